"""Seeded token-length distributions (fixed, uniform, lognormal, JSONL trace) for simulated prompts and responses.

A draw depends only on (seed, stream, key) — never on how many draws came before — so a
sample's response length does not change when the scheduler serves requests in another order
(seed step 23: a response ends at EOS, or at max_tokens when the model would have gone on).
The uniform number behind a draw comes from a BLAKE2b hash of the key, and the lognormal uses
the inverse normal CDF, so no RNG state is shared between samples.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist
from typing import Any, Literal

from vime.errors import ConfigError
from vime.inputs import read_jsonl

Kind = Literal["fixed", "uniform", "lognormal", "trace"]
_KINDS = ("fixed", "uniform", "lognormal", "trace")
_NORMAL = NormalDist()
#: Field names a trace line may use for its length, tried in this order.
TRACE_FIELDS = ("response_length", "completion_tokens", "response_tokens", "length",
                "prompt_length", "prompt_tokens")


def unit_hash(*parts: object) -> float:
    """A number in (0, 1) fixed by `parts` (BLAKE2b, so independent of PYTHONHASHSEED)."""
    digest = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=8).digest()
    # Shift into the open interval so the inverse normal CDF never sees 0 or 1.
    return (int.from_bytes(digest, "little") + 0.5) / 2.0**64


def key_seed(*parts: object) -> int:
    """A 64-bit integer fixed by `parts`, for seeding a per-request RNG."""
    digest = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


@lru_cache(maxsize=16)
def _read_trace(path: str, field: str | None) -> tuple[int, ...]:
    """Lengths from a JSONL file: each line a bare integer or an object with a length field."""
    values: list[int] = []
    fields = (field,) if field else TRACE_FIELDS
    for lineno, obj, line in read_jsonl(path, what="length trace",
                                        missing_hint="pass an existing JSONL file (one integer or one object "
                                                     f"with a {'/'.join(TRACE_FIELDS)} field per line)",
                                        bad_json_hint="write one JSON value per line"):
        if isinstance(obj, dict):
            found = next((obj[f] for f in fields if f in obj), None)
        else:
            found = obj
        if isinstance(found, bool) or not isinstance(found, int | float) or found < 1:
            raise ConfigError(f"length trace {path}:{lineno} has no positive length "
                              f"(looked for {', '.join(fields)}); got {line[:80]!r}")
        if isinstance(found, float) and not found.is_integer():
            raise ConfigError(f"length trace {path}:{lineno}: length {found} is not a whole number of tokens; "
                              f"write token counts")
        values.append(int(found))
    if not values:
        raise ConfigError(f"length trace {path!r} is empty; it needs at least one length")
    return tuple(values)


@dataclass(frozen=True)
class LengthDistribution:
    """A distribution of positive token lengths; `draw(u)` maps a uniform number to a length ≥ 1.

    ``fixed`` (n), ``uniform`` (a, b inclusive), ``lognormal`` (mu, sigma in log-tokens: median
    exp(mu); an optional clip share drawn past any cap), ``trace`` (an empirical list read from a JSONL file, drawn with replacement).
    """

    kind: Kind
    params: tuple[float, ...] = ()
    values: tuple[int, ...] = ()
    source: str | None = None

    def __post_init__(self) -> None:
        k, p = self.kind, self.params
        if k not in _KINDS:
            raise ConfigError(f"length distribution kind {k!r} is unknown; use one of {', '.join(_KINDS)}")
        if k == "fixed" and (len(p) != 1 or p[0] < 1):
            raise ConfigError(f"fixed length needs one N ≥ 1, got {p}")
        if k == "uniform" and (len(p) != 2 or not 1 <= p[0] <= p[1]):
            raise ConfigError(f"uniform length needs 1 ≤ A ≤ B, got {p}")
        if k == "lognormal" and (len(p) not in (2, 3) or not p[1] > 0 or not math.isfinite(p[0])
                                 or (len(p) == 3 and not 0 <= p[2] < 1)):
            raise ConfigError(f"lognormal length needs finite MU, SIGMA > 0 and an optional 0 ≤ CLIP < 1, got {p}")
        if k == "trace" and not self.values:
            raise ConfigError("trace length distribution needs at least one value")

    def draw(self, u: float) -> int:
        """The length at quantile `u` in (0, 1)."""
        k, p = self.kind, self.params
        if k == "fixed":
            return int(p[0])
        if k == "uniform":
            a, b = int(p[0]), int(p[1])
            return min(b, a + int(u * (b - a + 1)))
        if k == "lognormal":
            clip = p[2] if len(p) > 2 else 0.0
            if u >= 1.0 - clip:  # the clipped share: runs until the cap cuts it
                return 1 << 40
            x = math.exp(p[0] + p[1] * _NORMAL.inv_cdf(u / (1.0 - clip)))
            return max(1, min(int(round(x)), 1 << 40))
        return self.values[min(len(self.values) - 1, int(u * len(self.values)))]

    def mean(self, cap: int | None = None) -> float:
        """Expected length (capped at `cap` if given); lognormal by numerical quantiles."""
        if self.kind == "trace":
            vals: Sequence[int] = self.values
        else:
            n = 4096
            vals = [self.draw((i + 0.5) / n) for i in range(n)]
        if cap is not None:
            return sum(min(v, cap) for v in vals) / len(vals)
        return sum(vals) / len(vals)


def make_distribution(spec: Any) -> LengthDistribution:
    """A `LengthDistribution` from a `vime.config.LengthSpec`-like object, a spec string, a dict or an int.

    Strings use the command-line grammar (``fixed:N``, ``uniform:A,B``, ``lognormal:MU,SIGMA``,
    ``trace:FILE.jsonl``); a trace may name its field as ``trace:FILE.jsonl#field``.
    """
    if isinstance(spec, LengthDistribution):
        return spec
    if isinstance(spec, bool):
        raise ConfigError(f"length spec {spec!r} is not a distribution")
    if isinstance(spec, int):
        return LengthDistribution("fixed", (spec,))
    if isinstance(spec, str):
        from vime.config import parse_length_spec  # the one grammar lives with the flags

        spec = parse_length_spec(spec)
    if isinstance(spec, dict):
        kind, params, path = spec.get("kind"), tuple(spec.get("params", ())), spec.get("path")
    else:
        kind, params, path = getattr(spec, "kind", None), tuple(getattr(spec, "params", ())), \
            getattr(spec, "path", None)
    if kind == "trace":
        if not path:
            raise ConfigError("trace length spec needs a file: trace:FILE.jsonl")
        file, _, field = str(path).partition("#")
        return LengthDistribution("trace", (), _read_trace(file, field or None), file)
    if kind not in _KINDS:
        raise ConfigError(f"length spec {spec!r} is not fixed, uniform, lognormal or trace")
    return LengthDistribution(kind, params)


@dataclass(frozen=True)
class LengthDraw:
    """One response's fate: how many tokens it gets and why it stops (seed step 23)."""

    length: int
    finish_reason: Literal["stop", "length"]


