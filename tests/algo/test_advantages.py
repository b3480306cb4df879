"""Group reward normalisation (seed step 30) and GRPO returns (seed step 39), with hypothesis properties."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vime.algo.advantages import (
    compute_advantages_and_returns,
    get_grpo_returns,
    masked_whiten,
    normalize_group_rewards,
)

SEED_REWARDS = [1, 0, 0, 1, 1, 0, 1, 0]


def test_seed_group_becomes_pm_09354() -> None:
    raw, norm = normalize_group_rewards(SEED_REWARDS, [0] * 8)
    assert raw == [1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    # mean 0.5, unbiased std sqrt(8 × 0.25 / 7) = 0.5345, 0.5 / (0.5345 + 1e-6) = 0.9354
    expected = 0.5 / (math.sqrt(8 * 0.25 / 7) + 1e-6)
    assert [round(x, 4) for x in norm] == [0.9354, -0.9354, -0.9354, 0.9354, 0.9354, -0.9354, 0.9354, -0.9354]
    assert norm[0] == pytest.approx(expected, rel=1e-6)


def test_all_equal_group_gives_zeros() -> None:
    _, norm = normalize_group_rewards([1] * 8, [3] * 8)
    assert norm == [0.0] * 8


def test_groups_are_independent_and_order_preserved() -> None:
    rewards = SEED_REWARDS + [1] * 8
    groups = [0] * 8 + [1] * 8
    # interleave the two groups: the result must follow the samples, not their positions
    order = [i for pair in zip(range(8), range(8, 16), strict=True) for i in pair]
    _, norm = normalize_group_rewards([rewards[i] for i in order], [groups[i] for i in order])
    assert [round(x, 4) for x in norm[0::2]] == [0.9354, -0.9354, -0.9354, 0.9354, 0.9354, -0.9354, 0.9354, -0.9354]
    assert norm[1::2] == [0.0] * 8


def test_std_normalization_off_and_singleton_and_baseline() -> None:
    _, centred = normalize_group_rewards(SEED_REWARDS, [0] * 8, grpo_std_normalization=False)
    assert centred == [0.5, -0.5, -0.5, 0.5, 0.5, -0.5, 0.5, -0.5]
    _, single = normalize_group_rewards([0.7], [0])  # a group of one: centred, never divided
    assert single == [0.0]
    _, base = normalize_group_rewards(SEED_REWARDS, [0] * 8, advantage_estimator="reinforce_plus_plus_baseline")
    assert base == centred
    for est in ("gspo", "cispo"):
        assert normalize_group_rewards(SEED_REWARDS, [0] * 8, advantage_estimator=est)[1] == \
            normalize_group_rewards(SEED_REWARDS, [0] * 8)[1]


def test_length_mismatch_is_an_error() -> None:
    with pytest.raises(ValueError, match="3 rewards but 2 group indices"):
        normalize_group_rewards([1, 0, 1], [0, 0])


def test_grpo_returns_broadcast_seed_step39() -> None:
    _, norm = normalize_group_rewards(SEED_REWARDS, [0] * 8)
    adv, ret = compute_advantages_and_returns("grpo", norm, [3] + [5] * 7)
    assert [round(x, 4) for x in adv[0].tolist()] == [0.9354, 0.9354, 0.9354]
    assert torch.equal(adv[0], ret[0]) and adv[1].shape == (5,)
    assert [t.numel() for t in get_grpo_returns([1.0, 2.0], [0, 2])] == [0, 2]


def test_reinforce_baseline_whitens_over_masked_tokens() -> None:
    adv, _ = compute_advantages_and_returns("reinforce_plus_plus_baseline", [1.0, -1.0, 0.5], [2, 3, 1],
                                            [[1, 1], [1, 1, 0], [1]])
    flat = torch.cat(adv)
    mask = torch.tensor([1, 1, 1, 1, 0, 1], dtype=torch.bool)
    assert flat[mask].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert flat[mask].var(unbiased=False).item() == pytest.approx(1.0, abs=1e-4)
    with pytest.raises(ValueError, match="not supported"):
        compute_advantages_and_returns("ppo", [1.0], [1])


def test_masked_whiten_ignores_masked_positions() -> None:
    out = masked_whiten(torch.tensor([1.0, 3.0, 1000.0]), torch.tensor([1, 1, 0]))
    assert out[:2].tolist() == pytest.approx([-1.0, 1.0], abs=1e-4)


reward_lists = st.lists(st.sampled_from([0.0, 0.5, 1.0, -1.0, 2.0]), min_size=1, max_size=16)


@settings(max_examples=200, deadline=None)
@given(groups=st.lists(reward_lists, min_size=1, max_size=6))
def test_property_group_mean_zero_and_unit_std(groups: list[list[float]]) -> None:
    rewards = [r for g in groups for r in g]
    indices = [gi for gi, g in enumerate(groups) for _ in g]
    raw, norm = normalize_group_rewards(rewards, indices)
    assert raw == rewards and len(norm) == len(rewards)
    start = 0
    for g in groups:
        part = norm[start:start + len(g)]
        start += len(g)
        assert abs(sum(part) / len(part)) < 1e-5
        if len(g) > 1 and len(set(g)) > 1:
            assert statistics.stdev(part) == pytest.approx(1.0, rel=1e-3)
        if len(set(g)) == 1:
            assert all(abs(x) < 1e-6 for x in part)


@settings(max_examples=100, deadline=None)
@given(group=st.lists(st.floats(-10, 10, allow_nan=False), min_size=2, max_size=12),
       shift=st.floats(-5, 5, allow_nan=False))
def test_property_shift_invariance(group: list[float], shift: float) -> None:
    _, a = normalize_group_rewards(group, [0] * len(group), grpo_std_normalization=False)
    _, b = normalize_group_rewards([x + shift for x in group], [0] * len(group), grpo_std_normalization=False)
    assert a == pytest.approx(b, abs=1e-4)
