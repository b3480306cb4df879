"""Measured (`vime train --backend real --json`) next to predicted (`vime simulate --json`) per phase, with the error (issue 9).

Two commands:

    ... vime train --json | python scripts/h200_train/compare.py stamp > train.jsonl
        copies stdin to stdout, adding ``wall_time`` (epoch seconds) to every JSON object line, so
        steps can be matched to the GPU-memory samples taken meanwhile;

    python scripts/h200_train/compare.py compare --train train.jsonl --sim sim.json [--mem gpu_mem.csv]
        [--out compare.json] [--mem-tolerance-mib 1024]
        prints a table and writes JSON: for start-up and for each phase of each step, measured and
        predicted seconds and ``error_pct = 100 * (predicted - measured) / measured``; the same for
        the mean over all steps and over the steady steps (rollout id >= 1); the weight versions the
        responses carried (must rise by one per step from start-up's); and, from the memory samples
        (CSV ``epoch,gpu_index,used_mib``), each GPU's level while the engines generate and while the
        trainer trains in every step, whether both came back to the same level each step (spread
        within the tolerance), and its peak next to the simulator's.

Exit status: 0 when the run is complete and consistent (every predicted step measured, versions
rising by one, memory level steady where sampled), 1 otherwise, 2 for unreadable input.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

PHASES = ("rollout", "offload", "train", "onload_weights", "weight_sync", "onload_kv")
STARTUP = ("t_onload_weights", "t_weight_sync", "t_onload_kv", "t_total")


def stamp(src: TextIO, dst: TextIO, clock: Any = time.time) -> int:
    """Copy lines, adding ``wall_time`` to JSON objects; other lines pass unchanged. Returns objects stamped."""
    n = 0
    for line in src:
        text = line.strip()
        if text.startswith("{"):
            try:
                obj = json.loads(text)
            except json.JSONDecodeError:
                obj = None
            if isinstance(obj, dict):
                obj["wall_time"] = clock()
                dst.write(json.dumps(obj, sort_keys=True) + "\n")
                dst.flush()
                n += 1
                continue
        dst.write(line)
        dst.flush()
    return n


def error_pct(measured: float | None, predicted: float | None) -> float | None:
    """100 × (predicted − measured) / measured; None when either is missing or measured is 0."""
    if measured is None or predicted is None or measured == 0:
        return None
    return 100.0 * (predicted - measured) / measured


def _row(measured: float | None, predicted: float | None) -> dict[str, float | None]:
    return {"measured_s": measured, "predicted_s": predicted, "error_pct": error_pct(measured, predicted)}


def read_train(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(startup event, step events by rollout id) of a `vime train --json` log; non-JSON lines are skipped."""
    startup = None
    steps = []
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if obj.get("event") == "startup":
            startup = obj
        elif obj.get("event") == "step":
            steps.append(obj)
    steps.sort(key=lambda s: s["rollout_id"])
    return startup, steps


