"""Tests of the simulated vLLM engine: conformance, KV sizing by hand, closed form vs a per-iteration reference, semantics."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import math
import random
from collections import deque
from typing import Any

import engine_conformance as conformance
import pytest
import simpy

from vime.errors import ConfigError, EngineError, LifecycleError
from vime.protocols import GenerateRequest, GenerateResult, WeightBucket
from vime.sim import clock
from vime.sim.engine import (
    EngineSettings,
    IterationModel,
    SimEngine,
    activation_peak_bytes,
    engine_allocator,
    plan_kv_cache,
    sum_max_lines,
)
from vime.sim.engine.scheduler import _feasible_iterations
from vime.sim.hardware import load_hardware
from vime.sim.lengths import LengthSampler
from vime.sim.memory import SimAllocator, SimCluster, SimGPU

MiB = 1024**2
GiB = 1024**3


def make_engine(*, model: str = "Qwen3-4B", tp: int = 2, spec: Any = "fixed:64", seed: int = 0,
                kv_blocks: int | None = None, env: simpy.Environment | None = None, name: str = "engine0",
                record_events: bool = False, **settings: Any) -> SimEngine:
    """An awake engine; `kv_blocks` shrinks the GPU so the pool holds exactly that many blocks."""
    from vime.sim.models import load_model

    hw = load_hardware("H100-SXM-80G")
    m = load_model(model)
    st = EngineSettings(tp=tp, **settings)
    if kv_blocks is not None:
        st = dataclasses.replace(st, gpu_memory_utilization=1.0)
        fixed = m.weight_bytes(tp) + activation_peak_bytes(m, st) + st.cuda_graph_bytes + hw.cuda_context_bytes
        hw = dataclasses.replace(hw, memory_bytes=fixed + kv_blocks * st.block_size * m.kv_bytes_per_token(tp))
    env = env or simpy.Environment()
    return SimEngine(name, env, hw, m, st, LengthSampler(spec, seed=seed), seed=seed,
                     allocator=one_gpu_allocator(name, env, hw), record_events=record_events)


def one_gpu_allocator(name: str, env: simpy.Environment, hw: Any) -> SimAllocator:
    """An engine's allocator on one simulated GPU: the ranks of a TP group work in parallel, so one stands for all."""
    return engine_allocator(name, [SimGPU(0, hw.memory_bytes, env=env)], hw, env=env)


def req(prompt: int, max_tokens: int, rid: str) -> GenerateRequest:
    return GenerateRequest(list(range(prompt)), {"max_tokens": max_tokens}, request_id=rid)


def run_batch(engine: SimEngine, prompts: list[int], max_tokens: int) -> tuple[list[Any], list[float]]:
    """Submit all requests at t=0; return results and completion times."""
    times: list[float] = [0.0] * len(prompts)

    async def one(i: int) -> Any:
        r = await engine.generate(req(prompts[i], max_tokens, f"r{i}"))
        times[i] = clock.now()
        return r

    async def main() -> list[Any]:
        return list(await asyncio.gather(*(one(i) for i in range(len(prompts)))))

    return clock.run(main(), env=engine.env), times


# --------------------------------------------------------------------------------------------
# Conformance (the same suite runs against the real client's fakes)
# --------------------------------------------------------------------------------------------


def sim_subject() -> conformance.EngineSubject:
    e = make_engine(model="Qwen3-0.6B", tp=1, spec="lognormal:3.0,0.5")
    return conformance.EngineSubject(engine=e, run=lambda coro: clock.run(coro, env=e.env), settle_s=0.5,
                                     long_tokens=2048)


@pytest.mark.parametrize("check", conformance.ALL_CHECKS, ids=lambda c: c.__name__)
def test_sim_engine_conformance(check: Any) -> None:
    if check is conformance.check_pause_abort_returns_partial or check is conformance.check_pause_keep_then_resume:
        # These need a request that is still running after settle_s: make it long.
        def factory() -> conformance.EngineSubject:
            e = make_engine(model="Qwen3-0.6B", tp=1, spec="fixed:100000")
            return conformance.EngineSubject(engine=e, run=lambda coro: clock.run(coro, env=e.env))
        check(factory)
    else:
        check(sim_subject)


# --------------------------------------------------------------------------------------------
# KV sizing and block arithmetic by hand (Qwen3-4B, TP=2, H100 SXM 80G, utilization 0.9)
# --------------------------------------------------------------------------------------------


