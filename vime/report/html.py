"""Self-contained HTML reports: one run (simulated or measured), a sweep, a search, and a run beside its simulation.

Each page is one file that opens offline: the tables are HTML written here, the charts are SVG that
`report.js` (hand-written, no library, inlined into the page) draws from a JSON view model embedded
in the page (`vime.report.view`). Nothing is fetched; the Perfetto trace, when written, is linked.
"""

from __future__ import annotations

import html
import json
from collections.abc import Sequence
from importlib import resources
from typing import Any

from vime import __version__
from vime.report.bands import uncertainty_section, with_bands
from vime.report.recorder import Recorder
from vime.report.view import (
    PHASE_COLORS,
    PHASE_LABELS,
    PHASE_ORDER,
    SEED_STEPS,
    fmt_count,
    fmt_gib,
    fmt_seconds,
    gpu_ranges,
    partial_step,
    phase_rows,
    role_of,
    run_view,
    series_label,
)


class _Raw(str):
    """Markup that a table cell takes as it is (already escaped)."""


def _esc(x: Any) -> str:
    return x if isinstance(x, _Raw) else html.escape(str(x))


def _table(head: Sequence[str], rows: Sequence[Sequence[Any]], *, cls: str = "", num: Sequence[int] = (),
           sortable: bool = False) -> str:
    """An HTML table; columns in `num` are right-aligned numbers (and sort as numbers)."""
    nums = set(num)
    th = "".join(f'<th{" class=num" if i in nums else ""}>{_esc(h)}</th>' for i, h in enumerate(head))
    body = []
    for r in rows:
        cells = []
        for i, c in enumerate(r):
            value = ""
            if isinstance(c, tuple):  # (shown, sort value)
                c, value = c
                value = f' data-v="{html.escape(str(value))}"'
            cells.append(f'<td{" class=num" if i in nums else ""}{value}>{_esc(c)}</td>')
        body.append("<tr>" + "".join(cells) + "</tr>")
    classes = " ".join(x for x in (cls, "sortable" if sortable else "") if x)
    return (f'<table{f" class={chr(34)}{classes}{chr(34)}" if classes else ""}><thead><tr>{th}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table>')


def _asset(name: str) -> str:
    return resources.files("vime.report").joinpath(name).read_text(encoding="utf-8")


