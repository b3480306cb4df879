"""vLLM's own wake times (its engine log) beside the whole steps' onload phases: what the server's round trip adds (issue 17).

    python bench/engine_wake_log.py                 # every run under bench/data/h200_train_e2e with an engine log
    python bench/engine_wake_log.py --json          # the same rows as JSON

vLLM logs "It took X seconds to wake up tags ['weights']" (and ['kv_cache']) inside its engine core; the whole step's
perf/onload_weights_time and perf/onload_kv_time are the client's /wake_up calls around them. Per run: the median over
the steps after the first of each, and their difference (HTTP, the API server, the engine core's RPC). The simulator's
wake terms split the same way: what vLLM's pool does (EngineSettings.wake_per_gib_s, the spill, the per-tensor restore)
and the call around it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "bench" / "data" / "h200_train_e2e"
WAKE = re.compile(r"It took ([0-9.]+) seconds to wake up tags \['(weights|kv_cache)'\]")


def log_wakes(text: str) -> dict[str, list[float]]:
    """The engine log's wake times by tag, in order."""
    out: dict[str, list[float]] = {"weights": [], "kv_cache": []}
    for seconds, tag in WAKE.findall(text):
        out[tag].append(float(seconds))
    return out


def phases(train_jsonl: str) -> list[tuple[float, float]]:
    """(onload weights, onload KV) seconds of each step's report."""
    rows = []
    for line in train_jsonl.splitlines():
        m = json.loads(line)
        m = m.get("metrics", m)
        if "perf/onload_kv_time" in m:
            rows.append((m["perf/onload_weights_time"], m["perf/onload_kv_time"]))
    return rows


def run_row(name: str, wakes: dict[str, list[float]], steps: list[tuple[float, float]]) -> dict | None:
    """Medians over the steps after the first; the log's last wakes are the steps' (earlier ones: the start-up)."""
    n = len(steps)
    if n < 2 or len(wakes["weights"]) < n or len(wakes["kv_cache"]) < n:
        return None
    inside_w, inside_kv = wakes["weights"][-n:][1:], wakes["kv_cache"][-n:][1:]
    row = {"run": name, "weights_inside_s": statistics.median(inside_w),
           "weights_phase_s": statistics.median(s[0] for s in steps[1:]),
           "kv_inside_s": statistics.median(inside_kv), "kv_phase_s": statistics.median(s[1] for s in steps[1:])}
    row["weights_call_s"] = row["weights_phase_s"] - row["weights_inside_s"]
    row["kv_call_s"] = row["kv_phase_s"] - row["kv_inside_s"]
    return row


def rows(root: Path = RUNS) -> list[dict]:
    out = []
    for run in sorted(p for p in root.iterdir() if p.is_dir()):
        logs = sorted(run.glob("engine0.log")) + sorted(run.glob("logs/engine0.log"))
        if not logs or not (run / "train.jsonl").exists():
            continue
        row = run_row(run.name, log_wakes(logs[0].read_text(errors="replace")), phases((run / "train.jsonl").read_text()))
        if row:
            out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    table = rows()
    if a.json:
        print(json.dumps(table, indent=1))
        return 0
    for r in table:
        print(f"{r['run']:52s} weights: inside {1e3 * r['weights_inside_s']:6.1f} ms, phase {1e3 * r['weights_phase_s']:6.1f} "
              f"(+{1e3 * r['weights_call_s']:4.1f})   KV: inside {1e3 * r['kv_inside_s']:6.1f}, phase {1e3 * r['kv_phase_s']:6.1f} "
              f"(+{1e3 * r['kv_call_s']:4.1f})")
    calls = [r["weights_call_s"] for r in table] + [r["kv_call_s"] for r in table]
    if calls:
        print(f"{len(table)} runs: the call around vLLM's wake {1e3 * min(calls):.1f}-{1e3 * max(calls):.1f} ms, "
              f"median {1e3 * statistics.median(calls):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
