"""Tests of the virtual clock (vime/sim/clock/): exact virtual time, one tie order, bridges, deadlocks, refusals, determinism."""

from __future__ import annotations

import asyncio
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import simpy

from vime.errors import SimulationError
from vime.sim.clock import (
    SimEventLoop,
    current_env,
    event_future,
    future_event,
    new_sim_loop,
    now,
    run,
    sleep_until,
    wait_event,
)

REPO = Path(__file__).resolve().parents[2]


# --- exact virtual time ---------------------------------------------------------------------


def test_sleep_advances_virtual_time_exactly():
    async def main():
        loop = asyncio.get_running_loop()
        assert isinstance(loop, SimEventLoop)
        assert loop.time() == current_env().now == 0.0
        await asyncio.sleep(5)
        assert loop.time() == loop.env.now == 5.0
        return now()

    assert run(main()) == 5.0


def test_sequential_sleeps_sum_as_floats():
    delays = [0.1, 0.2, 0.3, 1e-9, 7.25, 1 / 3]

    async def main():
        seen = []
        for d in delays:
            await asyncio.sleep(d)
            seen.append(now())
        return seen

    expected, t = [], 0.0
    for d in delays:
        t += d
        expected.append(t)
    assert run(main()) == expected  # float equality: 0.1 + 0.2 lands on 0.30000000000000004


def test_nested_and_concurrent_sleeps_wake_in_time_then_creation_order():
    log = []

    async def inner(name):
        await asyncio.sleep(2)
        log.append((name, "inner", now()))

    async def a():
        await asyncio.sleep(1)
        log.append(("a", "outer", now()))
        await inner("a")

    async def b():
        await asyncio.sleep(3)
        log.append(("b", "outer", now()))

    async def main():
        await asyncio.gather(a(), b())
        return now()

    assert run(main()) == 3.0
    # Both wake at t=3; b's timer was created at t=0, a's at t=1, so b goes first.
    assert log == [("a", "outer", 1.0), ("b", "outer", 3.0), ("a", "inner", 3.0)]


def test_thousand_tasks_wake_at_their_exact_times_in_stable_order():
    rng = random.Random(3)
    # Half the delays collide (one decimal) to exercise ties.
    delays = [rng.uniform(0, 100) if i % 2 else round(rng.uniform(0, 10), 1) for i in range(1000)]
    woke = []

    async def sleeper(i, d):
        await asyncio.sleep(d)
        woke.append((i, now()))

    async def main():
        await asyncio.gather(*(sleeper(i, d) for i, d in enumerate(delays)))
        return now()

    assert run(main()) == max(delays)
    assert all(t == delays[i] for i, t in woke)
    assert [i for i, _ in woke] == sorted(range(1000), key=lambda i: (delays[i], i))


def _record_time(loop, out):
    out.append(loop.time())


def test_call_at_fires_exactly_at_the_requested_time():
    rng = random.Random(11)
    pairs = [(0.1, 0.1 + 0.2), (1e6 + 0.1, 1e6 + 0.7), (3.0, 3.0), (0.0, 1e-300)]
    for _ in range(300):
        start = rng.uniform(0, 10 ** rng.randint(0, 9))
        pairs.append((start, start + rng.uniform(0, 10 ** rng.randint(-6, 6))))

    for start, when in pairs:
        env = simpy.Environment(initial_time=start)
        loop = new_sim_loop(env)
        fired = []
        try:
            loop.call_at(when, _record_time, loop, fired)
            loop.run_until_complete(asyncio.sleep(when - start + 1.0))
        finally:
            loop.close()
        assert fired == [when], (start, when)


def test_sleep_until_lands_exactly_and_numpy_free():
    async def main():
        await asyncio.sleep(0.1)
        await sleep_until(0.7)
        t1 = now()
        await sleep_until(0.5)  # in the past: returns at once
        await asyncio.sleep(_FloatLike(0.25))
        return t1, now(), type(now())

    assert run(main()) == (0.7, 0.7 + 0.25, float)


