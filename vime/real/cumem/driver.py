"""The small driver surface the CuMem allocator needs (CUDA virtual memory, pinned host memory, async copies), and its errors."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from vime.errors import VimeError


class DriverError(VimeError):
    """A CUDA driver call failed: which call, the driver's error name, and what was asked."""

    def __init__(self, call: str, code: str, detail: str = "") -> None:
        self.call = call
        self.code = code
        self.detail = detail
        msg = f"{call} failed with {code}"
        if detail:
            msg += f" ({detail})"
        super().__init__(msg)

    @property
    def out_of_memory(self) -> bool:
        return "OUT_OF_MEMORY" in self.code


@runtime_checkable
class VmmDriver(Protocol):
    """What `CuMemAllocator` asks of the GPU. `CudaDriver` implements it with cuda-bindings,
    `FakeDriver` with bytearrays so the bookkeeping is tested on CPU.

    Copies are asynchronous on one copy stream owned by the driver; `record` marks the copies
    issued so far and `wait` blocks the host until they are done. Every failure raises
    `DriverError`.
    """

    #: Physical allocations and mappings are multiples of this (2 MiB on Hopper).
    granularity: int

    def reserve(self, size: int) -> int:
        """Reserve `size` bytes of device virtual address space; returns the address."""
        ...

    def free_address(self, va: int, size: int) -> None: ...

    def create(self, size: int) -> object:
        """Allocate `size` bytes of physical device memory (cuMemCreate); returns its handle."""
        ...

    def map(self, va: int, size: int, handle: object) -> None:
        """Map `handle` at `va` and make it readable and writable by this device (cuMemMap + cuMemSetAccess)."""
        ...

    def unmap(self, va: int, size: int) -> None: ...

    def release(self, handle: object) -> None: ...

    def host_alloc(self, size: int) -> int:
        """Pinned (page-locked) host memory usable for async copies; returns its address."""
        ...

    def host_free(self, ptr: int) -> None: ...

    def copy_d2h(self, dst_host: int, src_va: int, size: int) -> None: ...

    def copy_h2d(self, dst_va: int, src_host: int, size: int) -> None: ...

    def record(self) -> object:
        """An event that completes when every copy issued so far has completed."""
        ...

    def wait(self, event: object) -> None: ...

    def synchronize(self) -> None:
        """Block until all work on the device (every stream, compute included) has finished."""
        ...

    def host_available(self) -> int:
        """Bytes of host memory that can still be pinned (MemAvailable on Linux)."""
        ...


def meminfo_available(path: str = "/proc/meminfo") -> int:
    """MemAvailable in bytes from /proc/meminfo (0 when the file is missing or has no such line)."""
    try:
        with open(path) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return 0
    return 0
