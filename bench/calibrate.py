"""Measure a GPU for the simulator and write a hardware profile `vime simulate --hardware FILE.json` reads (issue 12).

Run it on your own GPU:

    python bench/calibrate.py --out bench/data/h200_calibration.json --profile bench/data/H200-141G-measured.json

Sections (each timed with CUDA events after warm-up, median of repeats, random data):
  gemm     bf16 GEMMs at transformer shapes (QKV, O, MLP, LM head) for decode and training token counts
  hbm      device-to-device copy bandwidth (bytes read + written)
  host     pinned host<->device copies both ways (and both at once), pageable for reference
  vmm      CUDA virtual memory: cuMemCreate / Map+SetAccess / Unmap / Release per GiB at several
           chunk sizes; pinned host allocation per GiB (first touch and reuse)
  decode   a decode-like workload: a Qwen3-4B-shaped layer stack over a KV cache (CUDA graph)
  prefill  one long prompt through the same stack (flash attention)
  megatron a real Megatron-core step (bench/megatron_step.py, in a subprocess; needs megatron-core)
  cumem    pause/resume of trainer state: vime vs torch_memory_saver vs a plain pinned copy
           (bench/cumem_pause.py, one subprocess per method and size)
  tests    the GPU tests of vime's CuMem allocator (pytest -m gpu)

Raw numbers go to --out after every section (a crash keeps what was measured); the profile is
written from whatever sections ran, with one provenance note per value.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent

#: Model shapes for GEMMs and the decode/prefill workloads (Qwen3 family).
SHAPES = {
    "qwen3-4b": dict(layers=36, hidden=2560, heads=32, kv_heads=8, head_dim=128, ffn=9728, vocab=151936),
    "qwen3-8b": dict(layers=36, hidden=4096, heads=32, kv_heads=8, head_dim=128, ffn=12288, vocab=151936),
}
DECODE_TOKENS = [1, 8, 32, 64, 128, 256, 512]
TRAIN_TOKENS = [2048, 8192, 16384]


# --------------------------------------------------------------------------------------------
# timing
# --------------------------------------------------------------------------------------------


def _torch():
    import torch

    return torch


def timeit(fn, *, warmup: int = 3, repeat: int = 10, inner: int = 1) -> dict:
    """Median seconds per call of `fn` (called `inner` times between two CUDA events, `repeat` times)."""
    torch = _torch()
    cuda = torch.cuda.is_available()
    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    samples = []
    for _ in range(repeat):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(inner):
                fn()
            b.record()
            b.synchronize()
            samples.append(a.elapsed_time(b) / 1e3 / inner)
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
    return {"median_s": statistics.median(samples), "min_s": min(samples), "max_s": max(samples), "n": repeat}


def _device():
    torch = _torch()
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


# --------------------------------------------------------------------------------------------
# sections
# --------------------------------------------------------------------------------------------


def environment(args) -> dict:
    torch = _torch()
    env = {"date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"), "host": platform.node(),
           "python": sys.version.split()[0], "torch": torch.__version__, "torch_cuda": torch.version.cuda,
           "command": " ".join(shlex.quote(a) for a in sys.argv)}
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(gpu=p.name, sm_count=p.multi_processor_count, memory_bytes=p.total_memory,
                   capability=f"{p.major}.{p.minor}", mem_get_info=list(torch.cuda.mem_get_info()))
        try:
            q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,name,memory.total,clocks.max.sm,"
                                "pcie.link.gen.max,pcie.link.width.max", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=30)
            env["nvidia_smi"] = q.stdout.strip()
            env["driver"] = q.stdout.split(",")[0].strip()
        except (OSError, subprocess.SubprocessError) as e:
            env["nvidia_smi"] = f"unavailable: {e}"
    try:
        env["meminfo_total"] = int(open("/proc/meminfo").readline().split()[1]) * 1024
    except OSError:
        pass
    env["cpu_count"] = os.cpu_count()
    return env


def gemm(args) -> dict:
    torch = _torch()
    dev = _device()
    out: dict = {"rows": []}
    scale = args.quick
    # the classic square product: the ceiling to compare the others with
    n = 512 if scale else 8192
    a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    t = timeit(lambda a=a, b=b: a @ b, repeat=5 if scale else 10)
    out["square"] = {"n": n, **t, "tflops": 2 * n**3 / t["median_s"] / 1e12}
    del a, b
    for model, s in SHAPES.items():
        if scale and model != "qwen3-4b":
            continue
        h = s["hidden"]
        mats = {"qkv": (h, (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"]),
                "o": (s["heads"] * s["head_dim"], h), "gate_up": (h, 2 * s["ffn"]),
                "down": (s["ffn"], h), "lm_head": (h, s["vocab"])}
        for name, (k, nn) in mats.items():
            if scale:
                k, nn = max(8, k // 16), max(8, nn // 16)
            wbytes = k * nn * 2
            # several weight copies so a small-M GEMM reads its weight from HBM, not the 60 MB L2
            copies = max(1, min(8, math.ceil(256 * MIB / wbytes)))
            ws = [torch.randn(k, nn, device=dev, dtype=torch.bfloat16) for _ in range(copies)]
            for m in DECODE_TOKENS + TRAIN_TOKENS:
                if scale and m > 512:
                    continue
                x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
                state = {"i": 0}

                def f(x=x, ws=ws, state=state):
                    state["i"] = (state["i"] + 1) % len(ws)
                    return x @ ws[state["i"]]

                inner = 20 if m <= 512 else 3
                t = timeit(f, warmup=3, repeat=5, inner=inner)
                flops = 2 * m * k * nn
                bytes_ = (m * k + k * nn + m * nn) * 2
                out["rows"].append({"model": model, "op": name, "m": m, "k": k, "n": nn, **t,
                                    "tflops": flops / t["median_s"] / 1e12,
                                    "gb_per_s": bytes_ / t["median_s"] / 1e9})
            del ws
    torch.cuda.empty_cache() if dev.type == "cuda" else None
    return out


def hbm(args) -> dict:
    torch = _torch()
    dev = _device()
    rows = []
    for size in ([16 * MIB] if args.quick else [256 * MIB, 2 * GIB]):
        src = torch.empty(size, dtype=torch.uint8, device=dev).random_()
        dst = torch.empty_like(src)
        t = timeit(lambda src=src, dst=dst: dst.copy_(src), repeat=10)
        rows.append({"bytes": size, **t, "bytes_per_s": 2 * size / t["median_s"]})
        del src, dst
    return {"copy": rows, "bytes_per_s": max(r["bytes_per_s"] for r in rows)}


def host(args) -> dict:
    torch = _torch()
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA"}
    rows = []
    for size in [64 * MIB, GIB, 4 * GIB]:
        h = torch.empty(size, dtype=torch.uint8, pin_memory=True)
        h.random_()
        d = torch.empty(size, dtype=torch.uint8, device="cuda")
        t_h2d = timeit(lambda h=h, d=d: d.copy_(h, non_blocking=True), repeat=5, warmup=2)
        t_d2h = timeit(lambda h=h, d=d: h.copy_(d, non_blocking=True), repeat=5, warmup=2)
        rows.append({"bytes": size, "h2d": t_h2d, "d2h": t_d2h,
                     "h2d_bytes_per_s": size / t_h2d["median_s"], "d2h_bytes_per_s": size / t_d2h["median_s"]})
        if size == 4 * GIB:
            # both directions at once, on two streams (the copy engines are separate)
            h2, d2 = torch.empty_like(h, pin_memory=True), torch.empty_like(d)
            s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

            def both(h=h, d=d, h2=h2, d2=d2, s1=s1, s2=s2):
                with torch.cuda.stream(s1):
                    d.copy_(h, non_blocking=True)
                with torch.cuda.stream(s2):
                    h2.copy_(d2, non_blocking=True)
                torch.cuda.current_stream().wait_stream(s1)
                torch.cuda.current_stream().wait_stream(s2)

            t_both = timeit(both, repeat=3, warmup=1)
            rows[-1]["both_ways_bytes_per_s"] = 2 * size / t_both["median_s"]
            del h2, d2
        del h, d
    pageable = torch.empty(GIB, dtype=torch.uint8)
    d = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    t = timeit(lambda: d.copy_(pageable), repeat=3, warmup=1)
    return {"pinned": rows, "pageable_h2d_bytes_per_s": GIB / t["median_s"],
            "h2d_bytes_per_s": max(r["h2d_bytes_per_s"] for r in rows),
            "d2h_bytes_per_s": max(r["d2h_bytes_per_s"] for r in rows)}


def vmm(args) -> dict:
    torch = _torch()
    if not torch.cuda.is_available():
        return {"skipped": "no CUDA"}
    sys.path.insert(0, str(ROOT))
    from vime.real.cumem.cuda_driver import CudaDriver

    torch.cuda.init()
    drv = CudaDriver(0)
    total = 8 * GIB
    out: dict = {"granularity": drv.granularity, "total_bytes": total, "chunks": []}
    for chunk in [drv.granularity, 32 * MIB, 512 * MIB, 2 * GIB]:
        n = total // chunk
        t0 = time.perf_counter()
        vas = [drv.reserve(chunk) for _ in range(n)]
        t1 = time.perf_counter()
        hs = [drv.create(chunk) for _ in range(n)]
        t2 = time.perf_counter()
        for va, h in zip(vas, hs, strict=True):
            drv.map(va, chunk, h)
        t3 = time.perf_counter()
        for va in vas:
            drv.unmap(va, chunk)
        t4 = time.perf_counter()
        for h in hs:
            drv.release(h)
        t5 = time.perf_counter()
        for va in vas:
            drv.free_address(va, chunk)
        gib = total / GIB
        out["chunks"].append({"chunk_bytes": chunk, "count": n, "reserve_s_per_gib": (t1 - t0) / gib,
                              "create_s_per_gib": (t2 - t1) / gib, "map_access_s_per_gib": (t3 - t2) / gib,
                              "unmap_s_per_gib": (t4 - t3) / gib, "release_s_per_gib": (t5 - t4) / gib})
    # pinned host memory: a fresh allocation pays page faults + pinning, a second one may find the pages warm
    pins = []
    for attempt in range(2):
        t0 = time.perf_counter()
        ptrs = [drv.host_alloc(GIB) for _ in range(4)]
        t1 = time.perf_counter()
        for p in ptrs:
            drv.host_free(p)
        t2 = time.perf_counter()
        pins.append({"attempt": attempt, "alloc_s_per_gib": (t1 - t0) / 4, "free_s_per_gib": (t2 - t1) / 4})
    out["pinned_host"] = pins
    t0 = time.perf_counter()
    x = torch.empty(4 * GIB, dtype=torch.uint8, pin_memory=True)
    out["torch_pin_memory_s_per_gib"] = (time.perf_counter() - t0) / 4
    del x
    return out


def _stack(s: dict, dev, dtype, layers: int):
    torch = _torch()
    h, nh, nkv, hd, f = s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["ffn"]
    def w(k, n):
        return torch.randn(k, n, device=dev, dtype=dtype) * (k ** -0.5)
    return [dict(qkv=w(h, (nh + 2 * nkv) * hd), o=w(nh * hd, h), gu=w(h, 2 * f), d=w(f, h)) for _ in range(layers)], \
        w(h, s["vocab"])


def decode(args) -> dict:
    """Time one decode iteration of a full Qwen3-4B-shaped stack for batch B over context L."""
    torch = _torch()
    import torch.nn.functional as F

    dev = _device()
    s = dict(SHAPES["qwen3-4b"])
    if args.quick:
        s.update(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=1024)
    nh, nkv, hd, f = s["heads"], s["kv_heads"], s["head_dim"], s["ffn"]
    g = nh // nkv
    layers, lm = _stack(s, dev, torch.bfloat16, s["layers"])
    weight_bytes = sum(t.numel() * 2 for lay in layers for t in lay.values()) + lm.numel() * 2
    configs = [(1, 512), (1, 8192), (16, 2048), (16, 8192), (64, 512), (64, 2048), (64, 4096),
               (128, 1024), (256, 512), (256, 1024)]
    if args.quick:
        configs = [(1, 64), (4, 128)]
    rows = []
    for b, length in configs:
        kv = [(torch.randn(b, nkv, length, hd, device=dev, dtype=torch.bfloat16),
               torch.randn(b, nkv, length, hd, device=dev, dtype=torch.bfloat16)) for _ in layers]
        x0 = torch.randn(b, s["hidden"], device=dev, dtype=torch.bfloat16)

        def step(x0=x0, kv=kv, b=b):
            x = x0
            for lay, (k, v) in zip(layers, kv, strict=True):
                qkv = x @ lay["qkv"]
                q = qkv[:, : nh * hd].view(b, nkv, g, hd)
                sc = torch.matmul(q, k.transpose(-1, -2)) * (hd ** -0.5)
                pr = torch.softmax(sc.float(), dim=-1).to(torch.bfloat16)
                a = torch.matmul(pr, v).reshape(b, nh * hd)
                x = x + a @ lay["o"]
                gu = x @ lay["gu"]
                x = x + (F.silu(gu[:, :f]) * gu[:, f:]) @ lay["d"]
            return x @ lm

        eager = timeit(step, warmup=2, repeat=5)
        graphed = None
        if dev.type == "cuda":
            try:
                st = torch.cuda.Stream()
                st.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(st):
                    for _ in range(2):
                        step()
                torch.cuda.current_stream().wait_stream(st)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                graphed = timeit(graph.replay, warmup=3, repeat=10)
                del graph
            except RuntimeError as e:
                graphed = {"error": repr(e)}
        kv_bytes = sum(k.numel() * 2 * 2 for k, _ in kv)
        lin_flops = 2 * b * (weight_bytes // 2)
        attn_flops = 2 * 2 * b * s["layers"] * nh * hd * length
        best = graphed["median_s"] if graphed and "median_s" in graphed else eager["median_s"]
        rows.append({"batch": b, "context": length, "eager": eager, "graph": graphed,
                     "weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "flops": lin_flops + attn_flops,
                     "step_s": best, "bytes_per_s": (weight_bytes + kv_bytes) / best,
                     "tokens_per_s": b / best})
        del kv
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return {"model": "qwen3-4b shapes (no norms, no rope, no sampling)", "shape": s, "rows": rows}


def prefill(args) -> dict:
    torch = _torch()
    import torch.nn.functional as F

    dev = _device()
    s = dict(SHAPES["qwen3-4b"])
    lengths = [1024, 4096, 16384]
    if args.quick:
        s.update(layers=2, hidden=256, heads=4, kv_heads=2, head_dim=64, ffn=512, vocab=1024)
        lengths = [64, 128]
    nh, nkv, hd, f = s["heads"], s["kv_heads"], s["head_dim"], s["ffn"]
    layers, lm = _stack(s, dev, torch.bfloat16, s["layers"])
    params = sum(t.numel() for lay in layers for t in lay.values())
    rows = []
    for t_len in lengths:
        x0 = torch.randn(t_len, s["hidden"], device=dev, dtype=torch.bfloat16)

        def fwd(x0=x0, t_len=t_len):
            x = x0
            for lay in layers:
                qkv = x @ lay["qkv"]
                q = qkv[:, : nh * hd].view(t_len, nh, hd).transpose(0, 1).unsqueeze(0)
                k = qkv[:, nh * hd:(nh + nkv) * hd].view(t_len, nkv, hd).transpose(0, 1)
                v = qkv[:, (nh + nkv) * hd:].view(t_len, nkv, hd).transpose(0, 1)
                k = k.repeat_interleave(nh // nkv, dim=0).unsqueeze(0)
                v = v.repeat_interleave(nh // nkv, dim=0).unsqueeze(0)
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
                x = x + a.squeeze(0).transpose(0, 1).reshape(t_len, nh * hd) @ lay["o"]
                gu = x @ lay["gu"]
                x = x + (F.silu(gu[:, :f]) * gu[:, f:]) @ lay["d"]
            return x[-1:] @ lm  # vLLM computes logits for the last position only

        t = timeit(fwd, warmup=2, repeat=5)
        lin = 2 * t_len * params + 2 * s["hidden"] * s["vocab"]
        attn = 2 * 2 * s["layers"] * nh * hd * t_len * t_len // 2  # causal: half the square
        rows.append({"tokens": t_len, **t, "flops": lin + attn, "linear_flops": lin, "attn_flops": attn,
                     "tflops": (lin + attn) / t["median_s"] / 1e12})
    return {"model": "qwen3-4b shapes (no norms, no rope)", "shape": s, "rows": rows}


def _run(cmd: list[str], timeout: float, log: Path) -> dict:
    t0 = time.perf_counter()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        with open(log, "ab") as f:
            f.write(("\n$ " + " ".join(cmd) + "\n").encode())
            f.flush()
            p = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env, cwd=ROOT)
        rc = p.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    return {"cmd": " ".join(cmd), "rc": rc, "wall_s": time.perf_counter() - t0}


def _remaining(args) -> float:
    return args.deadline - time.monotonic()


def megatron(args) -> dict:
    runs = []
    work = Path(args.work)
    plan = [["--preset", args.megatron_preset, "--shapes", args.megatron_shapes]]
    if args.megatron_cumem:
        plan.append(["--preset", args.megatron_preset, "--shapes", args.megatron_shapes.split(",")[0],
                     "--steps", "2", "--cumem"])
    if args.quick:
        plan = [["--preset", "tiny", "--device", "cpu", "--shapes", "2x32", "--steps", "1", "--warmup", "1"]]
    for i, extra in enumerate(plan):
        if _remaining(args) < 90:
            runs.append({"skipped": "deadline", "args": extra})
            continue
        out = work / f"megatron_{i}.json"
        r = _run([sys.executable, str(ROOT / "bench" / "megatron_step.py"), *extra, "--out", str(out)],
                 min(args.sub_timeout, _remaining(args) - 30), work / "megatron.log")
        if out.exists():
            r["result"] = json.loads(out.read_text())
        runs.append(r)
    return {"runs": runs}


def cumem(args) -> dict:
    runs = []
    work = Path(args.work)
    for spec in args.cumem_plan.split(","):
        method, gib, cycles = spec.split(":")
        if _remaining(args) < 60:
            runs.append({"skipped": "deadline", "spec": spec})
            continue
        out = work / f"cumem_{method}_{gib}.json"
        cmd = [sys.executable, str(ROOT / "bench" / "cumem_pause.py"), "--method", method, "--gib", gib,
               "--cycles", cycles, "--out", str(out)]
        if args.host_limit_gib:
            cmd += ["--host-limit-gib", str(args.host_limit_gib)]
        r = _run(cmd, min(args.sub_timeout, _remaining(args) - 20), work / "cumem.log")
        if out.exists():
            r["result"] = json.loads(out.read_text())
        runs.append(r)
    return {"runs": runs}


def tests(args) -> dict:
    work = Path(args.work)
    junit = work / "gpu_tests.xml"
    # The lent machine has no pytest-asyncio, so the repo's pyproject (which names one of its options)
    # is replaced by a minimal ini with the same markers and warnings-as-errors.
    ini = ROOT / "scripts" / "h200" / "pytest-gpu.ini"
    cfg = ["-c", str(ini), "--rootdir", str(ROOT)] if args.gpu_test_ini else []
    r = _run([sys.executable, "-m", "pytest", *cfg, "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}",
              "tests/real/test_cumem_gpu.py"], min(args.sub_timeout, _remaining(args) - 10), work / "tests.log")
    log = (work / "tests.log").read_text(errors="replace")
    r["summary"] = [line for line in log.splitlines() if any(w in line for w in (" passed", " failed", " skipped", "error"))][-3:]
    return r


SECTIONS = {"gemm": gemm, "hbm": hbm, "host": host, "vmm": vmm, "decode": decode, "prefill": prefill,
            "megatron": megatron, "cumem": cumem, "tests": tests}


# --------------------------------------------------------------------------------------------
# the profile
# --------------------------------------------------------------------------------------------


def build_profile(raw: dict, name: str, base: dict | None) -> dict:
    """A hardware profile in vime/sim/hardware.py's schema: measured rates where we have them, the
    base preset's values (and notes) elsewhere; efficiencies fitted from the workloads."""
    env = raw.get("env", {})
    prof = json.loads(json.dumps(base)) if base else {
        "name": name, "memory_bytes": env.get("memory_bytes", 0), "bf16_flops": 0, "hbm_bytes_per_s": 0,
        "nvlink_bytes_per_s": 0, "host_link_h2d_bytes_per_s": 0, "host_link_d2h_bytes_per_s": 0,
        "cuda_context_bytes": 512 * MIB, "efficiency": {}, "vmm": {}, "sources": {}}
    prof["name"] = name
    src = prof.setdefault("sources", {})
    where = f"bench/calibrate.py on {env.get('gpu', '?')} (driver {env.get('driver', '?')}, torch {env.get('torch')}) {env.get('date', '')}"
    commands = sorted({s.get("command", "") for s in raw.get("sections", {}).values() if s.get("command")})
    prof["description"] = (f"Measured: {env.get('gpu', '?')}, driver {env.get('driver', '?')}, torch {env.get('torch')}, "
                           f"{env.get('date', '')}, by " + " and ".join(f"`{c}`" for c in commands or [env.get("command", "")]))
    if "memory_bytes" in env:
        prof["memory_bytes"] = env["memory_bytes"]
        src["memory_bytes"] = f"torch.cuda.get_device_properties().total_memory, {where}"
    g = raw.get("gemm", {})
    if "square" in g:
        best = max([g["square"]["tflops"]] + [r["tflops"] for r in g.get("rows", []) if r["m"] >= 2048])
        prof["bf16_flops"] = best * 1e12
        src["bf16_flops"] = (f"best measured bf16 GEMM ({best:.0f} TFLOP/s; 8192^3: {g['square']['tflops']:.0f}), "
                             f"random data, {where}; datasheet dense peak 989 TFLOP/s")
    h = raw.get("hbm", {})
    if "bytes_per_s" in h:
        prof["hbm_bytes_per_s"] = h["bytes_per_s"]
        src["hbm_bytes_per_s"] = f"device-to-device copy, bytes read + written, {where}; datasheet 4.8 TB/s"
    ho = raw.get("host", {})
    if "h2d_bytes_per_s" in ho:
        prof["host_link_h2d_bytes_per_s"] = ho["h2d_bytes_per_s"]
        prof["host_link_d2h_bytes_per_s"] = ho["d2h_bytes_per_s"]
        prof.setdefault("efficiency", {})["host_copy_util"] = 1.0
        src["host_link_h2d_bytes_per_s"] = f"pinned cudaMemcpyAsync H2D, best of 64 MiB/1 GiB/4 GiB, {where}"
        src["host_link_d2h_bytes_per_s"] = f"pinned cudaMemcpyAsync D2H, best of 64 MiB/1 GiB/4 GiB, {where}"
        src["efficiency.host_copy_util"] = "1.0: the host-link rates above are measured copy rates"
    eff = prof.setdefault("efficiency", {})
    v = raw.get("vmm", {})
    if v.get("chunks"):
        # PyTorch's caching allocator hands out segments of tensor size: take the 512 MiB chunks
        row = min(v["chunks"], key=lambda c: abs(c["chunk_bytes"] - 512 * MIB))
        vm = prof.setdefault("vmm", {})
        vm["create_map_s_per_gib"] = row["create_s_per_gib"] + row["map_access_s_per_gib"] + row["reserve_s_per_gib"]
        vm["unmap_release_s_per_gib"] = row["unmap_s_per_gib"] + row["release_s_per_gib"]
        src["vmm.create_map_s_per_gib"] = f"cuMemCreate+cuMemMap+cuMemSetAccess in {row['chunk_bytes'] // MIB} MiB chunks, {where}"
        src["vmm.unmap_release_s_per_gib"] = f"cuMemUnmap+cuMemRelease in {row['chunk_bytes'] // MIB} MiB chunks, {where}"
        if v.get("pinned_host"):
            vm["pinned_alloc_s_per_gib"] = v["pinned_host"][0]["alloc_s_per_gib"]
            src["vmm.pinned_alloc_s_per_gib"] = f"cuMemHostAlloc of 4 x 1 GiB, first time in the process, {where}"
    # At trainer scale the first pause pins tens of GiB: its measured rate beats the 4 GiB probe above.
    firsts = [r["result"] for r in raw.get("cumem", {}).get("runs", [])
              if r.get("result", {}).get("method") == "vime" and r["result"].get("cycles")]
    if firsts:
        big = max(firsts, key=lambda r: r["kept_bytes"])
        info = big["cycles"][0]["pause_info"]
        if info.get("host_alloc_bytes"):
            vm = prof.setdefault("vmm", {})
            vm["pinned_alloc_s_per_gib"] = info["host_alloc_seconds"] / (info["host_alloc_bytes"] / GIB)
            src["vmm.pinned_alloc_s_per_gib"] = (f"first vime CuMem pause of {big['kept_bytes'] / GIB:.0f} GiB: cuMemHostAlloc "
                                                 f"in 1 GiB chunks, {info['host_alloc_bytes'] / GIB:.0f} GiB in "
                                                 f"{info['host_alloc_seconds']:.1f} s (bench/cumem_pause.py), {where}")
    if prof.get("hbm_bytes_per_s") and raw.get("decode", {}).get("rows"):
        # decode is bandwidth-bound: bytes (weights + KV) / time / HBM rate at the largest batches
        rows = raw["decode"]["rows"]
        utils = [(r["weight_bytes"] + r["kv_bytes"]) / r["step_s"] / prof["hbm_bytes_per_s"] for r in rows
                 if r["batch"] >= 16]
        if utils:
            eff["decode_bw_util"] = min(1.0, statistics.median(utils))
            src["efficiency.decode_bw_util"] = (f"median over batch>=16 of (weights+KV bytes)/step time/HBM copy rate, "
                                                f"bench/calibrate.py decode section (CUDA graph), {where}")
    if prof.get("bf16_flops") and raw.get("prefill", {}).get("rows"):
        long = [r for r in raw["prefill"]["rows"] if r["tokens"] >= 4096]
        if long:
            eff["prefill_mfu"] = min(1.0, statistics.median(r["flops"] / r["median_s"] for r in long) / prof["bf16_flops"])
            src["efficiency.prefill_mfu"] = f"prefill FLOPs/time/bf16_flops for prompts >= 4096 tokens, {where}"
    mg = [r.get("result") for r in raw.get("megatron", {}).get("runs", []) if r.get("result", {}).get("ok")]
    mg = [m for m in mg if m.get("device") == "cuda" and not m.get("cumem")]
    if mg and prof.get("bf16_flops"):
        ent = mg[0]["shapes"]
        # FLOPs as the simulator counts them (vime.sim ModelSpec.sequence_flops: causal attention,
        # backward = 2 x forward), so that its trainer model reproduces the measured time; the
        # script's own count (full s^2 attention, as the unfused local spec computes) is the fallback.
        try:
            sys.path.insert(0, str(ROOT))
            from vime.sim.models import load_model

            spec = load_model({"qwen3-0.6b": "Qwen3-0.6B", "qwen3-1.7b": "Qwen3-1.7B",
                               "qwen3-4b": "Qwen3-4B"}[mg[0]["preset"]])
            flops = [3 * e["mbs"] * spec.sequence_flops(e["seq"]) for e in ent]
            how = "vime.sim ModelSpec.sequence_flops x 3"
        except (ImportError, KeyError):
            flops = [e["fwd_bwd_flops"] for e in ent]
            how = "bench/megatron_step.py flops_per_step (full attention)"
        mfu = [f / (e["fwd_s_median"] + e["bwd_s_median"]) / prof["bf16_flops"] for f, e in zip(flops, ent, strict=True)]
        eff["train_mfu"] = min(1.0, statistics.median(mfu))
        src["efficiency.train_mfu"] = (f"Megatron-core {mg[0]['preset']} (local spec: unfused attention, torch AdamW, no TE) "
                                       f"fwd+bwd FLOPs ({how}) / time / bf16_flops, median over shapes "
                                       f"{[(e['mbs'], e['seq']) for e in ent]}, {where}")
    return prof


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default="bench/data/calibration.json", help="raw measurements (JSON)")
    ap.add_argument("--profile", default=None, help="hardware profile to write (vime/sim/hardware.py schema)")
    ap.add_argument("--name", default="H200-141G-measured", help="profile name")
    ap.add_argument("--base", default="vime/sim/data/hardware/H200-141G.json",
                    help="preset whose unmeasured values (NVLink, context size, ...) the profile keeps")
    ap.add_argument("--sections", default="gemm,hbm,host,vmm,decode,prefill,megatron",
                    help=f"comma-separated, from {','.join(SECTIONS)}")
    ap.add_argument("--work", default="/tmp/vime-calibrate", help="folder for subprocess outputs and logs")
    ap.add_argument("--deadline-s", type=float, default=540, help="stop starting sections after this many seconds")
    ap.add_argument("--sub-timeout", type=float, default=300, help="seconds per subprocess")
    ap.add_argument("--megatron-preset", default="qwen3-1.7b")
    ap.add_argument("--megatron-shapes", default="1x4096,4x2048")
    ap.add_argument("--megatron-cumem", action="store_true", help="also run the step with state in CuMem regions")
    ap.add_argument("--cumem-plan", default="vime:8:4,tms:8:3,plain:8:3",
                    help="method:GiB:cycles,... for bench/cumem_pause.py")
    ap.add_argument("--host-limit-gib", type=float, default=None)
    ap.add_argument("--quick", action="store_true", help="tiny sizes (a CPU dry run of the script)")
    ap.add_argument("--gpu-test-ini", action="store_true",
                    help="run the GPU tests with scripts/h200/pytest-gpu.ini (machines without pytest-asyncio)")
    ap.add_argument("--from-raw", default=None,
                    help="measure nothing: merge these comma-separated raw files (later ones win) into --out "
                         "and write --profile from them (re-runs the fit on a CPU)")
    args = ap.parse_args()
    if args.from_raw:
        raw: dict = {"sections": {}}
        for f in args.from_raw.split(","):
            part = json.loads(Path(f).read_text())
            raw.update({k: v for k, v in part.items() if k != "sections"})  # later files win
            raw["sections"].update(part.get("sections", {}))
        Path(args.out).write_text(json.dumps(raw, indent=1))
        if args.profile:
            base = json.loads(Path(args.base).read_text()) if args.base and Path(args.base).exists() else None
            Path(args.profile).write_text(json.dumps(build_profile(raw, args.name, base), indent=2) + "\n")
        summary(raw)
        return 0
    args.deadline = time.monotonic() + args.deadline_s
    Path(args.work).mkdir(parents=True, exist_ok=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)

    raw: dict = {"env": environment(args), "sections": {}}
    if out.exists():  # sections measured by an earlier call (e.g. cumem in a second run) are kept
        try:
            old = json.loads(out.read_text())
            raw.update({k: v for k, v in old.items() if k in SECTIONS})
            raw["sections"].update(old.get("sections", {}))
        except (OSError, ValueError):
            pass
    for name in args.sections.split(","):
        if name not in SECTIONS:
            raise SystemExit(f"unknown section {name!r}; choose from {sorted(SECTIONS)}")
        if _remaining(args) < 20:
            raw["sections"][name] = {"skipped": "deadline"}
            continue
        t0 = time.perf_counter()
        try:
            raw[name] = SECTIONS[name](args)
            status = "ok"
        except Exception as e:  # noqa: BLE001 - keep what the other sections measure
            raw[name] = {"error": repr(e), "traceback": traceback.format_exc()}
            status = "error"
        raw["sections"][name] = {"status": status, "wall_s": time.perf_counter() - t0, "date": raw["env"]["date"],
                                 "command": raw["env"]["command"]}
        print(f"[calibrate] {name}: {status} in {time.perf_counter() - t0:.1f}s", flush=True)
        out.write_text(json.dumps(raw, indent=1))
    if args.profile:
        base = None
        if args.base and Path(args.base).exists():
            base = json.loads(Path(args.base).read_text())
        prof = build_profile(raw, args.name, base)
        Path(args.profile).write_text(json.dumps(prof, indent=2) + "\n")
        print(f"[calibrate] profile -> {args.profile}")
    summary(raw)
    return 0


