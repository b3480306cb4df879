"""--recompute-granularity reaches Megatron: the same gradients, with the layers' forward run again in the backward."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = [pytest.mark.megatron,
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


def _grads_and_layer_forwards(granularity: str | None, queue: Any) -> None:
    """In a fresh process: one forward + backward of a tiny model built as the actor builds it."""
    import contextlib

    import torch
    import torch.distributed as dist

    from vime.real.megatron import compat
    from vime.real.ports import free_port

    compat.import_megatron()
    compat.install()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from megatron.core.transformer.transformer_layer import TransformerLayer

    from vime.real.megatron import model as mmodel
    from vime.real.megatron.actor import ActorConfig
    from vime.real.megatron.build import build_model

    class NoOffload:
        name = "none"

        def region(self, tag: str) -> Any:
            return contextlib.nullcontext()

    calls = {"n": 0}
    original = TransformerLayer.forward

    def counted(self, *a, **k):  # type: ignore[no-untyped-def]
        calls["n"] += 1
        return original(self, *a, **k)

    TransformerLayer.forward = counted
    hf = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 128, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "max_position_embeddings": 64, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
    spec = mmodel.spec_from_hf_config(hf)
    cfg = ActorConfig(hf_config=hf, dtype="float32", recompute_granularity=granularity)
    with compat.device_mode():
        ps.initialize_model_parallel(tensor_model_parallel_size=1)
        torch.manual_seed(0)
        model_parallel_cuda_manual_seed(0)
        built = build_model(spec, cfg, tp=1, cpu=True, offload=NoOffload())
        model = built.model
        model.train()
        ids = torch.arange(16).remainder(128).reshape(1, 16)
        pos = torch.arange(16).reshape(1, 16)
        logits = model(ids, pos, None)
        calls["after_forward"] = calls["n"]
        logits.float().square().mean().backward()
        grads = {n: p.main_grad.clone() if getattr(p, "main_grad", None) is not None else p.grad.clone()
                 for n, p in model.module.named_parameters()}
    queue.put({"forwards": calls["after_forward"], "total": calls["n"],
               "grads": {n: g.tolist() for n, g in grads.items()}})
    dist.destroy_process_group()


def _run(granularity: str | None) -> dict[str, Any]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_grads_and_layer_forwards, args=(granularity, queue))
    proc.start()
    import queue as queues

    while True:  # the child's result, or its death (a crash must not wait out a long timeout)
        try:
            out = queue.get(timeout=2)
            break
        except queues.Empty:
            assert proc.is_alive(), f"the build process died (exit {proc.exitcode}); see its traceback above"
    proc.join(timeout=60)
    assert proc.exitcode == 0
    return out


def test_full_recompute_runs_each_layer_again_and_keeps_the_gradients() -> None:
    import torch

    plain, full = _run(None), _run("full")
    assert plain["forwards"] == full["forwards"] == 2  # two layers, one forward each
    assert plain["total"] == 2  # nothing recomputed without the flag
    assert full["total"] == 4  # the backward ran both layers' forward again
    assert plain["grads"].keys() == full["grads"].keys()
    for name, g in plain["grads"].items():
        assert torch.allclose(torch.tensor(g), torch.tensor(full["grads"][name]), atol=1e-6), name
