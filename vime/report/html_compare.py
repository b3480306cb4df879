"""The HTML page of a measured run beside its simulation: both timelines and memory, and the error of each phase."""

from __future__ import annotations

from typing import Any

from vime.report.html import (
    _esc,
    _page,
    _Raw,
    _swatch,
    _table,
    _trace_link,
)
from vime.report.view import (
    PHASE_COLORS,
    PHASE_LABELS,
    PHASE_ORDER,
    fmt_gib,
    fmt_seconds,
)


def _err_cell(e: float | None, minor: bool = False) -> Any:
    """An error in %, coloured by size; `minor` (a phase too short to matter) is greyed whatever its size."""
    if e is None:
        return ("—", "")
    cls = "minor" if minor else ("good" if abs(e) <= 10 else ("warn" if abs(e) <= 25 else "bad"))
    note = ' title="under 1 % of T_step either way: its error hardly moves T_step"' if minor else ""
    return (_Raw(f'<span class="err {cls}"{note}>{e:+.1f} %</span>'), e)


def _minor(r: dict[str, Any], t_step: dict[str, Any]) -> bool:
    """Measured and simulated both under 1 % of the measured T_step."""
    total = t_step.get("measured_s") or 0
    return total > 0 and max(r.get("measured_s") or 0, r.get("predicted_s") or 0) < 0.01 * total


