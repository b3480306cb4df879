"""How long mapping CUDA virtual memory back takes (cuMemCreate + cuMemMap + cuMemSetAccess, as vLLM's CuMem pool wakes a KV cache) by the GiB mapped and by who released the memory just before.

    python bench/vmm_sweep.py --sizes 8,16,32,48,64,80,100,124 --chunks 28 --settle-s 2 --repeats 2 --out vmm_sweep.json

vLLM's KV-cache wake on the H200 took 0.022-0.037 s for 47 GiB, 0.11-0.15 s for 75.7 GiB and 0.33-0.36 s for 124 GiB:
superlinear, where an older small-size run gave 0.00016 s/GiB. Each size is split into ``--chunks`` equal allocations
(vLLM holds one KV tensor per layer: 28 for Qwen3-0.6B; ``--chunks 1,28`` interleaves both, for whether the count
matters) and mapped after one of five releases, interleaved (each repeat, each size, each chunk count, each condition
in turn) so host drift falls on all alike:

    self_now           this process maps N GiB, writes every page, gives it back, and maps N GiB again at once
    self_settled       the same, waiting --settle-s between the give-back and the timed mapping
    neighbour_now      a second process on the GPU maps, writes and gives back N GiB; this one maps N GiB at once
    neighbour_settled  the same, waiting --settle-s after the neighbour's reply
    unwritten_now      as self_now, but the first mapping is never written (do dirtied pages cost?)
    torch_settled      the neighbour takes N GiB through PyTorch's caching allocator in mixed-size tensors (2-512 MiB,
                       as a trainer's activations), writes and frees them, empties its cache; --settle-s; then map
    torch_holes_settled  the same, but the neighbour keeps every 16th tensor through the timed mapping (~6 % of N)

(--conditions picks; the first five by default.) ``--rdma`` allocates as vLLM's pool does (GPUDirect-RDMA capable);
``--reuse-va`` maps this process's memory back into address ranges reserved once per row, as vLLM's sleep keeps its
ranges and its wake maps into them. The H200's results: bench/data/h200_notes.md (seventeenth session).
Each timed mapping records its reserve/create/map seconds, create+map per chunk (does the cost rise partway?), the first
write of the mapped memory (fill_ + synchronize: where a lazy driver would pay) and the give-back; the JSON is rewritten
after every row. The default plan (4 sizes x 5 conditions x 2 repeats, 16 settles of 1 s) takes about 30-45 s on an
H200 with the interpreter's and the neighbour's start (~10 s); ``--budget-s`` stops starting rows after that many
seconds. Without a CUDA GPU it refuses (exit code 2).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.colocated_resume import _Mapped  # noqa: E402  (after the path: bench/ is not installed)

GIB = 1 << 30
MARGIN = GIB  # left free beyond the largest mapping: the two processes' contexts grow a little as they run
CONDITIONS = ("self_now", "self_settled", "neighbour_now", "neighbour_settled", "unwritten_now", "torch_settled",
              "torch_holes_settled")
DEFAULT_CONDITIONS = CONDITIONS[:5]
HOLE_EVERY = 16  # torch_holes_settled: the neighbour keeps every 16th of its tensors (~6 %) through the timed mapping
TORCH_MIB = (2, 8, 20, 64, 150, 288, 512)  # a trainer's activations: many tensors of mixed sizes
NO_GPU = "vmm_sweep.py: needs a CUDA GPU (none here); run it on the lent H200 through the device tool"


# --- the plan (pure) ------------------------------------------------------------------------------
def schedule(sizes: list[float], chunks: list[int], repeats: int,
             conditions: tuple[str, ...] = DEFAULT_CONDITIONS) -> list[tuple[int, float, int, str]]:
    """(repeat, size GiB, chunks, condition) in run order: each repeat runs every size, chunk count and condition."""
    return [(r, s, c, cond) for r in range(repeats) for s in sizes for c in chunks for cond in conditions]


def torch_sizes(nbytes: int, seed: int = 0) -> list[int]:
    """Tensor sizes (bytes) of mixed MiB, drawn with a fixed seed, that together hold about `nbytes`."""
    import random

    rng, out, left = random.Random(seed), [], nbytes
    while left > 0:
        out.append(min(rng.choice(TORCH_MIB) << 20, left))
        left -= out[-1]
    return out


def chunk_bytes(size_gib: float, chunks: int, granularity: int) -> int:
    """Bytes of each of `chunks` allocations that together hold `size_gib`, rounded up to the granularity."""
    per = -(-round(size_gib * GIB) // chunks)
    return max(1, -(-per // granularity)) * granularity


def fit_error(sizes: list[float], chunks: list[int], granularity: int, free: int) -> str | None:
    """Why the largest mapping would not fit in `free` bytes less the margin, or None when it does."""
    need, size, n = max((c * chunk_bytes(s, c, granularity), s, c) for s in sizes for c in chunks)
    if need <= free - MARGIN:
        return None
    return (f"--sizes {size:g} GiB ({need / GIB:.2f} GiB mapped as --chunks {n}) does not fit in {free / GIB:.2f} GiB "
            f"free less a {MARGIN / GIB:g} GiB margin")


def summarize(rows: list[dict]) -> list[dict]:
    """Per (condition, size, chunks): the rows, the median total and first-write seconds, and s/GiB."""
    groups: dict[tuple, list[dict]] = {}
    for row in rows:
        if "error" not in row:
            groups.setdefault((row["condition"], row["size_gib"], row["chunks"]), []).append(row)
    out = []
    for (cond, size, chunks), group in sorted(groups.items(), key=lambda kv: (CONDITIONS.index(kv[0][0]), *kv[0][1:])):
        total = statistics.median(r["total_s"] for r in group)
        out.append({"condition": cond, "size_gib": size, "chunks": chunks, "n": len(group), "median_total_s": total,
                    "s_per_gib": total / size,
                    "median_first_write_s": statistics.median(r["first_write_s"] for r in group)})
    return out


# --- arguments ------------------------------------------------------------------------------------
def _listed(text: str, kind, what: str, ok, need: str) -> list:
    """A comma-separated list of `kind`, each passing `ok`; else one error saying what each must be."""
    try:
        values = [kind(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of {what}: {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError(f"no {what} given")
    for v in values:
        if not ok(v):
            raise argparse.ArgumentTypeError(f"each {need}, not {v:g}")
    return values


def _sizes(text: str) -> list[float]:
    return _listed(text, float, "GiB", lambda s: math.isfinite(s) and s > 0, "size must be a positive finite GiB")


def _chunks(text: str) -> list[int]:
    return _listed(text, int, "counts", lambda c: c >= 1, "chunk count must be at least 1")


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be finite and at least 0, not {text}")
    return value


def _conditions(text: str) -> tuple[str, ...]:
    chosen = tuple(c.strip() for c in text.split(",") if c.strip())
    unknown = [c for c in chosen if c not in CONDITIONS]
    if not chosen or unknown:
        raise argparse.ArgumentTypeError(f"choose from {', '.join(CONDITIONS)}, not {text!r}")
    return chosen


def _repeats(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {value}")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vmm_sweep.py", description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=_sizes, default=[8.0, 47.0, 76.0, 124.0], help="GiB mapped, comma-separated")
    ap.add_argument("--chunks", type=_chunks, default=[28], help="allocations each size is split into (1,28: both)")
    ap.add_argument("--settle-s", type=_seconds, default=1.0, help="the settled conditions' wait after the release")
    ap.add_argument("--repeats", type=_repeats, default=2)
    ap.add_argument("--conditions", type=_conditions, default=DEFAULT_CONDITIONS,
                    help=f"comma-separated, of {', '.join(CONDITIONS)} (default: the first five)")
    ap.add_argument("--budget-s", type=_seconds, default=45.0,
                    help="start no row after this many seconds (0: no limit); the rows run are kept")
    ap.add_argument("--reuse-va", action="store_true",
                    help="map back into the address ranges the release kept, as vLLM's sleep and wake do")
    ap.add_argument("--rdma", action="store_true",
                    help="allocate as vLLM's CuMem pool does: GPUDirect-RDMA capable where the GPU supports it")
    ap.add_argument("--out", required=True)
    return ap.parse_args(argv)


# --- mapping, writing, giving back ----------------------------------------------------------------
def take(drv, nbytes: int, chunks: int, vas: list[int] | None = None) -> tuple[list[tuple[int, object]], dict]:
    """Map `chunks` allocations of `nbytes` as vLLM's CuMem pool does (an address range, a handle, map + access each;
    into `vas`, ranges already reserved, where given: vLLM's wake maps back into the ranges its sleep kept); on a
    failure give back what was taken and raise."""
    held: list[tuple[int, object]] = []
    t = {"reserve_s": 0.0, "create_s": 0.0, "map_s": 0.0, "chunk_s": []}
    va = handle = None
    t0 = time.perf_counter()
    try:
        for k in range(chunks):
            a = time.perf_counter()
            va = vas[k] if vas else drv.reserve(nbytes)
            b = time.perf_counter()
            handle = drv.create(nbytes)
            c = time.perf_counter()
            drv.map(va, nbytes, handle)  # cuMemMap + cuMemSetAccess
            d = time.perf_counter()
            held.append((va, handle))
            va = handle = None
            t["reserve_s"] += b - a
            t["create_s"] += c - b
            t["map_s"] += d - c
            t["chunk_s"].append(round(d - b, 7))
    except BaseException:
        give_back(drv, held, nbytes, keep_va=bool(vas))
        if handle is not None:
            drv.release(handle)
        if va is not None and not vas:
            drv.free_address(va, nbytes)
        raise
    t["total_s"] = time.perf_counter() - t0
    return held, t


def write(held: list[tuple[int, object]], nbytes: int) -> float:
    """Seconds to write every page of the mapped chunks (fill_, then synchronize), as a rollout's KV cache is."""
    import torch

    t0 = time.perf_counter()
    for va, _ in held:
        torch.as_tensor(_Mapped(va, nbytes), device="cuda").fill_(1)
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def give_back(drv, held: list[tuple[int, object]], nbytes: int, keep_va: bool = False) -> float:
    """Seconds to unmap, release and (unless `keep_va`: vLLM's sleep keeps them) free the address of each chunk, then
    synchronize."""
    t0 = time.perf_counter()
    for va, handle in held:
        drv.unmap(va, nbytes)
        drv.release(handle)
        if not keep_va:
            drv.free_address(va, nbytes)
    drv.synchronize()
    held.clear()
    return time.perf_counter() - t0


