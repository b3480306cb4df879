"""Tests of SimRouter: each policy's choices, health, retries on another engine, abort_all."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import pytest
import simpy
from test_engine import make_engine

from vime.errors import ConfigError, EngineError
from vime.protocols import GenerateRequest, GenerateResult, Router
from vime.sim import clock
from vime.sim.router import SimRouter


class FakeEngine:
    """Records what it served; `delay` makes requests overlap; `error` makes it fail every call."""

    def __init__(self, name: str, delay: float = 0.0, error: EngineError | None = None) -> None:
        self.name = name
        self.delay = delay
        self.error = error
        self.failed = False
        self.served: list[str | None] = []
        self.aborts = 0

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.served.append(request.request_id)
        if self.delay:
            await asyncio.sleep(self.delay)
        if self.error is not None:
            raise self.error
        return GenerateResult([1], [-0.1], "stop", len(request.token_ids), 1, engine=self.name)

    async def abort_all(self) -> int:
        self.aborts += 1
        return 0


def rq(i: int, session: str | None = None, prompt: list[int] | None = None) -> GenerateRequest:
    return GenerateRequest(prompt or [1, 2, 3, i], {"max_tokens": 4}, session_id=session, request_id=f"r{i}")


def route_all(router: SimRouter, requests: list[GenerateRequest]) -> list[GenerateResult]:
    async def main() -> list[GenerateResult]:
        return list(await asyncio.gather(*(router.generate(r) for r in requests)))

    return clock.run(main())


def test_is_a_router() -> None:
    assert isinstance(SimRouter([FakeEngine("a")]), Router)


def test_round_robin_spreads_evenly_in_order() -> None:
    engines = [FakeEngine(f"e{k}") for k in range(4)]
    results = route_all(SimRouter(engines, "round_robin"), [rq(i) for i in range(256)])
    assert [r.engine for r in results[:8]] == ["e0", "e1", "e2", "e3"] * 2
    assert [len(e.served) for e in engines] == [64] * 4  # seed step 21: about 64 per engine


def test_random_is_seeded() -> None:
    def picks(seed: int) -> list[str | None]:
        engines = [FakeEngine(f"e{k}") for k in range(4)]
        return [r.engine for r in route_all(SimRouter(engines, "random", seed=seed), [rq(i) for i in range(64)])]

    assert picks(5) == picks(5)
    assert picks(5) != picks(6)
    assert len(set(picks(5))) == 4


def test_consistent_hash_keeps_sessions_and_moves_only_a_dead_engines_keys() -> None:
    engines = [FakeEngine(f"e{k}") for k in range(4)]
    router = SimRouter(engines, "consistent_hash")
    sessions = [f"session-{i}" for i in range(200)]
    first = [router.choose(rq(i, s)) for i, s in enumerate(sessions)]
    again = [router.choose(rq(1000 + i, s)) for i, s in enumerate(sessions)]
    assert first == again
    assert set(first) == {0, 1, 2, 3}
    engines[2].failed = True
    moved = [router.choose(rq(i, s)) for i, s in enumerate(sessions)]
    for before, after in zip(first, moved, strict=True):
        if before != 2:
            assert after == before
        else:
            assert after != 2


def test_cache_aware_keeps_a_prompt_on_one_engine() -> None:
    engines = [FakeEngine(f"e{k}") for k in range(4)]
    router = SimRouter(engines, "cache_aware")
    group = [router.choose(rq(i, prompt=list(range(300)))) for i in range(8)]
    assert len(set(group)) == 1


def test_least_load_and_power_of_two_balance_outstanding_requests() -> None:
    for policy in ("least_load", "power_of_two"):
        engines = [FakeEngine(f"e{k}", delay=1.0) for k in range(4)]
        route_all(SimRouter(engines, policy, seed=1), [rq(i) for i in range(64)])
        counts = [len(e.served) for e in engines]
        assert sum(counts) == 64
        assert max(counts) - min(counts) <= (0 if policy == "least_load" else 8), (policy, counts)


def test_unknown_policy_is_refused() -> None:
    with pytest.raises(ConfigError, match="round_robin"):
        SimRouter([FakeEngine("a")], "fastest")
    with pytest.raises(ConfigError, match="at least one"):
        SimRouter([])


def test_retryable_failure_goes_to_another_engine_and_is_recorded() -> None:
    env = simpy.Environment()
    engines = [make_engine(model="Qwen3-0.6B", tp=1, spec="fixed:3000", env=env, name=f"e{k}") for k in range(2)]
    engines[0].inject_failure(at=0.5, detail="xid 79")
    router = SimRouter(engines, "round_robin")

    async def main() -> list[GenerateResult]:
        return list(await asyncio.gather(*(router.generate(GenerateRequest(list(range(50)), {"max_tokens": 3000},
                                                                           request_id=f"r{i}"))
                                           for i in range(4))))

    results = clock.run(main(), env=env)
    assert [r.engine for r in results] == ["e1"] * 4
    assert all(r.completion_tokens == 3000 for r in results)
    assert [(x.failed_engine, x.retried_on, x.time) for x in router.retries] == [("e0", "e1", 0.5)] * 2
    # New requests skip the dead engine.
    assert router.choose(GenerateRequest([1], {})) == 1


def test_non_retryable_error_propagates() -> None:
    bad = FakeEngine("a", error=EngineError("a", "generate", "bad request", status=400))
    good = FakeEngine("b")
    with pytest.raises(EngineError, match="bad request"):
        route_all(SimRouter([bad, good]), [rq(0)])
    assert good.served == []


def test_all_engines_failing_raises_the_last_error() -> None:
    err = EngineError("x", "generate", "down", status=503, retryable=True)
    engines = [FakeEngine(f"e{k}", error=err) for k in range(3)]
    with pytest.raises(EngineError, match="down"):
        route_all(SimRouter(engines), [rq(0)])
    assert [len(e.served) for e in engines] == [1, 1, 1]  # each tried once


def test_abort_all_reaches_every_healthy_engine() -> None:
    engines: list[Any] = [FakeEngine(f"e{k}") for k in range(3)]
    engines[1].failed = True
    clock.run(SimRouter(engines).abort_all())
    assert [e.aborts for e in engines] == [1, 0, 1]


def test_abort_all_on_sim_engines_returns_partial_results() -> None:
    env = simpy.Environment()
    engines = [make_engine(model="Qwen3-0.6B", tp=1, spec="fixed:2000", env=env, name=f"e{k}") for k in range(2)]
    router = SimRouter(engines)

    async def main() -> list[GenerateResult]:
        tasks = [asyncio.ensure_future(router.generate(GenerateRequest(list(range(20)), {"max_tokens": 2000},
                                                                       request_id=f"r{i}"))) for i in range(6)]
        await asyncio.sleep(0.5)
        await router.abort_all()
        return list(await asyncio.gather(*tasks))

    results = clock.run(main(), env=env)
    assert Counter(r.finish_reason for r in results) == {"abort": 6}
    assert all(0 < r.completion_tokens < 2000 for r in results)
