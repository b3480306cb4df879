"""Sample.append_response_tokens (seed step 25) and TrainBatch per-rank views (seed step 37)."""

from __future__ import annotations

import pytest

from vime.algo.dp_schedule import build_dp_schedule
from vime.errors import ResponseFormatError
from vime.protocols import GenerateResult
from vime.types import RankBatch, Sample, SampleStatus, TrainBatch


def seed_result() -> GenerateResult:
    return GenerateResult(token_ids=[101, 202, 151645], log_probs=[-0.42, -1.10, -0.08], finish_reason="stop",
                          prompt_tokens=200, completion_tokens=3, cached_tokens=0, weight_version="1")


def test_append_seed_step25() -> None:
    sample = Sample(index=0, group_index=0, tokens=list(range(1000, 1200)))
    result = seed_result()
    sample.append_response_tokens(result.token_ids, result.log_probs, trainable=True,
                                  meta_info=result.meta_info(), text="abc")
    assert len(sample.tokens) == 203
    assert sample.tokens[-3:] == [101, 202, 151645]
    assert sample.response_length == 3
    assert sample.loss_mask == [1, 1, 1]
    assert sample.rollout_log_probs == [-0.42, -1.10, -0.08]
    assert sample.weight_versions == ["1"]
    assert sample.status is SampleStatus.COMPLETED
    assert sample.response == "abc"
    assert sample.prompt_length == 200


def test_append_rejects_mismatched_lengths_and_leaves_sample_unchanged() -> None:
    sample = Sample(index=7, tokens=[1, 2])
    with pytest.raises(ResponseFormatError, match="3 response tokens but 2 log-probs"):
        sample.append_response_tokens([5, 6, 7], [-0.1, -0.2])
    assert sample.tokens == [1, 2] and sample.response_length == 0 and sample.loss_mask is None


def test_append_twice_non_trainable_and_versions() -> None:
    sample = Sample(tokens=[1])
    sample.append_response_tokens([2, 3], [-0.5, -0.6], meta_info={"weight_version": "1",
                                                                   "finish_reason": {"type": "abort"}})
    assert sample.status is SampleStatus.ABORTED
    sample.append_response_tokens([4], [-0.7], trainable=False, meta_info={"weight_version": "2",
                                                                          "finish_reason": {"type": "length"},
                                                                          "cached_tokens": 5})
    assert sample.tokens == [1, 2, 3, 4] and sample.response_length == 3
    assert sample.loss_mask == [1, 1, 0]
    assert sample.weight_versions == ["1", "2"]
    assert sample.status is SampleStatus.TRUNCATED
    assert sample.metadata["cached_tokens"] == 5
    sample.reset_for_retry()
    assert sample.tokens == [1] and sample.response_length == 0 and sample.status is SampleStatus.PENDING


def test_sample_status_alias_and_inconsistent_state() -> None:
    assert Sample.Status.TRUNCATED is SampleStatus.TRUNCATED
    broken = Sample(tokens=[1, 2, 3], response_length=2, loss_mask=[1])
    with pytest.raises(ValueError, match="inconsistent"):
        broken.append_response_tokens([4], [-1.0])


def make_batch(n: int = 256, gbs: int = 256) -> TrainBatch:
    lengths = [200 + (i * 37) % 900 for i in range(n)]
    schedule = build_dp_schedule(lengths, dp_size=4, micro_batch_size=8, global_batch_size=gbs)
    return TrainBatch(
        rollout_id=0, tokens=[[1] * n_ for n_ in lengths], response_lengths=[n_ - 100 for n_ in lengths],
        loss_masks=[[1] * (n_ - 100) for n_ in lengths], raw_rewards=[float(i % 2) for i in range(n)],
        rewards=[float(i % 2) - 0.5 for i in range(n)], total_lengths=lengths, sample_indices=list(range(n)),
        group_indices=[i // 8 for i in range(n)], schedule=schedule)


def test_train_batch_for_rank_seed_step37() -> None:
    batch = make_batch()
    assert batch.num_microbatches == [8] and batch.dp_size == 4
    seen: list[int] = []
    for rank in range(4):
        part = batch.for_rank(rank)
        assert isinstance(part, RankBatch)
        assert len(part.rows) == 64  # 256 / 4 (seed step 37)
        assert len(part.micro_batches(0)) == 8 and all(len(mb) == 8 for mb in part.micro_batches())
        assert part.total_lengths == [batch.total_lengths[r] for r in part.rows]
        assert part.sample_indices == part.rows
        seen.extend(part.rows)
    assert sorted(seen) == list(range(256))
    with pytest.raises(IndexError, match="DP rank 4"):
        batch.for_rank(4)


def test_train_batch_four_steps_micro_batches_per_step() -> None:
    part = make_batch(gbs=64).for_rank(1)
    assert part.num_microbatches == [2, 2, 2, 2]
    assert [len(part.micro_batches(s)) for s in range(4)] == [2, 2, 2, 2]
    assert part.micro_batches(3) == part.micro_batch_indices[6:8]


def test_train_batch_rejects_ragged_columns() -> None:
    batch = make_batch()
    with pytest.raises(ValueError, match="rewards has 255 rows"):
        TrainBatch(rollout_id=0, tokens=batch.tokens, response_lengths=batch.response_lengths,
                   loss_masks=batch.loss_masks, raw_rewards=batch.raw_rewards, rewards=batch.rewards[:-1],
                   total_lengths=batch.total_lengths, sample_indices=batch.sample_indices,
                   group_indices=batch.group_indices, schedule=batch.schedule)
