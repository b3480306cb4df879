"""Measured on the H200 vs predicted by vime's simulator: one table of quantity, measured, predicted, error % (issue 12).

Runs on a CPU from the raw JSON kept in bench/data (no GPU needed):

    python bench/compare_calibration.py                       # table on stdout
    python bench/compare_calibration.py --json bench/data/h200_comparison.json

Predictions come from the simulator's own models (vime.sim): the engine's `IterationModel`
(GPU roofline per iteration, host-bound floor, output head once per request), `ModelSpec` FLOPs /
bytes, the trainer's fwd/bwd/optimizer and memory formulas (`vime.sim.trainer.compute_seconds`,
`score_bytes`, `optimizer_step_bytes`), the engine's sleep/wake and bucket costs and the
allocators' (SimAllocator's own cost methods, persistent vs cold pinned buffers), evaluated with two hardware profiles: the
measured preset H200-141G-measured (vime/sim/data/hardware/, with its provenance; it describes the
software of the runs too: unfused attention, bf16 grads, torch AdamW) and the datasheet preset
H200-141G. Error % = (predicted - measured) / measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from pathlib import Path

import simpy

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vime.sim import clock  # noqa: E402
from vime.sim.engine import EngineSettings, IterationModel  # noqa: E402
from vime.sim.hardware import HardwareSpec, load_hardware  # noqa: E402
from vime.sim.memory import SimAllocator, SimCluster  # noqa: E402
from vime.sim.models import ModelSpec, load_model  # noqa: E402
from vime.sim.trainer import (  # noqa: E402
    OPTIMIZER_BYTES,
    PARAM_BYTES,
    compute_seconds,
    optimizer_step_bytes,
    optimizer_transient_bytes,
    rope_bytes,
    score_bytes,
    software_terms,
    streaming_bytes_per_s,
)

sys.path.insert(0, str(ROOT / "bench"))
from calibrate import MEGATRON_MODELS, bench_grad_bytes, merge_raw, pinned_samples  # noqa: E402
from calibrate import _megatron_software as megatron_software  # noqa: E402

GIB = 1 << 30
DATA = ROOT / "bench" / "data"
#: bench/megatron_step.py and bench/pin_cost.py results kept beside the calibration raw file (later leases).
#: vLLM 0.25.1 runs on the H200: the first lease, the second lease's three (b0 broke after its
#: frontend phase and three decode rows on a client keep-alive race, fixed since; what it measured
#: counts), and on an nvidia-h200-x2 lease one at TP=1 (GPU 0) and one at TP=2 (held out).
VLLM_FILES = ("h200_vllm_0.25.1.json", "h200_vllm_0.25.1_b0_keepalive_failure.json", "h200_vllm_0.25.1_b1.json",
              "h200_vllm_0.25.1_b2.json", "h200x2_vllm_0.25.1_tp1.json", "h200x2_vllm_0.25.1_tp2.json")
EXTRA_RAW_FILES = ("h200_megatron_qwen3-0.6b_cumem.json", "h200_megatron_1.7b_accounting.json",
                   "h200_megatron_1.7b_accounting_cast_bf16.json", "h200_pin_cost.json", "h200x2_nccl.json",
                   "h200_gemm_train_sweep.json", "h200_gemm_train_sweep_repeat.json")
#: Held out of every fit: Qwen3-4B steps, predicted before they ran (h200_megatron_qwen3-4b_predicted.json), and the
#: eleventh lease's Qwen3-0.6B and 4B steps across the host/GPU crossover (h200_megatron_qwen3-0.6b_overlap_predicted.json)
HELDOUT_FILES = ("h200_megatron_qwen3-4b_heldout.json", "h200_megatron_qwen3-0.6b_overlap.json",
                 "h200_megatron_qwen3-0.6b_overlap_repeat.json", "h200_megatron_qwen3-4b_1152.json")


def megatron_runs(raw: dict) -> list[dict]:
    """Every successful GPU Megatron step in `raw` (calibrate.py's raw file, merged with the
    bench/megatron_step.py results of EXTRA_RAW_FILES by `load_raw`)."""
    runs = [r.get("result") or {} for r in raw.get("megatron", {}).get("runs", [])]
    return [r for r in runs if r.get("ok") and r.get("device") == "cuda" and r.get("preset") in MEGATRON_MODELS]


def load_raw(path: str, extra: tuple[str, ...] = EXTRA_RAW_FILES) -> dict:
    """The calibration raw file with the kept results of later runs added (calibrate.merge_raw)."""
    parts = [json.loads(Path(path).read_text())]
    parts += [json.loads((DATA / f).read_text()) for f in extra if (DATA / f).exists()]
    for f in HELDOUT_FILES:  # compared, never fitted (calibrate.py is not given them)
        if (DATA / f).exists():
            parts.append({**json.loads((DATA / f).read_text()), "heldout": True})
    return merge_raw(parts)


def _iter_model(hw: HardwareSpec, model: ModelSpec, vllm_gpu_terms: bool = True, **kw) -> IterationModel:
    """vLLM's engine model on `hw`; without `vllm_gpu_terms` (the profile's KV read rate and sampler) for torch loops."""
    from calibrate import gpu_step_overrides  # noqa: PLC0415 - bench/calibrate.py, on the path below

    settings = EngineSettings(**{"max_model_len": 20480, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
                                 **(gpu_step_overrides(hw) if vllm_gpu_terms else {}), **kw})
    return IterationModel.build(hw, model, settings)


def prefill_seconds(im: IterationModel, prompt: int, chunk: int = 8192, overhead: bool = True) -> float:
    """A prompt through chunked prefill (vLLM's default budget of 8192 tokens per iteration)."""
    t, done = 0.0, 0
    while done < prompt:
        c = min(chunk, prompt - done)
        step = im.first_time if done == 0 else im.time  # an idle engine: the first step's CPU part shows
        t += step(c, done, c * done + c * (c + 1) / 2, seqs=1)
        done += c
    return t if overhead else t - im.overhead_s * math.ceil(prompt / chunk)


def decode_run_seconds(im: IterationModel, batch: int, prompt: int, new: int, response_per_token_s: float = 0.0,
                       response_per_request_s: float = 0.0) -> float:
    """B requests of `prompt` tokens each generating `new` tokens in lockstep (prefill then decode), until the last
    response is out.

    The prefill iteration samples each request's first token, so `new - 1` decode iterations follow; then the API
    server builds the B responses one at a time (EngineSettings.response_seconds each).
    """
    t = 0.0
    total = batch * prompt
    done = 0
    while done < total:  # prompts packed into 8192-token iterations
        c = min(8192, total - done)
        step = im.first_time if done == 0 else im.time
        t += step(c, 0, c * (prompt + 1) / 2, seqs=max(1, round(c / prompt)))
        done += c
    for j in range(new - 1):
        ctx = batch * (prompt + j + 1)
        t += im.time(batch, ctx, ctx)
    return t + batch * (response_per_request_s + new * response_per_token_s)


def decode_schedule(im: IterationModel, batch: int, prompt: int, new: int,
                    budget: int = 8192) -> tuple[float, float, float]:
    """B requests of `prompt` tokens arriving together, each generating `new` tokens, scheduled as vLLM's V1 engine
    does: every step the decoding requests first (one token each), then prefill chunks in the rest of the token
    budget, so the early requests decode while the later prompts are still being filled.

    Returns the engine's time until the last token; the mean inter-token latency as vLLM's /metrics counts it (for
    each token after a request's first, the time since its previous token); and the mean time to a request's first
    token. A request that decodes beside a prefill chunk waits a whole mixed step for its token, so at large B the
    mean latency is well above a pure decode step.
    """
    filled = [0] * batch  # prompt tokens in the cache
    gen = [0] * batch  # tokens generated
    last = [0.0] * batch
    t, itl_sum, itl_n, ttft_sum, first = 0.0, 0.0, 0, 0.0, True
    while gen[-1] < new:
        decoding = [i for i in range(batch) if filled[i] == prompt and 0 < gen[i] < new]
        left = budget - len(decoding)
        chunks = []
        for i in range(batch):
            if left <= 0:
                break
            if filled[i] < prompt:
                take = min(prompt - filled[i], left)
                chunks.append((i, take))
                left -= take
        tokens = len(decoding) + sum(c for _, c in chunks)
        dec_ctx = sum(prompt + gen[i] for i in decoding)
        kv_read = dec_ctx + sum(filled[i] + c for i, c in chunks)
        attn = dec_ctx + sum(c * filled[i] + c * (c + 1) / 2 for i, c in chunks)
        seqs = len(decoding) + len(chunks)
        t += (im.first_time if first else im.time)(tokens, kv_read, attn, seqs=seqs)
        first = False
        for i in decoding:
            itl_sum += t - last[i]
            itl_n += 1
            gen[i] += 1
            last[i] = t
        for i, c in chunks:
            filled[i] += c
            if filled[i] == prompt:  # the step that completes a prompt samples its first token
                gen[i] = 1
                last[i] = t
                ttft_sum += t
    return t, itl_sum / itl_n if itl_n else 0.0, ttft_sum / batch


def rows_for(hw: HardwareSpec, raw: dict, vllm: dict | None) -> list[dict]:
    rows: list[dict] = []

    # The pinning rates vary by tens of percent between processes (bench/pin_cost.py): a prediction
    # that pins or frees host memory also gets its range over the measured rates.
    alloc_rates, free_rates = pinned_samples(raw)
    hw_lo = hw_hi = hw
    if alloc_rates and free_rates:
        hw_lo, hw_hi = (dataclasses.replace(hw, vmm=dataclasses.replace(
            hw.vmm, pinned_alloc_s_per_gib=pick(alloc_rates), pinned_free_s_per_gib=pick(free_rates)))
            for pick in (min, max))

    def pinning(fn) -> tuple[float, float] | None:
        return (fn(hw_lo), fn(hw_hi)) if hw_lo is not hw else None

    def add(group: str, quantity: str, measured: float, predicted: float, unit: str, note: str = "",
            spread: tuple[float, float] | None = None, n: int = 1,
            pred_range: tuple[float, float] | None = None) -> None:
        """`spread`: the range of repeated measurements; `pred_range`: the prediction over the measured
        range of its noisy inputs (pinning rates). Either containing the other's value counts as
        inside the measurements' spread."""
        inside = bool((spread and spread[0] <= predicted <= spread[1])
                      or (pred_range and min(pred_range) <= measured <= max(pred_range)))
        rows.append({"group": group, "quantity": quantity, "measured": measured, "predicted": predicted,
                     "unit": unit, "error_pct": 100.0 * (predicted - measured) / measured if measured else None,
                     "note": note, "n": n, "spread": list(spread) if spread else None,
                     "predicted_range": sorted(pred_range) if pred_range else None, "within_spread": inside})

    # --- hardware rates (what the profile feeds every model) ---------------------------------------
    g = raw.get("gemm", {})
    if "square" in g:
        add("hardware", "bf16 GEMM 8192^3", g["square"]["tflops"] * 1e12, hw.bf16_flops, "FLOP/s")
    if "bytes_per_s" in raw.get("hbm", {}):
        add("hardware", "HBM copy (read+write)", raw["hbm"]["bytes_per_s"], hw.hbm_bytes_per_s, "B/s")
    ho = raw.get("host", {})
    if "h2d_bytes_per_s" in ho:
        add("hardware", "pinned H2D", ho["h2d_bytes_per_s"], hw.h2d_bytes_per_s, "B/s")
        add("hardware", "pinned D2H", ho["d2h_bytes_per_s"], hw.d2h_bytes_per_s, "B/s")

    # --- engine roofline vs the PyTorch decode / prefill workloads (no scheduler: overhead removed) -----
    m4 = load_model("Qwen3-4B")
    im = _iter_model(hw, m4, vllm_gpu_terms=False)  # torch loops: torch's attention, no sampler
    for r in raw.get("decode", {}).get("rows", []):
        b, length = r["batch"], r["context"]
        # the step's fixed part is GPU time (small kernels, graph replay: fit_whole_step.py section 0a), a torch loop's too
        pred = im.gpu_time(b, b * length, b * length)
        add("decode workload (PyTorch, CUDA graph, Qwen3-4B shapes)", f"step B={b} L={length}", r["step_s"], pred, "s")
    for r in raw.get("prefill", {}).get("rows", []):
        t = r["tokens"]
        pred = im.gpu_time(t, 0, t * (t + 1) / 2, seqs=1) - im.overhead_s
        add("prefill workload (PyTorch, flash attention, Qwen3-4B shapes)", f"prompt {t}", r["median_s"], pred, "s",
            "output head once per sequence (ModelSpec.prefill_flops)")

    # --- NCCL between GPUs of one host (1 MiB and up; below, the per-call cost is all there is) ----------
    nccl = raw.get("nccl")
    if nccl and nccl.get("env", {}).get("device") == "cuda":
        world = nccl["env"]["world"]
        for r in nccl["rows"]:
            if r["bytes"] < 1 << 20:
                continue
            mib = r["bytes"] >> 20
            add(f"NCCL on {world} H200s (bench/nccl_bench.py)", f"all_reduce {mib} MiB", r["all_reduce_s"],
                hw.allreduce_seconds(r["bytes"], world), "s")
            add(f"NCCL on {world} H200s (bench/nccl_bench.py)", f"all_gather {mib} MiB gathered", r["all_gather_s"],
                hw.allgather_seconds(r["bytes"], world), "s")

    # --- Megatron step: every run, each predicted with its own software (norm weights fp32 or cast) ------
    for res in megatron_runs(raw):
        spec = load_model(MEGATRON_MODELS[res["preset"]])
        sw, _ = megatron_software(res, {})
        run_hw = dataclasses.replace(hw, software=dataclasses.replace(hw.software, **sw))
        grads, _ = bench_grad_bytes(res)
        params = spec.num_params()
        tag = " (state in vime CuMem regions)" if res.get("cumem") else ""
        tag += " [bf16 norms]" if res.get("cast_bf16") else ""
        tag += " [held out]" if res.get("heldout") else ""
        group = "Megatron-core step (local spec, 1 GPU)"
        for e in res["shapes"]:
            mbs, seq = e["mbs"], e["seq"]
            lengths = [seq] * mbs
            fwd, bwd = compute_seconds(spec, run_hw, lengths)
            q = f"{res['preset']} {mbs}x{seq}{tag}"
            add(group, f"fwd {q}", e["fwd_s_median"], fwd, "s")
            add(group, f"bwd {q}", e["bwd_s_median"], bwd, "s")
            opt = params * optimizer_step_bytes(run_hw, grads) / streaming_bytes_per_s(run_hw)
            add(group, f"optimizer {q}", e["opt_s_median"], opt, "s",
                f"{run_hw.software.train_optimizer} optimizer: {optimizer_step_bytes(run_hw, grads)} B/param")
            tokens = mbs * seq
            act = spec.activation_bytes_per_token(1, 1, "none", sequence_parallel=False,
                                                  **software_terms(run_hw)) * tokens
            extra = score_bytes(spec, run_hw, lengths) + rope_bytes(spec, run_hw, lengths)
            state = params * (PARAM_BYTES + grads + OPTIMIZER_BYTES)
            transient = params * optimizer_transient_bytes(run_hw, grads)
            add(group, f"peak allocated {q}", e["peak_allocated_bytes"], state + max(act + extra, transient), "B",
                f"{run_hw.software.train_attention} attention ({extra / GIB:.1f} GiB of s^2 scores, masks and RoPE "
                f"tables), {run_hw.software.train_norm} norms, {grads}-byte grads; the optimizer "
                f"step's {optimizer_transient_bytes(run_hw, grads)} B/param when larger")
        for c in res.get("cumem_cycles", []):
            p, w = c["pause"], c["resume"]
            def pause(h: HardwareSpec, p=p) -> float:
                return _pause(h, p["copied_bytes"], p["released_bytes"], p["host_alloc_bytes"])

            add("vime CuMem on real Megatron state", f"pause cycle {c['cycle']} ({p['copied_bytes'] / GIB:.1f} GiB kept)",
                p["seconds"], pause(hw), "s", pred_range=pinning(pause) if p["host_alloc_bytes"] else None)
            add("vime CuMem on real Megatron state", f"resume cycle {c['cycle']}", w["seconds"],
                _resume(hw, w["copied_bytes"], p["released_bytes"]), "s")

    # --- CuMem vs torch_memory_saver (SimAllocator: persistent vs cold pinned buffers) ----------------
    for r in raw.get("cumem", {}).get("runs", []):
        res = r.get("result") or {}
        if not res.get("cycles") or res["method"] not in ("vime", "tms"):
            continue
        kept, total = res["kept_bytes"], res["total_bytes"]
        mode = "persistent" if res["method"] == "vime" else "cold"
        for c in res["cycles"]:
            alloc = kept if (mode == "cold" or c["cycle"] == 0) else 0
            q = f"{res['method']} {res['gib']:g} GiB state, cycle {c['cycle']}"
            def pause(h: HardwareSpec, kept=kept, total=total, alloc=alloc) -> float:
                return _pause(h, kept, total, alloc)

            def resume(h: HardwareSpec, kept=kept, total=total, cold=mode == "cold") -> float:
                return _resume(h, kept, total, cold=cold)

            add(f"pause/resume ({mode} pinned buffers)", f"pause {q}", c["pause_s"], pause(hw), "s",
                pred_range=pinning(pause) if alloc else None)
            add(f"pause/resume ({mode} pinned buffers)", f"resume {q}", c["resume_s"], resume(hw), "s",
                pred_range=pinning(resume) if mode == "cold" else None)

    # --- real vLLM 0.25.1: every run; measured = median over runs of each run's median, spread = the runs' range --
    runs = [v for v in (vllm if isinstance(vllm, list) else [vllm] if vllm else []) if v]
    by_tp: dict[int, list[dict]] = {}
    for v in runs:  # a run's TP is in its server argv
        argv = v.get("server_argv") or []
        tp = int(argv[argv.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in argv else 1
        by_tp.setdefault(tp, []).append(v)
    for tp, tp_runs in sorted(by_tp.items()):
        vllm_rows(hw, im if tp == 1 else _iter_model(hw, m4, tp=tp), m4, tp_runs, add, pinning, tp=tp)
    return rows


def _median(xs: list[float]) -> float:
    return statistics.median(xs)


def vllm_rows(hw: HardwareSpec, im: IterationModel, m4: ModelSpec, runs: list[dict], add, pinning,
              tp: int = 1) -> None:
    """The vLLM rows: one per quantity, measured over every run (each run's median of its repeats or
    cycles; the row's value is the median over runs and `spread` their range), predicted once by
    the engine's models (IterationModel, EngineSettings' call, per-tensor, bucket, front-end and
    first-update costs, the allocator's pinning)."""
    settings = EngineSettings(tp=tp, max_model_len=20480)
    group = "vLLM 0.25.1 (Qwen3-4B shapes, random weights)"
    if tp > 1:  # held out at first (h200x2_vllm_tp2_predicted.json: decode +6..+35 %), then host_step_tp_scale
        group = f"vLLM 0.25.1 TP={tp} on {tp} H200s (its host_step_tp_scale fitted with a TP=1 pair)"
    fe = settings.request_overhead_s

    def per_run(fn) -> list[float]:
        out = []
        for v in runs:
            try:
                x = fn(v.get("phases", {}))
            except (KeyError, IndexError, ValueError, StopIteration, statistics.StatisticsError):
                continue
            if x is not None:
                out.append(x)
        return out

    def row(grp: str, quantity: str, values: list[float], pred: float, note: str = "", pred_range=None) -> None:
        if values:
            add(grp, quantity, _median(values), pred, "s", note, spread=(min(values), max(values)), n=len(values),
                pred_range=pred_range)

    row(group, "lone request, 16 tokens, max_tokens 1",
        per_run(lambda ph: ph["frontend"]["summary"]["gen1_s"]["median"]),
        im.first_time(16, 0, 16 * 17 / 2, seqs=1) + fe + settings.response_seconds(1),
        "request_overhead_s was derived from these (minus the modelled first step and the response's building)")
    grid = sorted({(r["batch"], r["max_tokens"]) for v in runs for r in v.get("phases", {}).get("decode", [])},
                  key=lambda k: (k[1], k[0]))
    for b, n in grid:
        row(group, f"generate B={b} x {n} tokens",
            per_run(lambda ph, b=b, n=n: next(r["wall_s"] for r in ph["decode"]
                                              if (r["batch"], r["max_tokens"]) == (b, n))),
            decode_run_seconds(im, b, 128, n, settings.response_per_token_s, settings.response_per_request_s) + fe)
    lens = sorted({r["prompt_len"] for v in runs for r in v.get("phases", {}).get("prefill", [])})
    for n in lens:
        row(group, f"prefill {n} tokens, max_tokens 1",
            per_run(lambda ph, n=n: _median([r["wall_s"] for r in ph["prefill"] if r["prompt_len"] == n])),
            prefill_seconds(im, n) + fe + settings.response_seconds(1),
            "+ the front end (request_overhead_s) and the one-token response's building")

    if not any(v.get("phases", {}).get("sleep_l1") for v in runs):
        return  # no sleep cycles in these runs (--skip-sleep)
    wbytes = runs[0].get("weight_bytes", m4.weight_bytes())
    tensors = len(m4.hf_weight_shapes())  # one allocation each in vLLM's backup loop
    kv = _median([r["free_asleep"] - r["free_awake"] - wbytes for v in runs for r in v["phases"].get("sleep_l1", [])])
    l1_sleep = _pause(hw, wbytes, wbytes + kv, 0) + settings.sleep_call_s + settings.sleep_per_tensor_s * tensors
    sw = "vLLM sleep/wake"

    def cycles(ph: dict, phase: str, key: str, first: bool) -> float | None:
        xs = [r[key] for r in ph[phase] if (r["cycle"] == 0) == first]
        return _median(xs) if xs else None

    def first_sleep(h: HardwareSpec) -> float:
        return l1_sleep + wbytes * m4.vllm_pinned_scale() / GIB * h.vmm.pinned_alloc_s_per_gib

    row(sw, "sleep level 1, first (pins the host buffer)",
        per_run(lambda ph: cycles(ph, "sleep_l1", "sleep_s", True)), first_sleep(hw),
        "PyTorch's caching host allocator keeps the pinned blocks (only the first sleep pins) and rounds "
        "each up to a power of two (ModelSpec.vllm_pinned_scale)", pred_range=pinning(first_sleep))
    row(sw, "sleep level 1, later", per_run(lambda ph: cycles(ph, "sleep_l1", "sleep_s", False)), l1_sleep)
    wake_w = (_resume(hw, wbytes, wbytes) + settings.wake_call_s + settings.wake_per_gib_s * wbytes / GIB
              + settings.wake_per_tensor_s * tensors)
    # vLLM's pool maps beyond its cheap share of the GPU less other processes' memory (none here) counting from the
    # cycle's first wake (the weights', level 1)
    spill = max(0.0, wbytes + kv - max(wbytes, settings.wake_spill_share * hw.memory_bytes))
    wake_kv = (_resume(hw, 0, kv) + settings.wake_call_s + settings.wake_per_gib_s * kv / GIB
               + settings.wake_spill_s_per_gib * spill / GIB)
    row(sw, "wake weights (L1)", per_run(lambda ph: _median([r["wake_weights_s"] for r in ph["sleep_l1"]])), wake_w)
    row(sw, "wake kv_cache (L1)", per_run(lambda ph: _median([r["wake_kv_s"] for r in ph["sleep_l1"]])), wake_kv)
    released = _median([r["free_asleep"] - r["free_awake"] for v in runs for r in v["phases"].get("sleep_l2_ipc", [])])
    row(sw, "sleep level 2", per_run(lambda ph: _median([r["sleep_s"] for r in ph["sleep_l2_ipc"]])),
        _pause(hw, 0, released, 0) + settings.sleep_call_s)
    sizes = next((v.get("buckets", {}).get("sizes") for v in runs if v.get("buckets", {}).get("sizes")), [])
    per = [settings.http_rtt_s + settings.ipc_open_s + 25 * settings.load_per_tensor_s
           + 2 * n / hw.decode_bytes_per_s for n in sizes]
    update = sum(per) + 2 * settings.http_rtt_s + settings.start_update_call_s + settings.finish_update_call_s
    ipc = "vLLM IPC weight update"
    row(ipc, f"{len(sizes)} buckets, start..finish, first update",
        per_run(lambda ph: cycles(ph, "sleep_l2_ipc", "update_total_s", True)), update + settings.first_update_s,
        "+ first_update_s (the server's first start_weight_update)")
    row(ipc, f"{len(sizes)} buckets, start..finish, later",
        per_run(lambda ph: cycles(ph, "sleep_l2_ipc", "update_total_s", False)), update,
        "EngineSettings.bucket_seconds with ~25 tensors per bucket")


def _allocator(hw: HardwareSpec, copy: float, unmap: float, pinned: str):
    """A one-GPU SimAllocator holding `copy` bytes to offload ("kept") and `unmap - copy` to discard
    ("dropped"): the rows' costs come from the simulator's own cost methods."""
    env = simpy.Environment()
    cluster = SimCluster.create(env, hw, 1)
    alloc = SimAllocator("bench", cluster.gpus, hw, known_tags=("kept", "dropped"), pinned=pinned, env=env)
    if copy:
        alloc.allocate("kept", int(copy))
    if unmap > copy:
        alloc.allocate("dropped", int(unmap - copy))
    return alloc, env


def _pause(hw: HardwareSpec, copy: float, unmap: float, alloc: float) -> float:
    """SimAllocator.sleep_seconds: pinning what is not pinned yet + copy at d2h + unmap/release."""
    a, env = _allocator(hw, copy, unmap, "persistent")
    if copy and not alloc:  # a later cycle: the persistent host buffer exists from an earlier sleep
        async def cycle() -> None:
            await a.sleep(["kept"], ["dropped"] if unmap > copy else [])
            await a.wake_up()

        clock.run(cycle(), env=env)
    return a.sleep_seconds(["kept"] if copy else [], ["dropped"] if unmap > copy else [])


def _resume(hw: HardwareSpec, copy: float, mapped: float, cold: bool = False) -> float:
    """SimAllocator.wake_seconds: create/map + copy at h2d (+ freeing the host buffer when cold)."""
    a, env = _allocator(hw, copy, mapped, "cold" if cold else "persistent")

    async def sleep() -> None:
        await a.sleep(["kept"] if copy else [], ["dropped"] if mapped > copy else [])

    clock.run(sleep(), env=env)
    return a.wake_seconds(None)


def _fmt(v: float, unit: str) -> str:
    if unit == "s":
        return f"{v * 1e3:.2f} ms" if v < 1 else f"{v:.2f} s"
    if unit == "B":
        return f"{v / GIB:.1f} GiB"
    if unit == "B/s":
        return f"{v / 1e9:.1f} GB/s"
    if unit == "FLOP/s":
        return f"{v / 1e12:.0f} TFLOP/s"
    return f"{v:g}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", default=str(DATA / "h200_calibration.json"))
    ap.add_argument("--vllm", default=",".join(str(DATA / f) for f in VLLM_FILES),
                    help="vLLM bench JSONs (scripts/h200/vllm_bench.py --out), comma separated: every run counts")
    ap.add_argument("--hardware", default="H200-141G-measured",
                    help="measured profile: a preset name or a JSON file (bench/calibrate.py --profile writes one)")
    ap.add_argument("--preset", default="H200-141G", help="datasheet preset to compare with")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    raw = load_raw(args.raw)
    vllm = [json.loads(Path(f).read_text()) for f in (args.vllm or "").split(",") if f and Path(f).exists()]
    measured_hw, preset_hw = load_hardware(args.hardware), load_hardware(args.preset)
    rows = rows_for(measured_hw, raw, vllm)
    preset_rows = rows_for(preset_hw, raw, vllm)
    for r, p in zip(rows, preset_rows, strict=True):
        r["predicted_preset"] = p["predicted"]
        r["error_pct_preset"] = p["error_pct"]
    first = {}
    for i, r in enumerate(rows):
        first.setdefault(r["group"], i)
    rows.sort(key=lambda r: first[r["group"]])  # stable: rows keep their order inside a group
    group = None
    print(f"{'quantity':56s} {'measured':>10s} {'n':>2s} {'spread of runs':>19s} {'predicted':>10s} {'err %':>7s} "
          f"{'preset':>10s} {'err %':>7s}")
    for r in rows:
        if r["group"] != group:
            group = r["group"]
            print(f"--- {group}")
        spread = (f"{_fmt(r['spread'][0], r['unit'])}..{_fmt(r['spread'][1], r['unit'])}" if r.get("spread") else "")
        print(f"{r['quantity'][:56]:56s} {_fmt(r['measured'], r['unit']):>10s} {r.get('n', 1):>2d} {spread:>19s} "
              f"{_fmt(r['predicted'], r['unit']):>10s} {r['error_pct']:7.1f} {_fmt(r['predicted_preset'], r['unit']):>10s} "
              f"{r['error_pct_preset']:7.1f}")
    judged = [r for r in rows if r["group"] != "hardware"]
    within = [r for r in judged if abs(r["error_pct"]) <= 10]
    spread_only = [r for r in judged if abs(r["error_pct"]) > 10 and r.get("within_spread")]
    print(f"{len(within)}/{len(judged)} predictions within 10 % with the measured profile ({args.hardware}); "
          f"{len(spread_only)} more inside the range of the repeated measurements")
    for r in judged:
        if abs(r["error_pct"]) > 10 and not r.get("within_spread"):
            print(f"  outside both: {r['group']}: {r['quantity']} ({r['error_pct']:+.1f} %)")
    if args.json:
        Path(args.json).write_text(json.dumps({"hardware": args.hardware, "preset": args.preset, "rows": rows},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
