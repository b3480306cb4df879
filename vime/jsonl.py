"""Reading JSONL input files (prompt datasets, length traces) with errors that name the file, the line and the fix."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from vime.errors import ConfigError


def read_jsonl(path: str | Path, *, what: str, missing_hint: str, bad_json_hint: str = "") -> Iterator[
        tuple[int, Any, str]]:
    """Yield ``(line number, parsed value, stripped line)`` for every non-empty line of `path`.

    `what` names the input in errors (``"--prompt-data"``, ``"length trace"``); a missing file
    raises ConfigError ending with `missing_hint`, a line that is not JSON one naming ``file:line``.
    """
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist; {missing_hint}")
    suffix = f"; {bad_json_hint}" if bad_json_hint else ""
    with p.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            line = line.strip()
            if not line:
                continue
            try:
                value = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ConfigError(f"{what} {path}:{lineno} is not JSON ({exc.msg}){suffix}") from None
            yield lineno, value, line