def read_mem(path: Path) -> dict[int, list[tuple[float, float]]]:
    """GPU index -> [(epoch, used MiB)] sorted by time, from ``epoch,gpu,used_mib`` rows (bad rows skipped)."""
    out: dict[int, list[tuple[float, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.reader(f):
            try:
                t, gpu, used = float(row[0]), int(row[1]), float(row[2])
            except (ValueError, IndexError):
                continue
            out.setdefault(gpu, []).append((t, used))
    for samples in out.values():
        samples.sort()
    return out


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def phase_windows(step: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """Wall-clock (start, end) of each phase of a stamped step line: phases run in PHASES order from
    ``wall_time - t_step`` (save, eval and the gap come after them)."""
    t = float(step["wall_time"]) - float(step["t_step"])
    out = {}
    for ph in PHASES:
        d = float(step["phases"].get(ph) or 0.0)
        out[ph] = (t, t + d)
        t += d
    return out


def memory_per_step(mem: dict[int, list[tuple[float, float]]], steps: list[dict[str, Any]],
                    tolerance_mib: float) -> dict[str, Any]:
    """Each GPU's level in each step — median while the engines generate (middle 60 % of the rollout)
    and the most while the trainer trains — and whether both came back to the same level every step
    (spread over steps within `tolerance_mib`)."""
    gpus: dict[str, Any] = {}
    steady = True
    for gpu, samples in sorted(mem.items()):
        levels: dict[str, list[float | None]] = {"rollout_mib": [], "train_mib": []}
        for step in steps:
            win = phase_windows(step)
            r0, r1 = win["rollout"]
            lo, hi = r0 + 0.2 * (r1 - r0), r0 + 0.8 * (r1 - r0)
            during = sorted(u for t, u in samples if lo <= t <= hi)
            levels["rollout_mib"].append(during[len(during) // 2] if during else None)
            t0, t1 = win["train"]
            training = [u for t, u in samples if t0 <= t <= t1]
            levels["train_mib"].append(max(training) if training else None)
        row: dict[str, Any] = {**levels, "peak_mib": max(u for _, u in samples)}
        for key, vals in levels.items():
            seen = [v for v in vals if v is not None]
            spread = max(seen) - min(seen) if len(seen) >= 2 else None
            row[key.replace("_mib", "_spread_mib")] = spread
            steady &= spread is not None and spread <= tolerance_mib
        gpus[str(gpu)] = row
    return {"tolerance_mib": tolerance_mib, "gpus": gpus, "steady": bool(gpus) and steady}


def compare(train: dict[str, Any] | None, measured: list[dict[str, Any]], sim: dict[str, Any],
            mem: dict[int, list[tuple[float, float]]] | None = None, tolerance_mib: float = 1024.0) -> dict[str, Any]:
    """The comparison document (see the module docstring)."""
    predicted = {s["rollout_id"]: s for s in sim.get("steps", [])}
    by_id = {s["rollout_id"]: s for s in measured}
    problems: list[str] = []
    missing = sorted(set(predicted) - set(by_id))
    if missing:
        problems.append(f"steps predicted but not measured: {missing}")
    startup = {k: _row((train or {}).get(k), sim.get("startup", {}).get(k)) for k in STARTUP}
    steps = []
    for rid in sorted(set(predicted) & set(by_id)):
        m, p = by_id[rid], predicted[rid]
        rows = {ph: _row(m["phases"].get(ph), p["phases"].get(ph)) for ph in PHASES}
        rows["t_gap"] = _row(m.get("t_gap"), p.get("t_gap"))
        rows["t_step"] = _row(m.get("t_step"), p.get("t_step"))
        mm, pm = m.get("metrics", {}), p.get("metrics", {})
        steps.append({"rollout_id": rid, "phases": rows,
                      "weight_version": mm.get("rollout/weight_version"),
                      "response_len_mean": {"measured": mm.get("rollout/response_len/mean"),
                                            "predicted": pm.get("rollout/response_len/mean")},
                      "samples": {"measured": mm.get("rollout/kept_samples"), "predicted": pm.get("rollout/kept_samples")}})

    def mean_rows(sel: list[dict[str, Any]]) -> dict[str, Any]:
        out = {}
        for key in (*PHASES, "t_gap", "t_step"):
            ms = [s["phases"][key]["measured_s"] for s in sel if s["phases"][key]["measured_s"] is not None]
            ps = [s["phases"][key]["predicted_s"] for s in sel if s["phases"][key]["predicted_s"] is not None]
            out[key] = _row(_mean(ms), _mean(ps))
        return out

    first = int((train or {}).get("weight_version") or 1)
    versions = [s["weight_version"] for s in steps]
    expected = [float(first + i) for i in range(len(steps))]
    versions_ok = bool(steps) and [None if v is None else float(v) for v in versions] == expected
    if not versions_ok:
        problems.append(f"response weight versions {versions}, expected {expected}")
    doc: dict[str, Any] = {
        "schema": "vime.compare/1",
        "error_definition": "100 * (predicted - measured) / measured",
        "startup": startup,
        "steps": steps,
        "mean_all_steps": mean_rows(steps),
        "mean_steady_steps": mean_rows([s for s in steps if s["rollout_id"] >= 1]),
        "weight_versions": {"seen": versions, "expected": expected, "ok": versions_ok},
    }
    if mem is not None:
        stamped = [by_id[s["rollout_id"]] for s in steps]
        if any(m.get("wall_time") is None for m in stamped):
            problems.append("step lines carry no wall_time (pipe `vime train --json` through `compare.py stamp`)")
        else:
            doc["memory"] = memory_per_step(mem, stamped, tolerance_mib)
            # the simulator's per-GPU peak next to nvidia-smi's (which also counts memory outside the model's tags)
            for g in sim.get("memory", {}).get("gpus", []):
                row = doc["memory"]["gpus"].get(str(g.get("gpu")))
                if row is not None and g.get("peak_gib") is not None:
                    row["predicted_peak_mib"] = g["peak_gib"] * 1024
                    row["peak_error_pct"] = error_pct(row["peak_mib"], row["predicted_peak_mib"])
            if not doc["memory"]["steady"]:
                problems.append("GPU memory did not return to the same level each step (see memory)")
    doc["problems"] = problems
    doc["ok"] = not problems
    return doc


def _fmt(x: float | None, spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
        return "-".rjust(int(width or 0))
    return format(x, spec)


def format_table(doc: dict[str, Any]) -> str:
    """Human view: start-up, each step, and the steady mean, one row per phase."""
    lines = [f"{'':16}{'measured s':>12}{'predicted s':>13}{'error %':>9}"]

    def block(title: str, rows: dict[str, Any]) -> None:
        lines.append(title)
        for name, r in rows.items():
            lines.append(f"  {name:14}{_fmt(r['measured_s'], '12.3f')}{_fmt(r['predicted_s'], '13.3f')}"
                         f"{_fmt(r['error_pct'], '9.1f')}")

    block("start-up", doc["startup"])
    for s in doc["steps"]:
        block(f"step {s['rollout_id']} (weight version {s['weight_version']}, response mean "
              f"{_fmt(s['response_len_mean']['measured'], '.0f')} measured / "
              f"{_fmt(s['response_len_mean']['predicted'], '.0f')} predicted)", s["phases"])
    block("mean over steps >= 1", doc["mean_steady_steps"])
    if "memory" in doc:
        lines.append(f"GPU memory per step (MiB), same level each step within {doc['memory']['tolerance_mib']:.0f}: "
                     f"{doc['memory']['steady']}")
        for gpu, g in doc["memory"]["gpus"].items():
            lines.append(f"  gpu {gpu}: rollout {g['rollout_mib']} train {g['train_mib']} peak {g['peak_mib']}"
                         f" (predicted {_fmt(g.get('predicted_peak_mib'), '.0f')},"
                         f" error {_fmt(g.get('peak_error_pct'), '.1f')} %)")
    lines.append("OK" if doc["ok"] else "PROBLEMS: " + "; ".join(doc["problems"]))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("stamp", help="add wall_time to the JSON lines of stdin")
    c = sub.add_parser("compare", help="measured vs predicted per phase")
    c.add_argument("--train", required=True, type=Path)
    c.add_argument("--sim", required=True, type=Path)
    c.add_argument("--mem", type=Path)
    c.add_argument("--out", type=Path)
    c.add_argument("--mem-tolerance-mib", type=float, default=1024.0)
    a = ap.parse_args(argv)
    if a.cmd == "stamp":
        stamp(sys.stdin, sys.stdout)
        return 0
    try:
        startup, measured = read_train(a.train)
        sim = json.loads(a.sim.read_text())
        mem = read_mem(a.mem) if a.mem else None
    except (OSError, json.JSONDecodeError) as exc:
        print(f"compare: cannot read the inputs: {exc}", file=sys.stderr)
        return 2
    doc = compare(startup, measured, sim, mem, a.mem_tolerance_mib)
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(format_table(doc))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
