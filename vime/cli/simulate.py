"""`vime simulate`: one configuration as tables or JSON (with an optional trace and HTML report), or a sweep / search over many."""

from __future__ import annotations

import csv
import io
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from vime.config import Args
from vime.errors import SimulationError
from vime.faults import faults_of, format_fault_report, stop_message
from vime.outputs import write_atomic
from vime.runs.sweep import PointResult

_PHASE_LABEL = {"rollout": "rollout (14–32)", "offload": "offload (33–36)", "train": "train (37–42)",
                "onload_weights": "onload weights (43)", "weight_sync": "weight sync (44–53)",
                "onload_kv": "onload KV (54)", "gap": "outside the phases"}


def _band(b: dict[str, Any] | None) -> str:
    if not b or b.get("low_s") is None:
        return f"  {'(no band)':>17}"
    return f"  [{b['low_s']:7.3f}–{b['high_s']:7.3f}]"


def format_text(doc: dict[str, Any]) -> str:
    """The human report: phases, rollout figures, memory per GPU, verdict."""
    cfg, m = doc["config"], doc["model"]
    params = f"{m['params_b']:.2f} B params"
    ep = ""
    if m.get("experts"):  # MoE: the active parameters, the experts and the expert parallelism
        params += f", {m['active_params_b']:.2f} B active, {m['experts_per_token']} of {m['experts']} experts"
        ep = f", EP {cfg.get('expert_model_parallel_size', 1)}"
    lines = [f"vime simulate — {m['name']} ({params}) on "
             f"{cfg['actor_num_gpus']} × {doc['hardware']['name']}, "
             f"{'colocate' if cfg['colocate'] else 'disaggregated'}, TP {cfg['tensor_model_parallel_size']} × "
             f"DP {cfg['data_parallel_size']}{ep}, {cfg['rollout_num_engines']} engines × "
             f"{cfg['rollout_num_gpus_per_engine']} GPUs, {cfg['rollout_batch_size']} × {cfg['n_samples_per_prompt']} "
             f"samples, {len(doc['steps'])} step(s) simulated", ""]
    s = doc["summary"]
    unc = doc.get("uncertainty") or {}
    banded = unc.get("basis") is not None
    lines.append("T_step by phase (mean over simulated steps" + (", band: measured spread)" if banded else ")"))
    for name, p in s["phases"].items():
        bar = "█" * int(round(p["percent"] / 2.5))
        band = _band(unc.get("phases", {}).get(name)) if banded else ""
        lines.append(f"  {_PHASE_LABEL.get(name, name):<22} {p['seconds']:9.3f} s{band}  {p['percent']:5.1f} %  {bar}")
    lines.append(f"  {'T_step':<22} {s['t_step']:9.3f} s" + (_band(unc.get("t_step")) if banded else ""))
    if unc:
        lines.append(f"  (no band: {doc['hardware']['name']} records no measured spread, so each phase is an estimate "
                     f"of unknown error; --json's uncertainty says more)" if not banded else
                     f"  (band: lowest..highest measured/predicted over {unc['basis']}'s calibration rows and whole "
                     f"measured steps of what each phase rests on; --json's uncertainty says which)")
    r = doc["rollout"]
    lines += ["", "Rollout",
              f"  tokens generated per step {r['tokens_generated']:,}   tokens/s per GPU {r['tokens_per_s_per_gpu']:,.0f}"
              f"   longest sample {r['longest_sample_tokens']} tokens",
              f"  engine busy {100 * r['engine_busy_share']:.0f} % of rollout   KV blocks peak {r['kv_blocks_peak']:,} of "
              f"{r['kv_blocks_total']:,} ({100 * r['kv_blocks_used_share']:.0f} %)   preemptions {r['preemptions']}"]
    lines += _async_lines(doc.get("async"))
    lines += offload_lines(doc.get("offload"))
    lines += ["", "Peak memory per GPU (GiB, at the moment of the GPU's peak)"]
    for g in doc["memory"]["gpus"]:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in g["by_owner_tag_gib"].items())
        lines.append(f"  GPU {g['gpu']}: {g['peak_gib']:6.2f} of {g['capacity_gib']:.2f}  headroom "
                     f"{g['headroom_gib']:6.2f}  during {g['peak_phase'] or '-'}  [{parts}]")
    lines.append(f"  host pinned memory peak: {doc['memory']['host_pinned_peak_gib']:.2f} GiB")
    v = doc["verdict"]
    lines.append("")
    if v["fits"]:
        worst = min((g["headroom_gib"] for g in doc["memory"]["gpus"]), default=0.0)
        lines.append(f"Verdict: FITS — smallest headroom {worst:.2f} GiB")
        band = (doc.get("uncertainty") or {}).get("memory") or {}
        risky = [g for g in band.get("gpus", []) if g["at_risk"]]
        if risky:
            caps = {g["gpu"]: g["capacity_gib"] for g in doc["memory"]["gpus"]}
            over = "; ".join(f"GPU {g['gpu']}'s {g['high_phase']} up to {g['peak_high_gib']:.2f} of "
                             f"{caps[g['gpu']]:.2f} GiB (measured levels ran up to {100 * (g['high_factor'] - 1):.1f} % "
                             f"over the simulated)" for g in risky)
            lines.append(f"  AT RISK (the runs measured for {doc['uncertainty']['basis']}): {over}; leave more headroom "
                         f"(--gpu-memory-utilization, --micro-batch-size, --train-offload-plan)")
    else:
        o = v["oom"]
        lines.append(f"Verdict: OOM during {o['phase'] or '?'} (rollout {o['rollout_id']}) on GPU {o['gpu']}: "
                     f"{o['owner']}/{o['tag']} asked for {o['requested_gib']:.2f} GiB with {o['free_gib']:.2f} GiB free "
                     f"— short by {o['short_by_gib']:.2f} GiB at t = {o['time_s']:.3f} s")
        if v["fixes"]:
            lines.append("Fixes (each simulated):")
            lines += [f"  - {f}" for f in v["fixes"]]
    return "\n".join(lines)




