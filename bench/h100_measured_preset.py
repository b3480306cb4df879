"""Builds the H100-SXM-80G-measured preset: vime's own stack on an H100, from the session-25 hypothesis profile and the H100's own GEMM sweep.

    python bench/h100_measured_preset.py           # write vime/sim/data/hardware/H100-SXM-80G-measured.json
    python bench/h100_measured_preset.py --check   # exit 1 unless the committed preset is what this builds

The hypothesis (`bench/data/h100_calibration_s25/H100-vime-stack.json`, committed before any H100 whole step) is the
H200-141G-measured profile, i.e. vime's local-spec Megatron and vLLM 0.25.1 fitted on an H200, with every chip field a
lent H100 measured (memory, GEMM peak, HBM copy, host link, decode and prefill, VMM and pinning, eager launches). Its
whole-step prediction of the 0.6B micro-batch-4 run held on the H100 (T_step -5.8 %, the actor's pass 0.0 %,
peak memory +1.1 %: `bench/data/h200_notes.md`, twenty-sixth session). The preset adds the two chip fields the
hypothesis had left at the H200's: the dense GEMM rate and the fixed time per matmul kernel from the H100's own
`bench/gemm_train_sweep.py` rows. The trainer's host floors, the engine's software costs and the calibration spread stay
the H200's (same host class, same software); their sources say so.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from calibrate import _fit_gemm  # noqa: E402

DATA = ROOT / "bench" / "data" / "h100_calibration_s25"
HYPOTHESIS = DATA / "H100-vime-stack.json"
SWEEP = DATA / "h100_gemm_train_sweep_2026-12-05s25.json"
RAW = DATA / "h100_calibration.json"
DATASHEET = ROOT / "vime" / "sim" / "data" / "hardware" / "H100-SXM-80G.json"
PRESET = ROOT / "vime" / "sim" / "data" / "hardware" / "H100-SXM-80G-measured.json"
H200 = ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G-measured.json"
EMPTY_CACHE = ROOT / "bench" / "data" / "empty_cache_rate.json"
NAME = "H100-SXM-80G-measured"
# the fields the H100 measured itself (the hypothesis's sources start "H100:") or the preset fits here
OWN_PREFIX = "H100:"


def build() -> dict:
    prof = json.loads(HYPOTHESIS.read_text())
    sheet = json.loads(DATASHEET.read_text())
    env = json.loads(RAW.read_text())["env"]
    sweep = json.loads(SWEEP.read_text())
    rate, call = _fit_gemm(sweep["rows"])
    prof["name"] = NAME
    prof["description"] = (
        "NVIDIA H100 80GB HBM3 running vime's own stack (local-spec Megatron-core without TransformerEngine, vLLM "
        "0.25.1 with CUDA graphs): the chip as measured on one lent H100 (2026-12-05), the software's costs as measured "
        "on the H200 (the same GH100 die and host class); held out on one H100 whole step (bench/h100_measured_preset.py)")
    prof["provenance"] = {
        "machine": f"{env['gpu']} ({env['nvidia_smi']}), sm_count {env['sm_count']}, capability {env['capability']}, "
                   f"host '{env['host']}' with {env['cpu_count']} CPUs and {env['meminfo_total']} B RAM",
        "driver": env["driver"],
        "software": f"torch {env['torch']} (CUDA {env['torch_cuda']}), Python {env['python']}",
        "date": f"{env['date']} (calibrate.py, gemm_train_sweep.py); the whole step 2026-12-05 14:03 UTC",
        "command": f"{env['command']}; bench/gemm_train_sweep.py --out bench/data/h100_calibration_s25/{SWEEP.name}",
        "derived": f"python bench/h100_measured_preset.py (from {HYPOTHESIS.relative_to(ROOT)}, the pre-registered "
                   f"hypothesis, and the GEMM fit of {SWEEP.relative_to(ROOT)})",
    }
    eff, src = prof["efficiency"], prof["sources"]
    eff["train_mfu"] = rate / prof["bf16_flops"]
    eff["train_gemm_call_s"] = call
    rows = f"{len(sweep['rows'])} GEMMs of bench/gemm_train_sweep.py on an {sweep['device']} (torch {sweep['torch']})"
    src["efficiency.train_mfu"] = (f"{OWN_PREFIX} fit: the dense GEMM rate ({rate / 1e12:.0f} TFLOP/s over bf16_flops), "
                                   f"t = FLOPs / rate + a fixed time per kernel, least squares of the relative error, "
                                   f"{rows}, {SWEEP.relative_to(ROOT)}")
    src["efficiency.train_gemm_call_s"] = (f"{OWN_PREFIX} fit with train_mfu: the fixed time per matmul kernel "
                                           f"({call * 1e6:.1f} us), {rows}, {SWEEP.relative_to(ROOT)}")
    # vime's trainer runs the experts one by one: no grouped GEMM, no row dependence (as H200-141G-measured)
    eff["train_expert_rows_half"] = 0.0
    src["efficiency.train_expert_rows_half"] = json.loads(H200.read_text())["sources"]["efficiency.train_expert_rows_half"]
    # the trainer's first-step residue: since the 27th session a base under footprint.step_residue_bytes's terms
    h200 = json.loads(H200.read_text())
    prof["software"]["train_step_residue_bytes"] = h200["software"]["train_step_residue_bytes"]
    src["software.train_step_residue_bytes"] = h200["sources"]["software.train_step_residue_bytes"]
    # vLLM 0.25.1's memory picture since the 28th session: context and graphs beside the budget, the rest re-fitted
    for k in ("outside_budget_bytes", "graphs_beside_budget"):
        prof["engine"][k] = h200["engine"][k]
        src[f"engine.{k}"] = h200["sources"][f"engine.{k}"]
    # vLLM's decode step since the 29th session (fit_whole_step.py section 0a): the weights at the chip's own copy rate
    # beside a fixed GPU part (per layer since the 30th), the GEMMs' smooth roofline (31st), the attention's KV read and
    # the sampler refitted under them
    for k in ("decode_weight_bw_util", "iteration_overhead_s", "iteration_layer_s", "gemm_roofline_p"):
        eff[k] = h200["efficiency"][k]
        src[f"efficiency.{k}"] = h200["sources"][f"efficiency.{k}"]
    # the attention's KV read and the sampler's passes over the logits stream HBM: carried as shares of the chip's
    # own copy rate, not as the H200's absolute figures (4.32 TB/s would be above this chip's peak)
    ratio = prof["hbm_bytes_per_s"] / h200["hbm_bytes_per_s"]
    for k, v in (("kv_read_bytes_per_s", h200["engine"]["kv_read_bytes_per_s"] * ratio),
                 ("sample_s_per_logit", h200["engine"]["sample_s_per_logit"] / ratio)):
        prof["engine"][k] = float(f"{v:.4g}")
        src[f"engine.{k}"] = (f"{OWN_PREFIX} the H200's, scaled by the two chips' measured copy rates ({ratio:.4f}: "
                              f"a bandwidth-bound kernel; vLLM's paged decode attention on this H100 read 2.7-2.9 TB/s "
                              f"at 1088-token contexts, bench/data/vllm_bench_s32/decode_attention_h100.json): "
                              + h200["sources"][f"engine.{k}"])
    # the trainer's empty_cache: the H100's own whole steps' sleeps (bench/empty_cache_rate.py), not the VMM rate
    rates = json.loads(EMPTY_CACHE.read_text())
    n = sum(len(v) for k, v in rates["runs"].items() if "h100" in k)
    prof["vmm"]["empty_cache_s_per_gib"] = round(rates["median_s_per_gib"]["H100"], 7)
    src["vmm.empty_cache_s_per_gib"] = (f"{OWN_PREFIX} median over {n} trainer sleeps of the H100 whole steps: the "
                                        f"sleep's timed empty_cache over the torch cache it handed back "
                                        f"(bench/empty_cache_rate.py, {EMPTY_CACHE.relative_to(ROOT)})")
    for q in ("whole_step_rollout_memory", "whole_step_train_memory"):  # the same software's memory model
        prof["spread"][q] = dict(h200["spread"][q], source="H200-141G-measured's (the same software's memory model; "
                                 "the H100's own whole steps are checked against it in tests/bench/"
                                 "test_h100_measured_preset.py): " + h200["spread"][q]["source"])
    for key in ("nvlink_bytes_per_s", "internode_bytes_per_s"):  # the H100 board's datasheet, not the H200's
        src[key] = sheet["sources"][key]
    for key, text in list(src.items()):
        if not text.startswith(OWN_PREFIX) and key not in ("nvlink_bytes_per_s", "internode_bytes_per_s",
                                                            "cuda_context_bytes"):
            src[key] = f"H200-141G-measured's (vime's software on the same Hopper die and host class): {text}"
    return prof


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 unless the committed preset is what this builds")
    args = ap.parse_args()
    text = json.dumps(build(), indent=2) + "\n"
    if args.check:
        same = PRESET.is_file() and PRESET.read_text() == text
        print(f"{PRESET.relative_to(ROOT)}: {'as built' if same else 'differs from what bench/h100_measured_preset.py builds'}")
        return 0 if same else 1
    PRESET.write_text(text)
    print(f"wrote {PRESET.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
