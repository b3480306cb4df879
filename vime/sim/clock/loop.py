"""SimEventLoop: the asyncio event loop whose clock is a simpy.Environment's and whose timers are simpy events.

The loop subclasses ``asyncio.BaseEventLoop`` and keeps its ``_run_once`` (3.11-3.13 alike): it
relies on ``_run_once`` asking ``self._selector.select(timeout)`` with ``timeout == 0`` when
callbacks are ready or a stop is pending and ``None`` otherwise (our timers never enter
``self._scheduled``), on ``self._ready`` being the deque of ready handles, and on
``TimerHandle.cancel`` calling ``loop._timer_handle_cancelled``.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import heapq
import itertools
import math
import threading
import weakref
from typing import TYPE_CHECKING, Any

import simpy
from simpy.core import EmptySchedule

from vime.errors import SimulationError

# A deadlock report lists at most this many tasks (the seed runs 256 generate tasks at once).
_MAX_LISTED_TASKS = 40

_THREADS_REFUSED = (
    "threads are refused inside a simulation: a real thread runs in wall-clock time, which the "
    "virtual clock can neither see nor wait for, so its result would land at an arbitrary virtual "
    "time and break determinism. Model the work as a coroutine whose duration is an "
    "asyncio.sleep / simpy timeout, or call it synchronously (it then takes zero virtual time)."
)

_IO_REFUSED = (
    "real I/O is refused inside a simulation: sockets, pipes, subprocesses and signals live in "
    "wall-clock time, which the virtual clock cannot see. Pass the simulated backend (vime.sim) "
    "instead of the real one, or run this code on a real event loop (asyncio.run)."
)


def _delay_until(now: float, when: float) -> float:
    """The simpy delay ``d`` for which simpy's ``now + d`` lands exactly on ``when`` (0 if ``when`` is past)."""
    d = when - now
    if not d > 0:
        return d if d != d else 0.0  # NaN is passed on so the caller can reject it
    # when - now rounds, and now + (when - now) can then miss `when` by an ulp; nudge d until the
    # sum simpy will compute is `when` itself, so call_at(t) fires with env.now == t exactly.
    s = now + d
    for _ in range(8):
        if s == when:
            break
        d = math.nextafter(d, math.inf if s < when else 0.0)
        s = now + d
    return d


class _TimerEvent(simpy.Timeout):
    """A simpy timeout standing for one asyncio TimerHandle: when processed it makes the handle ready."""

    def __init__(self, loop: SimEventLoop, handle: asyncio.TimerHandle, delay: float) -> None:
        super().__init__(loop.env, delay)
        self.loop = loop
        self.handle = handle
        self.callbacks.append(self._fire)

    def _fire(self, _event: simpy.Event) -> None:
        handle = self.handle
        # A cancelled handle (wait_for finished early, sleep cancelled) stays in simpy's queue --
        # simpy cannot unschedule -- and is simply dropped here.
        if not handle._cancelled and not self.loop._closed:
            self.loop._ready.append(handle)


class _VirtualSelector:
    """Stands where BaseEventLoop._run_once expects an I/O selector; 'select' advances virtual time instead."""

    __slots__ = ("_loop",)

    def __init__(self, loop: SimEventLoop) -> None:
        self._loop = loop

    def select(self, timeout: float | None) -> tuple[()]:
        return self._loop._advance(timeout)

    def close(self) -> None:
        pass


