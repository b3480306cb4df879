"""Megatron-core actors on Ray trained with GRPO on CPU: TP=2 vs TP=1, DP=2, export round trip, checkpoints (seed steps 37–52)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from megatron_rollouts import CHOSEN, eval_rows, synthetic_batch

from vime.errors import ConfigError, LifecycleError
from vime.protocols import Trainer, TrainerState
from vime.real.megatron import model as mmodel
from vime.real.megatron.actor import ActorConfig
from vime.real.megatron.trainer import MegatronTrainer

pytestmark = pytest.mark.megatron

ROLLOUTS = 3
LR = 2e-3
SAMPLES = 16  # 4 prompts × 4 samples
GBS = 8  # two optimizer steps per rollout: old log-probs are recomputed (seed step 38)
# Adam divides by sqrt(v): a weight whose gradient is ~0 moves by ±lr on float noise alone, so
# params of two parallel layouts agree to a few 1e-5 (all but single elements agree to 4e-6). A DP
# run without gradient reduction departs by > 1e-3 (the last test), so this still separates them.
PARAM_ATOL = 1e-4


def _run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def groups(ray_local, tiny_hf_dir):
    """Three trainer groups started from the same HF checkpoint: TP=1, TP=2, and DP=2 (distributed optimizer)."""
    hf_config = mmodel.load_hf_config(str(tiny_hf_dir))
    base = dict(hf_config=hf_config, hf_checkpoint=str(tiny_hf_dir), lr=LR, seed=7)
    specs = {
        "tp1": (ActorConfig(tensor_model_parallel_size=1, **base), 1),
        "tp2": (ActorConfig(tensor_model_parallel_size=2, **base), 2),
        "dp2": (ActorConfig(tensor_model_parallel_size=1, use_distributed_optimizer=True, **base), 2),
    }
    with ThreadPoolExecutor(len(specs)) as pool:
        futures = {k: pool.submit(MegatronTrainer.launch, cfg, n, actor_num_cpus=0.25) for k, (cfg, n) in specs.items()}
        out = {k: f.result() for k, f in futures.items()}
    yield out
    for trainer in out.values():
        trainer.shutdown()


def _p_chosen(trainer: MegatronTrainer) -> float:
    logits = _run(trainer.full_logits(eval_rows()))
    return float(torch.softmax(logits[:, -1], dim=-1)[:, CHOSEN].mean())


@pytest.fixture(scope="module")
def training(groups):
    """Train all three groups on the same rollouts (concurrently); record metrics and P(chosen)."""
    before = {k: _p_chosen(t) for k, t in groups.items()}

    async def train_all():
        metrics = {k: [] for k in groups}
        for rid in range(ROLLOUTS):
            one = synthetic_batch(rid, global_batch_size=GBS)
            two = synthetic_batch(rid, global_batch_size=GBS, dp=2)
            results = await asyncio.gather(groups["tp1"].train(rid, one), groups["tp2"].train(rid, one),
                                           groups["dp2"].train(rid, two))
            for k, m in zip(("tp1", "tp2", "dp2"), results, strict=True):
                metrics[k].append(m)
        return metrics

    metrics = _run(train_all())
    after = {k: _p_chosen(t) for k, t in groups.items()}
    return {"metrics": metrics, "before": before, "after": after}


def _full_params(trainer: MegatronTrainer) -> dict[str, torch.Tensor]:
    """Megatron-full tensors gathered here from every TP rank's local shards (independent of the actors' gather)."""
    shards = _run(trainer.call("local_params"))
    tp = trainer.tp
    return {name: mmodel.unshard(name, [shards[r][name] for r in range(tp)]) for name in shards[0]}


def test_trainer_satisfies_the_protocol(groups):
    assert isinstance(groups["tp2"], Trainer)
    assert [r["tp_rank"] for r in groups["tp2"].ranks] == [0, 1]
    assert [r["dp_rank"] for r in groups["dp2"].ranks] == [0, 1]


def test_initial_logits_equal_the_hf_model(groups, tiny_hf_dir):
    """HF → Megatron load (QKV fusion, gate/up, TP sharding) reproduces the HF model, at TP=1 and TP=2."""
    from transformers import Qwen3ForCausalLM

    hf = Qwen3ForCausalLM.from_pretrained(str(tiny_hf_dir)).eval()
    rows = eval_rows()
    with torch.no_grad():
        want = hf(torch.tensor(rows)).logits
    for key in ("tp1", "tp2"):
        got = _run(groups[key].full_logits(rows))
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


def test_grpo_raises_the_rewarded_token_probability(training):
    """Responses containing CHOSEN earn reward 1: after GRPO, P(CHOSEN | prompt) is higher (all groups)."""
    for key in ("tp1", "tp2", "dp2"):
        before, after = training["before"][key], training["after"][key]
        assert after > 1.5 * before, (key, before, after)


def test_losses_match_between_tp1_and_tp2(training):
    """Same data, same init: TP=2 reports the TP=1 loss, clip fraction, entropy and grad norm (float tolerance)."""
    tp1, tp2 = training["metrics"]["tp1"], training["metrics"]["tp2"]
    assert any(abs(m.loss) > 1e-4 for m in tp1)  # a multi-step rollout's loss is not trivially 0
    for a, b in zip(tp1, tp2, strict=True):
        assert b.loss == pytest.approx(a.loss, abs=1e-5, rel=1e-4)
        assert b.pg_clipfrac == pytest.approx(a.pg_clipfrac, abs=1e-6)
        assert b.entropy == pytest.approx(a.entropy, rel=1e-5)
        assert b.grad_norm == pytest.approx(a.grad_norm, rel=1e-4)
        assert a.num_steps == b.num_steps == SAMPLES // GBS
        assert a.recomputed_log_probs and b.recomputed_log_probs


def test_metrics_are_reported(training):
    for m in training["metrics"]["tp2"]:
        assert m.tokens > 0 and m.extra["tokens_per_s"] > 0 and m.grad_norm > 0
        assert 0.0 <= m.pg_clipfrac <= 1.0
        assert 0.0 < m.entropy <= float(torch.log(torch.tensor(512.0))) + 1e-4


def test_tp2_params_equal_tp1_params(training, groups):
    p1, p2 = _full_params(groups["tp1"]), _full_params(groups["tp2"])
    assert p1.keys() == p2.keys()
    for name in p1:
        torch.testing.assert_close(p2[name], p1[name], atol=PARAM_ATOL, rtol=1e-4)


def test_dp_ranks_end_identical_and_equal_a_single_rank(training, groups):
    """finalize_model_grads reduces DP gradients: both DP ranks hold the same params, and they equal
    the TP=1/DP=1 model trained on the whole batch."""
    shards = _run(groups["dp2"].call("local_params"))
    ref = _full_params(groups["tp1"])
    for name in shards[0]:
        assert torch.equal(shards[0][name], shards[1][name]), name
        torch.testing.assert_close(shards[0][name], ref[name], atol=PARAM_ATOL, rtol=1e-4)


def test_weight_export_round_trip(training, groups):
    """Exported HF buckets hold exactly the gathered parameters, in buckets of the requested size (seed step 48)."""
    trainer = groups["tp2"]
    bucket_bytes = 64 * 1024

    async def collect():
        return [b async for b in trainer.export_weights(bucket_bytes)]

    buckets = _run(collect())
    exported: dict[str, torch.Tensor] = {}
    for i, b in enumerate(buckets):
        assert b.index == i
        assert b.nbytes == sum(t.numel() * t.element_size() for t in b.tensors.values())
        assert b.nbytes <= bucket_bytes or len(b.names) == 1  # a tensor larger than a bucket travels alone
        assert b.names == list(b.tensors)
        assert b.shapes == [list(t.shape) for t in b.tensors.values()]
        assert b.dtype_names == ["float32"] * len(b.names)
        assert not exported.keys() & b.tensors.keys()
        exported.update(b.tensors)
    assert len(buckets) > 1
    spec = trainer_spec(trainer)
    want = {}
    for name, full in _full_params(trainer).items():
        want.update(mmodel.megatron_to_hf(spec, name, full))
    assert exported.keys() == want.keys()
    for name in want:
        assert torch.equal(exported[name], want[name]), name


def trainer_spec(trainer: MegatronTrainer) -> mmodel.ModelSpec:
    return mmodel.spec_from_hf_config(trainer.cfg.hf_config)


def test_exported_weights_load_into_hf_and_reproduce_the_logits(training, groups, tmp_path, tiny_hf_dir):
    """An HF model loading the exported safetensors computes the trained Megatron model's logits."""
    from transformers import Qwen3ForCausalLM

    trainer = groups["tp2"]

    async def collect():
        return [b async for b in trainer.export_weights(1 << 20)]

    tensors = {n: t for b in _run(collect()) for n, t in b.tensors.items()}
    out = tmp_path / "exported"
    mmodel.write_hf_safetensors(str(out), tensors.items(), config=trainer.cfg.hf_config)
    hf = Qwen3ForCausalLM.from_pretrained(str(out)).eval()
    rows = eval_rows()
    with torch.no_grad():
        want = hf(torch.tensor(rows)).logits
    got = _run(trainer.full_logits(rows))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    # and the HF model differs from the untrained checkpoint: training really moved the weights
    base = Qwen3ForCausalLM.from_pretrained(str(tiny_hf_dir)).eval()
    with torch.no_grad():
        assert not torch.allclose(base(torch.tensor(rows)).logits, want, atol=1e-3)


