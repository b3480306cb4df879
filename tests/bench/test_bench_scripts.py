"""bench/ scripts still run against today's package (issue 16): each on its smallest case."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("extra", [["--drop-results"], ["--step"]])
def test_sim_scale_smoke_case_runs(extra: list[str]) -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench/bench_sim_scale.py"), "1k-256", "--in-process", *extra],
                         capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["samples"] == 1024 and row["tokens"] > 0 and row["peak_rss_gib"] > 0
    if "--step" in extra:
        assert row["fits"] is True and row["t_step"] > row["t_rollout"] > 0
    else:
        assert row["engines"] == 512 and row["kept_results"] == 0

