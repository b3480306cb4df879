"""Simulated GPU and host memory: byte pools per GPU by owner and tag (`pools`) and the CuMem-style allocator (`allocator`)."""

from vime.sim.memory.allocator import SimAllocator, elapse
from vime.sim.memory.pools import GiB, HostOutOfMemoryError, PinnedMode, SimCluster, SimGPU, SimHost

__all__ = ["GiB", "HostOutOfMemoryError", "PinnedMode", "SimAllocator", "SimCluster", "SimGPU", "SimHost", "elapse"]
