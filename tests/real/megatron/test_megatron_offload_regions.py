"""Where the trainer's tensors are allocated (the offload tags), checked on CPU: every parameter in a tag a sleep keeps.

On a GPU the offload backends keep the "params" and "optimizer" tags across a sleep and drop
"grads". The first whole H200 run trained with zero weights because the distributed optimizer's
DDP moved every parameter into a buffer allocated under "grads". This test records, per region,
the storage of every tensor created inside it (a TorchDispatchMode sees the factory calls on CPU
too) and checks each parameter, gradient buffer and optimizer tensor against its tag.
"""

from __future__ import annotations

import contextlib
from typing import Any

import pytest

pytestmark = [pytest.mark.megatron,
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


def _tags_of_build(distributed_optimizer: bool, dtype: str, moe: bool, queue: Any) -> None:
    """In a fresh process: build the trainer the way the actor does, with a recording offload."""
    import torch
    import torch.distributed as dist
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    from vime.real.megatron import compat
    from vime.real.ports import free_port

    compat.import_megatron()
    compat.install()
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    from megatron.core import parallel_state as ps

    from vime.real.megatron import model as mmodel
    from vime.real.megatron.actor import ActorConfig
    from vime.real.megatron.build import build_model
    from vime.real.megatron.offload import inner_optimizers

    owner: dict[int, str] = {}  # storage address -> tag it was allocated under

    class Record(TorchDispatchMode):
        def __init__(self, tag: str) -> None:
            super().__init__()
            self.tag = tag

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            seen = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs))
                    if isinstance(t, torch.Tensor)}
            for t in tree_leaves(out):
                # A fresh storage (not a view or in-place result of an input) is an allocation in
                # this region; it overwrites the address's owner since freed addresses get reused.
                if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in seen:
                    owner[t.untyped_storage().data_ptr()] = self.tag
            return out

    class RecordingOffload:
        name = "recording"

        def region(self, tag: str) -> Any:
            @contextlib.contextmanager
            def cm() -> Any:
                with Record(tag):
                    yield
            return cm()

    hf = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 128, "hidden_size": 64,
          "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 16, "max_position_embeddings": 64, "tie_word_embeddings": True, "rms_norm_eps": 1e-6}
    if moe:
        hf.update(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=4, num_experts_per_tok=2,
                  moe_intermediate_size=32, decoder_sparse_step=1, mlp_only_layers=[], tie_word_embeddings=False)
    spec = mmodel.spec_from_hf_config(hf)
    cfg = ActorConfig(hf_config=hf, use_distributed_optimizer=distributed_optimizer, dtype=dtype)
    with compat.device_mode():
        ps.initialize_model_parallel(tensor_model_parallel_size=1)
        built = build_model(spec, cfg, tp=1, cpu=True, offload=RecordingOffload())

        def tag(t: torch.Tensor) -> str:
            return owner.get(t.untyped_storage().data_ptr(), "untagged")

        out: dict[str, list[str]] = {"params": [], "main_grad": [], "main_params": [], "optimizer": []}
        for _, p in built.model.module.named_parameters():
            out["params"].append(tag(p))
            out["main_grad"].append(tag(p.main_grad))
        for inner in inner_optimizers(built.optimizer):
            for group in inner.param_groups:
                for p in group["params"]:
                    out["main_params"].append(tag(p))
                    out["optimizer"] += [tag(v) for v in inner.state.get(p, {}).values()
                                         if torch.is_tensor(v) and v.dim() > 0]
    counts = {k: len(v) for k, v in out.items()}
    queue.put({**{k: sorted(set(v)) for k, v in out.items()}, "counts": counts, "hf": hf})
    dist.destroy_process_group()


@pytest.mark.parametrize(("distributed_optimizer", "dtype", "moe"),
                         [(False, "bfloat16", False), (True, "bfloat16", False), (True, "float32", False),
                          (True, "bfloat16", True)])
def test_every_parameter_lives_in_a_tag_that_a_sleep_keeps(distributed_optimizer: bool, dtype: str, moe: bool) -> None:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_tags_of_build, args=(distributed_optimizer, dtype, moe, queue))
    proc.start()
    tags = queue.get(timeout=240)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    assert tags["params"] == ["params"], tags  # never "grads": those come back as garbage
    assert tags["optimizer"] == ["optimizer"], tags  # Adam's moments
    # what the simulator's state check counts: every parameter, its fp32 main copy and Adam's two moments
    from vime.sim.models import ModelSpec
    from vime.sim.trainer.sleep_extras import megatron_param_tensors

    n = tags["counts"]
    per_param = megatron_param_tensors(ModelSpec.from_hf_config(tags["hf"], name="toy"))
    assert (n["params"], n["main_params"], n["optimizer"]) == (per_param, per_param, 2 * per_param), n
    # the optimizer's fp32 main parameters; an fp32 model's optimizer steps the parameters themselves
    assert tags["main_params"] == (["params"] if dtype == "float32" else ["optimizer"]), tags
    # Dropped at sleep (no host copy), except where an fp32 model's parameter and gradient buffers
    # cannot be told apart: then both are kept.
    fp32_dist = distributed_optimizer and dtype == "float32"
    assert tags["main_grad"] == (["params"] if fp32_dist else ["grads"]), tags
