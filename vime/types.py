"""Sample (one generated response and its bookkeeping) and TrainBatch (the column batch plus its DP schedule)."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vime.errors import ResponseFormatError


class SampleStatus(enum.Enum):
    """Where a sample is in its life (seed steps 18, 19, 25, 28)."""

    PENDING = "pending"
    COMPLETED = "completed"  # finished by EOS / a stop condition
    TRUNCATED = "truncated"  # hit max_tokens (or had no budget left, seed step 19)
    ABORTED = "aborted"  # the engine aborted it (pause(abort), seed step 28)
    FAILED = "failed"  # the engine reported an error


#: finish_reason of a generate response → status (seed step 25).
FINISH_REASON_STATUS: dict[str, SampleStatus] = {
    "stop": SampleStatus.COMPLETED,
    "length": SampleStatus.TRUNCATED,
    "abort": SampleStatus.ABORTED,
    "error": SampleStatus.FAILED,
}


@dataclass
class Sample:
    """One prompt's copy and the response generated for it.

    Invariants (kept by `append_response_tokens`): ``tokens`` = prompt tokens + response tokens;
    ``response_length`` = number of response tokens; ``loss_mask`` and ``rollout_log_probs``
    (when not None) have exactly ``response_length`` entries.
    """

    Status: ClassVar[type[SampleStatus]] = SampleStatus

    group_index: int | None = None
    index: int | None = None
    prompt: str | list[dict[str, Any]] = ""
    label: Any = None
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    loss_mask: list[int] | None = None
    rollout_log_probs: list[float] | None = None
    reward: float | dict[str, Any] | None = None
    status: SampleStatus = SampleStatus.PENDING
    session_id: str | None = None
    weight_versions: list[str] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def total_length(self) -> int:
        return len(self.tokens)

    def append_response_tokens(self, tokens: Sequence[int], log_probs: Sequence[float], *,
                               trainable: bool = True, meta_info: Mapping[str, Any] | None = None,
                               text: str = "") -> None:
        """Extend tokens, response_length, loss_mask and rollout_log_probs together (seed step 25).

        `tokens` and `log_probs` must be of equal length, else `ResponseFormatError` and the sample
        is left unchanged. ``trainable=False`` appends mask 0 (e.g. tool output in multi-turn).
        `meta_info` (`GenerateResult.meta_info()`) stamps its weight_version onto
        ``weight_versions``, sets the status from ``finish_reason`` and adds cached tokens to
        ``metadata["cached_tokens"]``; `text` is appended to ``response``.
        """
        n = len(tokens)
        if n != len(log_probs):
            engine = str((meta_info or {}).get("engine") or "unknown")
            raise ResponseFormatError(
                engine, "generate",
                f"sample {self.index}: {n} response tokens but {len(log_probs)} log-probs; "
                f"they are zipped by position and must be of equal length")
        if self.loss_mask is None:
            self.loss_mask = [1] * self.response_length
        if self.rollout_log_probs is None:
            # a sample without log-probs so far (e.g. a resumed one) gets the "missing" sentinel
            self.rollout_log_probs = [-9999.0] * self.response_length
        if len(self.loss_mask) != self.response_length or len(self.rollout_log_probs) != self.response_length:
            raise ValueError(
                f"sample {self.index} is inconsistent before append: response_length "
                f"{self.response_length}, loss_mask {len(self.loss_mask)}, rollout_log_probs "
                f"{len(self.rollout_log_probs)}; build samples only through append_response_tokens")
        # map() rather than a generator: this runs for every generated token (the hot spot of
        # vime's own per-step cost), and the conversion keeps numpy scalars out of the sample.
        self.tokens.extend(map(int, tokens))
        self.response_length += n
        self.loss_mask.extend([1 if trainable else 0] * n)
        self.rollout_log_probs.extend(map(float, log_probs))
        self.response += text
        if meta_info:
            version = meta_info.get("weight_version")
            if version is not None:
                self.weight_versions.append(str(version))
            reason = meta_info.get("finish_reason")
            if isinstance(reason, Mapping):
                reason = reason.get("type")
            if reason in FINISH_REASON_STATUS:
                self.status = FINISH_REASON_STATUS[reason]
            cached = meta_info.get("cached_tokens")
            if cached:
                self.metadata["cached_tokens"] = self.metadata.get("cached_tokens", 0) + int(cached)

    def reset_for_retry(self) -> None:
        """Drop the response so the sample can be generated again (aborted samples, seed step 28)."""
        del self.tokens[self.prompt_length:]
        self.response = ""
        self.response_length = 0
        self.loss_mask = None
        self.rollout_log_probs = None
        self.reward = None
        self.status = SampleStatus.PENDING


# --------------------------------------------------------------------------------------------
# The column batch and its DP schedule (seed steps 30–31, 37)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DPSchedule:
    """How one rollout's rows are split into training steps, micro-batches and DP ranks (seed step 31).

    ``partitions[r]``: the batch rows DP rank r trains on, in the order it consumes them.
    ``micro_batch_indices[r][k]``: positions in ``partitions[r]`` forming r's k-th micro-batch
    (steps are consecutive: step s owns micro-batches ``sum(num_microbatches[:s])`` ...).
    ``num_microbatches[s]``: micro-batches per rank in step s (the same on every rank).
    ``global_batch_sizes[s]``: rows in step s.
    """

    partitions: list[list[int]]
    micro_batch_indices: list[list[list[int]]]
    num_microbatches: list[int]
    global_batch_sizes: list[int]

    @property
    def dp_size(self) -> int:
        return len(self.partitions)

    @property
    def num_steps(self) -> int:
        return len(self.num_microbatches)


@dataclass
class RankBatch:
    """One DP rank's share of a TrainBatch (seed step 37: 64 rows, 8 micro-batches × 8 for the seed)."""

    rank: int
    rows: list[int]  # indices into the TrainBatch
    tokens: list[list[int]]
    response_lengths: list[int]
    total_lengths: list[int]
    loss_masks: list[list[int]]
    rewards: list[float]
    raw_rewards: list[float]
    rollout_log_probs: list[list[float]] | None
    sample_indices: list[int]
    micro_batch_indices: list[list[int]]  # positions into this rank's rows
    num_microbatches: list[int]
    recompute_log_probs: bool = False  # TrainBatch.recompute_log_probs (seed step 38)

    def micro_batches(self, step: int | None = None) -> list[list[int]]:
        """Micro-batches (positions into this rank's rows) of one step, or all of them."""
        if step is None:
            return self.micro_batch_indices
        start = sum(self.num_microbatches[:step])
        return self.micro_batch_indices[start:start + self.num_microbatches[step]]


