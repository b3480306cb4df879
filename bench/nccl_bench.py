"""Collective and peer-copy speed between the GPUs of one host through PyTorch + NCCL: what the simulator's all-reduce, all-gather and broadcast costs rest on (issue 12).

One process per GPU. For each message size: all_reduce, all_gather_into_tensor and broadcast of
bf16 tensors, median of `--iters` timed calls after warm-up, reported as the bus bandwidth NCCL's
own tests use (all-reduce: bytes · 2(n-1)/n / t; all-gather: bytes · (n-1)/n / t, with bytes the
gathered size; broadcast: bytes / t), plus a device-to-device copy GPU 0 -> GPU 1.

    python3 bench/nccl_bench.py --out nccl.json                 # every GPU of the machine
    python3 bench/nccl_bench.py --device cpu --world 2 --out x  # gloo on a CPU (checks the script)

NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set before NCCL starts.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import time

SIZES = (8 << 10, 64 << 10, 1 << 20, 16 << 20, 128 << 20, 1 << 30)


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, queue) -> None:
    import warnings

    # torch >= 2.13 renames all_gather_into_tensor; the H200's torch 2.11 has only the old name
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch
    import torch.distributed as dist

    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                            world_size=world, rank=rank)
    dev = torch.device(f"cuda:{rank}" if cuda else "cpu")
    dtype = torch.bfloat16 if cuda else torch.float32
    elem = torch.tensor([], dtype=dtype).element_size()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()
        dist.barrier()

    def timed(fn) -> float:
        for _ in range(args.warmup):
            fn()
        times = []
        for _ in range(args.iters):
            sync()
            t0 = time.perf_counter()
            fn()
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        # every rank's median; the collective's time is the slowest rank's
        t = torch.tensor([statistics.median(times)], dtype=torch.float64, device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    rows = []
    for nbytes in args.sizes:
        n = max(1, nbytes // elem)
        x = torch.ones(n, dtype=dtype, device=dev)
        out = torch.empty(n * world, dtype=dtype, device=dev)
        shard = torch.ones(n // world if n >= world else 1, dtype=dtype, device=dev)
        gathered = torch.empty(shard.numel() * world, dtype=dtype, device=dev)
        t_ar = timed(lambda x=x: dist.all_reduce(x))
        t_ag = timed(lambda s=shard, g=gathered: dist.all_gather_into_tensor(g, s))
        t_bc = timed(lambda x=x: dist.broadcast(x, src=0))
        del out
        b = n * elem
        rows.append({"bytes": b,
                     "all_reduce_s": t_ar, "all_reduce_busbw": b * 2 * (world - 1) / world / t_ar,
                     "all_gather_s": t_ag, "all_gather_busbw": gathered.numel() * elem * (world - 1) / world / t_ag,
                     "broadcast_s": t_bc, "broadcast_busbw": b / t_bc})
        # all ranks summed ones: a wrong sum means the collective is broken, not slow
        if rank == 0:
            rows[-1]["all_reduce_ok"] = bool(x[0].item() > 0)
    result: dict = {"rank": rank, "rows": rows}
    if cuda and rank == 0 and world > 1:
        src = torch.ones(args.p2p_bytes // elem, dtype=dtype, device="cuda:0")
        dst = torch.empty_like(src, device="cuda:1")
        for _ in range(3):
            dst.copy_(src)
        torch.cuda.synchronize()
        ts = []
        for _ in range(10):
            t0 = time.perf_counter()
            dst.copy_(src)
            torch.cuda.synchronize()
            ts.append(time.perf_counter() - t0)
        result["p2p"] = {"bytes": args.p2p_bytes, "s": statistics.median(ts),
                         "bytes_per_s": args.p2p_bytes / statistics.median(ts),
                         "can_access_peer": bool(torch.cuda.can_device_access_peer(0, 1))}
    dist.barrier()
    dist.destroy_process_group()
    queue.put(result)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--world", type=int, default=0, help="processes (default: every GPU; cpu: 2)")
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="message bytes, comma separated")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--p2p-bytes", type=int, default=1 << 30)
    args = ap.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",") if s]
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")  # never NVLink multicast on shared hosts
    os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
    import torch
    import torch.multiprocessing as mp

    if args.device == "cuda":
        world = args.world or torch.cuda.device_count()
        if world < 2:
            raise SystemExit(f"nccl_bench needs at least 2 GPUs, this machine has {torch.cuda.device_count()}")
    else:
        world = args.world or 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(r, world, port, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    bad = [p.exitcode for p in procs if p.exitcode != 0]
    if bad:
        raise SystemExit(f"a rank exited with {bad}")
    rank0 = next(r for r in results if r["rank"] == 0)
    env = {"torch": torch.__version__, "nccl": ".".join(map(str, torch.cuda.nccl.version())) if args.device == "cuda"
           else None, "world": world, "device": args.device,
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
           "NCCL_NVLS_ENABLE": os.environ.get("NCCL_NVLS_ENABLE")}
    out = {"env": env, "argv": sys.argv, "rows": rank0["rows"], "p2p": rank0.get("p2p")}
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for r in rank0["rows"]:
        print(f"{r['bytes']:>11d} B  all_reduce {r['all_reduce_s'] * 1e6:9.1f} us {r['all_reduce_busbw'] / 1e9:7.1f} GB/s  "
              f"all_gather {r['all_gather_busbw'] / 1e9:7.1f} GB/s  broadcast {r['broadcast_busbw'] / 1e9:7.1f} GB/s",
              flush=True)
    if out["p2p"]:
        print(f"p2p copy GPU0->GPU1 {out['p2p']['bytes_per_s'] / 1e9:.1f} GB/s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
