"""Pieces of the Megatron actor and trainer that need no process group: micro-batches, config from Args, metric folding, offload choice."""

from __future__ import annotations

import pytest
import torch

from vime.errors import ConfigError, TrainerError
from vime.real.megatron.actor import ActorConfig
from vime.real.megatron.batches import make_micro_batch
from vime.real.megatron.loss import response_slice
from vime.real.megatron.memory import breakdown, segments_by_pool
from vime.real.megatron.offload import AccountedNoopOffload, make_offload_backend
from vime.real.megatron.trainer import fold_metrics

HF = {"model_type": "qwen3", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
      "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8}


def test_micro_batch_pads_right_and_response_slices_line_up():
    rows = [[5, 6, 7, 8, 9], [1, 2, 3]]
    mb = make_micro_batch(rows, [2, 1])
    assert mb.tokens.tolist() == [[5, 6, 7, 8, 9], [1, 2, 3, 0, 0]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4]] * 2
    # logp[b, p] is log P(token p+1 | tokens ≤ p): encode that as p+1 to read which token each slot scores
    logp = torch.tensor([[1.0, 2, 3, 4], [1, 2, 3, 4]])
    assert response_slice(logp, 0, 5, 2).tolist() == [3.0, 4.0]  # tokens 8, 9
    assert response_slice(logp, 1, 3, 1).tolist() == [2.0]  # token 3


@pytest.mark.parametrize("resp", [0, 3])
def test_micro_batch_needs_a_prompt_and_a_response(resp):
    with pytest.raises(TrainerError, match="response_length"):
        make_micro_batch([[1, 2, 3]], [resp])


def test_actor_config_from_args_takes_the_slime_flag_names(tmp_path):
    from vime.config import defaults

    args = defaults("train").replace(tensor_model_parallel_size=2, lr=3e-4, eps_clip=0.25, eps_clip_high=0.28)
    cfg = ActorConfig.from_args(args, HF)
    assert (cfg.tensor_model_parallel_size, cfg.lr, cfg.eps_clip, cfg.eps_clip_high) == (2, 3e-4, 0.25, 0.28)
    assert cfg.use_distributed_optimizer == args.use_distributed_optimizer
    assert cfg.offload_backend == args.train_offload_backend
    # whether the trainer sleeps decides who empties PyTorch's cache (the sleep, or the end of each train call)
    assert cfg.offload_train == bool(args.offload_train)
    assert ActorConfig.from_args(args.replace(offload_train=False), HF).offload_train is False
    if not torch.cuda.is_available():
        assert cfg.torch_dtype == torch.float32  # dtype auto: fp32 on CPU, bf16 on CUDA
    assert cfg.hf_checkpoint is None
    with pytest.raises(ConfigError, match="hf-checkpoint"):
        ActorConfig.from_args(defaults("train"))


def test_metrics_fold_over_dp_heads():
    base = {"grad_norm": 2.0, "num_steps": 1, "recomputed_log_probs": False, "train_time": 2.0}
    results = [dict(base, tp_rank=0, dp_rank=0, loss=1.0, pg_clipfrac=0.1, entropy=3.0, tokens=10),
               dict(base, tp_rank=1, dp_rank=0, loss=9.0, pg_clipfrac=0.9, entropy=9.0, tokens=10),
               dict(base, tp_rank=0, dp_rank=1, loss=3.0, pg_clipfrac=0.3, entropy=5.0, tokens=30)]
    m = fold_metrics(4, results)
    assert (m.rollout_id, m.loss, m.entropy, m.tokens, m.grad_norm) == (4, 2.0, 4.0, 40, 2.0)
    assert m.pg_clipfrac == pytest.approx(0.2)
    assert m.extra["tokens_per_s"] == 20.0


