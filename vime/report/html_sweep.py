"""The HTML page of a sweep or a search: ranked configurations, T_step by phase, memory headroom, the frontier."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vime.report.html import (
    _esc,
    _page,
    _Raw,
    _table,
    layout_line,
)
from vime.report.view import (
    PHASE_COLORS,
    PHASE_LABELS,
    PHASE_ORDER,
    fmt_gib,
    fmt_seconds,
)

#: Short names of the options a sweep or search changes, for row labels.
OPTION_LABELS = {"tensor_model_parallel_size": "TP", "pipeline_model_parallel_size": "PP",
                 "context_parallel_size": "CP", "rollout_num_gpus_per_engine": "GPUs/engine",
                 "micro_batch_size": "micro-batch", "gpu_memory_utilization": "mem. util.",
                 "actor_num_gpus_per_node": "GPUs/node", "actor_num_nodes": "nodes", "rollout_batch_size": "prompts",
                 "n_samples_per_prompt": "samples/prompt", "rollout_max_response_len": "max response",
                 "rollout_max_prompt_len": "max prompt", "global_batch_size": "global batch", "model": "model",
                 "hardware": "hardware", "max_num_seqs": "max seqs", "update_weight_buffer_size": "bucket bytes",
                 "train_offload_backend": "offload backend", "response_length": "response lengths"}


def change_label(changes: dict[str, Any]) -> str:
    """``{"micro_batch_size": 8, "tensor_model_parallel_size": 2}`` → "micro-batch 8 · TP 2" (GPUs first)."""
    ch = dict(changes)
    parts = []
    if "actor_num_gpus_per_node" in ch:
        gpus = int(ch.pop("actor_num_gpus_per_node")) * int(ch.pop("actor_num_nodes", 1))
        parts.append(f"{gpus} GPU{'s' if gpus != 1 else ''}")
    for k in ch:
        v = ch[k]
        if isinstance(v, bool):
            v = "on" if v else "off"
        parts.append(f"{OPTION_LABELS.get(k, '--' + k.replace('_', '-'))} {v}")
    return " · ".join(parts) or "base"


def sweep_rows(results: Sequence[Any], samples: int | None = None) -> list[dict[str, Any]]:
    """The view of ranked `PointResult`s (rank 1 first)."""
    rows = []
    for rank, r in enumerate(results, 1):
        status = "fits" if r.valid and r.fits else ("oom" if r.valid else "invalid")
        rows.append({"rank": rank, "label": change_label(r.changes), "changes": {k: r.changes[k] for k in sorted(r.changes)},
                     "status": status, "at_risk": r.at_risk and status == "fits",
                     "t_step": r.t_step if status == "fits" else None,
                     "phases": {p: r.phases.get(p, 0.0) for p in PHASE_ORDER if r.phases.get(p)} if status == "fits" else {},
                     "gpus": r.gpus, "gpu_s_step": r.gpu_s_per_step if status == "fits" else None,
                     "gpu_s_1k": r.gpu_s_per_1k_samples if status == "fits" else None,
                     "peak_gib": r.peak_gib, "capacity_gib": r.capacity_gib,
                     "headroom_gib": round(r.capacity_gib - r.peak_gib, 3) if r.capacity_gib else None,
                     "short_by_gib": r.short_by_gib, "reason": r.oom or r.error, "argv": list(r.argv)})
    return rows


def _sweep_table(rows: list[dict[str, Any]], axes: Sequence[str]) -> str:
    head = ["#", *[OPTION_LABELS.get(a, "--" + a.replace("_", "-")) for a in axes], "status", "T_step", "GPUs",
            "GPU·s / step", "GPU·s / 1k samples", "peak", "headroom", "reason"]
    body = []
    for r in rows:
        badge = {"fits": '<span class="badge good">fits</span>', "oom": '<span class="badge bad">OOM</span>',
                 "invalid": '<span class="badge">invalid</span>'}[r["status"]]
        if r.get("at_risk"):  # fits by less than measured levels ran over the memory model
            badge = '<span class="badge warn">at risk</span>'

        vals = [r["changes"].get(a, "") for a in axes]
        body.append([(str(r["rank"]), r["rank"]), *[(str(v), v if isinstance(v, (int, float)) else str(v)) for v in vals],
                     (_Raw(badge), r["status"]),
                     (fmt_seconds(r["t_step"]), r["t_step"] if r["t_step"] is not None else ""),
                     (str(r["gpus"] or "—"), r["gpus"]),
                     (f"{r['gpu_s_step']:,.0f}" if r["gpu_s_step"] is not None else "—", r["gpu_s_step"] or ""),
                     (f"{r['gpu_s_1k']:,.0f}" if r["gpu_s_1k"] is not None else "—", r["gpu_s_1k"] or ""),
                     (fmt_gib(r["peak_gib"]) if r["status"] != "invalid" else "—", r["peak_gib"]),
                     (fmt_gib(r["headroom_gib"]) if r["headroom_gib"] is not None and r["status"] == "fits" else "—",
                      r["headroom_gib"] if r["headroom_gib"] is not None else ""),
                     r["reason"] or ""])
    n = len(axes)
    return _table(head, body, cls="ranked", sortable=True, num=(0, n + 2, n + 3, n + 4, n + 5, n + 6, n + 7))


def command_block(argv: Sequence[str], placeholders: dict[str, str]) -> str:
    """The winning command, copyable, and what its placeholders stand for."""
    text = " ".join(argv)
    notes = "".join(f"<li><code>{_esc(k)}</code> is a placeholder: {_esc(v)}</li>" for k, v in placeholders.items())
    return (f'<div class="cmd"><button type="button" class="copy" data-copy="cmd-best">copy</button>'
            f'<pre id="cmd-best">{_esc(text)}</pre></div>' + (f"<ul class='note'>{notes}</ul>" if notes else ""))


def render_sweep_html(results: Sequence[Any], base: Any, *, kind: str = "sweep", goal: str | None = None,
                      best: Any = None, target_step_time: float | None = None, interrupted: tuple[int, int] | None = None,
                      placeholders: dict[str, str] | None = None, axes: Sequence[str] | None = None) -> str:
    """The page of a sweep (`kind` "sweep") or a search ("search", with its `goal` and `best`): ranked
    `PointResult`s of configurations of `base` (the resolved Args). `interrupted` is (done, total)."""
    cfg = base.to_dict()
    rows = sweep_rows(results)
    if axes is None:
        axes = sorted({k for r in results for k in r.changes}, key=lambda k: [a for r in results for a in r.changes].index(k))
    fits = [r for r in rows if r["status"] == "fits"]
    ooms = [r for r in rows if r["status"] == "oom"]
    bad = [r for r in rows if r["status"] == "invalid"]
    model, hw = cfg.get("model", ""), cfg.get("hardware", "")
    if kind == "search":
        eyebrow = f"vime simulate --search {goal}"
        title = f"{model} on {hw}: {len(rows)} layouts, best of each GPU count and parallelism"
    else:
        eyebrow = "vime simulate --sweep " + " × ".join(f"{a.replace('_', '-')}" for a in axes)
        title = f"{model} on {hw}: {len(rows)} configurations"
    sub = f"base: {layout_line(cfg)}"
    best_idx = None
    if kind == "search" and best is not None:
        best_idx = next((i for i, r in enumerate(results) if r is best), None)
    elif fits:
        best_idx = 0
    banner_cls = "ok" if best_idx is not None else "oom"
    if best_idx is not None:
        b = rows[best_idx]
        what = {"fastest": "Fastest", "fewest-gpus": "Fewest GPUs", "cheapest": "Cheapest"}.get(goal or "", "Fastest")
        text = (f"{what}: {b['label']} — T_step {fmt_seconds(b['t_step'])} on {b['gpus']} GPUs, "
                f"{b['gpu_s_step']:,.0f} GPU·s per step ({b['gpu_s_1k']:,.0f} per 1k samples)")
    elif kind == "search":
        text = "No configuration meets the goal within --max-gpus; raise --max-gpus or relax the target."
    else:
        text = "No configuration fits."
    counts = f"{len(fits)} fit, {len(ooms)} out of memory, {len(bad)} invalid"
    if interrupted:
        counts += f" — interrupted: {interrupted[0]} of {interrupted[1]} finished"
    body = [f'<header><div class="eyebrow">{_esc(eyebrow)}</div><h1>{_esc(title)}</h1><p class="sub">{_esc(sub)}</p></header>',
            f'<section class="verdict {banner_cls}" id="verdict"><span class="icon">{"✓" if best_idx is not None else "✕"}</span> '
            f'{_esc(text)}<div class="counts">{_esc(counts)}</div></section>']
    if kind == "search" and best is not None:
        body.append(f'<section id="command"><h2>Run it</h2>{command_block(best.argv, placeholders or {})}</section>')
    if kind == "search":
        body.append('<section id="frontier"><h2>Step time against GPU count</h2><p class="hint">Every layout searched; '
                    'the line is the frontier (the fastest step for at most that many GPUs).</p>'
                    '<div class="chart" id="frontier-chart"></div></section>'
                    '<section id="cost"><h2>What a step costs</h2><p class="hint">GPU-seconds per 1000 samples: '
                    'GPUs × T_step ÷ samples per step × 1000.</p><div class="chart" id="cost-chart"></div></section>')
    else:
        body.append('<section id="sweep-lines" hidden><h2>T_step along the sweep</h2><div class="chart" id="sweep-chart"></div></section>')
    body.append('<section id="ranking"><h2>Ranked: where the time goes and how much memory is left</h2>'
                '<p class="hint">Fitting configurations by T_step, then the ones that run out of memory (with the '
                'reason), then invalid ones.</p><div class="chart" id="rank-chart"></div></section>')
    body.append(f'<section id="table"><h2>All configurations</h2><p class="hint">Click a column to sort.</p>'
                f'<div class="scroll">{_sweep_table(rows, axes)}</div></section>')
    samples = int(cfg.get("samples_per_rollout") or 0)
    data = {"kind": kind, "goal": goal, "rows": rows, "best": best_idx, "axes": list(axes),
            "axis_labels": {a: OPTION_LABELS.get(a, "--" + a.replace("_", "-")) for a in axes},
            "target": target_step_time, "samples": samples,
            "phase_labels": {p: PHASE_LABELS[p] for p in PHASE_ORDER}, "phase_colors": {p: PHASE_COLORS[p] for p in PHASE_ORDER}}
    return _page(f"{eyebrow} — {title}", kind, "\n".join(body), data)


# --------------------------------------------------------------------------------------------
# A run beside its simulation


__all__ = ["change_label", "command_block", "render_sweep_html", "sweep_rows"]