def make_driver(rdma: bool):
    """A CudaDriver whose allocations are, with `rdma`, GPUDirect-RDMA capable where the GPU supports it, as vLLM's
    CuMem pool asks for (its cuDeviceGetAttribute check); returns (driver, whether the flag is set)."""
    from vime.real.cumem.cuda_driver import CudaDriver

    drv = CudaDriver(0)
    if not rdma:
        return drv, False
    cu = drv.cu
    attr = cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED
    err, supported = cu.cuDeviceGetAttribute(attr, 0)
    if int(err) != 0 or not supported:
        return drv, False
    drv._prop.allocFlags.gpuDirectRDMACapable = 1
    return drv, True


def neighbour(conn, rdma: bool = False) -> None:
    """The second process on the GPU: on ("take", bytes, chunks) it maps, writes and gives back, and replies with its
    seconds (or {"error": ...}); on ("exit",), a closed pipe or Ctrl-C it stops."""
    import torch

    from vime.real.cumem.driver import DriverError

    try:
        torch.cuda.init()
        drv, _ = make_driver(rdma)
        held, _ = take(drv, GIB, 2)  # warm: the first mapping and the first fill_ pay one-time costs
        write(held, GIB)
        give_back(drv, held, GIB)
        conn.send("ready")
        kept: list = []  # torch_holes_settled's tensors, held through the timed mapping
        while True:
            msg = conn.recv()
            if msg[0] == "exit":
                return
            if msg[0] in ("torch", "drop"):
                conn.send(through_torch(kept, *msg[1:]))
                continue
            _, nbytes, chunks = msg
            try:
                held, t = take(drv, nbytes, chunks)
            except DriverError as e:
                conn.send({"error": str(e)})
                continue
            conn.send({"map_s": t["total_s"], "write_s": write(held, nbytes), "give_back_s": give_back(drv, held, nbytes)})
    except (KeyboardInterrupt, EOFError):  # Ctrl-C reaches both processes; a closed pipe means the sweep is gone
        return


