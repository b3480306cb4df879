"""`--fault engine-crash` on the real backend: the engine's vLLM server process group is killed (SIGKILL) during the rollout the spec names; the run recovers as from any crash.

What follows is the run's own recovery, nothing staged: vllm-router retries the lost requests on
the other engines, the orchestrator's health check after the rollout finds the engine dead and
restarts its server through the fleet (`RolloutEngine.restart()`), and it rejoins with the next
weights. The engines are wrapped in `vime.recovery.SupervisedEngine`, so a server that dies in a
control call is restarted there too, and every restart is logged. Servers on this machine only:
the kill is a local signal to the server's process group (its guard's child).
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

from vime.errors import EngineError
from vime.faults import FaultLog, FaultSpec, parse_fault
from vime.recovery import SupervisedEngine


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

    def now(self) -> float:
        return asyncio.get_running_loop().time()

    def where(self) -> tuple[int | None, str | None]:
        return self.step, self.phase

    def wrap(self, engines: list[Any]) -> list[Any]:
        return [SupervisedEngine(e, self.log, now=self.now, where=self.where) for e in engines]

    def on_phase(self, name: str, begin: bool, t: float, rollout_id: int | None) -> None:
        if not begin:
            return
        self.step, self.phase = rollout_id, name
        loop = asyncio.get_running_loop()
        for s in self.specs:
            if s.kind == "engine-crash" and s.step == rollout_id and s.phase == name:
                self._pending.append(loop.call_later(s.at, self._kill, s))

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

    def close(self) -> None:
        for handle in self._pending:
            handle.cancel()
