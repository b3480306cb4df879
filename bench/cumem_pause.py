"""Pause/resume speed of trainer-like GPU state: vime's CuMem allocator vs torch_memory_saver vs a plain pinned copy (issue 11).

One method and one size per process (so each starts from a clean CUDA context and host memory):

    python bench/cumem_pause.py --method vime --gib 8 --cycles 4 --out vime8.json

The state imitates a bf16 model with fp32 master weights and Adam moments: per parameter 2 B
params + 4 B master + 8 B moments kept (tags params / optimizer) and 2 B grads discarded. GiB/s
is computed on the bytes that must survive. Every cycle checks that the tensors' addresses and
checksums are unchanged after resume.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

GIB = 1 << 30
TENSOR_BYTES = 256 << 20  # a Megatron bucket / a large layer: big enough to be its own segment


def _meminfo() -> dict[str, int]:
    out = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                k, v = line.split(":", 1)
                if k in ("MemTotal", "MemAvailable"):
                    out[k] = int(v.split()[0]) * 1024
    except OSError:
        pass
    return out


def layout(total_gib: float) -> list[tuple[str, str, int]]:
    """(tag, dtype, bytes) of each tensor for `total_gib` of trainer state (16 B per parameter)."""
    nparams = int(total_gib * GIB / 16)
    parts = [("params", "bf16", 2 * nparams), ("grads", "bf16", 2 * nparams),
             ("optimizer", "fp32", 4 * nparams), ("optimizer", "fp32", 4 * nparams),
             ("optimizer", "fp32", 4 * nparams)]
    out = []
    for tag, dtype, nbytes in parts:
        while nbytes > 0:
            n = min(TENSOR_BYTES, nbytes)
            out.append((tag, dtype, n))
            nbytes -= n
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--method", choices=["vime", "vime_prepared", "tms", "tms_retain", "plain"], required=True)
    ap.add_argument("--gib", type=float, default=8.0)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--host-limit-gib", type=float, default=None,
                    help="host memory vime may pin; /proc/meminfo understates it on balloon VMs")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    result: dict = {"method": args.method, "gib": args.gib, "cycles": [], "ok": False,
                    "meminfo_start": _meminfo(), "argv": sys.argv}

    def dump() -> None:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    torch.cuda.init()
    dev = torch.device("cuda", 0)
    spec = layout(args.gib)
    kept = sum(n for tag, _, n in spec if tag != "grads")
    result["kept_bytes"] = kept
    result["total_bytes"] = sum(n for _, _, n in spec)
    tensors: list[torch.Tensor] = []
    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}

    def make(tag: str, dtype: str, n: int) -> torch.Tensor:
        t = torch.empty(n // dt[dtype].itemsize, dtype=dt[dtype], device=dev)
        t.view(torch.int32).random_()
        return t

    pause = resume = None
    t_setup = time.perf_counter()
    if args.method.startswith("vime"):
        from vime.real.cumem.torch_hook import trainer_cumem

        limit = int(args.host_limit_gib * GIB) if args.host_limit_gib else None
        hook = trainer_cumem(0, host_limit_bytes=limit)
        alloc = hook.allocator
        for tag, dtype, n in spec:
            with hook.region(tag):
                tensors.append(make(tag, dtype, n))
        result["granularity"] = alloc.driver.granularity
        if args.method == "vime_prepared":
            t0 = time.perf_counter()
            result["prepare_host_bytes"] = alloc.prepare_host()
            result["prepare_host_s"] = time.perf_counter() - t0

        def pause() -> dict:
            return alloc.pause().as_dict()

        def resume() -> dict:
            return alloc.resume().as_dict()
    elif args.method.startswith("tms"):
        from torch_memory_saver import torch_memory_saver as tms

        tms.hook_mode = "torch"
        for tag, dtype, n in spec:
            with tms.region(tag=tag, enable_cpu_backup=(tag != "grads")):
                tensors.append(make(tag, dtype, n))
        if args.method == "tms_retain":
            tms.retain_cpu_backup = True

        def pause() -> dict:
            torch.cuda.synchronize()
            tms.pause()
            torch.cuda.synchronize()
            return {}

        def resume() -> dict:
            tms.resume()
            torch.cuda.synchronize()
            return {}
    else:
        for tag, dtype, n in spec:
            tensors.append(make(tag, dtype, n))
        keep = [t for t, (tag, _, _) in zip(tensors, spec, strict=True) if tag != "grads"]
        host: list[torch.Tensor] = []

        def pause() -> dict:
            torch.cuda.synchronize()
            first = not host
            t0 = time.perf_counter()
            if first:
                host.extend(torch.empty(t.numel(), dtype=t.dtype, pin_memory=True) for t in keep)
            t1 = time.perf_counter()
            for h, t in zip(host, keep, strict=True):
                h.copy_(t.view(-1), non_blocking=True)
            torch.cuda.synchronize()
            return {"host_alloc_seconds": t1 - t0}

        def resume() -> dict:
            for h, t in zip(host, keep, strict=True):
                t.view(-1).copy_(h, non_blocking=True)
            torch.cuda.synchronize()
            return {}

    torch.cuda.synchronize()
    result["setup_s"] = time.perf_counter() - t_setup
    ptrs = [t.data_ptr() for t in tensors]
    keep_idx = [i for i, (tag, _, _) in enumerate(spec) if tag != "grads"]

    def checksums() -> list[int]:
        return [int(tensors[i].view(torch.int32).sum(dtype=torch.int64)) for i in keep_idx]

    reference = checksums()
    free0, total = torch.cuda.mem_get_info()
    result["device_free_before"] = free0
    result["device_total"] = total
    dump()
    for c in range(args.cycles):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        pinfo = pause()
        t1 = time.perf_counter()
        free_paused = torch.cuda.mem_get_info()[0]
        t2 = time.perf_counter()
        rinfo = resume()
        t3 = time.perf_counter()
        intact = checksums() == reference and [t.data_ptr() for t in tensors] == ptrs
        cyc = {"cycle": c, "pause_s": t1 - t0, "resume_s": t3 - t2,
               "pause_gib_s": kept / GIB / (t1 - t0), "resume_gib_s": kept / GIB / (t3 - t2),
               "device_freed_bytes": free_paused - free0, "intact": intact,
               "pause_info": pinfo, "resume_info": rinfo}
        result["cycles"].append(cyc)
        print(f"{args.method} {args.gib:g}GiB cycle {c}: pause {t1 - t0:.3f}s ({cyc['pause_gib_s']:.1f} GiB/s) "
              f"resume {t3 - t2:.3f}s ({cyc['resume_gib_s']:.1f} GiB/s) freed {cyc['device_freed_bytes'] / GIB:.1f} GiB "
              f"intact={intact}", flush=True)
        dump()
        if not intact:
            break
        # The trainer touches its state between cycles; so do we (one kernel per tensor).
        for i in keep_idx:
            tensors[i].view(torch.int32).add_(1)
        reference = checksums()
    result["ok"] = all(c["intact"] for c in result["cycles"]) and len(result["cycles"]) == args.cycles
    result["meminfo_end"] = _meminfo()
    dump()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")
    sys.exit(main())