def _async_lines(a: dict[str, Any] | None) -> list[str]:
    """--async-mode one-step-off / fully-async: staleness, throughput and idle shares, all steps and steady state."""
    if not a:
        return []
    lines = ["", f"Asynchrony ({a['mode']}; steady state: the steps after the first {a['warmup_steps']})"]
    for label, p in (("all steps", a["all"]), ("steady state", a["steady"])):
        if not p["steps"]:
            continue
        lines.append(f"  {label:<13} T_step {p['t_step']:7.3f} s   {p['samples_per_s']:7.1f} samples/s   "
                     f"{p['tokens_per_s']:9,.0f} tokens/s   engines idle {100 * p['engine_idle_share']:4.1f} %   "
                     f"trainer idle {100 * p['trainer_idle_share']:4.1f} %")
        lines.append(f"  {'':<13} staleness mean {p['staleness_mean']:.2f} max {p['staleness_max']:.0f} versions   "
                     f"partially regenerated {100 * p['partial_share']:.1f} %   stale groups regenerated "
                     f"{p['stale_groups']:.0f}")
    return lines


def offload_lines(off: dict[str, Any] | None) -> list[str]:
    """The report's offload lines: the plan, GiB moved per step, and against `all` when another plan ran."""
    if not off:
        return []
    m = off["moved_gib_per_step"]
    lines = ["", f"Offload (--train-offload-plan {off['plan']}): {m['total']:.1f} GiB moved per step over all GPUs — trainer "
                 f"{m['trainer_to_host']:.1f} to host, {m['trainer_to_gpu']:.1f} to GPU; engines "
                 f"{m['engines_to_host']:.1f} to host, {m['engines_to_gpu']:.1f} to GPU"]
    if "auto" in off:
        c, b = off["auto"]["chosen"], off["auto"]["baseline_all"]
        lines.append(f"  auto chose --train-offload-plan {c['plan']} --gpu-memory-utilization "
                     f"{c['gpu_memory_utilization']:g} (resident: {', '.join(off['auto']['resident']) or 'nothing'}) "
                     f"of {len(off['auto']['candidates'])} simulated candidates")
    else:
        b = off.get("all")
    if b:
        saved = b["moved_gib_per_step"] - m["total"]
        lines.append(f"  against all at --gpu-memory-utilization {b['gpu_memory_utilization']:g}: "
                     + (f"T_step {b['t_step']:.3f} s, {b['moved_gib_per_step']:.1f} GiB moved per step (saves "
                        f"{saved:.1f} GiB)" if b["fits"] else f"does not fit ({b['why']})"))
    return lines