class SimEventLoop(asyncio.BaseEventLoop):
    """An asyncio event loop whose clock is ``env.now`` and whose timers are events in ``env``'s queue.

    ``env`` is the simpy.Environment shared with the hardware models. The loop never blocks: with
    no ready callback it steps ``env`` until one is ready, and raises SimulationError on a deadlock.
    Close it (``loop.close()``) when done; :func:`run` does that for you.
    """

    if TYPE_CHECKING:  # the BaseEventLoop internals this loop relies on (typeshed omits them)
        _ready: collections.deque[asyncio.Handle]
        _stopping: bool
        _closed: bool
        _debug: bool
        _thread_id: int | None

        def _check_closed(self) -> None: ...
        def _check_thread(self) -> None: ...
        def _check_callback(self, callback: Any, method: str) -> None: ...

    def __init__(self, env: simpy.Environment | None = None) -> None:
        super().__init__()
        if env is None:
            env = simpy.Environment(initial_time=0.0)
        elif not isinstance(env, simpy.Environment):
            raise TypeError(f"SimEventLoop needs a simpy.Environment, got {type(env).__name__}")
        self.env: simpy.Environment = env
        self._selector = _VirtualSelector(self)
        # Optional virtual-time limit (run(until=...)): stepping past it raises instead.
        self._until: float | None = None
        # Task names and report order come from a per-loop counter, so they are the same in every
        # run (asyncio's own "Task-N" counter is process-wide).
        self._task_counter = itertools.count(1)
        self._task_seq: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = weakref.WeakKeyDictionary()
        # Futures created by event_future -> the simpy event they wait for (for deadlock reports).
        self._event_waits: dict[asyncio.Future[Any], simpy.Event] = {}
        # simpy events made by future_event -> the asyncio future they stand for (same purpose).
        self._future_events: dict[simpy.Event, asyncio.Future[Any]] = {}
        # Set while run() cancels leftover tasks (see _advance).
        self._cancelling_leftovers = False

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} t={self.env.now!r} running={self.is_running()} "
                f"closed={self.is_closed()}>")

    # --- the clock --------------------------------------------------------------------------

    def time(self) -> float:
        """The virtual time: ``env.now``."""
        return self.env.now

    def call_later(self, delay: float, callback: Any, *args: Any,  # type: ignore[override]
                   context: Any = None) -> asyncio.TimerHandle:
        """Run ``callback(*args)`` once ``delay`` virtual seconds have passed (a simpy timeout of ``delay``)."""
        if delay is None:
            raise TypeError("delay must not be None")
        # float() keeps numpy scalars (durations computed by models) out of env.now.
        delay = float(delay)
        # Scheduling with `delay` itself (not when - now) makes simpy compute the same float sum
        # now + delay as the handle's `when`, so asyncio.sleep(x) wakes at exactly now + x.
        return self._new_timer(self.env.now + delay, delay, callback, args, context)

    def call_at(self, when: float, callback: Any, *args: Any,  # type: ignore[override]
                context: Any = None) -> asyncio.TimerHandle:
        """Run ``callback(*args)`` at virtual time ``when`` exactly (immediately if ``when`` is past)."""
        if when is None:
            raise TypeError("when cannot be None")
        when = float(when)
        return self._new_timer(when, _delay_until(self.env.now, when), callback, args, context)

    def _new_timer(self, when: float, delay: float, callback: Any, args: tuple[Any, ...],
                   context: Any) -> asyncio.TimerHandle:
        self._check_closed()
        if delay != delay:
            raise ValueError(f"timer at {when!r}: the delay is NaN; pass a finite number of seconds")
        if self._debug:
            self._check_thread()
            self._check_callback(callback, "call_at")
        handle = asyncio.TimerHandle(when, callback, args, self, context)
        source = getattr(handle, "_source_traceback", None)  # debug mode: drop this frame, as asyncio does
        if source:
            del source[-1]
        # A timer at +inf never fires; putting it in simpy's queue would let env.step() reach t=inf.
        if delay != math.inf:
            _TimerEvent(self, handle, delay if delay > 0 else 0.0)
        return handle

    def _timer_handle_cancelled(self, handle: asyncio.TimerHandle) -> None:
        # Our timers never sit in BaseEventLoop._scheduled; _TimerEvent drops cancelled handles.
        pass

    def _advance(self, timeout: float | None) -> tuple[()]:
        """Called by _run_once in place of select(): the simpy side of one loop iteration.

        ``timeout == 0`` (callbacks are ready): first process the simpy events already due at the
        current time, as asyncio polls I/O on every iteration -- so a task polling with
        asyncio.sleep(0) sees simpy progress, and a process polling with timeout(0) sees asyncio
        progress, at the same virtual time. ``timeout is None`` (nothing ready): step
        simpy, one event at a time, until an asyncio callback becomes ready, so an asyncio timer
        runs its callback before the simpy events that follow it in the queue.
        """
        if timeout is not None and timeout != 0:
            raise SimulationError(
                f"internal: BaseEventLoop asked to wait {timeout!r}s for a timer in its own heap; "
                "SimEventLoop keeps every timer in simpy (this Python's asyncio changed _run_once)")
        if self._stopping:
            return ()  # the run is over; leave later events to whoever runs env next
        last_run = self.env.now
        while True:
            try:
                if timeout == 0:
                    self._poll_due(last_run)
                else:
                    self._step_until_ready()
                return ()
            except EmptySchedule:
                raise self._deadlock_error(last_run) from None
            except asyncio.CancelledError as exc:
                if self._cancelling_leftovers:
                    # run() is cancelling leftover tasks; a simpy process waiting on one of them
                    # (future_event) dies of the same cancellation, as the tasks do. Go on.
                    continue
                # Leaking CancelledError out of the loop would read as if run() itself was cancelled.
                raise SimulationError(
                    f"at t={self.env.now!r} a simpy process did not handle the CancelledError of an "
                    "asyncio future it was waiting for (future_event); catch asyncio.CancelledError "
                    "in the process") from exc

    def _poll_due(self, t: float) -> None:
        env = self.env
        if env.peek() <= t:  # peek() is inf when the queue is empty
            # Only the events queued before this poll: a marker goes behind them, so a simpy
            # process polling with timeout(0) cannot starve the ready callbacks.
            marker = env.timeout(0)
            while not marker.processed:
                env.step()

    def _step_until_ready(self) -> None:
        ready = self._ready
        env = self.env
        until = self._until
        if until is None:
            while not ready and not self._stopping:
                env.step()
            return
        while not ready and not self._stopping:
            t = env.peek()
            if t > until:
                if t == math.inf:
                    raise EmptySchedule
                raise self._pending_error(
                    f"time limit until={until!r} reached at t={env.now!r} (next event at t={t!r}) "
                    "before the simulation finished")
            env.step()

    def _process_events(self, event_list: Any) -> None:
        pass  # there is no I/O to dispatch

    def _write_to_self(self) -> None:
        pass  # nothing ever blocks, so there is nothing to wake up

    # --- tasks and reports ------------------------------------------------------------------

    def create_task(self, coro: Any, *, name: str | None = None,  # type: ignore[override]
                    context: Any = None) -> asyncio.Task[Any]:
        """Like BaseEventLoop.create_task; unnamed tasks get a per-loop name ``Task-N`` (stable across runs)."""
        seq = next(self._task_counter)
        if name is None:
            name = f"Task-{seq}"
        task = super().create_task(coro, name=name, context=context)
        self._task_seq[task] = seq
        return task

    def _pending_tasks(self) -> list[asyncio.Task[Any]]:
        tasks = [t for t in asyncio.all_tasks(self) if not t.done()]
        return sorted(tasks, key=lambda t: (self._task_seq.get(t, 1 << 62), t.get_name()))

    def _describe_task(self, task: asyncio.Task[Any]) -> str:
        """One line: the task's name, where it is suspended (its await chain) and what it waits on."""
        chain = []
        obj: Any = task.get_coro()
        while obj is not None:
            code = getattr(obj, "cr_code", None) or getattr(obj, "gi_code", None)
            if code is None:
                break
            frame = getattr(obj, "cr_frame", None) or getattr(obj, "gi_frame", None)
            where = f" at {code.co_filename}:{frame.f_lineno}" if frame is not None else ""
            chain.append(f"{code.co_qualname}(){where}")
            obj = getattr(obj, "cr_await", None) or getattr(obj, "gi_yieldfrom", None)
        waiter = getattr(task, "_fut_waiter", None)
        if waiter is None:
            waits = "nothing"
        elif waiter in self._event_waits:
            waits = describe_event(self._event_waits[waiter])
        elif isinstance(waiter, asyncio.Task):
            waits = f"task {waiter.get_name()!r}"
        else:
            waits = f"a future that is never resolved {waiter!r}"
        return f"task {task.get_name()!r} waits on {waits}; suspended in " + " -> ".join(chain or ["?"])

    def _pending_error(self, headline: str, time: float | None = None) -> SimulationError:
        tasks = self._pending_tasks()
        lines = [self._describe_task(t) for t in tasks]
        shown = lines[:_MAX_LISTED_TASKS]
        if len(lines) > len(shown):
            shown.append(f"... and {len(lines) - len(shown)} more")
        body = "\n".join(f"  - {line}" for line in shown) or "  (no pending task)"
        simpy_side = self._simpy_waiting()
        if simpy_side:
            body += "\nsimpy processes waiting on asyncio:\n" + "\n".join(f"  - {w}" for w in simpy_side)
        err = SimulationError(f"{headline}; {len(tasks)} pending task(s):\n{body}")
        err.pending = lines  # type: ignore[attr-defined]
        err.simpy_waiting = simpy_side  # type: ignore[attr-defined]
        err.time = self.env.now if time is None else time  # type: ignore[attr-defined]
        return err

    def _simpy_waiting(self) -> list[str]:
        """Lines naming each simpy process blocked on a future_event, and the asyncio future it needs."""
        lines = []
        for event, fut in self._future_events.items():
            need = f"task {fut.get_name()!r}" if isinstance(fut, asyncio.Task) else f"future {fut!r}"
            for callback in event.callbacks or ():
                proc = getattr(callback, "__self__", None)
                if isinstance(proc, simpy.Process):
                    lines.append(f"process {proc.name!r} waits on {need}")
        return lines

    def _deadlock_error(self, last_run: float) -> SimulationError:
        t = self.env.now
        at = f"t={t!r}" if t == last_run else f"t={last_run!r} (clock drained to t={t!r})"
        if not self._pending_tasks():
            return self._pending_error(
                f"virtual-time deadlock at {at}: the loop was asked to run but nothing is ready and "
                "the simpy queue is empty; use run() / run_until_complete() rather than run_forever()",
                last_run)
        return self._pending_error(
            f"virtual-time deadlock at {at}: no asyncio callback is ready and the simpy queue is "
            "empty, so nothing can ever wake these tasks. Fix: make sure every awaited future, "
            "asyncio.Event, queue item, lock or simpy event is eventually set/triggered, or bound "
            "the wait with a timeout", last_run)

    # --- threads and I/O are refused --------------------------------------------------------

    def run_in_executor(self, executor: Any, func: Any, *args: Any) -> asyncio.Future[Any]:  # type: ignore[override]
        """Refused: a thread's wall-clock work is invisible to the virtual clock."""
        raise SimulationError(f"run_in_executor({_callable_name(func)}) / asyncio.to_thread(): {_THREADS_REFUSED}")

    def set_default_executor(self, executor: Any) -> None:
        """Refused: no executor can run inside a simulation."""
        raise SimulationError(f"set_default_executor(): {_THREADS_REFUSED}")

    def call_soon_threadsafe(self, callback: Any, *args: Any,  # type: ignore[override]
                             context: Any = None) -> asyncio.Handle:
        """call_soon from the loop's own thread; another thread is refused while the loop runs."""
        if self._thread_id is not None and threading.get_ident() != self._thread_id:
            raise SimulationError(f"call_soon_threadsafe() from another thread: {_THREADS_REFUSED}")
        return self.call_soon(callback, *args, context=context)

    # --- closing ----------------------------------------------------------------------------

    def close(self) -> None:
        """Close the loop and take its timers out of ``env``'s queue, so ``env`` can run on alone."""
        was_closed = self._closed
        super().close()
        if not was_closed:
            self._event_waits.clear()
            self._future_events.clear()
            # Leftover timers would otherwise still advance env.now when the simulation continues
            # without this loop; simpy has no public unschedule, so filter its heap (simpy 4 keeps
            # it in Environment._queue). Without that attribute they stay, inert (_fire checks _closed).
            queue = getattr(self.env, "_queue", None)
            if isinstance(queue, list):
                kept = [entry for entry in queue
                        if not (isinstance(entry[-1], _TimerEvent) and entry[-1].loop is self)]
                if len(kept) != len(queue):
                    heapq.heapify(kept)
                    queue[:] = kept