def _json_script(data: Any) -> str:
    text = json.dumps(data, separators=(",", ":"), sort_keys=False, allow_nan=False)
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def _page(title: str, kind: str, body: str, data: dict[str, Any]) -> str:
    """The page shell: styles and the renderer inline, the view model as JSON."""
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="vime {_esc(__version__)}">
<title>{_esc(title)}</title>
<style>{_asset("report.css")}</style></head>
<body class="vime-report" data-kind="{_esc(kind)}">
<main>
{body}
<footer>Written by vime {_esc(__version__)}. One file, no network: the charts are SVG drawn by the script in this
page. Drag across a chart to zoom, double-click to zoom out.</footer>
</main>
<div id="vime-tip" role="tooltip" hidden></div>
<script type="application/json" id="vime-data">{_json_script(data)}</script>
<script>{_asset("report.js")}</script>
<noscript><p class="warn">The charts need JavaScript; the tables above are complete without it.</p></noscript>
</body></html>
"""


# --------------------------------------------------------------------------------------------
# Pieces shared by the pages
# --------------------------------------------------------------------------------------------


def _gpus_of(cfg: dict[str, Any]) -> int:
    actor = int(cfg.get("actor_num_gpus") or 0)
    return actor if cfg.get("colocate", True) else actor + int(cfg.get("rollout_num_gpus") or 0)


def layout_line(cfg: dict[str, Any]) -> str:
    """One line of the layout: placement, parallelism, engines, batch."""
    if not cfg:
        return ""
    parts = [("colocated" if cfg.get("colocate") else "disaggregated"),
             f"TP {cfg.get('tensor_model_parallel_size')} × DP {cfg.get('data_parallel_size')}",
             f"{cfg.get('rollout_num_engines')} engine(s) × {cfg.get('rollout_num_gpus_per_engine')} GPU(s)",
             f"{cfg.get('rollout_batch_size')} prompts × {cfg.get('n_samples_per_prompt')} samples",
             f"micro-batch {cfg.get('micro_batch_size')}"]
    return " · ".join(parts)


def _dev(gpu: int) -> str:
    """A device as people say it: "GPU 3", or "host" for host memory (device -1)."""
    return "host" if gpu < 0 else f"GPU {gpu}"


def _kpi(label: str, value: str, note: str = "", cls: str = "") -> str:
    return (f'<div class="kpi {cls}"><div class="kpi-label">{_esc(label)}</div>'
            f'<div class="kpi-value">{_esc(value)}</div><div class="kpi-note">{_esc(note)}</div></div>')


def _cost(t_step: float, gpus: int, samples: int) -> tuple[float, float]:
    """(GPU-seconds per step, GPU-seconds per 1000 samples)."""
    per_step = gpus * t_step
    return per_step, (per_step / samples * 1000 if samples else 0.0)


def _swatch(color: str) -> _Raw:
    return _Raw(f'<i class="sw" style="background:{html.escape(color)}"></i>')


def _phase_table(doc: dict[str, Any]) -> str:
    summary = doc.get("summary", {})
    t_step = summary.get("t_step", 0.0)
    rows = []
    phases = summary.get("phases", {})
    for name in PHASE_ORDER:
        p = phases.get(name)
        if p is None:
            continue
        shown = fmt_seconds(p["seconds"])
        band = p.get("band")
        if isinstance(band, list) and len(band) == 2:
            shown += f" ({fmt_seconds(band[0])} – {fmt_seconds(band[1])})"
        bar = _Raw(f'<span class="pct"><span style="width:{min(100.0, max(0.0, p["percent"])):.1f}%;'
                   f'background:{PHASE_COLORS.get(name, "#999")}"></span></span> {p["percent"]:.1f} %')
        rows.append([_Raw(_swatch(PHASE_COLORS.get(name, "#999")) + _esc(PHASE_LABELS.get(name, name))),
                     SEED_STEPS.get(name, ""), (shown, p["seconds"]), (bar, p["percent"])])
    rows.append([_Raw("<b>T_step</b>"), "1–55", (_Raw(f"<b>{_esc(fmt_seconds(t_step))}</b>"), t_step), "100 %"])
    return _table(["phase", "seed steps", "time", "share of T_step"], rows, num=(2, 3))


def _memory_table(doc: dict[str, Any]) -> str:
    """Peak memory per GPU; GPUs with the same figures share a row."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for g in doc.get("memory", {}).get("gpus", []):
        norm = tuple(sorted((f"{role_of(k.split('/', 1)[0])}/{k.split('/', 1)[1]}", v)
                            for k, v in g["by_owner_tag_gib"].items()))
        key = (g["peak_gib"], g["capacity_gib"], g.get("peak_phase", ""), norm)
        groups.setdefault(key, []).append(g)
    rows = []
    for members in sorted(groups.values(), key=lambda ms: ms[0]["gpu"]):
        g = members[0]
        gpus = [m["gpu"] for m in members]
        share = 100 * g["peak_gib"] / g["capacity_gib"] if g["capacity_gib"] else 0.0
        cls = "bad" if g["headroom_gib"] < 0 else ("warn" if share > 95 else "good")
        bar = _Raw(f'<span class="pct {cls}"><span style="width:{min(100.0, share):.1f}%"></span></span> '
                   f'{share:.0f} %')
        parts = sorted(g["by_owner_tag_gib"].items(), key=lambda kv: -kv[1])
        breakdown = ", ".join(f"{series_label(role_of(k.split('/', 1)[0]), k.split('/', 1)[1])} {fmt_gib(v)}"
                              for k, v in parts[:6])
        if len(parts) > 6:
            breakdown += f", {len(parts) - 6} more"
        rows.append(["host" if gpus == [-1] else ("GPUs " if len(gpus) > 1 else "GPU ") + gpu_ranges(gpus), (fmt_gib(g["peak_gib"]), g["peak_gib"]), (fmt_gib(g["capacity_gib"]), g["capacity_gib"]),
                     (bar, share), (fmt_gib(g["headroom_gib"]), g["headroom_gib"]),
                     PHASE_LABELS.get(g.get("peak_phase") or "", g.get("peak_phase") or "—"), breakdown])
    host = doc.get("memory", {}).get("host_pinned_peak_gib")
    table = _table(["device", "peak", "capacity", "used", "headroom", "during", "held at the peak"], rows, num=(1, 2, 3, 4))
    if host:
        table += f'<p class="note">Host pinned memory peak: {_esc(fmt_gib(host))}.</p>'
    return table