#: from this many simulated samples on, `vime simulate` announces the run and shows its progress
LARGE_RUN_SAMPLES = 200_000


def run_simulate(args: Any) -> int:
    """`vime simulate`: one configuration (tables or --json), or a sweep / search over many."""
    if args.sweep or args.search:
        return run_sweep_command(args)
    from vime.runs.document import build_document
    from vime.runs.fixes import fix_lines, simulate_fixes
    from vime.runs.sim import simulate
    from vime.trackers import Trackers

    trackers = Trackers.from_config(args.logging, args.to_dict())  # simulated steps logged like real ones, to compare the curves
    calls: Any = None
    recording: dict[str, Any] = {}
    if args.record_calls:
        from vime.report.calls import CallLog

        calls = CallLog()
        log = calls
        recording = {"observers": [log], "wrap": lambda b: log.wrap(b.engines, b.router, b.trainer)}
    samples = int(args.samples_per_rollout) * max(1, int(args.num_rollout))
    big = samples >= LARGE_RUN_SAMPLES
    if big:  # a long run says so up front, and a terminal gets each rollout's progress bar
        print(f"simulating {samples:,} samples ({args.num_rollout} rollout(s) of {args.samples_per_rollout:,}); "
              f"runs this size take minutes", file=sys.stderr, flush=True)
    try:
        sim = simulate(args, progress=None if big and not args.json else False, on_step=trackers.step, **recording)
    finally:
        trackers.close()
    faults = faults_of(sim)
    if faults is not None and faults["outcome"] == "stopped":
        print(_dumps({"schema": "vime.simulate/faults", "faults": faults}) if args.json else format_fault_report(faults))
        print(f"vime simulate: {stop_message(faults)}", file=sys.stderr)
        return 1
    if sim.oom is not None:
        sim.fix_results = simulate_fixes(sim)
        sim.fixes = fix_lines(sim.fix_results)
    doc = build_document(sim, calls=calls)
    if doc["offload"]["plan"] != "all" and "auto" not in doc["offload"]:  # what the plan saved against all
        from vime.runs.offload import run_candidate

        doc["offload"]["all"] = run_candidate(args, "all", float(args.gpu_memory_utilization))[0].to_dict()
    if faults is not None:
        doc["faults"] = faults
    text = _dumps(doc)  # before any file is written: a non-finite number is a bug, never invalid JSON
    # the results first: a file that cannot be written (a full disk) then loses nothing but itself
    if args.json:
        print(text, flush=True)
    else:
        print(format_text(doc))
        if faults is not None:
            print("\n" + format_fault_report(faults))
        sys.stdout.flush()
    if args.trace_out:
        from vime.report.trace import recorder_trace

        write_atomic(args.trace_out, json.dumps(recorder_trace(sim.backends.recorder), separators=(",", ":")))
    if args.report:
        from vime.report.html import render_html

        write_atomic(args.report, render_html(doc, sim.backends.recorder, trace_href=trace_href(args)))
    if not args.json:
        for path, what in ((args.trace_out, "trace"), (args.report, "report")):
            if path:
                print(f"{what} written to {path}", file=sys.stderr)
    return 0 if sim.fits else 3


