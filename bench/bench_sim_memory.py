"""Wall cost of the simulator's memory and trainer models: pool changes, allocator cycles, one training call.

Run: python -m pytest bench/bench_sim_memory.py -q --benchmark-columns=mean,stddev,rounds
Each benchmark stores its rate in extra_info (``--benchmark-json`` keeps it).
"""

from __future__ import annotations

import random

import simpy

from vime.algo.dp_schedule import build_dp_schedule
from vime.config import parse_args
from vime.protocols import ENGINE_TAGS, TAG_CUDA_GRAPH, TAG_KV_CACHE, TAG_RUNTIME, TAG_WEIGHTS
from vime.report.recorder import Recorder
from vime.sim import clock
from vime.sim.hardware import load_hardware
from vime.sim.memory import GiB, SimAllocator, SimCluster, SimGPU
from vime.sim.models import load_model
from vime.sim.trainer import SimTrainer
from vime.types import TrainBatch

H100 = load_hardware("H100-SXM-80G")


def test_pool_alloc_free_with_recorder(benchmark):
    """20k alloc/free pairs on one GPU, every change sampled by the recorder."""
    n = 20_000

    def work() -> None:
        gpu = SimGPU(0, 80 * GiB, recorder=Recorder(simpy.Environment()))
        for i in range(n):
            gpu.alloc("actor", "activations", (i % 17 + 1) * 2**20)
            gpu.free("actor", "activations")

    benchmark.pedantic(work, rounds=5, iterations=1, warmup_rounds=1)
    rate = 2 * n / benchmark.stats.stats.mean
    benchmark.extra_info["changes_per_s"] = round(rate)
    print(f"\npool changes: {rate:,.0f}/s")


def test_engine_allocator_sleep_wake_cycles(benchmark):
    """1000 level-2 sleep / two-step wake cycles of a 2-GPU engine (seed steps 36, 7, 13)."""
    cycles = 1000

    def work() -> None:
        cl = SimCluster.create(simpy.Environment(), H100, 2)
        alloc = SimAllocator("engine0", cl.gpus, H100, host=cl.host, known_tags=ENGINE_TAGS,
                             non_deferrable=(TAG_RUNTIME, TAG_CUDA_GRAPH))
        for tag, n in ((TAG_WEIGHTS, 4 * GiB), (TAG_KV_CACHE, 60 * GiB), (TAG_CUDA_GRAPH, GiB), (TAG_RUNTIME, GiB)):
            alloc.allocate(tag, n)

        async def main() -> None:
            for _ in range(cycles):
                await alloc.sleep([TAG_RUNTIME, TAG_CUDA_GRAPH], [TAG_WEIGHTS, TAG_KV_CACHE])
                await alloc.wake_up([TAG_WEIGHTS])
                await alloc.wake_up([TAG_KV_CACHE])

        clock.run(main(), env=cl.env)

    benchmark.pedantic(work, rounds=3, iterations=1, warmup_rounds=1)
    rate = cycles / benchmark.stats.stats.mean
    benchmark.extra_info["cycles_per_s"] = round(rate)
    print(f"\nallocator cycles: {rate:,.0f}/s")


def _setup(flags: list[str]) -> tuple[object, TrainBatch]:
    """Arguments and a batch (built outside the measured part: a large batch has ~35M mask entries)."""
    args = parse_args(flags, command="simulate")
    n = args.rollout_batch_size * args.n_samples_per_prompt
    rng = random.Random(0)
    totals = [rng.randint(64, 512) + rng.randint(1, args.rollout_max_response_len) for _ in range(n)]
    schedule = build_dp_schedule(totals, dp_size=args.data_parallel_size, micro_batch_size=args.micro_batch_size,
                                 global_batch_size=args.global_batch_size)
    batch = TrainBatch(rollout_id=0, tokens=[[] for _ in totals], response_lengths=[t - 64 for t in totals],
                       loss_masks=[[1] * (t - 64) for t in totals], raw_rewards=[0.0] * n, rewards=[0.5] * n,
                       total_lengths=totals, sample_indices=list(range(n)), group_indices=list(range(n)),
                       schedule=schedule)
    return args, batch


def _train_once(args: object, batch: TrainBatch) -> float:
    cl = SimCluster.create(simpy.Environment(), H100, args.actor_num_nodes * args.actor_num_gpus_per_node)  # type: ignore[attr-defined]
    tr = SimTrainer(args.cluster, args.parallel, args.algo, load_model("Qwen3-4B"), cl, seed=args.seed)

    async def main() -> float:
        await tr.init()
        await tr.wake_up()
        await tr.train(0, batch)
        await tr.sleep()
        return clock.now()

    return clock.run(main(), env=cl.env)


def test_trainer_seed_scenario(benchmark):
    """The seed: 8 GPUs, TP 2 × DP 4, 256 samples, 32 micro-batches: init, wake, train, sleep."""
    args, batch = _setup([])
    virtual = benchmark.pedantic(lambda: _train_once(args, batch), rounds=5, iterations=1, warmup_rounds=1)
    benchmark.extra_info["virtual_s"] = virtual
    print(f"\nseed trainer cycle: {benchmark.stats.stats.mean * 1e3:.1f} ms wall for {virtual:.2f} s virtual")


def test_trainer_large_scenario(benchmark):
    """128 GPUs (16 nodes), TP 2 × DP 64, 8192 samples up to 8192 tokens, 4 optimizer steps."""
    flags = ["--actor-num-nodes", "16", "--rollout-batch-size", "1024", "--n-samples-per-prompt", "8",
             "--rollout-max-response-len", "8192", "--rollout-max-context-len", "9216",
             "--num-steps-per-rollout", "4", "--micro-batch-size", "4"]
    args, batch = _setup(flags)
    virtual = benchmark.pedantic(lambda: _train_once(args, batch), rounds=3, iterations=1, warmup_rounds=1)
    benchmark.extra_info["virtual_s"] = virtual
    print(f"\nlarge trainer cycle: {benchmark.stats.stats.mean * 1e3:.1f} ms wall for {virtual:.2f} s virtual")
