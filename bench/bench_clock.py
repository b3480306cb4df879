"""Cost of the virtual clock's round trips (asyncio timer <-> simpy queue, both bridges), as events per wall second.

Run: python -m pytest bench/bench_clock.py -q --benchmark-columns=mean,stddev,rounds
Each benchmark stores ``events_per_s`` in its extra_info (``--benchmark-json`` keeps it).
"""

from __future__ import annotations

import asyncio

import simpy

from vime.sim.clock import current_env, future_event, run, wait_event

N = 20_000  # round trips per measured run


def _report(benchmark, events: int) -> None:
    rate = events / benchmark.stats.stats.mean
    benchmark.extra_info["events_per_s"] = round(rate)
    benchmark.extra_info["us_per_event"] = round(1e6 / rate, 3)
    print(f"\n{benchmark.name}: {rate:,.0f} events/s ({1e6 / rate:.2f} us each)")


def test_asyncio_sleep_round_trip(benchmark):
    """One task, N sleeps: each is a TimerHandle -> simpy timeout -> ready -> task step."""
    async def main():
        for _ in range(N):
            await asyncio.sleep(0.001)

    benchmark.pedantic(lambda: run(main()), rounds=5, iterations=1, warmup_rounds=1)
    _report(benchmark, N)


def test_many_concurrent_sleepers(benchmark):
    """1000 tasks x 20 sleeps of varied length: a 1000-deep simpy queue."""
    async def sleeper(i):
        for k in range(20):
            await asyncio.sleep(0.5 + ((i * 7 + k) % 13) * 0.1)

    async def main():
        await asyncio.gather(*(sleeper(i) for i in range(1000)))

    benchmark.pedantic(lambda: run(main()), rounds=3, iterations=1, warmup_rounds=1)
    _report(benchmark, 20 * 1000)


def test_wait_event_round_trip(benchmark):
    """N awaits of a simpy timeout from asyncio (simpy -> asyncio bridge)."""
    async def main():
        env = current_env()
        for _ in range(N):
            await wait_event(env.timeout(0.001))

    benchmark.pedantic(lambda: run(main()), rounds=5, iterations=1, warmup_rounds=1)
    _report(benchmark, N)


def test_ping_pong_between_simpy_process_and_task(benchmark):
    """A simpy process and a task hand a token back and forth N times (both bridges, 2 crossings each)."""
    async def main():
        env = current_env()
        loop = asyncio.get_running_loop()
        to_simpy = [loop.create_future() for _ in range(N)]
        to_asyncio = [env.event() for _ in range(N)]

        def process():
            for i in range(N):
                yield future_event(to_simpy[i])
                yield env.timeout(0.001)
                to_asyncio[i].succeed()

        proc = env.process(process())
        for i in range(N):
            to_simpy[i].set_result(None)
            await wait_event(to_asyncio[i])
        await wait_event(proc)

    benchmark.pedantic(lambda: run(main()), rounds=3, iterations=1, warmup_rounds=1)
    _report(benchmark, 2 * N)


def test_baseline_plain_simpy_timeouts(benchmark):
    """Reference: N timeouts in a plain simpy process, no asyncio at all."""
    def once():
        env = simpy.Environment()

        def process():
            for _ in range(N):
                yield env.timeout(0.001)

        env.process(process())
        env.run()

    benchmark.pedantic(once, rounds=5, iterations=1, warmup_rounds=1)
    _report(benchmark, N)


def test_baseline_plain_asyncio_sleep0(benchmark):
    """Reference: N asyncio.sleep(0) on the stock event loop (no timers, no simpy)."""
    async def main():
        for _ in range(N):
            await asyncio.sleep(0)

    benchmark.pedantic(lambda: asyncio.run(main()), rounds=5, iterations=1, warmup_rounds=1)
    _report(benchmark, N)


def test_sim_loop_sleep0(benchmark):
    """N asyncio.sleep(0) on the SimEventLoop: the per-iteration overhead (the poll of simpy)."""
    async def main():
        for _ in range(N):
            await asyncio.sleep(0)

    benchmark.pedantic(lambda: run(main()), rounds=5, iterations=1, warmup_rounds=1)
    _report(benchmark, N)
