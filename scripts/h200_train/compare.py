"""Measured (`vime train --backend real --json`) next to predicted (`vime simulate --json`) per phase, with the error (issue 9).

A thin caller of the one comparison tool, `vime.report.compare` (also `vime compare`): the same two
commands as before,

    ... vime train --json | python scripts/h200_train/compare.py stamp > train.jsonl
    python scripts/h200_train/compare.py compare --train train.jsonl --sim sim.json [--mem gpu_mem.csv]
        [--out compare.json] [--mem-tolerance-mib 1024]

and the same functions for scripts that import this file (compare, format_table, phase_windows, ...).
Exit status: 0 when the run is complete and consistent, 1 otherwise, 2 for unreadable input.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vime.report.compare import (  # noqa: E402  (the repository root goes on the path first)
    PHASES,
    STARTUP,
    compare,
    compare_runs,
    error_pct,
    format_table,
    memory_per_step,
    phase_windows,
    read_mem,
    read_sim,
    read_train,
    stamp,
)
from vime.report.compare import main as _main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return _main(argv, prog="compare.py")


__all__ = ["PHASES", "STARTUP", "compare", "compare_runs", "error_pct", "format_table", "memory_per_step",
           "phase_windows", "read_mem", "read_sim", "read_train", "stamp", "main"]

if __name__ == "__main__":
    sys.exit(main())
