"""The virtual clock: an asyncio event loop driven by a simpy.Environment, so orchestration and hardware models share one time.

DESIGN.md, "One clock for both worlds". The orchestration (seed: 256 concurrent ``generate`` tasks, a
semaphore, ``asyncio.wait(FIRST_COMPLETED)``) is ordinary asyncio code; the hardware models are simpy
processes. :class:`SimEventLoop` (`loop`) runs the asyncio side on top of a ``simpy.Environment``:

* ``loop.time()`` is ``env.now``;
* every asyncio timer (``call_at``/``call_later``, hence ``asyncio.sleep``, ``wait_for``,
  ``asyncio.timeout``) is a simpy timeout in the environment's own queue, so timers and simpy
  events share one queue and one tie order (time, then priority, then creation order);
* each loop iteration processes the simpy events due at the current time (where asyncio would
  poll I/O), then runs the ready callbacks; when none is ready the loop steps simpy, one event at
  a time, until an asyncio callback becomes ready -- no real waiting, no selector;
* nothing ready and nothing scheduled while a task is still pending is a deadlock:
  :class:`~vime.errors.SimulationError` naming every pending task and what it awaits, never a hang;
* threads (``run_in_executor``, ``asyncio.to_thread``) and real I/O (sockets, subprocesses, pipes,
  signals) are refused with a SimulationError: the virtual clock cannot see wall-clock work.

Bridges (`bridge`): ``await wait_event(ev)`` waits for a simpy event from asyncio; a simpy process can
``yield future_event(fut)`` to wait for an asyncio future or task. Exceptions cross both ways.
`run` (`runner`) runs a coroutine to completion on a fresh loop, like ``asyncio.run``.

Caveats: a simpy process that ticks forever keeps the queue non-empty and so hides a deadlock --
bound such runs with ``run(..., until=t)``. A failed simpy event nobody waits for stops the run,
and simpy re-raises it as ``type(exc)(*exc.args)``: an exception class whose ``__init__`` does not
accept its own ``.args`` then surfaces as a TypeError. ``asyncio.wait`` returns sets: sort what
you collect by a stable key.
"""

from vime.sim.clock.bridge import current_env, event_future, future_event, now, sleep_until, wait_event
from vime.sim.clock.loop import SimEventLoop
from vime.sim.clock.runner import new_sim_loop, run

__all__ = [
    "SimEventLoop",
    "current_env",
    "event_future",
    "future_event",
    "new_sim_loop",
    "now",
    "run",
    "sleep_until",
    "wait_event",
]
