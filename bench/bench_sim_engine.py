"""Wall-clock cost of the simulated engines: the seed's step (engine side) and a 64-engine rollout at growing lengths.

Run: python -m pytest bench/bench_sim_engine.py -q --benchmark-columns=mean,min,max,rounds
Each benchmark stores in its extra_info: simulated tokens, simulated tokens per wall-second,
virtual rollout seconds, scheduler phases (simpy waits) and iterations, so the JSON output
(``--benchmark-json``) shows that wall time follows requests and batch changes, not tokens.

- seed step (engine side): 8 × H100, Qwen3-4B, 4 engines of TP 2 (seed section 0): start-up
  (engines asleep, trainer initialised), wake weights (steps 4–7), weight publication in 1 GiB
  buckets from the simulated trainer (step 8 / 45–52), wake KV (10–13), 256 samples ≤ 1024 tokens
  through the router (14–28), sleep level 2 (33–36). Target: well under 1 s.
- large: 64 × H100, 64 engines of TP 1, 8192 samples (1024 prompts × 8), responses from the
  default lognormal (median 0.4 × max) capped at 1k, 2k, 4k, 8k tokens, and 8k with the KV cache
  squeezed (--gpu-memory-utilization 0.35) so that preemptions multiply. Target: < 20 s at 8k.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

from vime.config import defaults, parse_args
from vime.protocols import GenerateRequest
from vime.sim import clock
from vime.sim.backends import SimBackends, build_sim_backends


def _requests(b: SimBackends, n: int, max_prompt: int, max_tokens: int) -> list[GenerateRequest]:
    assert b.lengths is not None
    reqs = []
    for i in range(n):
        group = i // 8  # the 8 samples of a GRPO group share a prompt (seed step 16)
        p = b.lengths.prompt(f"prompt-{group}", cap=max_prompt)
        reqs.append(GenerateRequest(list(range(1000 + group, 1000 + group + p)), {"max_tokens": max_tokens},
                                    session_id=f"session-{i}", request_id=f"sample-{i}"))
    return reqs


async def _publish(b: SimBackends, version: int) -> None:
    await asyncio.gather(*(e.start_weight_update() for e in b.engines))
    async for bucket in b.trainer.export_weights(1 << 30):
        await asyncio.gather(*(e.update_weights(bucket) for e in b.engines))
    await asyncio.gather(*(e.finish_weight_update(version) for e in b.engines))


def _report(benchmark: Any, b: SimBackends, virtual_s: float, wall_s: float, cpu_s: float) -> dict[str, Any]:
    stats = b.rollout_stats()
    phases = sum(e.stats.phases for e in b.engines)
    info = {
        "engines": len(b.engines),
        "requests": stats["requests"],
        "simulated_tokens": stats["tokens_generated"],
        "tokens_per_wall_s": round(stats["tokens_generated"] / wall_s),
        "virtual_rollout_s": round(virtual_s, 3),
        "wall_s": round(wall_s, 3),
        # CPU seconds of this process: what the wall time would be on an otherwise idle core.
        "cpu_s": round(cpu_s, 3),
        "tokens_per_cpu_s": round(stats["tokens_generated"] / cpu_s),
        "phases": phases,
        "iterations": stats["iterations"],
        "preemptions": stats["preemptions"],
    }
    benchmark.extra_info.update(info)
    print(f"\n{benchmark.name}: {info}")
    return info


def test_seed_step_engine_side(benchmark: Any) -> None:
    out: dict[str, float] = {}

    def step() -> SimBackends:
        c0 = time.process_time()
        b = build_sim_backends(defaults(), seed=1234)

        async def main() -> float:
            await b.trainer.sleep()  # the orchestrator's start-up (seed step 3): the trainer comes up awake
            await asyncio.gather(*(e.wake_up(["weights"]) for e in b.engines))
            await _publish(b, 1)
            await asyncio.gather(*(e.wake_up(["kv_cache", "cuda_graph"]) for e in b.engines))
            start = clock.now()
            reqs = _requests(b, 256, 512, 1024)
            results = await asyncio.gather(*(b.router.generate(r) for r in reqs))
            assert len(results) == 256
            rollout = clock.now() - start
            await asyncio.gather(*(e.sleep(2) for e in b.engines))
            return rollout

        out["virtual"] = clock.run(main(), env=b.env)
        out["cpu"] = time.process_time() - c0
        return b

    b = benchmark.pedantic(step, rounds=5, iterations=1, warmup_rounds=1)
    _report(benchmark, b, out["virtual"], benchmark.stats.stats.mean, out["cpu"])


@pytest.mark.parametrize(("max_len", "util"), [(1024, 0.9), (2048, 0.9), (4096, 0.9), (8192, 0.9), (8192, 0.35)],
                         ids=["1k", "2k", "4k", "8k", "8k-kv-pressure"])
def test_large_rollout_64_engines(benchmark: Any, max_len: int, util: float) -> None:
    """util 0.35 leaves each engine ~90k KV tokens for ~480k wanted: thousands of preemptions."""
    args = parse_args(["--actor-num-nodes", "8", "--rollout-num-gpus-per-engine", "1",
                       "--rollout-max-response-len", str(max_len), "--rollout-max-context-len", str(max_len + 512),
                       "--rollout-batch-size", "1024", "--n-samples-per-prompt", "8",
                       "--gpu-memory-utilization", str(util)], command="simulate")
    out: dict[str, float] = {}

    def rollout() -> SimBackends:
        c0 = time.process_time()
        b = build_sim_backends(args)
        reqs = _requests(b, 8192, 512, max_len)

        async def main() -> float:
            await b.trainer.sleep()  # colocated: the trainer leaves the GPUs to the engines, as the orchestrator has it
            await asyncio.gather(*(e.wake_up(None) for e in b.engines))
            start = clock.now()
            results = await asyncio.gather(*(b.router.generate(r) for r in reqs))
            assert len(results) == 8192
            return clock.now() - start

        out["virtual"] = clock.run(main(), env=b.env)
        out["cpu"] = time.process_time() - c0
        return b

    b = benchmark.pedantic(rollout, rounds=1, iterations=1)
    _report(benchmark, b, out["virtual"], benchmark.stats.stats.mean, out["cpu"])


def test_seed_full_step_orchestrated(benchmark: Any) -> None:
    """The whole seed step through the orchestrator (`vime simulate`, one rollout), start-up included."""
    from vime.runs.sim import simulate

    args = defaults().replace(num_rollout=1)
    out: dict[str, Any] = {}

    def run() -> Any:
        c0 = time.process_time()
        sim = simulate(args)
        out["cpu"] = time.process_time() - c0
        return sim

    sim = benchmark.pedantic(run, rounds=5, iterations=1, warmup_rounds=1)
    assert sim.fits and len(sim.steps) == 1
    _report(benchmark, sim.backends, sim.steps[0].t_rollout, benchmark.stats.stats.mean, out["cpu"])
