"""Sampling-parameter translation to vLLM names (seed step 19)."""

from __future__ import annotations

import pytest

from vime.algo.sampling import (
    build_inference_sampling_params,
    default_sampling_params,
    logprobs_count,
    sampling_params_for_sample,
)
from vime.config import parse_args
from vime.types import Sample, SampleStatus

SEED_BASE = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 1024, "stop": None,
             "stop_token_ids": None, "skip_special_tokens": False, "no_stop_trim": True,
             "spaces_between_special_tokens": False}
SEED_VLLM = {"max_tokens": 1024, "temperature": 1.0, "top_p": 1.0, "logprobs": 1, "top_k": -1,
             "skip_special_tokens": False, "spaces_between_special_tokens": False}


def test_seed_base_params_from_args() -> None:
    assert default_sampling_params(parse_args([], command="train").rollout) == SEED_BASE


def test_seed_translation_exactly() -> None:
    args = parse_args([], command="train")
    sample = Sample(index=0, tokens=list(range(200)))  # a new 200-token prompt
    sp = sampling_params_for_sample(sample, default_sampling_params(args.rollout), logprobs_count(args.rollout))
    assert sp == SEED_VLLM
    assert list(sp) == list(SEED_VLLM)  # same keys in the seed's order
    assert sp["max_tokens"] == 1024  # 1024 - response_length 0
    assert len(sample.tokens) + sp["max_tokens"] <= args.rollout_max_context_len  # 1224 ≤ 4096
    assert sample.status is SampleStatus.PENDING


def test_budget_shrinks_with_existing_response_and_truncates_at_zero() -> None:
    sample = Sample(tokens=list(range(10)))
    sample.append_response_tokens(list(range(1000)), [-0.1] * 1000)
    sp = sampling_params_for_sample(sample, SEED_BASE)
    assert sp is not None and sp["max_tokens"] == 24
    sample.append_response_tokens(list(range(24)), [-0.1] * 24)
    assert sampling_params_for_sample(sample, SEED_BASE) is None
    assert sample.status is SampleStatus.TRUNCATED
    sample.append_response_tokens([1], [-0.1])
    with pytest.raises(ValueError, match="more than max_new_tokens"):
        sampling_params_for_sample(sample, SEED_BASE)


@pytest.mark.parametrize(("top_k", "written"), [(-1, True), (0, False), (20, True), (None, False)])
def test_top_k_written_when_positive_or_minus_one(top_k: int | None, written: bool) -> None:
    sp = build_inference_sampling_params({**SEED_BASE, "top_k": top_k})
    assert ("top_k" in sp) is written
    if written:
        assert sp["top_k"] == top_k


def test_stop_written_only_when_non_empty() -> None:
    assert "stop" not in build_inference_sampling_params({**SEED_BASE, "stop": []})
    sp = build_inference_sampling_params({**SEED_BASE, "stop": ["</s>"], "stop_token_ids": [151645]})
    assert sp["stop"] == ["</s>"] and sp["stop_token_ids"] == [151645]
    args = parse_args(["--rollout-stop", "</s>", "--rollout-stop-token-ids", "1", "2"], command="train")
    assert build_inference_sampling_params(default_sampling_params(args.rollout))["stop_token_ids"] == [1, 2]


def test_logprobs_count_score_centering() -> None:
    assert logprobs_count(parse_args(["--score-centering-top-k", "4"], command="train").rollout) == 1
    on = parse_args(["--use-score-centering", "--score-centering-top-k", "4"], command="train")
    assert logprobs_count(on.rollout) == 5
    top_p = parse_args(["--use-score-centering", "--score-centering-top-k", "4", "--rollout-top-p", "0.9"],
                       command="train")
    assert logprobs_count(top_p.rollout) == 1