def through_torch(kept: list, nbytes: int = 0, keep_every: int = 0) -> dict:
    """The neighbour's torch conditions: take `nbytes` in mixed-size tensors through PyTorch's caching allocator, write
    them, free all but every `keep_every`-th, give the cache back; with nbytes 0 free what was kept."""
    import torch

    t0 = time.perf_counter()
    tensors = [torch.ones(n, dtype=torch.uint8, device="cuda") for n in torch_sizes(nbytes)]
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    if not nbytes:
        kept.clear()
    kept.extend(t for i, t in enumerate(tensors) if keep_every and i % keep_every == keep_every - 1)
    del tensors
    torch.cuda.empty_cache()
    torch.cuda.synchronize()
    return {"map_s": t1 - t0, "write_s": 0.0, "give_back_s": time.perf_counter() - t1,
            "kept_gib": sum(t.numel() for t in kept) / GIB}


def _answer(conn, proc, what: str, timeout: float = 120.0):
    """The neighbour's next message; a clear error if it went quiet or died (a closed pipe polls as readable)."""
    try:
        if conn.poll(timeout):
            return conn.recv()
    except EOFError:
        pass
    raise RuntimeError(f"the neighbour did not answer {what} in {timeout:g} s (exit code {proc.exitcode})")


def _stop(conn, proc) -> None:
    """Always end the neighbour: ask, wait, then terminate."""
    try:
        conn.send(("exit",))
    except (OSError, ValueError):  # the pipe is already gone
        pass
    proc.join(timeout=10)
    if proc.is_alive():
        proc.terminate()
        proc.join(timeout=5)


