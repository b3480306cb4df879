"""The experts' GEMMs of Qwen3 MoE layers on one GPU: grouped (`torch._grouped_mm`), one by one, and a dense GEMM of equal FLOPs.

The simulator charges a MoE layer's expert FLOPs at `efficiency.train_expert_gemm_efficiency` (0.7 on every datasheet
preset, an assumption for Megatron's grouped GEMM on Hopper) of its dense GEMM rate; the published MoE steps (NeMo-RL
Qwen3-30B-A3B / 235B-A22B) come out 24-50 % short. This times, for one EP rank holding `experts` local experts that
each receive `rows` routed tokens (balanced), the SwiGLU expert FFN's two products (fc1: h -> 2f, fc2: f -> h) in their
forward, input-gradient and weight-gradient forms:
  grouped   one `torch._grouped_mm` over all local experts (what Megatron's grouped GEMM / TE's grouped linear do)
  loop      one matmul per expert (what vime's local-spec trainer does)
  dense     one matmul of experts x rows tokens with the same K and N: equal FLOPs, no grouping
and the whole expert block under autograd (`layer`: permute, grouped fc1, SwiGLU, grouped fc2, weighted unpermute,
forward + backward) so the token-proportional work beside the GEMMs shows.
    python bench/moe_gemm.py --out bench/data/moe_gemm/measured_<date>.json
    python bench/moe_gemm.py --predict --out bench/data/moe_gemm/predicted_<date>.json   # the simulator's, no GPU
    python bench/moe_gemm.py --report bench/data/moe_gemm/measured_<date>.json [--rate-profile H100-SXM-80G]  # ratios
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (hidden, expert ffn, experts, top-k) of the MoE presets
SHAPES = {"qwen3-30b-a3b": (2048, 768, 128, 8), "qwen3-235b-a22b": (4096, 1536, 128, 8)}
LOCAL_EXPERTS = (8, 16)
ROWS = (128, 256, 512, 1024, 2048, 4096)
KINDS = ("fwd", "dgrad", "wgrad")


def products(preset: str) -> dict[str, tuple[int, int]]:
    """(K, N) of the expert FFN's two products."""
    h, f, _, _ = SHAPES[preset]
    return {"fc1": (h, 2 * f), "fc2": (f, h)}


def cases():
    for preset in SHAPES:
        for experts in LOCAL_EXPERTS:
            for rows in ROWS:
                yield preset, experts, rows


def gemm_calls(m: int, k: int, n: int, experts: int, dev):
    """{impl: {kind: callable}} for one product of `experts` experts x `m` rows each, K = k, N = n."""
    import torch

    bf = torch.bfloat16
    x = torch.randn(experts * m, k, device=dev, dtype=bf)
    dy = torch.randn(experts * m, n, device=dev, dtype=bf)
    w = torch.randn(experts, k, n, device=dev, dtype=bf) / k ** 0.5
    wt = w.transpose(-2, -1)  # [E, N, K] view, the layout the backward multiplies by
    offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * m
    dense_w = w[0]
    xs, dys = x.split(m), dy.split(m)
    xt = x.t()
    return {
        "grouped": {"fwd": lambda: torch._grouped_mm(x, w, offs=offs),
                    "dgrad": lambda: torch._grouped_mm(dy, wt, offs=offs),
                    "wgrad": lambda: torch._grouped_mm(xt, dy, offs=offs)},
        "loop": {"fwd": lambda: [a @ w[e] for e, a in enumerate(xs)],
                 "dgrad": lambda: [g @ w[e].t() for e, g in enumerate(dys)],
                 "wgrad": lambda: [a.t() @ g for a, g in zip(xs, dys, strict=True)]},
        "dense": {"fwd": lambda: x @ dense_w,
                  "dgrad": lambda: dy @ dense_w.t(),
                  "wgrad": lambda: xt @ dy},
    }


def layer_call(preset: str, experts: int, rows: int, dev):
    """The expert block of one rank under autograd, forward + backward: permute the routed rows into expert order,
    grouped fc1, SwiGLU, grouped fc2, scale by the router's weights, add back into token order."""
    import torch

    h, f, _, k = SHAPES[preset]
    bf = torch.bfloat16
    routed = experts * rows
    tokens = routed // k if routed >= k else routed
    x = torch.randn(tokens, h, device=dev, dtype=bf, requires_grad=True)
    w1 = (torch.randn(experts, h, 2 * f, device=dev, dtype=bf) / h ** 0.5).requires_grad_()
    w2 = (torch.randn(experts, f, h, device=dev, dtype=bf) / f ** 0.5).requires_grad_()
    src = torch.randperm(routed, device=dev) % tokens  # which token each expert-ordered row comes from
    probs = torch.rand(routed, 1, device=dev, dtype=bf)
    offs = torch.arange(1, experts + 1, device=dev, dtype=torch.int32) * rows
    grad = torch.randn(tokens, h, device=dev, dtype=bf)

    def step():
        a = x.index_select(0, src)
        gu = torch._grouped_mm(a, w1, offs=offs)
        g, u = gu.chunk(2, dim=-1)
        y = torch._grouped_mm(torch.nn.functional.silu(g) * u, w2, offs=offs) * probs
        out = torch.zeros(tokens, h, device=dev, dtype=bf).index_add(0, src, y)
        out.backward(grad)
        dx = x.grad
        x.grad = w1.grad = w2.grad = None  # the next pass starts clean, as the first did
        return dx
    return step


