"""The training GEMMs of Qwen3 dense layers on one GPU: forward, input-grad and weight-grad products per shape and token count.

The simulator's trainer takes one GEMM rate (`efficiency.train_mfu`, fitted on Qwen3-1.7B layers); the H200 whole steps
show Qwen3-0.6B layers (hidden 1024) running 5-20 % slower than it (bench/data/h200_notes.md, sixteenth session). This
times the products a layer's linear parts run, so a rate by shape can be fitted and checked:

    python bench/gemm_train_sweep.py --out bench/data/h200_gemm_train_sweep.json
    python bench/gemm_train_sweep.py --predict --out bench/data/h200_gemm_train_sweep_predicted.json   # the model's
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (hidden, heads, kv heads, head dim, ffn) of the dense presets megatron_step.py builds
SHAPES = {"qwen3-0.6b": (1024, 16, 8, 128, 3072), "qwen3-1.7b": (2048, 16, 8, 128, 6144),
          "qwen3-4b": (2560, 32, 8, 128, 9728)}
TOKENS = (1152, 2304, 4608, 9216, 18432)


def mats(preset: str) -> dict[str, tuple[int, int]]:
    """(in, out) features of each linear layer of a block."""
    h, heads, kv, hd, ffn = SHAPES[preset]
    return {"qkv": (h, (heads + 2 * kv) * hd), "o": (heads * hd, h), "gate_up": (h, 2 * ffn), "down": (ffn, h)}


def cuda_timer(repeat: int):
    """f -> (median, min) seconds of `repeat` CUDA-event-timed calls of f after 3 warm-up calls."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def run(f) -> tuple[float, float]:
        for _ in range(3):
            f()
        times = []
        for _ in range(repeat):
            start.record()
            f()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        times.sort()
        return times[len(times) // 2], times[0]
    return run


def measure(repeat: int) -> list[dict]:
    import torch

    dev = torch.device("cuda")
    run = cuda_timer(repeat)
    rows = []
    for preset in SHAPES:
        for op, (k, n) in mats(preset).items():
            w = torch.randn(n, k, device=dev, dtype=torch.bfloat16)  # nn.Linear's [out, in]
            for m in TOKENS:
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                dy = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
                kinds = {"fwd": lambda x=x, w=w: x @ w.t(),          # [m, n]
                         "dgrad": lambda dy=dy, w=w: dy @ w,          # [m, k]
                         "wgrad": lambda dy=dy, x=x: dy.t() @ x}      # [n, k]
                for kind, f in kinds.items():
                    med, low = run(f)
                    rows.append({"preset": preset, "op": op, "kind": kind, "m": m, "k": k, "n": n,
                                 "median_s": med, "min_s": low, "tflops": 2 * m * k * n / med / 1e12})
                del x, dy
            del w
    return rows


def predict() -> list[dict]:
    """The simulator's rate for every row: one GEMM rate whatever the shape (train_mfu x the bf16 peak)."""
    sys.path.insert(0, str(ROOT))
    from vime.sim.hardware import load_hardware

    hw = load_hardware(ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G-measured.json")
    rate = hw.train_flops
    return [{"preset": p, "op": op, "kind": kind, "m": m, "k": k, "n": n, "median_s": 2 * m * k * n / rate,
             "tflops": rate / 1e12}
            for p in SHAPES for op, (k, n) in mats(p).items() for m in TOKENS for kind in ("fwd", "dgrad", "wgrad")]


def write_rows(out: Path, what: str, predicted: bool, make) -> list[dict]:
    """Time `make()`, write its rows to `out` as JSON with the device and torch when measured; the rows."""
    t0 = time.perf_counter()
    rows = make()
    info: dict = {"what": what, "predicted": predicted, "rows": rows, "wall_s": time.perf_counter() - t0}
    if not predicted:
        import torch
        info["device"] = torch.cuda.get_device_name(0)
        info["torch"] = torch.__version__
    out.write_text(json.dumps(info, indent=1) + "\n")
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--predict", action="store_true", help="write the simulator's rows instead (no GPU)")
    args = ap.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    rows = write_rows(args.out, __doc__.splitlines()[0], args.predict, predict if args.predict else
                      lambda: measure(args.repeat))
    for r in rows[:: 15 if len(rows) > 30 else 1]:
        print(f"{r['preset']} {r['op']} {r['kind']} m={r['m']}: {r['median_s'] * 1e6:8.1f} us {r['tflops']:6.1f} TFLOP/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
