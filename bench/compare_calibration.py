"""Measured on the H200 vs predicted by vime's simulator: one table of quantity, measured, predicted, error % (issue 12).

Runs on a CPU from the raw JSON kept in bench/data (no GPU needed):

    python bench/compare_calibration.py                       # table on stdout
    python bench/compare_calibration.py --json bench/data/h200_comparison.json

Predictions come from the simulator's own models (vime.sim): the engine's `IterationModel`
(GPU roofline per iteration, host-bound floor, output head once per request), `ModelSpec` FLOPs /
bytes, the trainer's fwd/bwd/optimizer and memory formulas (`vime.sim.trainer.compute_seconds`,
`score_bytes`, `optimizer_step_bytes`), the engine's sleep/wake and bucket costs and the
allocators' (persistent vs cold pinned buffers), evaluated with two hardware profiles: the
measured preset H200-141G-measured (vime/sim/data/hardware/, with its provenance; it describes the
software of the runs too: unfused attention, bf16 grads, torch AdamW) and the datasheet preset
H200-141G. Error % = (predicted - measured) / measured.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vime.sim.engine import EngineSettings, IterationModel  # noqa: E402
from vime.sim.hardware import HardwareSpec, load_hardware  # noqa: E402
from vime.sim.models import ModelSpec, load_model  # noqa: E402
from vime.sim.trainer import (  # noqa: E402
    OPTIMIZER_BYTES,
    PARAM_BYTES,
    compute_seconds,
    grad_bytes,
    optimizer_step_bytes,
    score_bytes,
    streaming_bytes_per_s,
)

GIB = 1 << 30
DATA = ROOT / "bench" / "data"


def _iter_model(hw: HardwareSpec, model: ModelSpec, **kw) -> IterationModel:
    settings = EngineSettings(**{"max_model_len": 20480, "max_num_seqs": 256, "max_num_batched_tokens": 8192, **kw})
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


def decode_run_seconds(im: IterationModel, batch: int, prompt: int, new: int) -> float:
    """B requests of `prompt` tokens each generating `new` tokens in lockstep (prefill then decode).

    The prefill iteration samples each request's first token, so `new - 1` decode iterations follow.
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
    return t


