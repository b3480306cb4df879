"""The Megatron trainer on a tiny Qwen3-MoE (issue 21), on CPU through Ray: Megatron-core's MoE layers (local spec,
TP 1, EP 1) load the HF checkpoint and give its logits, GRPO raises the rewarded token's probability, and the
exported weights load into transformers and give the trained model's logits."""

from __future__ import annotations

import asyncio

import pytest
import torch
from megatron_rollouts import CHOSEN, eval_rows, synthetic_batch

from vime.real.megatron import model as mmodel
from vime.real.megatron.actor import ActorConfig
from vime.real.megatron.trainer import MegatronTrainer

pytestmark = pytest.mark.megatron

ROLLOUTS = 3
LR = 2e-3


def _run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def trainer(ray_local, tiny_moe_dir):
    cfg = ActorConfig(hf_config=mmodel.load_hf_config(str(tiny_moe_dir)), hf_checkpoint=str(tiny_moe_dir), lr=LR,
                      seed=7, tensor_model_parallel_size=1)
    t = MegatronTrainer.launch(cfg, 1, actor_num_cpus=0.25)
    yield t
    t.shutdown()


def _p_chosen(trainer: MegatronTrainer) -> float:
    logits = _run(trainer.full_logits(eval_rows()))
    return float(torch.softmax(logits[:, -1], dim=-1)[:, CHOSEN].mean())


def _hf_logits(path) -> torch.Tensor:
    from transformers import Qwen3MoeForCausalLM

    hf = Qwen3MoeForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor(eval_rows())).logits


def test_moe_trainer_loads_trains_and_exports(trainer, tiny_moe_dir, tmp_path):
    torch.testing.assert_close(_run(trainer.full_logits(eval_rows())), _hf_logits(tiny_moe_dir), atol=1e-4,
                               rtol=1e-4)
    before = _p_chosen(trainer)

    async def train():
        return [await trainer.train(rid, synthetic_batch(rid, global_batch_size=8)) for rid in range(ROLLOUTS)]

    metrics = _run(train())
    after = _p_chosen(trainer)
    assert len(metrics) == ROLLOUTS
    assert after > 1.5 * before, (before, after)

    async def collect():
        return [b async for b in trainer.export_weights(1 << 20)]

    tensors = {n: t for b in _run(collect()) for n, t in b.tensors.items()}
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in tensors and "model.layers.0.mlp.gate.weight" in tensors
    out = tmp_path / "exported"
    mmodel.write_hf_safetensors(str(out), tensors.items(), config=trainer.cfg.hf_config)
    torch.testing.assert_close(_run(trainer.full_logits(eval_rows())), _hf_logits(out), atol=1e-4, rtol=1e-4)
