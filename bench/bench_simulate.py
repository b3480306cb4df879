"""Speed of `vime simulate` as a user meets it: the default run from process start, and a 100-point sweep.

Targets (issue 5): default run end to end under 3 s on a 2-core machine; a 100-point sweep of the
seed scenario under 60 s on its 2 cores. Run: `pytest bench/bench_simulate.py --benchmark-only -s`.
"""

from __future__ import annotations

import subprocess
import sys

from vime.config import parse_args
from vime.runs.sweep import parse_sweep, run_points


def test_default_run_process_start_to_report(benchmark):
    def run() -> None:
        out = subprocess.run([sys.executable, "-m", "vime.cli", "simulate"], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr

    benchmark.pedantic(run, rounds=3, iterations=1)


def test_sweep_of_100_points(benchmark):
    base = parse_args(["--num-rollout", "1"], command="simulate")
    points = parse_sweep(["micro-batch-size=1,2,4,8,16", "gpu-memory-utilization=0.5,0.6,0.7,0.8,0.9",
                          "rollout-max-response-len=512,1024,1536,2048"])
    assert len(points) == 100

    def run() -> None:
        results = run_points(base, points)
        assert len(results) == 100

    benchmark.pedantic(run, rounds=1, iterations=1)
