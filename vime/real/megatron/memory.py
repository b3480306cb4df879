"""Where a trainer rank's GPU memory lives (issue 25): each offload tag, PyTorch's other pools, the peak, the whole device.

The simulator's resident-trainer bytes decide whether the engines can wake (an OOM at the second
wake on the H200, 2026-12-02); these figures, logged under ``memory/`` with every step, are what
it is checked against.
"""

from __future__ import annotations

import sys
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from vime.real.megatron.offload import OFFLOAD_TAGS

GIB = float(2**30)


def segments_by_pool(segments: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """(reserved, allocated) bytes of PyTorch's segments per pool: "default" for the caching allocator's
    own pool, "private" for every other one (a MemPool, a CUDA graph's)."""
    out: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for seg in segments:
        pool = tuple(seg.get("segment_pool_id") or (0, 0))
        row = out["default" if pool == (0, 0) else "private"]
        row[0] += int(seg["total_size"])
        row[1] += int(seg["allocated_size"])
    return {k: (v[0], v[1]) for k, v in out.items()}


def breakdown(prefix: str, tag_bytes: Mapping[str, int], pools: Mapping[str, tuple[int, int]],
              peak_reserved: int, device_used: int, tag_regions: int | None = None) -> dict[str, float]:
    """The ``memory/<prefix>_*`` metrics in GiB. `tag_bytes` are the CuMem tags' mapped bytes (none for
    other offload backends); the private pools' reserved bytes beyond the tags' regions (`tag_regions`,
    mapped or paused: PyTorch still counts a paused tag's segments; default their mapped bytes) are
    PyTorch's other private pools; `device_used` is the whole GPU's (every process on it)."""
    out = {f"memory/{prefix}_{tag}_gib": n / GIB for tag, n in tag_bytes.items()}
    default = pools.get("default", (0, 0))
    private = pools.get("private", (0, 0))
    out[f"memory/{prefix}_torch_cache_gib"] = default[0] / GIB
    out[f"memory/{prefix}_torch_allocated_gib"] = default[1] / GIB
    regions = sum(tag_bytes.values()) if tag_regions is None else tag_regions
    out[f"memory/{prefix}_other_pools_gib"] = max(private[0] - regions, 0) / GIB
    out[f"memory/{prefix}_peak_reserved_gib"] = peak_reserved / GIB
    out[f"memory/{prefix}_device_used_gib"] = device_used / GIB
    return out


def measure(prefix: str, offload: Any) -> dict[str, float]:
    """`breakdown` of this process's current device (call on a GPU rank only)."""
    import torch

    allocator = getattr(offload, "allocator", None)
    tags = {} if allocator is None else {t: allocator.device_bytes(t) for t in OFFLOAD_TAGS}
    regions = None if allocator is None else sum(allocator.allocated_bytes(t) for t in OFFLOAD_TAGS)
    free, total = torch.cuda.mem_get_info()
    return breakdown(prefix, tags, segments_by_pool(torch.cuda.memory_snapshot()),
                     torch.cuda.max_memory_reserved(), total - free, regions)


def after_sleep(rank: int, offload: Any) -> dict[str, float]:
    """`measure` after a sleep, also printed to the log: a wake that runs out of memory ends the run before
    the next step reports it. The peak starts again here: the next `trained` peak is the wake's and training's."""
    import torch

    figures = measure("asleep", offload)
    torch.cuda.reset_peak_memory_stats()
    print(f"[vime trainer rank {rank}] asleep: " + ", ".join(
        f"{k.removeprefix('memory/asleep_')} {v:.2f}" for k, v in figures.items()), file=sys.stderr, flush=True)
    return figures


def process(cpu: bool) -> dict[str, float]:
    """Resident memory of this process (MiB) and, on a GPU, PyTorch's peak allocated (MiB)."""
    import resource

    out = {"max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if not cpu:
        import torch

        out["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
    return out