class _FloatLike:
    """A duration type that is not a float (like numpy.float64); the loop must store plain floats."""

    def __init__(self, value):
        self.value = value

    def __float__(self):
        return self.value

    def __gt__(self, other):
        return self.value > other

    def __le__(self, other):
        return self.value <= other


def test_timer_at_infinity_never_fires_and_the_wait_is_reported():
    async def main():
        await asyncio.sleep(float("inf"))

    with pytest.raises(SimulationError, match="deadlock") as info:
        run(main())
    assert info.value.time == 0.0


# --- timeouts ----------------------------------------------------------------------------------


def test_wait_for_times_out_at_the_exact_virtual_time():
    async def main():
        await asyncio.sleep(0.1)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(asyncio.sleep(10), 0.2)
        return now()

    assert run(main()) == 0.1 + 0.2


def test_asyncio_timeout_context_expires_at_the_exact_virtual_time():
    async def main():
        await asyncio.sleep(0.3)
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.5):
                await wait_event(current_env().timeout(4))
        t1 = now()
        async with asyncio.timeout_at(asyncio.get_running_loop().time() + 2):
            await asyncio.sleep(1)
        return t1, now()

    assert run(main()) == (0.3 + 1.5, 0.3 + 1.5 + 1)


def test_timeout_that_does_not_fire_leaves_no_trace_in_the_environment():
    env = simpy.Environment()

    async def main():
        assert await asyncio.wait_for(wait_event(env.timeout(1, value="ok")), 100) == "ok"
        return now()

    assert run(main(), env=env) == 1.0
    # The cancelled 100 s timer is gone from simpy's queue: running env on does not move the clock.
    env.run()
    assert env.now == 1.0


# --- tie order: one queue ----------------------------------------------------------------------


def test_asyncio_timers_and_simpy_events_share_one_tie_order():
    log = []

    async def main():
        env = current_env()
        loop = asyncio.get_running_loop()
        env.timeout(1).callbacks.append(lambda _: log.append("simpy-first"))
        loop.call_later(1, log.append, "asyncio")
        env.timeout(1).callbacks.append(lambda _: log.append("simpy-last"))
        await asyncio.sleep(1)
        log.append("main")

    run(main())
    assert log == ["simpy-first", "asyncio", "simpy-last", "main"]


def test_simpy_events_due_now_are_processed_on_every_loop_iteration():
    log = []

    async def main():
        env = current_env()

        def proc():
            yield env.timeout(0)
            log.append("simpy")

        env.process(proc())
        asyncio.get_running_loop().call_soon(log.append, "asyncio")
        polls = 0
        while "simpy" not in log:  # polling with sleep(0) must see simpy progress, not spin forever
            polls += 1
            await asyncio.sleep(0)
        log.append("main")
        return now(), polls

    # Poll 1 starts the process (it then queues its timeout(0) behind the poll's marker); the
    # "asyncio" callback runs; poll 2 processes the timeout; main sees it on its second check.
    assert run(main()) == (0.0, 2)
    assert log == ["asyncio", "simpy", "main"]


@pytest.mark.timeout(30)
def test_simpy_process_polling_at_the_same_time_does_not_starve_asyncio():
    state = {"flag": False, "polls": 0}

    async def main():
        env = current_env()

        def poller():
            while not state["flag"]:
                state["polls"] += 1
                yield env.timeout(0)
            return env.now

        proc = env.process(poller())
        for _ in range(3):  # a few loop iterations of asyncio work before the flag is set
            await asyncio.sleep(0)
        state["flag"] = True
        return await wait_event(proc)

    assert run(main()) == 0.0
    assert 1 <= state["polls"] <= 5


# --- the bridges and exceptions crossing both ways ----------------------------------------------


