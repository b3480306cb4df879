"""The vLLM /inference/v1/generate wire format: decode a response's JSON and parse it into a GenerateResult (seed steps 24–25)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from operator import itemgetter
from typing import Any

from vime.errors import ResponseFormatError
from vime.protocols import FinishReason, GenerateResult

#: vLLM writes this log-prob when the sampled token is missing from the returned top-k map
#: (seed step 24); vime keeps it as the "missing" marker and maps null / non-finite values to it.
MISSING_LOGPROB = -9999.0
_TOKEN_PREFIX = "token_id:"

_PREFIX_LEN = len(_TOKEN_PREFIX)
_get_logprob = itemgetter("logprob")
_get_token = itemgetter("token")
_get_token_id = itemgetter("token_id")

_FINISH: dict[str, FinishReason] = {"stop": "stop", "length": "length", "abort": "abort",
                                    "cancelled": "abort", "error": "error"}


# The one fast path: a msgspec decoder that reads only the fields parse_generate_response uses
# (~4x faster than json.loads on a 1024-token answer, bench/bench_vllm_client.py). Absent fields stay
# absent and explicit nulls stay None, so the parser sees what json.loads would give it.
try:
    import msgspec
    from msgspec import UNSET, Struct, UnsetType
except ImportError:  # pragma: no cover - msgspec comes with vLLM
    msgspec = None  # type: ignore[assignment]

if msgspec is not None:
    class _Entry(Struct):
        logprob: Any = UNSET
        token_id: Any = UNSET
        token: Any = UNSET

    class _Logprobs(Struct):
        content: list[_Entry] | None | UnsetType = UNSET

    class _Choice(Struct):
        token_ids: Any = UNSET
        logprobs: _Logprobs | None | UnsetType = UNSET
        finish_reason: Any = UNSET
        weight_versions: Any = UNSET
        weight_version: Any = UNSET

    class _Response(Struct):
        choices: list[_Choice] | None | UnsetType = UNSET
        usage: Any = UNSET
        weight_versions: Any = UNSET
        weight_version: Any = UNSET

    _decoder = msgspec.json.Decoder(_Response)


def decode_generate(content: str | bytes | bytearray) -> Any:
    """The JSON of a generate response as builtins; raises ValueError when it is not JSON.

    A body of the expected shape is decoded by msgspec (used fields only); anything else by
    json.loads in full, so the parser's error shows what the server really sent.
    """
    if msgspec is not None:
        try:
            return msgspec.to_builtins(_decoder.decode(content))
        except (msgspec.DecodeError, msgspec.ValidationError):
            pass
    return json.loads(content)


def _fail(engine: str | None, detail: str) -> ResponseFormatError:
    return ResponseFormatError(engine or "unknown", "generate", detail)


def _entry_token_id(entry: Mapping[str, Any], engine: str | None, pos: int) -> int:
    tid = entry.get("token_id")
    if tid is not None:
        return int(tid)
    token = entry.get("token")
    if isinstance(token, str) and token.startswith(_TOKEN_PREFIX):
        try:
            return int(token[len(_TOKEN_PREFIX):])
        except ValueError:
            pass
    raise _fail(engine, f"logprobs.content[{pos}] has neither a numeric token_id nor a "
                        f"'token_id:<id>' token (got token={token!r})")


def _token_ids_from_entries(content: Sequence[Any], engine: str | None) -> list[int]:
    try:  # fast path: every entry has a numeric token_id, or every entry a "token_id:<id>" token
        return list(map(int, map(_get_token_id, content)))
    except (KeyError, TypeError, ValueError):
        pass
    try:
        tokens = list(map(_get_token, content))
        if all(t.startswith(_TOKEN_PREFIX) for t in tokens):
            return [int(t[_PREFIX_LEN:]) for t in tokens]
    except (KeyError, TypeError, ValueError, AttributeError):
        pass
    return [_entry_token_id(e, engine, i) for i, e in enumerate(content)]  # slow path names the culprit


def _log_probs(content: Sequence[Any], engine: str | None) -> list[float]:
    try:
        out = list(map(float, map(_get_logprob, content)))  # None raises TypeError → slow path
    except (TypeError, KeyError):
        out = []
        for pos, e in enumerate(content):
            if not isinstance(e, Mapping) or "logprob" not in e:
                raise _fail(engine, f"logprobs.content[{pos}] has no 'logprob': {e!r}") from None
            v = e["logprob"]
            out.append(MISSING_LOGPROB if v is None else float(v))
    if not math.isfinite(sum(out)):  # one C-level pass; fix up only when something is off
        out = [x if math.isfinite(x) else MISSING_LOGPROB for x in out]
    return out


def parse_weight_versions(output: Mapping[str, Any]) -> list[str]:
    """Every weight version that produced part of the response, oldest first.

    A response carries either ``"weight_version": "1"`` or, when an update landed mid-request,
    ``"weight_versions"`` — a list of versions or of spans ``{"weight_version"|"version": v, ...}``.
    """
    spans = output.get("weight_versions")
    if spans is None:
        choices = output.get("choices") or [{}]
        spans = choices[0].get("weight_versions") if isinstance(choices[0], Mapping) else None
    if spans:
        versions = []
        for span in spans:
            if isinstance(span, Mapping):
                v = span.get("weight_version", span.get("version"))
            else:
                v = span
            if v is not None:
                versions.append(str(v))
        return versions
    single = output.get("weight_version")
    if single is None:
        choices = output.get("choices") or [{}]
        single = choices[0].get("weight_version") if isinstance(choices[0], Mapping) else None
    return [] if single is None else [str(single)]


def parse_generate_response(output: Mapping[str, Any] | str | bytes, *, engine: str | None = None,
                            require_logprobs: bool = True) -> GenerateResult:
    """Tokens, log-probs and meta of the first choice of a generate response (seed step 25).

    Token ids come from ``choices[0].token_ids``, or, when absent, from each logprob entry's
    numeric ``token_id`` or ``"token": "token_id:<id>"``. Log-probs are zipped with the tokens
    by position; unequal lengths, or entry ids that contradict ``token_ids``, raise
    `ResponseFormatError` (never silently truncated). Usage may lack details
    (``cached_tokens`` then 0). With several weight versions the last one is reported
    (`parse_weight_versions` gives them all). With ``require_logprobs=False`` a response
    without logprobs gets `MISSING_LOGPROB` for every token.
    """
    if isinstance(output, (str, bytes, bytearray)):
        try:
            output = decode_generate(output)
        except ValueError as exc:
            raise _fail(engine, f"response is not JSON: {exc}") from None
    if not isinstance(output, Mapping):
        raise _fail(engine, f"response is a {type(output).__name__}, not a JSON object")
    choices = output.get("choices")
    if not choices or not isinstance(choices, list) or not isinstance(choices[0], Mapping):
        raise _fail(engine, f"response has no choices: keys {sorted(output)}")
    choice = choices[0]

    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, Mapping) else None
    token_ids = choice.get("token_ids")
    if token_ids is None:
        if content is None:
            raise _fail(engine, "choice has neither token_ids nor logprobs.content")
        token_ids = _token_ids_from_entries(content, engine)
    elif content and isinstance(content[0], Mapping) and "token_id" in content[0]:
        # numeric ids are cheap to cross-check; a mismatch means tokens and log-probs are misaligned
        try:
            ids = list(map(_get_token_id, content))
        except (KeyError, TypeError):
            ids = [e.get("token_id") if isinstance(e, Mapping) else None for e in content]
        if len(ids) == len(token_ids) and ids != list(token_ids):
            pos = next(i for i, (a, b) in enumerate(zip(ids, token_ids, strict=True)) if a != b)
            raise _fail(engine, f"logprobs.content[{pos}].token_id {ids[pos]} differs from token_ids[{pos}] "
                                f"{token_ids[pos]}")
    if content is None:
        if require_logprobs and token_ids:
            raise _fail(engine, f"{len(token_ids)} tokens but no logprobs.content; request logprobs ≥ 1")
        log_probs = [MISSING_LOGPROB] * len(token_ids)
    else:
        log_probs = _log_probs(content, engine)
    if len(log_probs) != len(token_ids):
        raise _fail(engine, f"{len(token_ids)} token_ids but {len(log_probs)} logprobs.content entries; "
                            f"they are zipped by position and must be of equal length")

    reason = choice.get("finish_reason")
    if isinstance(reason, Mapping):
        reason = reason.get("type")
    if reason is None:
        finish: FinishReason = "stop"
    elif reason in _FINISH:
        finish = _FINISH[reason]
    else:
        raise _fail(engine, f"unknown finish_reason {reason!r} (expected stop, length, abort or error)")

    usage = output.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    cached = details.get("cached_tokens")
    if cached is None:
        cached = usage.get("cached_tokens", 0)
    completion = usage.get("completion_tokens")
    versions = parse_weight_versions(output)
    try:
        ids = list(map(int, token_ids))
    except (TypeError, ValueError):
        raise _fail(engine, f"token_ids must be integers, got {token_ids[:8]!r}...") from None
    return GenerateResult(
        token_ids=ids,
        log_probs=log_probs,
        finish_reason=finish,
        prompt_tokens=int(usage.get("prompt_tokens") or 0),
        completion_tokens=int(len(token_ids) if completion is None else completion),
        cached_tokens=int(cached or 0),
        weight_version=versions[-1] if versions else None,
        engine=engine,
    )