# --- the sweep ------------------------------------------------------------------------------------
def run_row(drv, conn, proc, size: float, chunks: int, condition: str, settle_s: float, reuse_va: bool = False) -> dict:
    """Release N GiB as `condition` says, then time mapping N GiB, its first write and its give-back (with `reuse_va`,
    this process's mappings go into address ranges reserved once for the row, as vLLM's sleep and wake do)."""
    from vime.real.cumem.driver import DriverError

    n = chunk_bytes(size, chunks, drv.granularity)
    row: dict = {"chunk_bytes": n, "mapped_gib": n * chunks / GIB}
    vas = [drv.reserve(n) for _ in range(chunks)] if reuse_va else None
    try:
        if condition.startswith("torch"):
            conn.send(("torch", n * chunks, HOLE_EVERY if "holes" in condition else 0))
            prep = _answer(conn, proc, "torch")
        elif condition.startswith("neighbour"):
            conn.send(("take", n, chunks))
            prep = _answer(conn, proc, "take")
            if "error" in prep:
                return {**row, "error": f"neighbour: {prep['error']}", "prep": prep}
        else:
            held, t = take(drv, n, chunks, vas)
            prep = {"map_s": t["total_s"], "write_s": 0.0 if condition == "unwritten_now" else write(held, n)}
            prep["give_back_s"] = give_back(drv, held, n, keep_va=reuse_va)
        if condition.endswith("settled"):
            time.sleep(settle_s)
        row["free_before_gib"] = drv.device_free()[0] / GIB
        held, timed = take(drv, n, chunks, vas)
        timed["first_write_s"] = write(held, n)
        timed["give_back_s"] = give_back(drv, held, n, keep_va=reuse_va)
    except DriverError as e:  # e.g. out of memory because a release has not landed yet: a finding, keep sweeping
        return {**row, "error": str(e)}
    finally:
        for va in vas or ():
            drv.free_address(va, n)
        if "holes" in condition:
            conn.send(("drop",))
            _answer(conn, proc, "drop")
    return {**row, **timed, "prep": prep}


