"""The KL loss's reference model in the real Megatron trainer (issue 19): built from the initial weights or --ref-load, on the GPU or the host, timed, and pulling the policy back."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from megatron_rollouts import eval_rows, synthetic_batch

from vime.real.megatron import model as mmodel
from vime.real.megatron.actor import ActorConfig
from vime.real.megatron.trainer import MegatronTrainer

pytestmark = pytest.mark.megatron


def _params(trainer: MegatronTrainer) -> dict[str, torch.Tensor]:
    return asyncio.run(trainer.call("local_params"))[0]


def test_kl_to_the_reference_is_reported_and_keeps_the_policy_closer(ray_local, tiny_hf_dir):
    hf_config = mmodel.load_hf_config(str(tiny_hf_dir))
    base = dict(hf_config=hf_config, hf_checkpoint=str(tiny_hf_dir), lr=5e-3, seed=7)
    kl = dict(use_kl_loss=True, kl_loss_coef=20.0, kl_loss_type="k2")
    cfgs = {"free": ActorConfig(**base), "kl": ActorConfig(**kl, **base),
            # --ref-placement host: the same reference, kept on the host and brought in for each forward
            "kl_host": ActorConfig(**kl, ref_placement="host", **base)}
    with ThreadPoolExecutor(3) as pool:
        futures = {k: pool.submit(MegatronTrainer.launch, c, 1, actor_num_cpus=0.25) for k, c in cfgs.items()}
        trainers = {k: f.result() for k, f in futures.items()}
    try:
        start = _params(trainers["free"])
        assert all(torch.equal(start[n], t) for n, t in _params(trainers["kl"]).items())
        start_logits = asyncio.run(trainers["free"].full_logits(eval_rows()))

        async def train(t: MegatronTrainer) -> list:
            return [await t.train(rid, synthetic_batch(rid, global_batch_size=8)) for rid in range(3)]

        with ThreadPoolExecutor(3) as pool:
            runs = {k: pool.submit(asyncio.run, train(t)).result() for k, t in trainers.items()}
        kl_metrics = runs["kl"]
        # where the reference lives changes no number the loss sees, in any of the three steps
        assert [(m.loss, m.extra["kl_loss"]) for m in runs["kl_host"]] == [(m.loss, m.extra["kl_loss"]) for m in kl_metrics]
        assert all(m.extra["ref_log_probs_time"] > 0 for m in runs["kl_host"])
        assert all(m.extra["ref_log_probs_time"] > 0 for m in kl_metrics)
        assert "ref_log_probs_time" not in runs["free"][0].extra
        # the train time's parts, under the simulator's keys: the reference's forward is not the actor's training
        for m in (*kl_metrics, *runs["free"]):
            parts = m.extra["actor_train_time"] + m.extra["weight_backup_time"] + m.extra.get("ref_log_probs_time", 0)
            assert 0 < m.extra["actor_train_time"] and parts <= m.extra["train_time"] * (1 + 1e-9)
        # two optimizer steps per rollout: after the first, the policy has left the reference
        assert kl_metrics[-1].extra["kl_loss"] > 0

        def kl_from_start(name: str) -> float:
            """Mean KL(π_start ‖ π) over the evaluation positions: how far the policy moved."""
            logits = asyncio.run(trainers[name].full_logits(eval_rows()))
            p0, lp0, lp = start_logits.softmax(-1), start_logits.log_softmax(-1), logits.log_softmax(-1)
            return float((p0 * (lp0 - lp)).sum(-1).mean())

        assert kl_from_start("kl") < 0.5 * kl_from_start("free")
    finally:
        for t in trainers.values():
            t.shutdown()
