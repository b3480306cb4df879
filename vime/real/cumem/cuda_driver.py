"""`VmmDriver` over the CUDA driver API through cuda-bindings (`cuda.bindings.driver`): cuMemCreate/Map/SetAccess/Unmap/Release, pinned host memory, async copies."""

from __future__ import annotations

import threading
from typing import Any

from vime.real.cumem.driver import DriverError, meminfo_available


def _load() -> Any:
    try:
        from cuda.bindings import driver as cu
    except ImportError:  # cuda-python before 12.6 spelled it cuda.cuda
        try:
            from cuda import cuda as cu  # type: ignore[no-redef]
        except ImportError as e:
            raise ImportError("CudaDriver needs cuda-bindings: pip install 'cuda-bindings>=12.6'") from e
    return cu


class CudaDriver:
    """Physical allocations pinned on `device`, mapped read-write for it; copies on a private non-blocking stream.

    Uses the device's primary context (the one PyTorch uses), so addresses it maps are valid
    for PyTorch tensors.
    """

    def __init__(self, device: int = 0, *, granularity: str = "recommended") -> None:
        cu = self.cu = _load()
        self.device = device
        self._check("cuInit", cu.cuInit(0))
        dev = self._check("cuDeviceGet", cu.cuDeviceGet(device))
        self._ctx = self._check("cuDevicePrimaryCtxRetain", cu.cuDevicePrimaryCtxRetain(dev))
        self._tls = threading.local()
        self._ensure_ctx()
        prop = cu.CUmemAllocationProp()
        prop.type = cu.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
        prop.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        prop.location.id = device
        self._prop = prop
        option = (cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
                  if granularity == "recommended"
                  else cu.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM)
        self.granularity = int(self._check("cuMemGetAllocationGranularity",
                                           cu.cuMemGetAllocationGranularity(prop, option)))
        access = cu.CUmemAccessDesc()
        access.location.type = cu.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
        access.location.id = device
        access.flags = cu.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
        self._access = [access]
        self.stream = self._check("cuStreamCreate",
                                  cu.cuStreamCreate(cu.CUstream_flags.CU_STREAM_NON_BLOCKING.value))

    # --- helpers --------------------------------------------------------------------------------
    def _check(self, call: str, result: Any, detail: str = "") -> Any:
        """cuda-bindings returns (CUresult, *values): raise on error, return the value(s)."""
        if isinstance(result, tuple):
            err, values = result[0], result[1:]
        else:
            err, values = result, ()
        if int(err) != 0:
            name = getattr(err, "name", str(err))
            raise DriverError(call, name, detail)
        if not values:
            return None
        return values[0] if len(values) == 1 else values

    def _ensure_ctx(self) -> None:
        # The allocator hook may be called from PyTorch's autograd threads, where no context is current.
        if not getattr(self._tls, "ready", False):
            self._check("cuCtxSetCurrent", self.cu.cuCtxSetCurrent(self._ctx))
            self._tls.ready = True

    # --- VmmDriver ------------------------------------------------------------------------------
    def reserve(self, size: int) -> int:
        self._ensure_ctx()
        ptr = self._check("cuMemAddressReserve", self.cu.cuMemAddressReserve(size, self.granularity, 0, 0),
                          f"{size} bytes")
        return int(ptr)

    def free_address(self, va: int, size: int) -> None:
        self._ensure_ctx()
        self._check("cuMemAddressFree", self.cu.cuMemAddressFree(va, size), f"{va:#x}")

    def create(self, size: int) -> object:
        self._ensure_ctx()
        return self._check("cuMemCreate", self.cu.cuMemCreate(size, self._prop, 0), f"{size} bytes")

    def map(self, va: int, size: int, handle: object) -> None:
        self._ensure_ctx()
        self._check("cuMemMap", self.cu.cuMemMap(va, size, 0, handle, 0), f"{size} bytes at {va:#x}")
        try:
            self._check("cuMemSetAccess", self.cu.cuMemSetAccess(va, size, self._access, 1),
                        f"{size} bytes at {va:#x}")
        except DriverError:
            self.cu.cuMemUnmap(va, size)
            raise

    def unmap(self, va: int, size: int) -> None:
        self._ensure_ctx()
        self._check("cuMemUnmap", self.cu.cuMemUnmap(va, size), f"{size} bytes at {va:#x}")

    def release(self, handle: object) -> None:
        self._ensure_ctx()
        self._check("cuMemRelease", self.cu.cuMemRelease(handle))

    def host_alloc(self, size: int) -> int:
        self._ensure_ctx()
        return int(self._check("cuMemHostAlloc", self.cu.cuMemHostAlloc(size, 0), f"{size} bytes"))

    def host_free(self, ptr: int) -> None:
        self._ensure_ctx()
        self._check("cuMemFreeHost", self.cu.cuMemFreeHost(ptr))

    def copy_d2h(self, dst_host: int, src_va: int, size: int) -> None:
        self._check("cuMemcpyDtoHAsync", self.cu.cuMemcpyDtoHAsync(dst_host, src_va, size, self.stream))

    def copy_h2d(self, dst_va: int, src_host: int, size: int) -> None:
        self._check("cuMemcpyHtoDAsync", self.cu.cuMemcpyHtoDAsync(dst_va, src_host, size, self.stream))

    def record(self) -> object:
        cu = self.cu
        event = self._check("cuEventCreate", cu.cuEventCreate(cu.CUevent_flags.CU_EVENT_DISABLE_TIMING.value))
        self._check("cuEventRecord", cu.cuEventRecord(event, self.stream))
        return event

    def wait(self, event: object) -> None:
        self._check("cuEventSynchronize", self.cu.cuEventSynchronize(event))
        self._check("cuEventDestroy", self.cu.cuEventDestroy(event))

    def synchronize(self) -> None:
        self._ensure_ctx()
        self._check("cuCtxSynchronize", self.cu.cuCtxSynchronize())

    def host_available(self) -> int:
        return meminfo_available()

    def device_free(self) -> tuple[int, int]:
        """(free, total) device bytes (cuMemGetInfo)."""
        self._ensure_ctx()
        free, total = self._check("cuMemGetInfo", self.cu.cuMemGetInfo())
        return int(free), int(total)
