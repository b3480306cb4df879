"""vLLM's dense decode step against the engine model's GEMM roofline: the structures tried on every dense bench row.

A decode step's GPU time, past its fixed part and the sampler, is the linear layers (their weights streamed, or
their FLOPs) and the attention (its KV read, or its FLOPs). The structures, each over every dense
`scripts/h200/vllm_bench.py` row of both chips: vLLM's own mean inter-token latency against the model's of the row
scheduled as vLLM schedules it (`compare_calibration.decode_schedule`; at 192+ requests of 128-token prompts the
early requests decode beside the later prompts' prefill chunks, which the latency holds):

- ``joint``: max(weights + KV, GEMM FLOPs + attention FLOPs), the model before the thirty-first session;
- ``serial``: max(weights, GEMM FLOPs) + max(KV, attention FLOPs), the GEMMs and the attention as separate kernels;
- ``serial p=P``: the GEMMs' two roofs as a p-norm, (w^P + f^P)^(1/P) (efficiency.gemm_roofline_p);
- ``serial M/(M+H)``: the GEMMs' FLOPs at M / (M + H) of the prefill rate for M rows, the larger roof taken.

Each serial structure comes with its own attention KV rate and sampler, refitted as `fit_whole_step.py` section 0
fits them (the H200 whole steps' GPU-bound decode); `joint` keeps the values it was committed with and is
scheduled the same way (until the thirty-second session's review it was judged on pure decode means). P and H are
chosen on the H200's first 14B/32B benches (rows at B >= 64) and judged on the rows not fitted on: the H100's
8B/14B/32B and both chips' later grids (each predicted before it ran). The H100's KV rate and sampler are the
H200's scaled by the two chips' copy rates, as its profile carries them (`--verbatim-kv`: as they were before the
thirty-second session). The 4B and 0.6B rows are the CPU step on most hosts (a floor per machine), listed apart.

    python bench/decode_roofline.py > bench/data/vllm_bench_s32/decode_roofline.txt
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import fit_whole_step  # noqa: E402
from compare_calibration import _iter_model, decode_schedule  # noqa: E402

from vime.sim.engine.costs import IterationModel  # noqa: E402
from vime.sim.hardware import HardwareSpec  # noqa: E402

DATA = ROOT / "bench" / "data"
HARDWARE = ROOT / "vime" / "sim" / "data" / "hardware"
PROFILES = {"H200": "H200-141G-measured", "H100": "H100-SXM-80G-measured"}
#: (chip, bench) of every dense vLLM-alone bench with vLLM's own step per row
BENCHES = (("H100", "vllm_bench_s29/vllm_4b_h100.json"), ("H100", "vllm_bench_s29/vllm_8b_h100.json"),
           ("H100", "vllm_bench_s30/vllm_14b_h100.json"), ("H100", "vllm_bench_s30/vllm_32b_h100.json"),
           ("H200", "vllm_bench_s31/vllm_14b_h200.json"), ("H200", "vllm_bench_s31/vllm_32b_h200.json"),
           ("H200", "vllm_bench_s31/vllm_14b_grid_h200.json"),
           ("H200", "h200_vllm_0.25.1_b1.json"), ("H200", "h200_vllm_0.25.1_b2.json"),
           ("H200", "vllm_bench_s15/vllm_4b_s15.json"),
           ("H100", "vllm_bench_s32/vllm_14b_grid_h100.json"), ("H100", "vllm_bench_s32/vllm_32b_grid_h100.json"),
           ("H100", "vllm_bench_s32/vllm_06b_grid_h100.json"))
#: chosen on: the H200's 14B/32B rows at B >= 64 of the thirty-first session's first benches
FIT_FILES = ("vllm_bench_s31/vllm_14b_h200.json", "vllm_bench_s31/vllm_32b_h200.json")
PROMPT = 128  # vllm_bench.py's decode prompts
SCALE_KV = "--verbatim-kv" not in sys.argv  # the thirty-first session's carry: the H200's rates on the H100 as they are
#: the joint structure's section-0 values as committed under it (thirtieth session)
JOINT_TERMS = {"engine.kv_read_bytes_per_s": 4.73e12, "engine.sample_s_per_logit": 8.5e-11}
CANDIDATES = ([("joint", 0.0), ("serial", 0.0)] + [("p", p) for p in (1.5, 2.0, 2.25, 2.5, 3.0, 4.0)]
              + [("M", h) for h in (32, 48, 64, 72, 80, 96)])


def fitted(row: dict) -> bool:
    return row["bench"] in FIT_FILES and row["batch"] >= 64


def held_out(row: dict) -> bool:
    """Dense rows at B >= 64 not fitted on: the H100's 8B/14B/32B (its grids to 512 requests of the thirty-second session
    among them), the H200's 14B grid (each grid predicted before it ran)."""
    return not fitted(row) and row["preset"] in ("qwen3-8b", "qwen3-14b", "qwen3-32b") and row["batch"] >= 64


