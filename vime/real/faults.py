"""`--fault` on the real backend: ``engine-crash`` kills the engine's vLLM server process group (SIGKILL) during the rollout the spec names, ``router-down`` kills vllm-router and starts it again after ``for`` seconds, ``trainer-crash`` kills trainer rank 0's process as that rollout's train phase begins.

After an engine crash the recovery is the run's own, nothing staged: vllm-router retries the lost requests on
the other engines, the orchestrator's health check after the rollout finds the engine dead and
restarts its server through the fleet (`RolloutEngine.restart()`), and it rejoins with the next
weights. The engines are wrapped in `vime.recovery.SupervisedEngine`, so a server that dies in a
control call is restarted there too, and every restart is logged. While the router is down the
router client is a `vime.recovery.RouterGate`: requests cut by the kill fail and are retried by the
rollout, and every request waits until the router answers again (the client's reconnect). A killed
trainer rank ends the run (the trainer names the rank); the fault section then says how to resume.
Processes on this machine only: the kills are local signals.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from vime.errors import EngineError
from vime.faults import FaultLog, FaultSpec, parse_fault
from vime.recovery import RouterGate, SupervisedEngine


def server_groups(guard_pid: int) -> list[int]:
    """The process groups the guard `guard_pid` started (the server leads its own: the guard starts it in a new session)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        if int(stat.rsplit(")", 1)[1].split()[1]) == guard_pid:
            out.append(int(entry))
    return sorted(out)


class RealFaults:
    """The ``--fault`` specs of a real run (engine-crash during a rollout): an orchestrator observer that kills servers."""

    def __init__(self, args: Any, session: Any) -> None:
        self.specs: list[FaultSpec] = [parse_fault(t) for t in args.fault]
        self.log = FaultLog(self.specs)
        self.save = args.save
        self.session = session
        self.step: int | None = None
        self.phase: str | None = "startup"
        self._pending: list[asyncio.TimerHandle] = []
        self._tasks: list[asyncio.Task[None]] = []
        self.gate: RouterGate | None = None

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def where(self) -> tuple[int | None, str | None]:
        return self.step, self.phase

    def wrap(self, engines: list[Any], router: Any) -> tuple[list[Any], Any]:
        """The engines supervised, and the router behind a gate when a router-down spec is given."""
        if any(s.kind == "router-down" for s in self.specs):
            router = self.gate = RouterGate(router)
        return [SupervisedEngine(e, self.log, now=self.now, where=self.where) for e in engines], router

    def on_phase(self, name: str, begin: bool, t: float, rollout_id: int | None) -> None:
        if not begin:
            return
        self.step, self.phase = rollout_id, name
        loop = asyncio.get_running_loop()
        for s in self.specs:
            if s.kind == "engine-crash" and s.step == rollout_id and s.phase == name:
                self._pending.append(loop.call_later(s.at, self._kill, s))
            elif s.kind == "router-down" and s.step == rollout_id and name == "rollout":
                self._pending.append(loop.call_later(s.at, self._router_down, s))
            elif s.kind == "trainer-crash" and s.step == rollout_id and name == "train":
                self._pending.append(loop.call_later(0.0, self._kill_trainer, s))

    def on_call(self, component: str, call: str, t0: float, t1: float) -> None:
        pass

    def _guard_pid(self, index: int) -> int:
        fleet = getattr(self.session, "fleet", None)
        if fleet is not None:
            pid = fleet.engines[index].pid
        else:
            pid = self.session.placement["engine_hosts"][index]["guard_pid"]
        if pid is None:
            raise EngineError(f"engine{index}", "fault", "its server's guard process is unknown; cannot kill it")
        return int(pid)

    def _kill(self, spec: FaultSpec) -> None:
        name = f"engine{spec.engine}"
        groups = server_groups(self._guard_pid(spec.engine))
        for pgid in groups:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.log.add(self.now(), self.step, self.phase, "crash", name,
                     f"server process group(s) {groups} killed with SIGKILL (--fault {spec.text})")

    def _kill_trainer(self, spec: FaultSpec) -> None:
        ranks = self.session.placement.get("trainer_ranks") or []
        pid = ranks[0].get("pid") if ranks else None
        if pid is None:
            raise EngineError("trainer", "fault", "trainer rank 0's process is unknown; cannot kill it")
        os.kill(int(pid), signal.SIGKILL)
        reason = f"the trainer crashed in rollout {self.step}'s train phase (--fault {spec.text})"
        self.log.add(self.now(), self.step, self.phase, "crash", "trainer",
                     f"rank 0 (pid {pid}) killed with SIGKILL (--fault {spec.text})")
        self.log.stopped = reason

    def _router_down(self, spec: FaultSpec) -> None:
        assert self.gate is not None
        proc = next(p for p in reversed(self.session.launcher.processes) if p.name == "router")
        self.gate.down(cut=False)  # the kill cuts what is in flight
        os.killpg(proc.pid, signal.SIGKILL)
        self.log.add(self.now(), self.step, self.phase, "down", "router",
                     f"vllm-router (pid {proc.pid}) killed with SIGKILL for {spec.duration:g} s (--fault {spec.text})")
        self._tasks.append(asyncio.ensure_future(self._router_back(spec)))

    async def _router_back(self, spec: FaultSpec) -> None:
        assert self.gate is not None
        await asyncio.sleep(spec.duration)
        took = await asyncio.to_thread(self.session.launcher.restart, "router", timeout_s=120.0)
        self.gate.up()
        self.log.add(self.now(), self.step, self.phase, "up", "router",
                     f"started again (healthy after {took:.1f} s, same port); {self.gate.held} request(s) waited for it")

    async def close(self) -> None:
        for handle in self._pending:
            handle.cancel()
        for task in self._tasks:  # a router still down comes back before the session tears it down
            await task
