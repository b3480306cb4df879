"""A self-contained HTML report of one simulation: phase breakdown, timeline and memory over time, as inline SVG.

No scripts and no network fetches: the file opens anywhere, also offline, and renders the same
in every browser.
"""

from __future__ import annotations

import html
from typing import Any

from vime.report.recorder import HOST, Recorder

GiB = 1024**3

PHASE_COLORS = {
    "rollout": "#4e79a7", "offload": "#f28e2b", "train": "#e15759", "onload_weights": "#76b7b2",
    "weight_sync": "#59a14f", "onload_kv": "#edc948", "gap": "#bab0ac", "eval": "#b07aa1", "save": "#ff9da7",
}
_PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
            "#9c755f", "#bab0ac", "#1f77b4", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5"]


def _esc(x: Any) -> str:
    return html.escape(str(x))


def _phase_bar(phases: dict[str, dict[str, float]], width: int = 900) -> str:
    total = sum(p["seconds"] for p in phases.values()) or 1.0
    x = 0.0
    parts = []
    for name, p in phases.items():
        w = width * p["seconds"] / total
        color = PHASE_COLORS.get(name, "#999")
        parts.append(f'<rect x="{x:.2f}" y="0" width="{max(w, 0):.2f}" height="36" fill="{color}">'
                     f'<title>{_esc(name)}: {p["seconds"]:.3f} s ({p["percent"]:.1f} %)</title></rect>')
        if w > 60:
            parts.append(f'<text x="{x + 4:.2f}" y="23" font-size="12" fill="#fff">{_esc(name)} '
                         f'{p["percent"]:.0f}%</text>')
        x += w
    return f'<svg class="bar" width="{width}" height="36" role="img">{"".join(parts)}</svg>'


def _timeline(recorder: Recorder, width: int = 900) -> str:
    spans = recorder.spans
    if not spans:
        return "<p>no spans recorded</p>"
    t_end = max(s.t1 for s in spans) or 1.0
    tracks = sorted({s.track for s in spans}, key=lambda t: (t != "phases", t))
    row = 18
    label_w = 120
    scale = (width - label_w) / t_end
    parts = []
    for i, track in enumerate(tracks):
        y = i * row
        parts.append(f'<text x="0" y="{y + 13}" font-size="11">{_esc(track)}</text>')
        for s in spans:
            if s.track != track:
                continue
            w = max((s.t1 - s.t0) * scale, 0.5)
            color = PHASE_COLORS.get(s.name, _PALETTE[hash_name(s.name) % len(_PALETTE)])
            parts.append(f'<rect x="{label_w + s.t0 * scale:.2f}" y="{y + 2}" width="{w:.2f}" height="{row - 4}" '
                         f'fill="{color}"><title>{_esc(track)}: {_esc(s.name)} {s.t0:.3f}–{s.t1:.3f} s'
                         f'</title></rect>')
    height = len(tracks) * row + 20
    parts.append(f'<text x="{label_w}" y="{height - 4}" font-size="11">0 s</text>')
    parts.append(f'<text x="{width - 60}" y="{height - 4}" font-size="11">{t_end:.2f} s</text>')
    return f'<svg width="{width}" height="{height}" role="img">{"".join(parts)}</svg>'


def hash_name(name: str) -> int:
    """A colour index that does not depend on PYTHONHASHSEED."""
    h = 0
    for ch in name:
        h = (h * 131 + ord(ch)) % 1_000_003
    return h


def _memory_chart(recorder: Recorder, gpu: int, capacity: int | None, width: int = 900,
                  height: int = 160) -> str:
    """Stacked step chart of one GPU's memory by owner/tag over time."""
    samples = [m for m in recorder.samples if m.gpu == gpu]
    if not samples:
        return ""
    t_end = max(max(m.t for m in samples), max((s.t1 for s in recorder.spans), default=0.0)) or 1.0
    series: dict[str, int] = {}
    points: list[tuple[float, dict[str, int]]] = []
    for m in samples:
        series[f"{m.owner}/{m.tag}"] = m.bytes
        if points and points[-1][0] == m.t:
            points[-1] = (m.t, dict(series))
        else:
            points.append((m.t, dict(series)))
    keys = sorted({k for _, s in points for k in s})
    top = max(capacity or 0, max(sum(s.values()) for _, s in points)) or 1
    label_w = 50
    sx = (width - label_w) / t_end
    sy = (height - 20) / top
    parts = []
    # Each series is a polygon between the cumulative sums below and including it.
    for idx, key in enumerate(keys):
        color = _PALETTE[idx % len(_PALETTE)]
        upper, lower = [], []
        for j, (t, s) in enumerate(points):
            t_next = points[j + 1][0] if j + 1 < len(points) else t_end
            below = sum(s.get(k, 0) for k in keys[:idx])
            here = below + s.get(key, 0)
            for tt in (t, t_next):
                upper.append((label_w + tt * sx, height - 20 - here * sy))
                lower.append((label_w + tt * sx, height - 20 - below * sy))
        pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in upper + lower[::-1])
        parts.append(f'<polygon points="{pts}" fill="{color}" fill-opacity="0.85"><title>{_esc(key)}</title></polygon>')
    if capacity:
        y = height - 20 - capacity * sy
        parts.append(f'<line x1="{label_w}" y1="{y:.1f}" x2="{width}" y2="{y:.1f}" stroke="#c00" '
                     f'stroke-dasharray="4 3"/><text x="{label_w + 4}" y="{y + 12:.1f}" font-size="10" fill="#c00">'
                     f'capacity {capacity / GiB:.0f} GiB</text>')
    parts.append(f'<text x="0" y="12" font-size="10">{top / GiB:.0f} GiB</text>')
    parts.append(f'<text x="0" y="{height - 22}" font-size="10">0</text>')
    legend = "".join(f'<span class="key"><i style="background:{_PALETTE[i % len(_PALETTE)]}"></i>{_esc(k)}</span>'
                     for i, k in enumerate(keys))
    name = "host pinned memory" if gpu == HOST else f"GPU {gpu}"
    return (f'<h3>{name}</h3><svg width="{width}" height="{height}" role="img">{"".join(parts)}</svg>'
            f'<div class="legend">{legend}</div>')


