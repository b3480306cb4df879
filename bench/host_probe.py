"""The host's single-thread speed at the work vLLM's front end and Megatron's launches do, recorded beside each GPU run.

The host-bound phases (vLLM's CPU step at small models, the API server's building of responses, the
one-by-one MoE experts) moved by 20–40 % between H200 leases while the GPU-bound ones stayed put
(bench/data/h200_notes.md, ninth session): the machines behind one device kind differ in their CPUs.
This probe times three fixed single-thread workloads so a run's host-bound figures can be set against
the speed of the host that produced them:

- ``python_loop_s``: a pure-Python loop with dict and list work (a scheduler's and an API server's kind);
- ``json_dumps_s``: 256 responses of 1024 token ids and their log-probs serialized (the response building);
- ``torch_dispatch_s``: small CPU tensor ops through PyTorch's dispatcher (the per-kernel launch path),
  absent when torch is not importable.

Each is the best of ``--repeats`` timings (the least disturbed), in seconds; also the CPU model, the
cores and the load average. Usage: ``python bench/host_probe.py [--repeats N] [--out host.json]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from calibrate import _cpu_name as cpu_model  # noqa: E402 - the calibration's reading of /proc/cpuinfo


def python_loop() -> None:
    """Dict and list churn: 200k iterations of the bookkeeping a scheduler does per request."""
    state: dict[int, list[int]] = {}
    for i in range(200_000):
        row = state.setdefault(i & 1023, [])
        row.append(i)
        if len(row) > 8:
            row.pop(0)


def json_dumps() -> None:
    """256 responses of 1024 token ids with a log-prob each, as an API server returns them."""
    ids = list(range(1024))
    logprobs = [-0.5 - (i % 7) * 0.1 for i in range(1024)]
    for _ in range(256):
        json.dumps({"token_ids": ids, "logprobs": logprobs, "finish_reason": "length"})


def torch_dispatch() -> None:
    """4000 tiny CPU ops: the dispatcher's fixed cost, which bounds how fast a host launches kernels."""
    import torch  # noqa: PLC0415 - optional: the probe runs without it

    a = torch.ones(8)
    for _ in range(1000):
        b = a + 1.0
        b = b * 2.0
        b = b.sum()
        a = a.clone()


def best_of(fn: Callable[[], None], repeats: int) -> float:
    """The fastest of `repeats` runs of `fn`, in seconds (after one warm-up run)."""
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def probe(repeats: int = 5) -> dict:
    """The host's description and the three timings (see the module docstring)."""
    out = {"cpu_model": cpu_model(), "cpus": os.cpu_count(), "load_avg_1m": os.getloadavg()[0],
           "python": platform.python_version(), "repeats": repeats,
           "python_loop_s": best_of(python_loop, repeats), "json_dumps_s": best_of(json_dumps, repeats)}
    try:
        import torch  # noqa: F401, PLC0415

        out["torch_dispatch_s"] = best_of(torch_dispatch, repeats)
    except ImportError:
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5, help="timings per workload; the fastest is kept (default 5)")
    ap.add_argument("--out", type=Path, help="write the JSON here as well as to stdout")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be at least 1, got {args.repeats}")
    if args.out is not None and not args.out.parent.is_dir():
        ap.error(f"--out {args.out}: the folder {args.out.parent} does not exist")
    text = json.dumps(probe(args.repeats), indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