def test_sleep_wake_lifecycle_and_export_while_asleep(training, groups):
    trainer = groups["tp2"]

    async def flow():
        await trainer.sleep()
        assert trainer.lifecycle.state is TrainerState.ASLEEP
        with pytest.raises(LifecycleError):
            await trainer.train(99, synthetic_batch(99))
        with pytest.raises(LifecycleError):
            await trainer.sleep()
        names = [n async for b in trainer.export_weights(1 << 20) for n in b.names]  # reads the backup
        await trainer.wake_up()
        return names

    names = _run(flow())
    assert "model.embed_tokens.weight" in names
    assert trainer.lifecycle.state is TrainerState.AWAKE
    for info in _run(trainer.call("offload_info")):
        assert info["backend"] == "noop" and info["events"][-2:] == ["pause", "resume"]
        assert info["last_offloaded_bytes"] > 0


def test_batch_for_another_dp_size_is_refused(groups):
    with pytest.raises(ConfigError, match="DP ranks"):
        _run(groups["dp2"].train(0, synthetic_batch(0, dp=1)))


def test_checkpoint_saved_at_tp2_resumes_at_tp1(training, groups, tmp_path):
    """HF safetensors checkpoint + rollout id: a TP=1 group loading a TP=2 save computes the same logits."""
    path = str(tmp_path / "ckpt")
    _run(groups["tp2"].save_checkpoint(ROLLOUTS - 1, path))
    with open(os.path.join(path, "vime_state.json")) as fh:
        assert json.load(fh)["rollout_id"] == ROLLOUTS - 1
    assert _run(groups["tp1"].load_checkpoint(path)) == ROLLOUTS
    rows = eval_rows()
    a = _run(groups["tp2"].full_logits(rows))
    b = _run(groups["tp1"].full_logits(rows))
    torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
    shutil.rmtree(path)


