"""Why a trainer's resume costs ~0.15 s more in a colocated RL step than alone (issue 17): the same resume timed alone and after a neighbour process took and gave back most of the GPU.

    python bench/colocated_resume.py --preset qwen3-0.6b --neighbour-gib 100 --cycles 3 --out colocated_resume.json

The trainer's state is laid out as the real actor's is under vime's CuMem allocator: the DDP parameter and gradient
buffers as one region each, the optimizer's fp32 main copy and Adam's two moments one region per parameter tensor
(Megatron's layout of the preset). Each cycle pauses the state, then either waits (``alone``) or lets a neighbour
process map and touch ``--neighbour-gib`` and release it — through CUDA's virtual-memory calls as vLLM's CuMem pool
does (``cumem``) or through PyTorch's allocator (``torch``) — and then resumes, timing the resume, the first
cuMemCreate after the neighbour's release, and the neighbour's own calls. The conditions are interleaved, so host
drift falls on all of them alike. The tenth H200 lease measured 0.316 s for the 0.6B's resume inside whole steps and
0.156-0.166 s alone (bench/data/h200_megatron_qwen3-0.6b_cumem.json).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GIB = 1 << 30
CHUNK = 2 * GIB  # the neighbour's allocations: large, as a KV cache's


def state_layout(preset: str) -> list[tuple[str, int]]:
    """(tag, bytes) of each region of a one-GPU trainer of `preset`: params and grads as DDP buffers, the optimizer
    per parameter tensor (fp32 main copy, two moments)."""
    from vime.sim.models import load_model

    model = load_model(preset)
    tensors = model.vllm_weight_allocations(1)  # bf16 bytes per parameter tensor, fused QKV and fc1 as Megatron's
    out = [("params", sum(tensors)), ("grads", 2 * sum(tensors))]
    for n in tensors:
        out += [("optimizer", 2 * n)] * 3
    return out


class _Mapped:
    """A driver-mapped range as a uint8 CUDA array (torch.as_tensor reads __cuda_array_interface__)."""

    def __init__(self, va: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (va, False), "version": 3}


def neighbour(conn) -> None:
    """A second process on the GPU: on ("cumem"|"torch", gib) it takes `gib`, writes it, gives it back, and replies
    with its timings; on ("exit", 0) it stops."""
    import torch

    from vime.real.cumem.cuda_driver import CudaDriver

    torch.cuda.init()
    drv = CudaDriver(0)
    conn.send("ready")
    while True:
        how, gib = conn.recv()
        if how == "exit":
            return
        t0 = time.perf_counter()
        if how == "cumem":
            held = []
            for _ in range(int(gib * GIB // CHUNK)):
                va = drv.reserve(CHUNK)
                handle = drv.create(CHUNK)
                drv.map(va, CHUNK, handle)
                held.append((va, handle))
            t1 = time.perf_counter()
            for va, _ in held:  # write every page, as a rollout's KV cache does
                torch.as_tensor(_Mapped(va, CHUNK), device="cuda").fill_(1)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            for va, handle in held:
                drv.unmap(va, CHUNK)
                drv.release(handle)
                drv.free_address(va, CHUNK)
            drv.synchronize()
        else:
            x = torch.empty(int(gib * GIB), dtype=torch.uint8, device="cuda")
            t1 = time.perf_counter()
            x.fill_(1)
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            del x
            torch.cuda.empty_cache()
            torch.cuda.synchronize()
        t3 = time.perf_counter()
        conn.send({"take_s": t1 - t0, "write_s": t2 - t1, "give_back_s": t3 - t2})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="Qwen3-0.6B")
    ap.add_argument("--neighbour-gib", type=float, default=100.0)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--idle-s", type=float, default=1.0, help="the alone condition's wait between pause and resume")
    ap.add_argument("--settle-s", type=float, default=0.0,
                    help="wait this long after the neighbour gave its memory back, before the resume")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("{}\n")  # writable before the GPU work starts

    import torch

    from vime.real.cumem.torch_hook import trainer_cumem

    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=neighbour, args=(child,), daemon=True)
    proc.start()
    if not parent.poll(120) or parent.recv() != "ready":
        raise RuntimeError(f"the neighbour process did not start (exit code {proc.exitcode})")

    torch.cuda.init()
    hook = trainer_cumem(0)
    alloc = hook.allocator
    spec = state_layout(args.preset)
    tensors = []
    for tag, n in spec:
        with hook.region(tag):
            tensors.append(torch.ones(n, dtype=torch.uint8, device="cuda"))
    torch.cuda.synchronize()
    result: dict = {"preset": args.preset, "regions": len(alloc.regions), "state_bytes": sum(n for _, n in spec),
                    "neighbour_gib": args.neighbour_gib, "idle_s": args.idle_s, "settle_s": args.settle_s, "argv": sys.argv, "cycles": []}
    drv = alloc.driver
    for cycle in range(args.cycles):
        for condition in ("alone", "cumem", "torch"):
            pause = alloc.pause()
            side: dict = {}
            if condition == "alone":
                time.sleep(args.idle_s)
            else:
                parent.send((condition, args.neighbour_gib))
                if not parent.poll(120):
                    raise RuntimeError(f"the neighbour did not answer {condition} in 120 s (exit code {proc.exitcode})")
                side = parent.recv()
                time.sleep(args.settle_s)
            t0 = time.perf_counter()
            probe = drv.create(drv.granularity)  # the first cuMemCreate after the neighbour's release
            t1 = time.perf_counter()
            drv.release(probe)
            resume = alloc.resume()
            row = {"cycle": cycle, "condition": condition, "pause_s": pause.seconds, "first_create_s": t1 - t0,
                   "resume_s": resume.seconds, "resume_bytes": resume.copied_bytes, "neighbour": side}
            result["cycles"].append(row)
            print(f"cycle {cycle} {condition:6s} pause {pause.seconds:.3f} s, first create {1e3 * (t1 - t0):.2f} ms, "
                  f"resume {resume.seconds:.3f} s; neighbour {json.dumps({k: round(v, 3) for k, v in side.items()})}",
                  flush=True)
            out_path.write_text(json.dumps(result, indent=1) + "\n")
    parent.send(("exit", 0))
    proc.join(timeout=30)
    kept = [t for t, (tag, _) in zip(tensors, spec, strict=True) if tag != "grads"]  # grads are dropped at pause
    result["restored"] = all(bool((t == 1).all()) for t in kept)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if result["restored"] else 1


if __name__ == "__main__":
    sys.exit(main())
