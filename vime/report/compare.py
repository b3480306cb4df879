"""Measured next to predicted: real runs (`vime train --json`) against their simulation (`vime simulate --json`), phase by phase and call for call (issues 9, 26).

One comparison for every pair the project makes — the GPU runs (scripts/h200_train), the CPU twin
(bench/data/cpu_twin.json), the reports — through `vime compare` (`vime.cli.compare`):

    vime compare --train RUN.jsonl [--train RUN2.jsonl ...] --sim SIM.json [--mem gpu_mem.csv]
                 [--out COMPARE.json] [--tolerance-pct 20] [--calls]
    ... vime train --json | vime compare stamp > RUN.jsonl     # adds wall_time to every JSON line

Inputs: a measured run is the JSON lines `vime train --json` prints (``startup`` and ``step``
events; ``calls`` in each when it ran with ``--record-calls``); the prediction is the
``vime.simulate/1`` document (or, the same way, the JSON lines of ``vime train --backend sim``).
With several measured runs of one configuration, each phase's measured value is the median over
the runs and its spread the half range, ``100 × (max − min) / 2 / median``.

The ``vime.compare/1`` document: for start-up and for each phase of each step, measured and
predicted seconds and ``error_pct = 100 × (predicted − measured) / measured``; the same for the mean
over all steps and over the steady steps (rollout id ≥ 1: the first step of a fresh server pays
its warm-up); per phase of the steady mean the spread and whether the error is within
``max(spread, tolerance)``; the weight versions the responses carried (rising by one per step from
start-up's); with memory samples (CSV ``epoch,gpu_index,used_mib``, GPU runs) each GPU's level while
the engines generate and while the trainer trains, and its peak next to the simulator's; and when
both sides recorded their calls, whether every measured run made the simulation's calls, rollout by
rollout, and the first call where one did not.

Exit status of the command: 0 when complete and consistent (every predicted step measured,
versions rising by one, memory steady where sampled, calls equal where recorded), 1 otherwise,
2 for unreadable input. Phase errors never fail it: they are figures, not assertions.
"""

from __future__ import annotations

import csv
import json
import math
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

from vime.report.calls import first_divergence, format_sequences

PHASES = ("rollout", "offload", "train", "onload_weights", "weight_sync", "onload_kv")
STARTUP = ("t_onload_weights", "t_weight_sync", "t_onload_kv", "t_total")
ROWS = (*PHASES, "t_gap", "t_step")
SCHEMA = "vime.compare/1"

Run = tuple[dict[str, Any] | None, list[dict[str, Any]]]  # (startup event, step events)


# --------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------


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


def read_train(path: Path) -> Run:
    """(startup event, step events by rollout id) of a `vime train --json` log; non-JSON lines are skipped."""
    return train_events(Path(path).read_text().splitlines())


def read_sim(path: Path) -> dict[str, Any]:
    """A prediction: the ``vime.simulate/1`` document, or the JSON lines of ``vime train --backend sim`` (made into one)."""
    text = path.read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        doc = None
    if isinstance(doc, dict):
        return doc
    startup, steps = read_train(path)
    if not steps:
        raise ValueError(f"{path}: neither a vime simulate --json document nor vime train --json lines")
    return {"startup": startup, "steps": steps}


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


# --------------------------------------------------------------------------------------------
# Rows
# --------------------------------------------------------------------------------------------


def error_pct(measured: float | None, predicted: float | None) -> float | None:
    """100 × (predicted − measured) / measured; None when either is missing or measured is 0."""
    if measured is None or predicted is None or measured == 0:
        return None
    return 100.0 * (predicted - measured) / measured


def _row(measured: float | None, predicted: float | None, runs: Sequence[float | None] = ()) -> dict[str, Any]:
    row: dict[str, Any] = {"measured_s": measured, "predicted_s": predicted, "error_pct": error_pct(measured, predicted)}
    seen = [x for x in runs if x is not None]
    if len(seen) > 1:
        row["measured_runs_s"] = list(seen)
        row["spread_pct"] = 100.0 * (max(seen) - min(seen)) / 2 / measured if measured else None
    return row


