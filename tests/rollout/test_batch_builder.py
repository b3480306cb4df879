"""BatchBuilder (seed steps 30–31, 42): columns, group normalisation, the DP split, per-rank data."""

from __future__ import annotations

import pytest

from vime.config import defaults
from vime.errors import ConfigError
from vime.runs.loop import build_batch_builder
from vime.types import Sample

SEED_REWARDS = [1, 0, 0, 1, 1, 0, 1, 0]


def seed_samples(n_groups=32, n=8):
    out = []
    for g in range(n_groups):
        for k in range(n):
            s = Sample(group_index=g, index=g * n + k, tokens=list(range(200)))
            length = 3 + (g * n + k) % 5
            s.append_response_tokens(list(range(length)), [-0.1] * length,
                                     meta_info={"weight_version": "1", "finish_reason": {"type": "stop"}})
            s.reward = SEED_REWARDS[k]
            out.append(s)
    return out


def test_seed_batch_columns_normalisation_and_schedule():
    args = defaults("train")
    batch = build_batch_builder(args).build(0, seed_samples())
    assert len(batch) == 256
    assert batch.raw_rewards[:8] == [float(r) for r in SEED_REWARDS]
    assert [round(r, 4) for r in batch.rewards[:8]] == [0.9354, -0.9354, -0.9354, 0.9354, 0.9354, -0.9354,
                                                        0.9354, -0.9354]
    assert batch.num_microbatches == [8] and batch.dp_size == 4
    assert batch.total_lengths[0] == 203 and batch.response_lengths[0] == 3
    assert batch.rollout_log_probs is not None and batch.rollout_log_probs[0] == [-0.1] * 3
    assert batch.weight_versions[0] == ["1"]
    rows = []
    for rank in range(4):
        part = batch.for_rank(rank)
        assert len(part.rows) == 64 and len(part.micro_batches()) == 8
        assert all(len(mb) == 8 for mb in part.micro_batches())
        rows += part.rows
    assert sorted(rows) == list(range(256))  # every sample trained exactly once


def test_four_steps_give_two_microbatches_per_step():
    args = defaults("train").replace(num_steps_per_rollout=4, micro_batch_size=8)
    assert build_batch_builder(args).build(0, seed_samples()).num_microbatches == [2, 2, 2, 2]


def test_uniform_group_normalises_to_zero_and_dict_rewards_are_read():
    samples = seed_samples(4)
    for s in samples[:8]:
        s.reward = {"reward": 1.0, "acc": 1}
    args = defaults("train").replace(rollout_batch_size=4, micro_batch_size=1)
    batch = build_batch_builder(args).build(0, samples)
    assert batch.rewards[:8] == [0.0] * 8 and batch.raw_rewards[:8] == [1.0] * 8


def test_missing_reward_and_unconsumed_batches_are_errors():
    args = defaults("train")
    samples = seed_samples()
    samples[3].reward = None
    with pytest.raises(ConfigError, match="sample 3 .*without a reward"):
        build_batch_builder(args).build(0, samples)
    bb = build_batch_builder(args)
    bb.build(0, seed_samples())
    with pytest.raises(ConfigError, match="training_completed"):
        bb.build(1, seed_samples())
    bb.training_completed(0)
    bb.build(1, seed_samples())
