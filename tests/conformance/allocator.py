"""Conformance checks for any `vime.protocols.Allocator` (simulated or real), driven through a factory.

A factory returns an `AllocatorSubject`: the allocator, a way to allocate bytes under a tag (the
protocol leaves allocation to the implementation: `SimAllocator.allocate`, a real allocator's
`malloc` or a tagged torch allocation), a way to run a coroutine (the virtual clock for the
simulator, `asyncio.run` for real code), and two distinct tags the allocator knows. Each
`check_*` function builds a fresh subject and asserts one part of the contract, so a test
module for another implementation only writes the factory and calls these.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest

from vime.errors import LifecycleError, UnknownTagError
from vime.protocols import Allocator, TagState

MiB = 1024**2


@dataclass
class AllocatorSubject:
    allocator: Any
    allocate: Callable[[str, int], None]
    run: Callable[[Coroutine[Any, Any, Any]], Any]
    tag_a: str
    tag_b: str


Factory = Callable[[], AllocatorSubject]


def _filled(make: Factory, a_bytes: int = 64 * MiB, b_bytes: int = 32 * MiB) -> tuple[AllocatorSubject, int, int]:
    s = make()
    s.allocate(s.tag_a, a_bytes)
    s.allocate(s.tag_b, b_bytes)
    return s, s.allocator.device_bytes(s.tag_a), s.allocator.device_bytes(s.tag_b)


def check_is_allocator(make: Factory) -> None:
    s = make()
    assert isinstance(s.allocator, Allocator)
    for tag in (s.tag_a, s.tag_b):
        assert s.allocator.lifecycle.state(tag) is TagState.AWAKE


def check_sleep_releases_and_offloads(make: Factory) -> None:
    """After sleep(offload=[a], discard=[b]) neither tag holds device memory and a's bytes sit on the host."""
    s, a, b = _filled(make)
    assert a > 0 and b > 0
    host_before = s.allocator.host_bytes()
    s.run(s.allocator.sleep([s.tag_a], [s.tag_b]))
    assert s.allocator.device_bytes(s.tag_a) == 0
    assert s.allocator.device_bytes(s.tag_b) == 0
    assert s.allocator.host_bytes() >= host_before + a - host_before  # the offloaded copy is held
    assert s.allocator.host_bytes() >= a
    assert s.allocator.lifecycle.state(s.tag_a) is TagState.OFFLOADED
    assert s.allocator.lifecycle.state(s.tag_b) is TagState.DISCARDED


def check_wake_restores_usage(make: Factory) -> None:
    """sleep + wake of every tag returns device usage to exactly where it was."""
    s, a, b = _filled(make)
    total = s.allocator.device_bytes()
    s.run(s.allocator.sleep([s.tag_a], [s.tag_b]))
    s.run(s.allocator.wake_up([s.tag_a]))
    assert s.allocator.device_bytes(s.tag_a) == a
    assert s.allocator.device_bytes(s.tag_b) == 0
    assert s.allocator.lifecycle.state(s.tag_b) is TagState.DISCARDED
    s.run(s.allocator.wake_up(None))
    assert s.allocator.device_bytes(s.tag_b) == b
    assert s.allocator.device_bytes() == total
    assert s.allocator.lifecycle.asleep_tags() == []


def check_repeated_cycles_are_stable(make: Factory, cycles: int = 3) -> None:
    """Device and host usage after each full cycle is the same as after the first (nothing leaks)."""
    s, _, _ = _filled(make)
    after: list[tuple[int, int]] = []
    for _ in range(cycles):
        s.run(s.allocator.sleep([s.tag_a], [s.tag_b]))
        s.run(s.allocator.wake_up(None))
        after.append((s.allocator.device_bytes(), s.allocator.host_bytes()))
    assert len(set(after)) == 1, after


def check_illegal_calls_raise_before_acting(make: Factory) -> None:
    """Unknown tags, sleeping a sleeping tag and waking an awake tag raise the shared errors; nothing changes."""
    s, a, b = _filled(make)
    total = s.allocator.device_bytes()
    with pytest.raises(UnknownTagError):
        s.run(s.allocator.sleep(["no-such-tag"]))
    with pytest.raises(LifecycleError):
        s.run(s.allocator.wake_up([s.tag_a]))  # awake
    assert s.allocator.device_bytes() == total
    s.run(s.allocator.sleep([s.tag_a]))
    with pytest.raises(LifecycleError):
        s.run(s.allocator.sleep([s.tag_a]))
    with pytest.raises(UnknownTagError):
        s.run(s.allocator.wake_up(["no-such-tag"]))
    assert s.allocator.device_bytes(s.tag_a) == 0
    assert s.allocator.device_bytes(s.tag_b) == b
    s.run(s.allocator.wake_up([s.tag_a]))
    assert s.allocator.device_bytes() == total


ALL_CHECKS: tuple[Callable[[Factory], None], ...] = (
    check_is_allocator,
    check_sleep_releases_and_offloads,
    check_wake_restores_usage,
    check_repeated_cycles_are_stable,
    check_illegal_calls_raise_before_acting,
)
