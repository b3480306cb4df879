"""Reading input files (JSON, JSONL) and checking the numbers in them, with one-line errors that name the file, the key or line, and the fix."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from vime.errors import ConfigError


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def loads(text: str) -> Any:
    """json.loads without Python's NaN / Infinity / -Infinity extension (they are not JSON and poison sums)."""
    return json.loads(text, parse_constant=_no_constants)


def read_json(path: str | Path, *, what: str, missing_hint: str) -> Any:
    """The JSON value in file `path`; unreadable, non-UTF-8 or non-JSON content raises a one-line ConfigError."""
    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{what} {str(path)!r} does not exist; {missing_hint}")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path}: byte {exc.start} is not UTF-8; save the file as UTF-8 JSON") from None
    except OSError as exc:
        raise ConfigError(f"{what} {path}: cannot be read ({exc.strerror})") from None
    try:
        return loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{what} {path}:{exc.lineno}:{exc.colno} is not JSON ({exc.msg})") from None
    except ValueError as exc:
        raise ConfigError(f"{what} {path}: {exc}; use a finite number") from None


def count(data: Mapping[str, Any], key: str, *, where: str, default: Any = None, minimum: int = 1,
          maximum: int | None = None) -> int:
    """`data[key]` as an integer count: a JSON integer (not a boolean, not 2560.7) in [minimum, maximum]."""
    value = data.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: {key!r} is missing; add it (an integer ≥ {minimum})")
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer() and math.isfinite(value):
            value = int(value)
        else:
            raise ConfigError(f"{where}: {key!r} must be an integer, got {value!r}")
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"in [{minimum}, {maximum}]" if maximum is not None else f"≥ {minimum}"
        raise ConfigError(f"{where}: {key!r} = {value} must be {bound}")
    return value


def number(data: Mapping[str, Any], key: str, *, where: str, default: Any = None, positive: bool = True,
           low: float | None = None, high: float | None = None) -> float:
    """`data[key]` as a finite number (positive when asked; within [low, high] when given, a plausibility range)."""
    value = data.get(key, default)
    if value is None:
        raise ConfigError(f"{where}: {key!r} is missing; add it (a finite number)")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{where}: {key!r} must be a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {key!r} = {value} must be finite")
    if positive and value <= 0:
        raise ConfigError(f"{where}: {key!r} = {value:g} must be > 0")
    if (low is not None and value < low) or (high is not None and value > high):
        bound = f"[{low:g}, {high:g}]" if low is not None and high is not None else (
            f"≥ {low:g}" if low is not None else f"≤ {high:g}")
        raise ConfigError(f"{where}: {key!r} = {value:g} is outside the plausible range {bound}; check the value")
    return value


def flag(data: Mapping[str, Any], key: str, *, where: str, default: bool = False) -> bool:
    """`data[key]` as a JSON boolean."""
    value = data.get(key, default)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise ConfigError(f"{where}: {key!r} must be true or false, got {value!r}")
    return value


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
    try:
        lines = p.read_bytes().decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {path}: byte {exc.start} is not UTF-8; save the file as UTF-8 JSONL") from None
    for lineno, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line:
            continue
        try:
            value = loads(line)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{what} {path}:{lineno} is not JSON ({exc.msg}){suffix}") from None
        except ValueError as exc:
            raise ConfigError(f"{what} {path}:{lineno}: {exc}{suffix}") from None
        yield lineno, value, line
