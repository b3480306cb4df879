"""vLLM's own CuMem pool timed alone, without an engine: its KV-cache wake by GiB and by how long after the sleep (issue 17).

    python bench/vllm_cumem_probe.py --size 124 --chunks 28 --settles 0,0.5,2 --repeats 2 --out probe_124.json

In the whole steps vLLM's KV wake takes 0.025 s for 47 GiB, 0.11 s for 82 and 0.34 s for 124 (H200), while the same
driver calls made by bench/vmm_sweep.py take 0.03-0.05 s for 124 GiB once the released memory has settled. This probe
allocates weights (`--weights-gib`, tag "weights") and `--chunks` KV tensors of `--size` GiB in all (tag "kv_cache")
through vLLM's CuMemAllocator, then per cycle: sleep (weights offloaded to the host, as level 1), wait a settle, wake
the weights, wake the KV cache, write the KV (as a rollout does) — timing each. If the settled KV wake here costs what
it costs in the engine, the cost is in vLLM's allocation path; if it costs what vmm_sweep.py's settled mapping costs,
it is in the engine's or the step's state. One size per process: vLLM's pool keeps what it mapped until the process
ends. Needs vLLM and a CUDA GPU (refused otherwise, exit code 2).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.vmm_sweep import _listed, _repeats  # noqa: E402  (after the path: bench/ is not installed)

GIB = 1 << 30


def _settles(text: str) -> list[float]:
    return _listed(text, float, "seconds", lambda v: math.isfinite(v) and v >= 0, "settle must be finite and at least 0")


def _gib(text: str) -> float:
    return _listed(text, float, "GiB", lambda v: math.isfinite(v) and v > 0, "size must be a positive finite GiB")[0]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vllm_cumem_probe.py", description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=_gib, required=True, help="GiB of KV cache (one size per process)")
    ap.add_argument("--chunks", type=_repeats, default=28, help="KV tensors (vLLM: one per layer)")
    ap.add_argument("--weights-gib", type=_gib, default=1.1, help="GiB of weights, offloaded at each sleep")
    ap.add_argument("--settles", type=_settles, default=[0.0, 0.5, 2.0], help="seconds between sleep and wake")
    ap.add_argument("--repeats", type=_repeats, default=2)
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


def cycle(alloc, kv: list, settle_s: float) -> dict:
    """Sleep, wait, wake weights, wake KV, write the KV: seconds of each."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    alloc.sleep(offload_tags=("weights",))
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    time.sleep(settle_s)
    free_before = torch.cuda.mem_get_info()[0] / GIB
    t2 = time.perf_counter()
    alloc.wake_up(["weights"])
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    alloc.wake_up(["kv_cache"])
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    for t in kv:
        t.fill_(1)
    torch.cuda.synchronize()
    t5 = time.perf_counter()
    return {"settle_s": settle_s, "sleep_s": t1 - t0, "free_before_wake_gib": free_before, "wake_weights_s": t3 - t2,
            "wake_kv_s": t4 - t3, "write_kv_s": t5 - t4}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("{}\n")  # writable before the GPU work starts
    try:
        import torch
        from vllm.device_allocator.cumem import CuMemAllocator
    except ImportError as e:
        print(f"vllm_cumem_probe.py: needs vLLM and torch ({e}); run it on the lent H200", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("vllm_cumem_probe.py: needs a CUDA GPU (none here); run it on the lent H200", file=sys.stderr)
        return 2
    torch.cuda.init()
    alloc = CuMemAllocator.get_instance()
    per = int(args.size * GIB) // args.chunks
    with alloc.use_memory_pool(tag="weights"):
        weights = torch.ones(int(args.weights_gib * GIB), dtype=torch.uint8, device="cuda")
    with alloc.use_memory_pool(tag="kv_cache"):
        kv = [torch.zeros(per, dtype=torch.int8, device="cuda") for _ in range(args.chunks)]
    torch.cuda.synchronize()
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "size_gib": args.size,
              "chunks": args.chunks, "weights_gib": args.weights_gib, "argv": sys.argv,
              "free_after_alloc_gib": torch.cuda.mem_get_info()[0] / GIB, "cycles": []}
    cycle(alloc, kv, 0.5)  # warm: the first sleep pins the host backup
    for r in range(args.repeats):
        for settle in args.settles:
            row = {"repeat": r, **cycle(alloc, kv, settle)}
            result["cycles"].append(row)
            out.write_text(json.dumps(result, indent=1) + "\n")
            print(f"{args.size:g} GiB x{args.chunks} settle {settle:g} s: sleep {row['sleep_s']:.4f}, wake weights "
                  f"{row['wake_weights_s']:.4f}, wake kv {row['wake_kv_s']:.4f}, write kv {row['write_kv_s']:.4f} s, "
                  f"free before {row['free_before_wake_gib']:.1f} GiB", flush=True)
    del weights, kv
    return 0


if __name__ == "__main__":
    sys.exit(main())
