"""Running a coroutine on the virtual clock: a fresh SimEventLoop, then asyncio.run's epilogue (leftover tasks, async generators)."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import simpy

from vime.errors import SimulationError
from vime.sim.clock.loop import SimEventLoop

T = TypeVar("T")


def new_sim_loop(env: simpy.Environment | None = None) -> SimEventLoop:
    """A new SimEventLoop on ``env`` (a fresh Environment starting at 0.0 if None). The caller closes it."""
    return SimEventLoop(env)


def run(coro: Coroutine[Any, Any, T], *, env: simpy.Environment | None = None,
        until: float | None = None) -> T:
    """Run ``coro`` to completion on a fresh SimEventLoop over ``env`` and return its result.

    Like ``asyncio.run``: the coroutine runs as task ``'main'``; afterwards leftover tasks are
    cancelled (in creation order) and async generators shut down; the loop is closed, ``env`` is
    left at the final virtual time with its own simpy events still queued. ``until`` bounds the
    virtual time: needing an event later than ``until`` raises SimulationError (use it when simpy
    processes tick forever, which would otherwise hide a deadlock). A deadlock raises
    SimulationError listing the pending tasks.
    """
    if not asyncio.iscoroutine(coro):
        raise TypeError(f"run() needs a coroutine object, got {coro!r}; call the async function: run(main())")
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise SimulationError("run() cannot be called from a running event loop; await the coroutine instead")
    loop = new_sim_loop(env)
    if until is not None:
        if not until >= loop.env.now:
            coro.close()
            loop.close()
            raise SimulationError(f"run(until={until!r}) is before the environment's time {loop.env.now!r}")
        loop._until = until
    try:
        result = loop.run_until_complete(loop.create_task(coro, name="main"))
    except BaseException as exc:
        try:
            _finish(loop)
        except Exception as cleanup:
            exc.add_note(f"while cleaning up after it: {type(cleanup).__name__}: {cleanup}")
        finally:
            loop.close()
        raise
    try:
        _finish(loop)
    finally:
        loop.close()
    return result


def _finish(loop: SimEventLoop) -> None:
    """Cancel leftover tasks in creation order and shut down async generators (asyncio.run's epilogue)."""
    loop._cancelling_leftovers = True
    try:
        leftovers = loop._pending_tasks()
        if leftovers:
            for task in leftovers:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*leftovers, return_exceptions=True))
            for task in leftovers:
                if not task.cancelled() and task.exception() is not None:
                    loop.call_exception_handler({
                        "message": "unhandled exception during vime.sim.clock.run() shutdown",
                        "exception": task.exception(),
                        "task": task,
                    })
        shutdown = loop.shutdown_asyncgens()
        try:
            loop.run_until_complete(shutdown)
        except BaseException:
            shutdown.close()  # the loop failed under it; leave no never-finished coroutine behind
            raise
    finally:
        loop._cancelling_leftovers = False