@dataclass
class TrainBatch:
    """One rollout as columns (seed step 30) plus its DP schedule (seed step 31).

    Row i describes one sample: ``tokens[i]`` (prompt + response), ``response_lengths[i]``,
    ``loss_masks[i]`` (response_length entries), ``raw_rewards[i]``, ``rewards[i]`` (after group
    normalisation), ``rollout_log_probs[i]`` (response_length entries, or None for the whole
    batch), ``total_lengths[i]`` = len(tokens[i]) and ``sample_indices[i]`` = Sample.index.
    """

    rollout_id: int
    tokens: list[list[int]]
    response_lengths: list[int]
    loss_masks: list[list[int]]
    raw_rewards: list[float]
    rewards: list[float]
    total_lengths: list[int]
    sample_indices: list[int]
    group_indices: list[int]
    schedule: DPSchedule
    rollout_log_probs: list[list[float]] | None = None
    weight_versions: list[list[str]] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    #: seed step 38, decided once by whoever builds the batch: the trainer runs a separate old-log-prob
    #: forward (True) or reuses its training forward (False); None for a hand-built batch: the
    #: schedule decides (more than one optimizer step per rollout needs it)
    recompute_log_probs: bool | None = None

    def __post_init__(self) -> None:
        if self.recompute_log_probs is None:
            self.recompute_log_probs = len(self.schedule.num_microbatches) != 1
        n = len(self.tokens)
        columns: dict[str, Sequence[Any]] = {"response_lengths": self.response_lengths, "loss_masks": self.loss_masks,
                   "raw_rewards": self.raw_rewards, "rewards": self.rewards,
                   "total_lengths": self.total_lengths, "sample_indices": self.sample_indices,
                   "group_indices": self.group_indices}
        if self.rollout_log_probs is not None:
            columns["rollout_log_probs"] = self.rollout_log_probs
        for name, col in columns.items():
            if len(col) != n:
                raise ValueError(f"TrainBatch column {name} has {len(col)} rows, tokens has {n}")

    def __len__(self) -> int:
        return len(self.tokens)

    # Convenience views of the schedule (the names Megatron-side code expects).
    @property
    def partitions(self) -> list[list[int]]:
        return self.schedule.partitions

    @property
    def micro_batch_indices(self) -> list[list[list[int]]]:
        return self.schedule.micro_batch_indices

    @property
    def num_microbatches(self) -> list[int]:
        return self.schedule.num_microbatches

    @property
    def global_batch_sizes(self) -> list[int]:
        return self.schedule.global_batch_sizes

    @property
    def dp_size(self) -> int:
        return self.schedule.dp_size

    @property
    def num_tokens(self) -> int:
        return sum(self.total_lengths)

    def for_rank(self, rank: int) -> RankBatch:
        """The rows DP rank `rank` trains on, in consumption order, with its micro-batch indices."""
        if not 0 <= rank < self.dp_size:
            raise IndexError(f"DP rank {rank} out of range: the schedule has {self.dp_size} ranks")
        rows = self.schedule.partitions[rank]

        def pick(col: list[Any]) -> list[Any]:
            return [col[i] for i in rows]

        return RankBatch(
            rank=rank, rows=list(rows), tokens=pick(self.tokens), response_lengths=pick(self.response_lengths),
            total_lengths=pick(self.total_lengths), loss_masks=pick(self.loss_masks),
            rewards=pick(self.rewards), raw_rewards=pick(self.raw_rewards),
            rollout_log_probs=None if self.rollout_log_probs is None else pick(self.rollout_log_probs),
            sample_indices=pick(self.sample_indices),
            micro_batch_indices=self.schedule.micro_batch_indices[rank],
            num_microbatches=list(self.schedule.num_microbatches),
            recompute_log_probs=bool(self.recompute_log_probs),
        )
