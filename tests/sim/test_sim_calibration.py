"""The simulator's structure against the H200 measurements kept in bench/data (issues 10 and 12), on a CPU."""

from __future__ import annotations

import dataclasses
import json
import math
import random
import statistics
from pathlib import Path
from typing import Any

import pytest
import simpy

from vime.errors import ConfigError
from vime.protocols import TAG_KV_CACHE, TAG_WEIGHTS, WeightBucket
from vime.sim import clock
from vime.sim.engine import (
    EngineSettings,
    IterationModel,
    SimEngine,
    engine_allocator,
    sum_max_lines,
    sum_max_of_lines,
)
from vime.sim.engine.costs import _Phase
from vime.sim.hardware import HardwareSpec, load_hardware
from vime.sim.hardware_parts import Software
from vime.sim.lengths import LengthSampler
from vime.sim.memory import GiB, SimAllocator, SimCluster
from vime.sim.models import load_model
from vime.sim.trainer import (
    ADAM_STEP_BYTES,
    OPTIMIZER_BYTES,
    PARAM_BYTES,
    TORCH_ADAMW_STEP_BYTES,
    compute_seconds,
    grad_bytes,
    optimizer_step_bytes,
    rope_bytes,
    score_bytes,
    software_terms,
    streaming_bytes_per_s,
)
from vime.testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "data"
MEASURED = load_hardware("H200-141G-measured")
H100 = load_hardware("H100-SXM-80G")
QWEN3_4B = load_model("Qwen3-4B")
QWEN3_17B = load_model("Qwen3-1.7B")
VLLM = json.loads((DATA / "h200_vllm_0.25.1.json").read_text())
CAL = json.loads((DATA / "h200_calibration.json").read_text())
MEGATRON = next(r["result"] for r in CAL["megatron"]["runs"]
                if r.get("result", {}).get("ok") and not r["result"].get("cumem"))


def _compare_module() -> Any:
    return load_script(ROOT / "bench" / "compare_calibration.py", "compare_calibration", register=True)


def _err(pred: float, measured: float) -> float:
    return abs(pred - measured) / measured


# --------------------------------------------------------------------------------------------
# The preset and its schema
# --------------------------------------------------------------------------------------------


def test_measured_preset_records_its_provenance_and_software():
    prov = dict(MEASURED.provenance)
    assert {"machine", "driver", "date", "command"} <= set(prov)
    assert prov["driver"] == CAL["env"]["driver"]
    assert "calibrate.py" in prov["command"] and "H200" in prov["machine"]
    assert MEASURED.software == Software("unfused", "torch", "torch", "unfused",
                                         train_step_residue_bytes=MEASURED.software.train_step_residue_bytes,
                                         trainer_process_bytes=MEASURED.software.trainer_process_bytes)
    assert MEASURED.software.train_step_residue_bytes > 0  # bench/fit_trainer_residue.py
    # measured rates, not datasheet ones
    assert MEASURED.hbm_bytes_per_s == pytest.approx(CAL["hbm"]["bytes_per_s"])
    # the round trip keeps the new sections
    again = HardwareSpec.from_dict(MEASURED.to_dict())
    assert again.software == MEASURED.software and again.provenance == MEASURED.provenance
    assert again.efficiency == MEASURED.efficiency and again.vmm == MEASURED.vmm


def test_datasheet_presets_keep_the_production_training_stack():
    for name in ("H100-SXM-80G", "H200-141G", "A100-80G"):
        hw = load_hardware(name)
        # the production stack, carrying the measured trainer process's memory outside its allocator
        assert hw.software == Software(trainer_process_bytes=MEASURED.software.trainer_process_bytes) != Software()
        assert (grad_bytes(), optimizer_step_bytes(hw)) == (4, ADAM_STEP_BYTES)
        assert score_bytes(QWEN3_4B, hw, [4096]) == 0.0
        # vLLM's per-step host work is host software, not GPU: every preset carries the H200 fit
        measured = load_hardware("H200-141G-measured").efficiency
        assert hw.efficiency.host_step_s == measured.host_step_s
        assert hw.efficiency.host_step_per_seq_s == measured.host_step_per_seq_s


@pytest.mark.parametrize(("section", "value", "needle"), [
    ({"train_attention": "sdpa"}, None, "train_attention"),
    ({"train_grad_bytes": 2}, None, "--grad-reduce-in-bf16"),  # the run's setting since issue 17
    ({"train_optimizer": "sgd"}, None, "train_optimizer"),
    ({"fused_rope": True}, None, "unknown software"),
])
def test_bad_software_section_is_refused_by_name(section, value, needle):
    data = H100.to_dict() | {"software": section}
    with pytest.raises(ConfigError, match=needle):
        HardwareSpec.from_dict(data)


# --------------------------------------------------------------------------------------------
# Engine: host-bound steps, LM head once per request, closed form with the host floor
# --------------------------------------------------------------------------------------------


def _im(hw: HardwareSpec = MEASURED) -> IterationModel:
    return IterationModel.build(hw, QWEN3_4B, EngineSettings(max_model_len=20480))


def _fit_whole_step() -> Any:
    return load_script(ROOT / "bench" / "fit_whole_step.py", "vime_bench_fit_whole_step")


def test_large_decode_batches_are_host_bound_at_short_contexts_small_ones_gpu_bound():
    """vLLM 0.25.1 on the H200: 3.8 ms per step at B=1; at B=256 the client saw 19-21 ms per step, of which the
    engine's step is 9-16 ms (vLLM's own inter-token latency, /metrics in the whole steps of the fourth lease),
    growing with the context once the KV reads outweigh the CPU's step, and the rest the API server building the
    256 responses one at a time (EngineSettings.response_seconds)."""
    im = _im()
    rows = {(r["batch"], r["max_tokens"]): r for r in VLLM["phases"]["decode"]}
    ctx = 128 + 512  # mid-run context per request
    big, small = 256, 1
    assert im.time(big, big * 192, big * 192) == pytest.approx(im.host(big))  # a short context: the CPU bounds it
    assert im.gpu_time(big, big * 1100, big * 1100) > im.host(big)  # a long one: the KV reads do
    assert im.time(small, ctx, ctx) == pytest.approx(im.gpu_time(small, ctx, ctx))
    # the engine's own step at 256 requests in the whole steps (/metrics, per rollout and quarter), held out: the
    # hosts' means spread 10.1-15.2 ms over 14 runs; the model (fitted on the 0.6B benches of three hosts) sits inside:
    # the median run within 10 %, every run within 40 % (the fastest, the 0.6B of 2026-12-02s8 at 10.1 ms, +38 %; the
    # 4B-only fit of 2026-12-02 was 35-47 % short on the later runs)
    fws = _fit_whole_step()
    errors = []
    for run in (*fws.METRICS_RUNS, *fws.HELD_OUT_METRICS_RUNS):
        run_im = IterationModel.build(MEASURED, fws.model_of(fws.RUN_SPECS[run][0]),
                                      EngineSettings(max_model_len=20480, **MEASURED.engine_overrides()))
        quarters = fws.step_quarters(run)
        assert len(quarters) >= 4, run
        modelled = statistics.fmean(run_im.time(big, big * c, big * c) for c, _ in quarters)
        errors.append(_err(modelled, statistics.fmean(t for _, t in quarters)))
    assert len(errors) == 14
    assert statistics.median(errors) < 0.10 and max(errors) < 0.40, errors
    # what the bench's client saw per step: the step plus each step's share of the responses' building (this 4B bench
    # held out, a fast host: B=256 13 % over)
    s = EngineSettings()
    for b, n in ((small, 256), (big, 1024)):
        assert _err(im.time(b, b * ctx, b * ctx) + b * s.response_seconds(n) / n, rows[(b, n)]["s_per_step"]) < 0.15
    # without the responses' cost the step would have to be the client's 19-21 ms: vLLM's own latency says no
    assert rows[(big, 1024)]["s_per_step"] > 1.5 * max(fws.engine_itl("qwen3-4b-cumem-1g_mbs2_2026-12-02s8"))


