"""Paired speed check of `vime simulate` in two checkouts (issue 16: the restructure must not slow it).

Run: python bench/paired_simulate.py BEFORE_DIR AFTER_DIR [--rounds N]
Alternates the two checkouts round by round (so machine load hits both alike) on the default run and
the 64-engine × 8192-sample case, each a fresh process, and prints per case the median wall and CPU
seconds (children's user + sys) of each side and their ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

CASES = {
    "default": ["simulate"],
    "large_8192": ["simulate", "--actor-num-nodes", "8", "--rollout-num-gpus-per-engine", "1",
                   "--rollout-batch-size", "1024", "--n-samples-per-prompt", "8"],
}


def run_once(tree: str, argv: list[str]) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    out = subprocess.run([sys.executable, "-m", "vime.cli", *argv], cwd=tree, capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": tree})
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode not in (0, 3):
        raise SystemExit(f"{tree}: vime {' '.join(argv)} failed:\n{out.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before")
    ap.add_argument("after")
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    print(f"1-min load at start: {os.getloadavg()[0]:.1f}")
    for case, argv in CASES.items():
        res: dict[str, list[tuple[float, float]]] = {"before": [], "after": []}
        for i in range(a.rounds):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for side in order:
                res[side].append(run_once(getattr(a, side), argv))
        med = {s: (statistics.median(w for w, _ in r), statistics.median(c for _, c in r)) for s, r in res.items()}
        print(f"{case:<11} wall before {med['before'][0]:.2f} s after {med['after'][0]:.2f} s "
              f"(x{med['after'][0] / med['before'][0]:.2f}); CPU before {med['before'][1]:.2f} s after "
              f"{med['after'][1]:.2f} s (x{med['after'][1] / med['before'][1]:.2f}); {a.rounds} rounds")
    print(f"1-min load at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
