"""GSPO, CISPO, truncated importance sampling and the KL estimators (issue 19), against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from vime.algo.policy_loss import approx_kl, cispo_loss, gspo_loss, sequence_ratio, tis_weights


def test_gspo_ratio_is_per_sequence_and_its_gradient_is_spread_over_the_tokens() -> None:
    logp = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    old = torch.tensor([-1.2, -1.8, -1.0])
    masks = [[1, 1], [1]]
    s = sequence_ratio(logp, old, masks)
    assert s.tolist() == pytest.approx([1.0, math.exp(0.5)])  # mean log-ratio 0 and 0.5
    adv = torch.tensor([1.0, 1.0, -1.0])
    loss, clipped = gspo_loss(logp, old, adv, masks, eps_clip=0.2, eps_clip_high=0.2)
    # sample 0: -s·A = -1; sample 1: A < 0 and s > 1.2, so max(-s·A, -1.2·A) = s (unclipped, gradient kept)
    assert loss.tolist() == pytest.approx([-1.0, math.exp(0.5)]) and clipped.tolist() == [0.0, 0.0]
    loss.sum().backward()
    assert logp.grad is not None
    # d(-s·A)/d logp_t = -A·s/|y|: -0.5 for each of sample 0's two tokens, +e^0.5 for sample 1's one
    assert logp.grad.tolist() == pytest.approx([-0.5, -0.5, math.exp(0.5)])


def test_gspo_clips_a_whole_sequence() -> None:
    logp = torch.tensor([-0.5, -0.5], requires_grad=True)
    old = torch.tensor([-1.0, -1.0])
    loss, clipped = gspo_loss(logp, old, torch.tensor([2.0, 2.0]), [[1, 1]], eps_clip=0.2, eps_clip_high=0.2)
    assert loss.item() == pytest.approx(-1.2 * 2.0) and clipped.item() == 1.0
    loss.sum().backward()
    assert logp.grad is not None and logp.grad.tolist() == [0.0, 0.0]


def test_a_masked_token_does_not_enter_the_sequence_ratio() -> None:
    logp = torch.tensor([-1.0, -9.0])
    old = torch.tensor([-1.0, -1.0])
    assert sequence_ratio(logp, old, [[1, 0]]).item() == pytest.approx(1.0)


def test_cispo_keeps_the_gradient_of_a_clipped_token_with_its_weight_bounded() -> None:
    logp = torch.tensor([-1.0], requires_grad=True)
    old = torch.tensor([-1.5])  # ratio e^0.5 = 1.65, clipped to 1.2
    loss, clipped = cispo_loss(logp, old, torch.tensor([1.0]), eps_clip=0.2, eps_clip_high=0.2)
    assert loss.item() == pytest.approx(-1.2 * 1.0 * -1.0) and clipped.item() == 1.0
    loss.sum().backward()
    assert logp.grad is not None and logp.grad.item() == pytest.approx(-1.2)  # PPO's clip would give 0


def test_tis_weights_truncate_the_rollout_mismatch() -> None:
    w = tis_weights(torch.tensor([-1.0, -1.0, -1.0]), torch.tensor([-2.0, -1.0, -0.5]), clip_high=2.0, clip_low=0.5)
    assert w.tolist() == pytest.approx([2.0, 1.0, math.exp(-0.5)])
    assert w.requires_grad is False


@pytest.mark.parametrize("kind,value,grad", [
    ("k1", 0.5, 1.0),
    ("k2", 0.125, 0.5),
    ("k3", math.exp(-0.5) - 0.5, 1 - math.exp(-0.5)),
    ("low_var_kl", math.exp(-0.5) - 0.5, 1 - math.exp(-0.5)),
])
def test_kl_estimators(kind: str, value: float, grad: float) -> None:
    logp = torch.tensor([-1.0], requires_grad=True)
    kl = approx_kl(logp, torch.tensor([-1.5]), kind)
    assert kl.item() == pytest.approx(value)
    kl.sum().backward()
    assert logp.grad is not None and logp.grad.item() == pytest.approx(grad)


def test_low_var_kl_is_clamped_and_an_unknown_type_refused() -> None:
    assert approx_kl(torch.tensor([-30.0]), torch.tensor([0.0]), "low_var_kl").item() == 10.0
    assert approx_kl(torch.tensor([-30.0]), torch.tensor([0.0]), "k3").item() > 10.0
    with pytest.raises(ValueError, match="k4"):
        approx_kl(torch.tensor([0.0]), torch.tensor([0.0]), "k4")
