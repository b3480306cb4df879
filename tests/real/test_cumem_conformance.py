"""The Allocator conformance suite (tests/conformance/allocator.py) against vime's CuMem allocator over the fake driver."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conformance import allocator as conformance

from vime.real.cumem import CuMemAllocator, FakeDriver

MIB = 1 << 20


def cumem_subject() -> conformance.AllocatorSubject:
    """Trainer tags: params offloaded, grads discarded (what the trainer's sleep does, seed step 41)."""
    drv = FakeDriver(granularity=2 * MIB, device_capacity=256 * MIB, host_capacity=256 * MIB)
    alloc = CuMemAllocator(drv, chunk_bytes=16 * MIB)
    return conformance.AllocatorSubject(alloc, lambda tag, n: alloc.malloc(n, tag), asyncio.run, "params", "grads")


@pytest.mark.parametrize("check", conformance.ALL_CHECKS, ids=lambda c: c.__name__)
def test_cumem_allocator_conformance(check: Any) -> None:
    check(cumem_subject)