def test_gpu_bound_decode_fits_a_kv_rate_and_a_sampler_that_hold_on_held_out_steps():
    """vLLM's decode step where it rises with its context (/metrics of the whole steps): least squares over the 0.6B at
    4096-token responses and the 4B gives one KV read rate and one sampler cost per logit for both models, under
    section 0a's fixed part and weights at the copy rate: the held-out quarters (another lease's 0.6B, the 4B at 64
    requests) within 5 %, the fitted ones within 6.5 % (the 0.6B's second quarter, at its CPU floor, +6.0 %: 2 % under
    the rate-only step before section 0a, which was 18 % slow on an 8B). The 4B at 64 requests was within 1 % while the
    GEMMs hid the KV read; in series with it (the GEMMs' roofline, bench/decode_roofline.py) it is −3.8 % at p = 2 and
    −4.7 % at p = 3 (the thirty-second session: p chosen on vLLM's latencies of the 14B/32B rows, where its 64-request
    GEMMs take less than p = 2 gave them)."""
    fws = _fit_whole_step()
    fitted, lines = fws.gpu_step_terms(json.loads((ROOT / "vime/sim/data/hardware/H200-141G-measured.json").read_text()))
    rate, per_logit = fitted["engine.kv_read_bytes_per_s"], fitted["engine.sample_s_per_logit"]
    # faster than the calibration's unfused torch attention, at most the H200's 4.8 TB/s within the fit's 2 %; a sampler
    # of a few ms at 256
    assert MEASURED.decode_bytes_per_s < rate < 1.02 * 4.8e12
    assert 1e-3 < 256 * 151_936 * per_logit < 5e-3
    rows = [line for line in lines if "quarter" in line]
    assert sum("[fitted]" in r for r in rows) == 7 and sum("[held out]" in r for r in rows) == 3
    for r in rows:
        err = float(r.split("(")[-1].split("%")[0])
        assert abs(err) < (5.0 if "[held out]" in r else 6.5), r


def test_prefill_counts_the_output_head_once_per_request():
    im = dataclasses.replace(_im(), roofline_p=0.0)  # the larger roof alone: the FLOPs' time exactly
    t = 8192
    flops = (im.gpu_time(t, 0, t * (t + 1) / 2, seqs=1) - im.fixed(t)) * im.flops_per_s * im.tp
    assert flops == pytest.approx(QWEN3_4B.prefill_flops(t), rel=1e-9)
    # decode (one token per request) still pays the head for every token
    n = 64
    dec = (im.gpu_time(n, 0, 0) - im.fixed(n))
    assert dec == pytest.approx(max(im.weight_bytes / MEASURED.decode_weight_bytes_per_s,
                                    n * QWEN3_4B.flops_per_token(0) / im.flops_per_s))


def test_decode_streams_weights_at_the_copy_rate_beside_a_fixed_part():
    """PyTorch decode stack with CUDA graphs (calibrate.py's rows, Qwen3-4B shapes): the weights at the measured copy
    rate plus the layers' fixed GPU part (fit_whole_step.py section 0a, solved on vLLM's benches) hold all 10 within
    10 % but the largest (256 requests at 1024 tokens: +10.9 %, its GEMMs now in series with a KV read whose torch
    rate, decode_bw_util, was fitted as if they were hidden); without the fixed part the one-request rows are far short."""
    im = _im()
    assert MEASURED.decode_weight_bytes_per_s == MEASURED.hbm_bytes_per_s
    assert im.overhead_s == pytest.approx(QWEN3_4B.num_layers * MEASURED.efficiency.iteration_layer_s)
    assert im.overhead_s > 1e-3
    assert MEASURED.efficiency.iteration_overhead_s == 0.0  # per layer, not per step (the next test)
    for r in CAL["decode"]["rows"]:
        b, length = r["batch"], r["context"]
        assert _err(im.gpu_time(b, b * length, b * length), r["step_s"]) < (0.12 if b * length >= 256 * 1024 else 0.10), \
            (b, length)
    small = next(r for r in CAL["decode"]["rows"] if r["batch"] == 1 and r["context"] == 512)
    no_fixed = dataclasses.replace(im, overhead_s=0.0)
    assert no_fixed.gpu_time(1, 512, 512) < 0.7 * small["step_s"]
    # every preset streams the weights apart from the KV now; the H100's at its own measured copy rate
    a100 = load_hardware("A100-80G")
    assert _im(a100).weight_bytes_per_s == a100.decode_weight_bytes_per_s != a100.decode_bytes_per_s
    assert _im(H100).weight_bytes_per_s == H100.decode_weight_bytes_per_s > H100.decode_bytes_per_s


def _body(preset: str, tmp: Path) -> Any:
    """The simulator's model of a scripts/h200_train/seed_model.py preset (the bodies the benches served)."""
    from vime.testing.scripts import load_script

    seed_model = load_script(ROOT / "scripts" / "h200_train" / "seed_model.py",
                             "vime_seed_model_calibration")
    return load_model(str(seed_model.write_body_config(tmp / preset, preset)))