def test_wait_event_returns_values_of_timeouts_and_processes():
    async def main():
        env = current_env()

        def worker():
            yield env.timeout(2)
            return "built"

        assert await wait_event(env.timeout(1.5, value="v")) == "v"
        assert now() == 1.5
        assert await wait_event(env.process(worker())) == "built"
        assert now() == 3.5
        ev = env.timeout(0, value=7)
        await asyncio.sleep(1)  # ev is processed by now
        assert ev.processed
        assert await wait_event(ev) == 7
        return now()

    assert run(main()) == 4.5


def test_failing_simpy_process_raises_in_the_awaiting_task():
    boom = KeyError("gpu 3")

    async def main():
        env = current_env()

        def bad():
            yield env.timeout(2)
            raise boom

        with pytest.raises(KeyError) as info:
            await wait_event(env.process(bad()))
        assert info.value is boom
        await asyncio.sleep(1)  # the failure was handled: the simulation goes on
        return now()

    assert run(main()) == 3.0


def test_unhandled_simpy_failure_stops_the_simulation():
    async def main():
        env = current_env()

        def bad():
            yield env.timeout(1)
            raise ValueError("nobody waits for me")

        env.process(bad())
        await asyncio.sleep(5)

    with pytest.raises(ValueError, match="nobody waits for me"):
        run(main())


def test_simpy_process_gets_the_result_or_exception_of_an_asyncio_task():
    record = []

    async def compute(x):
        await asyncio.sleep(2)
        if x < 0:
            raise ArithmeticError(f"negative {x}")
        return x * 10

    async def main():
        env = current_env()

        def consumer():
            record.append(("ok", (yield future_event(asyncio.ensure_future(compute(4)))), env.now))
            try:
                yield future_event(asyncio.ensure_future(compute(-1)))
            except ArithmeticError as exc:
                record.append(("err", str(exc), env.now))
            return "consumer done"

        def unhandled():
            yield future_event(asyncio.ensure_future(compute(-2)))

        assert await wait_event(env.process(consumer())) == "consumer done"
        with pytest.raises(ArithmeticError, match="negative -2"):
            await wait_event(env.process(unhandled()))
        return now()

    assert run(main()) == 6.0
    assert record == [("ok", 40, 2.0), ("err", "negative -1", 4.0)]


def test_bridges_check_their_arguments():
    async def main():
        with pytest.raises(SimulationError, match="another simpy.Environment"):
            await wait_event(simpy.Environment().timeout(1))
        with pytest.raises(TypeError, match="simpy event"):
            await wait_event("not an event")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="asyncio future or task"):
            future_event(42)  # type: ignore[arg-type]
        with pytest.raises(SimulationError, match="not the environment"):
            future_event(asyncio.get_running_loop().create_future(), simpy.Environment())

    run(main())


def test_outside_a_simulation_the_helpers_refuse_clearly():
    with pytest.raises(SimulationError, match="no event loop is running"):
        current_env()
    with pytest.raises(SimulationError, match="no event loop is running"):
        now()

    async def on_plain_asyncio():
        with pytest.raises(SimulationError, match="_UnixSelectorEventLoop|EventLoop"):
            current_env()
        with pytest.raises(SimulationError, match="inside a simulation"):
            await wait_event(simpy.Environment().timeout(1))
        with pytest.raises(SimulationError, match="not a SimEventLoop"):
            future_event(asyncio.get_running_loop().create_future())
        inner = asyncio.sleep(0)
        with pytest.raises(SimulationError, match="running event loop"):
            run(inner)

    asyncio.run(on_plain_asyncio())
    with pytest.raises(TypeError, match="coroutine object"):
        run(asyncio.sleep)  # type: ignore[arg-type]


# --- cancellation ------------------------------------------------------------------------------


