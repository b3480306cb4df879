"""Speed of `--search` at scale (issue 25): a 10,000-configuration search, and the same winner as exhaustive on a subset.

Run once per scenario (it takes minutes; not a timed test):

    PYTHONPATH=$PWD python bench/bench_search.py seed          # Qwen3-4B, the default scenario, ≤ 128 GPUs
    PYTHONPATH=$PWD python bench/bench_search.py qwen3-32b     # Qwen3-32B, ≤ 128 GPUs

Prints (and writes to --out as JSON): the grid size, wall time, points pruned per rule, points
simulated, the winner; then, on the subset of the grid with at most --subset-max-gpus GPUs, the
pruned search and the exhaustive one (every point simulated in full) and whether their winners agree.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from typing import Any

from vime.config import parse_args
from vime.runs.search import PLANNING_AXES, grid, run_search

SCENARIOS = {"seed": [], "qwen3-32b": ["--model", "Qwen3-32B"]}


def _cpu_s() -> float:
    """CPU seconds of this process and its finished workers (the machine is shared: wall time alone misleads)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _row(best: Any) -> dict[str, Any] | None:
    return None if best is None else {"changes": best.changes, "t_step": best.t_step, "gpus": best.gpus}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenario", choices=sorted(SCENARIOS))
    ap.add_argument("--max-gpus", type=int, default=128)
    ap.add_argument("--subset-max-gpus", type=int, default=8)
    ap.add_argument("--workers", type=int, default=None)
    ap.add_argument("--out", default=None, help="JSON file for the figures")
    a = ap.parse_args()
    base = parse_args(SCENARIOS[a.scenario], command="simulate")
    load = os.getloadavg()
    points = grid(a.max_gpus, PLANNING_AXES)
    print(f"{a.scenario}: {len(points):,} configurations, {os.cpu_count()} cores, load {load[0]:.2f}", flush=True)
    t, c = time.perf_counter(), _cpu_s()
    best, ranked, stats = run_search(base, points=points, workers=a.workers, progress=sys.stderr.isatty())
    wall, cpu = time.perf_counter() - t, _cpu_s() - c
    print(f"  pruned search: {stats.summary()} (probe {stats.probe_s:.1f} s; {cpu:.0f} CPU-s; load now "
          f"{os.getloadavg()[0]:.2f})", flush=True)
    print(f"  winner: {_row(best)}")
    subset = [p for p in points if p["actor_num_nodes"] * p["actor_num_gpus_per_node"] <= a.subset_max_gpus]
    t, c = time.perf_counter(), _cpu_s()
    sb, _, sstats = run_search(base, points=subset, workers=a.workers)
    s_wall, s_cpu = time.perf_counter() - t, _cpu_s() - c
    t, c = time.perf_counter(), _cpu_s()
    eb, eranked, estats = run_search(base, points=subset, workers=a.workers, exhaustive=True)
    e_wall, e_cpu = time.perf_counter() - t, _cpu_s() - c
    same = (sb is None and eb is None) or (sb is not None and eb is not None and sb.changes == eb.changes
                                           and sb.t_step == eb.t_step)
    print(f"  subset ≤ {a.subset_max_gpus} GPUs, {len(subset):,} configurations: pruned {s_wall:.1f} s, {s_cpu:.0f} CPU-s "
          f"({sstats.summary()}); exhaustive {e_wall:.1f} s, {e_cpu:.0f} CPU-s ({len(eranked):,} simulated); "
          f"same winner: {same}")
    print(f"  subset winner: {_row(eb)}")
    figures = {"scenario": a.scenario, "argv": SCENARIOS[a.scenario], "cores": os.cpu_count(), "load_1m": load[0],
               "configurations": len(points), "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "stats": stats.to_dict(),
               "winner": _row(best),
               "subset": {"max_gpus": a.subset_max_gpus, "configurations": len(subset), "pruned_wall_s": round(s_wall, 1), "pruned_cpu_s": round(s_cpu, 1),
                          "pruned_stats": sstats.to_dict(), "exhaustive_wall_s": round(e_wall, 1), "exhaustive_cpu_s": round(e_cpu, 1),
                          "pruned_winner": _row(sb), "exhaustive_winner": _row(eb), "same_winner": same}}
    if a.out:
        with open(a.out, "w") as f:
            json.dump(figures, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
