"""Length distributions the simulator draws prompt and response lengths from (--prompt-length / --response-length)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

from vime.errors import ConfigError

LengthKind = Literal["fixed", "uniform", "lognormal", "trace"]
_SPEC_GRAMMAR = "fixed:N | uniform:A,B | lognormal:MU,SIGMA[,CLIP] | trace:FILE.jsonl"

#: Default response-length model: lognormal with median 40 % of --rollout-max-response-len and
#: sigma 0.6, clipped at the maximum. For the seed (max 1024) the median is ~410 tokens, the mean
#: ~490 and ~6 % of responses hit the cap — the long-tailed mix of a math-reasoning GRPO run,
#: where a few long responses decide when a group (and the rollout) finishes.
DEFAULT_RESPONSE_MEDIAN_FRACTION = 0.4
DEFAULT_RESPONSE_SIGMA = 0.6
#: Default prompt-length model: uniform between 1/8 of --rollout-max-prompt-len and the maximum
#: (64..512 for the seed; the seed's worked example uses a 200-token prompt).
DEFAULT_PROMPT_MIN_FRACTION = 8


@dataclass(frozen=True)
class LengthSpec:
    """A token-length distribution parsed from ``fixed:N``, ``uniform:A,B``, ``lognormal:MU,SIGMA`` or ``trace:FILE``.

    ``fixed``: always N (N ≥ 1). ``uniform``: integers A..B inclusive (1 ≤ A ≤ B).
    ``lognormal``: exp(Normal(MU, SIGMA)) with SIGMA > 0 (MU in log-tokens, so the median is
    exp(MU)); an optional CLIP in [0, 1) is the share of responses that run to the cap whatever the body
    (the truncated share a dashboard shows as clip ratio). ``trace``: lengths read from a JSONL file by
    the simulator. Every draw is capped at ``cap`` (the matching --rollout-max-*-len) by whoever samples it.
    """

    kind: LengthKind
    params: tuple[float, ...] = ()
    path: str | None = None
    cap: int | None = None

    def __str__(self) -> str:
        if self.kind == "trace":
            return f"trace:{self.path}"
        if self.kind == "lognormal":
            clip = f",{self.params[2]:.6g}" if len(self.params) > 2 else ""
            return f"lognormal:{self.params[0]:.6g},{self.params[1]:.6g}{clip}"
        return f"{self.kind}:" + ",".join(str(int(p)) for p in self.params)

    def to_dict(self) -> dict[str, Any]:
        return {"spec": str(self), "kind": self.kind, "params": list(self.params), "path": self.path,
                "cap": self.cap}


def parse_length_spec(text: str, *, flag: str = "--response-length", cap: int | None = None) -> LengthSpec:
    """Parse a length SPEC string; raises ConfigError naming `flag`, the value and the grammar."""
    def bad(why: str) -> ConfigError:
        return ConfigError(f"{flag} {text!r}: {why}; expected {_SPEC_GRAMMAR}")

    kind, sep, rest = text.strip().partition(":")
    kind = kind.strip().lower()
    if not sep or not rest.strip():
        raise bad("missing ':' and parameters")
    rest = rest.strip()
    if kind == "trace":
        return LengthSpec("trace", (), rest, cap)
    parts = [p.strip() for p in rest.split(",")]
    if kind == "fixed":
        if len(parts) != 1:
            raise bad("fixed takes one integer N")
        n = _spec_int(parts[0], bad)
        if n < 1:
            raise bad("N must be ≥ 1")
        return LengthSpec("fixed", (n,), None, cap)
    if kind == "uniform":
        if len(parts) != 2:
            raise bad("uniform takes two integers A,B")
        a, b = _spec_int(parts[0], bad), _spec_int(parts[1], bad)
        if not 1 <= a <= b:
            raise bad("need 1 ≤ A ≤ B")
        return LengthSpec("uniform", (a, b), None, cap)
    if kind == "lognormal":
        if len(parts) not in (2, 3):
            raise bad("lognormal takes MU,SIGMA and an optional CLIP")
        try:
            values = tuple(float(x) for x in parts)
        except ValueError:
            raise bad("MU, SIGMA and CLIP must be numbers") from None
        if not all(math.isfinite(x) for x in values) or values[1] <= 0:
            raise bad("MU must be finite and SIGMA > 0")
        if len(values) == 3 and not 0 <= values[2] < 1:
            raise bad("CLIP is the share of responses cut at the cap: 0 ≤ CLIP < 1")
        return LengthSpec("lognormal", values, None, cap)
    raise bad(f"unknown kind {kind!r}")


def _spec_int(text: str, bad: Any) -> int:
    try:
        return int(text)
    except ValueError:
        raise bad(f"{text!r} is not an integer") from None


def default_response_spec(max_response_len: int) -> LengthSpec:
    """The documented default response-length model for a given --rollout-max-response-len."""
    mu = math.log(DEFAULT_RESPONSE_MEDIAN_FRACTION * max_response_len)
    return LengthSpec("lognormal", (round(mu, 6), DEFAULT_RESPONSE_SIGMA), None, max_response_len)


def default_prompt_spec(max_prompt_len: int) -> LengthSpec:
    """The documented default prompt-length model for a given --rollout-max-prompt-len."""
    low = max(1, max_prompt_len // DEFAULT_PROMPT_MIN_FRACTION)
    return LengthSpec("uniform", (low, max_prompt_len), None, max_prompt_len)

