"""A measured run beside its simulation: the error of every phase, the weight versions, memory, and the views the page draws.

Inputs are what vime writes anyway: a run's `vime train --json` lines (or its ``vime.train/1``
document), the ``vime.simulate/1`` document of the same arguments, and optionally GPU memory
samples (CSV ``epoch,gpu_index,used_mib``, as ``nvidia-smi --query-gpu=timestamp,index,memory.used``
gives them, with the epoch first) or the recorders of both runs. ``error_pct = 100 × (simulated −
measured) / measured``. `compare` builds the ``vime.compare/1`` document; `format_table` prints it;
`views_from_steps` and `views_from_recorders` give `vime.report.html.render_compare_html` each side's
timeline and memory, on one time axis whose 0 is the first step's rollout.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

from vime.report.recorder import Recorder
from vime.report.view import PHASE_COLORS, PHASE_LABELS, run_view

PHASES = ("rollout", "offload", "train", "onload_weights", "weight_sync", "onload_kv")
STARTUP = ("t_onload_weights", "t_weight_sync", "t_onload_kv", "t_total")
SCHEMA = "vime.compare/1"


def error_pct(measured: float | None, predicted: float | None) -> float | None:
    """100 × (predicted − measured) / measured; None when either is missing or measured is 0."""
    if measured is None or predicted is None or measured == 0:
        return None
    return 100.0 * (predicted - measured) / measured


def _row(measured: float | None, predicted: float | None) -> dict[str, float | None]:
    return {"measured_s": measured, "predicted_s": predicted, "error_pct": error_pct(measured, predicted)}


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


def read_train(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(startup event, step events by rollout id) of a `vime train --json` log file."""
    return train_events(Path(path).read_text().splitlines())


def read_mem(path: Path) -> dict[int, list[tuple[float, float]]]:
    """GPU index -> [(epoch, used MiB)] sorted by time, from ``epoch,gpu,used_mib`` rows (bad rows skipped)."""
    out: dict[int, list[tuple[float, float]]] = {}
    with open(path, newline="") as f:
        for row in csv.reader(f):
            try:
                t, gpu, used = float(row[0]), int(row[1]), float(row[2])
            except (ValueError, IndexError):
                continue
            if math.isfinite(t) and math.isfinite(used):
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


def compare(train: dict[str, Any] | None, measured: list[dict[str, Any]], sim: dict[str, Any],
            mem: dict[int, list[tuple[float, float]]] | None = None, tolerance_mib: float = 1024.0) -> dict[str, Any]:
    """The ``vime.compare/1`` document: start-up and every phase of every step measured and predicted with the
    error, the means over all steps and over the steady ones (rollout id ≥ 1), the weight versions the
    responses carried (must rise by one per step from start-up's), and with `mem` (and stamped steps)
    each GPU's level in rollout and train of every step and its peak next to the simulator's.
    ``problems`` lists what is incomplete or inconsistent; ``ok`` is True when nothing is."""
    predicted = {s["rollout_id"]: s for s in sim.get("steps", [])}
    by_id = {s["rollout_id"]: s for s in measured}
    problems: list[str] = []
    missing = sorted(set(predicted) - set(by_id))
    if missing:
        problems.append(f"steps predicted but not measured: {missing}")
    startup = {k: _row((train or {}).get(k), (sim.get("startup") or {}).get(k)) for k in STARTUP}
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
        "schema": SCHEMA,
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
    if "memory" in doc and "tolerance_mib" in doc["memory"]:
        lines.append(f"GPU memory per step (MiB), same level each step within {doc['memory']['tolerance_mib']:.0f}: "
                     f"{doc['memory']['steady']}")
        for gpu, g in doc["memory"]["gpus"].items():
            lines.append(f"  gpu {gpu}: rollout {g['rollout_mib']} train {g['train_mib']} peak {g['peak_mib']}"
                         f" (predicted {_fmt(g.get('predicted_peak_mib'), '.0f')},"
                         f" error {_fmt(g.get('peak_error_pct'), '.1f')} %)")
    elif "memory" in doc:
        for gpu, g in doc["memory"]["gpus"].items():
            lines.append(f"  gpu {gpu}: peak {g['peak_mib']:.0f} MiB (predicted {_fmt(g.get('predicted_peak_mib'), '.0f')},"
                         f" error {_fmt(g.get('peak_error_pct'), '.1f')} %)")
    lines.append("OK" if doc["ok"] else "PROBLEMS: " + "; ".join(doc["problems"]))
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# What the page draws of each side
# --------------------------------------------------------------------------------------------