def label(structure: str, value: float) -> str:
    return {"p": f"serial p={value:g}", "M": f"serial M/(M+{value:g})"}.get(structure, structure)


@contextlib.contextmanager
def gemm_structure(structure: str, value: float) -> Iterator[None]:
    """IterationModel as `structure` has it: p-norms are the model's own; M/(M+H) patches its gemm_time, `joint` its
    gpu_time (max(weights + KV, GEMM + attention FLOPs), the model before the thirty-first session)."""
    if structure not in ("M", "joint"):
        yield
        return

    def rows_half(self: IterationModel, tokens: int, seqs: int) -> float:
        comp = (self.flops_base * tokens + self.flops_head * seqs) / self.tp / self.flops_per_s
        return max(self._weights_s(tokens), comp * (1.0 + value / max(tokens, 1)))

    def joint(self: IterationModel, tokens: int, kv_read_tokens: float, attn_ctx: float, seqs: int | None = None) -> float:
        seqs = tokens if seqs is None else seqs
        kv = self.kv_bytes_per_token * kv_read_tokens / (self.kv_bytes_per_s or self.bytes_per_s)
        flops = (self.flops_base * tokens + self.flops_head * seqs + self.flops_per_ctx * attn_ctx) / self.tp / self.flops_per_s
        return self.fixed(tokens) + self.sample_s * seqs + max(self._weights_s(tokens) + kv, flops)

    name, patch = ("gemm_time", rows_half) if structure == "M" else ("gpu_time", joint)
    original = getattr(IterationModel, name)
    setattr(IterationModel, name, patch)
    try:
        yield
    finally:
        setattr(IterationModel, name, original)


def profiles(structure: str, value: float) -> dict[str, dict]:
    """Both chips' profiles under a structure: its p, and the section-0 terms refitted under it (the H100's are the
    H200's, as bench/h100_measured_preset.py carries them)."""
    raw = {chip: json.loads((HARDWARE / f"{name}.json").read_text()) for chip, name in PROFILES.items()}
    for prof in raw.values():
        prof["efficiency"]["gemm_roofline_p"] = value if structure == "p" else 0.0
    if structure == "joint":
        terms = JOINT_TERMS
    else:
        terms, _ = fit_whole_step.gpu_step_terms(copy.deepcopy(raw["H200"]))
    for prof in raw.values():
        # scaled to each chip's copy rate, as bench/h100_measured_preset.py carries them (SCALE_KV off: verbatim)
        ratio = prof["hbm_bytes_per_s"] / raw["H200"]["hbm_bytes_per_s"] if SCALE_KV else 1.0
        for key, v in terms.items():
            field = key.split(".", 1)[1]
            prof["engine"][field] = v * ratio if field == "kv_read_bytes_per_s" else v / ratio
    return raw


