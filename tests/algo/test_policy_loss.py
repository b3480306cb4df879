"""PPO policy loss (seed step 40): ratio 1 with a live gradient, clipping kills the gradient, masks aggregate."""

from __future__ import annotations

import math

import pytest
import torch

from vime.algo.policy_loss import aggregate, compute_policy_loss, policy_loss

A = 0.5 / (math.sqrt(8 * 0.25 / 7) + 1e-6)  # the seed's normalised advantage, 0.9354


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_ratio_one_loss_is_minus_advantage_with_gradient(sign: float) -> None:
    current = torch.tensor([-0.42, -1.10, -0.08], requires_grad=True)
    old = current.detach()  # reuse: old = current.detach() (seed step 38)
    adv = torch.full((3,), sign * A)
    out = policy_loss(current, old, adv, [[1, 1, 1]], eps_clip=0.2)
    assert round(out.loss.item(), 4) == round(-sign * 0.9354, 4)
    assert out.ratio_mean.item() == 1.0 and out.clipfrac.item() == 0.0 and out.ppo_kl.item() == 0.0
    out.loss.backward()
    assert current.grad is not None
    assert current.grad.tolist() == pytest.approx([-sign * A / 3] * 3, rel=1e-6)


@pytest.mark.parametrize(("ratio", "adv"), [(1.5, A), (0.5, -A)])
def test_clipped_token_has_zero_gradient(ratio: float, adv: float) -> None:
    old = torch.tensor([-1.0])
    current = (old + math.log(ratio)).clone().requires_grad_(True)
    out = policy_loss(current, old, torch.tensor([adv]), [[1]], eps_clip=0.2, eps_clip_high=0.2)
    bound = 1.2 if adv > 0 else 0.8
    assert out.loss.item() == pytest.approx(-bound * adv, rel=1e-5)
    assert out.clipfrac.item() == 1.0
    out.loss.backward()
    assert current.grad is not None and current.grad.item() == 0.0


def test_unclipped_inside_range_keeps_gradient() -> None:
    old = torch.tensor([-1.0])
    current = (old + math.log(1.1)).clone().requires_grad_(True)
    out = policy_loss(current, old, torch.tensor([A]), [[1]], eps_clip=0.2)
    out.loss.backward()
    assert current.grad is not None and current.grad.item() == pytest.approx(-1.1 * A, rel=1e-5)


def test_asymmetric_clip_high() -> None:
    ppo_kl = -torch.log(torch.tensor([1.25, 1.25]))
    loss, clip = compute_policy_loss(ppo_kl, torch.tensor([1.0, 1.0]), 0.2, 0.28)
    assert loss.tolist() == pytest.approx([-1.25, -1.25]) and clip.tolist() == [0.0, 0.0]
    loss, clip = compute_policy_loss(ppo_kl, torch.tensor([1.0, 1.0]), 0.2, 0.2)
    assert loss.tolist() == pytest.approx([-1.2, -1.2]) and clip.tolist() == [1.0, 1.0]


def test_dual_clip_caps_negative_advantage_loss() -> None:
    old = torch.tensor([-5.0, -5.0])
    current = (old + math.log(10.0)).clone().requires_grad_(True)
    adv = torch.tensor([-1.0, 1.0])
    out = policy_loss(current, old, adv, [[1, 1]], eps_clip=0.2, eps_clip_c=3.0, aggregation="token_mean")
    per_token, _ = compute_policy_loss(old - current.detach(), adv, 0.2, 0.2, 3.0)
    # negative advantage: min(3·|A|, 10·|A|) = 3; positive: clipped at 1.2 → -1.2
    assert per_token.tolist() == pytest.approx([3.0, -1.2], rel=1e-5)
    out.loss.backward()
    assert current.grad is not None and current.grad.tolist() == [0.0, 0.0]
    no_dual, _ = compute_policy_loss(old - current.detach(), adv, 0.2, 0.2)
    assert no_dual[0].item() == pytest.approx(10.0, rel=1e-5)
    with pytest.raises(ValueError, match="eps_clip_c must be > 1"):
        compute_policy_loss(old, adv, 0.2, 0.2, 0.9)


def test_loss_mask_excludes_tokens_from_value_and_gradient() -> None:
    current = torch.tensor([-1.0, -2.0, -3.0, -4.0], requires_grad=True)
    adv = torch.tensor([1.0, 1.0, 5.0, 2.0])
    out = policy_loss(current, current.detach(), adv, [[1, 1, 0], [1]], eps_clip=0.2)
    assert out.loss.item() == pytest.approx(-(1.0 + 1.0 + 2.0) / 3)
    out.loss.backward()
    assert current.grad is not None and current.grad[2].item() == 0.0


def test_token_mean_vs_sample_mean() -> None:
    values = torch.tensor([1.0, 1.0, 1.0, 4.0])
    masks = [[1, 1, 1], [1]]
    assert aggregate(values, masks, "token_mean").item() == pytest.approx(7 / 4)
    assert aggregate(values, masks, "sample_mean").item() == pytest.approx((1.0 + 4.0) / 2)
    # an all-masked sample counts as 0 in the per-sample mean and nothing in the per-token mean
    assert aggregate(torch.tensor([2.0, 9.0]), [[1], [0]], "sample_mean").item() == pytest.approx(1.0)
    assert aggregate(torch.tensor([2.0, 9.0]), [[1], [0]], "token_mean").item() == pytest.approx(2.0)


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="loss masks cover 2"):
        aggregate(torch.zeros(3), [[1, 1]])
    with pytest.raises(ValueError, match="same shape"):
        policy_loss(torch.zeros(3), torch.zeros(2), torch.zeros(3), [[1, 1, 1]], eps_clip=0.2)
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(torch.zeros(1), [[1]], "mean")  # type: ignore[arg-type]
