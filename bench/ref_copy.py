"""How long the KL reference's copy-in takes under --ref-placement host: per tensor vs one flat copy, cold vs warm allocator.

The 4B KL runs of 2026-12-05 measured the host-placed reference's forward 0.67 s longer than the
GPU-placed one's, where the simulator charged bytes / pinned h2d (0.14 s for 7.5 GiB). The real
trainer copies each parameter on its own (`ReferenceModel._on`: one allocation and one copy per
tensor, ~400 for the 4B). Each case runs in a fresh process so the caching allocator starts empty
as it does after a wake (the trainer's cache outside the sleeping region is emptied at sleep):
  per_tensor   each pinned view `.to(cuda, non_blocking=True)`, then one synchronize
  flat         the one pinned buffer `.to(cuda, non_blocking=True)`, views cut from the GPU copy
  alloc_only   the per-tensor allocations alone (`torch.empty` on the GPU, no copy)
each timed cold (first in the process) and warm (again after dropping the copies: blocks cached).
Usage: python bench/ref_copy.py [--model qwen3-4b|qwen3-0.6b] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

SHAPES = {  # (hidden, ffn, layers, q heads, kv heads, head dim, vocab, tied)
    "qwen3-4b": (2560, 9728, 36, 32, 8, 128, 151936, True),
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936, True),
}


def param_shapes(model: str) -> list[tuple[int, ...]]:
    """Megatron's parameters of one TP-1 rank of `model` (fused QKV and gate/up, q/k norms)."""
    h, f, n, qh, kvh, d, v, tied = SHAPES[model]
    out: list[tuple[int, ...]] = [(v, h)]
    for _ in range(n):
        out += [(h,), ((qh + 2 * kvh) * d, h), (d,), (d,), (h, qh * d), (h,), (2 * f, h), (h, f)]
    out += [(h,)] + ([] if tied else [(v, h)])
    return out


def one(model: str, method: str) -> dict:
    import torch
    shapes = param_shapes(model)
    sizes = [int(torch.Size(s).numel()) * 2 for s in shapes]
    offsets, end = [], 0
    for b in sizes:
        end = -(-end // 256) * 256
        offsets.append(end)
        end += b
    flat = torch.empty(end, dtype=torch.uint8, pin_memory=True)
    flat.fill_(1)
    views = [flat[o:o + b].view(torch.bfloat16).view(s) for o, b, s in zip(offsets, sizes, shapes, strict=True)]
    dev = torch.device("cuda")
    torch.empty(1, device=dev)  # the context, outside the timing
    torch.cuda.synchronize()

    def run() -> float:
        t0 = time.perf_counter()
        if method == "per_tensor":
            held = [v.to(dev, non_blocking=True) for v in views]
        elif method == "flat":
            g = flat.to(dev, non_blocking=True)
            held = [g[o:o + b].view(torch.bfloat16).view(s) for o, b, s in zip(offsets, sizes, shapes, strict=True)]
        else:
            held = [torch.empty(s, dtype=torch.bfloat16, device=dev) for s in shapes]
        torch.cuda.synchronize()
        dt = time.perf_counter() - t0
        del held
        return dt

    cold, warm = run(), run()
    return {"model": model, "method": method, "tensors": len(shapes), "gib": end / 2**30,
            "pinned": bool(flat.is_pinned()), "cold_s": cold, "warm_s": warm,
            "cold_gib_per_s": end / 2**30 / cold, "warm_gib_per_s": end / 2**30 / warm}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen3-4b", choices=sorted(SHAPES))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out")
    ap.add_argument("--one", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.model, a.one)))
        return
    rows = []
    for r in range(a.repeats):  # interleaved, each case in its own process
        for m in ("per_tensor", "flat", "alloc_only"):
            p = subprocess.run([sys.executable, __file__, "--model", a.model, "--one", m],
                               capture_output=True, text=True, check=True)
            row = json.loads(p.stdout.strip().splitlines()[-1]) | {"repeat": r}
            rows.append(row)
            print(f"{m:11s} r{r} {row['tensors']} tensors {row['gib']:.2f} GiB pinned={row['pinned']} "
                  f"cold {row['cold_s']:.3f} s ({row['cold_gib_per_s']:.1f} GiB/s) "
                  f"warm {row['warm_s']:.3f} s ({row['warm_gib_per_s']:.1f} GiB/s)", flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
