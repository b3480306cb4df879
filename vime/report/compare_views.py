"""Views of a measured run and its simulation for the pages: phases on one time axis from step lines or a recorder."""

from __future__ import annotations

from typing import Any

from vime.report.compare import PHASES
from vime.report.recorder import Recorder
from vime.report.view import PHASE_COLORS, PHASE_LABELS, run_view


def _phase_span(name: str, rid: int | None, t0: float, t1: float) -> dict[str, Any]:
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
            phases.append(_phase_span(p, None, t, t + d))
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
            phases.append(_phase_span(p, s["rollout_id"], t, t + d))
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