def test_kv_sizing_qwen3_4b_tp2_h100_by_hand() -> None:
    from vime.sim.models import load_model

    hw, m = load_hardware("H100-SXM-80G"), load_model("Qwen3-4B")
    st = EngineSettings(tp=2, gpu_memory_utilization=0.9, max_num_seqs=256, max_num_batched_tokens=8192)
    plan = plan_kv_cache(hw, m, st)

    capacity = 81559 * MiB  # what nvidia-smi reports for an H100 80GB HBM3
    assert hw.memory_bytes == capacity == 85_520_809_984
    budget = int(0.9 * capacity)  # 76_968_728_985
    # Qwen3-4B: 36 layers, hidden 2560, 32 q heads / 8 kv heads of 128, FFN 9728, vocab 151936, tied.
    # One layer on one of 2 ranks: q (2560·2048) + k,v (2·2560·512) + o (2048·2560) + q/k norms (2·128)
    # + gate/up/down (3·2560·9728/2) + 2 RMSNorms (2·2560).
    layer = 2560 * 2048 + 2 * 2560 * 512 + 2048 * 2560 + 2 * 128 + 3 * 2560 * 9728 // 2 + 2 * 2560
    assert layer == 50_468_096
    params = 36 * layer + 151936 * 2560 // 2 + 2560  # + vocab-parallel embedding (tied head) + final norm
    weights = 2 * params
    assert weights == 4_022_664_192  # ≈ 4 GB per GPU (seed step 36)
    # Profiling peak: 8192 tokens × bf16 (2·2560 + (16 + 2·4)·128 + 3·9728/2) + sampler 256 × 151936 × 8.
    act = 8192 * 2 * (2 * 2560 + (16 + 2 * 4) * 128 + 3 * 9728 // 2) + 256 * 151936 * 8
    assert act == 684_457_984
    graphs = 512 * MiB
    context = 512 * MiB
    kv = budget - weights - act - graphs - context
    assert kv == 71_187_864_985
    per_token = 2 * 36 * (8 // 2) * 128 * 2  # K and V · layers · kv heads per rank · head_dim · bf16
    assert per_token == 73_728
    blocks = kv // (16 * per_token)
    assert blocks == 60_346  # 965_536 tokens of KV per engine

    assert (plan.budget_bytes, plan.weight_bytes, plan.activation_peak_bytes) == (budget, weights, act)
    assert (plan.cuda_graph_bytes, plan.context_bytes, plan.kv_cache_bytes) == (graphs, context, kv)
    assert (plan.kv_bytes_per_token, plan.block_bytes, plan.num_blocks) == (per_token, 16 * per_token, blocks)
    assert plan.max_tokens == blocks * 16


def test_block_arithmetic_of_one_request() -> None:
    """Prompt 200 + 100 tokens: 13 blocks after prefill; at the end 299 tokens are cached → 19 blocks."""
    e = make_engine(spec="fixed:100")
    (r,), _ = run_batch(e, [200], 1024)
    assert r.completion_tokens == 100 and r.finish_reason == "stop"
    assert e.stats.kv_blocks_peak == -(-(200 + 100 - 1) // 16) == 19
    assert e.used_blocks == 0  # everything freed
    assert e.stats.prefill_tokens == 200
    assert e.stats.tokens_generated == 100
    assert e.stats.iterations == 100  # one prefill iteration (first token) + 99 decode iterations


def test_kv_that_cannot_hold_max_model_len_is_refused() -> None:
    with pytest.raises(ConfigError, match="max_model_len"):
        make_engine(model="Qwen3-0.6B", tp=1, kv_blocks=100, max_model_len=4096)


def test_settings_validation_names_the_flag() -> None:
    with pytest.raises(ConfigError, match="max-num-batched-tokens"):
        EngineSettings(max_num_seqs=512, max_num_batched_tokens=256)
    with pytest.raises(ConfigError, match="gpu-memory-utilization"):
        EngineSettings(gpu_memory_utilization=1.5)


# --------------------------------------------------------------------------------------------
# Closed form against a per-iteration reference scheduler (same documented rules)
# --------------------------------------------------------------------------------------------


def reference_finish_times(engine: SimEngine, reqs: list[tuple[str, int, int]]) -> tuple[dict[str, float], int]:
    """Iterate token by token: decode first, then prefill chunks in admission order, then FCFS admissions;
    preempt the last admitted when blocks run out, no admissions in an iteration that preempted."""
    s, nb_total, bs = engine.settings, engine.kv.num_blocks, engine.settings.block_size

    def blocks(n: int) -> int:
        return -(-n // bs)

    waiting = deque({"id": rid, "P": p, "tgt": t, "gen": 0, "comp": 0} for rid, p, t in reqs)
    running: list[dict[str, Any]] = []
    used, t, out, preemptions = 0, 0.0, {}, 0
    first = True  # every request arrives at t = 0 and the engine stays busy until the last finishes
    while waiting or running:
        preempted = False
        while True:
            dec = [r for r in running if r["P"] + r["gen"] - r["comp"] == 1]
            pre = [r for r in running if r["P"] + r["gen"] - r["comp"] > 1]
            budget = s.max_num_batched_tokens - len(dec)
            sched = [(r, 1) for r in dec]
            need = sum(blocks(r["comp"] + 1) - blocks(r["comp"]) for r in dec)
            for r in pre:
                if budget <= 0:
                    break
                take = min(r["P"] + r["gen"] - r["comp"], budget)
                need += blocks(r["comp"] + take) - blocks(r["comp"])
                sched.append((r, take))
                budget -= take
            if need <= nb_total - used or not running:
                break
            victim = running.pop()
            used -= blocks(victim["comp"])
            victim["comp"] = 0
            waiting.appendleft(victim)
            preempted = True
            preemptions += 1
        free = nb_total - used - need
        if not preempted:
            while waiting and len(running) < s.max_num_seqs and budget > 0:
                r = waiting[0]
                take = min(r["P"] + r["gen"] - r["comp"], budget)
                if blocks(take) > free:
                    break
                waiting.popleft()
                running.append(r)
                sched.append((r, take))
                budget -= take
                free -= blocks(take)
        if not sched:
            continue
        tokens = sum(k for _, k in sched)
        kv_read = sum(r["comp"] + k for r, k in sched)
        attn = sum(k * r["comp"] + k * (k + 1) / 2 for r, k in sched)
        # logits once per scheduled request; the first iteration after idle pays host + GPU (nothing hides it)
        step = engine.cost.first_time if first else engine.cost.time
        first = False
        t += step(tokens, kv_read, attn, len(sched))
        used = nb_total - free
        for r, k in sched:
            r["comp"] += k
            if r["comp"] == r["P"] + r["gen"]:
                r["gen"] += 1
                if r["gen"] == r["tgt"]:
                    out[r["id"]] = t
                    running.remove(r)
                    used -= blocks(r["comp"])
    return out, preemptions


@pytest.mark.parametrize(("n", "seed", "kv_blocks", "budget", "max_seqs"), [
    (64, 1, None, 8192, 256),  # the seed's per-engine load, plenty of KV
    (300, 2, None, 8192, 256),  # more requests than max_num_seqs: admissions at completions
    (120, 3, None, 512, 64),  # small chunked-prefill budget: prompts span several iterations
    (64, 4, 256, 2048, 256),  # KV runs out: preemption by recompute
    (200, 5, 400, 2048, 256),
])
@pytest.mark.parametrize("gpu_terms", [{}, {"kv_read_bytes_per_s": 4.45e12, "sample_s_per_logit": 8.08e-11}],
                         ids=["calibrated", "measured-kv-rate-and-sampler"])
def test_closed_form_matches_per_iteration_reference(n: int, seed: int, kv_blocks: int | None, budget: int,
                                                     max_seqs: int, gpu_terms: dict) -> None:
    e = make_engine(model="Qwen3-0.6B", tp=1, spec="lognormal:5.5,1.0", seed=seed, kv_blocks=kv_blocks,
                    max_num_batched_tokens=budget, max_num_seqs=max_seqs, **gpu_terms)
    rnd = random.Random(seed)
    prompts = [rnd.randint(20, 1500) for _ in range(n)]
    results, times = run_batch(e, prompts, 1024)
    ref, ref_preemptions = reference_finish_times(
        e, [(f"r{i}", prompts[i], r.completion_tokens) for i, r in enumerate(results)])
    overhead = e.settings.request_overhead_s  # the front end's latency: half before the scheduler, half after
    # the API server builds the responses one at a time, in the order the engine finished them
    tokens = {f"r{i}": r.completion_tokens for i, r in enumerate(results)}
    out, free = {}, 0.0
    for rid, t in ref.items():  # insertion order: finish order
        free = max(t, free) + e.settings.response_seconds(tokens[rid])
        out[rid] = free
    assert e.settings.response_per_token_s > 0
    for i in range(n):
        assert times[i] == pytest.approx(out[f"r{i}"] + overhead, rel=1e-9)
    assert e.stats.preemptions == ref_preemptions
    if kv_blocks is not None:
        assert ref_preemptions > 0
    # The point of the closed form: far fewer simpy waits than iterations.
    assert e.stats.phases < e.stats.iterations / 3


def test_sum_max_lines_matches_brute_force() -> None:
    rnd = random.Random(7)
    for _ in range(500):
        m0, m1, f0, f1 = (rnd.uniform(-1, 1) for _ in range(4))
        k = rnd.randint(0, 60)
        brute = sum(max(m0 + m1 * j, f0 + f1 * j) for j in range(k))
        assert sum_max_lines(m0, m1, f0, f1, k) == pytest.approx(brute, abs=1e-9)


def test_feasible_iterations_matches_brute_force() -> None:
    rnd = random.Random(11)
    bs = 16
    for _ in range(300):
        comps = [rnd.randint(0, 200) for _ in range(rnd.randint(1, 20))]
        free = rnd.randint(0, 60)
        counts = [0] * bs
        for c in comps:
            counts[(-c) % bs] += 1
        cum = [sum(counts[: r + 1]) for r in range(bs)]

        def need(j: int, comps: list[int] = comps) -> int:  # new blocks for iterations 0..j
            return sum(-(-(c + j + 1) // bs) - -(-c // bs) for c in comps)

        brute = 0
        while brute < 500 and need(brute) <= free:
            brute += 1
        assert _feasible_iterations(len(comps), cum, free, bs, 500) == brute


def test_iteration_time_roofline() -> None:
    """Decode is bandwidth bound (weights + KV read), a long prefill is compute bound; TP adds all-reduce."""
    from vime.sim.models import load_model

    hw, m = load_hardware("H100-SXM-80G"), load_model("Qwen3-4B")
    cost = IterationModel.build(hw, m, EngineSettings(tp=2))
    decode = cost.time(1, 1000, 1000)
    weights_read = m.weight_bytes(2) / (hw.hbm_bytes_per_s * hw.efficiency.decode_bw_util)
    assert decode > weights_read + cost.overhead_s
    assert cost.overhead_s == pytest.approx(m.num_layers * hw.efficiency.iteration_layer_s) and cost.overhead_s > 1e-3
    prefill = cost.time(8192, 8192, 8192 * 8193 / 2)
    flops = m.flops_per_token(0) * 8192 + (m.flops_per_token(4096) - m.flops_per_token(0)) / 4096 * 8192 * 8193 / 2
    assert prefill >= flops / 2 / (hw.bf16_flops * hw.efficiency.prefill_mfu)
    single = IterationModel.build(hw, m, EngineSettings(tp=1))
    assert single.allreduce_latency_s == 0 and cost.allreduce_latency_s > 0


def test_a_measured_kv_rate_and_the_sampler_enter_the_gpu_step_by_hand() -> None:
    """vLLM's attention reads the KV at its own rate and the sampler runs over the vocabulary for every scheduled
    request after the forward (the H200 whole steps' /metrics, bench/fit_whole_step.py section 0): a decode step of
    256 requests at 3000 tokens of context, by hand, and the closed form's lines agree with the step."""
    from vime.sim.models import load_model

    hw, m = load_hardware("H200-141G-measured"), load_model("Qwen3-0.6B")
    plain = IterationModel.build(hw, m, EngineSettings())
    rate, per_logit = 4.45e12, 8.08e-11
    cost = IterationModel.build(hw, m, EngineSettings(kv_read_bytes_per_s=rate, sample_s_per_logit=per_logit))
    n, ctx = 256, 256 * 3000
    kv = m.kv_bytes_per_token(1) * ctx
    # the linear layers: their weights at the weight rate against their FLOPs (256 rows of the 0.6B's big output head
    # lead), the profile's p-norm of the two; then the attention's KV read at the measured rate (not the streaming rate), which their tensor
    # cores do not hide: separate kernels
    weights = m.weight_bytes(1) / hw.decode_weight_bytes_per_s
    gemm_flops = n * (m.flops_per_token(0, lm_head=False) + m.lm_head_flops_per_token())
    p, flops_s = hw.efficiency.gemm_roofline_p, gemm_flops / hw.prefill_flops
    gemm = (weights ** p + flops_s ** p) ** (1 / p)  # near the ridge the two roofs add in part
    assert flops_s > weights and gemm > 1.05 * flops_s
    assert plain.gpu_time(n, ctx, ctx) == pytest.approx(plain.fixed(n) + gemm + kv / hw.decode_bytes_per_s)
    by_hand = cost.fixed(n) + n * m.vocab_size * per_logit + gemm + kv / rate
    assert cost.gpu_time(n, ctx, ctx) == pytest.approx(by_hand, rel=1e-12)
    assert cost.time(n, ctx, ctx) == pytest.approx(max(by_hand, cost.host(n)), rel=1e-12)
    c, m0, _, f0, _ = cost.decode_lines(n, ctx)
    assert c + max(m0, f0) == pytest.approx(by_hand, rel=1e-12)
    for bad in ({"kv_read_bytes_per_s": -1.0}, {"sample_s_per_logit": float("nan")}):
        with pytest.raises(ConfigError, match=next(iter(bad))):
            EngineSettings(**bad)


# --------------------------------------------------------------------------------------------
# Monotonicity, preemption, determinism
# --------------------------------------------------------------------------------------------


def test_longer_responses_take_longer() -> None:
    spans = []
    for n in (128, 256, 512, 1024):
        e = make_engine(spec=f"fixed:{n}")
        _, times = run_batch(e, [200] * 64, 1024)
        spans.append(max(times))
    assert spans == sorted(spans) and len(set(spans)) == 4


def test_more_gpus_never_slow_decode_per_request() -> None:
    # Same load per engine, wider TP: each iteration reads fewer weight bytes per GPU.
    per_tp = []
    for tp in (1, 2, 4):
        e = make_engine(model="Qwen3-8B", tp=tp, spec="fixed:512")
        _, times = run_batch(e, [300] * 64, 1024)
        per_tp.append(max(times))
    assert per_tp[0] >= per_tp[1] >= per_tp[2]
    # Same total load on more engines (more GPUs): each engine's batch shrinks.
    spans = []
    for engines in (1, 2, 4):
        env = simpy.Environment()
        es = [make_engine(tp=2, spec="fixed:512", env=env, name=f"e{k}") for k in range(engines)]

        async def main(es: list[SimEngine] = es) -> float:
            await asyncio.gather(*(es[i % len(es)].generate(req(300, 1024, f"r{i}")) for i in range(128)))
            return clock.now()

        spans.append(clock.run(main(), env=env))
    assert spans[0] >= spans[1] >= spans[2]


def test_kv_exhaustion_preempts_and_everything_finishes() -> None:
    e = make_engine(model="Qwen3-0.6B", tp=1, spec="fixed:900", kv_blocks=300, max_num_batched_tokens=2048)
    results, _ = run_batch(e, [400] * 48, 1024)
    assert e.stats.preemptions > 0
    assert all(r.finish_reason == "stop" and r.completion_tokens == 900 for r in results)
    assert e.stats.kv_blocks_peak <= e.kv.num_blocks == 300
    assert e.used_blocks == 0 and e.in_flight == 0
    # Recomputation shows up as extra prefill work.
    assert e.stats.prefill_tokens > 48 * 400


def _run_for_log(seed: int) -> tuple[list[Any], list[Any]]:
    e = make_engine(model="Qwen3-0.6B", tp=1, spec="lognormal:5.0,1.0", seed=seed, kv_blocks=400,
                    max_num_batched_tokens=2048, record_events=True)
    rnd = random.Random(3)
    results, _ = run_batch(e, [rnd.randint(50, 800) for _ in range(80)], 1024)
    return [(r.token_ids, r.log_probs, r.finish_reason) for r in results], list(e.events or [])


def test_same_seed_same_results_and_event_log() -> None:
    a, b = _run_for_log(1), _run_for_log(1)
    assert a == b
    assert any(ev[1] == "preempt" for ev in a[1])
    c = _run_for_log(2)
    assert c[0] != a[0]


def test_tokens_do_not_depend_on_engine_or_order() -> None:
    """A sample's length and tokens are fixed by (seed, request id), whatever else runs."""
    e1 = make_engine(spec="lognormal:5.0,0.8", seed=9, name="a")
    e2 = make_engine(spec="lognormal:5.0,0.8", seed=9, name="b")
    (r1,), _ = run_batch(e1, [100], 1024)

    async def crowded() -> Any:
        others = [e2.generate(req(300, 1024, f"x{i}")) for i in range(20)]
        mine = e2.generate(req(100, 1024, "r0"))
        return (await asyncio.gather(*others, mine))[-1]

    r2 = clock.run(crowded(), env=e2.env)
    assert (r1.token_ids, r1.log_probs) == (r2.token_ids, r2.log_probs)


def test_stop_ends_with_eos_and_length_hits_max_tokens() -> None:
    e = make_engine(spec="uniform:1,2000")
    results, _ = run_batch(e, [64] * 64, 1000)
    stops = [r for r in results if r.finish_reason == "stop"]
    lengths = [r for r in results if r.finish_reason == "length"]
    assert stops and lengths
    assert all(r.token_ids[-1] == e.eos_token_id for r in stops)
    assert all(e.eos_token_id not in r.token_ids for r in lengths)
    assert all(r.completion_tokens == 1000 for r in lengths)


# --------------------------------------------------------------------------------------------
# Pause, sleep, weights, faults
# --------------------------------------------------------------------------------------------


def test_pause_abort_returns_partial_tokens_of_all_in_flight() -> None:
    e = make_engine(spec="fixed:1000")

    async def main() -> tuple[list[Any], float]:
        tasks = [asyncio.ensure_future(e.generate(req(200, 1024, f"r{i}"))) for i in range(32)]
        await asyncio.sleep(1.0)
        await e.pause("abort")
        t = clock.now()
        return list(await asyncio.gather(*tasks)), t

    results, t = clock.run(main(), env=e.env)
    assert all(r.finish_reason == "abort" for r in results)
    counts = {r.completion_tokens for r in results}
    assert len(counts) == 1 and 0 < counts.pop() < 1000  # all decoded in lockstep
    assert e.used_blocks == 0
    assert t < 1.1


def test_pause_keep_freezes_time_and_resume_finishes() -> None:
    e = make_engine(spec="fixed:500")

    async def main() -> tuple[float, float]:
        task = asyncio.ensure_future(e.generate(req(200, 1024, "r")))
        await asyncio.sleep(0.5)
        await e.pause("keep")
        frozen = e.stats.tokens_generated
        await asyncio.sleep(100)
        assert e.stats.tokens_generated == frozen and not task.done()
        await e.resume()
        r = await task
        assert r.completion_tokens == 500 and r.finish_reason == "stop"
        return clock.now(), frozen

    end, frozen = clock.run(main(), env=e.env)
    assert end > 100.5 and 0 < frozen < 500


def test_pause_wait_drains_in_flight() -> None:
    e = make_engine(spec="fixed:300")

    async def main() -> None:
        task = asyncio.ensure_future(e.generate(req(200, 1024, "r")))
        await asyncio.sleep(0.1)
        await e.pause("wait")
        assert task.done() and task.result().finish_reason == "stop"
        held = asyncio.ensure_future(e.generate(req(10, 20, "late")))
        await asyncio.sleep(1)
        assert not held.done()
        await e.resume()
        await held

    clock.run(main(), env=e.env)


def test_abort_requests_ends_everything() -> None:
    e = make_engine(spec="fixed:800")

    async def main() -> list[Any]:
        tasks = [asyncio.ensure_future(e.generate(req(100, 1024, f"r{i}"))) for i in range(8)]
        await asyncio.sleep(0.2)
        assert await e.abort_all() == 8
        return list(await asyncio.gather(*tasks))

    assert {r.finish_reason for r in clock.run(main(), env=e.env)} == {"abort"}


def _engine_with_allocator(**settings: Any) -> tuple[SimEngine, SimCluster]:
    from vime.sim.models import load_model

    env = simpy.Environment()
    hw = load_hardware("H100-SXM-80G")
    cluster = SimCluster.create(env, hw, 2)
    alloc = engine_allocator("engine0", cluster.gpus, hw, host=cluster.host, recorder=cluster.recorder, env=env,
                             pinned="cold")
    e = SimEngine("engine0", env, hw, load_model("Qwen3-4B"), EngineSettings(tp=2, **settings), LengthSampler("fixed:32"),
                  allocator=alloc)
    return e, cluster


def test_sleep_level2_discards_weights_and_kv_and_wake_restores() -> None:
    e, cluster = _engine_with_allocator()
    g0 = cluster.gpus[0]
    kv = e.kv
    awake = g0.used("engine0")
    assert awake == kv.context_bytes + kv.weight_bytes + kv.activation_peak_bytes + kv.cuda_graph_bytes \
        + kv.kv_allocated_bytes
    assert awake <= kv.budget_bytes

    async def main() -> dict[str, float]:
        t: dict[str, float] = {}
        t0 = clock.now()
        await e.sleep(2)
        t["sleep"] = clock.now() - t0
        assert g0.used("engine0") == kv.context_bytes
        # Level 2 offloads runtime and CUDA graphs (both GPUs), discards weights and KV.
        assert cluster.host.used("engine0") == 2 * (kv.activation_peak_bytes + kv.cuda_graph_bytes)
        t0 = clock.now()
        await e.wake_up(["weights"])  # non-deferrable runtime + graphs come back too (seed step 7)
        t["wake_weights"] = clock.now() - t0
        assert g0.used("engine0", "weights") == kv.weight_bytes
        assert g0.used("engine0", "cuda_graph") == kv.cuda_graph_bytes
        assert g0.used("engine0", "kv_cache") == 0
        await e.wake_up(["kv_cache", "cuda_graph"])
        assert g0.used("engine0") == awake
        assert cluster.host.used("engine0") == 0  # cold pinned buffers are freed on wake
        r = await e.generate(req(10, 100, "after"))
        assert r.completion_tokens == 32
        return t

    t = clock.run(main(), env=e.env)
    assert t["sleep"] > 0 and t["wake_weights"] > 0


def test_vllm_0_25_1_sleeps_copy_no_runtime_memory() -> None:
    """EngineSettings.sleep_backup_runtime 0 (vLLM 0.25.1, the H200 profile): a level-2 sleep copies nothing to the host
    ("0.00 GiB is backed up in CPU"), the runtime and CUDA-graph memory come back empty, and the weights' wake costs less."""
    walls = {}
    for backup in (1, 0):
        e, cluster = _engine_with_allocator(sleep_backup_runtime=backup)
        g0 = cluster.gpus[0]

        async def main(e: SimEngine = e, cluster: SimCluster = cluster, g0: Any = g0) -> float:
            await e.sleep(2)
            host = cluster.host.used("engine0")
            t0 = clock.now()
            await e.wake_up(["weights"])
            assert g0.used("engine0", "cuda_graph") == e.kv.cuda_graph_bytes  # mapped again either way
            return host, clock.now() - t0

        host, walls[backup] = clock.run(main(), env=e.env)
        assert (host == 0) == (backup == 0)
    assert walls[0] < walls[1]


def test_vllm_0_25_1_keeps_context_and_graphs_beside_the_budget() -> None:
    """EngineSettings.graphs_beside_budget 1 (vLLM 0.25.1, the measured profiles): the KV cache is the budget less the
    weights and activations, the context and graphs held beside it; the graphs stay mapped through sleeps, and a wake
    cycle still ends at each sleep (the second step's KV wake costs what the first did)."""
    inside, _ = _engine_with_allocator(sleep_backup_runtime=0)
    e, cluster = _engine_with_allocator(sleep_backup_runtime=0, graphs_beside_budget=1)
    kv = e.kv
    assert kv.kv_cache_bytes == kv.budget_bytes - kv.weight_bytes - kv.activation_peak_bytes
    assert kv.kv_cache_bytes - inside.kv.kv_cache_bytes == kv.cuda_graph_bytes + kv.context_bytes
    assert not kv.graphs_in_pool and inside.kv.graphs_in_pool
    g0 = cluster.gpus[0]
    assert g0.used("engine0") == kv.context_bytes + kv.cuda_graph_bytes + kv.weight_bytes + kv.activation_peak_bytes \
        + kv.kv_allocated_bytes

    async def main() -> list[float]:
        walls = []
        for _ in range(2):
            await e.sleep(2)
            assert g0.used("engine0") == kv.context_bytes + kv.cuda_graph_bytes  # the graphs stay
            await e.wake_up(["weights"])
            t0 = clock.now()
            await e.wake_up(["kv_cache", "cuda_graph"])
            walls.append(clock.now() - t0)
            assert g0.used("engine0", "cuda_graph") == kv.cuda_graph_bytes
        return walls

    first, second = clock.run(main(), env=e.env)
    assert second == pytest.approx(first)


def test_graphs_beside_budget_is_zero_or_one() -> None:
    with pytest.raises(ConfigError, match="graphs_beside_budget must be 0"):
        EngineSettings(graphs_beside_budget=0.5)


def test_sleep_backup_runtime_is_zero_or_one() -> None:
    with pytest.raises(ConfigError, match="sleep_backup_runtime must be 0"):
        EngineSettings(sleep_backup_runtime=2)


def test_sleep_level1_offloads_weights_to_host() -> None:
    e, cluster = _engine_with_allocator()

    async def main() -> None:
        await e.sleep(1)
        # two GPUs; the weights' backup is pinned in power-of-two blocks (PyTorch's caching host allocator)
        weights = math.ceil(e.kv.weight_bytes * e.model.vllm_pinned_scale(2))
        assert weights > e.kv.weight_bytes
        assert cluster.host.used("engine0") == 2 * (weights + e.kv.activation_peak_bytes + e.kv.cuda_graph_bytes)
        await e.wake_up(None)
        assert not await e.is_sleeping()

    clock.run(main(), env=e.env)


def test_sleep_keep_with_requests_in_flight_recomputes_after_wake() -> None:
    e = make_engine(spec="fixed:400")

    async def main() -> Any:
        task = asyncio.ensure_future(e.generate(req(200, 1024, "r")))
        await asyncio.sleep(0.3)
        await e.sleep(1, mode="keep")
        await asyncio.sleep(10)
        assert not task.done()
        await e.wake_up(None)
        return await task

    r = clock.run(main(), env=e.env)
    assert r.completion_tokens == 400 and e.stats.preemptions == 1


def test_weight_update_costs_bucket_by_bucket() -> None:
    e = make_engine()
    buckets = [WeightBucket([f"w{i}"], ["bfloat16"], [[GiB // 2]], GiB, index=i) for i in range(4)]

    async def main() -> float:
        await e.start_weight_update()
        t0 = clock.now()
        for b in buckets:
            await e.update_weights(b)
        t = clock.now() - t0
        await e.finish_weight_update(2)
        return t

    elapsed = clock.run(main(), env=e.env)
    assert elapsed == pytest.approx(4 * e.bucket_seconds(buckets[0]))
    # 1 GiB read + 0.5 GiB shard written at the device-to-device rate, plus fixed per-bucket costs.
    hw = e.hardware
    assert e.bucket_seconds(buckets[0]) > 1.5 * GiB / (hw.hbm_bytes_per_s * hw.efficiency.decode_bw_util)


def test_update_weights_while_asleep_raises() -> None:
    e = make_engine()

    async def main() -> None:
        await e.sleep(2)
        with pytest.raises(LifecycleError, match="tags=\\[weights\\]"):
            await e.start_weight_update()

    clock.run(main(), env=e.env)


def test_bad_request_is_a_400() -> None:
    e = make_engine(max_model_len=4096)

    async def main() -> None:
        with pytest.raises(EngineError) as info:
            await e.generate(req(4000, 200, "too-long"))
        assert info.value.status == 400 and "maximum context length" in str(info.value)
        with pytest.raises(ConfigError, match="prompt token"):  # the caller's input: refused before I/O, as in real
            await e.generate(GenerateRequest([], {"max_tokens": 8}))

    clock.run(main(), env=e.env)


def test_fault_injection_fails_in_flight_and_later_calls_until_restart() -> None:
    e = make_engine(spec="fixed:2000")
    e.inject_failure(at=1.5, detail="GPU fell off the bus")

    async def main() -> float:
        tasks = [asyncio.ensure_future(e.generate(req(100, 3000, f"r{i}"))) for i in range(4)]
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert clock.now() == 1.5
        assert all(isinstance(x, EngineError) and x.retryable for x in done)
        assert not await e.health()
        with pytest.raises(EngineError) as later:
            await e.generate(req(100, 10, "later"))
        assert later.value.retryable
        with pytest.raises(EngineError):
            await e.pause("abort")
        await e.restart()
        assert await e.health()
        r = await e.generate(req(100, 3000, "after"))
        assert r.completion_tokens == 2000 and r.weight_version is None
        return clock.now()

    end = clock.run(main(), env=e.env)
    assert end > 1.5 + e.settings.restart_s
    assert e.stats.failed == 4


def test_busy_periods_become_trace_spans() -> None:
    class Spans:
        def __init__(self) -> None:
            self.spans: list[tuple[Any, ...]] = []

        def on_call(self, component: str, call: str, t0: float, t1: float) -> None:
            self.spans.append((component, call, t0, t1))

        def span(self, track: str, name: str, t0: float, t1: float, **args: Any) -> None:
            self.spans.append((track, name, t0, t1, args))

    e = make_engine(spec="fixed:50")
    obs = Spans()
    e.observer = obs

    async def main() -> None:
        await asyncio.gather(*(e.generate(req(100, 64, f"a{i}")) for i in range(4)))
        await asyncio.sleep(1)
        await e.pause("keep")
        await e.resume()
        await asyncio.gather(*(e.generate(req(100, 64, f"b{i}")) for i in range(4)))

    clock.run(main(), env=e.env)
    busy = [s for s in obs.spans if s[1] == "generate"]
    assert [s[4]["tokens"] for s in busy] == [200, 200]
    assert busy[0][3] < busy[1][2]  # an idle gap between the two bursts
    assert [s[1] for s in obs.spans if s[1] != "generate"] == ["pause", "resume"]


_DETERMINISM_SCRIPT = """
import asyncio, hashlib, random, sys
sys.path.insert(0, {tests!r})
from test_engine import make_engine, run_batch
e = make_engine(model="Qwen3-0.6B", tp=1, spec="lognormal:5.0,1.0", seed=4, kv_blocks=400,
                max_num_batched_tokens=2048, record_events=True)
rnd = random.Random(3)
results, times = run_batch(e, [rnd.randint(50, 800) for _ in range(60)], 1024)
h = hashlib.sha256(repr(([(r.token_ids, r.log_probs, r.finish_reason) for r in results], times, e.events)).encode())
print(h.hexdigest())
"""


def test_identical_across_processes_and_hash_seeds() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = _DETERMINISM_SCRIPT.format(tests=str(Path(__file__).parent))
    digests = set()
    for hash_seed in ("0", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                             check=True)
        digests.add(out.stdout.strip())
    assert len(digests) == 1 and len(digests.pop()) == 64


def test_cancelled_client_frees_its_seat_and_blocks() -> None:
    e = make_engine(spec="fixed:3000")

    async def main() -> None:
        task = asyncio.ensure_future(e.generate(req(200, 3500, "gone")))
        other = asyncio.ensure_future(e.generate(req(200, 3500, "stays")))
        await asyncio.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)
        assert e.running == 1 and e.stats.aborted == 1
        assert (await other).completion_tokens == 3000

    clock.run(main(), env=e.env)


def test_wake_with_only_implicit_tags_does_nothing_and_bad_sleep_mode_is_a_config_error() -> None:
    e, cluster = _engine_with_allocator()

    async def main() -> None:
        with pytest.raises(ConfigError, match="sleep mode"):
            await e.sleep(2, mode="later")  # type: ignore[arg-type]
        await e.sleep(2)
        t0 = clock.now()
        await e.wake_up(["cuda_graph"])  # normalises to no vLLM tag: no request, as the real client
        assert clock.now() == t0 and cluster.gpus[0].used("engine0", "cuda_graph") == 0
        assert await e.is_sleeping()

    clock.run(main(), env=e.env)


def test_sleep_wait_while_paused_keeps_the_frozen_requests() -> None:
    """A paused scheduler cannot drain, so sleep(mode=wait) keeps its requests (they recompute after wake)."""
    e = make_engine(spec="fixed:500")

    async def main() -> Any:
        task = asyncio.ensure_future(e.generate(req(200, 1024, "r")))
        await asyncio.sleep(0.3)
        await e.pause("keep")
        await e.sleep(2, mode="wait")
        await e.wake_up(None)
        await e.resume()
        return await task

    r = clock.run(main(), env=e.env)
    assert r.completion_tokens == 500 and e.stats.preemptions == 1


@pytest.mark.parametrize("seed", range(12))
def test_random_control_sequences_keep_the_invariants(seed: int) -> None:
    """Arrivals at random times mixed with pause/resume/flush/sleep/wake: every request gets an answer,
    tokens and log-probs zip, and the block pool ends empty."""
    rnd = random.Random(seed)
    e = make_engine(model="Qwen3-0.6B", tp=1, spec="lognormal:5.5,1.0", seed=seed,
                    kv_blocks=rnd.choice([300, 600, None]), max_num_batched_tokens=rnd.choice([512, 2048, 8192]),
                    max_num_seqs=rnd.choice([16, 64, 256]))
    answers: dict[int, Any] = {}

    async def client(i: int, t: float, prompt: int) -> None:
        await asyncio.sleep(t)
        try:
            answers[i] = await e.generate(req(prompt, 1024, f"r{i}"))
        except LifecycleError as exc:  # arrived while asleep: refused before any work
            answers[i] = exc

    async def controller() -> None:
        paused = False
        for _ in range(rnd.randint(1, 8)):
            await asyncio.sleep(rnd.uniform(0, 3))
            op = rnd.choice(["abort", "keep", "wait", "resume", "flush", "sleep"])
            if op in ("abort", "keep", "wait"):
                await e.pause(op)
                paused = True
            elif op == "resume":
                await e.resume()
                paused = False
            elif op == "flush" and paused:
                await e.flush_cache()
            elif op == "sleep":
                await e.sleep(rnd.choice([1, 2]), mode=rnd.choice(["abort", "keep", "wait"]))
                await asyncio.sleep(rnd.uniform(0, 1))
                await e.wake_up(None)
        await e.resume()

    n = rnd.randint(20, 120)
    clients = [client(i, rnd.uniform(0, 5), rnd.randint(10, 1500)) for i in range(n)]

    async def main() -> None:
        await asyncio.gather(controller(), *clients)

    clock.run(main(), env=e.env)
    assert sorted(answers) == list(range(n))
    for r in answers.values():
        if not isinstance(r, LifecycleError):
            assert len(r.token_ids) == len(r.log_probs) == r.completion_tokens <= 1024
    assert e.used_blocks == 0 and e.in_flight == 0
    assert e.stats.kv_blocks_peak <= e.kv.num_blocks


def test_ignore_eos_runs_to_max_tokens() -> None:
    e = make_engine(spec="fixed:10")

    async def main() -> Any:
        return await e.generate(GenerateRequest([1, 2, 3], {"max_tokens": 77, "ignore_eos": True}, request_id="x"))

    r = clock.run(main(), env=e.env)
    assert (r.completion_tokens, r.finish_reason) == (77, "length")


def test_answered_requests_are_not_kept_by_the_engine() -> None:
    """Once answered, a request and its response belong to the caller: the scheduler holds neither."""
    e = make_engine(spec="fixed:32", name="forgetful")

    async def main() -> int:
        return len(await asyncio.gather(*(e.generate(req(100, 64, f"r{i}")) for i in range(8))))

    assert clock.run(main(), env=e.env) == 8
    gc.collect()
    assert not [o for o in gc.get_objects() if type(o) is GenerateResult and o.engine == "forgetful"]