def step_seconds(im: IterationModel, batch: int, tokens: int) -> float:
    """The model's vLLM step of a row as vLLM's /metrics count it (prompt 128, `tokens` new each): the mean
    inter-token latency of the row scheduled as vLLM schedules it (`decode_schedule`: the early requests decode
    beside the later prompts' prefill chunks)."""
    return decode_schedule(im, batch, PROMPT, tokens)[1]


def bench_rows() -> list[dict]:
    out = []
    for chip, rel in BENCHES:
        run = json.loads((DATA / rel).read_text())
        for r in run["phases"]["decode"]:
            if r.get("itl_mean_s"):
                out.append({"chip": chip, "bench": rel, "preset": run["preset"], "batch": r["batch"],
                            "tokens": r["max_tokens"], "measured_s": r["itl_mean_s"]})
    return out


def predict(rows: list[dict], structure: str, value: float) -> list[float]:
    """Each row's modelled step under the structure (its own section-0 terms); relative errors (%) returned, the
    predictions left in row[label]."""
    ims: dict[tuple[str, str], IterationModel] = {}
    errs = []
    with gemm_structure(structure, value):
        raw = profiles(structure, value)
        for row in rows:
            key = (row["chip"], row["preset"])
            if key not in ims:
                hw = HardwareSpec.from_dict(raw[row["chip"]], origin=PROFILES[row["chip"]])
                ims[key] = _iter_model(hw, fit_whole_step.model_of(row["preset"]))
            pred = step_seconds(ims[key], row["batch"], row["tokens"])
            row[label(structure, value)] = pred
            errs.append(100.0 * (pred - row["measured_s"]) / row["measured_s"])
    return errs


def rms(errs: list[float]) -> float:
    return math.sqrt(sum(e * e for e in errs) / len(errs))


def main() -> int:
    rows = bench_rows()
    fit_rows, held_rows = [r for r in rows if fitted(r)], [r for r in rows if held_out(r)]
    print(f"{len(fit_rows)} fitted rows (the H200's 14B/32B at B >= 64), {len(held_rows)} held out (the H100's "
          f"8B/14B/32B, both chips' later grids; B >= 64); each row vLLM's mean inter-token latency against the "
          f"model's of the row as vLLM schedules it; the H100's KV rate and sampler "
          f"{'scaled to its copy rate' if SCALE_KV else 'the H200s verbatim (--verbatim-kv)'}")
    best: dict[str, tuple[float, float]] = {}
    for structure, value in CANDIDATES:
        with gemm_structure(structure, value):
            terms = profiles(structure, value)["H200"]["engine"]
        a, b = predict(fit_rows, structure, value), predict(held_rows, structure, value)
        if structure in ("p", "M") and rms(a) < best.get(structure, (math.inf, 0.0))[0]:
            best[structure] = (rms(a), value)
        print(f"  {label(structure, value):18s} KV {terms['kv_read_bytes_per_s'] / 1e12:.2f} TB/s, sampler "
              f"{terms['sample_s_per_logit'] * 1e12:5.1f} ps | fitted rms {rms(a):5.1f} %, max {max(map(abs, a)):5.1f} % "
              f"| held out rms {rms(b):5.1f} %, max {max(map(abs, b)):5.1f} %")
    shown = [("joint", 0.0), ("serial", 0.0), ("p", best["p"][1]), ("M", best["M"][1])]
    print("\nevery row (vLLM's step, ms), error of each structure at its best value on the fitted rows:")
    for structure, value in shown:
        predict(rows, structure, value)
    for r in rows:
        m = r["measured_s"]
        tag = "fitted" if fitted(r) else "held out" if held_out(r) else "CPU step" if r["preset"] in ("qwen3-4b", "qwen3-0.6b") else "B < 64"
        cells = "  ".join(f"{100 * (r[label(s, v)] - m) / m:+6.1f}" for s, v in shown)
        print(f"  {r['chip']} {r['preset']:10s} B={r['batch']:3d} x {r['tokens']:4d}  measured {1e3 * m:6.2f}  {cells}  "
              f"[{tag}]")
    print("  (columns: " + ", ".join(label(s, v) for s, v in shown) + ")")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