_ROLLOUT_LABELS = (
    ("tokens_generated", "Tokens generated per step", fmt_count),
    ("tokens_per_s_per_gpu", "Generation throughput per GPU", lambda v: f"{v:,.0f} tokens/s"),
    ("tokens_per_s", "Generation throughput", lambda v: f"{v:,.0f} tokens/s"),
    ("longest_sample_tokens", "Longest sample", lambda v: f"{v:,} tokens"),
    ("engine_busy_share", "Engines busy during rollout", lambda v: f"{100 * v:.0f} %"),
    ("preemptions", "Preemptions (KV cache ran out)", fmt_count),
    ("aborted_requests", "Aborted requests", fmt_count),
)


def _rollout_table(doc: dict[str, Any]) -> str:
    r = doc.get("rollout", {})
    rows = [[label, fmt(r[key])] for key, label, fmt in _ROLLOUT_LABELS if key in r]
    if "kv_blocks_total" in r:
        rows.insert(4, ["KV cache blocks at the peak", f"{r.get('kv_blocks_peak', 0):,} of {r['kv_blocks_total']:,} "
                                                       f"({100 * r.get('kv_blocks_used_share', 0):.1f} %)"])
    return _table(["", ""], rows, cls="kv", num=(1,))


def _startup_table(doc: dict[str, Any]) -> str:
    s = doc.get("startup")
    if not s:
        return ""
    rows: list[list[Any]] = [[PHASE_LABELS["onload_weights"], fmt_seconds(s.get("t_onload_weights"))],
            [PHASE_LABELS["weight_sync"], f"{fmt_seconds(s.get('t_weight_sync'))} ({s.get('buckets', '?')} buckets, "
                                          f"weights v{s.get('weight_version', '?')})"],
            [PHASE_LABELS["onload_kv"], fmt_seconds(s.get("t_onload_kv"))],
            [_Raw("<b>start-up (seed steps 1–13)</b>"), _Raw(f"<b>{_esc(fmt_seconds(s.get('t_total')))}</b>")]]
    return _table(["", ""], rows, cls="kv", num=(1,))


def _fixes_table(verdict: dict[str, Any]) -> str:
    results = verdict.get("fix_results") or []
    if not results and verdict.get("fixes"):
        results = [{"fix": f.split(": ", 1)[0], "result": f.split(": ", 1)[-1], "fits": ": fits" in f,
                    "t_step_s": None} for f in verdict["fixes"]]
    if not results:
        return "<p>No fix was tried.</p>"
    rows = []
    for r in results:
        badge = _Raw('<span class="badge good">fits</span>' if r["fits"] else
                     '<span class="badge bad">still OOM</span>' if "still OOM" in r["result"] else
                     '<span class="badge">invalid</span>')
        t = r.get("t_step_s")
        rows.append([r["fix"], badge, (fmt_seconds(t) if t is not None else "—", t if t is not None else "")])
    return _table(["change", "simulated outcome", "T_step then"], rows, cls="fixes", num=(2,))


def _trace_link(trace_href: str | None) -> str:
    if not trace_href:
        return ('<p class="note">For every call and allocation, write a trace with <code>--trace-out FILE</code> '
                'and open it in Perfetto (ui.perfetto.dev) or chrome://tracing.</p>')
    return (f'<p class="deep">Deep dive: <a href="{html.escape(trace_href)}" download>{_esc(trace_href)}</a> — the '
            f'Perfetto trace of this run (one track per GPU, engine and trainer; memory as counters). Open it in '
            f'Perfetto (ui.perfetto.dev, "Open trace file") or chrome://tracing.</p>')


# --------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------


