"""Measured (`vime train --backend real --json`) next to predicted (`vime simulate --json`) per phase, with the error (issue 9).

Two commands:

    ... vime train --json | python scripts/h200_train/compare.py stamp > train.jsonl
        copies stdin to stdout, adding ``wall_time`` (epoch seconds) to every JSON object line, so
        steps can be matched to the GPU-memory samples taken meanwhile;

    python scripts/h200_train/compare.py compare --train train.jsonl --sim sim.json [--mem gpu_mem.csv]
        [--out compare.json] [--mem-tolerance-mib 1024]
        prints a table and writes JSON: for start-up and for each phase of each step, measured and
        predicted seconds and ``error_pct = 100 * (predicted - measured) / measured``; the same for
        the mean over all steps and over the steady steps (rollout id >= 1); the weight versions the
        responses carried (must rise by one per step from start-up's); and, from the memory samples
        (CSV ``epoch,gpu_index,used_mib``), each GPU's level while the engines generate and while the
        trainer trains in every step, whether both came back to the same level each step (spread
        within the tolerance), and its peak next to the simulator's.

The comparison itself lives in the package (`vime.report.compare`, also behind `vime compare`, which
adds ``--report`` for the page); this script keeps the command line the H200 runs were written with.

Exit status: 0 when the run is complete and consistent (every predicted step measured, versions
rising by one, memory level steady where sampled), 1 otherwise, 2 for unreadable input.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any, TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's vime, wherever this runs from

from vime.report.compare import (  # noqa: E402  (re-exported: the tests and summarize.py use them from here)
    PHASES,
    STARTUP,
    compare,
    error_pct,
    format_table,
    memory_per_step,
    phase_windows,
    read_mem,
    read_train,
)

__all__ = ["PHASES", "STARTUP", "compare", "error_pct", "format_table", "memory_per_step", "phase_windows",
           "read_mem", "read_train", "stamp"]


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


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("stamp", help="add wall_time to the JSON lines of stdin")
    c = sub.add_parser("compare", help="measured vs predicted per phase")
    c.add_argument("--train", required=True, type=Path)
    c.add_argument("--sim", required=True, type=Path)
    c.add_argument("--mem", type=Path)
    c.add_argument("--out", type=Path)
    c.add_argument("--mem-tolerance-mib", type=float, default=1024.0)
    a = ap.parse_args(argv)
    if a.cmd == "stamp":
        stamp(sys.stdin, sys.stdout)
        return 0
    try:
        startup, measured = read_train(a.train)
        sim = json.loads(a.sim.read_text())
        mem = read_mem(a.mem) if a.mem else None
    except (OSError, json.JSONDecodeError) as exc:
        print(f"compare: cannot read the inputs: {exc}", file=sys.stderr)
        return 2
    doc = compare(startup, measured, sim, mem, a.mem_tolerance_mib)
    if a.out:
        a.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(format_table(doc))
    return 0 if doc["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