def _table(rows: list[list[Any]], head: list[str]) -> str:
    th = "".join(f"<th>{_esc(h)}</th>" for h in head)
    body = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def render_html(doc: dict[str, Any], recorder: Recorder) -> str:
    """The report page for one simulation `doc` (the --json document) and its recorder."""
    summary = doc["summary"]
    verdict = doc["verdict"]
    phases = summary["phases"]
    phase_rows = [[n, f'{p["seconds"]:.3f}', f'{p["percent"]:.1f}'] for n, p in phases.items()]
    phase_rows.append(["T_step", f'{summary["t_step"]:.3f}', "100.0"])
    mem_rows = []
    for g in doc["memory"]["gpus"]:
        mem_rows.append([g["gpu"], f'{g["peak_gib"]:.2f}', f'{g["capacity_gib"]:.2f}', f'{g["headroom_gib"]:.2f}',
                         g.get("peak_phase", ""),
                         ", ".join(f"{k} {v:.2f}" for k, v in g["by_owner_tag_gib"].items())])
    caps = {g["gpu"]: int(g["capacity_gib"] * GiB) for g in doc["memory"]["gpus"]}
    charts = "".join(_memory_chart(recorder, gpu, caps.get(gpu)) for gpu in sorted({m.gpu for m in recorder.samples}))
    if verdict["fits"]:
        verdict_html = '<p class="ok">Fits: no GPU ran out of memory.</p>'
    else:
        o = verdict["oom"]
        fixes = "".join(f"<li>{_esc(f)}</li>" for f in verdict.get("fixes", []))
        verdict_html = (f'<p class="oom">OOM during {_esc(o["phase"])} on GPU {o["gpu"]}: {_esc(o["owner"])}/'
                        f'{_esc(o["tag"])} short by {o["short_by_gib"]:.2f} GiB (t = {o["time_s"]:.3f} s)</p>'
                        f"<ul>{fixes}</ul>")
    cfg = doc.get("config", {})
    if str(doc.get("schema", "")).startswith("vime.train"):
        title = f'vime train (measured) — {cfg.get("hf_checkpoint", "")} on this machine'
    else:
        title = f'vime simulate — {cfg.get("model", "")} on {cfg.get("hardware", "")}'
    rollout_rows = [[k, v] for k, v in doc.get("rollout", {}).items()]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{_esc(title)}</title>
<style>
body{{font-family:system-ui,sans-serif;margin:24px;color:#222;max-width:980px}}
table{{border-collapse:collapse;margin:8px 0 16px}}td,th{{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}}
.ok{{color:#176a2a;font-weight:bold}}.oom{{color:#b00;font-weight:bold}}
.legend{{font-size:11px;margin-bottom:12px}}.key{{margin-right:10px}}.key i{{display:inline-block;width:10px;height:10px;margin-right:3px}}
</style></head><body>
<h1>{_esc(title)}</h1>
<h2>Verdict</h2>{verdict_html}
<h2>Where a step's time goes</h2>{_phase_bar(phases)}
{_table(phase_rows, ["phase", "seconds", "%"])}
<h2>Rollout</h2>{_table(rollout_rows, ["figure", "value"])}
<h2>Timeline</h2>{_timeline(recorder)}
<h2>Peak memory per GPU</h2>{_table(mem_rows, ["GPU", "peak GiB", "capacity GiB", "headroom GiB", "phase at peak", "by owner/tag (GiB)"])}
<h2>Memory over time</h2>{charts}
</body></html>
"""