def trace_href(args: Any) -> str | None:
    """The --trace-out file as the --report page links it: relative to the page's directory."""
    if not (args.trace_out and args.report):
        return None
    here = os.path.dirname(os.path.abspath(args.report))
    return os.path.relpath(os.path.abspath(args.trace_out), here).replace(os.sep, "/")


# Sweeps and searches (vime.runs.sweep computes, this prints)


def _rows(results: Sequence[PointResult]) -> list[dict[str, Any]]:
    rows = []
    for rank, r in enumerate(results, 1):
        status = r.status
        fits = r.valid and r.fits
        row: dict[str, Any] = {"rank": rank, **{k: r.changes[k] for k in sorted(r.changes)}, "status": status,
                               "t_step_s": r.t_step if fits else "", "peak_gib": r.peak_gib,
                               "gpus": r.gpus, "gpu_s_step": round(r.gpu_s_per_step, 1) if fits else "",
                               "gpu_s_per_1k": round(r.gpu_s_per_1k_samples, 1) if fits else "",
                               "reason": r.oom or r.error}
        rows.append(row)
    return rows


def format_results(results: Sequence[PointResult]) -> str:
    rows = _rows(results)
    if not rows:
        return "(no configurations)"
    cols = list(rows[0].keys())
    for r in rows:
        cols += [c for c in r if c not in cols]
    widths = {c: max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols if c != "reason"}
    head = "  ".join(f"{c:<{widths[c]}}" for c in widths) + "  reason"
    lines = [head]
    for r in rows:
        lines.append("  ".join(f"{r.get(c, '')!s:<{widths[c]}}" for c in widths) + "  " + str(r.get("reason", "")))
    return "\n".join(lines)


def format_csv(results: Sequence[PointResult]) -> str:
    rows = _rows(results)
    cols: list[str] = []
    for r in rows:
        cols += [c for c in r if c not in cols]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return buf.getvalue()


def _dumps(doc: dict[str, Any]) -> str:
    try:
        return json.dumps(doc, indent=1, sort_keys=False, allow_nan=False)
    except ValueError as exc:
        raise SimulationError(f"the simulation produced a non-finite number ({exc}); this is a vime bug, "
                              f"please report it with the command line") from None


def _print_results(args: Args, results: Sequence[PointResult], schema: str, extra: dict[str, Any]) -> None:
    if args.json:
        print(_dumps({"schema": schema, **extra, "results": [asdict(r) for r in results]}))
    elif args.csv:
        print(format_csv(results), end="")
    else:
        print(format_results(results))


def _log_point(total: int) -> Any:
    """A line on stderr per finished configuration, for logs (a terminal gets the progress bar instead)."""
    done = [0]

    def log(r: PointResult) -> None:
        done[0] += 1
        status = r.status
        print(f"[{done[0]}/{total}] {json.dumps(r.changes, default=str)} {status}", file=sys.stderr, flush=True)

    return log


def _write_sweep_report(args: Args, results: Sequence[PointResult], *, kind: str, best: PointResult | None = None,
                        interrupted: tuple[int, int] | None = None, axes: Sequence[str] | None = None) -> None:
    """--report of a sweep or search: the ranked page (written atomically)."""
    if not args.report:
        return
    from vime.report.html_sweep import render_sweep_html
    from vime.runs.sweep import placeholders

    page = render_sweep_html(results, args, kind=kind, goal=args.search, best=best, target_step_time=args.target_step_time,
                             interrupted=interrupted, placeholders=placeholders(best.argv) if best else {}, axes=axes)
    write_atomic(args.report, page)
    if not (args.json or args.csv):
        print(f"report written to {args.report}", file=sys.stderr)


