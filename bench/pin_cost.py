"""What pinned host memory costs on a GPU machine: allocate and free per GiB, by API and size, each in a fresh process (issue 12).

The simulator charges `vmm.pinned_alloc_s_per_gib` when a sleep or pause first needs host
buffers and `vmm.pinned_free_s_per_gib` when a cold allocator (torch_memory_saver) gives them back.
On the lent H200 the same call measured 0.34 to 0.56 s/GiB in different runs, so this script
separates what might explain it:

- the API and piece size: `cu_1g` (cuMemHostAlloc in 1 GiB pieces, vime's HostArena), `cu_256m`
  (256 MiB pieces, as torch_memory_saver allocates one backup per tensor), `torch_pin`
  (`torch.empty(pin_memory=True)`, PyTorch's caching host allocator, which vLLM's CPU backup uses);
- the operating system's share: `touch` maps anonymous memory and writes one byte per page, no
  pinning, so it measures page population alone (a VM may fault guest memory in lazily);
- transparent huge pages: `touch_thp` is `touch` with madvise(MADV_HUGEPAGE), and `register_thp`
  pins such memory with cuMemHostRegister, a way to pin that populates 2 MiB pages instead of 4 KiB;
- the total size (does the per-GiB cost grow with it?) and a second allocation right after a free
  in the same process (does re-pinning cost less?).

Each (method, size) runs in its own process, in an interleaved order, so one run's pages do not
favour the next more than the machine itself does.

    python3 bench/pin_cost.py --out pin.json [--sizes 4,16] [--methods cu_1g,cu_256m,torch_pin,touch]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import subprocess
import sys
import time
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20
METHODS = ("cu_1g", "cu_256m", "torch_pin", "touch", "touch_thp", "register_thp")


def meminfo() -> dict[str, int]:
    out: dict[str, int] = {}
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("MemTotal", "MemFree", "MemAvailable", "AnonHugePages", "Mlocked", "Cached"):
                out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


def thp() -> dict[str, str]:
    out = {}
    for name in ("enabled", "defrag"):
        try:
            out[name] = Path(f"/sys/kernel/mm/transparent_hugepage/{name}").read_text().strip()
        except OSError:
            out[name] = "unreadable"
    return out


class _Cu:
    """cuMemHostAlloc / cuMemFreeHost through cuda-bindings in pieces of `piece` bytes."""

    def __init__(self, piece: int) -> None:
        try:
            from cuda.bindings import driver as cu
        except ImportError:
            from cuda import cuda as cu  # type: ignore[no-redef]
        self.cu, self.piece = cu, piece
        self._ok(cu.cuInit(0))
        dev = self._ok(cu.cuDeviceGet(0))
        ctx = self._ok(cu.cuDevicePrimaryCtxRetain(dev))
        self._ok(cu.cuCtxSetCurrent(ctx))

    def _ok(self, res):
        err, *vals = res if isinstance(res, tuple) else (res,)
        if int(err) != 0:
            raise RuntimeError(f"CUDA driver error {err}")
        return vals[0] if vals else None

    def alloc(self, nbytes: int) -> list:
        return [self._ok(self.cu.cuMemHostAlloc(min(self.piece, nbytes - off), 0))
                for off in range(0, nbytes, self.piece)]

    def free(self, ptrs: list) -> None:
        for p in ptrs:
            self._ok(self.cu.cuMemFreeHost(p))


class _TorchPin:
    """`torch.empty(..., pin_memory=True)` in 256 MiB pieces; freeing empties PyTorch's host cache."""

    def __init__(self) -> None:
        import torch

        self.torch = torch
        torch.cuda.init()

    def alloc(self, nbytes: int) -> list:
        t = self.torch
        return [t.empty(min(256 * MIB, nbytes - off), dtype=t.uint8, pin_memory=True)
                for off in range(0, nbytes, 256 * MIB)]

    def free(self, bufs: list) -> None:
        bufs.clear()
        empty = getattr(self.torch._C, "_host_emptyCache", None)
        if empty is None:
            raise RuntimeError("this torch cannot empty its pinned host cache (torch._C._host_emptyCache)")
        empty()


class _Touch:
    """Anonymous memory, one byte written per 4 KiB page: what populating pages costs without pinning."""

    def __init__(self, huge: bool = False) -> None:
        self.huge = huge

    def alloc(self, nbytes: int) -> list:
        mm = mmap.mmap(-1, nbytes)
        if self.huge:
            mm.madvise(mmap.MADV_HUGEPAGE)
        view = memoryview(mm)
        step = mmap.PAGESIZE
        for off in range(0, nbytes, 64 * MIB):  # slices keep Python's per-page work off the clock's scale
            end = min(nbytes, off + 64 * MIB)
            view[off:end:step] = b"\x01" * len(range(off, end, step))
        view.release()
        return [mm]

    def free(self, bufs: list) -> None:
        for mm in bufs:
            mm.close()
        bufs.clear()