def test_the_fixed_part_of_a_decode_step_is_per_layer_on_four_dense_depths(tmp_path: Path):
    """vLLM's one-request step on the H100 for the 4B, 8B (36 layers), 14B (40) and 32B (64; dummy weights): the H200's
    per-layer part (fitted on the 4B alone) with the weights at the copy rate holds all four within 5 %; the same 1.78 ms
    taken once per step (the twenty-ninth session's structure) misses the 32B by more than 6 %."""
    from vime.sim.engine import EngineSettings, IterationModel

    hw = load_hardware("H100-SXM-80G-measured")
    assert hw.efficiency.iteration_layer_s == MEASURED.efficiency.iteration_layer_s  # carried, not refitted
    per_step = dataclasses.replace(hw, efficiency=dataclasses.replace(
        hw.efficiency, iteration_overhead_s=36 * hw.efficiency.iteration_layer_s, iteration_layer_s=0.0))
    runs = {"qwen3-4b": "vllm_bench_s29/vllm_4b_h100.json", "qwen3-8b": "vllm_bench_s29/vllm_8b_h100.json",
            "qwen3-14b": "vllm_bench_s30/vllm_14b_h100.json", "qwen3-32b": "vllm_bench_s30/vllm_32b_h100.json"}
    errors = {}
    for preset, f in runs.items():
        data = ROOT / "bench" / "data" / f
        row = next(r for r in json.loads(data.read_text())["phases"]["decode"] if r["batch"] == 1)
        ctx = row["prompt_len"] + row["max_tokens"] / 2
        model = _body(preset, tmp_path)
        for name, profile in (("layer", hw), ("step", per_step)):
            settings = EngineSettings(max_model_len=20480, **profile.engine_overrides())
            step = IterationModel.build(profile, model, settings).gpu_time(1, ctx, ctx)
            errors[preset, name] = (step - row["itl_mean_s"]) / row["itl_mean_s"]
    assert all(abs(errors[p, "layer"]) < 0.05 for p in runs), errors
    assert errors["qwen3-32b", "step"] < -0.06, errors


def test_iterations_past_the_cuda_graphs_pay_the_eager_launch_cost():
    im = _im()
    graph = im.graph_max_tokens
    assert im.fixed(graph + 1) - im.fixed(graph) == pytest.approx(MEASURED.efficiency.eager_iteration_s + im.allreduce_per_token_s)
    rows = {r["tokens"]: r for r in CAL["prefill"]["rows"]}
    # fitted on 4096 and 16384 tokens; the 1024-token prefill checks it
    pred = im.gpu_time(1024, 0, 1024 * 1025 / 2, seqs=1) - im.overhead_s
    assert _err(pred, rows[1024]["median_s"]) < 0.05


def test_an_uncompiled_engine_pays_its_forwards_dispatch_on_the_cpu_step_at_every_batch():
    """--enforce-eager also turns torch.compile off: each layer's ops go out one by one from Python, a CPU cost the
    GPU cannot hide (the H200's 0.6B bench: 21 ms per step at one request, against 1.9 ms with graphs and compile).
    The Qwen3-4B bench (36 layers, held out of bench/eager_dispatch.py's fit) checks its per-layer form."""
    settings = EngineSettings(max_model_len=20480, cuda_graph_max_tokens=0, compiled=False)
    eager, compiled = IterationModel.build(MEASURED, QWEN3_4B, settings), _im()
    dispatch = QWEN3_4B.num_layers * MEASURED.efficiency.uncompiled_host_s_per_layer
    for seqs in (1, 16, 256):
        assert eager.host(seqs) - compiled.host(seqs) == pytest.approx(dispatch)
        assert eager.time(seqs, seqs * 512, seqs * 512) >= compiled.host(seqs) + dispatch - 1e-12
    bench = json.loads((DATA / "vllm_bench_s21" / "vllm_4b_eager_quick.json").read_text())
    for r in bench["phases"]["decode"]:  # 128-token prompts; the mean inter-token latency: decode iterations only
        ctx = [r["batch"] * (128 + j + 1) for j in range(r["max_tokens"] - 1)]
        modelled = sum(eager.time(r["batch"], c, c) for c in ctx) / len(ctx)
        assert _err(modelled, r["itl_mean_s"]) < 0.10, (r["batch"], modelled, r["itl_mean_s"])


def test_without_async_scheduling_an_iteration_is_its_gpu_time_plus_its_cpu_step():
    serial = IterationModel.build(MEASURED, QWEN3_4B, EngineSettings(max_model_len=20480, async_scheduling=False))
    overlapped = _im()
    for seqs in (1, 64, 256):
        gpu, host = overlapped.gpu_time(seqs, seqs * 512, seqs * 512), overlapped.host(seqs)
        assert overlapped.time(seqs, seqs * 512, seqs * 512) == pytest.approx(max(gpu, host))
        assert serial.time(seqs, seqs * 512, seqs * 512) == pytest.approx(gpu + host)
    # an uncompiled forward's dispatch overlaps the kernels it launches even then
    eager = IterationModel.build(MEASURED, QWEN3_4B, EngineSettings(max_model_len=20480, async_scheduling=False,
                                                                    compiled=False, cuda_graph_max_tokens=0))
    gpu, host = eager.gpu_time(256, 256 * 512, 256 * 512), eager.host(256)
    assert eager.time(256, 256 * 512, 256 * 512) == pytest.approx(host - eager.dispatch_s + max(gpu, eager.dispatch_s))


@pytest.mark.parametrize("kw", [{}, {"async_scheduling": False}, {"compiled": False, "cuda_graph_max_tokens": 0},
                                {"async_scheduling": False, "compiled": False, "cuda_graph_max_tokens": 0}])
def test_the_lockstep_closed_form_is_the_sum_of_its_iterations_in_every_scheduling_mode(kw):
    im = IterationModel.build(MEASURED, QWEN3_4B, EngineSettings(max_model_len=20480, **kw))
    for n in (1, 64, 256):
        ctx0, k = n * 600, 300
        assert im.decode_phase(k, n, ctx0).elapsed(k) == pytest.approx(sum(im.time(n, ctx0 + n * j, ctx0 + n * j) for j in range(k)))