def test_memory_folds_to_the_fullest_rank_and_breaks_down_by_pool():
    base = {"grad_norm": 2.0, "num_steps": 1, "recomputed_log_probs": False, "train_time": 2.0, "loss": 0.0,
            "pg_clipfrac": 0.0, "entropy": 0.0, "tokens": 1, "dp_rank": 0}
    results = [dict(base, tp_rank=0, memory={"memory/asleep_params_gib": 1.0}),
               dict(base, tp_rank=1, memory={"memory/asleep_params_gib": 3.0})]
    assert fold_metrics(0, results).extra["memory/asleep_params_gib"] == 3.0

    segs = [{"segment_pool_id": (0, 0), "total_size": 6 << 30, "allocated_size": 1 << 30},
            {"segment_pool_id": (0, 1), "total_size": 8 << 30, "allocated_size": 8 << 30},
            {"segment_pool_id": (0, 2), "total_size": 3 << 30, "allocated_size": 2 << 30}]
    pools = segments_by_pool(segs)
    assert pools == {"default": (6 << 30, 1 << 30), "private": (11 << 30, 10 << 30)}
    # a private pool beyond the CuMem tags' bytes is memory the offload never moves (the DDP copy of 2026-12-02)
    m = breakdown("asleep", {"params": 8 << 30, "grads": 0, "optimizer": 0}, pools, 20 << 30, 30 << 30)
    assert m["memory/asleep_params_gib"] == 8.0 and m["memory/asleep_other_pools_gib"] == 3.0
    assert (m["memory/asleep_torch_cache_gib"], m["memory/asleep_torch_allocated_gib"]) == (6.0, 1.0)
    assert (m["memory/asleep_peak_reserved_gib"], m["memory/asleep_device_used_gib"]) == (20.0, 30.0)
    # paused tags map nothing but PyTorch still counts their segments: those are not "other" pools
    paused = breakdown("asleep", {"params": 0, "grads": 0, "optimizer": 0}, pools, 20 << 30, 30 << 30, 8 << 30)
    assert paused["memory/asleep_params_gib"] == 0.0 and paused["memory/asleep_other_pools_gib"] == 3.0


def test_offload_backend_choice():
    if not torch.cuda.is_available():  # on CPU every backend is the accounted no-op
        for name in ("auto", "cumem", "torch_memory_saver"):
            assert isinstance(make_offload_backend(name), AccountedNoopOffload)
    noop = make_offload_backend("noop")
    noop.pause(123)
    noop.resume()
    assert noop.events == ["pause", "resume"] and noop.offloaded_bytes == 0
    with pytest.raises(ConfigError, match="unknown"):
        make_offload_backend("magic")


class _Payload:
    """An object whose unpickling would run code (here: it only flags that it did)."""

    ran = False

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (_mark_ran, ())


def _mark_ran() -> None:
    _Payload.ran = True


def test_a_crafted_optimizer_checkpoint_is_refused_without_running_it(tmp_path):
    import torch

    from vime.errors import TrainerError
    from vime.real.megatron.weights import read_optimizer_state

    good = tmp_path / "rank00000.pt"
    torch.save({"layout": {"tp": 1}, "states": [{"state": {0: {"exp_avg": torch.zeros(2)}}, "param_groups": []}]}, good)
    assert read_optimizer_state(str(good))["layout"] == {"tp": 1}
    bad = tmp_path / "evil.pt"
    torch.save({"layout": {}, "states": [_Payload()]}, bad)
    with pytest.raises(TrainerError, match="refused for safety"):
        read_optimizer_state(str(bad))
    assert not _Payload.ran


def test_device_views_copy_one_host_buffer_whole_and_cut_it_the_same_way():
    # a host-placed KL reference comes in as one buffer (one allocation, one transfer), not a copy per tensor
    from vime.real.megatron.weights import device_views, host_views
    src = [("a", torch.randn(3, 5).bfloat16()), ("b", torch.randn(7)), ("c", torch.randn(2, 2).half())]
    host = host_views(src, pinned=False)
    for name, t in src:
        host[name].copy_(t)
    there = device_views(host, torch.device("cpu"))
    assert [(n, there[n].dtype, tuple(there[n].shape)) for n, _ in src] == [(n, t.dtype, tuple(t.shape)) for n, t in src]
    assert all(torch.equal(there[n], t) for n, t in src)
    with pytest.raises(ValueError, match="stray"):
        device_views(host | {"stray": torch.zeros(2)}, torch.device("cpu"))
