"""vime's CuMem allocator for the trainer: tagged regions of CUDA virtual memory that pause into persistent pinned host buffers and resume at the same addresses (issue 11; seed steps 37 and 41).

Every allocation is a *region*: a reserved virtual address range with one physical allocation
mapped into it. Pausing a tag copies what must survive (params, optimizer state) into pinned
host memory, then unmaps and releases the physical memory; discardable tags (grads,
activations) are released without a copy. Resuming maps fresh physical memory at the very same
addresses, so every tensor, every Megatron buffer and every pointer cached anywhere stays valid,
and copies the contents back.

What makes it fast (torch_memory_saver allocates pinned memory on every pause):
- the pinned host memory is *persistent*: carved from buffers allocated once (the first pause,
  or `prepare_host()` ahead of time) and reused every step;
- copies go in large pieces (`chunk_bytes`) on one stream, and the host unmaps region i while
  the copy engine still moves region i+1 (pause), or maps region i+1 while region i is copied
  back (resume); the first pause allocates host chunk k+1 while chunk k is copied.

The bookkeeping here is pure Python over a `VmmDriver`; `CudaDriver` is the real one,
`FakeDriver` the CPU one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from typing import Any

from vime.errors import LifecycleError, UnknownTagError, VimeError
from vime.protocols import TRAINER_TAGS, AllocatorLifecycle, TagState
from vime.real.cumem.driver import DriverError, VmmDriver

GIB = 1 << 30

#: Trainer tags whose contents need not survive a pause (seed step 41: grads are dropped).
DEFAULT_DISCARDABLE: frozenset[str] = frozenset({"grads", "activations"})


def fmt_bytes(n: int) -> str:
    """Bytes in GiB, or MiB below one GiB, so small figures do not print as 0.00."""
    return f"{n / GIB:.2f} GiB" if abs(n) >= GIB else f"{n / (1 << 20):.1f} MiB"


class HostMemoryError(VimeError, MemoryError):
    """Not enough host memory to pin the state a pause must keep; raised before anything is copied."""

    def __init__(self, owner: str, needed: int, available: int, tags: Collection[str]) -> None:
        self.needed = needed
        self.available = available
        super().__init__(
            f"{owner}: pausing {sorted(tags)} needs {fmt_bytes(needed)} of new pinned host memory, "
            f"only {fmt_bytes(available)} is available (short by {fmt_bytes(needed - available)}); "
            "free host memory, offload less (shard the optimizer over more GPUs, discard more tags), "
            "or pass host_limit_bytes= if /proc/meminfo understates what this machine can pin"
        )


class RemapError(VimeError):
    """Physical memory for a paused region could not be created or mapped again at its address."""

    def __init__(self, owner: str, region: Region, cause: DriverError, remaining: int) -> None:
        self.region = region
        self.cause = cause
        super().__init__(
            f"{owner}: resume could not remap {fmt_bytes(region.size)} of tag {region.tag!r} "
            f"at {region.va:#x}: {cause}; {remaining} region(s) of the tag are still unmapped and the "
            "tag stays asleep. Free GPU memory (is the rollout engine still awake?) and call resume again"
        )


@dataclass
class Region:
    """One allocation: `size` bytes reserved at `va` (granularity-rounded); `nbytes` were asked for."""

    va: int
    size: int
    nbytes: int
    tag: str
    handle: object | None = None
    #: pinned host pieces (address, bytes) that hold the contents while paused; kept across cycles
    host: list[tuple[int, int]] = field(default_factory=list)

    @property
    def mapped(self) -> bool:
        return self.handle is not None


class HostArena:
    """Persistent pinned host memory: buffers of `chunk_bytes` allocated on demand, never given back
    to the OS until `close()`, carved into pieces that regions keep from one pause to the next."""

    def __init__(self, driver: VmmDriver, chunk_bytes: int) -> None:
        self.driver = driver
        self.chunk_bytes = chunk_bytes
        self.buffers: list[tuple[int, int]] = []  # (ptr, size) of every pinned allocation
        self.free: list[tuple[int, int]] = []  # extents not held by any region
        self.alloc_seconds = 0.0

    @property
    def total(self) -> int:
        return sum(s for _, s in self.buffers)

    def free_bytes(self) -> int:
        return sum(s for _, s in self.free)

    def take(self, nbytes: int) -> list[tuple[int, int]]:
        """Pieces summing to `nbytes`, reused extents first, then new chunks."""
        pieces: list[tuple[int, int]] = []
        need = nbytes
        while need > 0:
            if not self.free:
                size = max(self.chunk_bytes, 0) or need
                t0 = time.perf_counter()
                ptr = self.driver.host_alloc(size)
                self.alloc_seconds += time.perf_counter() - t0
                self.buffers.append((ptr, size))
                self.free.append((ptr, size))
            ptr, size = self.free.pop(0)
            n = min(size, need)
            pieces.append((ptr, n))
            if n < size:
                self.free.insert(0, (ptr + n, size - n))
            need -= n
        return pieces

    def give_back(self, pieces: Iterable[tuple[int, int]]) -> None:
        self.free.extend(pieces)

    def close(self) -> None:
        for ptr, _ in self.buffers:
            self.driver.host_free(ptr)
        self.buffers.clear()
        self.free.clear()


@dataclass
class CycleStats:
    """What one pause or resume did: bytes copied / released and how long it took."""

    op: str
    tags: list[str]
    copied_bytes: int = 0
    released_bytes: int = 0
    host_alloc_bytes: int = 0
    host_alloc_seconds: float = 0.0
    seconds: float = 0.0

    @property
    def gib_per_s(self) -> float:
        return self.copied_bytes / GIB / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"op": self.op, "tags": self.tags, "copied_bytes": self.copied_bytes,
                "released_bytes": self.released_bytes, "host_alloc_bytes": self.host_alloc_bytes,
                "host_alloc_seconds": self.host_alloc_seconds, "seconds": self.seconds,
                "gib_per_s": self.gib_per_s}


class CuMemAllocator:
    """Tagged CUDA virtual memory with pause/resume for one trainer process (implements `vime.protocols.Allocator`).

    - `malloc(nbytes, tag)` / `free(va)` are what the PyTorch hook (`TorchCuMem`) calls.
    - `pause(tags)` / `resume(tags)` do the work; `sleep` / `wake_up` are the protocol's async form.
    - Misuse (pause of a paused tag, resume of an awake one, an unknown tag, allocating into a
      paused tag) raises `LifecycleError` before any driver call.
    """

    def __init__(self, driver: VmmDriver, *, name: str = "trainer-cumem",
                 tags: Collection[str] = TRAINER_TAGS,
                 discardable: Collection[str] = DEFAULT_DISCARDABLE,
                 chunk_bytes: int = GIB, host_limit_bytes: int | None = None) -> None:
        unknown = set(discardable) - set(tags)
        if unknown:
            raise ValueError(f"discardable tags {sorted(unknown)} are not among the allocator's tags {sorted(tags)}")
        if chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes must be positive, got {chunk_bytes}")
        self.driver = driver
        self.name = name
        self.lifecycle = AllocatorLifecycle(name, frozenset(tags))
        self.discardable = frozenset(discardable)
        self.host_limit_bytes = host_limit_bytes
        self.arena = HostArena(driver, chunk_bytes)
        self.regions: dict[int, Region] = {}
        self.history: list[CycleStats] = []
        self._lock = threading.RLock()  # torch may call malloc/free from its autograd threads

    # --- allocation (called by the PyTorch hook) ------------------------------------------------
    def malloc(self, nbytes: int, tag: str) -> int:
        """Reserve, create and map a region for `nbytes` under `tag`; returns its device address."""
        state = self.lifecycle.state(tag)  # raises UnknownTagError
        if state is not TagState.AWAKE:
            raise LifecycleError(self.name, "malloc", f"tag {tag!r} is {state.value}",
                                 "resume the tag before allocating into it")
        g = self.driver.granularity
        size = max(g, -(-nbytes // g) * g)
        with self._lock:
            va = self.driver.reserve(size)
            try:
                handle = self.driver.create(size)
            except DriverError:
                self.driver.free_address(va, size)
                raise
            try:
                self.driver.map(va, size, handle)
            except DriverError:
                self.driver.release(handle)
                self.driver.free_address(va, size)
                raise
            self.regions[va] = Region(va=va, size=size, nbytes=nbytes, tag=tag, handle=handle)
            return va

    def free(self, va: int) -> None:
        """Give a region back entirely (its physical memory, addresses and host pieces)."""
        with self._lock:
            region = self.regions.pop(va, None)
            if region is None:
                raise ValueError(f"{self.name}: free of {va:#x}, which this allocator did not allocate")
            if region.mapped:
                self.driver.unmap(region.va, region.size)
                self.driver.release(region.handle)
            self.driver.free_address(region.va, region.size)
            self.arena.give_back(region.host)

    # --- queries --------------------------------------------------------------------------------
    def device_bytes(self, tag: str | None = None) -> int:
        return sum(r.size for r in self.regions.values() if r.mapped and (tag is None or r.tag == tag))

    def allocated_bytes(self, tag: str | None = None) -> int:
        """Bytes held by regions (mapped or not): what the tag occupies when awake."""
        return sum(r.size for r in self.regions.values() if tag is None or r.tag == tag)

    def host_bytes(self) -> int:
        return self.arena.total

    def host_bytes_needed(self, tags: Collection[str] | None = None) -> int:
        """New pinned host bytes the next pause of `tags` (None: every awake tag) would allocate."""
        offload, _ = self._split(tags)
        missing = sum(r.nbytes for r in self.regions.values()
                      if r.tag in offload and r.mapped and not r.host)
        return max(0, missing - self.arena.free_bytes())

    def check_host_memory(self, tags: Collection[str] | None = None) -> int:
        """Raise `HostMemoryError` if the next pause cannot pin what it must keep; returns the bytes needed."""
        offload, _ = self._split(tags)
        needed = self.host_bytes_needed(tags)
        if needed:
            # Pieces come in whole chunks: the last one may be larger than what is missing.
            chunk = self.arena.chunk_bytes
            needed = -(-needed // chunk) * chunk
            available = (self.host_limit_bytes - self.arena.total if self.host_limit_bytes is not None
                         else self.driver.host_available())
            if needed > available:
                raise HostMemoryError(self.name, needed, available, offload)
        return needed

    def prepare_host(self, tags: Collection[str] | None = None) -> int:
        """Pin host memory now for every region the next pause will copy, so the first pause is as
        fast as later ones (call it once the model and optimizer exist). Returns the bytes pinned."""
        offload, _ = self._split(tags)
        self.check_host_memory(tags)
        before = self.arena.total
        with self._lock:
            for r in self._regions(offload):
                if r.mapped and not r.host:
                    r.host = self.arena.take(r.nbytes)
        return self.arena.total - before

    # --- pause / resume -------------------------------------------------------------------------
    def _split(self, tags: Collection[str] | None) -> tuple[set[str], set[str]]:
        if tags is None:
            tags = [t for t in self.lifecycle.known_tags if self.lifecycle.state(t) is TagState.AWAKE]
        for t in tags:
            if t not in self.lifecycle.known_tags:
                raise UnknownTagError(self.name, "pause", t, self.lifecycle.known_tags)
        offload = {t for t in tags if t not in self.discardable}
        return offload, set(tags) - offload

    def _regions(self, tags: Collection[str]) -> list[Region]:
        # Address order: deterministic, and neighbouring regions are copied back to back.
        return sorted((r for r in self.regions.values() if r.tag in tags), key=lambda r: r.va)

    def pause(self, tags: Collection[str] | None = None) -> CycleStats:
        """Offload the non-discardable `tags` (None: every awake tag) and release the device memory of all of them."""
        offload, discard = self._split(tags)
        return self.sleep_sync(offload, discard)

    def sleep_sync(self, offload_tags: Collection[str], discard_tags: Collection[str] = ()) -> CycleStats:
        """Copy `offload_tags` to persistent pinned host memory, release the memory of both sets (seed step 41)."""
        offload, discard = set(offload_tags), set(discard_tags)
        if offload & discard:
            raise ValueError(f"tags {sorted(offload & discard)} are both offloaded and discarded")
        self.lifecycle.check_sleep(offload | discard)
        self.check_host_memory(offload)
        stats = CycleStats("pause", sorted(offload | discard))
        drv = self.driver
        t0 = time.perf_counter()
        alloc0, total0 = self.arena.alloc_seconds, self.arena.total
        with self._lock:
            drv.synchronize()  # the kernels that wrote this state must be done before it is read
            pending: list[tuple[Region, object]] = []
            for r in self._regions(offload):
                if not r.mapped:
                    continue
                if not r.host:
                    r.host = self.arena.take(r.nbytes)  # first pause: pins while earlier copies run
                off = 0
                for ptr, n in r.host:
                    drv.copy_d2h(ptr, r.va + off, n)
                    off += n
                stats.copied_bytes += r.nbytes
                pending.append((r, drv.record()))
            for r in self._regions(discard):
                stats.released_bytes += self._release(r)
            for r, event in pending:
                drv.wait(event)  # later regions are still being copied while this one is released
                stats.released_bytes += self._release(r)
        self.lifecycle.on_sleep(offload, discard)
        stats.seconds = time.perf_counter() - t0
        stats.host_alloc_seconds = self.arena.alloc_seconds - alloc0
        stats.host_alloc_bytes = self.arena.total - total0
        self.history.append(stats)
        return stats

    def _release(self, r: Region) -> int:
        if not r.mapped:
            return 0
        self.driver.unmap(r.va, r.size)
        self.driver.release(r.handle)
        r.handle = None
        return r.size

    def resume(self, tags: Collection[str] | None = None) -> CycleStats:
        """Map fresh physical memory at the same addresses for `tags` (None: every paused tag) and copy
        back what was offloaded. If memory runs out midway, `RemapError` leaves the tag paused and
        a later resume finishes the job."""
        if tags is None:
            tags = self.lifecycle.asleep_tags()
        tags = list(tags)
        self.lifecycle.check_wake(tags)
        stats = CycleStats("resume", sorted(tags))
        drv = self.driver
        t0 = time.perf_counter()
        with self._lock:
            todo = [r for r in self._regions(tags) if not r.mapped]
            try:
                for i, r in enumerate(todo):
                    try:
                        handle = drv.create(r.size)
                    except DriverError as e:
                        raise RemapError(self.name, r, e, len(todo) - i) from e
                    try:
                        drv.map(r.va, r.size, handle)
                    except DriverError as e:
                        drv.release(handle)
                        raise RemapError(self.name, r, e, len(todo) - i) from e
                    r.handle = handle
                    stats.released_bytes -= r.size
                    if self.lifecycle.state(r.tag) is TagState.OFFLOADED:
                        off = 0
                        for ptr, n in r.host:
                            drv.copy_h2d(r.va + off, ptr, n)  # runs while the next region is mapped
                            off += n
                        stats.copied_bytes += r.nbytes
            finally:
                drv.wait(drv.record())  # never return with copies into live tensors in flight
        self.lifecycle.on_wake(tags)
        stats.seconds = time.perf_counter() - t0
        self.history.append(stats)
        return stats

    # --- the Allocator protocol (async form) ----------------------------------------------------
    async def sleep(self, offload_tags: Collection[str], discard_tags: Collection[str] = ()) -> None:
        self.sleep_sync(offload_tags, discard_tags)

    async def wake_up(self, tags: Collection[str] | None = None) -> None:
        self.resume(tags)

    def close(self) -> None:
        """Free every region and the pinned host buffers (end of the process)."""
        for va in sorted(self.regions):
            self.free(va)
        self.arena.close()