def _phase(name: str, rid: int | None, t0: float, t1: float) -> dict[str, Any]:
    return {"name": name, "label": PHASE_LABELS.get(name, name), "rollout_id": rid, "t0": round(t0, 6),
            "t1": round(t1, 6), "color": PHASE_COLORS.get(name, "#999")}


def timeline_from_steps(startup: dict[str, Any] | None, steps: list[dict[str, Any]], *,
                        mem: dict[int, list[tuple[float, float]]] | None = None,
                        capacity_gib: dict[int, float] | None = None,
                        peaks_gib: dict[int, float] | None = None) -> dict[str, Any]:
    """A side's view from its step lines alone: phases back to back in the seed's order from the first step's
    rollout (t = 0), start-up's parts just before it; with stamped steps and `mem` ({gpu: [(epoch, MiB)]})
    the measured memory per GPU on the same axis. `peaks_gib` are drawn as lines (the other side's peaks)."""
    phases: list[dict[str, Any]] = []
    windows = []
    if startup:
        parts = [(p, float(startup.get(f"t_{p}") or 0.0)) for p in ("onload_weights", "weight_sync", "onload_kv")]
        t = -sum(d for _, d in parts)
        t0 = t
        for p, d in parts:
            phases.append(_phase(p, None, t, t + d))
            t += d
        windows.append({"label": "start-up", "t0": round(t0, 6), "t1": 0.0})
    origin_wall = None
    if steps and all(s.get("wall_time") is not None for s in steps):
        origin_wall = float(steps[0]["wall_time"]) - float(steps[0]["t_step"])
    t = 0.0
    for s in steps:
        if origin_wall is not None:
            t = float(s["wall_time"]) - float(s["t_step"]) - origin_wall
        start = t
        for p in PHASES:
            d = float(s["phases"].get(p) or 0.0)
            phases.append(_phase(p, s["rollout_id"], t, t + d))
            t += d
        t = start + float(s["t_step"])
        windows.append({"label": f"step {s['rollout_id']}", "t0": round(start, 6), "t1": round(t, 6)})
    t_start = phases[0]["t0"] if phases else 0.0
    t_end = t
    groups = []
    if mem and origin_wall is not None:
        for gpu, samples in sorted(mem.items()):
            ts = [round(e - origin_wall, 6) for e, _ in samples]
            groups.append({"gpus": [gpu], "host": False, "label": f"GPU {gpu}", "kind": "one",
                           "capacity_gib": (capacity_gib or {}).get(gpu), "t": ts,
                           "series": {"gpu/used": [round(u / 1024, 4) for _, u in samples]},
                           "members": [{"gpu": gpu, "variant": 0, "owners": {}}]})
            if ts:
                t_start, t_end = min(t_start, ts[0]), max(t_end, ts[-1])
    return {"t_start": round(t_start, 6), "t_end": round(t_end, 6), "phases": phases, "windows": windows,
            "tracks": [], "call_names": [], "call_colors": [],
            "memory": {"legend": [{"key": "gpu/used", "label": "in use (measured)", "color": "#1d2330"}], "groups": groups},
            "peaks_gib": {str(k): v for k, v in sorted((peaks_gib or {}).items())}, "oom": None}


def _first_rollout(recorder: Recorder) -> float | None:
    starts = [(rid, t0) for name, rid, t0, _ in recorder.phase_spans if name == "rollout" and rid is not None]
    return min(starts)[1] if starts else None


def view_from_recorder(doc: dict[str, Any], recorder: Recorder) -> dict[str, Any]:
    """A side's view from its recorder (`run_view`), with t = 0 at its first step's rollout."""
    origin = _first_rollout(recorder)
    return run_view(doc, recorder, origin=origin)


def views_from_files(train_startup: dict[str, Any] | None, measured: list[dict[str, Any]], sim: dict[str, Any],
                     mem: dict[int, list[tuple[float, float]]] | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(measured view, simulated view) from a run's JSON lines, its simulation's document and memory samples."""
    capacity = {int(g["gpu"]): g["capacity_gib"] for g in sim.get("memory", {}).get("gpus", [])}
    sim_peaks = {int(g["gpu"]): g["peak_gib"] for g in sim.get("memory", {}).get("gpus", [])}
    measured_view = timeline_from_steps(train_startup, measured, mem=mem, capacity_gib=capacity)
    simulated_view = timeline_from_steps(sim.get("startup"), sim.get("steps", []), peaks_gib=sim_peaks if mem else None)
    return measured_view, simulated_view
