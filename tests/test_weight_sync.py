"""should_flush_cache exactly as seed steps 8 and 45, and the pause mode of seed step 46."""

from __future__ import annotations

from vime.weight_sync import pause_mode_for_update, should_flush_cache


def test_seed_first_publication_and_next() -> None:
    assert should_flush_cache(1, 1, 0) is True  # step 8: 1 == 0 + 1
    assert should_flush_cache(1, 2, 0) is True  # step 45: (2 - 1) % 1 == 0


def test_interval_counts_from_version_one() -> None:
    flushed = [v for v in range(1, 12) if should_flush_cache(3, v, 0)]
    assert flushed == [1, 4, 7, 10]


def test_resume_always_flushes_first_publication() -> None:
    assert should_flush_cache(3, 6, 5) is True  # (6 - 1) % 3 != 0, but it is the first after resume
    assert should_flush_cache(3, 7, 5) is True  # (7 - 1) % 3 == 0
    assert should_flush_cache(3, 8, 5) is False


def test_nonpositive_interval_keeps_cache_after_first() -> None:
    assert should_flush_cache(0, 1, 0) is True
    assert [should_flush_cache(0, v, 0) for v in range(2, 6)] == [False] * 4
    assert should_flush_cache(-1, 3, 0) is False


def test_pause_mode() -> None:
    assert pause_mode_for_update(True) == "abort"
    assert pause_mode_for_update(False) == "keep"