def _verdict_banner(doc: dict[str, Any], measured: bool) -> str:
    v = doc["verdict"]
    summary = doc.get("summary", {})
    if v["fits"]:
        gpus = doc.get("memory", {}).get("gpus", [])
        worst = min(gpus, key=lambda g: g["headroom_gib"]) if gpus else None
        what = "Ran to the end" if measured else "Fits"
        text = f"{what}: T_step {fmt_seconds(summary.get('t_step'))}"
        if worst is not None:
            text += f", smallest headroom {fmt_gib(worst['headroom_gib'])} on {_dev(worst['gpu'])}"
            phase = worst.get("peak_phase")
            if phase:  # a peak outside every phase (an engine's KV cache taken at launch) has none to name
                text += f" ({PHASE_LABELS.get(phase, phase).lower()})"
        return f'<section class="verdict ok" id="verdict"><span class="icon">✓</span> {_esc(text)}</section>'
    o = v["oom"]
    fits = [r for r in (v.get("fix_results") or []) if r.get("fits")]
    tried = len(v.get("fix_results") or v.get("fixes") or [])
    role = role_of(o["owner"])
    text = (f"Out of memory during {PHASE_LABELS.get(o['phase'], o['phase']).lower()} (step {o.get('rollout_id')}) on "
            f"GPU {o['gpu']}: {series_label(role, o['tag'])} asked for {fmt_gib(o['requested_gib'])} with "
            f"{fmt_gib(o['free_gib'])} free — short by {fmt_gib(o['short_by_gib'])} at t = {fmt_seconds(o['time_s'])}.")
    if tried:
        text += f" {len(fits)} of {tried} simulated fixes fit" + (f"; first: {fits[0]['fix']}." if fits else ".")
    return f'<section class="verdict oom" id="verdict"><span class="icon">✕</span> {_esc(text)}</section>'