def _median(xs: Sequence[float | None]) -> float | None:
    seen = [x for x in xs if x is not None]
    return float(statistics.median(seen)) if seen else None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def _phase(step: Mapping[str, Any], key: str) -> float | None:
    if key in PHASES:
        v = step.get("phases", {}).get(key)
    else:
        v = step.get(key)
    return None if v is None else float(v)


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


# --------------------------------------------------------------------------------------------
# The comparison
# --------------------------------------------------------------------------------------------


def _calls_of(startup: Mapping[str, Any] | None, steps: Sequence[Mapping[str, Any]]) -> dict[str, list[Any]] | None:
    """The call log of a run or a prediction (``calls`` in start-up and in each step), or None if it has none."""
    out: dict[str, list[Any]] = {}
    if startup and "calls" in startup:
        out["startup"] = list(startup["calls"])
    for s in steps:
        if "calls" in s:
            out[str(s["rollout_id"])] = list(s["calls"])
    return out or None


def compare_runs(runs: Sequence[Run], sim: dict[str, Any], mem: dict[int, list[tuple[float, float]]] | None = None,
                 tolerance_mib: float = 1024.0, *, tolerance_pct: float = 20.0) -> dict[str, Any]:
    """The comparison document of one or more measured runs of one configuration against their prediction
    (module docstring)."""
    if not runs:
        raise ValueError("compare_runs needs at least one measured run")
    predicted = {s["rollout_id"]: s for s in sim.get("steps", [])}
    sim_startup = sim.get("startup") or {}
    problems: list[str] = []
    by_id = [{s["rollout_id"]: s for s in steps} for _, steps in runs]
    for k, ids in enumerate(by_id):
        missing = sorted(set(predicted) - set(ids))
        if missing:
            where = f" in run {k + 1}" if len(runs) > 1 else ""
            problems.append(f"steps predicted but not measured{where}: {missing}")
    common = sorted(set(predicted).intersection(*[set(ids) for ids in by_id]))
    startup = {}
    for key in STARTUP:
        vals = [(st or {}).get(key) for st, _ in runs]
        startup[key] = _row(_median(vals), sim_startup.get(key), vals)
    steps = []
    for rid in common:
        p = predicted[rid]
        rows = {}
        for key in ROWS:
            vals = [_phase(ids[rid], key) for ids in by_id]
            rows[key] = _row(_median(vals), _phase(p, key), vals)
        first = by_id[0][rid]
        mm, pm = first.get("metrics", {}), p.get("metrics", {})
        steps.append({"rollout_id": rid, "phases": rows,
                      "weight_version": mm.get("rollout/weight_version"),
                      "response_len_mean": {"measured": mm.get("rollout/response_len/mean"),
                                            "predicted": pm.get("rollout/response_len/mean")},
                      "samples": {"measured": mm.get("rollout/kept_samples"), "predicted": pm.get("rollout/kept_samples")}})

    def mean_rows(ids: Sequence[int], check: bool) -> dict[str, Any]:
        out = {}
        for key in ROWS:
            per_run = [_mean([v for rid in ids if (v := _phase(r[rid], key)) is not None]) for r in by_id]
            pred = _mean([v for rid in ids if (v := _phase(predicted[rid], key)) is not None])
            row = _row(_median(per_run), pred, per_run)
            if check and row["error_pct"] is not None:
                allowed = max(row.get("spread_pct") or 0.0, tolerance_pct)
                row["allowed_pct"] = allowed
                row["within"] = abs(row["error_pct"]) <= allowed
            out[key] = row
        return out

    versions_ok = True
    seen_versions: list[Any] = []
    expected: list[float] = []
    for k, ((st, _), ids) in enumerate(zip(runs, by_id, strict=True)):
        first_v = int((st or {}).get("weight_version") or 1)
        vs = [ids[rid].get("metrics", {}).get("rollout/weight_version") for rid in common]
        exp = [float(first_v + i) for i in range(len(common))]
        if k == 0:
            seen_versions, expected = vs, exp
        if not common or [None if v is None else float(v) for v in vs] != exp:
            versions_ok = False
            where = f" in run {k + 1}" if len(runs) > 1 else ""
            problems.append(f"response weight versions {vs}{where}, expected {exp}")
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "error_definition": "100 * (predicted - measured) / measured",
        "runs": len(runs),
        "tolerance_pct": tolerance_pct,
        "startup": startup,
        "steps": steps,
        "mean_all_steps": mean_rows(common, False),
        "mean_steady_steps": mean_rows([r for r in common if r >= 1], True),
        "weight_versions": {"seen": seen_versions, "expected": expected, "ok": versions_ok},
    }
    calls = _compare_calls(runs, sim)
    if calls is not None:
        doc["calls"] = calls
        if not calls["equal"]:
            problems.append(f"calls differ: {calls['first_divergence']}")
    if mem is not None:
        stamped = [by_id[0][rid] for rid in common]
        if any(m.get("wall_time") is None for m in stamped):
            problems.append("step lines carry no wall_time (pipe `vime train --json` through `vime compare stamp`)")
        else:
            doc["memory"] = memory_per_step(mem, stamped, tolerance_mib)
            # the simulator's per-GPU peak next to nvidia-smi's (which also counts memory outside the model's tags)
            for g in sim.get("memory", {}).get("gpus", []):
                row = doc["memory"]["gpus"].get(str(g.get("gpu")))
                if row is not None and g.get("peak_gib") is not None:
                    row["predicted_peak_mib"] = g["peak_gib"] * 1024
                    row["peak_error_pct"] = error_pct(row["peak_mib"], row["predicted_peak_mib"])
                # the level while the trainer trains, where its own memory decides (vime.simulate/1.2 on)
                train_gib = (g.get("phase_peaks_gib") or {}).get("train")
                seen = [v for v in (row or {}).get("train_mib", []) if v is not None]
                if row is not None and train_gib is not None and seen:
                    row["train_max_mib"] = max(seen)
                    row["predicted_train_mib"] = train_gib * 1024
                    row["train_error_pct"] = error_pct(row["train_max_mib"], row["predicted_train_mib"])
            if not doc["memory"]["steady"]:
                problems.append("GPU memory did not return to the same level each step (see memory)")
    doc["problems"] = problems
    doc["ok"] = not problems
    return doc


