"""The run recorder: phase spans, protocol calls, memory samples and peaks — what reports, traces and OOM verdicts read.

Backend-neutral: the simulator feeds it today, and a real run can feed it the same way (it needs
nothing from `vime.sim`). Deterministic: no wall clock of its own, dicts keep insertion order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from vime.errors import OutOfMemoryError, SimulationError

#: Device index of host (pinned CPU) memory in samples, peaks and errors.
HOST = -1


class Clock(Protocol):
    """Anything whose ``now`` is the current time in seconds: a simpy.Environment, or a real run's clock."""

    @property
    def now(self) -> float: ...


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
    """A high-water mark: bytes, when, in which phase / rollout, and (for a whole device) who held what."""

    bytes: int
    t: float
    phase: str
    rollout_id: int | None
    breakdown: tuple[tuple[str, str, int], ...] = ()  # (owner, tag, bytes), sorted by owner, tag


class Recorder:
    """Collects everything a run shows: spans, memory samples, peaks, phases, the first OOM.

    Times are in the run's clock (virtual seconds in a simulation, monotonic seconds in a real
    run). ``clock`` (a `Clock`: the simulation's ``env``, or an object whose ``now`` reads
    ``time.monotonic()``) is what `now()` reads when a call gives no time; unbound, `now()` is
    0.0. Feeding it:

    - ``on_phase(name, begin, t, rollout_id)`` and ``on_call(component, call, t0, t1)``: the
      `vime.protocols.StepObserver` calls of the orchestrator; phases nest, and a sample or peak
      is attributed to the innermost phase in progress and the last rollout id that began one;
    - ``span(track, name, t0, t1, **args)``: any other timed interval (an engine busy, a copy);
    - ``instant(track, name, **args)``: a point event at `now()`;
    - ``on_memory(gpu, owner, tag, nbytes, total=None, t=None)``: right after a change,
      (owner, tag) holds ``nbytes`` on device ``gpu`` (HOST for pinned host memory). ``total``
      is the device's whole usage then (None: the sum of what this recorder was told for that
      device); ``t`` None means `now()`. A device index names one device per recorder;
    - ``on_oom(error)``: an `OutOfMemoryError`; the first one is the run's verdict.

    Reading it: ``spans``, ``samples``, ``instants``, ``phase_spans``, ``gpu_peaks`` (per device,
    with the (owner, tag) breakdown at the peak), ``tag_peaks``, ``phase_peaks`` (per device and phase name, every
    phase in progress counted), ``oom``, `peak_table`, `to_dict`.
    """

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock = clock
        self.spans: list[Span] = []
        self.samples: list[MemorySample] = []
        self.instants: list[tuple[float, str, str, dict[str, Any]]] = []  # (t, track, name, args)
        self.gpu_peaks: dict[int, Peak] = {}
        self.tag_peaks: dict[tuple[int, str, str], Peak] = {}
        #: (device, phase name) -> the device's most bytes while that phase was in progress (nested or not)
        self.phase_peaks: dict[tuple[int, str], int] = {}
        self._totals: dict[int, int] = {}  # each device's whole usage as last reported
        self.phase_spans: list[tuple[str, int | None, float, float]] = []  # (name, rollout_id, t0, t1)
        self.oom: OutOfMemoryError | None = None
        self.rollout_id: int | None = None
        self._phase_stack: list[tuple[str, int | None, float]] = []
        # Bytes by (owner, tag) on each device as last reported: the breakdown of a device's peak.
        self._held: dict[int, dict[tuple[str, str], int]] = {}

    def bind(self, clock: Clock) -> None:
        """Read time from ``clock`` from now on."""
        self.clock = clock

    def now(self) -> float:
        return float(self.clock.now) if self.clock is not None else 0.0

    # --- StepObserver ---------------------------------------------------------------------------
    @property
    def phase(self) -> str:
        """The innermost phase in progress ("" outside any)."""
        return self._phase_stack[-1][0] if self._phase_stack else ""

    def on_phase(self, name: str, begin: bool, t: float, rollout_id: int | None) -> None:
        if begin:
            self._phase_stack.append((name, rollout_id, t))
            for gpu, total in self._totals.items():  # a phase that changes nothing still holds what was there
                self._raise_phase_peak(gpu, name, total)
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

    # --- what backends report -------------------------------------------------------------------
    def span(self, track: str, name: str, t0: float, t1: float, **args: Any) -> None:
        self.spans.append(Span(track, name, t0, t1, dict(args)))

    def instant(self, track: str, name: str, **args: Any) -> None:
        self.instants.append((self.now(), track, name, dict(args)))

    def on_memory(self, gpu: int, owner: str, tag: str, nbytes: int, total: int | None = None,
                  t: float | None = None) -> None:
        """(owner, tag) holds `nbytes` on device `gpu` right after a change (see the class docstring)."""
        if t is None:
            t = self.now()
        held = self._held.get(gpu)
        if held is None:
            held = self._held[gpu] = {}
        key = (owner, tag)
        if nbytes:
            held[key] = nbytes
        else:
            held.pop(key, None)
        if total is None:
            total = sum(held.values())
        self.samples.append(MemorySample(t, gpu, owner, tag, nbytes, total))
        self._totals[gpu] = total
        for name in {p[0] for p in self._phase_stack}:
            self._raise_phase_peak(gpu, name, total)
        best = self.tag_peaks.get((gpu, owner, tag))
        if best is None or nbytes > best.bytes:
            self.tag_peaks[(gpu, owner, tag)] = Peak(nbytes, t, self.phase, self.rollout_id)
        best = self.gpu_peaks.get(gpu)
        if best is None or total > best.bytes:
            breakdown = tuple((o, g, b) for (o, g), b in sorted(held.items()))
            self.gpu_peaks[gpu] = Peak(total, t, self.phase, self.rollout_id, breakdown)

    def _raise_phase_peak(self, gpu: int, phase: str, total: int) -> None:
        if total > self.phase_peaks.get((gpu, phase), -1):
            self.phase_peaks[(gpu, phase)] = total

    def on_oom(self, error: OutOfMemoryError) -> None:
        if self.oom is None:
            self.oom = error
        self.instants.append((error.time if error.time is not None else self.now(), f"gpu{error.gpu}", "OOM",
                              {"owner": error.owner, "tag": error.tag, "requested": error.requested,
                               "free": error.free, "phase": error.phase}))

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