def render_html(doc: dict[str, Any], recorder: Recorder, *, trace_href: str | None = None) -> str:
    """The page of one run: `doc` is its document (``vime.simulate/1.x`` or ``vime.train/1``), `recorder` what it
    recorded; `trace_href` links the Perfetto trace written beside the page."""
    doc = with_bands(doc)  # a simulation's uncertainty, where the phase table and chart draw bands
    cfg = doc.get("config", {})
    measured = str(doc.get("schema", "")).startswith("vime.train")
    summary = doc.get("summary", {})
    steps = doc.get("steps", [])
    if measured:
        where = "this machine"
        ckpt = str(cfg.get("hf_checkpoint") or "").rstrip("/")
        what = ckpt.rsplit("/", 1)[-1] or "model"  # the checkpoint's name; its path is in the trace and the config
        title = f"{what} on {where}"
        eyebrow = f"vime train (measured) · --backend {doc.get('backend', 'real')} · {len(steps)} step(s)"
    else:
        title = f"{doc.get('model', {}).get('name', cfg.get('model', ''))} on {_gpus_of(cfg)} × " \
                f"{doc.get('hardware', {}).get('name', cfg.get('hardware', ''))}"
        eyebrow = f"vime simulate · {len(steps)} simulated step(s)"
    view = run_view(doc, recorder)
    bars = phase_rows(doc)
    partial = partial_step(recorder) if not doc["verdict"]["fits"] else None
    if partial is not None:
        bars.append(partial)
    gpus = _gpus_of(cfg)
    samples = int(cfg.get("samples_per_rollout") or 0)
    kpis = []
    t_step = summary.get("t_step", 0.0)
    if steps:
        band = summary.get("t_step_band")
        note = f"range {fmt_seconds(band[0])} – {fmt_seconds(band[1])}" if isinstance(band, list) else \
            f"mean of {len(steps)} step(s)"
        kpis.append(_kpi("T_step", fmt_seconds(t_step), note))
        r = doc.get("rollout", {})
        if "tokens_per_s_per_gpu" in r:
            kpis.append(_kpi("Generation", f"{r['tokens_per_s_per_gpu']:,.0f} tok/s/GPU",
                             f"{r.get('tokens_generated', 0):,} tokens per step"))
        elif "tokens_per_s" in r:
            kpis.append(_kpi("Generation", f"{r['tokens_per_s']:,.0f} tok/s", f"{r.get('tokens_generated', 0):,} tokens per step"))
        per_step, per_1k = _cost(t_step, gpus, samples)
        if gpus:
            kpis.append(_kpi("Cost per step", f"{per_step:,.0f} GPU·s", f"{per_1k:,.0f} GPU·s per 1k samples "
                                                                       f"({gpus} GPUs, {samples} samples)"))
    else:
        kpis.append(_kpi("T_step", "—", "no step completed", "bad"))
    mem = doc.get("memory", {}).get("gpus", [])
    if mem:
        worst = max(mem, key=lambda g: g["peak_gib"] / g["capacity_gib"] if g["capacity_gib"] else 0)
        fits = doc["verdict"]["fits"]
        # after an OOM the peak is what was held when the allocation failed: its "headroom" is not room to spare
        kpis.append(_kpi("Peak memory" if fits else "Peak memory held",
                         f"{fmt_gib(worst['peak_gib'])} of {fmt_gib(worst['capacity_gib'])}",
                         f"{_dev(worst['gpu'])}, headroom {fmt_gib(worst['headroom_gib'])}" if fits else
                         f"{_dev(worst['gpu'])}, the most held before the OOM", "" if fits else "bad"))
    v = doc["verdict"]
    risky = [g for g in ((doc.get("uncertainty") or {}).get("memory") or {}).get("gpus", []) if g["at_risk"]]
    if v["fits"] and risky:  # fits, but by less than measured levels ran over the model
        g = max(risky, key=lambda r: r["peak_high_gib"])
        kpis.append(_kpi("At risk", f"up to {fmt_gib(g['peak_high_gib'])}",
                         f"{_dev(g['gpu'])} in {g['high_phase']}: measured levels ran up to "
                         f"{100 * (g['high_factor'] - 1):.1f} % over the model", "warn"))
    if not v["fits"]:
        o = v["oom"]
        kpis.append(_kpi("Out of memory", f"short by {fmt_gib(o['short_by_gib'])}",
                         f"GPU {o['gpu']} at t = {fmt_seconds(o['time_s'])}", "bad"))
    body = [f'<header><div class="eyebrow">{_esc(eyebrow)}</div><h1>{_esc(title)}</h1>'
            f'<p class="sub">{_esc(layout_line(cfg))}</p></header>',
            _verdict_banner(doc, measured),
            f'<section class="kpis">{"".join(kpis)}</section>']
    time_title = "Where a step's time goes" if steps else "What ran before the OOM"
    body.append(f'<section id="phases"><h2>{time_title}</h2><div class="chart" id="phase-chart"></div>'
                + (_phase_table(doc) if steps else "") + "</section>" + (uncertainty_section(doc) if steps else ""))
    if not v["fits"]:
        body.append(f'<section id="fixes"><h2>Fixes, each simulated</h2>{_fixes_table(v)}</section>')
    body.append('<section id="timeline-memory"><h2>Timeline and memory over time</h2>'
                '<p class="hint">One time axis for the timeline and every memory chart; the coloured bands are the '
                'phases. Drag across any chart to zoom (all follow), double-click to zoom out, hover for values.</p>'
                '<div class="toolbar" id="zoom-bar"></div><div class="frame"><div class="chart" id="timeline"></div></div>'
                '<div id="memory-charts"></div></section>')
    if mem:
        body.append(f'<section id="peaks"><h2>Peak memory per GPU</h2>{_memory_table(doc)}</section>')
    details = []
    if steps:
        details.append(f'<div><h3>Rollout</h3>{_rollout_table(doc)}</div>')
    if doc.get("startup"):
        details.append(f'<div><h3>Start-up</h3>{_startup_table(doc)}</div>')
    if details:
        body.append(f'<section id="details" class="cols">{"".join(details)}</section>')
    body.append(f'<section id="files">{_trace_link(trace_href)}</section>')
    data = {"kind": "run", "measured": measured, "view": view, "bars": bars}
    return _page(f"{eyebrow.split(' · ')[0]} — {title}", "run", "\n".join(body), data)


__all__ = ["layout_line", "render_html"]
