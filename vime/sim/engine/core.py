"""The engine core of one simulated server: the scheduler's busy loop on the virtual clock, controls at iteration boundaries.

One simpy process per server process (a restart starts a new core): it applies the controls
handed to it (pause, the quiesce of sleep, abort, cancel, flush) at the next iteration boundary,
then runs the scheduler's plan — a closed-form lockstep decode phase waited with one simpy
timeout, cut short when an arrival or control pokes it, or one explicit iteration — and commits it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import simpy

from vime.errors import SimulationError
from vime.protocols import EngineLifecycle, EngineMemory
from vime.sim import clock
from vime.sim.engine.scheduler import DONE

if TYPE_CHECKING:
    from vime.sim.engine.scheduler import Request, Scheduler


async def pause_for(env: simpy.Environment, seconds: float) -> None:
    """Let `seconds` of virtual time pass in asyncio code (nothing for seconds ≤ 0)."""
    if seconds > 0:
        await clock.event_future(env.timeout(seconds))


class EngineCore:
    """Runs `sched` on `env` while the server is awake, unpaused and not held for sleep.

    `control(kind, arg)` hands a control over and returns once it took effect; `poke()` cuts a
    waiting phase short (an arrival at the head of the queue); `stop(error)` ends the process and
    fails every request and control still waiting (the server died). `busy_span(t0, t1, tokens)`
    receives each stretch of work, `log` the core's events.
    """

    def __init__(self, name: str, env: simpy.Environment, lifecycle: EngineLifecycle, sched: Scheduler,
                 busy_span: Callable[[float, float, int], None], log: Callable[..., None]) -> None:
        self.name = name
        self.env = env
        self.lifecycle = lifecycle
        self.sched = sched
        self._busy_span = busy_span
        self._log = log
        self._controls: deque[tuple[str, Any, simpy.Event]] = deque()
        self._drain_waiters: list[tuple[simpy.Event, bool]] = []  # (event, hold the scheduler after)
        self.hold = False  # scheduler held for sleep (apart from an explicit pause)
        self.stopped = False
        self._wake: simpy.Event | None = None
        self._busy_since: float | None = None
        self._busy_tokens = 0

    #: set on the core that replaces a dead server's until its restart: controls arriving now fail
    refuse: BaseException | None = None

    def start(self) -> None:
        self.env.process(self._loop())

    def poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    async def control(self, kind: str, arg: Any = None) -> None:
        """Hand a control to the scheduler process and wait until it took effect at an iteration boundary."""
        if self.refuse is not None:  # the server died while the call was on its way in
            raise self.refuse
        ev = self.env.event()
        self._controls.append((kind, arg, ev))
        self.poke()
        outcome = await clock.event_future(ev)
        if isinstance(outcome, BaseException):
            raise outcome

    def cancel(self, req: Request) -> None:
        """Abort a request whose client went away, at the next boundary."""
        self._controls.append(("cancel", req, self.env.event()))
        self.poke()

    def stop(self, error: BaseException) -> None:
        """The server process died: every request, control and drain waiting gets `error`; the loop ends."""
        self.stopped = True
        for req in self.sched.requests():
            self.sched.stats.failed += 1
            req.mode = DONE
            req.done.succeed(error)
        for _, _, ev in self._controls:
            ev.succeed(error)
        for ev, _ in self._drain_waiters:
            ev.succeed(error)
        wake = self._wake
        self.end_busy()
        if wake is not None and not wake.triggered:
            wake.succeed()

    def end_busy(self) -> None:
        """Close the current busy period as one trace span (one per stretch of work, not per iteration)."""
        if self._busy_since is None:
            return
        self._busy_span(self._busy_since, float(self.env.now), self.sched.stats.tokens_generated - self._busy_tokens)
        self._busy_since = None

    # --- controls at iteration boundaries -------------------------------------------------------
    def _apply_controls(self) -> None:
        sched, lc = self.sched, self.lifecycle
        while self._controls:
            kind, arg, ev = self._controls.popleft()
            if kind == "pause":
                lc.on_pause(arg)
                self._log("pause", arg)
                if arg == "abort":
                    sched.abort_all()
                if arg == "wait":
                    self._drain_waiters.append((ev, False))
                else:
                    ev.succeed()
            elif kind == "quiesce":  # sleep: what happens to requests still in the scheduler
                if arg == "wait" and lc.paused in ("abort", "keep"):
                    arg = "keep"  # a paused scheduler cannot drain: its requests stay frozen
                self._log("quiesce", arg)
                if arg == "abort":
                    sched.abort_all()
                if arg == "wait":
                    self._drain_waiters.append((ev, True))
                else:
                    sched.preempt_all()
                    self.hold = True
                    ev.succeed()
            elif kind == "abort":
                sched.abort_all(include_held=True)
                ev.succeed()
            elif kind == "cancel":
                sched.cancel(arg)
                ev.succeed()
            elif kind == "flush":
                sched.preempt_all()
                self._log("flush")
                ev.succeed()
            else:  # pragma: no cover - programming error
                raise SimulationError(f"engine {self.name}: unknown control {kind!r}")
        if self._drain_waiters and not sched.has_work():
            for ev, hold in self._drain_waiters:
                self.hold = self.hold or hold
                ev.succeed()
            self._drain_waiters.clear()

    def _runnable(self) -> bool:
        if self.stopped or self.hold:
            return False
        if self.lifecycle.memory is not EngineMemory.AWAKE:
            return False
        if self.lifecycle.paused in ("abort", "keep"):
            return False
        return self.sched.has_work()

    # --- the process ----------------------------------------------------------------------------
    def _loop(self):  # simpy process
        env, sched, stats = self.env, self.sched, self.sched.stats
        idle_plans = 0
        while True:
            if self.stopped:
                return
            self._apply_controls()
            if not self._runnable():
                self.end_busy()
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if self._busy_since is None:
                self._busy_since = float(env.now)
                self._busy_tokens = stats.tokens_generated
                sched.first_step = True  # its CPU work has no earlier GPU step to hide behind
            phase = sched.plan_phase()
            if phase is not None:
                sched.first_step = False  # (a phase resumed after a pause: its lead-in is not modelled)
                stats.phases += 1
                start = float(env.now)
                total = phase.elapsed(phase.k)
                self._wake = env.event()
                timer = env.timeout(total)
                yield timer | self._wake
                self._wake = None
                if self.stopped:
                    return
                if timer.processed:
                    k = phase.k
                else:
                    elapsed = float(env.now) - start
                    k = min(phase.done_by(elapsed) + 1, phase.k)
                    rest = phase.elapsed(k) - elapsed
                    if rest > 0:
                        yield env.timeout(rest)
                        if self.stopped:
                            return
                sched.advance_decode(k, total if k == phase.k else phase.elapsed(k))
                continue
            dt = sched.plan_iteration()
            if dt is None:
                idle_plans += 1
                if idle_plans > 2:  # pragma: no cover - a scheduler bug must not hang the simulation
                    raise SimulationError(f"engine {self.name}: requests queued but none can be scheduled "
                                          f"({len(sched.waiting)} waiting, {sched.num_blocks - sched.used_blocks} "
                                          f"free blocks)")
                continue
            idle_plans = 0
            stats.phases += 1
            yield env.timeout(dt)
            if self.stopped:
                return
            sched.commit_iteration()
