"""Samples → the column TrainBatch with group-normalised rewards and its DP schedule (seed steps 30–31, 42).

`BatchBuilder.build(rollout_id, samples)` is the seed's ``begin + convert`` followed by
``split_by_dp``: it lays the samples out as columns (tokens, response lengths, loss masks, raw
and normalised rewards, rollout log-probs, total lengths), normalises rewards per group with the
algorithm's own function, and attaches the DP schedule (which rows each DP rank trains on, in
which micro-batches). `training_completed` (seed step 42) marks a batch as consumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from vime.algo.advantages import normalize_group_rewards
from vime.algo.dp_schedule import build_dp_schedule
from vime.algo.logprob_reuse import needs_log_prob_recompute
from vime.errors import ConfigError
from vime.types import Sample, TrainBatch

if TYPE_CHECKING:
    from vime.config import AlgoConfig, TrainConfig


class BatchBuilder:
    """Builds one TrainBatch per rollout; holds at most `max_outstanding` batches not yet trained on."""

    def __init__(self, train: TrainConfig, algo: AlgoConfig, *, dp_size: int, reward_key: str | None = None,
                 max_outstanding: int = 1) -> None:
        self.train = train
        self.algo = algo
        self.dp_size = dp_size
        self.max_outstanding = max_outstanding
        self.reward_key = reward_key  # --reward-key
        self.outstanding: list[int] = []  # rollout ids built and not yet reported trained

    # --- seed step 30 -----------------------------------------------------------------------------
    def build(self, rollout_id: int, samples: Sequence[Sample]) -> TrainBatch:
        """Columns, normalised rewards and the DP schedule of one rollout's samples."""
        if len(self.outstanding) >= self.max_outstanding:
            raise ConfigError(f"BatchBuilder: rollout {rollout_id} built while rollouts {self.outstanding} "
                              f"are not yet trained; call training_completed() after each train (seed step 42)")
        tokens: list[list[int]] = []
        response_lengths: list[int] = []
        loss_masks: list[list[int]] = []
        raw: list[float] = []
        groups: list[int] = []
        indices: list[int] = []
        totals: list[int] = []
        log_probs: list[list[float]] | None = []
        versions: list[list[str]] = []
        for s in samples:
            if s.reward is None:
                raise ConfigError(f"sample {s.index} (group {s.group_index}) reached the batch without a reward")
            tokens.append(s.tokens)
            response_lengths.append(s.response_length)
            loss_masks.append(s.loss_mask if s.loss_mask is not None else [1] * s.response_length)
            raw.append(self._reward(s))
            if s.index is None:
                raise ConfigError("a sample without an index reached the batch; samples come numbered from the "
                                  "data source (seed step 16)")
            groups.append(s.group_index if s.group_index is not None else s.index)
            indices.append(s.index)
            totals.append(len(s.tokens))
            versions.append(s.weight_versions)
            if log_probs is not None:
                if s.rollout_log_probs is None:
                    log_probs = None  # one sample without log-probs: the column is absent
                else:
                    log_probs.append(s.rollout_log_probs)
        raw_rewards, rewards = normalize_group_rewards(
            raw, groups, advantage_estimator=self.algo.advantage_estimator,
            grpo_std_normalization=self.algo.grpo_std_normalization)
        # --- seed step 31 -------------------------------------------------------------------------
        schedule = build_dp_schedule(totals, dp_size=self.dp_size, micro_batch_size=self.train.micro_batch_size,
                                     global_batch_size=self.train.global_batch_size)
        self.outstanding.append(rollout_id)
        return TrainBatch(rollout_id=rollout_id, tokens=tokens, response_lengths=response_lengths,
                          loss_masks=loss_masks, raw_rewards=raw_rewards, rewards=rewards, total_lengths=totals,
                          sample_indices=indices, group_indices=groups, schedule=schedule,
                          rollout_log_probs=log_probs, weight_versions=versions,
                          recompute_log_probs=needs_log_prob_recompute(self.algo, schedule.num_microbatches))

    def _reward(self, s: Sample) -> float:
        r = s.reward
        if isinstance(r, dict):
            key = self.reward_key or ("reward" if "reward" in r else next(iter(r)))
            if key not in r:
                raise ConfigError(f"sample {s.index}: reward has no key {key!r} (keys {sorted(r)}); set --reward-key")
            r = r[key]
        return float(r)  # type: ignore[arg-type]

    # --- seed step 42 -----------------------------------------------------------------------------
    def training_completed(self, rollout_id: int) -> None:
        """The trainer consumed rollout `rollout_id`'s batch; its slot is free again."""
        if rollout_id in self.outstanding:
            self.outstanding.remove(rollout_id)
