"""Bookkeeping cost of vime's CuMem allocator (issue 11): pause + resume of many regions over the fake driver.

Run: python -m pytest bench/bench_cumem.py -q --benchmark-columns=mean,stddev,rounds
The real pause/resume speed is link-bound (bench/cumem_pause.py on a GPU: 51 GiB/s on the H200);
this measures the Python side per region, which must stay far below a copy's time (a 256 MiB
region copies in ~5 ms at 51 GiB/s).
"""

from __future__ import annotations

from vime.real.cumem import CuMemAllocator, FakeDriver

REGIONS = 500
MIB = 1 << 20


class _NoCopyDriver(FakeDriver):
    """The fake driver without byte copies: what remains is the allocator's own work."""

    def copy_d2h(self, dst_host: int, src_va: int, size: int) -> None:
        self.calls.append("copy_d2h")

    def copy_h2d(self, dst_va: int, src_host: int, size: int) -> None:
        self.calls.append("copy_h2d")

    def create(self, size: int) -> object:
        self.calls.append("create")
        handle = self._next_handle
        self._next_handle += 1
        self._physical[handle] = bytearray(0)
        return handle

    def map(self, va: int, size: int, handle: object) -> None:
        self.calls.append("map")
        self._mapped[va] = (size, handle)

    def host_alloc(self, size: int) -> int:
        self.calls.append("host_alloc")
        ptr = self._next_host
        self._next_host += size + 4096
        self._host[ptr] = bytearray(0)
        return ptr


def test_pause_resume_cycle_500_regions(benchmark):
    drv = _NoCopyDriver(granularity=2 * MIB, device_capacity=1 << 50, host_capacity=1 << 50)
    alloc = CuMemAllocator(drv, chunk_bytes=1 << 30)
    for i in range(REGIONS):
        alloc.malloc(4 * MIB, ("params", "optimizer", "grads")[i % 3])
    alloc.prepare_host()

    def cycle():
        drv.calls.clear()  # keep the call log from growing across rounds
        alloc.pause()
        alloc.resume()

    benchmark(cycle)
    per_region = benchmark.stats.stats.mean / REGIONS
    benchmark.extra_info["us_per_region_cycle"] = round(per_region * 1e6, 2)
    assert alloc.lifecycle.asleep_tags() == []
