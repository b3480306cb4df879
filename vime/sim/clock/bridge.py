"""Bridges between asyncio and simpy inside a SimEventLoop: await a simpy event, yield an asyncio future, read the time."""

from __future__ import annotations

import asyncio
from typing import Any, cast

import simpy

from vime.errors import SimulationError
from vime.sim.clock.loop import SimEventLoop, describe_event


def _running_sim_loop(what: str) -> SimEventLoop:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        loop = None
    if not isinstance(loop, SimEventLoop):
        where = "no event loop is running" if loop is None else f"the running loop is {type(loop).__name__}"
        raise SimulationError(
            f"{what} works only inside a simulation, but {where}; start the coroutine with "
            "vime.sim.clock.run(...) or on a new_sim_loop()")
    return loop


def current_env() -> simpy.Environment:
    """The simpy.Environment of the running SimEventLoop; SimulationError outside one."""
    return _running_sim_loop("current_env()").env


def now() -> float:
    """The current virtual time (``current_env().now``)."""
    return _running_sim_loop("now()").env.now


def event_future(event: simpy.Event) -> asyncio.Future[Any]:
    """An asyncio future that resolves when ``event`` is processed: its value, or its exception.

    Must be called inside the SimEventLoop that owns ``event``'s environment. A failure delivered
    to the future counts as handled (the event is defused). If the future is cancelled first it
    detaches, and a later failure of ``event`` is then unhandled, as in plain simpy.
    """
    loop = _running_sim_loop("event_future()")
    if not isinstance(event, simpy.Event):
        raise TypeError(f"expected a simpy event (timeout, process, request, ...), got {type(event).__name__}")
    if event.env is not loop.env:
        raise SimulationError(
            f"{describe_event(event)} belongs to another simpy.Environment than the running "
            "SimEventLoop; create it from current_env()")
    fut = loop.create_future()
    if event.callbacks is None:  # already processed
        _deliver(fut, event)
        return fut

    def on_event(ev: simpy.Event) -> None:
        if not fut.done():
            _deliver(fut, ev)

    def on_done(f: asyncio.Future[Any]) -> None:
        loop._event_waits.pop(f, None)
        callbacks = event.callbacks
        if f.cancelled() and callbacks is not None and on_event in callbacks:
            callbacks.remove(on_event)

    event.callbacks.append(on_event)
    loop._event_waits[fut] = event
    fut.add_done_callback(on_done)
    return fut


def _deliver(fut: asyncio.Future[Any], event: simpy.Event) -> None:
    if event.ok:
        fut.set_result(event.value)
    else:
        event.defused = True
        fut.set_exception(cast(BaseException, event.value))


async def sleep_until(when: float) -> None:
    """Sleep until virtual time ``when`` exactly (``asyncio.sleep(when - now())`` can miss it by an ulp)."""
    loop = _running_sim_loop("sleep_until()")
    fut = loop.create_future()
    handle = loop.call_at(when, _set_result_unless_done, fut)
    try:
        await fut
    finally:
        handle.cancel()


def _set_result_unless_done(fut: asyncio.Future[Any]) -> None:
    if not fut.done():
        fut.set_result(None)


async def wait_event(event: simpy.Event) -> Any:
    """Wait, from asyncio code, for a simpy event (timeout, process, resource request, ...).

    Returns the event's value at the virtual time it is processed; raises its exception if it failed.
    """
    return await event_future(event)


def future_event(fut: asyncio.Future[Any], env: simpy.Environment | None = None) -> simpy.Event:
    """A simpy event that a process can ``yield`` to wait for an asyncio future or task.

    It succeeds with the future's result, fails with its exception, or fails with
    ``asyncio.CancelledError`` if the future is cancelled. ``env`` defaults to (and must be) the
    environment of the SimEventLoop that owns ``fut``. As in simpy, a failure nobody yields is
    unhandled and stops the simulation.
    """
    if not asyncio.isfuture(fut):
        raise TypeError(f"future_event() needs an asyncio future or task, got {type(fut).__name__}; "
                        "wrap a coroutine with asyncio.ensure_future(...) first")
    loop = fut.get_loop()
    if not isinstance(loop, SimEventLoop):
        raise SimulationError(f"future_event(): the future belongs to a {type(loop).__name__}, not a "
                              "SimEventLoop, so simpy cannot see when it completes")
    if env is None:
        env = loop.env
    elif env is not loop.env:
        raise SimulationError("future_event(): env is not the environment of the future's SimEventLoop")
    event = env.event()

    def on_done(f: asyncio.Future[Any]) -> None:
        loop._future_events.pop(event, None)
        if f.cancelled():
            # simpy's annotation says Exception; it accepts (and processes catch) any BaseException.
            event.fail(asyncio.CancelledError(f"awaited asyncio future was cancelled: {f!r}"))  # type: ignore[arg-type]
            return
        exc = f.exception()
        if exc is not None:
            event.fail(exc)  # type: ignore[arg-type]
        else:
            event.succeed(f.result())

    if not fut.done():
        loop._future_events[event] = fut
    fut.add_done_callback(on_done)
    return event
