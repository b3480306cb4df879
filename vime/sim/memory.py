"""Simulated GPU and host memory: per-GPU accounting by owner and tag, a CuMem-style allocator, and the recorder.

Every byte the simulator places on a GPU goes through one `SimGPU`, whatever owns it (an engine's
weights and KV cache, the trainer's params and optimizer, CUDA contexts). So when a colocated
trainer wakes while an engine still holds its KV cache, the allocation that does not fit raises
`OutOfMemoryError` at that virtual time, on that GPU, for that owner and tag, in the phase the
orchestrator announced (the error also carries ``rollout_id``) — exactly where a real run would die.

- `SimGPU` / `SimHost`: byte pools with a capacity, usage by (owner, tag), peaks; never negative.
- `SimAllocator`: the `vime.protocols.Allocator` of one owner spanning one or more GPUs, with
  vLLM CuMem semantics (tags, offload to pinned host memory, discard, remap, non-deferrable tags)
  and the time those cost (host-link copies, VMM map/unmap, pinned allocation "cold" or
  "persistent").
- `SimRecorder`: the `vime.protocols.StepObserver` of a simulation; it also receives every
  memory change and span, and keeps what reports, traces and OOM messages need.
- `SimCluster`: the GPUs, the host and the recorder of one simulated node set, built together.

Deterministic: no wall clock, no hashing of unordered sets into output; dicts keep insertion order.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from vime.errors import LifecycleError, OutOfMemoryError, SimulationError
from vime.protocols import AllocatorLifecycle, TagState

if TYPE_CHECKING:
    import simpy

    from vime.sim.hardware import HardwareSpec

GiB = 1024**3

#: gpu index used for host (pinned CPU) memory in samples, peaks and errors.
HOST = -1

PinnedMode = Literal["persistent", "cold"]


# --------------------------------------------------------------------------------------------
# Recorder
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Span:
    """A timed interval on a named track (a GPU, an engine, the trainer, "phases")."""

    track: str
    name: str
    t0: float
    t1: float
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class MemorySample:
    """Usage right after one change: `bytes` held by (owner, tag) on `gpu` (HOST = -1), and the device total."""

    t: float
    gpu: int
    owner: str
    tag: str
    bytes: int
    total: int


@dataclass(frozen=True)
class Peak:
    """A high-water mark: bytes, when, in which phase / rollout, and (for a whole GPU) who held what."""

    bytes: int
    t: float
    phase: str
    rollout_id: int | None
    breakdown: tuple[tuple[str, str, int], ...] = ()  # (owner, tag, bytes), sorted by owner, tag


class SimRecorder:
    """Collects everything a simulation shows: spans, memory samples, peaks, phases, the OOM.

    Implements `vime.protocols.StepObserver`. Time comes from `env` (bind it with `bind`, or
    let a `SimCluster` do it); without one, the current simulation of `vime.sim.clock` is used.
    """

    def __init__(self, env: simpy.Environment | None = None) -> None:
        self.env = env
        self.spans: list[Span] = []
        self.samples: list[MemorySample] = []
        self.instants: list[tuple[float, str, str, dict[str, Any]]] = []  # (t, track, name, args)
        self.gpu_peaks: dict[int, Peak] = {}
        self.tag_peaks: dict[tuple[int, str, str], Peak] = {}
        self.phase_spans: list[tuple[str, int | None, float, float]] = []  # (name, rollout_id, t0, t1)
        self.oom: OutOfMemoryError | None = None
        self._phase_stack: list[tuple[str, int | None, float]] = []
        self.rollout_id: int | None = None

    def bind(self, env: simpy.Environment) -> None:
        self.env = env

    def now(self) -> float:
        if self.env is not None:
            return float(self.env.now)
        try:
            from vime.sim import clock
            return float(clock.now())
        except Exception:  # no simulation running: a static accounting (tests, planning math)
            return 0.0

    # --- StepObserver ---------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        """The innermost phase in progress ("" outside any)."""
        return self._phase_stack[-1][0] if self._phase_stack else ""

    def on_phase(self, name: str, begin: bool, t: float, rollout_id: int | None) -> None:
        if begin:
            self._phase_stack.append((name, rollout_id, t))
            if rollout_id is not None:
                self.rollout_id = rollout_id
            return
        for i in range(len(self._phase_stack) - 1, -1, -1):
            if self._phase_stack[i][0] == name:
                _, rid, t0 = self._phase_stack.pop(i)
                self.phase_spans.append((name, rid, t0, t))
                self.spans.append(Span("phases", name, t0, t, {"rollout_id": rid}))
                return
        raise SimulationError(f"recorder: phase {name!r} ended at t={t} but never began")

    def on_call(self, component: str, call: str, t0: float, t1: float) -> None:
        self.spans.append(Span(component, call, t0, t1, {}))

    # --- what models report -----------------------------------------------------------------
    def span(self, track: str, name: str, t0: float, t1: float, **args: Any) -> None:
        self.spans.append(Span(track, name, t0, t1, dict(args)))

    def instant(self, track: str, name: str, **args: Any) -> None:
        self.instants.append((self.now(), track, name, dict(args)))

    def on_memory(self, pool: _Pool, owner: str, tag: str) -> None:
        """Called by a pool after every change (alloc or free)."""
        t = self.now()
        held = pool.held(owner, tag)
        total = pool.used()
        self.samples.append(MemorySample(t, pool.index, owner, tag, held, total))
        key = (pool.index, owner, tag)
        best = self.tag_peaks.get(key)
        if best is None or held > best.bytes:
            self.tag_peaks[key] = Peak(held, t, self.phase, self.rollout_id)
        best = self.gpu_peaks.get(pool.index)
        if best is None or total > best.bytes:
            breakdown = tuple((o, g, b) for (o, g), b in sorted(pool.usage().items()))
            self.gpu_peaks[pool.index] = Peak(total, t, self.phase, self.rollout_id, breakdown)

    # --- views for reports ---------------------------------------------------------------------
    def peak_table(self) -> list[dict[str, Any]]:
        """One row per (gpu, owner, tag) high-water mark, sorted (host rows have gpu = -1)."""
        return [{"gpu": g, "owner": o, "tag": t, "bytes": p.bytes, "t": p.t, "phase": p.phase,
                 "rollout_id": p.rollout_id}
                for (g, o, t), p in sorted(self.tag_peaks.items())]

    def to_dict(self) -> dict[str, Any]:
        """Everything recorded, JSON-able and in a deterministic order (what `vime simulate` serialises)."""
        return {
            "phases": [{"name": n, "rollout_id": r, "t0": t0, "t1": t1} for n, r, t0, t1 in self.phase_spans],
            "spans": [{"track": s.track, "name": s.name, "t0": s.t0, "t1": s.t1, "args": s.args} for s in self.spans],
            "instants": [{"t": t, "track": tr, "name": n, "args": a} for t, tr, n, a in self.instants],
            "memory_samples": [[s.t, s.gpu, s.owner, s.tag, s.bytes, s.total] for s in self.samples],
            "gpu_peaks": {str(g): {"bytes": p.bytes, "t": p.t, "phase": p.phase, "rollout_id": p.rollout_id,
                                   "breakdown": [list(b) for b in p.breakdown]}
                          for g, p in sorted(self.gpu_peaks.items())},
            "tag_peaks": self.peak_table(),
            "oom": None if self.oom is None else {
                "gpu": self.oom.gpu, "owner": self.oom.owner, "tag": self.oom.tag, "requested": self.oom.requested,
                "free": self.oom.free, "phase": self.oom.phase, "time": self.oom.time,
                "rollout_id": getattr(self.oom, "rollout_id", None), "message": str(self.oom)},
        }

    def on_oom(self, error: OutOfMemoryError) -> None:
        if self.oom is None:
            self.oom = error
        self.instants.append((error.time if error.time is not None else self.now(), f"gpu{error.gpu}", "OOM",
                              {"owner": error.owner, "tag": error.tag, "requested": error.requested,
                               "free": error.free, "phase": error.phase}))


# --------------------------------------------------------------------------------------------
# Pools
# --------------------------------------------------------------------------------------------


class HostOutOfMemoryError(OutOfMemoryError):
    """Pinned host memory ran out (gpu = HOST = -1)."""

    def __init__(self, owner: str, tag: str, requested: int, free: int, phase: str = "",
                 time: float | None = None) -> None:
        super().__init__(HOST, owner, tag, requested, free, phase, time)
        when = f" during {phase}" if phase else ""
        at = f" at t={time:.3f}s" if time is not None else ""
        self._set(f"host pinned memory exhausted{when}{at}: {owner}/{tag} asked for "
                     f"{requested / GiB:.2f} GiB, {free / GiB:.2f} GiB free",
                  owner, tag, requested, free, phase, time)


class _Pool:
    """Bytes by (owner, tag) under an optional capacity; the shared part of SimGPU and SimHost."""

    def __init__(self, index: int, capacity: int | None, *, recorder: SimRecorder | None = None,
                 env: simpy.Environment | None = None, name: str = "") -> None:
        if capacity is not None and capacity < 0:
            raise ValueError(f"capacity must be >= 0, got {capacity}")
        self.index = index
        self.capacity = capacity
        self.recorder = recorder
        self.env = env
        self.name = name or (f"gpu{index}" if index >= 0 else "host")
        self._held: dict[tuple[str, str], int] = {}
        self._total = 0
        self.peak_bytes = 0
        self._peaks: dict[tuple[str, str], int] = {}

    def _now(self) -> float:
        if self.env is not None:
            return float(self.env.now)
        return self.recorder.now() if self.recorder is not None else 0.0

    def _oom(self, owner: str, tag: str, nbytes: int, free: int) -> OutOfMemoryError:
        phase = self.recorder.phase if self.recorder is not None else ""
        err = OutOfMemoryError(self.index, owner, tag, nbytes, free, phase, self._now())
        err.rollout_id = self.recorder.rollout_id if self.recorder is not None else None  # type: ignore[attr-defined]
        return err

    # --- changes ------------------------------------------------------------------------------
    def alloc(self, owner: str, tag: str, nbytes: int) -> None:
        """Add `nbytes` under (owner, tag); raises OutOfMemoryError (nothing changes) if it does not fit."""
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise ValueError(f"{self.name}: {owner}/{tag} allocation must be a non-negative int, got {nbytes!r}")
        if nbytes == 0:
            return
        if self.capacity is not None and self._total + nbytes > self.capacity:
            err = self._oom(owner, tag, nbytes, self.capacity - self._total)
            if self.recorder is not None:
                self.recorder.on_oom(err)
            raise err
        key = (owner, tag)
        self._held[key] = self._held.get(key, 0) + nbytes
        self._total += nbytes
        self.peak_bytes = max(self.peak_bytes, self._total)
        if self._held[key] > self._peaks.get(key, 0):
            self._peaks[key] = self._held[key]
        if self.recorder is not None:
            self.recorder.on_memory(self, owner, tag)

    def free(self, owner: str, tag: str, nbytes: int | None = None) -> int:
        """Release `nbytes` (all of (owner, tag) when None); returns the bytes freed.

        Freeing more than is held is a model bug and raises SimulationError (usage never goes negative).
        """
        key = (owner, tag)
        held = self._held.get(key, 0)
        amount = held if nbytes is None else nbytes
        if not isinstance(amount, int) or amount < 0:
            raise ValueError(f"{self.name}: free of {owner}/{tag} must be a non-negative int, got {nbytes!r}")
        if amount > held:
            raise SimulationError(f"{self.name}: {owner}/{tag} frees {amount} bytes but holds only {held}")
        if amount == 0:
            return 0
        if amount == held:
            del self._held[key]
        else:
            self._held[key] = held - amount
        self._total -= amount
        if self.recorder is not None:
            self.recorder.on_memory(self, owner, tag)
        return amount

    # --- queries --------------------------------------------------------------------------------
    def used(self, owner: str | None = None, tag: str | None = None) -> int:
        """Bytes held now, filtered by owner and/or tag."""
        if owner is None and tag is None:
            return self._total
        if owner is not None and tag is not None:
            return self._held.get((owner, tag), 0)
        return sum(b for (o, t), b in self._held.items()
                   if (owner is None or o == owner) and (tag is None or t == tag))

    def held(self, owner: str, tag: str) -> int:
        """Bytes of exactly (owner, tag)."""
        return self._held.get((owner, tag), 0)

    @property
    def free_bytes(self) -> int | None:
        return None if self.capacity is None else self.capacity - self._total

    def usage(self) -> dict[tuple[str, str], int]:
        """Bytes by (owner, tag), sorted by key."""
        return dict(sorted(self._held.items()))

    def peak(self, owner: str | None = None, tag: str | None = None) -> int:
        """Highest usage ever: overall (no arguments) or of one (owner, tag) (or summed over the missing key's maxima)."""
        if owner is None and tag is None:
            return self.peak_bytes
        return max((b for (o, t), b in self._peaks.items()
                    if (owner is None or o == owner) and (tag is None or t == tag)), default=0)

    def __repr__(self) -> str:
        cap = "∞" if self.capacity is None else f"{self.capacity / GiB:.2f}"
        return f"{type(self).__name__}({self.name}, {self._total / GiB:.2f}/{cap} GiB)"


class SimGPU(_Pool):
    """One GPU's device memory; `capacity` comes from the hardware profile (`HardwareSpec.memory_bytes`)."""

    def __init__(self, index: int, capacity: int, *, recorder: SimRecorder | None = None,
                 env: simpy.Environment | None = None) -> None:
        if index < 0:
            raise ValueError(f"GPU index must be >= 0, got {index}")
        super().__init__(index, capacity, recorder=recorder, env=env)


class SimHost(_Pool):
    """Pinned host memory of the node(s); `capacity=None` means unlimited (the default)."""

    def __init__(self, capacity: int | None = None, *, recorder: SimRecorder | None = None,
                 env: simpy.Environment | None = None) -> None:
        super().__init__(HOST, capacity, recorder=recorder, env=env, name="host")

    def _oom(self, owner: str, tag: str, nbytes: int, free: int) -> OutOfMemoryError:
        phase = self.recorder.phase if self.recorder is not None else ""
        err = HostOutOfMemoryError(owner, tag, nbytes, free, phase, self._now())
        err.rollout_id = self.recorder.rollout_id if self.recorder is not None else None  # type: ignore[attr-defined]
        return err


@dataclass
class SimCluster:
    """GPUs (all of one `HardwareSpec`), the pinned host pool and the recorder of one simulation."""

    env: simpy.Environment
    hardware: HardwareSpec
    gpus: list[SimGPU]
    host: SimHost
    recorder: SimRecorder

    @classmethod
    def create(cls, env: simpy.Environment, hardware: HardwareSpec, num_gpus: int, *,
               host_capacity: int | None = None, recorder: SimRecorder | None = None) -> SimCluster:
        if num_gpus < 1:
            raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
        rec = recorder or SimRecorder(env)
        if rec.env is None:
            rec.bind(env)
        gpus = [SimGPU(i, hardware.memory_bytes, recorder=rec, env=env) for i in range(num_gpus)]
        return cls(env, hardware, gpus, SimHost(host_capacity, recorder=rec, env=env), rec)


# --------------------------------------------------------------------------------------------
# Time
# --------------------------------------------------------------------------------------------


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


# --------------------------------------------------------------------------------------------
# Allocator
# --------------------------------------------------------------------------------------------


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

    `pinned="cold"` pays `pinned_alloc_s_per_gib` on every sleep and frees the host buffer on
    wake, paying `pinned_free_s_per_gib` there (torch_memory_saver style); `pinned="persistent"` allocates the host buffer the first
    time (and when a tag grows) and keeps it across cycles (vime's CuMem style), so later sleeps
    pay only the copy. Illegal calls raise the shared `AllocatorLifecycle` errors before anything happens.
    """

    def __init__(self, owner: str, gpus: Sequence[SimGPU], hardware: HardwareSpec, *,
                 host: SimHost | None = None, known_tags: Collection[str],
                 non_deferrable: Collection[str] = (), pinned: PinnedMode = "persistent",
                 pinned_scale: Mapping[str, float] | None = None,
                 recorder: SimRecorder | None = None, env: simpy.Environment | None = None) -> None:
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
        return max(self._wake_costs(self._wake_set(tags)))

    def _wake_costs(self, tags: Collection[str]) -> list[float]:
        hw = self.hardware
        times = []
        for i in range(len(self.gpus)):
            mapped = sum(self._sizes.get(t, [0] * len(self.gpus))[i] for t in tags)
            copy = sum(self._sizes.get(t, [0] * len(self.gpus))[i] for t in tags
                       if self.lifecycle.state(t) is TagState.OFFLOADED)
            # A cold buffer (torch_memory_saver) is freed once copied back: cuMemFreeHost is part of
            # the resume (measured 0.088 s/GiB on the H200, about half of its 8.2 s resume of 49 GiB).
            free = (sum(self._sizes.get(t, [0] * len(self.gpus))[i] * self.pinned_scale.get(t, 1.0) for t in tags
                        if self.lifecycle.state(t) is TagState.OFFLOADED) if self.pinned == "cold" else 0)
            times.append(mapped / GiB * hw.vmm.create_map_s_per_gib + copy / hw.h2d_bytes_per_s
                         + free / GiB * hw.vmm.pinned_free_s_per_gib)
        return times

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
        await elapse(env, max(times))
        for tag in offload + discard:
            for gpu, n in zip(self.gpus, self._sizes.get(tag, [0] * len(self.gpus)), strict=True):
                gpu.free(self.owner, tag, n)
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
