"""Samples → TrainBatch: columns, group reward normalisation and the DP schedule (seed steps 30–31)."""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import Any

from vime.algo.advantages import normalize_group_rewards
from vime.algo.dp_schedule import build_dp_schedule
from vime.types import Sample, TrainBatch


def _reward(sample: Sample) -> float:
    r = sample.reward
    if isinstance(r, numbers.Real) and not isinstance(r, bool):
        return float(r)
    if isinstance(r, bool):
        return float(r)
    raise ValueError(f"sample {sample.index} (group {sample.group_index}) has reward {r!r}; every sample "
                     f"needs a numeric reward before the batch is built (seed step 26)")


def build_train_batch(samples: Sequence[Sample], args: Any, rollout_id: int, *, balance: bool = True) -> TrainBatch:
    """Convert one rollout's samples (in rollout order) into a scheduled TrainBatch.

    Rewards are normalised per group (`normalize_group_rewards` with the args' estimator and
    std switch); rows are split by `build_dp_schedule` with ``args.data_parallel_size``,
    ``args.micro_batch_size`` and ``args.global_batch_size``. `args` is `vime.config.Args` or
    any object with those names. ``rollout_log_probs`` is kept only when every sample has it.
    """
    if not samples:
        raise ValueError(f"rollout {rollout_id} has no samples to train on")
    tokens, response_lengths, loss_masks, total_lengths = [], [], [], []
    for s in samples:
        if s.response_length > len(s.tokens):
            raise ValueError(f"sample {s.index}: response_length {s.response_length} exceeds its "
                             f"{len(s.tokens)} tokens")
        mask = list(s.loss_mask) if s.loss_mask is not None else [1] * s.response_length
        if len(mask) != s.response_length:
            raise ValueError(f"sample {s.index}: loss_mask has {len(mask)} entries, response_length is "
                             f"{s.response_length}")
        tokens.append(list(s.tokens))
        response_lengths.append(s.response_length)
        loss_masks.append(mask)
        total_lengths.append(len(s.tokens))
    groups = [s.group_index if s.group_index is not None else -1 - i for i, s in enumerate(samples)]
    raw, normalized = normalize_group_rewards(
        [_reward(s) for s in samples], groups, advantage_estimator=args.advantage_estimator,
        grpo_std_normalization=args.grpo_std_normalization)
    log_probs = None
    if all(s.rollout_log_probs is not None for s in samples):
        log_probs = [list(s.rollout_log_probs or ()) for s in samples]
    schedule = build_dp_schedule(total_lengths, dp_size=int(args.data_parallel_size),
                                 micro_batch_size=int(args.micro_batch_size),
                                 global_batch_size=int(args.global_batch_size), balance=balance)
    return TrainBatch(
        rollout_id=rollout_id, tokens=tokens, response_lengths=response_lengths, loss_masks=loss_masks,
        raw_rewards=raw, rewards=normalized, total_lengths=total_lengths,
        sample_indices=[s.index if s.index is not None else i for i, s in enumerate(samples)],
        group_indices=groups, schedule=schedule, rollout_log_probs=log_probs,
        weight_versions=[list(s.weight_versions) for s in samples],
    )
