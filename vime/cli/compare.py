"""`vime compare`: a run's `vime train --json` lines beside its simulation's `vime simulate --json` document, per phase; --report draws the page."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from vime.errors import ConfigError

USAGE = "vime compare --train RUN.jsonl --sim SIM.json [--mem GPU_MEM.csv] [--report PAGE.html] [--json] [--out FILE]"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(f"vime compare: {message} (see `vime compare --help`)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="vime compare", allow_abbrev=False, description=(
        "A measured run beside its simulation: each phase measured, simulated and the error "
        "(100 × (simulated − measured) / measured), the weight versions, and with --mem each GPU's memory. "
        "Exit 0 when complete and consistent, 1 when not, 2 for unreadable input."))
    ap.add_argument("--train", required=True, metavar="RUN.jsonl",
                    help="the run's `vime train --json` output (step lines; wall_time stamps line memory up)")
    ap.add_argument("--sim", required=True, metavar="SIM.json", help="`vime simulate --json` of the same arguments")
    ap.add_argument("--mem", metavar="GPU_MEM.csv", help="GPU memory samples, rows epoch,gpu_index,used_mib")
    ap.add_argument("--mem-tolerance-mib", type=float, default=1024.0, metavar="MIB",
                    help="how far a GPU's level may move between steps and still count as steady (default: 1024)")
    ap.add_argument("--report", metavar="PAGE.html", help="write the page: phases, timelines and memory of both")
    ap.add_argument("--json", action="store_true", help="print the vime.compare/1 document instead of the table")
    ap.add_argument("--out", metavar="FILE", help="also write the vime.compare/1 document to FILE")
    return ap


def run_compare(argv: Sequence[str]) -> int:
    from vime.inputs import read_json
    from vime.outputs import write_atomic
    from vime.report.compare import compare, format_table, read_mem, read_train, views_from_files
    from vime.report.html import layout_line, render_compare_html

    a = build_parser().parse_args(list(argv))
    for flag, path in (("--train", a.train), ("--mem", a.mem)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(f"{flag} {path}: no such file")
    try:
        startup, measured = read_train(Path(a.train))
        mem = read_mem(Path(a.mem)) if a.mem else None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"vime compare: cannot read the inputs: {exc}") from None
    sim = read_json(a.sim, what="--sim", missing_hint="give the `vime simulate --json` document of the run's arguments")
    if not isinstance(sim, dict) or "steps" not in sim:
        raise ConfigError(f"--sim {a.sim}: not a `vime simulate --json` document (no steps)")
    doc = compare(startup, measured, sim, mem, a.mem_tolerance_mib)
    text = json.dumps(doc, indent=1, sort_keys=True, allow_nan=False)
    if a.out:
        write_atomic(a.out, text + "\n")
    if a.report:
        measured_view, simulated_view = views_from_files(startup, measured, sim, mem)
        model, hw = sim.get("model", {}).get("name", "model"), sim.get("hardware", {}).get("name", "")
        note = "" if measured else " — the run has no step (it stopped before its first one finished: see its log)"
        page = render_compare_html(doc, measured_view=measured_view, simulated_view=simulated_view,
                                   title=f"{model}: {Path(a.train).name} beside its simulation on {hw}",
                                   sub=layout_line(sim.get("config", {})) + note)
        write_atomic(a.report, page)
    if a.json:
        print(text)
    else:
        print(format_table(doc))
        if a.report:
            print(f"report written to {a.report}", file=sys.stderr)
    return 0 if doc["ok"] else 1