def rows_for(hw: HardwareSpec, raw: dict, vllm: dict | None) -> list[dict]:
    rows: list[dict] = []

    def add(group: str, quantity: str, measured: float, predicted: float, unit: str, note: str = "") -> None:
        rows.append({"group": group, "quantity": quantity, "measured": measured, "predicted": predicted,
                     "unit": unit, "error_pct": 100.0 * (predicted - measured) / measured if measured else None,
                     "note": note})

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
    im = _iter_model(hw, m4)
    for r in raw.get("decode", {}).get("rows", []):
        b, length = r["batch"], r["context"]
        pred = im.gpu_time(b, b * length, b * length) - im.overhead_s  # no scheduler: GPU part only
        add("decode workload (PyTorch, CUDA graph, Qwen3-4B shapes)", f"step B={b} L={length}", r["step_s"], pred, "s")
    for r in raw.get("prefill", {}).get("rows", []):
        t = r["tokens"]
        pred = im.gpu_time(t, 0, t * (t + 1) / 2, seqs=1) - im.overhead_s
        add("prefill workload (PyTorch, flash attention, Qwen3-4B shapes)", f"prompt {t}", r["median_s"], pred, "s",
            "output head once per sequence (ModelSpec.prefill_flops)")

    # --- Megatron step ---------------------------------------------------------------------------
    runs = [r.get("result") or {} for r in raw.get("megatron", {}).get("runs", [])]
    for res in runs:
        if not res.get("ok") or res.get("device") != "cuda":
            continue
        spec = load_model({"qwen3-1.7b": "Qwen3-1.7B", "qwen3-0.6b": "Qwen3-0.6B", "qwen3-4b": "Qwen3-4B"}[res["preset"]])
        params = spec.num_params()
        tag = " (state in vime CuMem regions)" if res.get("cumem") else ""
        for e in res["shapes"]:
            mbs, seq = e["mbs"], e["seq"]
            lengths = [seq] * mbs
            fwd, bwd = compute_seconds(spec, hw, lengths)
            q = f"{res['preset']} mbs={mbs} seq={seq}{tag}"
            add("Megatron-core step (local spec, 1 GPU)", f"fwd {q}", e["fwd_s_median"], fwd, "s")
            add("Megatron-core step (local spec, 1 GPU)", f"bwd {q}", e["bwd_s_median"], bwd, "s")
            opt = params * optimizer_step_bytes(hw) / streaming_bytes_per_s(hw)
            add("Megatron-core step (local spec, 1 GPU)", f"optimizer {q}", e["opt_s_median"], opt, "s",
                f"{hw.software.train_optimizer} optimizer: {optimizer_step_bytes(hw)} B/param")
            tokens = mbs * seq
            act = spec.activation_bytes_per_token(1, 1, "none", sequence_parallel=False) * tokens
            scores = score_bytes(spec, hw, lengths)
            state = params * (PARAM_BYTES + grad_bytes(hw) + OPTIMIZER_BYTES)
            add("Megatron-core step (local spec, 1 GPU)", f"peak allocated {q}", e["peak_allocated_bytes"],
                state + act + scores, "B",
                f"{hw.software.train_attention} attention ({scores / GIB:.1f} GiB of s^2 scores), "
                f"{grad_bytes(hw)}-byte grads")
        for c in res.get("cumem_cycles", []):
            p, w = c["pause"], c["resume"]
            add("vime CuMem on real Megatron state", f"pause cycle {c['cycle']} ({p['copied_bytes'] / GIB:.1f} GiB kept)",
                p["seconds"], _pause(hw, p["copied_bytes"], p["released_bytes"], p["host_alloc_bytes"]), "s")
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
            add(f"pause/resume ({mode} pinned buffers)", f"pause {q}", c["pause_s"], _pause(hw, kept, total, alloc), "s")
            add(f"pause/resume ({mode} pinned buffers)", f"resume {q}", c["resume_s"],
                _resume(hw, kept, total, cold=mode == "cold"), "s")

    # --- real vLLM 0.25.1 -----------------------------------------------------------------------------
    if vllm:
        ph = vllm.get("phases", {})
        settings = EngineSettings(max_model_len=20480)
        for r in ph.get("decode", []):
            pred = decode_run_seconds(im, r["batch"], r["prompt_len"], r["max_tokens"])
            add("vLLM 0.25.1 (Qwen3-4B shapes, random weights)", f"generate B={r['batch']} x {r['max_tokens']} tokens",
                r["wall_s"], pred, "s")
        seen = set()
        for r in ph.get("prefill", []):
            if r["prompt_len"] in seen:
                continue
            same = [x["wall_s"] for x in ph["prefill"] if x["prompt_len"] == r["prompt_len"]]
            seen.add(r["prompt_len"])
            add("vLLM 0.25.1 (Qwen3-4B shapes, random weights)", f"prefill {r['prompt_len']} tokens, max_tokens 1",
                min(same), prefill_seconds(im, r["prompt_len"]), "s",
                "the prefill samples the only token; vLLM's per-request front end (HTTP, engine-core IPC) is not modelled")
        wbytes = vllm.get("weight_bytes", m4.weight_bytes())
        tensors = len(m4.hf_weight_shapes())  # one allocation each in vLLM's backup loop
        for row in ph.get("sleep_l1", []):
            c = row["cycle"]
            kv = row["free_asleep"] - row["free_awake"] - wbytes
            # Persistent pinned pool: only the first sleep pins (PyTorch's caching host allocator keeps it).
            pin = wbytes if c == 0 else 0
            add("vLLM sleep/wake", f"sleep level 1, cycle {c}", row["sleep_s"],
                _pause(hw, wbytes, wbytes + kv, pin) + settings.sleep_call_s + settings.sleep_per_tensor_s * tensors,
                "s", "pins host memory on the first sleep only; + call and per-tensor costs (EngineSettings)")
            add("vLLM sleep/wake", f"wake weights (L1), cycle {c}", row["wake_weights_s"],
                _resume(hw, wbytes, wbytes) + settings.wake_call_s + settings.wake_per_tensor_s * tensors, "s")
            add("vLLM sleep/wake", f"wake kv_cache (L1), cycle {c}", row["wake_kv_s"],
                _resume(hw, 0, kv) + settings.wake_call_s, "s")
        for row in ph.get("sleep_l2_ipc", []):
            c = row["cycle"]
            released = row["free_asleep"] - row["free_awake"]
            add("vLLM sleep/wake", f"sleep level 2, cycle {c}", row["sleep_s"],
                _pause(hw, 0, released, 0) + settings.sleep_call_s, "s")
            sizes = vllm.get("buckets", {}).get("sizes", [])
            per = [settings.http_rtt_s + settings.ipc_open_s + 25 * settings.load_per_tensor_s
                   + 2 * n / hw.decode_bytes_per_s for n in sizes]
            add("vLLM IPC weight update", f"16 buckets, start..finish, cycle {c}", row["update_total_s"],
                sum(per) + 2 * settings.http_rtt_s, "s", "EngineSettings.bucket_seconds with ~25 tensors per bucket")
    return rows


