"""A CPU stand-in for the CUDA driver: virtual addresses, physical handles and pinned host memory as bytearrays.

It enforces what the real driver enforces (no double map, no access to unmapped memory, no
release of a mapped handle, capacity limits) so the allocator's bookkeeping is tested on CPU
(issue 11). Tests write and read "device" memory with `write` / `read`, standing in for kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from vime.real.cumem.driver import DriverError

_MIB = 1 << 20


@dataclass
class FakeDriver:
    """`VmmDriver` on bytearrays. `device_capacity` / `host_capacity` bound physical and pinned bytes."""

    granularity: int = 2 * _MIB
    device_capacity: int = 1 << 34
    host_capacity: int = 1 << 34
    #: the next N `create` calls fail with OUT_OF_MEMORY (to test remap failure)
    fail_creates: int = 0
    calls: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._next_va = 0x7F00_0000_0000
        self._next_host = 0x1000_0000
        self._next_handle = 1
        self._reserved: dict[int, int] = {}  # va -> size
        self._physical: dict[int, bytearray] = {}  # handle -> bytes
        self._mapped: dict[int, tuple[int, int]] = {}  # va -> (size, handle)
        self._host: dict[int, bytearray] = {}  # ptr -> bytes
        self.synchronized = 0

    # --- virtual addresses ----------------------------------------------------------------------
    def reserve(self, size: int) -> int:
        self.calls.append("reserve")
        self._check_aligned("cuMemAddressReserve", size)
        va = self._next_va
        self._next_va += size + self.granularity  # a guard gap, so an overrun is never silently another region
        self._reserved[va] = size
        return va

    def free_address(self, va: int, size: int) -> None:
        self.calls.append("free_address")
        if self._reserved.get(va) != size:
            raise DriverError("cuMemAddressFree", "CUDA_ERROR_INVALID_VALUE", f"va={va:#x} size={size}")
        if va in self._mapped:
            raise DriverError("cuMemAddressFree", "CUDA_ERROR_INVALID_VALUE", "range still mapped")
        del self._reserved[va]

    # --- physical memory ------------------------------------------------------------------------
    def create(self, size: int) -> object:
        self.calls.append("create")
        self._check_aligned("cuMemCreate", size)
        if self.fail_creates > 0:
            self.fail_creates -= 1
            raise DriverError("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY", f"{size} bytes (injected)")
        if self.device_used() + size > self.device_capacity:
            raise DriverError("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY",
                              f"{size} bytes asked, {self.device_capacity - self.device_used()} free")
        handle = self._next_handle
        self._next_handle += 1
        # Fresh physical memory holds garbage, not zeros: fill it so a missing copy-back shows.
        self._physical[handle] = bytearray(b"\xa5") * size
        return handle

    def release(self, handle: object) -> None:
        self.calls.append("release")
        if handle not in self._physical:
            raise DriverError("cuMemRelease", "CUDA_ERROR_INVALID_VALUE", f"unknown handle {handle}")
        if any(h == handle for _, h in self._mapped.values()):
            raise DriverError("cuMemRelease", "CUDA_ERROR_INVALID_VALUE", "handle is still mapped")
        del self._physical[handle]  # type: ignore[arg-type]

    def map(self, va: int, size: int, handle: object) -> None:
        self.calls.append("map")
        if self._reserved.get(va) != size:
            raise DriverError("cuMemMap", "CUDA_ERROR_INVALID_VALUE", f"va={va:#x} is not a reserved range of {size}")
        if va in self._mapped:
            raise DriverError("cuMemMap", "CUDA_ERROR_ALREADY_MAPPED", f"va={va:#x}")
        if not isinstance(handle, int) or len(self._physical.get(handle, b"")) != size:
            raise DriverError("cuMemMap", "CUDA_ERROR_INVALID_HANDLE", f"handle {handle}")
        self._mapped[va] = (size, handle)  # type: ignore[assignment]

    def unmap(self, va: int, size: int) -> None:
        self.calls.append("unmap")
        if self._mapped.get(va, (None,))[0] != size:
            raise DriverError("cuMemUnmap", "CUDA_ERROR_INVALID_VALUE", f"va={va:#x} is not mapped")
        del self._mapped[va]

    # --- host memory and copies -----------------------------------------------------------------
    def host_alloc(self, size: int) -> int:
        self.calls.append("host_alloc")
        if self.host_used() + size > self.host_capacity:
            raise DriverError("cuMemHostAlloc", "CUDA_ERROR_OUT_OF_MEMORY", f"{size} bytes")
        ptr = self._next_host
        self._next_host += size + 4096
        self._host[ptr] = bytearray(size)
        return ptr

    def host_free(self, ptr: int) -> None:
        self.calls.append("host_free")
        if ptr not in self._host:
            raise DriverError("cuMemFreeHost", "CUDA_ERROR_INVALID_VALUE", f"{ptr:#x}")
        del self._host[ptr]

    def copy_d2h(self, dst_host: int, src_va: int, size: int) -> None:
        self.calls.append("copy_d2h")
        hbuf, hoff = self._host_at(dst_host, size)
        dbuf, doff = self._device_at(src_va, size, "cuMemcpyDtoHAsync")
        hbuf[hoff:hoff + size] = dbuf[doff:doff + size]

    def copy_h2d(self, dst_va: int, src_host: int, size: int) -> None:
        self.calls.append("copy_h2d")
        hbuf, hoff = self._host_at(src_host, size)
        dbuf, doff = self._device_at(dst_va, size, "cuMemcpyHtoDAsync")
        dbuf[doff:doff + size] = hbuf[hoff:hoff + size]

    def record(self) -> object:
        return len(self.calls)

    def wait(self, event: object) -> None:
        self.calls.append("wait")

    def synchronize(self) -> None:
        self.synchronized += 1

    def host_available(self) -> int:
        return self.host_capacity - self.host_used()

    # --- what a kernel would do, and what tests inspect -----------------------------------------
    def write(self, va: int, data: bytes) -> None:
        buf, off = self._device_at(va, len(data), "kernel write")
        buf[off:off + len(data)] = data

    def read(self, va: int, size: int) -> bytes:
        buf, off = self._device_at(va, size, "kernel read")
        return bytes(buf[off:off + size])

    def is_mapped(self, va: int) -> bool:
        return va in self._mapped

    def device_used(self) -> int:
        return sum(len(b) for b in self._physical.values())

    def host_used(self) -> int:
        return sum(len(b) for b in self._host.values())

    def reserved_ranges(self) -> int:
        return len(self._reserved)

    def _check_aligned(self, call: str, size: int) -> None:
        if size <= 0 or size % self.granularity:
            raise DriverError(call, "CUDA_ERROR_INVALID_VALUE",
                              f"size {size} is not a positive multiple of the granularity {self.granularity}")

    def _device_at(self, va: int, size: int, call: str) -> tuple[bytearray, int]:
        for base, (msize, handle) in self._mapped.items():
            if base <= va and va + size <= base + msize:
                return self._physical[handle], va - base
        raise DriverError(call, "CUDA_ERROR_ILLEGAL_ADDRESS", f"{size} bytes at {va:#x} are not mapped")

    def _host_at(self, ptr: int, size: int) -> tuple[bytearray, int]:
        for base, buf in self._host.items():
            if base <= ptr and ptr + size <= base + len(buf):
                return buf, ptr - base
        raise DriverError("cuMemcpy", "CUDA_ERROR_INVALID_VALUE", f"{size} host bytes at {ptr:#x} not pinned")