def test_the_committed_dispatch_is_what_the_eager_bench_fit_gives():
    """bench/eager_dispatch.py's fit (the 0.6B eager bench's batches 1 and 16 over the compiled profile) is the value
    the H200 profile carries; the profile's own dispatch does not enter the fit."""
    fit = load_script(ROOT / "bench" / "eager_dispatch.py", "vime_bench_eager_dispatch").fit
    profile = json.loads((ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G-measured.json").read_text())
    assert fit(profile) == MEASURED.efficiency.uncompiled_host_s_per_layer > 0
    profile["efficiency"]["uncompiled_host_s_per_layer"] = 1.0
    assert fit(profile) == MEASURED.efficiency.uncompiled_host_s_per_layer


def test_first_step_after_idle_pays_host_and_gpu():
    """A lone prefill on an idle vLLM: nothing hides its CPU step (8192 tokens: 140 ms measured)."""
    env = simpy.Environment()
    e = SimEngine("e", env, MEASURED, QWEN3_4B, EngineSettings(max_model_len=20480, gpu_memory_utilization=0.6),
                  LengthSampler("fixed:1", seed=0), seed=0, allocator=_one_gpu(env))
    from vime.protocols import GenerateRequest
    done: list[float] = []

    async def one(n: int) -> None:
        t0 = clock.now()
        await e.generate(GenerateRequest(list(range(n)), {"max_tokens": 1}, request_id=f"p{n}"))
        done.append(clock.now() - t0)

    async def main() -> None:
        for n in (2048, 8192):
            await one(n)
            await clock.sleep_until(clock.now() + 1.0)  # idle again

    clock.run(main(), env=env)
    im = e.cost
    runs = [VLLM] + [json.loads((DATA / f"h200_vllm_0.25.1_{b}.json").read_text()) for b in ("b1", "b2")]
    for n, took in zip((2048, 8192), done, strict=True):
        # the front end's fixed latency and its building of the one-token response are outside the engine
        engine_part = took - e.settings.request_overhead_s - e.settings.response_seconds(1)
        assert engine_part == pytest.approx(im.first_time(n, 0, n * (n + 1) / 2, 1), rel=1e-9)
        assert engine_part - im.time(n, 0, n * (n + 1) / 2, 1) == pytest.approx(im.host(1), rel=1e-9)
        measured = statistics.median(r["wall_s"] for run in runs for r in run["phases"]["prefill"]
                                     if r["prompt_len"] == n)
        # median of the three runs' repeats: 8192: -1 %; 2048: -14 % (the runs spread 37-57 ms at 2048)
        assert _err(took, measured) < (0.10 if n == 8192 else 0.15)
        assert _err(took - im.host(1), measured) > _err(took, measured)  # the host step moves it closer
    # a profile without a host step is unchanged by the rule
    bare = _im(dataclasses.replace(H100, efficiency=dataclasses.replace(H100.efficiency, host_step_s=0.0,
                                                                          host_step_per_seq_s=0.0)))
    assert bare.first_time(2048, 0, 2048 * 2049 / 2, 1) == bare.time(2048, 0, 2048 * 2049 / 2, 1)


def test_sum_max_of_lines_matches_brute_force():
    rng = random.Random(7)
    for _ in range(300):
        lines = [(rng.uniform(-5, 5), rng.uniform(-1, 1)) for _ in range(rng.randint(1, 4))]
        k = rng.randint(0, 60)
        brute = sum(max(a + b * j for a, b in lines) for j in range(k))
        assert sum_max_of_lines(lines, k) == pytest.approx(brute, abs=1e-9)
    assert sum_max_of_lines([(1.0, 0.5), (3.0, -0.2)], 17) == pytest.approx(sum_max_lines(1.0, 0.5, 3.0, -0.2, 17))


def test_phase_with_a_host_floor_equals_iteration_by_iteration():
    im = _im()
    for n, ctx0 in ((256, 256 * 129), (16, 16 * 129), (128, 128 * 5000)):
        c, m0, m1, f0, f1 = im.decode_lines(n, ctx0)
        phase = _Phase(500, c, m0, m1, f0, f1, im.host(n))
        brute = sum(im.time(n, ctx0 + n * j, ctx0 + n * j) for j in range(500))
        assert phase.elapsed(500) == pytest.approx(brute, rel=1e-12)
        assert phase.done_by(phase.elapsed(200)) == 200


def test_engine_decode_runs_match_the_held_out_vllm_runs_within_20_percent():
    """A SimEngine with the measured preset against vLLM's generate calls (B requests, prompt 128, n tokens)."""
    for r in VLLM["phases"]["decode"]:
        env = simpy.Environment()
        # the engine as `vime simulate` builds it: the profile's measured GPU terms of vLLM's step included
        settings = EngineSettings(max_model_len=20480, max_num_seqs=256, max_num_batched_tokens=8192,
                                  gpu_memory_utilization=0.6, **MEASURED.engine_overrides())
        e = SimEngine("e", env, MEASURED, QWEN3_4B, settings, LengthSampler(f"fixed:{r['max_tokens']}", seed=0),
                      seed=0, allocator=_one_gpu(env))
        from vime.protocols import GenerateRequest

        async def main(e: SimEngine = e, r: dict = r) -> float:
            import asyncio
            await asyncio.gather(*(e.generate(GenerateRequest(list(range(r["prompt_len"])),
                                                              {"max_tokens": r["max_tokens"], "ignore_eos": True},
                                                              request_id=f"q{i}"))
                                   for i in range(r["batch"])))
            return clock.now()

        took = clock.run(main(), env=env)
        # held out since 2026-12-04 (the CPU step is fitted on the 0.6B benches of three hosts); this run's host was a
        # fast one (lockstep k 63 us against the fitted benches' 62-88): within 10 % before, 20 % now
        assert _err(took, r["wall_s"]) < 0.20, (r["batch"], r["max_tokens"], took, r["wall_s"])


# --------------------------------------------------------------------------------------------
# Engine sleep / wake / weight update
# --------------------------------------------------------------------------------------------


def _sleep_cycles(engine: SimEngine, level: int, cycles: int) -> list[tuple[float, float]]:
    out: list[tuple[float, float]] = []

    async def main() -> None:
        for _ in range(cycles):
            t0 = clock.now()
            await engine.sleep(level)
            t1 = clock.now()
            await engine.wake_up([TAG_WEIGHTS])
            await engine.wake_up([TAG_KV_CACHE])
            out.append((t1 - t0, clock.now() - t1))

    clock.run(main(), env=engine.env)
    return out


def _one_gpu(env: simpy.Environment) -> SimAllocator:
    """The engine's allocator on one measured GPU (with a host pool, so pinned bytes are accounted)."""
    cl = SimCluster.create(env, MEASURED, 1)
    return engine_allocator("e", cl.gpus, MEASURED, host=cl.host, env=env)


def _vllm_engine() -> SimEngine:
    env = simpy.Environment()
    settings = EngineSettings(max_model_len=20480, gpu_memory_utilization=0.6)
    return SimEngine("e", env, MEASURED, QWEN3_4B, settings, LengthSampler("fixed:8", seed=0), seed=0,
                     allocator=_one_gpu(env))


def test_engine_pins_host_memory_on_the_first_sleep_only():
    """vLLM 0.25.1: level-1 sleep 4.21 s the first time, 0.26 s later (PyTorch's caching host allocator)."""
    e = _vllm_engine()
    times = _sleep_cycles(e, 1, 3)
    first, later = times[0][0], [t for t, _ in times[1:]]
    assert later[0] == pytest.approx(later[1])
    # level 1 offloads weights and the (vime-modelled) runtime and graph tags; only the first sleep pins
    # them, the weights in power-of-two blocks (PyTorch's caching host allocator)
    scale = QWEN3_4B.vllm_pinned_scale(1)
    assert 1.3 < scale < 1.4
    offloaded = e.kv.weight_bytes * scale + e.kv.activation_peak_bytes + e.kv.cuda_graph_bytes
    assert first - later[0] == pytest.approx(offloaded / GiB * MEASURED.vmm.pinned_alloc_s_per_gib, rel=1e-6)
    # three runs: the first sleep 4.21 / 6.95 / 5.89 s (pinning varies between processes), later 0.26-0.27 s
    runs = [VLLM] + [json.loads((DATA / f).read_text()) for f in ("h200_vllm_0.25.1_b1.json", "h200_vllm_0.25.1_b2.json")]
    firsts = [r["phases"]["sleep_l1"][0]["sleep_s"] for r in runs]
    assert _err(first, statistics.median(firsts)) < 0.20 and min(firsts) <= first <= max(firsts)
    later_measured = [statistics.median(c["sleep_s"] for c in r["phases"]["sleep_l1"][1:]) for r in runs]
    assert _err(later[0], statistics.median(later_measured)) < 0.10


def test_engine_sleep_and_wake_pay_a_fixed_call_cost():
    """Level-2 sleep copies (almost) nothing yet took 0.07-0.10 s; waking only the KV cache 0.11-0.12 s."""
    e = _vllm_engine()
    _sleep_cycles(e, 1, 1)  # the pinned pool exists from here on, as in the measured run (L1 cycles first)
    s, kv = e.settings, e.kv
    # vime's level 2 still offloads the runtime and CUDA-graph tags (vime.protocols.sleep_offload_tags)
    copied = kv.activation_peak_bytes + kv.cuda_graph_bytes
    released = kv.weight_bytes + kv.kv_allocated_bytes + copied
    out: list[float] = []

    async def main() -> None:
        t0 = clock.now()
        await e.sleep(2)
        out.append(clock.now() - t0)

    clock.run(main(), env=e.env)
    expected = (s.http_rtt_s + copied / MEASURED.d2h_bytes_per_s
                + released / GiB * MEASURED.vmm.unmap_release_s_per_gib + s.sleep_call_s)
    assert out[0] == pytest.approx(expected, rel=1e-9)
    l2 = [r["sleep_s"] for r in VLLM["phases"]["sleep_l2_ipc"]]
    assert min(l2) * 0.9 <= out[0] <= max(l2) * 1.15
    kv_wake = statistics.median(r["wake_kv_s"] for r in VLLM["phases"]["sleep_l1"])
    weights_wake = statistics.median(r["wake_weights_s"] for r in VLLM["phases"]["sleep_l1"])
    pred = _sleep_cycles(_vllm_engine(), 1, 2)[1][1]  # weights + KV wake of a later cycle
    # the two wakes together within 20 % (the weights' copy-back alone is slower than the link: see the notes)
    assert _err(pred, weights_wake + kv_wake) < 0.20


def test_weight_backup_and_restore_pay_per_tensor():
    """vLLM's CuMem allocator copies allocation by allocation: only offloaded (copied) weights pay per tensor."""
    e = _vllm_engine()
    (first_sleep, _), (later_sleep, later_wake) = _sleep_cycles(e, 1, 2)
    s, kv, hw = e.settings, e.kv, MEASURED
    tensors = len(QWEN3_4B.hf_weight_shapes())
    copied = kv.weight_bytes + kv.activation_peak_bytes + kv.cuda_graph_bytes
    released = copied + kv.kv_allocated_bytes
    assert later_sleep == pytest.approx(s.http_rtt_s + copied / hw.d2h_bytes_per_s
                                        + released / GiB * hw.vmm.unmap_release_s_per_gib
                                        + s.sleep_call_s + s.sleep_per_tensor_s * tensors, rel=1e-9)
    # the two wakes: weights (copied back, per tensor) then the KV cache (mapped only), which maps beyond the pool's
    # cheap share of the GPU (nothing else on it) after the weights' GiB
    spill = max(0, released - max(copied, int(s.wake_spill_share * e.allocator.gpus[0].capacity)))
    assert spill > 0
    assert later_wake == pytest.approx(2 * s.http_rtt_s + released / GiB * (hw.vmm.create_map_s_per_gib + s.wake_per_gib_s)
                                       + copied / hw.h2d_bytes_per_s + 2 * s.wake_call_s
                                       + s.wake_per_tensor_s * tensors + spill / GiB * s.wake_spill_s_per_gib, rel=1e-9)
    measured = statistics.median(r["wake_weights_s"] for r in VLLM["phases"]["sleep_l1"])
    kv_part = released - copied
    weights_wake = later_wake - (s.http_rtt_s + kv_part / GiB * (hw.vmm.create_map_s_per_gib + s.wake_per_gib_s)
                                 + s.wake_call_s + spill / GiB * s.wake_spill_s_per_gib)
    assert _err(weights_wake, measured) < 0.10
    # a level-2 sleep discards the weights: no per-tensor term
    e2 = _vllm_engine()
    _sleep_cycles(e2, 1, 1)
    out: list[float] = []

    async def main() -> None:
        t0 = clock.now()
        await e2.sleep(2)
        out.append(clock.now() - t0)
        t1 = clock.now()
        await e2.wake_up([TAG_WEIGHTS])
        out.append(clock.now() - t1)

    clock.run(main(), env=e2.env)
    assert out[1] == pytest.approx(s.http_rtt_s + (kv.weight_bytes + copied - kv.weight_bytes) / GiB
                                   * (hw.vmm.create_map_s_per_gib + s.wake_per_gib_s) + (copied - kv.weight_bytes) / hw.h2d_bytes_per_s
                                   + s.wake_call_s, rel=1e-6)


def test_ipc_bucket_cost_matches_the_measured_per_bucket_time():
    e = _vllm_engine()
    sizes = VLLM["buckets"]["sizes"]
    per_bucket = [e.bucket_seconds(WeightBucket([f"t{j}" for j in range(25)], ["bfloat16"] * 25, [[1]] * 25, n,
                                                index=i)) for i, n in enumerate(sizes)]
    # the three TP-1 runs' medians differ 1.6× (15.2, 24.7, 18.7 ms): their median, as compare_calibration.py and
    # bench/fit_whole_step.py take it (which fits ipc_open_s beside load_per_tensor_s)
    runs = [json.loads((DATA / f).read_text()) for f in ("h200_vllm_0.25.1.json", "h200_vllm_0.25.1_b1.json",
                                                          "h200_vllm_0.25.1_b2.json")]
    measured = statistics.median(statistics.median(t for r in run["phases"]["sleep_l2_ipc"] for t in r["bucket_s"])
                                 for run in runs)
    assert _err(statistics.median(per_bucket), measured) < 0.10


# --------------------------------------------------------------------------------------------
# Trainer: unfused attention, 2-byte grads, torch AdamW
# --------------------------------------------------------------------------------------------


ACCOUNTING = {f: json.loads((DATA / f).read_text())
              for f in ("h200_megatron_1.7b_accounting.json", "h200_megatron_1.7b_accounting_cast_bf16.json")}


def _run_hw(res: dict) -> HardwareSpec:
    norm = "torch" if res.get("cast_bf16") else "torch_fp32_weight"
    return dataclasses.replace(MEASURED, software=dataclasses.replace(MEASURED.software, train_norm=norm))


@pytest.mark.parametrize("shape", MEGATRON["shapes"], ids=lambda e: f"{e['mbs']}x{e['seq']}")
def test_megatron_local_spec_step_times(shape):
    # the first lease's run kept its norm weights fp32 (composite norms): predicted with that software
    fwd, bwd = compute_seconds(QWEN3_17B, _run_hw(MEGATRON), [shape["seq"]] * shape["mbs"])
    assert _err(fwd, shape["fwd_s_median"]) < 0.10
    assert _err(bwd, shape["bwd_s_median"]) < 0.10
    # the bench ran 2-byte grads (grad_reduce_in_fp32=False)
    assert optimizer_step_bytes(MEASURED, 2) == TORCH_ADAMW_STEP_BYTES + 6  # + copying 2-byte grads into fp32
    opt = QWEN3_17B.num_params() * optimizer_step_bytes(MEASURED, 2) / streaming_bytes_per_s(MEASURED)
    assert _err(opt, shape["opt_s_median"]) < 0.10
    # the fused-Adam assumption (30 B/param) is > 60 % short of the torch AdamW run
    fused = dataclasses.replace(MEASURED, software=dataclasses.replace(MEASURED.software, train_optimizer="fused"))
    assert optimizer_step_bytes(fused) == ADAM_STEP_BYTES
    assert _err(opt * ADAM_STEP_BYTES / optimizer_step_bytes(MEASURED, 2), shape["opt_s_median"]) > 0.6


def test_unfused_attention_computes_the_full_square_and_streams_the_scores():
    lengths = [2048] * 4
    flash = dataclasses.replace(MEASURED, software=dataclasses.replace(MEASURED.software, train_attention="flash"))
    f_fwd, f_bwd = compute_seconds(QWEN3_17B, flash, lengths)
    u_fwd, u_bwd = compute_seconds(QWEN3_17B, MEASURED, lengths)
    causal = sum(4.0 * QWEN3_17B.num_layers * QWEN3_17B.num_attention_heads * QWEN3_17B.head_dim
                 * n * (n + 1) / 2 for n in lengths)
    attn_rate = MEASURED.bf16_flops * MEASURED.efficiency.train_attention_mfu
    # the full square at the attention matmuls' own rate replaces the causal half at the GEMM rate
    matmul = QWEN3_17B.unfused_attention_flops(lengths) / attn_rate - causal / MEASURED.train_flops
    stream = QWEN3_17B.score_elements(lengths) / streaming_bytes_per_s(MEASURED)
    k = MEASURED.efficiency.train_backward_factor
    # and its two batched products per layer are matmul kernels with their fixed time, twice in the backward
    calls = 2 * QWEN3_17B.num_layers * MEASURED.efficiency.train_gemm_call_s
    assert calls > 0
    assert u_fwd - f_fwd == pytest.approx(matmul + 33 * stream + calls, rel=1e-9)
    assert u_bwd - f_bwd == pytest.approx(k * (matmul + calls) + 41 * stream, rel=1e-9)
    # the default stack: backward twice the forward, no floor, no unfused kernels
    prod = dataclasses.replace(MEASURED, software=Software(),
                               efficiency=dataclasses.replace(MEASURED.efficiency, train_backward_factor=2.0,
                                                              train_host_fwd_s_per_layer=0.0,
                                                              train_host_bwd_s_per_layer=0.0))
    p_fwd, p_bwd = compute_seconds(QWEN3_17B, prod, lengths)
    assert p_bwd == pytest.approx(2 * p_fwd)


def test_trainer_never_runs_ahead_of_its_cpu_launches():
    """Qwen3-0.6B 1x1024 on the H200: 12 ms of GPU work took 65.6 ms forward (the profile's floor)."""
    eff = MEASURED.efficiency
    fwd, bwd = compute_seconds(load_model("Qwen3-0.6B"), MEASURED, [1024])
    assert (fwd, bwd) == (eff.train_host_fwd_s_per_layer * 28, eff.train_host_bwd_s_per_layer * 28)
    big_fwd, _ = compute_seconds(QWEN3_17B, MEASURED, [2048] * 4)
    assert big_fwd > 2 * eff.train_host_fwd_s_per_layer * 28  # large micro-batches are GPU-bound


def test_unfused_norms_cost_their_measured_traffic():
    """fp32 norm weights (composite norms) against a bf16 cast: the forward difference of the H200 runs."""
    cast = dataclasses.replace(MEASURED, software=dataclasses.replace(MEASURED.software, train_norm="torch"))
    fp32 = dataclasses.replace(MEASURED, software=dataclasses.replace(MEASURED.software, train_norm="torch_fp32_weight"))
    runs = {json.loads((DATA / f).read_text()).get("cast_bf16", False): json.loads((DATA / f).read_text())
            for f in ("h200_megatron_1.7b_accounting.json", "h200_megatron_1.7b_accounting_cast_bf16.json")}
    for shape in runs[True]["shapes"]:
        lengths = [shape["seq"]] * shape["mbs"]
        other = next(e for e in runs[False]["shapes"] if (e["mbs"], e["seq"]) == (shape["mbs"], shape["seq"]))
        measured = other["fwd_s_median"] - shape["fwd_s_median"]
        pred = compute_seconds(QWEN3_17B, fp32, lengths)[0] - compute_seconds(QWEN3_17B, cast, lengths)[0]
        assert _err(pred, measured) < 0.10, (shape["mbs"], shape["seq"], pred, measured)


@pytest.mark.parametrize(("name", "i"), [(f, i) for f, r in ACCOUNTING.items() for i in range(len(r["shapes"]))])
def test_megatron_activation_model_matches_the_saved_tensors(name, i):
    """Per layer and token, what the model says a block keeps equals what autograd saved on the H200
    (bench/megatron_step.py --account: storages saved for backward, counted once), and the peak is
    the state plus all of it plus the bf16 logits alive at the end of the forward (within 1 %)."""
    res = ACCOUNTING[name]
    shape = res["shapes"][i]
    hw = _run_hw(res)
    lengths = [shape["seq"]] * shape["mbs"]
    tokens = sum(lengths)
    terms = software_terms(hw)
    per_layer = QWEN3_17B.activation_bytes_per_layer_token(1, sequence_parallel=False, **terms)
    seq = (score_bytes(QWEN3_17B, hw, lengths) + rope_bytes(QWEN3_17B, hw, lengths)) / QWEN3_17B.num_layers / tokens
    assert per_layer + seq == pytest.approx(shape["accounting"]["saved"]["per_layer_bytes_per_token"][0], rel=1e-9)
    act = QWEN3_17B.activation_bytes_per_token(1, 1, "none", sequence_parallel=False, **terms) * tokens
    state = QWEN3_17B.num_params() * (PARAM_BYTES + grad_bytes(bf16_grads=True) + OPTIMIZER_BYTES)
    assert _err(state + act + score_bytes(QWEN3_17B, hw, lengths) + rope_bytes(QWEN3_17B, hw, lengths),
                shape["peak_allocated_bytes"]) < 0.01


@pytest.mark.parametrize("shape", MEGATRON["shapes"], ids=lambda e: f"{e['mbs']}x{e['seq']}")
def test_megatron_local_spec_peak_memory(shape):
    """The first lease's runs (norm weights fp32): the peak within 1 %, from -55 % with the flash model."""
    lengths = [shape["seq"]] * shape["mbs"]
    hw = _run_hw(MEGATRON)
    params = QWEN3_17B.num_params()
    act = QWEN3_17B.activation_bytes_per_token(1, 1, "none", sequence_parallel=False, **software_terms(hw)) * sum(lengths)
    pred = (params * (PARAM_BYTES + grad_bytes(bf16_grads=True) + OPTIMIZER_BYTES) + act + score_bytes(QWEN3_17B, hw, lengths)
            + rope_bytes(QWEN3_17B, hw, lengths))
    assert _err(pred, shape["peak_allocated_bytes"]) < 0.01
    expanded = 3 * 2 * QWEN3_17B.num_attention_heads * QWEN3_17B.head_dim * QWEN3_17B.num_layers * sum(lengths)
    mask = QWEN3_17B.num_layers * max(lengths) ** 2
    assert score_bytes(QWEN3_17B, hw, lengths) == 6 * QWEN3_17B.score_elements(lengths) + expanded + mask
    # state after init was measured too: 16 B/param with 2-byte grads
    assert params * (PARAM_BYTES + grad_bytes(bf16_grads=True) + OPTIMIZER_BYTES) == pytest.approx(
        MEGATRON["state_bytes_after_init"], rel=0.01)
    # recompute: selective drops the scores, full keeps one layer's
    assert score_bytes(QWEN3_17B, hw, lengths, recompute="selective") == expanded / 3  # the query only
    assert score_bytes(QWEN3_17B, hw, lengths, recompute="full") == pytest.approx(
        score_bytes(QWEN3_17B, hw, lengths) / QWEN3_17B.num_layers)


def test_sim_trainer_uses_the_profiles_software():
    from vime.config import parse_args
    from vime.sim.trainer import SimTrainer
    base = ["--no-colocate", "--no-offload-train", "--rollout-num-gpus", "8"]
    plans = {}
    # the grads' dtype is the run's (--grad-reduce-in-bf16), the rest the profile's software
    for name, hw, flags in (("flash", dataclasses.replace(H100, memory_bytes=MEASURED.memory_bytes), []),
                            ("unfused", dataclasses.replace(H100, memory_bytes=MEASURED.memory_bytes,
                                                            software=Software("unfused", "torch")),
                             ["--grad-reduce-in-bf16"])):
        args = parse_args([*base, *flags], command="simulate")
        cl = SimCluster.create(simpy.Environment(), hw, 8)
        tr = SimTrainer(args.cluster, args.parallel, args.algo, QWEN3_4B, cl, seed=args.seed)
        plans[name] = (tr, tr.memory_plan(2048, [1024, 1024]), tr._optimizer_seconds())
    (_, pf, of), (tu, pu, ou) = plans["flash"], plans["unfused"]
    assert pu["grads"] * 2 == pf["grads"]
    lay = tu.layout
    extra = score_bytes(QWEN3_4B, tu.hw, [1024, 1024], lay.tp, lay.pp)
    per_token = {name: QWEN3_4B.activation_bytes_per_token(lay.tp, lay.pp, sequence_parallel=lay.tp > 1,
                                                           **software_terms(tr.hw))
                 for name, (tr, _, _) in plans.items()}
    body = (per_token["unfused"] - per_token["flash"]) * 2048
    assert extra > 0 and pu["activations"] - pf["activations"] == pytest.approx((extra + body) * lay.pp / lay.cp, abs=2)
    assert ou > of


# --------------------------------------------------------------------------------------------
# Allocator: a cold resume frees its pinned buffer
# --------------------------------------------------------------------------------------------


def test_cold_resume_pays_freeing_the_pinned_buffer():
    """torch_memory_saver at 8 GiB: resume 0.82 s measured, 0.14 s for the copy alone."""
    runs = [r["result"] for r in CAL["cumem"]["runs"] if (r.get("result") or {}).get("method") == "tms"
            and (r.get("result") or {}).get("gib") == 8]
    assert runs
    res = runs[0]
    kept = res["kept_bytes"]

    def resume(pinned: str) -> float:
        cl = SimCluster.create(simpy.Environment(), MEASURED, 1)
        a = SimAllocator("actor", cl.gpus, MEASURED, host=cl.host, known_tags=("params", "optimizer"),
                         pinned=pinned, env=cl.env)
        a.allocate("params", kept)
        out: list[float] = []

        async def main() -> None:
            await a.sleep(["params"])
            t0 = clock.now()
            await a.wake_up()
            out.append(clock.now() - t0)

        clock.run(main(), env=cl.env)
        return out[0]

    cold, persistent = resume("cold"), resume("persistent")
    assert cold - persistent == pytest.approx(kept / GiB * MEASURED.vmm.pinned_free_s_per_gib, rel=1e-9)
    measured = statistics.median(c["resume_s"] for c in res["cycles"])
    assert _err(cold, measured) < 0.20
    # freeing pinned memory measured 0.083-0.172 s/GiB across processes (bench/pin_cost.py): the
    # measured resume lies inside what that range of rates predicts
    probe = json.loads((DATA / "h200_pin_cost.json").read_text())
    frees = [rep["free_s_per_gib"] for run in probe["runs"] if run.get("method") in ("cu_1g", "cu_256m", "torch_pin")
             for rep in run["reps"]]
    assert persistent + kept / GiB * min(frees) <= measured <= persistent + kept / GiB * max(frees)
    assert _err(persistent, measured) > 0.5  # without the free the model was 83 % short


# --------------------------------------------------------------------------------------------
# The whole comparison
# --------------------------------------------------------------------------------------------


def test_comparison_counts_improve_and_stay():
    mod = _compare_module()
    runs = [json.loads((DATA / f).read_text()) for f in mod.VLLM_FILES]
    rows = mod.rows_for(MEASURED, mod.load_raw(str(DATA / "h200_calibration.json")), runs)
    judged = [r for r in rows if r["group"] != "hardware"]
    within = [r for r in judged if abs(r["error_pct"]) <= 10]
    spread = [r for r in judged if abs(r["error_pct"]) > 10 and r["within_spread"]]
    assert len(judged) == 218
    assert len(within) >= 165
    # the rest: inside the range of the repeated measurements, except 39: Megatron steps near the CPU floor (the
    # eleventh lease's 0.6B ones, held out, on a faster host than the floor's), the first 56 GiB resume, and 7 rows
    # of the held-out TP=2 engine (its CPU step is faster than the TP=1 fit says)
    assert len(within) + len(spread) >= 179
    tp1 = [r for r in judged if r["group"].startswith("vLLM 0.25.1 (Qwen3-4B")]
    # medians over 4-5 runs of the 4B bench, held out since the CPU step is fitted on the 0.6B benches (2026-12-04):
    # their hosts were fast ones, the B=256 rows 11-13 % over; 256 × 1024 18 % since the GEMMs run in series with the
    # KV read (bench/decode_roofline.py: the dense 8B-32B rows it fixed were 20-25 % short)
    assert all(abs(r["error_pct"]) <= (20 if "256 x 1024" in r["quantity"] else 12) for r in tp1)
    nccl = [r for r in judged if r["group"].startswith("NCCL")]
    assert len(nccl) == 8 and all(abs(r["error_pct"]) < 10 for r in nccl)
    # the held-out Qwen3-4B and Qwen3-0.6B steps (predicted before they ran): every 4B peak within 1 %, every
    # GPU-bound forward and backward (modelled GPU time over 1.5x the CPU floor) within 10 %
    held = [r for r in judged if "[held out]" in r["quantity"]]
    assert len(held) == 84
    assert all(abs(r["error_pct"]) < 1 for r in held if r["quantity"].startswith("peak qwen3-4b"))
    near_floor = ("1x1024", "2x1024", "1x1152", "2x1152", "4x1152", "8x640", "16x640")
    gpu_bound = [r for r in held if r["quantity"].split()[0] in ("fwd", "bwd")
                 and not any(f" {s} " in r["quantity"] for s in near_floor)]
    assert len(gpu_bound) == 16 and all(abs(r["error_pct"]) < 10 for r in gpu_bound)
    assert all(math.isfinite(r["predicted"]) for r in rows)
    # every vLLM row counts every run that measured it
    assert {r["n"] for r in tp1} <= {3, 4, 5}


def test_matmul_kernels_and_the_eager_stacks_width_traffic():
    """Each matmul kernel's fixed time and the eager stack's bytes per token and layer width, as compute_seconds adds
    them: counted per kernel of the whole model (two per forward one in the backward), the traffic split over the
    ranks, none of it on a fused stack."""
    from vime.sim.trainer.costs import gemm_calls, layer_width, streaming_bytes_per_s

    eff = MEASURED.efficiency
    assert eff.train_gemm_call_s > 0 and eff.train_width_bytes_fwd > 0 and eff.train_width_bytes_bwd > 0
    m, lengths = load_model("Qwen3-0.6B"), [1152] * 8
    # 4 projections per dense layer, the head, the unfused attention's 2 batched products per layer
    assert gemm_calls(m, True) == 6 * m.num_layers + 1 and gemm_calls(m, False) == 4 * m.num_layers + 1
    moe = load_model("Qwen3-30B-A3B")
    assert gemm_calls(moe, False) == 4 * (moe.num_layers - len(moe.moe_layers)) + 2 * len(moe.moe_layers) + 1
    assert layer_width(m) == (16 + 2 * 8) * 128 + 1024
    floorless = dataclasses.replace(MEASURED, efficiency=dataclasses.replace(
        eff, train_host_fwd_s_per_layer=0.0, train_host_bwd_s_per_layer=0.0))

    def without(hw: HardwareSpec, **zero: float) -> HardwareSpec:
        return dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **zero))

    for ranks in (1, 2):
        fwd, bwd = compute_seconds(m, floorless, lengths, ranks)
        f0, b0 = compute_seconds(m, without(floorless, train_gemm_call_s=0.0), lengths, ranks)
        calls = gemm_calls(m, True) * eff.train_gemm_call_s
        assert fwd - f0 == pytest.approx(calls) and bwd - b0 == pytest.approx(eff.train_backward_factor * calls)
        f1, b1 = compute_seconds(m, without(floorless, train_width_bytes_fwd=0.0, train_width_bytes_bwd=0.0),
                                 lengths, ranks)
        per_byte = sum(lengths) * layer_width(m) * m.num_layers / ranks / streaming_bytes_per_s(MEASURED)
        assert fwd - f1 == pytest.approx(per_byte * eff.train_width_bytes_fwd)
        assert bwd - b1 == pytest.approx(per_byte * eff.train_width_bytes_bwd)
    fused = dataclasses.replace(floorless, software=dataclasses.replace(MEASURED.software, train_elementwise="fused"))
    no_width = without(fused, train_width_bytes_fwd=0.0, train_width_bytes_bwd=0.0)
    assert compute_seconds(m, fused, lengths) == compute_seconds(m, no_width, lengths)


