"""`vime compare`: measured runs next to their simulation, phase by phase and call for call (`vime.report.compare`)."""

from __future__ import annotations

from collections.abc import Sequence

from vime.report.compare import main as _main


def run_compare(argv: Sequence[str]) -> int:
    """``vime compare stamp`` or ``vime compare [compare] --train RUN.jsonl ... --sim SIM.json ...``."""
    args = list(argv)
    if not args or args[0] not in ("stamp", "compare", "-h", "--help"):
        args = ["compare", *args]
    return _main(args, prog="vime compare")
