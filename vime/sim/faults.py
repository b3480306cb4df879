"""`--fault` on simulated backends: each spec armed on the virtual clock (a server killed, an engine slowed, the router taken down, the trainer crashed), the run's recovery wrapped around the backends.

`SimFaults` is an orchestrator observer (it knows the step and phase the run is in), wraps the
engines in `vime.recovery.SupervisedEngine` (whose pre-call hook fails a wake or a weight update),
the router in `RouterGate` and the trainer in `_CrashingTrainer`. Everything happens at virtual
times fixed by the specs and the run, so a faulted simulation is as deterministic as any other.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from vime.faults import FaultLog, FaultSpec, FaultStop, parse_fault, resume_hint
from vime.recovery import RouterGate, SupervisedEngine


def _sim_engine(engine: Any) -> Any:
    """The SimEngine under wrappers (disk sync, call recording)."""
    while not hasattr(type(engine), "fail_now"):
        engine = engine.inner if hasattr(engine, "inner") else engine._target
    return engine


def _slowed(cost: Any, factor: float) -> Any:
    """An iteration model whose every iteration takes `factor` times as long (rates divided, fixed costs multiplied)."""
    return dataclasses.replace(
        cost, bytes_per_s=cost.bytes_per_s / factor, flops_per_s=cost.flops_per_s / factor,
        weight_bytes_per_s=cost.weight_bytes_per_s / factor, overhead_s=cost.overhead_s * factor,
        allreduce_per_token_s=cost.allreduce_per_token_s * factor, allreduce_latency_s=cost.allreduce_latency_s * factor,
        host_s=cost.host_s * factor, host_per_seq_s=cost.host_per_seq_s * factor, eager_s=cost.eager_s * factor)


class SimFaults:
    """The ``--fault`` specs of `args` armed on `backends` (see the module docstring); `log` says what happened."""

    def __init__(self, args: Any, backends: Any) -> None:
        self.specs: list[FaultSpec] = [parse_fault(t) for t in args.fault]
        self.log = FaultLog(self.specs, recorder=backends.recorder)
        self.save = args.save
        self.env = backends.env
        self.raw = [_sim_engine(e) for e in backends.engines]
        self.gate: RouterGate | None = None
        self.step: int | None = None
        self.phase: str | None = "startup"
        self._fired: set[int] = set()
        for i, s in enumerate(self.specs):
            if s.kind == "engine-crash" and s.time is not None:
                self._later(s.time, self._crash, i, s)
            if s.kind == "slow-engine" and s.step is None:
                self._slow(i, s)

    def now(self) -> float:
        return float(self.env.now)

    def where(self) -> tuple[int | None, str | None]:
        return self.step, self.phase

    # --- wrapping ------------------------------------------------------------------------------
    def wrap(self, backends: Any, replaced: dict[str, Any]) -> dict[str, Any]:
        engines = replaced.get("engines", backends.engines)
        router = replaced.get("router", backends.router)
        trainer = replaced.get("trainer", backends.trainer)
        out = dict(replaced)
        out["engines"] = [SupervisedEngine(e, self.log, now=self.now, where=self.where, before=self._before)
                          for e in engines]
        if any(s.kind == "router-down" for s in self.specs):
            out["router"] = self.gate = RouterGate(router)
        if any(s.kind == "trainer-crash" for s in self.specs):
            out["trainer"] = _CrashingTrainer(trainer, self)
        return out

    # --- observer ------------------------------------------------------------------------------
    def on_phase(self, name: str, begin: bool, t: float, rollout_id: int | None) -> None:
        if not begin:
            return
        self.step, self.phase = rollout_id, name
        for i, s in enumerate(self.specs):
            if s.step != rollout_id:
                continue
            if s.kind == "engine-crash" and s.phase == name:
                self._later(s.at, self._crash, i, s)
            elif s.kind == "slow-engine" and name == "rollout":
                self._slow(i, s)
            elif s.kind == "router-down" and name == "rollout":
                self._later(s.at, self._router, i, s)

    def on_call(self, component: str, call: str, t0: float, t1: float) -> None:
        pass

    # --- the faults ----------------------------------------------------------------------------
    def _later(self, delay: float, fire: Any, i: int, spec: FaultSpec) -> None:
        def process():  # simpy process
            yield self.env.timeout(delay)
            fire(i, spec)
        self.env.process(process())

    def _crash(self, i: int, spec: FaultSpec) -> None:
        engine = self.raw[spec.engine]
        self.log.add(self.now(), self.step, self.phase, "crash", engine.name, f"server killed (--fault {spec.text})")
        engine.fail_now(f"injected crash (--fault {spec.text})")

    def _slow(self, i: int, spec: FaultSpec) -> None:
        if i in self._fired:
            return
        self._fired.add(i)
        engine = self.raw[spec.engine]
        engine.cost = _slowed(engine.cost, spec.factor)
        engine._sched.cost = engine.cost  # the running scheduler's, and any restarted one's
        self.log.add(self.now(), self.step, self.phase, "slow", engine.name,
                     f"every iteration {spec.factor:g}× as long from here on (--fault {spec.text})")

    def _router(self, i: int, spec: FaultSpec) -> None:
        assert self.gate is not None
        gate = self.gate
        gate.down()
        self.log.add(self.now(), self.step, self.phase, "down", "router", f"unreachable for {spec.duration:g} s "
                     f"(--fault {spec.text})")

        def back():  # simpy process
            yield self.env.timeout(spec.duration)
            gate.up()
            self.log.add(self.now(), self.step, self.phase, "up", "router",
                         f"back; {gate.cut} request(s) cut in flight were retried, {gate.held} waited for it")
        self.env.process(back())

    async def _before(self, engine: Any, call: str, args: tuple[Any, ...]) -> None:
        """Before a control call: a wake-fail or update-fail spec for this engine, rollout and call kills the server."""
        index = next(k for k, e in enumerate(self.raw) if e.name == engine.name)
        for i, s in enumerate(self.specs):
            if i in self._fired or s.engine != index or s.step != self.step:
                continue
            hit = (s.kind == "wake-fail" and call == "wake_up" and self.phase == s.phase) or \
                  (s.kind == "update-fail" and call == "update_weights" and self.phase == "weight_sync"
                   and args[0].index == s.bucket)
            if hit:
                self._fired.add(i)
                what = "wake-up" if s.kind == "wake-fail" else f"weight bucket {s.bucket}"
                self.log.add(self.now(), self.step, self.phase, "crash", engine.name,
                             f"server died on its {what} (--fault {s.text})")
                self.raw[index].fail_now(f"injected: {what} failed (--fault {s.text})")


class _CrashingTrainer:
    """The trainer, dying in the train call of the rollout a ``trainer-crash`` spec names."""

    def __init__(self, trainer: Any, faults: SimFaults) -> None:
        self.inner = trainer
        self._faults = faults

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def train(self, rollout_id: int, batch: Any) -> Any:
        for s in self._faults.specs:
            if s.kind == "trainer-crash" and s.step == rollout_id:
                f = self._faults
                reason = f"the trainer crashed in rollout {rollout_id}'s train call (--fault {s.text})"
                f.log.add(f.now(), rollout_id, "train", "crash", "trainer", reason)
                f.log.stopped = reason
                raise FaultStop(f"{reason}; its batch was not trained. {resume_hint(f.save)}")
        return await self.inner.train(rollout_id, batch)