def _compare_calls(runs: Sequence[Run], sim: dict[str, Any]) -> dict[str, Any] | None:
    """Call for call, every measured run against the prediction (None unless both sides recorded calls)."""
    predicted = _calls_of(sim.get("startup"), sim.get("steps", []))
    measured = [_calls_of(st, steps) for st, steps in runs]
    if predicted is None or any(m is None for m in measured):
        return None
    per_run = []
    for m in measured:
        assert m is not None
        segs = [k for k in predicted if k in m]  # steps both sides ran
        d = first_divergence({k: m[k] for k in segs}, {k: predicted[k] for k in segs}, names=("measured", "predicted"))
        per_run.append(None if d is None else str(d))
    first = next((d for d in per_run if d is not None), None)
    return {"equal": first is None, "first_divergence": first, "per_run": per_run,
            "measured": measured[0], "predicted": predicted}


def compare(train: dict[str, Any] | None, measured: list[dict[str, Any]], sim: dict[str, Any],
            mem: dict[int, list[tuple[float, float]]] | None = None, tolerance_mib: float = 1024.0) -> dict[str, Any]:
    """One measured run against its prediction (`compare_runs` of one run)."""
    return compare_runs([(train, measured)], sim, mem, tolerance_mib)


# --------------------------------------------------------------------------------------------
# Printing
# --------------------------------------------------------------------------------------------


def _fmt(x: float | None, spec: str) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        width = "".join(ch for ch in spec.split(".")[0] if ch.isdigit())
        return "-".rjust(int(width or 0))
    return format(x, spec)


