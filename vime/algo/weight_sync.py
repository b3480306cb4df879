"""Weight-publication bookkeeping: when to flush engine caches and how to pause (seed steps 8, 45–46)."""

from __future__ import annotations

from vime.protocols import PauseMode


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