def _callable_name(func: Any) -> str:
    # asyncio.to_thread wraps the function as partial(context.run, func, ...): show func.
    while isinstance(func, functools.partial):
        inner = func.args[0] if func.args and callable(func.args[0]) else None
        func = inner if getattr(func.func, "__name__", "") == "run" and inner is not None else func.func
    return getattr(func, "__qualname__", None) or type(func).__name__


def _refused_io(name: str) -> Any:
    def refused(self: SimEventLoop, *args: Any, **kwargs: Any) -> Any:
        raise SimulationError(f"loop.{name}(): {_IO_REFUSED}")

    refused.__name__ = name
    refused.__qualname__ = f"SimEventLoop.{name}"
    refused.__doc__ = "Refused inside a simulation (real I/O)."
    return refused


for _name in (
    "create_connection", "create_server", "create_unix_connection", "create_unix_server",
    "create_datagram_endpoint", "connect_accepted_socket", "start_tls", "sendfile",
    "connect_read_pipe", "connect_write_pipe", "subprocess_exec", "subprocess_shell",
    "add_reader", "remove_reader", "add_writer", "remove_writer",
    "sock_recv", "sock_recv_into", "sock_recvfrom", "sock_recvfrom_into", "sock_sendall",
    "sock_sendto", "sock_connect", "sock_accept", "sock_sendfile",
    "getaddrinfo", "getnameinfo", "add_signal_handler", "remove_signal_handler",
):
    setattr(SimEventLoop, _name, _refused_io(_name))
del _name


def describe_event(event: simpy.Event) -> str:
    """A short, address-free description of a simpy event for error messages."""
    kind = type(event).__name__
    if isinstance(event, simpy.Process):
        target = event.target if event.is_alive else None
        kind = f"Process {event.name!r}"
        if target is not None:
            kind += f" (itself waiting on {type(target).__name__})"
    elif hasattr(event, "resource"):
        kind = f"{kind} on {type(event.resource).__name__}"
    state = "triggered" if event.triggered else "not triggered"
    return f"simpy event {kind} ({state})"