def measure(repeat: int) -> list[dict]:
    import torch

    dev = torch.device("cuda")
    sys.path.insert(0, str(ROOT / "bench"))
    from gemm_train_sweep import cuda_timer  # noqa: PLC0415 - the same CUDA-event timing as the dense sweep

    run = cuda_timer(repeat)

    def timed(row: dict, fn) -> dict:
        """`row` with fn's median and min time and rate, or the error a layout this torch refuses gives (a finding)."""
        try:
            med, low = run(fn)
        except Exception as e:  # noqa: BLE001
            return {**row, "error": f"{type(e).__name__}: {e}"[:300]}
        return {**row, "median_s": med, "min_s": low, "tflops": row["flops"] / med / 1e12}

    rows_out = []
    for preset, experts, m in cases():
        for prod, (k, n) in products(preset).items():
            calls = gemm_calls(m, k, n, experts, dev)
            flops = 2 * experts * m * k * n
            for impl, kinds in calls.items():
                for kind, fn in kinds.items():
                    rows_out.append(timed({"preset": preset, "experts": experts, "rows": m, "product": prod,
                                           "impl": impl, "kind": kind, "k": k, "n": n, "flops": flops}, fn))
            del calls
        h, f, _, _ = SHAPES[preset]
        flops = 3 * 2 * experts * m * (h * 2 * f + f * h)  # forward + two backward products of fc1 and fc2
        rows_out.append(timed({"preset": preset, "experts": experts, "rows": m, "product": "block", "impl": "layer",
                               "kind": "fwd+bwd", "flops": flops}, layer_call(preset, experts, m, dev)))
        torch.cuda.empty_cache()
    return rows_out


def predict() -> list[dict]:
    """The simulator's time for every grouped row: the FLOPs at the preset's expert efficiency (times its row factor,
    r / (r + train_expert_rows_half)) x its GEMM rate, plus one kernel's fixed time (`train_gemm_call_s`); the dense rows at the GEMM rate. Both H200 profiles and the H100 are written:
    the datasheet's 0.7 (what the published MoE rows use) and the measured profile's (fitted on vime's one-by-one
    experts, so its grouped row is not a prediction of a grouped kernel)."""
    sys.path.insert(0, str(ROOT))
    from vime.sim.hardware import load_hardware
    from vime.sim.moe import grouped_gemm_row_factor

    out = []
    for name in ("H200-141G", "H200-141G-measured", "H100-SXM-80G"):
        hw = load_hardware(ROOT / "vime" / "sim" / "data" / "hardware" / f"{name}.json")
        rate, eff = hw.train_flops, hw.efficiency.train_expert_gemm_efficiency
        call = hw.efficiency.train_gemm_call_s
        for preset, experts, m in cases():
            for prod, (k, n) in products(preset).items():
                flops = 2 * experts * m * k * n
                grouped = rate * eff * grouped_gemm_row_factor(m, hw.efficiency.train_expert_rows_half)
                for impl, r in (("grouped", grouped), ("dense", rate)):
                    for kind in KINDS:
                        t = flops / r + call
                        out.append({"profile": name, "preset": preset, "experts": experts, "rows": m,
                                    "product": prod, "impl": impl, "kind": kind, "k": k, "n": n, "flops": flops,
                                    "median_s": t, "tflops": flops / t / 1e12})
    return out


def report(path: Path, dense_rate: float) -> str:
    """Per case: grouped TFLOP/s (fc1 + fc2, forward + both gradients), grouped / dense of equal FLOPs, grouped /
    `dense_rate` (the simulator's GEMM rate), one-by-one / grouped time, and the whole block's time over the grouped
    GEMMs' alone."""
    rows = json.loads(path.read_text())["rows"]
    by: dict[tuple, dict[str, float]] = {}
    for r in rows:
        if "median_s" in r:
            d = by.setdefault((r["preset"], r["experts"], r["rows"]), {})
            d[r["impl"]] = d.get(r["impl"], 0.0) + r["median_s"]
            d["flops_" + r["impl"]] = d.get("flops_" + r["impl"], 0.0) + r["flops"]
    lines = [f"{'preset':16} {'E':>3} {'rows':>5} {'grouped TF/s':>12} {'/dense':>7} {'/rate':>6} {'loop/gr':>8} {'block/gr':>9}"]
    for (preset, e, m), d in sorted(by.items()):
        if "grouped" not in d:
            continue
        tf = d["flops_grouped"] / d["grouped"] / 1e12
        cells = [f"{tf:12.1f}", f"{d['dense'] / d['grouped']:7.2f}" if "dense" in d else f"{'-':>7}",
                 f"{tf * 1e12 / dense_rate:6.2f}",
                 f"{d['loop'] / d['grouped']:8.2f}" if "loop" in d else f"{'-':>8}",
                 f"{d['layer'] / d['grouped']:9.2f}" if "layer" in d else f"{'-':>9}"]
        lines.append(f"{preset:16} {e:3d} {m:5d} " + " ".join(cells))
    return "\n".join(lines)


