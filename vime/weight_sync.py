"""Publishing the trainer's weights to every rollout engine (seed steps 8, 45–52), written once against the protocols, and when to flush caches.

The sequence, for version v: pause every engine (abort when the caches are flushed, else keep
requests frozen in place) → flush the prefix caches when flushing → open a weight-update session
on every engine → for each bucket the trainer exports, push it to every engine concurrently →
close the sessions stamping v → resume. The same code does the first publication at start-up
(seed step 8, v0 → v1, always flushed) and every later one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from vime.protocols import PauseMode, RolloutEngine, Trainer


def should_flush_cache(flush_cache_interval: int, weight_version: int, initial_weight_version: int = 0) -> bool:
    """Whether publishing `weight_version` must abort requests and reset the engines' prefix caches.

    `weight_version` is the version being published (after the increment);
    `initial_weight_version` the version the trainer started from (0 on a fresh start, the
    loaded version on resume). The first publication always flushes
    (``weight_version == initial + 1``: seed step 8, should_flush_cache(1, 1, 0) is True); after
    that every `flush_cache_interval`-th version counted from version 1 flushes
    (``(weight_version − 1) % interval == 0``: seed step 45, should_flush_cache(1, 2, 0) is True).
    An interval ≤ 0 never flushes after the first publication, keeping the KV cache.
    """
    if weight_version == initial_weight_version + 1:
        return True
    return flush_cache_interval > 0 and (weight_version - 1) % flush_cache_interval == 0


def pause_mode_for_update(flush_cache: bool) -> PauseMode:
    """Pause mode before a weight update (seed step 46): abort when flushing, else freeze requests in place."""
    return "abort" if flush_cache else "keep"


@dataclass(frozen=True)
class PublishReport:
    """What one publication did: the version stamped, whether caches were flushed, buckets and bytes pushed."""

    version: int
    flushed: bool
    pause_mode: str
    buckets: int
    bytes_per_engine: int
    # where the publication's time went, in the loop's seconds: the control calls (pause, flush, open,
    # close, resume), the trainer producing buckets (gather, convert, stage) and the engines loading them
    t_control: float = 0.0
    t_export: float = 0.0
    t_load: float = 0.0

    def parts(self) -> dict[str, float]:
        """The publication's time split: control calls, the trainer's export, the engines' loads."""
        return {"control": self.t_control, "export": self.t_export, "load": self.t_load}


async def publish_weights(trainer: Trainer, engines: Sequence[RolloutEngine], version: int, *,
                          flush_cache: bool, bucket_bytes: int) -> PublishReport:
    """Push the trainer's current weights to `engines` and stamp `version` (seed steps 46–52).

    Preconditions: every engine has its weights mapped (woken with tags=[weights], seed step 43)
    and `version` is above the engines' current version. Buckets go out one at a time, each to
    all engines at once, so at most one bucket of staging memory is held on the trainer side.
    """
    mode = pause_mode_for_update(flush_cache)
    now = asyncio.get_running_loop().time
    t_begin = now()
    # seed step 46
    await asyncio.gather(*(e.pause(mode) for e in engines))
    if flush_cache:
        await asyncio.gather(*(e.flush_cache() for e in engines))
    # seed step 47
    await asyncio.gather(*(e.start_weight_update() for e in engines))
    # seed steps 48–50
    buckets = nbytes = 0
    t_export = t_load = 0.0
    export = trainer.export_weights(bucket_bytes)
    try:
        t0 = now()
        async for bucket in export:
            t1 = now()
            await asyncio.gather(*(e.update_weights(bucket) for e in engines))
            t_export, t_load = t_export + (t1 - t0), t_load + (now() - t1)
            buckets += 1
            nbytes += bucket.nbytes
            t0 = now()
        t_export += now() - t0  # the export's last step: finding it has no more buckets
    finally:
        # Close the export at once, also when an engine failed mid-way: a CUDA-IPC export holds
        # its staging buffer until then, and the garbage collector's finaliser runs too late.
        aclose = getattr(export, "aclose", None)
        if aclose is not None:
            await aclose()
    # seed step 51
    await asyncio.gather(*(e.finish_weight_update(version) for e in engines))
    # seed step 52
    await asyncio.gather(*(e.resume() for e in engines))
    t_control = now() - t_begin - t_export - t_load
    return PublishReport(version, flush_cache, mode, buckets, nbytes, t_control, t_export, t_load)