class LengthSampler:
    """Deterministic per-key lengths: `response(key, max_tokens)` and `prompt(key, cap)`.

    The key is whatever identifies a sample stably (its request id, or "prompt-digest/k").
    """

    def __init__(self, response: Any, prompt: Any = None, *, seed: int = 0) -> None:
        self.response_dist = make_distribution(response)
        self.prompt_dist = make_distribution(prompt) if prompt is not None else None
        self.seed = int(seed)
        self._seen: dict[int, int] = {}

    def auto_key(self, token_ids: Sequence[int]) -> str:
        """A key for a request that carries no id: its prompt digest and how often that prompt came before.

        Identical prompts (the n samples of one GRPO group) get distinct keys 0, 1, 2 …, in
        arrival order; prefer passing request ids, which do not depend on order at all.
        """
        digest = key_seed(len(token_ids), *token_ids)
        k = self._seen.get(digest, 0)
        self._seen[digest] = k + 1
        return f"prompt:{digest:016x}/{k}"

    def response(self, key: object, max_tokens: int) -> LengthDraw:
        """The drawn length capped at `max_tokens`: "length" when the cap cut it, else "stop" (EOS)."""
        if max_tokens < 1:
            raise ConfigError(f"max_tokens must be ≥ 1, got {max_tokens}")
        n = self.response_dist.draw(unit_hash(self.seed, "response", key))
        if n >= max_tokens:
            return LengthDraw(max_tokens, "length")
        return LengthDraw(n, "stop")

    def prompt(self, key: object, cap: int | None = None) -> int:
        """A prompt length for `key`, capped at `cap`."""
        if self.prompt_dist is None:
            raise ConfigError("this LengthSampler has no prompt distribution; pass prompt=SPEC")
        n = self.prompt_dist.draw(unit_hash(self.seed, "prompt", key))
        return min(n, cap) if cap is not None else n
