"""Simulated memory pools: one GPU's device memory, the node's pinned host memory, and the cluster that builds them.

Every byte the simulator places on a GPU goes through one `SimGPU`, whatever owns it (an engine's
weights and KV cache, the trainer's params and optimizer, CUDA contexts). So when a colocated
trainer wakes while an engine still holds its KV cache, the allocation that does not fit raises
`OutOfMemoryError` at that virtual time, on that GPU, for that owner and tag, in the phase the
recorder was told (the error also carries ``rollout_id``) — exactly where a real run would die.
Each pool reports every change to its `vime.report.recorder.Recorder`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from vime.errors import OutOfMemoryError, SimulationError
from vime.report.recorder import HOST, Recorder

if TYPE_CHECKING:
    import simpy

    from vime.sim.hardware import HardwareSpec

GiB = 1024**3

PinnedMode = Literal["persistent", "cold"]


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

    def __init__(self, index: int, capacity: int | None, *, recorder: Recorder | None = None,
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
        self._freed: dict[str, int] = {}  # bytes each owner has released, ever
        self._owner_bytes: dict[str, int] = {}
        self._owner_high: dict[str, int] = {}  # per owner, its most bytes since it last handed memory back
        self._handed_back: dict[str, tuple[float, int]] = {}  # per owner, when it last did and how many bytes

    def _now(self) -> float:
        """The pool's time: its env's, else its recorder's clock, else the running simulation's (0.0 outside one)."""
        if self.env is not None:
            return float(self.env.now)
        rec = self.recorder
        if rec is None:
            return 0.0
        return float(rec.clock.now) if rec.clock is not None else _simulation_now()

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
        held = self._held[key] = self._held.get(key, 0) + nbytes
        total = self._total = self._total + nbytes
        if total > self.peak_bytes:
            self.peak_bytes = total
        if held > self._peaks.get(key, 0):
            self._peaks[key] = held
        mine = self._owner_bytes[owner] = self._owner_bytes.get(owner, 0) + nbytes
        self._owner_high[owner] = max(self._owner_high.get(owner, 0), mine)
        if self.recorder is not None:
            self.recorder.on_memory(self.index, owner, tag, held, total, self._now())

    def freed_by_others(self, owner: str) -> int:
        """Bytes every owner but `owner` has released here, ever (a wake compares two readings)."""
        return sum(n for o, n in self._freed.items() if o != owner)

    def hand_back(self, owner: str) -> int:
        """`owner` returns its freed memory to the driver now (a sleep's empty_cache): the bytes below its high-water
        mark since it last did, as a caching allocator (torch's) keeps freed blocks until then; noted with the time."""
        mine = self._owner_bytes.get(owner, 0)
        nbytes = self._owner_high.get(owner, 0) - mine
        self._owner_high[owner] = mine
        if nbytes > 0:
            self._handed_back[owner] = (self._now(), nbytes)
        return nbytes

    def not_ready(self, owner: str, s_per_gib: float) -> tuple[float, int]:
        """What owners other than `owner` handed back and the driver has not yet made ready for another process (it
        clears memory in the background at `s_per_gib` from the hand-back): (seconds until all is, bytes still not)."""
        now, wait, left = self._now(), 0.0, 0
        for other, (t, nbytes) in self._handed_back.items():
            rest = t + nbytes / GiB * s_per_gib - now if other != owner else 0.0
            if rest > 0:
                wait, left = max(wait, rest), left + int(rest / s_per_gib * GiB)
        return wait, left

    def owners(self) -> set[str]:
        """Every owner that has held memory here (a process once on a GPU keeps its context there)."""
        return {owner for owner, _ in self._peaks}

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
        left = held - amount
        if left:
            self._held[key] = left
        else:
            del self._held[key]
        self._total -= amount
        self._owner_bytes[owner] -= amount
        self._freed[owner] = self._freed.get(owner, 0) + amount
        if self.recorder is not None:
            self.recorder.on_memory(self.index, owner, tag, left, self._total, self._now())
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

    def __init__(self, index: int, capacity: int, *, recorder: Recorder | None = None,
                 env: simpy.Environment | None = None) -> None:
        if index < 0:
            raise ValueError(f"GPU index must be >= 0, got {index}")
        super().__init__(index, capacity, recorder=recorder, env=env)


class SimHost(_Pool):
    """Pinned host memory of the node(s); `capacity=None` means unlimited (the default)."""

    def __init__(self, capacity: int | None = None, *, recorder: Recorder | None = None,
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
    recorder: Recorder

    @classmethod
    def create(cls, env: simpy.Environment, hardware: HardwareSpec, num_gpus: int, *,
               host_capacity: int | None = None, recorder: Recorder | None = None) -> SimCluster:
        if num_gpus < 1:
            raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
        rec = recorder if recorder is not None else Recorder()
        if rec.clock is None:
            rec.bind(env)
        gpus = [SimGPU(i, hardware.memory_bytes, recorder=rec, env=env) for i in range(num_gpus)]
        return cls(env, hardware, gpus, SimHost(host_capacity, recorder=rec, env=env), rec)


def _simulation_now() -> float:
    from vime.sim import clock
    try:
        return float(clock.now())
    except Exception:  # no simulation running: a static accounting (tests, planning math)
        return 0.0
