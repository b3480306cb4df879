"""A simulated server's death and restart: fault injection at a virtual time, and the protocol's ``restart()``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import simpy

from vime.errors import EngineError, SimulationError
from vime.protocols import EngineMemory
from vime.sim.engine.core import pause_for

if TYPE_CHECKING:
    from vime.sim.engine.settings import EngineSettings


class EngineFaults:
    """`vime.sim.engine.server.SimEngine`'s failure and restart, apart from its protocol calls."""

    name: str
    env: simpy.Environment
    settings: EngineSettings
    lifecycle: Any
    allocator: Any
    _failed: str | None
    _core: Any
    _updated_once: bool

    def _log(self, *event: Any) -> None:
        raise NotImplementedError

    def _new_process(self) -> None:
        raise NotImplementedError

    def inject_failure(self, at: float, detail: str = "injected failure") -> None:
        """Make the server die at virtual time `at`: in-flight and later calls raise EngineError(retryable=True)."""
        if at < self.env.now:
            raise SimulationError(f"engine {self.name}: failure time {at} is in the past (now {self.env.now})")

        def crash():  # simpy process
            yield self.env.timeout(at - self.env.now)
            self.fail_now(detail)

        self.env.process(crash())

    def fail_now(self, detail: str = "injected failure") -> None:
        """The server process dies now: every waiting caller gets EngineError(retryable=True)."""
        if self._failed is not None:
            return
        self._failed = detail
        self._log("fail", detail)
        self._core.stop(EngineError(self.name, "generate", f"engine died: {detail}", status=503, retryable=True))
        self._new_process()
        self._core.refuse = EngineError(self.name, "control", f"engine died: {detail}", status=503, retryable=True)

    async def restart(self) -> None:
        """Bring a failed server back (after `restart_s`): awake, empty, no weight version, paused by nothing."""
        if self._failed is None:
            raise EngineError(self.name, "restart", "engine is healthy; restart only a failed engine")
        await pause_for(self.env, self.settings.restart_s)
        self._failed = None
        lc = self.lifecycle
        lc.memory, lc.sleep_level, lc.paused, lc.updating, lc.weight_version = \
            EngineMemory.AWAKE, 0, None, False, None
        # The dead process's memory stays accounted; the new one maps all of it again.
        if self.allocator.lifecycle.asleep_tags():
            await self.allocator.wake_up(None)
        self._updated_once = False  # a new process: its weight-transfer setup comes again
        self._new_process()
        self._core.start()
        self._log("restart")
