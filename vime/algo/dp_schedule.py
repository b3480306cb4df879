"""The DP training schedule: steps, micro-batches per step, rows per DP rank, balanced by length (seed step 31)."""

from __future__ import annotations

from collections.abc import Sequence

from vime.errors import ConfigError
from vime.types import DPSchedule


def _balanced_equal_split(items: Sequence[int], lengths: Sequence[int], parts: int) -> list[list[int]]:
    """Split `items` into `parts` lists of equal size with near-equal length sums.

    Longest first, one item per part per round; within a round the longest item goes to the
    currently lightest part. This keeps every part's size equal and bounds the spread of the
    sums by the longest single item (each round adds anti-sorted increments to the loads).
    Ties break on position, so the result is deterministic.
    """
    order = sorted(items, key=lambda i: (-lengths[i], i))
    buckets: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for start in range(0, len(order), parts):
        round_items = order[start:start + parts]
        by_load = sorted(range(parts), key=lambda p: (loads[p], p))
        for item, p in zip(round_items, by_load, strict=False):
            buckets[p].append(item)
            loads[p] += lengths[item]
    for b in buckets:
        b.sort()  # consume in sample order within a rank
    return buckets


def build_dp_schedule(
    total_lengths: Sequence[int],
    *,
    dp_size: int,
    micro_batch_size: int,
    global_batch_size: int,
    balance: bool = True,
) -> DPSchedule:
    """Split one rollout's rows into optimizer steps, DP ranks and micro-batches (seed step 31).

    Steps take consecutive rows: ``num_steps = len(total_lengths) // global_batch_size`` (the
    count must divide exactly). Within a step each rank gets ``global_batch_size / dp_size``
    rows — chosen to balance the token sums across ranks when `balance`, else as contiguous
    micro-batches dealt round-robin — cut into micro-batches of `micro_batch_size`.
    The seed (256 rows, gbs 256, mbs 8, DP 4) gives ``num_microbatches == [8]``; with 4 steps
    (gbs 64) ``[2, 2, 2, 2]``.
    """
    n = len(total_lengths)
    for name, value in (("dp_size", dp_size), ("micro_batch_size", micro_batch_size),
                        ("global_batch_size", global_batch_size)):
        if value < 1:
            raise ConfigError(f"{name} must be ≥ 1, got {value}")
    if n == 0 or n % global_batch_size:
        raise ConfigError(
            f"{n} samples cannot be split into optimizer steps of --global-batch-size {global_batch_size}; "
            f"the rollout must produce a multiple of it (--rollout-batch-size × --n-samples-per-prompt)")
    per_rank = global_batch_size // dp_size
    if global_batch_size % (micro_batch_size * dp_size):
        raise ConfigError(
            f"--global-batch-size {global_batch_size} is not divisible by --micro-batch-size "
            f"{micro_batch_size} × DP {dp_size} = {micro_batch_size * dp_size}; every DP rank needs the "
            f"same number of full micro-batches")
    mbs_per_rank = per_rank // micro_batch_size
    num_steps = n // global_batch_size

    partitions: list[list[int]] = [[] for _ in range(dp_size)]
    micro_batch_indices: list[list[list[int]]] = [[] for _ in range(dp_size)]
    for step in range(num_steps):
        rows = list(range(step * global_batch_size, (step + 1) * global_batch_size))
        if balance:
            rank_rows = _balanced_equal_split(rows, total_lengths, dp_size)
        else:
            chunks = [rows[i:i + micro_batch_size] for i in range(0, len(rows), micro_batch_size)]
            rank_rows = [[r for chunk in chunks[rank::dp_size] for r in chunk] for rank in range(dp_size)]
        for rank in range(dp_size):
            start = len(partitions[rank])
            partitions[rank].extend(rank_rows[rank])
            for k in range(mbs_per_rank):
                first = start + k * micro_batch_size
                micro_batch_indices[rank].append(list(range(first, first + micro_batch_size)))
    return DPSchedule(
        partitions=partitions,
        micro_batch_indices=micro_batch_indices,
        num_microbatches=[mbs_per_rank] * num_steps,
        global_batch_sizes=[global_batch_size] * num_steps,
    )
