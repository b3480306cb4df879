"""Plugs `CuMemAllocator` into PyTorch: one `torch.cuda.MemPool` per tag over a pluggable allocator whose malloc/free are ctypes callbacks (no compiled extension).

Tensors created inside `with hook.region("params"):` live in regions of that tag, so Megatron's
parameters, gradient buffers and optimizer states can be paused and resumed at the same
addresses (issue 11). PyTorch's caching allocator sits in front: a region is one of its
segments, and freed blocks are reused within the tag's pool.
"""

from __future__ import annotations

import atexit
import ctypes
import threading
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from vime.errors import VimeError
from vime.real.cumem.allocator import CuMemAllocator

# The signatures torch's CUDAPluggableAllocator calls (c10/cuda/CUDAPluggableAllocator):
#   void* alloc(ssize_t size, int device, cudaStream_t stream)
#   void  free(void* ptr, size_t size, int device, cudaStream_t stream)
ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)

# PyTorch may call the thunks until its pools are gone, which can be after the hook object is
# collected: the thunks are never freed (two small objects per hook).
_KEEPALIVE: list[object] = []


class HookError(VimeError):
    """An allocation or free that went through the PyTorch hook failed; holds the original error."""


class TorchCuMem:
    """The bridge between PyTorch's caching allocator and a `CuMemAllocator`.

    Errors inside the callbacks cannot cross into C++: they are kept in `errors` and the
    allocation returns NULL, which PyTorch reports as out of memory; `check()` re-raises them.
    """

    def __init__(self, allocator: CuMemAllocator) -> None:
        self.allocator = allocator
        self.errors: list[BaseException] = []
        self._tls = threading.local()
        # Keep the ctypes thunks alive as long as PyTorch may call them.
        self._alloc_fn = ALLOC_FN(self._on_alloc)
        self._free_fn = FREE_FN(self._on_free)
        _KEEPALIVE.extend((self._alloc_fn, self._free_fn))
        self._torch_allocator: Any = None
        self._pools: dict[str, Any] = {}
        # Drop the pools while Python is fully alive, not during interpreter teardown.
        ref = weakref.ref(self)

        def close_if_alive() -> None:
            hook = ref()
            if hook is not None:
                hook.close()

        atexit.register(close_if_alive)

    # --- the callbacks --------------------------------------------------------------------------
    def _on_alloc(self, size: int, device: int, stream: int | None) -> int:
        tag = getattr(self._tls, "tag", None)
        try:
            if tag is None:
                raise HookError("an allocation reached the vime CuMem pool outside `region(tag)`")
            return self.allocator.malloc(size, tag)
        except BaseException as e:  # noqa: BLE001 - nothing may propagate into C++
            self.errors.append(e)
            return 0

    def _on_free(self, ptr: int | None, size: int, device: int, stream: int | None) -> None:
        try:
            if ptr:
                self.allocator.free(ptr)
        except BaseException as e:  # noqa: BLE001
            self.errors.append(e)

    def function_pointers(self) -> tuple[int, int]:
        """Addresses of the malloc and free thunks, as torch._C._cuda_customAllocator takes them."""
        alloc = ctypes.cast(self._alloc_fn, ctypes.c_void_p).value
        free = ctypes.cast(self._free_fn, ctypes.c_void_p).value
        assert alloc and free
        return alloc, free

    def check(self) -> None:
        """Raise the first error a callback swallowed (then forget them)."""
        if self.errors:
            first, self.errors = self.errors[0], []
            raise HookError(f"the CuMem hook failed: {first}") from first

    # --- PyTorch side ---------------------------------------------------------------------------
    def pool(self, tag: str) -> Any:
        import torch

        if self._torch_allocator is None:
            self._torch_allocator = torch._C._cuda_customAllocator(*self.function_pointers())
        if tag not in self._pools:
            self._pools[tag] = torch.cuda.MemPool(allocator=self._torch_allocator)
        return self._pools[tag]

    def close(self) -> None:
        """Give every pool's segments back (PyTorch frees them through the hook), then the host buffers."""
        if self._pools:
            import torch

            torch.cuda.synchronize()
            self._pools.clear()
        self.allocator.close()

    @contextmanager
    def region(self, tag: str) -> Iterator[None]:
        """Allocations of this thread inside the block go to `tag`'s regions."""
        import torch

        self.allocator.lifecycle.state(tag)  # unknown tags fail here, not inside a callback
        pool = self.pool(tag)
        previous = getattr(self._tls, "tag", None)
        self._tls.tag = tag
        try:
            with torch.cuda.use_mem_pool(pool):
                yield
        finally:
            self._tls.tag = previous
        self.check()


def trainer_cumem(device: int = 0, **allocator_kwargs: Any) -> TorchCuMem:
    """A CUDA-backed allocator plus its PyTorch hook for one trainer process on `device`."""
    from vime.real.cumem.cuda_driver import CudaDriver

    return TorchCuMem(CuMemAllocator(CudaDriver(device), **allocator_kwargs))
