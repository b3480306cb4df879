"""The old-log-prob reuse decision (seed step 38): every condition."""

from __future__ import annotations

import dataclasses

import pytest

from vime.algo.logprob_reuse import (
    can_reuse_log_probs_in_loss,
    log_prob_reuse_blockers,
    needs_log_prob_recompute,
)
from vime.config import defaults, parse_args


def _algo(**changes: object):  # noqa: ANN202
    """The algorithm options with some changed directly: some blockers are flags the parser now refuses
    (not trained yet), and the decision must still be right for them."""
    return dataclasses.replace(defaults("train").algo, **changes)


def test_seed_reuses_and_skips_recompute() -> None:
    args = parse_args([], command="train")
    assert can_reuse_log_probs_in_loss(args.algo, [8]) is True
    assert needs_log_prob_recompute(args.algo, [8]) is False
    assert log_prob_reuse_blockers(args.algo, [8]) == []


def test_four_steps_cannot_reuse_and_recomputes() -> None:
    args = parse_args(["--num-steps-per-rollout", "4"], command="train")
    assert can_reuse_log_probs_in_loss(args.algo, [2, 2, 2, 2]) is False
    assert needs_log_prob_recompute(args.algo, [2, 2, 2, 2]) is True
    assert "4 optimizer steps" in log_prob_reuse_blockers(args.algo, [2, 2, 2, 2])[0]


@pytest.mark.parametrize("changes", [
    {"loss_type": "sft_loss"},
    {"kl_coef": 0.01, "advantage_estimator": "reinforce_plus_plus_baseline"},
    {"use_rollout_logprobs": True},
    {"get_mismatch_metrics": True},
    {"use_critic": True},
    {"use_opd": True},
    {"use_routing_replay": True},
    {"advantage_estimator": "gspo"},
])
def test_each_condition_blocks_reuse(changes: dict[str, object]) -> None:
    algo = _algo(**changes)
    assert can_reuse_log_probs_in_loss(algo, [8]) is False
    assert len(log_prob_reuse_blockers(algo, [8])) == 1


def test_rollout_routing_replay_keeps_reuse() -> None:
    algo = _algo(use_routing_replay=True, use_rollout_routing_replay=True)
    assert can_reuse_log_probs_in_loss(algo, [8]) is True


def test_rollout_logprobs_skip_recompute_unless_mismatch_metrics() -> None:
    args = parse_args(["--use-rollout-logprobs"], command="train")
    assert needs_log_prob_recompute(args.algo, [8]) is False  # engine log-probs are the old ones
    both = parse_args(["--use-rollout-logprobs", "--get-mismatch-metrics"], command="train")
    assert needs_log_prob_recompute(both.algo, [8]) is True


def test_the_batch_builder_decides_once_and_the_batch_carries_it() -> None:
    from vime.runs.loop import build_batch_builder
    from vime.types import Sample

    def samples() -> list[Sample]:
        out = []
        for i in range(16):
            s = Sample(index=i, group_index=i // 8, tokens=[1, 2, 3, 4], response_length=2, reward=float(i % 2))
            out.append(s)
        return out

    one = build_batch_builder(parse_args(["--rollout-batch-size", "2", "--micro-batch-size", "2"], command="train"))
    assert one.build(0, samples()).recompute_log_probs is False
    four = build_batch_builder(parse_args(["--rollout-batch-size", "2", "--micro-batch-size", "2",
                                    "--num-steps-per-rollout", "2"], command="train"))
    batch = four.build(0, samples())
    assert batch.recompute_log_probs is True and all(batch.for_rank(r).recompute_log_probs for r in range(batch.dp_size))
