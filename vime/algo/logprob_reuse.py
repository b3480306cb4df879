"""Whether the trainer may skip the separate old-log-prob forward pass (seed step 38)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vime.config import AlgoConfig


def log_prob_reuse_blockers(algo: AlgoConfig, num_microbatches: Sequence[int]) -> list[str]:
    """The reasons the old log-probs cannot be taken from the training forward itself; empty = reusable.

    Reuse is sound only when the policy cannot have changed between the rollout's "old" policy
    and the forward that computes the loss: a single optimizer step per rollout, and nothing
    else that needs the old log-probs as a separate tensor.
    """
    reasons = []
    if len(num_microbatches) != 1:
        reasons.append(f"{len(num_microbatches)} optimizer steps per rollout (policy changes after the first)")
    if algo.loss_type != "policy_loss":
        reasons.append(f"loss_type {algo.loss_type!r} is not policy_loss")
    if algo.kl_coef != 0:
        reasons.append(f"kl_coef {algo.kl_coef} ≠ 0")
    if algo.use_rollout_logprobs:
        reasons.append("use_rollout_logprobs (the engine's log-probs are the old log-probs)")
    if algo.get_mismatch_metrics:
        reasons.append("get_mismatch_metrics needs trainer log-probs to compare")
    if algo.use_critic:
        reasons.append("use_critic")
    if algo.use_opd:
        reasons.append("use_opd")
    if algo.use_routing_replay and not algo.use_rollout_routing_replay:
        reasons.append("use_routing_replay without use_rollout_routing_replay records routes in a separate pass")
    if algo.advantage_estimator == "gspo":
        reasons.append("gspo uses sequence-level ratios of the old policy")
    return reasons


def can_reuse_log_probs_in_loss(algo: AlgoConfig, num_microbatches: Sequence[int]) -> bool:
    """True when old log-probs = current.detach() is exact (seed step 38): True for the seed, False with 4 steps."""
    return not log_prob_reuse_blockers(algo, num_microbatches)


def needs_log_prob_recompute(algo: AlgoConfig, num_microbatches: Sequence[int]) -> bool:
    """Whether the trainer runs compute_log_prob over the whole batch before training (seed step 38)."""
    wants_trainer_log_probs = not algo.use_rollout_logprobs or algo.get_mismatch_metrics
    return bool(wants_trainer_log_probs) and not can_reuse_log_probs_in_loss(algo, num_microbatches)
