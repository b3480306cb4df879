"""Tests of build_sim_backends: placement on GPUs, start-up state, and one rollout through the router."""

from __future__ import annotations

import asyncio

import pytest

from vime.config import defaults, parse_args
from vime.errors import SimulationError
from vime.protocols import EngineMemory, GenerateRequest, TrainerState, WeightBucket
from vime.sim import clock
from vime.sim.backends import SimBackends, build_sim_backends
from vime.sim.trainer.footprint import trainer_context_bytes


def test_seed_scenario_placement_and_startup_state() -> None:
    b = build_sim_backends(defaults())
    assert isinstance(b, SimBackends)
    assert len(b.gpus) == 8 and len(b.engines) == 4
    assert b.engine_gpus == {"engine0": [0, 1], "engine1": [2, 3], "engine2": [4, 5], "engine3": [6, 7]}
    # Seed step 4: the engines sleep while Megatron initialises; the trainer comes up awake, as the real
    # actors do, and the orchestrator's start-up puts it to sleep (seed step 3, offload_train).
    assert all(e.lifecycle.memory is EngineMemory.ASLEEP and e.lifecycle.sleep_level == 2 for e in b.engines)
    assert b.trainer.lifecycle.state is TrainerState.AWAKE
    assert all(e.lifecycle.weight_version is None for e in b.engines)
    assert b.startup_s > 0 and b.env.now == pytest.approx(b.startup_s)
    for k, gpu in enumerate(b.gpus):
        engine = f"engine{k // 2}"
        # What stays mapped on a GPU: both processes' CUDA contexts (engine weights and KV discarded).
        assert gpu.used(engine, "weights") == 0 and gpu.used(engine, "kv_cache") == 0
        assert gpu.used(engine, "context") == b.hardware.cuda_context_bytes
        assert gpu.used("actor", "context") == trainer_context_bytes(b.hardware)
        # The engine's full footprint (the GPU's peak, before it slept) stayed within vLLM's budget.
        kv = b.engines[k // 2].kv
        assert gpu.peak_bytes == kv.context_bytes + kv.weight_bytes + kv.activation_peak_bytes \
            + kv.cuda_graph_bytes + kv.kv_allocated_bytes <= kv.budget_bytes


def test_disaggregated_placement_keeps_engines_awake() -> None:
    args = parse_args(["--no-colocate", "--rollout-num-gpus", "4", "--actor-num-gpus-per-node", "4"],
                      command="simulate")
    b = build_sim_backends(args)
    assert len(b.gpus) == 8
    assert b.engine_gpus == {"engine0": [4, 5], "engine1": [6, 7]}
    assert all(e.lifecycle.memory is EngineMemory.AWAKE for e in b.engines)
    assert all(b.gpus[g].used("actor") == 0 for g in (4, 5, 6, 7))
    assert all(b.gpus[g].used("engine0") == 0 for g in (0, 1, 2, 3))


def test_start_inside_a_running_loop_needs_start_false() -> None:
    args = defaults()

    async def main() -> SimBackends:
        with pytest.raises(SimulationError, match="start=False"):
            build_sim_backends(args)
        b = build_sim_backends(args, start=False)
        return b

    b = clock.run(main())
    assert not b.started


def test_one_rollout_through_the_router_with_versions() -> None:
    b = build_sim_backends(defaults(), seed=7)

    async def step() -> list[object]:
        await b.trainer.sleep()  # seed 3
        await asyncio.gather(*(e.wake_up(["weights"]) for e in b.engines))  # seed 4–7
        await asyncio.gather(*(e.start_weight_update() for e in b.engines))  # seed 8 (as 47–51)
        async for bucket in b.trainer.export_weights(1 << 30):
            await asyncio.gather(*(e.update_weights(bucket) for e in b.engines))
        await asyncio.gather(*(e.finish_weight_update(1) for e in b.engines))
        await asyncio.gather(*(e.wake_up(["kv_cache", "cuda_graph"]) for e in b.engines))  # seed 10–13
        reqs = [GenerateRequest(list(range(200)), {"max_tokens": 1024}, request_id=f"s{i}") for i in range(256)]
        return list(await asyncio.gather(*(b.router.generate(r) for r in reqs)))

    results = clock.run(step(), env=b.env)
    assert {r.weight_version for r in results} == {"1"}  # seed step 24
    stats = b.rollout_stats()
    assert stats["requests"] == 256 and stats["routed"] == {f"engine{k}": 64 for k in range(4)}
    assert stats["tokens_generated"] == sum(r.completion_tokens for r in results)
    assert stats["busy_s_max"] > 0 and stats["kv_blocks_peak"] > 0
    # Same seed, same everything.
    again = build_sim_backends(defaults(), seed=7)
    assert clock.run(_tokens_of(again), env=again.env) == [r.token_ids for r in results[:3]]


async def _tokens_of(b: SimBackends) -> list[list[int]]:
    await b.trainer.sleep()
    await asyncio.gather(*(e.wake_up(None) for e in b.engines))
    reqs = [GenerateRequest(list(range(200)), {"max_tokens": 1024}, request_id=f"s{i}") for i in range(3)]
    return [r.token_ids for r in await asyncio.gather(*(b.router.generate(r) for r in reqs))]


def test_disaggregated_weight_buckets_go_over_the_network() -> None:
    colo = build_sim_backends(defaults(), start=False)
    args = parse_args(["--no-colocate", "--rollout-num-gpus", "4", "--actor-num-gpus-per-node", "4"],
                      command="simulate")
    disagg = build_sim_backends(args, start=False)
    bucket = WeightBucket(["w"], ["bfloat16"], [[1 << 29]], 1 << 30)
    hw = disagg.hardware
    assert disagg.settings is not None
    assert disagg.settings.weight_transfer_bytes_per_s == hw.bus_bytes_per_s(inter_node=True)
    assert disagg.engines[0].bucket_seconds(bucket) > colo.engines[0].bucket_seconds(bucket)