def sweep(args: argparse.Namespace, out_path: Path, t_start: float) -> int:
    import torch


    ctx = mp.get_context("spawn")
    conn, child = ctx.Pipe()
    proc = ctx.Process(target=neighbour, args=(child, args.rdma), daemon=True)
    proc.start()  # its start (~5 s) overlaps this process's
    try:
        torch.cuda.init()
        drv, rdma = make_driver(args.rdma)
        held, _ = take(drv, GIB, 2)  # warm, as the neighbour does
        write(held, GIB)
        give_back(drv, held, GIB)
        if _answer(conn, proc, "ready") != "ready":
            raise RuntimeError("the neighbour process did not start")
        free, total = drv.device_free()
        if (why := fit_error(args.sizes, args.chunks, drv.granularity, free)) is not None:
            print(f"vmm_sweep.py: {why}", file=sys.stderr)
            return 2
        props = torch.cuda.get_device_properties(0)
        err, driver = drv.cu.cuDriverGetVersion()
        plan = schedule(args.sizes, args.chunks, args.repeats, args.conditions)
        result: dict = {"device": props.name, "total_gib": total / GIB, "free_gib_at_start": free / GIB,
                        "torch": torch.__version__, "cuda": torch.version.cuda,
                        "driver": int(driver) if int(err) == 0 else None, "granularity": drv.granularity,
                        "sizes_gib": args.sizes, "chunks": args.chunks, "settle_s": args.settle_s,
                        "repeats": args.repeats, "rdma": rdma, "reuse_va": args.reuse_va, "budget_s": args.budget_s, "argv": sys.argv,
                        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "planned_rows": len(plan), "skipped_rows": 0,
                        "wall_s": 0.0, "rows": [], "summary": []}
        for i, (repeat, size, chunks, condition) in enumerate(plan):
            if args.budget_s and time.perf_counter() - t_start > args.budget_s:
                result["skipped_rows"] = len(plan) - i
                print(f"budget of {args.budget_s:g} s spent: {len(plan) - i} of {len(plan)} rows not run", flush=True)
                break
            row = {"repeat": repeat, "size_gib": size, "chunks": chunks, "condition": condition,
                   **run_row(drv, conn, proc, size, chunks, condition, args.settle_s, args.reuse_va)}
            result["rows"].append(row)
            result["summary"] = summarize(result["rows"])
            result["wall_s"] = time.perf_counter() - t_start
            out_path.write_text(json.dumps(result, indent=1) + "\n")
            head = f"r{repeat} {size:6g} GiB x{chunks:<3d} {condition:17s}"
            if "error" in row:
                print(f"{head} error: {row['error']}", flush=True)
            else:
                print(f"{head} map {row['total_s']:.4f} s ({row['total_s'] / size:.6f} s/GiB: create "
                      f"{row['create_s']:.4f}, map {row['map_s']:.4f}), first write {row['first_write_s']:.4f} s, "
                      f"give back {row['give_back_s']:.4f} s, free before {row['free_before_gib']:.1f} GiB", flush=True)
        result["wall_s"] = time.perf_counter() - t_start
        out_path.write_text(json.dumps(result, indent=1) + "\n")
        return 0
    finally:
        _stop(conn, proc)


def main(argv: list[str] | None = None) -> int:
    t_start = time.perf_counter()
    args = parse_args(argv)
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text("{}\n")  # writable before the GPU work starts
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if not has_gpu:
        print(NO_GPU, file=sys.stderr)
        return 2
    try:
        return sweep(args, out_path, t_start)
    except KeyboardInterrupt:
        print("vmm_sweep.py: interrupted; the rows run so far are in " + str(out_path), file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
