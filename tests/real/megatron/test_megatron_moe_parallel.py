"""The Megatron trainer on the tiny Qwen3-MoE over 2 ranks on CPU (gloo, through Ray): EP 2, TP 2 (ETP 2) and
TP 2 × EP 2 (ETP 1) each hold their share of the experts, load the HF checkpoint's logits, train with GRPO, and
export an HF state that transformers loads with the trained logits (issue 21)."""

from __future__ import annotations

import asyncio
import re
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from megatron_rollouts import CHOSEN, eval_rows, synthetic_batch

from vime.real.megatron import model as mmodel
from vime.real.megatron.actor import ActorConfig
from vime.real.megatron.trainer import MegatronTrainer

pytestmark = pytest.mark.megatron

LR = 2e-3
ROLLOUTS = 2
EXPERTS, WIDTH, HIDDEN, LAYERS = 4, 64, 64, 2  # conftest's tiny_moe_dir
#: (TP, EP, ETP on each rank as the actor resolves it) of each 2-rank layout
LAYOUTS = {"ep2": (1, 2, 1), "tp2": (2, 1, 2), "tp2ep2": (2, 2, 1)}


def _run(coro):
    return asyncio.run(coro)


@pytest.fixture(scope="module")
def groups(ray_local, tiny_moe_dir):
    base = dict(hf_config=mmodel.load_hf_config(str(tiny_moe_dir)), hf_checkpoint=str(tiny_moe_dir), lr=LR, seed=7)
    cfgs = {k: ActorConfig(tensor_model_parallel_size=tp, expert_model_parallel_size=ep, **base)
            for k, (tp, ep, _) in LAYOUTS.items()}
    with ThreadPoolExecutor(len(cfgs)) as pool:
        futures = {k: pool.submit(MegatronTrainer.launch, cfg, 2, actor_num_cpus=0.25) for k, cfg in cfgs.items()}
        out = {k: f.result() for k, f in futures.items()}
    yield out
    for t in out.values():
        t.shutdown()


def _hf_logits(path) -> torch.Tensor:
    from transformers import Qwen3MoeForCausalLM

    hf = Qwen3MoeForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor(eval_rows())).logits


def _p_chosen(logits: torch.Tensor) -> float:
    return float(torch.softmax(logits[:, -1], dim=-1)[:, CHOSEN].mean())


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_each_rank_holds_its_experts_and_loads_the_hf_logits(groups, tiny_moe_dir, layout):
    trainer = groups[layout]
    _, ep, etp = LAYOUTS[layout]
    per_rank = _run(trainer.call("local_params"))
    for params in per_rank:
        experts = {n: p for n, p in params.items() if ".local_experts." in n}
        held = {int(re.search(r"local_experts\.(\d+)\.", n).group(1)) for n in experts}
        assert held == set(range(EXPERTS // ep)), sorted(held)
        # E/EP experts per layer, each of gate+up [2f, h] and down [h, f] split over ETP
        assert sum(p.numel() for p in experts.values()) == LAYERS * EXPERTS // ep * 3 * WIDTH * HIDDEN // etp
    torch.testing.assert_close(_run(trainer.full_logits(eval_rows())), _hf_logits(tiny_moe_dir), atol=1e-4,
                               rtol=1e-4)


@pytest.fixture(scope="module")
def trained(groups):
    """Every layout trained on the same rollouts (EP 2 at TP 1 is DP 2: its batch is split over 2 ranks)."""
    before = {k: _run(t.full_logits(eval_rows())) for k, t in groups.items()}
    params = {k: _run(t.call("local_params")) for k, t in groups.items()}

    async def train_all():
        for rid in range(ROLLOUTS):
            await asyncio.gather(*(t.train(rid, synthetic_batch(rid, global_batch_size=8, dp=t.dp))
                                   for t in groups.values()))

    _run(train_all())
    return {"before": before, "params": params}


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_grpo_moves_every_rank_and_the_export_round_trips(groups, trained, layout, tmp_path):
    trainer = groups[layout]
    after = _run(trainer.full_logits(eval_rows()))
    assert _p_chosen(after) > 1.2 * _p_chosen(trained["before"][layout])
    for old, new in zip(trained["params"][layout], _run(trainer.call("local_params")), strict=True):
        moved = [n for n in old if ".local_experts." in n and not torch.equal(old[n], new[n])]
        assert moved, "no expert weight of this rank changed"

    async def collect():
        return [b async for b in trainer.export_weights(1 << 20)]

    tensors = {n: t for b in _run(collect()) for n, t in b.tensors.items()}
    assert {f"model.layers.{i}.mlp.experts.{j}.down_proj.weight" for i in range(LAYERS)
            for j in range(EXPERTS)} <= set(tensors)
    out = tmp_path / "exported"
    mmodel.write_hf_safetensors(str(out), tensors.items(), config=trainer.cfg.hf_config)
    torch.testing.assert_close(after, _hf_logits(out), atol=1e-4, rtol=1e-4)


def test_layouts_train_alike(groups, trained):
    """The same rollouts through three layouts give nearly the same model (Adam amplifies float noise a little)."""
    logits = {k: _run(t.full_logits(eval_rows())) for k, t in groups.items()}
    for k in ("tp2", "tp2ep2"):
        torch.testing.assert_close(logits[k], logits["ep2"], atol=2e-4, rtol=0)


def test_checkpoint_gathers_the_experts_and_loads_into_another_layout(groups, trained, tmp_path):
    """The EP 2 checkpoint holds every expert (HF safetensors written by rank 0); it loads back with its
    optimizer state, and into TP 2 × EP 2 with the weights only (another layout: Adam restarts)."""
    ep2, other = groups["ep2"], groups["tp2ep2"]
    want = _run(ep2.full_logits(eval_rows()))
    _run(ep2.save_checkpoint(ROLLOUTS - 1, str(tmp_path)))
    torch.testing.assert_close(_hf_logits(tmp_path), want, atol=1e-4, rtol=1e-4)
    for trainer, note in ((ep2, "optimizer restored"), (other, "optimizer reset")):
        assert _run(trainer.load_checkpoint(str(tmp_path))) == ROLLOUTS
        assert set(_run(trainer.call("last_load_info"))) == {note}
        torch.testing.assert_close(_run(trainer.full_logits(eval_rows())), want, atol=1e-5, rtol=1e-5)