def render_compare_html(cmp: dict[str, Any], *, measured_view: dict[str, Any] | None, simulated_view: dict[str, Any] | None,
                        title: str, sub: str = "", trace_href: str | None = None) -> str:
    """The page of a measured run beside its simulation: `cmp` is `vime.report.compare.compare`'s document;
    the views (`run_view` shape, or `compare_views.timeline_from_steps`) give each side's timeline and memory."""
    mean = cmp.get("mean_steady_steps") or {}
    if not any(r.get("measured_s") for r in mean.values()):
        mean = cmp.get("mean_all_steps") or {}
    t = mean.get("t_step", {})
    err = t.get("error_pct")
    worst = max(((p, r["error_pct"]) for p, r in mean.items() if p in PHASE_ORDER and r.get("error_pct") is not None
                 and (r.get("measured_s") or 0) > 0.02 * (t.get("measured_s") or 1)),
                key=lambda x: abs(x[1]), default=None)
    if err is None:
        text = "No step was measured and simulated both; nothing to compare."
        cls = "oom"
    else:
        text = (f"Simulated T_step {fmt_seconds(t.get('predicted_s'))} against {fmt_seconds(t.get('measured_s'))} measured: "
                f"{err:+.1f} %")
        if worst is not None:
            text += f"; the phase furthest off is {PHASE_LABELS.get(worst[0], worst[0]).lower()} ({worst[1]:+.1f} %)"
        cls = "ok" if abs(err) <= 15 else "oom"
    problems = cmp.get("problems") or []
    body = [f'<header><div class="eyebrow">measured beside simulated</div><h1>{_esc(title)}</h1>'
            f'<p class="sub">{_esc(sub)}</p></header>',
            f'<section class="verdict {cls}" id="verdict"><span class="icon">{"✓" if cls == "ok" else "!"}</span> {_esc(text)}'
            + (f'<div class="counts">{_esc("; ".join(problems))}</div>' if problems else "") + "</section>"]
    body.append('<section id="phase-compare"><h2>Each phase, measured and simulated</h2><p class="hint">Mean over the '
                'steady steps (rollout id ≥ 1, or all steps when there is only one); error = (simulated − measured) ÷ '
                'measured (grey where the phase is under 1 % of T_step).</p><div class="chart" id="compare-chart"></div></section>')
    rows = []
    for p in (*PHASE_ORDER, "t_gap", "t_step"):
        r = mean.get(p)
        if r is None or (r.get("measured_s") is None and r.get("predicted_s") is None):
            continue
        label = _Raw("<b>T_step</b>") if p == "t_step" else (
            PHASE_LABELS["gap"] if p == "t_gap" else _Raw(_swatch(PHASE_COLORS.get(p, "#999")) + _esc(PHASE_LABELS.get(p, p))))
        rows.append([label, (fmt_seconds(r.get("measured_s")), r.get("measured_s") or ""),
                     (fmt_seconds(r.get("predicted_s")), r.get("predicted_s") or ""),
                     _err_cell(r.get("error_pct"), minor=p != "t_step" and _minor(r, t))])
    body.append(_table(["phase", "measured", "simulated", "error"], rows, num=(1, 2, 3)))
    srows = []
    for s in cmp.get("steps", []):
        r = s["phases"]["t_step"]
        srows.append([f"step {s['rollout_id']}", (fmt_seconds(r["measured_s"]), r["measured_s"] or ""),
                      (fmt_seconds(r["predicted_s"]), r["predicted_s"] or ""), _err_cell(r["error_pct"]),
                      "" if s.get("weight_version") is None else f"v{s['weight_version']:.0f}"])
    su = cmp.get("startup", {}).get("t_total", {})
    if su.get("measured_s") is not None or su.get("predicted_s") is not None:
        srows.insert(0, ["start-up", (fmt_seconds(su.get("measured_s")), su.get("measured_s") or ""),
                         (fmt_seconds(su.get("predicted_s")), su.get("predicted_s") or ""), _err_cell(su.get("error_pct")), ""])
    body.append(f'<section id="steps"><h2>Each step</h2>{_table(["", "measured", "simulated", "error", "weights"], srows, num=(1, 2, 3))}</section>')
    body.append('<section id="timeline-memory"><h2>Timelines and memory, on one axis</h2><p class="hint">Both runs start '
                'at the first step\'s rollout (t = 0; start-up lies before it). Drag to zoom, double-click to zoom out.</p>'
                '<div class="toolbar" id="zoom-bar"></div><div class="frame"><div class="chart" id="timeline"></div></div>'
                '<div id="memory-charts"></div></section>')
    mem = cmp.get("memory", {}).get("gpus", {})
    if mem:
        mrows = []
        for gpu, g in sorted(mem.items(), key=lambda kv: int(kv[0])):
            mrows.append([f"GPU {gpu}", (fmt_gib(g["peak_mib"] / 1024), g["peak_mib"]),
                          (fmt_gib(g["predicted_peak_mib"] / 1024) if g.get("predicted_peak_mib") is not None else "—",
                           g.get("predicted_peak_mib") or ""), _err_cell(g.get("peak_error_pct"))])
            if g.get("predicted_train_mib") is not None:
                mrows.append([f"GPU {gpu} while training", (fmt_gib(g["train_max_mib"] / 1024), g["train_max_mib"]),
                              (fmt_gib(g["predicted_train_mib"] / 1024), g["predicted_train_mib"]),
                              _err_cell(g.get("train_error_pct"))])
        body.append(f'<section id="peaks"><h2>Peak memory</h2>{_table(["", "measured", "simulated", "error"], mrows, num=(1, 2, 3))}'
                    '<p class="note">Measured memory is what the driver reports for the whole GPU (every process, '
                    'allocator caches included); the simulation counts the tagged allocations.</p></section>')
    body.append(f'<section id="files">{_trace_link(trace_href)}</section>')
    data = {"kind": "compare", "sides": [s for s in ({"name": "measured", "view": measured_view},
                                                       {"name": "simulated", "view": simulated_view}) if s["view"]],
            "mean": {p: mean[p] for p in PHASE_ORDER if p in mean}, "steps": cmp.get("steps", []),
            "phase_labels": {p: PHASE_LABELS[p] for p in PHASE_ORDER}, "phase_colors": {p: PHASE_COLORS[p] for p in PHASE_ORDER}}
    return _page(f"vime — {title}: measured beside simulated", "compare", "\n".join(body), data)


__all__ = ["render_compare_html"]