def _pause(hw: HardwareSpec, copy: float, unmap: float, alloc: float) -> float:
    """SimAllocator._sleep_costs: pinned allocation + copy at d2h + unmap/release per GiB."""
    return (alloc / GIB * hw.vmm.pinned_alloc_s_per_gib + copy / hw.d2h_bytes_per_s
            + unmap / GIB * hw.vmm.unmap_release_s_per_gib)


def _resume(hw: HardwareSpec, copy: float, mapped: float, cold: bool = False) -> float:
    """SimAllocator._wake_costs: create/map per GiB + copy at h2d (+ freeing the host buffer when cold)."""
    free = copy / GIB * hw.vmm.pinned_free_s_per_gib if cold else 0.0
    return mapped / GIB * hw.vmm.create_map_s_per_gib + copy / hw.h2d_bytes_per_s + free


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
    ap.add_argument("--vllm", default=str(DATA / "h200_vllm_0.25.1.json"))
    ap.add_argument("--hardware", default="H200-141G-measured",
                    help="measured profile: a preset name or a JSON file (bench/calibrate.py --profile writes one)")
    ap.add_argument("--preset", default="H200-141G", help="datasheet preset to compare with")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args()
    raw = json.loads(Path(args.raw).read_text())
    vllm = json.loads(Path(args.vllm).read_text()) if args.vllm and Path(args.vllm).exists() else None
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
    print(f"{'quantity':58s} {'measured':>12s} {'predicted':>12s} {'err %':>8s} {'preset':>12s} {'err %':>8s}")
    for r in rows:
        if r["group"] != group:
            group = r["group"]
            print(f"--- {group}")
        print(f"{r['quantity'][:58]:58s} {_fmt(r['measured'], r['unit']):>12s} {_fmt(r['predicted'], r['unit']):>12s} "
              f"{r['error_pct']:8.1f} {_fmt(r['predicted_preset'], r['unit']):>12s} {r['error_pct_preset']:8.1f}")
    within = [r for r in rows if r["group"] != "hardware" and abs(r["error_pct"]) <= 10]
    judged = [r for r in rows if r["group"] != "hardware"]
    print(f"{len(within)}/{len(judged)} predictions within 10 % with the measured profile ({args.hardware})")
    if args.json:
        Path(args.json).write_text(json.dumps({"hardware": args.hardware, "preset": args.preset, "rows": rows},
                                              indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
