"""Scale of the simulator: the rollout of one step on 1,024 GPUs (512 engines of TP 2), 65,536 samples ≤ 8k tokens.

Run: python bench/bench_sim_scale.py [CASE ...] [--profile cpu|mem] [--drop-results] [--step]
Each case runs in a fresh process (peak RSS is per process) and prints wall s, CPU s and peak RSS
(resource.getrusage). Target, not asserted: the `65k-8k` case under 60 s wall and 4 GiB peak RSS
on a 2-core machine. The other cases show how the cost grows with response length (65k samples at
1k…8k tokens) and with the sample count (8k…65k samples at 8k tokens).

The cluster is built from the same flags as `vime simulate` (128 nodes × 8 GPUs, colocated, TP 2
engines, --rollout-batch-size 8192 × --n-samples-per-prompt 8, --micro-batch-size 1 so that the
trainer's 8k-token micro-batches fit for `--step`), the requests as bench_sim_engine's
large case builds them (the 8 samples of a group share one prompt list, as the rollout's do).
`--drop-results` lets every response go as soon as it arrives (the simulator's own footprint,
without the 16 bytes per generated token a kept `GenerateResult` holds); `--step` runs the whole
orchestrated step (`vime simulate --num-rollout 1`: rollout, train, weight sync) instead of the
engine side alone; `--profile cpu` prints the top of cProfile, `--profile mem` tracemalloc's top
allocation sites when the first response arrives (every request is in the engines) and at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: import the vime of this checkout
    sys.path.insert(0, str(ROOT))

GiB = 1024**3
# name: (samples, longest response)
CASES: dict[str, tuple[int, int]] = {
    "65k-8k": (65_536, 8192),
    "65k-1k": (65_536, 1024),
    "65k-2k": (65_536, 2048),
    "65k-4k": (65_536, 4096),
    "8k-8k": (8_192, 8192),
    "16k-8k": (16_384, 8192),
    "32k-8k": (32_768, 8192),
    "1k-256": (1_024, 256),  # a smoke case: tests/bench runs it so the script cannot rot
}
DEFAULT = ["65k-8k"]


def _flags(samples: int, max_len: int) -> list[str]:
    return ["--actor-num-nodes", "128", "--actor-num-gpus-per-node", "8", "--rollout-num-gpus-per-engine", "2",
            "--rollout-max-response-len", str(max_len), "--rollout-max-context-len", str(max_len + 512),
            "--rollout-batch-size", str(samples // 8), "--n-samples-per-prompt", "8", "--num-rollout", "1",
            "--micro-batch-size", "1"]


def _rollout(samples: int, max_len: int, keep: bool) -> dict[str, Any]:
    """The engine side of the step: wake the engines, 65k requests through the router, all answered."""
    from vime.config import parse_args
    from vime.protocols import GenerateRequest
    from vime.sim import clock
    from vime.sim.backends import build_sim_backends

    b = build_sim_backends(parse_args(_flags(samples, max_len), command="simulate"))
    assert b.lengths is not None
    reqs = []
    for group in range(samples // 8):
        p = b.lengths.prompt(f"prompt-{group}", cap=512)
        prompt = list(range(1000 + group, 1000 + group + p))
        for i in range(8 * group, 8 * group + 8):
            reqs.append(GenerateRequest(prompt, {"max_tokens": max_len}, session_id=f"session-{i}",
                                        request_id=f"sample-{i}"))
    kept: list[Any] = []
    tokens = [0]

    async def one(r: GenerateRequest) -> None:
        res = await b.router.generate(r)
        if not tokens[0]:
            _memory_top("first response")
        tokens[0] += res.completion_tokens
        if keep:
            kept.append(res)

    async def main() -> float:
        await b.trainer.sleep()  # the trainer comes up awake; start-up hands the GPUs to the engines (seed step 3)
        await asyncio.gather(*(e.wake_up(None) for e in b.engines))
        start = clock.now()
        await asyncio.gather(*(one(r) for r in reqs))
        return clock.now() - start

    virtual = clock.run(main(), env=b.env)
    _memory_top("the end")
    stats = b.rollout_stats()
    assert stats["requests"] == samples and tokens[0] == stats["tokens_generated"]
    return {"engines": len(b.engines), "virtual_rollout_s": round(virtual, 3), "tokens": stats["tokens_generated"],
            "phases": sum(e.stats.phases for e in b.engines), "iterations": stats["iterations"],
            "preemptions": stats["preemptions"], "kept_results": len(kept)}


def _step(samples: int, max_len: int) -> dict[str, Any]:
    """The whole orchestrated step, as `vime simulate --num-rollout 1` runs it."""
    from vime.config import parse_args
    from vime.runs.sim import simulate

    sim = simulate(parse_args(_flags(samples, max_len), command="simulate"))
    _memory_top("the end")
    out: dict[str, Any] = {"fits": sim.fits, "tokens": sim.backends.rollout_stats()["tokens_generated"]}
    if sim.oom is not None:
        out["oom"] = str(sim.oom)
    if sim.steps:
        out |= {"t_step": round(sim.steps[0].t_step, 3), "t_rollout": round(sim.steps[0].t_rollout, 3)}
    return out


def _memory_top(when: str) -> None:
    """tracemalloc's top allocation sites now (when `--profile mem` started it)."""
    import tracemalloc

    if not tracemalloc.is_tracing():
        return
    snap = tracemalloc.take_snapshot()
    current, peak = tracemalloc.get_traced_memory()
    print(f"tracemalloc at {when}: current {current / GiB:.2f} GiB, peak so far {peak / GiB:.2f} GiB", file=sys.stderr)
    for stat in snap.statistics("lineno")[:12]:
        print(f"  {stat.size / GiB:7.3f} GiB  {stat.count:>10,}  {stat.traceback[0]}", file=sys.stderr)


def run_case(name: str, keep: bool, step: bool, profile: str | None) -> dict[str, Any]:
    samples, max_len = CASES[name]
    work = (lambda: _step(samples, max_len)) if step else (lambda: _rollout(samples, max_len, keep))
    if profile == "mem":
        import tracemalloc

        tracemalloc.start(8)
    prof = None
    if profile == "cpu":
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    w0, c0 = time.perf_counter(), time.process_time()
    info = work()
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    if prof is not None:
        import pstats

        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"case": name, "samples": samples, "max_len": max_len, "mode": "step" if step else "rollout",
            "keep_results": keep, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "peak_rss_gib": round(rss / GiB, 2), **info}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*", default=DEFAULT, help=f"from {', '.join(CASES)} (default: {DEFAULT[0]})")
    ap.add_argument("--drop-results", action="store_true", help="do not keep the responses")
    ap.add_argument("--step", action="store_true", help="the whole orchestrated step, not the rollout alone")
    ap.add_argument("--profile", choices=("cpu", "mem"), help="cProfile or tracemalloc (slower; one case)")
    ap.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    unknown = [c for c in a.cases if c not in CASES]
    if unknown:
        ap.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    if a.in_process:
        for name in a.cases:
            print(json.dumps(run_case(name, not a.drop_results, a.step, a.profile)), flush=True)
        return
    extra = (["--drop-results"] if a.drop_results else []) + (["--step"] if a.step else []) \
        + (["--profile", a.profile] if a.profile else [])
    for name in a.cases:  # a fresh process per case: ru_maxrss is the peak of the whole process
        subprocess.run([sys.executable, __file__, name, "--in-process", *extra], check=True, cwd=ROOT)


if __name__ == "__main__":
    main()