def summary(raw: dict) -> None:
    """A short table last (the device tool returns the tail of the output)."""
    g = raw.get("gemm", {})
    if "square" in g:
        print(f"gemm 8192^3 bf16: {g['square']['tflops']:.0f} TFLOP/s")
        for r in g.get("rows", []):
            if r["model"] == "qwen3-4b" and r["op"] in ("gate_up", "lm_head"):
                print(f"  {r['op']:8s} m={r['m']:6d}: {r['tflops']:7.1f} TFLOP/s {r['gb_per_s']:7.0f} GB/s")
    if "bytes_per_s" in raw.get("hbm", {}):
        print(f"hbm copy: {raw['hbm']['bytes_per_s'] / 1e12:.2f} TB/s")
    ho = raw.get("host", {})
    if "h2d_bytes_per_s" in ho:
        print(f"pinned h2d {ho['h2d_bytes_per_s'] / 1e9:.1f} GB/s d2h {ho['d2h_bytes_per_s'] / 1e9:.1f} GB/s "
              f"pageable h2d {ho['pageable_h2d_bytes_per_s'] / 1e9:.1f} GB/s")
    for c in raw.get("vmm", {}).get("chunks", []):
        print(f"vmm chunk {c['chunk_bytes'] // MIB:5d} MiB: create {c['create_s_per_gib'] * 1e3:.2f} map {c['map_access_s_per_gib'] * 1e3:.2f} "
              f"unmap {c['unmap_s_per_gib'] * 1e3:.2f} release {c['release_s_per_gib'] * 1e3:.2f} ms/GiB")
    for p in raw.get("vmm", {}).get("pinned_host", []):
        print(f"pinned host alloc try {p['attempt']}: {p['alloc_s_per_gib'] * 1e3:.0f} ms/GiB")
    for r in raw.get("decode", {}).get("rows", []):
        print(f"decode B={r['batch']:4d} L={r['context']:5d}: {r['step_s'] * 1e3:7.2f} ms {r['bytes_per_s'] / 1e12:.2f} TB/s "
              f"(eager {r['eager']['median_s'] * 1e3:.2f} ms)")
    for r in raw.get("prefill", {}).get("rows", []):
        print(f"prefill T={r['tokens']:6d}: {r['median_s'] * 1e3:8.2f} ms {r['tflops']:.0f} TFLOP/s")
    for r in raw.get("megatron", {}).get("runs", []):
        res = r.get("result") or {}
        print(f"megatron rc={r.get('rc')} {r.get('wall_s', 0):.0f}s cumem={res.get('cumem')}")
        for e in res.get("shapes", []):
            print(f"  mbs={e['mbs']} seq={e['seq']}: fwd {e['fwd_s_median'] * 1e3:.0f} bwd {e['bwd_s_median'] * 1e3:.0f} "
                  f"opt {e['opt_s_median'] * 1e3:.0f} ms peak {e.get('peak_allocated_bytes', 0) / GIB:.1f} GiB "
                  f"{e.get('tflops_fwd_bwd', 0):.0f} TFLOP/s")
        for c in res.get("cumem_cycles", []):
            print(f"  cumem cycle {c['cycle']}: pause {c['pause']['gib_per_s']:.1f} resume {c['resume']['gib_per_s']:.1f} GiB/s")
    for r in raw.get("cumem", {}).get("runs", []):
        res = r.get("result") or {}
        cyc = res.get("cycles", [])
        desc = " | ".join(f"{c['pause_gib_s']:.1f}/{c['resume_gib_s']:.1f}" for c in cyc)
        print(f"cumem {res.get('method', r.get('spec'))} {res.get('gib', '')} GiB rc={r.get('rc')}: pause/resume GiB/s {desc} ok={res.get('ok')}")
    t = raw.get("tests", {})
    if t:
        print(f"gpu tests rc={t.get('rc')}: {t.get('summary')}")


if __name__ == "__main__":
    sys.exit(main())
