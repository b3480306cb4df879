"""The old-log-prob reuse decision (seed step 38): every condition."""

from __future__ import annotations

import pytest

from vime.algo.logprob_reuse import (
    can_reuse_log_probs_in_loss,
    log_prob_reuse_blockers,
    needs_log_prob_recompute,
)
from vime.config import parse_args


def test_seed_reuses_and_skips_recompute() -> None:
    args = parse_args([], command="train")
    assert can_reuse_log_probs_in_loss(args, [8]) is True
    assert needs_log_prob_recompute(args, [8]) is False
    assert log_prob_reuse_blockers(args, [8]) == []


def test_four_steps_cannot_reuse_and_recomputes() -> None:
    args = parse_args(["--num-steps-per-rollout", "4"], command="train")
    assert can_reuse_log_probs_in_loss(args, [2, 2, 2, 2]) is False
    assert needs_log_prob_recompute(args, [2, 2, 2, 2]) is True
    assert "4 optimizer steps" in log_prob_reuse_blockers(args, [2, 2, 2, 2])[0]


@pytest.mark.parametrize("argv", [
    ["--loss-type", "sft_loss"],
    ["--kl-coef", "0.01"],
    ["--use-rollout-logprobs"],
    ["--get-mismatch-metrics"],
    ["--use-critic"],
    ["--use-opd"],
    ["--use-routing-replay"],
    ["--advantage-estimator", "gspo"],
])
def test_each_condition_blocks_reuse(argv: list[str]) -> None:
    args = parse_args(argv, command="train")
    assert can_reuse_log_probs_in_loss(args, [8]) is False
    assert len(log_prob_reuse_blockers(args, [8])) == 1


def test_rollout_routing_replay_keeps_reuse() -> None:
    args = parse_args(["--use-routing-replay", "--use-rollout-routing-replay"], command="train")
    assert can_reuse_log_probs_in_loss(args, [8]) is True


def test_rollout_logprobs_skip_recompute_unless_mismatch_metrics() -> None:
    args = parse_args(["--use-rollout-logprobs"], command="train")
    assert needs_log_prob_recompute(args, [8]) is False  # engine log-probs are the old ones
    both = parse_args(["--use-rollout-logprobs", "--get-mismatch-metrics"], command="train")
    assert needs_log_prob_recompute(both, [8]) is True