def test_cancelling_a_task_waiting_on_a_simpy_event_detaches_it():
    seen = []

    async def waiter(ev):
        try:
            await wait_event(ev)
        except asyncio.CancelledError:
            seen.append(("cancelled", now()))
            raise

    async def main():
        env = current_env()
        ev = env.timeout(10)
        task = asyncio.create_task(waiter(ev))
        await asyncio.sleep(2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert ev.callbacks == []  # the bridge's callback was removed
        await wait_event(ev)  # the event itself is unaffected
        return now()

    assert run(main()) == 10.0
    assert seen == [("cancelled", 2.0)]


def test_cancelled_task_reaches_a_waiting_simpy_process_as_cancelled_error():
    seen = []

    async def main():
        env = current_env()
        task = asyncio.create_task(asyncio.sleep(100))

        def watcher():
            try:
                yield future_event(task)
            except asyncio.CancelledError:
                seen.append(env.now)

        proc = env.process(watcher())
        await asyncio.sleep(3)
        task.cancel()
        await wait_event(proc)

    run(main())
    assert seen == [3.0]


def test_cancellation_a_simpy_process_does_not_handle_is_reported():
    async def main():
        task = asyncio.create_task(asyncio.sleep(100))

        def watcher():
            yield future_event(task)

        current_env().process(watcher())
        await asyncio.sleep(1)
        task.cancel()
        await asyncio.sleep(1)

    with pytest.raises(SimulationError, match="did not handle the CancelledError"):
        run(main())


def test_run_cancels_leftover_tasks_and_closes_async_generators():
    seen = []

    async def background():
        try:
            await asyncio.sleep(1000)
        except asyncio.CancelledError:
            seen.append(("background cancelled", now()))
            raise

    async def ticks():
        try:
            while True:
                yield now()
                await asyncio.sleep(1)
        finally:
            seen.append(("generator closed", now()))

    kept = []  # keeps the generator alive so run()'s shutdown_asyncgens (not GC) must close it

    async def main():
        asyncio.create_task(background())
        gen = ticks()
        kept.append(gen)
        assert [await gen.__anext__(), await gen.__anext__()] == [0.0, 1.0]
        return "result"

    env = simpy.Environment()
    assert run(main(), env=env) == "result"
    assert seen == [("background cancelled", 1.0), ("generator closed", 1.0)]
    env.run()
    assert env.now == 1.0  # the cancelled sleeps' timers left with the loop


def test_run_cleanup_spreads_cancellation_into_waiting_simpy_processes():
    seen = []

    async def main():
        env = current_env()
        leftover = asyncio.create_task(asyncio.sleep(100), name="leftover")

        def waits_quietly():
            yield future_event(leftover)  # dies of the cleanup's cancellation, like a task would

        def waits_and_handles():
            try:
                yield future_event(leftover)
            except asyncio.CancelledError:
                seen.append(("handled", env.now))

        env.process(waits_quietly())
        env.process(waits_and_handles())
        await asyncio.sleep(2)
        return "main done"

    assert run(main()) == "main done"
    assert seen == [("handled", 2.0)]


# --- asyncio primitives in virtual time --------------------------------------------------------


def test_semaphore_queue_event_gather_and_wait_work_in_virtual_time():
    async def main():
        sem = asyncio.Semaphore(2)
        finished = []

        async def hold(i):
            async with sem:
                await asyncio.sleep(1)
            finished.append((i, now()))
            return i

        assert await asyncio.gather(*(hold(i) for i in range(5))) == [0, 1, 2, 3, 4]
        assert finished == [(0, 1.0), (1, 1.0), (2, 2.0), (3, 2.0), (4, 3.0)]

        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        got = []

        async def producer():
            for i in range(3):
                await asyncio.sleep(0.5)
                await queue.put(i)

        async def consumer():
            for _ in range(3):
                item = await queue.get()
                got.append((item, now()))
                await asyncio.sleep(2)

        await asyncio.gather(producer(), consumer())
        assert got == [(0, 3.5), (1, 5.5), (2, 7.5)]

        flag = asyncio.Event()
        asyncio.get_running_loop().call_later(4, flag.set)
        await flag.wait()
        assert now() == 9.5 + 4

        tasks = [asyncio.create_task(asyncio.sleep(d, d), name=f"s{d}") for d in (3, 1, 2)]
        done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        assert [t.get_name() for t in done] == ["s1"] and now() == 14.5
        assert sorted(t.get_name() for t in pending) == ["s2", "s3"]
        done, _ = await asyncio.wait(tasks, timeout=0.5)
        assert now() == 15.0 and [t.get_name() for t in done] == ["s1"]
        async with asyncio.TaskGroup() as tg:
            tg.create_task(asyncio.sleep(4))
        return now()

    assert run(main()) == 19.0


def test_simpy_resource_used_from_asyncio_and_simpy_alike():
    log = []

    async def main():
        env = current_env()
        gpus = simpy.Resource(env, capacity=2)

        async def job(name):
            with gpus.request() as req:
                await wait_event(req)
                log.append((name, "start", now()))
                await asyncio.sleep(1)
            log.append((name, "end", now()))

        def simpy_job():
            with gpus.request() as req:
                yield req
                log.append(("simpy", "start", env.now))
                yield env.timeout(1.5)
            log.append(("simpy", "end", env.now))

        proc = env.process(simpy_job())
        await asyncio.gather(*(job(f"a{i}") for i in range(4)))
        await wait_event(proc)
        return now()

    assert run(main()) == 3.0
    starts = [(n, t) for n, what, t in log if what == "start"]
    # The simpy process asked first (its Initialize ran before the tasks started), then a0..a3.
    assert starts == [("simpy", 0.0), ("a0", 0.0), ("a1", 1.0), ("a2", 1.5), ("a3", 2.0)]
    ends = sorted((t, n) for n, what, t in log if what == "end")
    assert ends == [(1.0, "a0"), (1.5, "simpy"), (2.0, "a1"), (2.5, "a2"), (3.0, "a3")]


# --- deadlocks and time limits -----------------------------------------------------------------


@pytest.mark.timeout(30)
def test_deadlock_raises_listing_every_pending_task_and_what_it_waits_on():
    async def main():
        env = current_env()
        never = asyncio.Event()

        async def stuck_on_event():
            await never.wait()

        def stuck_process():
            yield env.event()

        async def stuck_on_simpy():
            await wait_event(env.process(stuck_process()))

        a = asyncio.create_task(stuck_on_event(), name="needs-flag")
        b = asyncio.create_task(stuck_on_simpy(), name="needs-simpy")
        await asyncio.sleep(3)
        await asyncio.gather(a, b)

    with pytest.raises(SimulationError, match="deadlock at t=3.0") as info:
        run(main())
    err = info.value
    assert err.time == 3.0
    assert len(err.pending) == 3
    main_line, flag_line, simpy_line = err.pending
    assert main_line.startswith("task 'main'") and "main()" in main_line
    assert flag_line.startswith("task 'needs-flag'") and "Event.wait()" in flag_line
    assert "stuck_on_event()" in flag_line
    assert simpy_line.startswith("task 'needs-simpy'")
    assert "Process 'stuck_process' (itself waiting on Event)" in simpy_line
    assert "needs-flag" in str(err) and "needs-simpy" in str(err)


@pytest.mark.timeout(30)
def test_deadlock_report_names_simpy_processes_waiting_on_asyncio():
    async def main():
        env = current_env()
        never = asyncio.get_running_loop().create_future()
        blocker = asyncio.create_task(asyncio.wait_for(never, None), name="blocker")

        def consumer():
            yield future_event(blocker)

        await wait_event(env.process(consumer()))

    with pytest.raises(SimulationError, match="simpy processes waiting on asyncio") as info:
        run(main())
    assert info.value.simpy_waiting == ["process 'consumer' waits on task 'blocker'"]
    assert "Process 'consumer' (itself waiting on Event)" in info.value.pending[0]


@pytest.mark.timeout(30)
def test_deadlock_on_a_plain_future_and_after_a_drained_timer():
    async def main():
        fut = asyncio.get_running_loop().create_future()
        await asyncio.wait_for(asyncio.sleep(2), 50)  # leaves a cancelled timer at t=50
        await fut

    with pytest.raises(SimulationError, match="never resolved") as info:
        run(main())
    assert info.value.time == 2.0  # the time the tasks got stuck, not where the clock drained to


@pytest.mark.timeout(30)
def test_until_bounds_virtual_time_even_when_simpy_ticks_forever():
    async def main():
        env = current_env()

        def ticker():
            while True:
                yield env.timeout(1)

        env.process(ticker())
        await asyncio.get_running_loop().create_future()  # would spin forever without `until`

    with pytest.raises(SimulationError, match="time limit until=100") as info:
        run(main(), until=100)
    assert info.value.pending[0].startswith("task 'main'")

    async def short():
        await asyncio.sleep(100)
        return now()

    assert run(short(), until=100) == 100.0
    with pytest.raises(SimulationError, match="before the environment's time"):
        run(short(), env=simpy.Environment(initial_time=5), until=1)


def test_run_on_a_given_environment_keeps_its_clock_and_simpy_events():
    env = simpy.Environment(initial_time=100)
    done = []

    def model():
        yield env.timeout(10)
        done.append(env.now)

    env.process(model())

    async def main():
        await asyncio.sleep(1)
        return now()

    assert run(main(), env=env) == 101
    env.run()
    assert done == [110] and env.now == 110


def test_successive_runs_on_one_environment_continue_its_clock():
    env = simpy.Environment()

    async def step(d):
        await asyncio.sleep(d)
        return now()

    assert [run(step(1), env=env), run(step(2), env=env)] == [1, 3]


def test_works_under_asyncio_runner_and_in_debug_mode():
    async def main():
        await asyncio.sleep(2.5)
        return now()

    with asyncio.Runner(loop_factory=new_sim_loop, debug=True) as runner:
        assert runner.get_loop().get_debug()
        assert runner.run(main()) == 2.5
        assert runner.run(main()) == 5.0


@pytest.mark.timeout(30)
def test_main_error_survives_a_cleanup_that_deadlocks():
    async def stubborn():
        try:
            await asyncio.sleep(100)
        except asyncio.CancelledError:
            await asyncio.get_running_loop().create_future()  # refuses to finish

    async def main():
        asyncio.create_task(stubborn(), name="stubborn")
        await asyncio.sleep(1)
        raise LookupError("the real failure")

    with pytest.raises(LookupError, match="the real failure") as info:
        run(main())
    assert any("deadlock" in note and "stubborn" in note for note in info.value.__notes__)


@pytest.mark.timeout(30)
def test_run_forever_with_nothing_to_do_is_an_error_not_a_hang():
    loop = new_sim_loop()
    try:
        with pytest.raises(SimulationError, match="nothing is ready"):
            loop.run_forever()
    finally:
        loop.close()


# --- threads and real I/O are refused -----------------------------------------------------------


def test_threads_are_refused():
    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(SimulationError, match=r"to_thread\(\): threads are refused"):
            await asyncio.to_thread(sum, [1, 2])
        with pytest.raises(SimulationError, match=r"run_in_executor\(sum\)"):
            await loop.run_in_executor(None, sum, [1, 2])
        with pytest.raises(SimulationError, match="threads are refused"):
            loop.set_default_executor(None)
        errors = []

        def from_thread():
            try:
                loop.call_soon_threadsafe(print, "never")
            except SimulationError as exc:
                errors.append(exc)

        thread = threading.Thread(target=from_thread)
        thread.start()
        thread.join(10)
        assert len(errors) == 1 and "another thread" in str(errors[0])
        loop.call_soon_threadsafe(lambda: None)  # from the loop's own thread it is just call_soon

    run(main())


def test_real_io_is_refused():
    async def main():
        loop = asyncio.get_running_loop()
        with pytest.raises(SimulationError, match=r"create_connection\(\): real I/O is refused"):
            await asyncio.open_connection("127.0.0.1", 9)
        with pytest.raises(SimulationError, match=r"create_server\(\): real I/O"):
            await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        with pytest.raises(SimulationError, match=r"subprocess_exec\(\): real I/O"):
            await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")
        with pytest.raises(SimulationError, match=r"getaddrinfo\(\): real I/O"):
            await loop.getaddrinfo("localhost", 80)
        with pytest.raises(SimulationError, match=r"add_reader\(\): real I/O"):
            loop.add_reader(0, print)

    run(main())


# --- determinism ----------------------------------------------------------------------------


def scenario_log() -> str:
    """A mixed scenario (ties, semaphore, queue, resource, timeouts, cancellation, both bridges); its event log."""
    log: list[str] = []

    def note(who: str, what: str) -> None:
        log.append(f"{now()!r} {who} {what}")

    async def main() -> None:
        env = current_env()
        rng = random.Random(1234)
        sem = asyncio.Semaphore(3)
        gpus = simpy.Resource(env, capacity=2)
        queue: asyncio.Queue[str] = asyncio.Queue()

        def engine(i: int):
            for step in range(3):
                yield env.timeout(rng.choice([0.5, 1.0, 1.5]))
                queue.put_nowait(f"e{i}.{step}")
            return f"engine {i} finished"

        async def request(i: int) -> str:
            async with sem:
                note(f"r{i}", "admitted")
                with gpus.request() as req:
                    await wait_event(req)
                    await asyncio.sleep(rng.choice([0.25, 0.5, 1.0]))
                try:
                    await asyncio.wait_for(asyncio.sleep(rng.choice([0.5, 2.0])), 1.0)
                    note(f"r{i}", "in time")
                except TimeoutError:
                    note(f"r{i}", "timed out")
            return f"r{i}"

        procs = [env.process(engine(i)) for i in range(4)]
        tasks = [asyncio.create_task(request(i)) for i in range(12)]
        pending = set(tasks)
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            note("main", "done " + ",".join(sorted(t.result() for t in done)))
        for p in procs:
            note("main", await wait_event(p))
        while not queue.empty():
            note("main", "item " + queue.get_nowait())

        def waits_for_task(task: asyncio.Task[None]):
            try:
                yield future_event(task)
            except asyncio.CancelledError:
                note("simpy", "saw cancellation")

        victim = asyncio.create_task(asyncio.sleep(50))
        watcher = env.process(waits_for_task(victim))
        await asyncio.sleep(1)
        victim.cancel()
        await wait_event(watcher)
        note("main", "end")

    run(main())
    return "\n".join(log)


def test_event_log_is_identical_across_runs_in_one_process():
    first = scenario_log()
    assert first.count("\n") > 40
    assert scenario_log() == first


@pytest.mark.timeout(120)
def test_event_log_is_identical_across_hash_seeds():
    code = ("import importlib.util as u, sys; s = u.spec_from_file_location('clock_scenario', sys.argv[1]); "
            "m = u.module_from_spec(s); s.loader.exec_module(m); print(m.scenario_log())")
    outputs = []
    for seed in ("0", "1", "4242"):
        envvars = dict(os.environ, PYTHONHASHSEED=seed,
                       PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        proc = subprocess.run([sys.executable, "-c", code, __file__], cwd=REPO, env=envvars, capture_output=True,
                              text=True, timeout=100)
        assert proc.returncode == 0, proc.stderr
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0].strip() == scenario_log()


def test_event_future_can_join_asyncio_wait_with_tasks():
    async def main():
        env = current_env()
        fut = event_future(env.timeout(2, value="simpy"))
        task = asyncio.create_task(asyncio.sleep(3, "asyncio"))
        done, pending = await asyncio.wait([fut, task], return_when=asyncio.FIRST_COMPLETED)
        assert done == {fut} and fut.result() == "simpy" and now() == 2.0
        assert await task == "asyncio"
        return now()

    assert run(main()) == 3.0