def format_table(doc: dict[str, Any], *, steps: bool = True, calls: bool = False) -> str:
    """Human view: start-up, each step (unless `steps` is False), and the steady mean, one row per phase;
    with several runs the spread, and for the steady mean whether the error is within the allowance;
    with `calls`, both sides' call sequences."""
    multi = doc.get("runs", 1) > 1
    head = f"{'':16}{'measured s':>12}{'predicted s':>13}{'error %':>9}"
    if multi:
        head += f"{'spread %':>10}"
    lines = [head]

    def block(title: str, rows: dict[str, Any]) -> None:
        lines.append(title)
        for name, r in rows.items():
            line = (f"  {name:14}{_fmt(r['measured_s'], '12.3f')}{_fmt(r['predicted_s'], '13.3f')}"
                    f"{_fmt(r['error_pct'], '9.1f')}")
            if multi:
                line += _fmt(r.get("spread_pct"), "10.1f")
            if "within" in r:
                line += f"  {'within' if r['within'] else 'OFF'} (allowed {r['allowed_pct']:.0f} %)"
            lines.append(line)

    block("start-up", doc["startup"])
    if steps:
        for s in doc["steps"]:
            block(f"step {s['rollout_id']} (weight version {s['weight_version']}, response mean "
                  f"{_fmt(s['response_len_mean']['measured'], '.0f')} measured / "
                  f"{_fmt(s['response_len_mean']['predicted'], '.0f')} predicted)", s["phases"])
    of_runs = f" (median of {doc['runs']} runs)" if multi else ""
    block(f"mean over steps >= 1{of_runs}", doc["mean_steady_steps"])
    if "memory" in doc:
        lines.append(f"GPU memory per step (MiB), same level each step within {doc['memory']['tolerance_mib']:.0f}: "
                     f"{doc['memory']['steady']}")
        for gpu, g in doc["memory"]["gpus"].items():
            lines.append(f"  gpu {gpu}: rollout {g['rollout_mib']} train {g['train_mib']} peak {g['peak_mib']}"
                         f" (predicted {_fmt(g.get('predicted_peak_mib'), '.0f')},"
                         f" error {_fmt(g.get('peak_error_pct'), '.1f')} %)")
            if g.get("predicted_train_mib") is not None:
                lines.append(f"    while training: most {g['train_max_mib']:.0f} (predicted {g['predicted_train_mib']:.0f},"
                             f" error {_fmt(g.get('train_error_pct'), '.1f')} %)")
    if "calls" in doc:
        c = doc["calls"]
        lines.append("calls: the same, rollout by rollout" if c["equal"] else f"calls DIFFER: {c['first_divergence']}")
        if calls:
            lines.append(format_sequences(c["measured"], c["predicted"], names=("measured", "predicted")))
    lines.append("OK" if doc["ok"] else "PROBLEMS: " + "; ".join(doc["problems"]))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The page's views (vime.report.html_compare.render_compare_html)
# --------------------------------------------------------------------------------------------


def train_events(lines: list[str]) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(startup event, step events by rollout id) of `vime train --json` lines; other lines are skipped."""
    startup = None
    steps = []
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        if obj.get("event") == "startup":
            startup = obj
        elif obj.get("event") == "step":
            steps.append(obj)
    steps.sort(key=lambda s: s["rollout_id"])
    return startup, steps


def peak_memory(measured_mib: dict[int, float], sim: dict[str, Any]) -> dict[str, Any]:
    """Each GPU's measured peak next to the simulator's (the ``memory`` section without per-step levels)."""
    predicted = {int(g["gpu"]): g["peak_gib"] * 1024 for g in sim.get("memory", {}).get("gpus", [])
                 if g.get("peak_gib") is not None}
    gpus = {}
    for gpu in sorted(set(measured_mib) | set(predicted)):
        m, p = measured_mib.get(gpu), predicted.get(gpu)
        if m is None:
            continue
        gpus[str(gpu)] = {"peak_mib": m, "predicted_peak_mib": p, "peak_error_pct": error_pct(m, p)}
    return {"gpus": gpus}


# --------------------------------------------------------------------------------------------
# Command line (`vime compare`, and scripts/h200_train/compare.py)
# --------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None, *, prog: str = "vime compare") -> int:
    """The command line (`vime compare`, scripts/h200_train/compare.py): `vime.cli.compare.run_compare`;
    unreadable input exits 2."""
    from vime.cli.compare import run_compare
    from vime.errors import ConfigError

    try:
        return run_compare(list(sys.argv[1:] if argv is None else argv), prog=prog)
    except ConfigError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2


__all__ = ["PHASES", "STARTUP", "SCHEMA", "train_events", "peak_memory", "stamp", "read_train", "read_sim", "read_mem", "error_pct", "phase_windows",
           "memory_per_step", "compare", "compare_runs", "format_table", "main"]
