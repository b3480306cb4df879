"""Recovery from faults at the protocol level, for both backends: an engine whose server died in a control call is restarted and put back where the run expects it; requests wait out a router that is down.

The orchestrator itself restarts an engine found dead after a rollout (`Orchestrator._check_engines`):
that covers a crash while generating, whose requests the rollout retries on the other engines.
`SupervisedEngine` covers the other phases: a sleep, wake, pause, flush or weight-update call that
fails because the server died restarts it (``RolloutEngine.restart()``) and then

- in the middle of a weight update: opens the update again and replays the buckets it already took;
- after its weights were published (waking the KV cache, resuming): replays the last publication,
  so it never serves the weights the restarted server loaded from disk;
- inside the weight sync's pause: pauses it again with the same mode;

and repeats the call (a wake is not repeated: a restarted server comes up awake).
`RouterGate` holds requests while the router is down and fails those in flight when it goes down
(the rollout retries them), so nothing is lost.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from vime.engine_delegate import DelegatingEngine
from vime.errors import EngineError
from vime.faults import FaultLog
from vime.protocols import TAG_WEIGHTS, GenerateRequest, GenerateResult, WeightBucket

#: (step, phase) the run is in, for the log
Where = Callable[[], tuple[int | None, str | None]]
#: called before each control call: (engine, call, args); fault injection kills the server here
Hook = Callable[[Any, str, tuple[Any, ...]], Awaitable[None]]


class SupervisedEngine(DelegatingEngine):
    """A `RolloutEngine` that restarts its server when a control call finds it dead (see the module docstring)."""

    def __init__(self, engine: Any, log: FaultLog, *, now: Callable[[], float], where: Where,
                 before: Hook | None = None) -> None:
        self.inner = engine
        self.name = engine.name
        self._log = log
        self._now = now
        self._where = where
        self._before = before
        self._session: list[WeightBucket] | None = None  # buckets of the open weight update
        self._last: tuple[int, list[WeightBucket]] | None = None  # the last finished publication
        self._pause_mode: str | None = None

    @property
    def lifecycle(self) -> Any:
        return self.inner.lifecycle

    # generate, health, is_sleeping, is_paused, weight_version and backend extras: DelegatingEngine's
    async def restart(self) -> None:
        """The orchestrator's restart of an engine found dead after a rollout; the next publication gives it weights."""
        t0 = self._now()
        await self.inner.restart()
        self._session, self._last, self._pause_mode = None, None, None
        self._record("restart", f"found dead after the rollout; restarted in {self._now() - t0:.3f} s, "
                                f"its in-flight requests retried on the other engines")

    # --- control calls -------------------------------------------------------------------------
    async def sleep(self, level: int, mode: str = "keep") -> None:
        await self._control("sleep", level, mode)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        await self._control("wake_up", tags)

    async def pause(self, mode: str = "abort") -> None:
        await self._control("pause", mode)
        self._pause_mode = mode

    async def resume(self) -> None:
        await self._control("resume")
        self._pause_mode = None

    async def flush_cache(self) -> None:
        await self._control("flush_cache")

    async def start_weight_update(self) -> None:
        await self._control("start_weight_update")
        self._session = []

    async def update_weights(self, bucket: WeightBucket) -> None:
        await self._control("update_weights", bucket)
        if self._session is not None:
            self._session.append(bucket)

    async def finish_weight_update(self, version: int) -> None:
        await self._control("finish_weight_update", version)
        self._last = (version, list(self._session or []))
        self._session = None

    async def _control(self, call: str, *args: Any) -> None:
        if self._before is not None:
            await self._before(self, call, args)
        try:
            await getattr(self.inner, call)(*args)
        except EngineError as exc:
            if await self._alive():
                raise  # the engine answered with an error: not a crash, nothing to recover
            await self._recover(call, args, exc)

    async def _alive(self) -> bool:
        try:
            return bool(await self.inner.health())
        except EngineError:
            return False

    async def _recover(self, call: str, args: tuple[Any, ...], exc: EngineError) -> None:
        t0 = self._now()
        await self.inner.restart()  # an EngineError here ends the run, naming why
        took = self._now() - t0
        replayed = ""
        if self._pause_mode is not None and call not in ("pause", "resume"):
            await self.inner.pause(self._pause_mode)
        if call in ("update_weights", "finish_weight_update") and self._session is not None:
            await self.inner.start_weight_update()
            for bucket in self._session:
                await self.inner.update_weights(bucket)
            replayed = f"; the update reopened and its {len(self._session)} earlier bucket(s) sent again"
        elif (call == "wake_up" and TAG_WEIGHTS not in (args[0] or ())) or call == "resume":
            if self._last is not None:
                await self._replay_last()
                replayed = f"; weights v{self._last[0]} published to it again"
        if call != "wake_up":  # a restarted server is awake: nothing to wake
            await getattr(self.inner, call)(*args)
        self._record("restart", f"{call} failed ({exc.detail}); restarted in {took:.3f} s{replayed}, {call} done")

    async def _replay_last(self) -> None:
        assert self._last is not None
        version, buckets = self._last
        await self.inner.start_weight_update()
        for bucket in buckets:
            await self.inner.update_weights(bucket)
        await self.inner.finish_weight_update(version)

    def _record(self, what: str, detail: str) -> None:
        step, phase = self._where()
        self._log.restarted.append(self.name)
        self._log.add(self._now(), step, phase, what, self.name, detail)


class RouterGate:
    """A `Router` that can be down: requests sent meanwhile wait until it is back, those in flight fail (retried)."""

    def __init__(self, router: Any) -> None:
        self.inner = router
        self._up = asyncio.Event()
        self._up.set()
        self._in_flight: dict[asyncio.Task[Any], None] = {}  # ordered: cancelled in a fixed order (determinism)
        self._cut: set[asyncio.Task[Any]] = set()  # cancelled by down(), not by their caller
        self.held = 0  # requests that waited for the router
        self.cut = 0  # requests in flight when it went down

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    @property
    def is_down(self) -> bool:
        return not self._up.is_set()

    def down(self, *, cut: bool = True) -> None:
        """From now on requests wait; with `cut` those in flight fail now (the simulator's; a real router
        that is killed cuts its connections itself)."""
        self._up.clear()
        for task in list(self._in_flight) if cut else ():
            self._cut.add(task)
            task.cancel()

    def up(self) -> None:
        self._up.set()

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        if not self._up.is_set():
            self.held += 1
            await self._up.wait()  # the client's reconnect with backoff, until the router answers again
        task = asyncio.ensure_future(self.inner.generate(request))
        self._in_flight[task] = None
        try:
            return await task
        except asyncio.CancelledError:
            if task in self._cut:
                self.cut += 1
                raise EngineError("router", "generate", "the router went down with the request in flight "
                                  "(connection reset)", retryable=True) from None
            raise
        finally:
            self._in_flight.pop(task, None)
            self._cut.discard(task)

    async def abort_all(self) -> None:
        if not self._up.is_set():
            await self._up.wait()
        await self.inner.abort_all()