def run_sweep_command(args: Args) -> int:
    """`vime simulate --sweep ...` / `--search ...`: print the ranked table (text, --json or --csv), and with
    --report write the page of it.

    Ctrl-C prints the configurations that finished (and writes their page) and exits 130.
    """
    from vime.errors import Interrupted
    from vime.runs.search import run_search
    from vime.runs.sweep import parse_sweep, placeholders, run_points

    quiet = bool(args.json or args.csv) or not sys.stderr.isatty()
    if args.search:
        try:
            best, ranked, stats = run_search(args, goal=args.search, max_gpus=int(args.max_gpus),
                                             target_step_time=args.target_step_time, workers=args.workers,
                                             progress=not quiet, ray_address=args.ray_address)
        except Interrupted as stop:
            _print_results(args, stop.results, "vime.search/1", {"goal": args.search, "interrupted": True})  # type: ignore[arg-type]
            _write_sweep_report(args, stop.results, kind="search", interrupted=(len(stop.results), stop.total))  # type: ignore[arg-type]
            print(f"vime simulate: {stop}", file=sys.stderr)
            return 130
        _write_sweep_report(args, ranked, kind="search", best=best)
        if args.json:
            print(json.dumps({"schema": "vime.search/1", "goal": args.search, "best": asdict(best) if best else None,
                              "placeholders": placeholders(best.argv) if best else {}, "search": stats.to_dict(),
                              "candidates": [asdict(r) for r in ranked]}, indent=1))
        elif args.csv:
            print(format_csv(ranked), end="")
        else:
            print(format_results(ranked))
            print()
            print(stats.summary())
            for rule, first in stats.to_dict()["first_pruned_by_rule"].items():
                print(f"  {rule}, e.g. {json.dumps(first['changes'], default=str)}: {first['reason']}")
            if best is None:
                print("No configuration meets the goal within --max-gpus; raise --max-gpus or relax the target.")
            else:
                print(f"Best ({args.search}): T_step {best.t_step:.3f} s on {best.gpus} GPUs — "
                      f"{best.gpu_s_per_step:,.1f} GPU·s per step, {best.gpu_s_per_1k_samples:,.1f} GPU·s per 1k samples")
                if best.at_risk:
                    print("  AT RISK: it fits by less than measured memory levels have run over the model on this "
                          "profile, and no configuration clear of that met the goal (vime simulate it for the band)")
                print(" ".join(best.argv))
                for word, what in placeholders(best.argv).items():
                    print(f"  {word} is a placeholder: {what}")
                if int(best.changes.get("expert_model_parallel_size", 1)) > 1:
                    print("  note: vime train --backend real trains MoE models at --expert-model-parallel-size 1 only "
                          "today; this layout runs on --backend sim")
        return 0 if best is not None else 3
    points = parse_sweep(args.sweep, max_points=int(args.max_points))
    axes = list(points[0]) if points else []
    if not (args.json or args.csv):
        workers = min(args.workers or os.cpu_count() or 1, len(points))
        print(f"simulating {len(points)} configurations on {workers} worker(s)", file=sys.stderr, flush=True)
    try:
        results = run_points(args, points, workers=args.workers, ray_address=args.ray_address, progress=not quiet,
                             on_result=None if (args.json or args.csv or sys.stderr.isatty()) else _log_point(len(points)))
    except Interrupted as stop:
        _print_results(args, stop.results, "vime.sweep/1", {"interrupted": True})  # type: ignore[arg-type]
        _write_sweep_report(args, stop.results, kind="sweep", interrupted=(len(stop.results), stop.total), axes=axes)  # type: ignore[arg-type]
        print(f"vime simulate: {stop}", file=sys.stderr)
        return 130
    _print_results(args, results, "vime.sweep/1", {})
    _write_sweep_report(args, results, kind="sweep", axes=axes)
    return 0
