"""build_train_batch: the seed's 32 × 8 samples become one scheduled TrainBatch (seed steps 16, 30–31, 37)."""

from __future__ import annotations

import pytest

from vime.algo.batch import build_train_batch
from vime.config import parse_args
from vime.types import Sample

SEED_REWARDS = [1, 0, 0, 1, 1, 0, 1, 0]


def seed_samples(groups: int = 32, n: int = 8) -> list[Sample]:
    """Samples numbered as the data source of seed step 16 numbers them; rewards of group 0 as in step 26."""
    out = []
    for g in range(groups):
        for k in range(n):
            i = g * n + k
            s = Sample(group_index=g, index=i, tokens=list(range(200)))
            length = 3 + (i * 53) % 1000
            s.append_response_tokens([7] * length, [-0.5] * length, meta_info={"weight_version": "1"})
            s.reward = SEED_REWARDS[k] if g == 0 else float(k % 3 == 0)
            out.append(s)
    return out


def test_seed_numbering_and_batch() -> None:
    samples = seed_samples()
    batch = build_train_batch(samples, parse_args([], command="train"), rollout_id=0)
    assert len(batch) == 256
    # the numbering of seed step 16 is carried into the columns (group_index 0..31, index 0..255)
    assert batch.group_indices == [i // 8 for i in range(256)]
    assert batch.sample_indices == list(range(256))
    assert [round(r, 4) for r in batch.rewards[:8]] == [0.9354, -0.9354, -0.9354, 0.9354, 0.9354, -0.9354,
                                                         0.9354, -0.9354]
    assert batch.raw_rewards[:8] == [float(r) for r in SEED_REWARDS]
    assert batch.num_microbatches == [8]
    assert all(len(batch.for_rank(r).rows) == 64 for r in range(4))
    assert batch.total_lengths[0] == 203 and batch.rollout_log_probs is not None
    assert batch.weight_versions[0] == ["1"]


def test_four_steps_batch() -> None:
    batch = build_train_batch(seed_samples(), parse_args(["--num-steps-per-rollout", "4"], command="train"), 0)
    assert batch.num_microbatches == [2, 2, 2, 2]


def test_missing_reward_and_log_probs() -> None:
    samples = seed_samples(groups=4)
    samples[3].reward = None
    args = parse_args(["--rollout-batch-size", "4"], command="train")
    with pytest.raises(ValueError, match="sample 3 .* numeric reward"):
        build_train_batch(samples, args, 0)
    samples[3].reward = 1.0
    samples[5].rollout_log_probs = None
    samples[5].loss_mask = None
    assert build_train_batch(samples, args, 0).rollout_log_probs is None
