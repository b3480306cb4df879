"""The real trainer's loss for each objective flag (issue 19) against a plain-torch reference written here: GSPO, CISPO, TIS, KL to a reference, the entropy bonus.

The loss under test is `vime.real.megatron.loss.policy_loss`, the function the Megatron actor's
schedule calls, with Megatron's vocab-parallel cross-entropy on one CPU rank (gloo). Each variant's
gradient with respect to the logits must equal the reference's and differ from plain GRPO's.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch

pytestmark = [pytest.mark.megatron,
              pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

V, B, S = 11, 2, 6
RESP = [3, 4]  # response lengths of the two rows (totals 5 and 6)
TOTAL = [5, 6]


def _inputs(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, S, V, generator=g)
    tokens = torch.randint(0, V, (B, S), generator=g)
    return {"logits": logits, "tokens": tokens,
            "old": [torch.randn(r, generator=g) * 0.3 - 2.0 for r in RESP],
            "rollout": [torch.randn(r, generator=g) * 0.3 - 2.0 for r in RESP],
            "ref": [torch.randn(r, generator=g) * 0.3 - 2.0 for r in RESP],
            "adv": [torch.full((RESP[0],), 0.9354), torch.full((RESP[1],), -0.9354)],
            "masks": [torch.tensor([1.0, 1.0, 1.0]), torch.tensor([1.0, 0.0, 1.0, 1.0])]}


def _reference(variant: str, x: dict[str, Any]) -> torch.Tensor:
    """d loss / d logits, from the formulas written out in plain torch (sample-mean aggregation)."""
    logits = x["logits"].clone().requires_grad_(True)
    lsm = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    logp_all = lsm.gather(-1, x["tokens"][:, 1:].unsqueeze(-1)).squeeze(-1)
    ent_all = -(lsm.exp() * lsm).sum(-1)
    eps = 0.2
    per_sample = []
    ents = []
    for i in range(B):
        t, r = TOTAL[i], RESP[i]
        cur = logp_all[i, t - r - 1: t - 1]
        ent = ent_all[i, t - r - 1: t - 1]
        m, a, old = x["masks"][i], x["adv"][i], x["old"][i]
        ents.append((ent * m).sum() / m.sum())
        if variant == "gspo":
            s = torch.exp(((cur - old) * m).sum() / m.sum())
            per_sample.append(torch.maximum(-s * a[0], -s.clamp(1 - eps, 1 + eps) * a[0]))
            continue
        ratio = torch.exp(cur - old)
        if variant == "cispo":
            tok = -ratio.detach().clamp(1 - eps, 1 + eps) * a * cur
        else:
            tok = torch.maximum(-ratio * a, -ratio.clamp(1 - eps, 1 + eps) * a)
        if variant == "tis":
            tok = tok * torch.exp(old - x["rollout"][i]).clamp(0.0, 2.0)
        term = (tok * m).sum() / m.sum()
        if variant == "kl":
            d = cur - x["ref"][i]
            term = term + 0.5 * (((torch.exp(-d) - 1 + d).clamp(-10, 10) * m).sum() / m.sum())
        per_sample.append(term)
    loss = torch.stack(per_sample).mean()
    if variant == "entropy":
        loss = loss - 0.01 * torch.stack(ents).mean()
    loss.backward()
    assert logits.grad is not None
    return logits.grad


def _vime_grads(variants: list[str], queue: Any) -> None:
    """In a fresh process: one gloo rank, Megatron's parallel state, then vime's loss per variant."""
    import os

    import torch.distributed as dist

    from vime.real.megatron import compat

    compat.import_megatron()
    compat.install()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    from vime.real.ports import free_port

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1)
    from megatron.core import parallel_state as ps

    from vime.real.megatron.actor import ActorConfig
    from vime.real.megatron.batches import MicroBatch
    from vime.real.megatron.loss import TokenScorer, policy_loss

    with compat.device_mode():
        ps.initialize_model_parallel(tensor_model_parallel_size=1)
        x = _inputs()
        base = ActorConfig(hf_config={}, eps_clip=0.2, eps_clip_high=0.2)
        cfgs = {"grpo": base, "gspo": replace(base, advantage_estimator="gspo"),
                "cispo": replace(base, advantage_estimator="cispo"),
                "tis": replace(base, use_tis=True, tis_clip=2.0, tis_clip_low=0.0),
                "kl": replace(base, use_kl_loss=True, kl_loss_coef=0.5, kl_loss_type="low_var_kl"),
                "entropy": replace(base, entropy_coef=0.01)}
        out = {}
        for variant in variants:
            logits = x["logits"].clone().requires_grad_(True)
            mb = MicroBatch(tokens=x["tokens"], position_ids=torch.arange(S).expand(B, S), total_lengths=TOTAL,
                            response_lengths=RESP, loss_masks=x["masks"], advantages=x["adv"],
                            old_log_probs=x["old"], rollout_log_probs=x["rollout"], ref_log_probs=x["ref"])
            loss, _ = policy_loss(cfgs[variant], TokenScorer(V, 0), mb, logits)
            loss.backward()
            out[variant] = logits.grad.tolist()  # plain lists: no tensor sharing across the process boundary
    queue.put(out)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def vime_grads() -> dict[str, torch.Tensor]:
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_vime_grads, args=(["grpo", "gspo", "cispo", "tis", "kl", "entropy"], queue))
    proc.start()
    out = queue.get(timeout=240)
    proc.join(timeout=60)
    assert proc.exitcode == 0
    return {k: torch.tensor(v) for k, v in out.items()}


@pytest.mark.parametrize("variant", ["grpo", "gspo", "cispo", "tis", "kl", "entropy"])
def test_the_real_loss_gradient_equals_the_reference(vime_grads: dict[str, torch.Tensor], variant: str) -> None:
    want = _reference(variant, _inputs())
    torch.testing.assert_close(vime_grads[variant], want, atol=1e-6, rtol=1e-5)
    if variant != "grpo":  # the flag changes what is trained
        assert not torch.allclose(vime_grads[variant], vime_grads["grpo"], atol=1e-6)
    assert math.isfinite(float(vime_grads[variant].abs().sum()))
