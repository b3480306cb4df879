"""vime's CuMem allocator for the trainer: tagged CUDA virtual memory that pauses to persistent pinned host memory and resumes at the same addresses (issue 11)."""

from vime.real.cumem.allocator import (
    DEFAULT_DISCARDABLE,
    CuMemAllocator,
    CycleStats,
    HostArena,
    HostMemoryError,
    Region,
    RemapError,
)
from vime.real.cumem.driver import DriverError, VmmDriver
from vime.real.cumem.fake import FakeDriver

__all__ = [
    "DEFAULT_DISCARDABLE",
    "CuMemAllocator",
    "CycleStats",
    "DriverError",
    "FakeDriver",
    "HostArena",
    "HostMemoryError",
    "Region",
    "RemapError",
    "VmmDriver",
]