def test_the_kv_wake_spill_is_the_probes_fit_and_holds_on_vllm_alone():
    """vLLM's pool maps cheaply up to wake_spill_share of the GPU less other processes' memory and at
    wake_spill_s_per_gib more beyond (bench/vllm_cumem_probe.py's mapping calls, fit_whole_step.py section 1b): the
    committed values are that fit, every probe run within 25 %, and vLLM alone's KV wake (held out) within 10 %."""
    fws = _fit_whole_step()
    fitted, lines = fws.spill_terms()
    s = EngineSettings()
    assert (fitted["wake_spill_share"], fitted["wake_spill_s_per_gib"]) == (s.wake_spill_share, s.wake_spill_s_per_gib)
    assert 5 * fitted["_cheap_s_per_gib"] < s.wake_spill_s_per_gib  # the spill is the expensive part (8.5x)
    runs = [line for line in lines if "[fitted]" in line]
    assert len(runs) == len(fws.SPILL_RUNS)
    for r in runs:
        assert abs(float(r.split("(")[-1].split("%")[0])) < 25.0, r
    wake = fws.wake_terms(json.loads((ROOT / "vime/sim/data/hardware/H200-141G-measured.json").read_text()),
                          fitted["_cheap_s_per_gib"])
    over = fws.spill_over(wake["_kv_gib"], wake["_weights_gib"], fws.TOTAL_GIB, s.wake_spill_share)
    assert over > 0  # vLLM alone's 83 GiB pool spills
    model = s.wake_call_s + fitted["_cheap_s_per_gib"] * wake["_kv_gib"] + s.wake_spill_s_per_gib * over
    assert _err(model, wake["_kv_s"]) < 0.10