def test_without_finalize_model_grads_dp_training_departs_from_single_rank(training, groups):
    """The DP test can fail: with the finalize hook removed, the distributed optimizer steps each
    shard with one rank's gradients only, and the result departs from the single-rank model."""
    dp2, tp1 = groups["dp2"], groups["tp1"]

    def gap() -> float:
        ref, shards = _full_params(tp1), _run(dp2.call("local_params"))
        return max(float((shards[0][n] - ref[n]).abs().max()) for n in ref)

    assert gap() < PARAM_ATOL  # in step before the change
    _run(dp2.call("set_finalize_grads", False))
    try:
        rid = 50

        async def step():
            await asyncio.gather(tp1.train(rid, synthetic_batch(rid, global_batch_size=GBS)),
                                 dp2.train(rid, synthetic_batch(rid, global_batch_size=GBS, dp=2)))

        _run(step())
        assert gap() > 1e-3
    finally:
        _run(dp2.call("set_finalize_grads", True))


def test_orchestrator_drives_the_real_trainer_with_simulated_engines(training, groups, tiny_hf_dir):
    """Mixed mode: the step loop on the simulated clock and engines, training on the real Megatron
    actors (TP=2), for two rollouts; the engines receive the real trainer's exported buckets."""
    from vime.config import defaults
    from vime.runs.sim import simulate

    trainer = groups["tp2"]
    before = _full_params(trainer)
    args = defaults("train").replace(
        backend="sim", model=str(tiny_hf_dir / "config.json"), actor_num_gpus_per_node=2,
        tensor_model_parallel_size=2, rollout_num_gpus_per_engine=1, rollout_batch_size=2, n_samples_per_prompt=4,
        micro_batch_size=2, rollout_max_prompt_len=16, rollout_max_response_len=8, rollout_max_context_len=64,
        num_rollout=2, custom_rm_path="megatron_rollouts.even_token_fraction")
    exported: list[int] = []

    class Counting:
        """Counts the buckets the orchestrator pulls from the real trainer."""

        def __getattr__(self, name):
            return getattr(trainer, name)

        async def export_weights(self, bucket_bytes):
            async for b in trainer.export_weights(bucket_bytes):
                exported.append(len(b.names))
                yield b

    trainer.blocking = True
    try:
        run = simulate(args, wrap=lambda backends: {"trainer": Counting()})
    finally:
        trainer.blocking = False
    steps = run.report.steps
    assert [s.rollout_id for s in steps] == [0, 1]
    assert [s.published_version for s in steps] == [2, 3]
    hf_names = {n for name, full in before.items() for n, _ in mmodel.megatron_to_hf(trainer_spec(trainer), name, full)}
    assert sum(exported) == 3 * len(hf_names)  # start-up publication + one per step
    for s in steps:
        assert s.train["grad_norm"] > 0 and s.train["tokens"] > 0 and s.train["num_steps"] == 1
        assert not s.train["recomputed_log_probs"]  # the seed's reuse case: one step per rollout
    after = _full_params(trainer)
    assert any(not torch.equal(before[n], after[n]) for n in before)


def test_resume_restores_the_optimizer_state(groups, training, tmp_path):
    """Save, train one rollout, load, train it again: the same params (Adam moments came back).
    Without the optimizer files Adam restarts and the params differ, so the check can fail."""
    trainer = groups["tp1"]
    path = str(tmp_path / "resume")
    _run(trainer.save_checkpoint(7, path))
    batch = synthetic_batch(60, global_batch_size=GBS)
    _run(trainer.train(60, batch))
    continued = _full_params(trainer)

    assert _run(trainer.load_checkpoint(path)) == 8
    assert _run(trainer.call("last_load_info")) == ["optimizer restored"]
    _run(trainer.train(60, batch))
    resumed = _full_params(trainer)
    for name in continued:
        torch.testing.assert_close(resumed[name], continued[name], atol=1e-6, rtol=1e-6)

    shutil.rmtree(os.path.join(path, "optimizer"))
    _run(trainer.load_checkpoint(path))
    assert _run(trainer.call("last_load_info")) == ["optimizer reset"]
    _run(trainer.train(60, batch))
    restarted = _full_params(trainer)
    assert max(float((restarted[n] - continued[n]).abs().max()) for n in continued) > 1e-4