def _grouped_over_dense(path: Path) -> list[tuple[tuple, float]]:
    """Per (preset, experts, rows) case of a measured file: the dense GEMMs' summed time over the grouped GEMMs'."""
    by: dict[tuple, dict[str, float]] = {}
    for r in json.loads(path.read_text())["rows"]:
        if "median_s" in r:
            d = by.setdefault((r["preset"], r["experts"], r["rows"]), {})
            d[r["impl"]] = d.get(r["impl"], 0.0) + r["median_s"]
    return [(case, d["dense"] / d["grouped"]) for case, d in sorted(by.items()) if "dense" in d and "grouped" in d]


def fit_rows(path: Path) -> tuple[float, float, list[tuple[tuple, float, float]]]:
    """(c, r0, [(case, measured, fitted)]): t_dense / t_grouped = c · r / (r + r0) over a measured file's cases (fc1 +
    fc2, forward and both gradients; r rows per expert), least squares in log space, r0 on a 1-row grid."""
    pts = _grouped_over_dense(path)
    best = None
    for r0 in range(0, 2001):
        logs = [math.log(y) - math.log(case[2] / (case[2] + r0)) for case, y in pts]
        lc = sum(logs) / len(logs)
        err = sum((v - lc) ** 2 for v in logs)
        if best is None or err < best[0]:
            best = (err, float(r0), math.exp(lc))
    _, r0, c = best
    return c, r0, [(case, y, c * case[2] / (case[2] + r0)) for case, y in pts]


def check_rows(path: Path, c: float, r0: float) -> str:
    """The median and largest |error| of c · r / (r + r0) against a measured file's grouped / dense ratios."""
    errs = sorted(abs(c * m / (m + r0) / y - 1) for (_, _, m), y in _grouped_over_dense(path))
    return f"{path.name}: median |error| {100 * errs[len(errs) // 2]:.1f} %, max {100 * errs[-1]:.1f} % over {len(errs)} cases"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--report", type=Path, help="print the ratios of a measured file instead")
    ap.add_argument("--rate-profile", default="H200-141G-measured",
                    help="with --report: the profile whose dense GEMM rate the /rate column divides by (H100: a file "
                         "built from bench/data/h100_calibration_s25, or a preset)")
    ap.add_argument("--repeat", type=int, default=9)
    ap.add_argument("--predict", action="store_true", help="write the simulator's rows instead (no GPU)")
    ap.add_argument("--fit-rows", type=Path, nargs="+", metavar="FILE",
                    help="fit grouped / dense = c·r/(r + r0) on the first measured file, check it on the others")
    args = ap.parse_args(argv)
    if args.fit_rows:
        c, r0, _ = fit_rows(args.fit_rows[0])
        print(f"grouped / dense = {c:.3f} r / (r + {r0:.0f}), fitted on {args.fit_rows[0].name}")
        for path in args.fit_rows:
            print("  " + check_rows(path, c, r0))
        return 0
    if args.report:
        sys.path.insert(0, str(ROOT))
        from vime.sim.hardware import load_hardware

        hw = load_hardware(args.rate_profile)
        print(f"/rate: over {hw.name}'s dense training rate, {hw.train_flops / 1e12:.0f} TFLOP/s")
        print(report(args.report, hw.train_flops))
        return 0
    if args.out is None:
        ap.error("--out is required unless --report")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, str(ROOT / "bench"))
    from gemm_train_sweep import write_rows  # noqa: PLC0415 - the dense sweep's file format

    rows = write_rows(args.out, __doc__.splitlines()[0], args.predict, predict if args.predict else
                      lambda: measure(args.repeat))
    for r in rows:
        if r.get("impl") in ("grouped", "layer") and r["experts"] == 16 and r.get("profile", "H200-141G") == "H200-141G":
            tf = f"{r['tflops']:6.1f} TFLOP/s" if "tflops" in r else r.get("error", "")
            print(f"{r['preset']} E={r['experts']} rows={r['rows']} {r['product']} {r['impl']} {r['kind']}: {tf}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
