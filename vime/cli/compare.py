"""`vime compare`: measured runs (`vime train --json` lines) beside their simulation, phase by phase and call for call; --report draws the page."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from vime.errors import ConfigError

USAGE = ("vime compare --train RUN.jsonl [--train RUN2.jsonl ...] --sim SIM.json [--mem GPU_MEM.csv] "
         "[--report PAGE.html] [--json] [--out FILE] [--calls]   |   ... | vime compare stamp")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"vime compare: {message} (see `vime compare --help`)")


def build_parser(prog: str = "vime compare") -> argparse.ArgumentParser:
    ap = _Parser(prog=prog, allow_abbrev=False, description=(
        "Measured runs beside their simulation: each phase measured (the median over the runs, with their spread), "
        "simulated and the error (100 × (simulated − measured) / measured), the weight versions, the protocol calls "
        "when both sides recorded them (--record-calls), and with --mem each GPU's memory. "
        "`vime compare stamp` adds wall_time to the JSON lines piped through it. "
        "Exit 0 when complete and consistent, 1 when not, 2 for unreadable input."))
    ap.add_argument("--train", required=True, action="append", metavar="RUN.jsonl",
                    help="a run's `vime train --json` output (repeat for several runs of one configuration)")
    ap.add_argument("--sim", required=True, metavar="SIM.json", help="`vime simulate --json` of the same arguments")
    ap.add_argument("--mem", metavar="GPU_MEM.csv", help="GPU memory samples, rows epoch,gpu_index,used_mib")
    ap.add_argument("--mem-tolerance-mib", type=float, default=1024.0, metavar="MIB",
                    help="how far a GPU's level may move between steps and still count as steady (default: 1024)")
    ap.add_argument("--tolerance-pct", type=float, default=20.0,
                    help="error allowed per steady phase when the runs' spread is smaller (default 20)")
    ap.add_argument("--report", metavar="PAGE.html", help="write the page: phases, timelines and memory of both")
    ap.add_argument("--json", action="store_true", help="print the vime.compare/1 document instead of the table")
    ap.add_argument("--out", metavar="FILE", help="also write the vime.compare/1 document to FILE")
    ap.add_argument("--calls", action="store_true", help="print both sides' call sequences")
    ap.add_argument("--no-steps", action="store_true", help="print only start-up and the steady mean")
    return ap


def run_compare(argv: Sequence[str], *, prog: str = "vime compare") -> int:
    """``vime compare stamp`` or ``vime compare [compare] --train RUN.jsonl ... --sim SIM.json ...``."""
    from vime.inputs import read_json
    from vime.outputs import write_atomic
    from vime.report.compare import compare_runs, format_table, read_mem, read_train, stamp
    from vime.report.compare_views import views_from_files

    args = list(argv)
    if args[:1] == ["stamp"]:
        stamp(sys.stdin, sys.stdout)
        return 0
    if args[:1] == ["compare"]:
        args = args[1:]
    a = build_parser(prog).parse_args(args)
    for flag, paths in (("--train", a.train), ("--mem", [a.mem] if a.mem else [])):
        for path in paths:
            if not Path(path).is_file():
                raise ConfigError(f"vime compare: cannot read the inputs: {flag} {path}: no such file")
    try:
        runs = [read_train(Path(p)) for p in a.train]
        mem = read_mem(Path(a.mem)) if a.mem else None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"vime compare: cannot read the inputs: {exc}") from None
    sim = read_json(a.sim, what="--sim", missing_hint="give the `vime simulate --json` document of the run's arguments")
    if not isinstance(sim, dict) or "steps" not in sim:
        raise ConfigError(f"--sim {a.sim}: not a `vime simulate --json` document (no steps)")
    doc = compare_runs(runs, sim, mem, a.mem_tolerance_mib, tolerance_pct=a.tolerance_pct)
    text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False)
    if a.out:
        write_atomic(a.out, text + "\n")
    if a.report:
        from vime.report.html import layout_line
        from vime.report.html_compare import render_compare_html

        startup, measured = runs[0]
        measured_view, simulated_view = views_from_files(startup, measured, sim, mem)
        model, hw = sim.get("model", {}).get("name", "model"), sim.get("hardware", {}).get("name", "")
        note = "" if measured else " — the run has no step (it stopped before its first one finished: see its log)"
        page = render_compare_html(doc, measured_view=measured_view, simulated_view=simulated_view,
                                   title=f"{model}: {Path(a.train[0]).name} beside its simulation on {hw}",
                                   sub=layout_line(sim.get("config", {})) + note)
        write_atomic(a.report, page)
    if a.json:
        print(text)
    else:
        print(format_table(doc, steps=not a.no_steps, calls=a.calls))
        if a.report:
            print(f"report written to {a.report}", file=sys.stderr)
    return 0 if doc["ok"] else 1