class _RegisterThp(_Touch):
    """Huge-page anonymous memory, populated, then pinned with cuMemHostRegister (the time includes both)."""

    def __init__(self) -> None:
        super().__init__(huge=True)
        self.cu = _Cu(GIB)

    def alloc(self, nbytes: int) -> list:
        import ctypes

        bufs = super().alloc(nbytes)
        ptr = ctypes.addressof(ctypes.c_char.from_buffer(bufs[0]))
        self.cu._ok(self.cu.cu.cuMemHostRegister(ptr, nbytes, 0))
        return bufs + [ptr]

    def free(self, bufs: list) -> None:
        self.cu._ok(self.cu.cu.cuMemHostUnregister(bufs.pop()))
        super().free(bufs)


def child(method: str, gib: float, reps: int) -> dict:
    nbytes = int(gib * GIB)
    impl = {"cu_1g": lambda: _Cu(GIB), "cu_256m": lambda: _Cu(256 * MIB), "torch_pin": _TorchPin,
            "touch": _Touch, "touch_thp": lambda: _Touch(huge=True), "register_thp": _RegisterThp}[method]()
    before = meminfo()
    rows = []
    for rep in range(reps):
        t0 = time.perf_counter()
        bufs = impl.alloc(nbytes)
        t1 = time.perf_counter()
        mid = meminfo()
        impl.free(bufs)
        t2 = time.perf_counter()
        rows.append({"rep": rep, "alloc_s": t1 - t0, "free_s": t2 - t1,
                     "alloc_s_per_gib": (t1 - t0) / gib, "free_s_per_gib": (t2 - t1) / gib,
                     "anon_huge_pages_held": mid.get("AnonHugePages", 0) - before.get("AnonHugePages", 0)})
    return {"method": method, "gib": gib, "reps": rows, "meminfo_before": before, "meminfo_after": meminfo()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", help="JSON with every run")
    ap.add_argument("--sizes", default="4,16", help="GiB per run, in this order")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--reps", type=int, default=2, help="alloc+free rounds per process (the last size gets 1)")
    ap.add_argument("--deadline-s", type=float, default=150.0, help="start no run after this many seconds")
    ap.add_argument("--timeout-s", type=float, default=120.0, help="per run")
    ap.add_argument("--child", nargs=3, metavar=("METHOD", "GIB", "REPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        method, gib, reps = args.child[0], float(args.child[1]), int(args.child[2])
        print(json.dumps(child(method, gib, reps)))
        return 0
    if not args.out:
        ap.error("--out is required")
    methods = [m for m in args.methods.split(",") if m]
    unknown = sorted(set(methods) - set(METHODS))
    if unknown:
        ap.error(f"unknown method(s) {unknown}; choose from {', '.join(METHODS)}")
    sizes = [float(s) for s in args.sizes.split(",") if s]
    result: dict = {"argv": sys.argv, "thp": thp(), "cpu_count": os.cpu_count(), "meminfo": meminfo(), "runs": []}
    start = time.perf_counter()
    for i, gib in enumerate(sizes):
        reps = args.reps if i < len(sizes) - 1 else 1
        for method in methods:  # interleaved: every method at one size before the next size
            if time.perf_counter() - start > args.deadline_s:
                result["runs"].append({"method": method, "gib": gib, "skipped": "deadline"})
                continue
            cmd = [sys.executable, __file__, "--child", method, str(gib), str(reps)]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
                row = (json.loads(p.stdout.strip().splitlines()[-1]) if p.returncode == 0
                       else {"method": method, "gib": gib, "error": p.stderr.strip()[-2000:]})
                if "error" in row:
                    row["error_line"] = row["error"].splitlines()[-1] if row["error"] else f"exit {p.returncode}"
            except subprocess.TimeoutExpired:
                row = {"method": method, "gib": gib, "error": f"timed out after {args.timeout_s} s"}
            result["runs"].append(row)
            reps_txt = ", ".join(f"alloc {r['alloc_s_per_gib'] * 1e3:.0f} free {r['free_s_per_gib'] * 1e3:.0f}"
                                 for r in row.get("reps", []))
            print(f"{method:10s} {gib:5.1f} GiB  ms/GiB: {reps_txt or row.get('error_line', row.get('error', ''))}", flush=True)
            Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
