"""bench/pin_cost.py, the pinned-memory cost probe for the H200 (issue 12), on a CPU: what runs here runs, the rest reports why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_touch_runs_and_cuda_methods_report_their_error(tmp_path: Path):
    out = tmp_path / "pin.json"
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "pin_cost.py"), "--out", str(out), "--sizes", "0.0625,0.125",
                        "--methods", "touch,cu_1g", "--reps", "2"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    data = json.loads(out.read_text())
    assert data["thp"].keys() == {"enabled", "defrag"}
    touch = [r for r in data["runs"] if r["method"] == "touch"]
    assert [r["gib"] for r in touch] == [0.0625, 0.125]
    assert [len(r["reps"]) for r in touch] == [2, 1]  # the last size runs once
    for r in touch:
        for rep in r["reps"]:
            assert rep["alloc_s"] > 0 and rep["free_s"] >= 0
            assert abs(rep["alloc_s_per_gib"] * r["gib"] - rep["alloc_s"]) < 1e-9
    cu = [r for r in data["runs"] if r["method"] == "cu_1g"]
    assert len(cu) == 2
    try:
        import cuda.bindings  # noqa: F401
        has_cuda = True
    except ImportError:
        has_cuda = False
    if not has_cuda:  # no driver bindings here: each run says why instead of stopping the probe
        assert all("error_line" in r and "cuda" in r["error_line"].lower() for r in cu)


def test_unknown_method_is_refused_by_name(tmp_path: Path):
    p = subprocess.run([sys.executable, str(ROOT / "bench" / "pin_cost.py"), "--out", str(tmp_path / "x.json"),
                        "--methods", "touch,cudaMallocManaged"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "cudaMallocManaged" in p.stderr and "touch" in p.stderr
