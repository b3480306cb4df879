"""Parsing a vLLM generate response (seed steps 24–25): `vime.real.vllm.response`."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from vime.errors import ResponseFormatError
from vime.real.vllm.response import MISSING_LOGPROB, parse_generate_response, parse_weight_versions
from vime.types import Sample

SEED_RESPONSE: dict[str, Any] = {
    "choices": [{
        "token_ids": [101, 202, 151645],
        "logprobs": {"content": [
            {"token_id": 101, "logprob": -0.42, "top_logprobs": []},
            {"token_id": 202, "logprob": -1.10, "top_logprobs": []},
            {"token_id": 151645, "logprob": -0.08, "top_logprobs": []},
        ]},
        "finish_reason": "stop",
    }],
    "usage": {"prompt_tokens": 200, "completion_tokens": 3},
    "weight_version": "1",
}


def test_seed_response() -> None:
    r = parse_generate_response(SEED_RESPONSE, engine="engine-0")
    assert r.token_ids == [101, 202, 151645]
    assert r.log_probs == [-0.42, -1.10, -0.08]
    assert r.finish_reason == "stop"
    assert r.meta_info() == {"finish_reason": {"type": "stop"}, "weight_version": "1", "prompt_tokens": 200,
                             "completion_tokens": 3, "cached_tokens": 0}
    assert r.engine == "engine-0"
    sample = Sample(tokens=list(range(200)))
    sample.append_response_tokens(r.token_ids, r.log_probs, meta_info=r.meta_info())
    assert len(sample.tokens) == 203 and sample.loss_mask == [1, 1, 1]
    assert sample.rollout_log_probs == [-0.42, -1.10, -0.08] and sample.weight_versions == ["1"]


def test_json_bytes_and_token_string_form_without_token_ids() -> None:
    resp = copy.deepcopy(SEED_RESPONSE)
    del resp["choices"][0]["token_ids"]
    resp["choices"][0]["logprobs"]["content"] = [
        {"token": "token_id:101", "logprob": -0.42}, {"token": "token_id:202", "logprob": -1.10},
        {"token": "token_id:151645", "logprob": -0.08}]
    r = parse_generate_response(json.dumps(resp).encode())
    assert r.token_ids == [101, 202, 151645] and r.log_probs == [-0.42, -1.10, -0.08]


def test_sentinel_null_and_non_finite_become_missing() -> None:
    resp = copy.deepcopy(SEED_RESPONSE)
    content = resp["choices"][0]["logprobs"]["content"]
    content[0]["logprob"] = -9999.0
    content[1]["logprob"] = None
    content[2]["logprob"] = float("-inf")
    r = parse_generate_response(resp)
    assert r.log_probs == [MISSING_LOGPROB] * 3 and MISSING_LOGPROB == -9999.0


def test_usage_details_cached_tokens_and_missing_usage() -> None:
    resp = copy.deepcopy(SEED_RESPONSE)
    resp["usage"] = {"prompt_tokens": 200, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 192}}
    assert parse_generate_response(resp).cached_tokens == 192
    resp["usage"] = {"prompt_tokens": 200, "completion_tokens": 3, "prompt_tokens_details": None}
    assert parse_generate_response(resp).cached_tokens == 0
    del resp["usage"]
    r = parse_generate_response(resp)
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens) == (0, 3, 0)


def test_weight_versions_spans() -> None:
    resp = copy.deepcopy(SEED_RESPONSE)
    del resp["weight_version"]
    resp["weight_versions"] = [{"weight_version": "1", "start": 0, "end": 2}, {"version": 2, "start": 2, "end": 3}]
    assert parse_weight_versions(resp) == ["1", "2"]
    assert parse_generate_response(resp).weight_version == "2"
    resp["weight_versions"] = ["3", "4"]
    assert parse_generate_response(resp).weight_version == "4"
    del resp["weight_versions"]
    assert parse_generate_response(resp).weight_version is None


@pytest.mark.parametrize(("reason", "expected"), [("length", "length"), ({"type": "abort"}, "abort"),
                                                  ("cancelled", "abort"), ("error", "error"), (None, "stop")])
def test_finish_reasons(reason: Any, expected: str) -> None:
    resp = copy.deepcopy(SEED_RESPONSE)
    resp["choices"][0]["finish_reason"] = reason
    assert parse_generate_response(resp).finish_reason == expected


def test_abort_with_no_tokens() -> None:
    resp = {"choices": [{"token_ids": [], "logprobs": {"content": []}, "finish_reason": "abort"}],
            "usage": {"prompt_tokens": 200, "completion_tokens": 0}}
    r = parse_generate_response(resp)
    assert r.token_ids == [] and r.log_probs == [] and r.finish_reason == "abort"


def mutate(fn) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    resp = copy.deepcopy(SEED_RESPONSE)
    fn(resp)
    return resp


@pytest.mark.parametrize(("resp", "fragment"), [
    (mutate(lambda r: r["choices"][0]["logprobs"]["content"].pop()), "3 token_ids but 2 logprobs"),
    (mutate(lambda r: r["choices"][0]["token_ids"].pop()), "2 token_ids but 3 logprobs"),
    (mutate(lambda r: r["choices"][0].update(logprobs=None)), "no logprobs.content"),
    (mutate(lambda r: r["choices"][0]["logprobs"]["content"][1].update(token_id=999)), "differs from token_ids[1]"),
    (mutate(lambda r: r["choices"][0].update(finish_reason="tool_calls")), "unknown finish_reason"),
    (mutate(lambda r: r["choices"][0]["logprobs"]["content"][0].pop("logprob")), "has no 'logprob'"),
    (mutate(lambda r: r.update(choices=[])), "no choices"),
    (b"{not json", "not JSON"),
    ([1, 2], "not a JSON object"),
])
def test_malformed_responses(resp: Any, fragment: str) -> None:
    with pytest.raises(ResponseFormatError) as info:
        parse_generate_response(resp, engine="e1")
    assert fragment in str(info.value) and "engine e1" in str(info.value)


def test_bad_token_string_and_optional_logprobs() -> None:
    resp = {"choices": [{"logprobs": {"content": [{"token": "hello", "logprob": -1.0}]}, "finish_reason": "stop"}]}
    with pytest.raises(ResponseFormatError, match="token_id:<id>"):
        parse_generate_response(resp)
    bare = {"choices": [{"token_ids": [5, 6], "finish_reason": "length"}]}
    r = parse_generate_response(bare, require_logprobs=False)
    assert r.log_probs == [MISSING_LOGPROB, MISSING_LOGPROB]