def test_handed_back_memory_is_made_ready_at_the_probes_rate_and_the_held_out_runs_follow():
    """EngineSettings.wake_ready_s_per_gib is fit_whole_step.py section 1c's closed form on the session-19 probe runs
    (another process handing back 40-108 GiB just before the KV wake), each fitted run within 5 %; held out, the runs
    where the hand-back was made ready before the wake are no more than 25 % under (their first mapping call, which the
    baselines lack) and never over, and a 20 GiB KV waits for nothing."""
    fws = _fit_whole_step()
    fitted, lines = fws.ready_terms(EngineSettings().wake_spill_share)
    assert fitted["wake_ready_s_per_gib"] == EngineSettings().wake_ready_s_per_gib
    rows = {line.split()[0]: line for line in lines if line.startswith("h200_s19_")}
    assert set(rows) == {*fws.READY_FIT_RUNS, *fws.READY_HELD_OUT}

    def err(line: str) -> float:
        return float(line.split("(")[-1].split("%")[0])

    for name in fws.READY_FIT_RUNS:
        assert abs(err(rows[name])) < 5.0, rows[name]
    for name in fws.READY_HELD_OUT:
        if "small" in name:
            assert "the model waits 0.000 s" in rows[name]
        else:
            assert -25.0 < err(rows[name]) < 2.0, rows[name]
