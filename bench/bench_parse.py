"""Speed of parsing a generate response: a 1024-token response must parse well under 1 ms (seed step 25)."""

from __future__ import annotations

import json
import random
from typing import Any

from vime.real.vllm.response import parse_generate_response


def make_response(n: int, *, token_strings: bool = False) -> dict[str, Any]:
    rng = random.Random(0)
    ids = [rng.randrange(151_000) for _ in range(n)]
    content = []
    for t in ids:
        lp = -rng.random() * 3
        entry: dict[str, Any] = {"logprob": lp, "top_logprobs": [{"token": f"token_id:{t}", "logprob": lp}]}
        if token_strings:
            entry["token"] = f"token_id:{t}"
        else:
            entry["token_id"] = t
        content.append(entry)
    choice: dict[str, Any] = {"index": 0, "logprobs": {"content": content}, "finish_reason": "length"}
    if not token_strings:
        choice["token_ids"] = ids
    return {"request_id": "r", "model": "m", "choices": [choice],
            "usage": {"prompt_tokens": 200, "completion_tokens": n, "total_tokens": 200 + n,
                      "prompt_tokens_details": {"cached_tokens": 64}},
            "weight_version": "1"}


def test_parse_1024_tokens_dict(benchmark) -> None:  # type: ignore[no-untyped-def]
    resp = make_response(1024)
    result = benchmark(parse_generate_response, resp)
    assert len(result.token_ids) == 1024


def test_parse_1024_tokens_token_strings(benchmark) -> None:  # type: ignore[no-untyped-def]
    resp = make_response(1024, token_strings=True)
    result = benchmark(parse_generate_response, resp)
    assert len(result.token_ids) == 1024


def test_parse_1024_tokens_from_json_bytes(benchmark) -> None:  # type: ignore[no-untyped-def]
    raw = json.dumps(make_response(1024)).encode()
    result = benchmark(parse_generate_response, raw)
    assert len(result.log_probs) == 1024
