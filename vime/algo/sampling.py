"""Sampling parameters: vime's rollout names → vLLM's /inference/v1/generate names (seed step 19)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from vime.types import Sample, SampleStatus

if TYPE_CHECKING:
    from vime.config import RolloutConfig


def default_sampling_params(cfg: RolloutConfig) -> dict[str, Any]:
    """The rollout's base sampling params from the options (GenerateState.sampling_params, seed step 19)."""
    return {
        "temperature": cfg.rollout_temperature,
        "top_p": cfg.rollout_top_p,
        "top_k": cfg.rollout_top_k,
        "max_new_tokens": cfg.rollout_max_response_len,
        "stop": cfg.rollout_stop,
        "stop_token_ids": cfg.rollout_stop_token_ids,
        "skip_special_tokens": cfg.rollout_skip_special_tokens,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }


def logprobs_count(cfg: RolloutConfig) -> int:
    """Log-probs per position to request: top-k + 1 for score centering with top_p 1, else 1 (seed step 19)."""
    if cfg.use_score_centering and cfg.rollout_top_p == 1:
        return int(cfg.score_centering_top_k) + 1
    return 1


def build_inference_sampling_params(sampling_params: Mapping[str, Any], logprobs: int = 1) -> dict[str, Any]:
    """Translate to vLLM names (seed step 19).

    ``max_new_tokens`` → ``max_tokens``; ``top_k`` is written only when > 0 or == −1 (0 is
    omitted); ``stop`` / ``stop_token_ids`` only when non-empty; ``no_stop_trim`` has no vLLM
    counterpart and is dropped.
    """
    sp: dict[str, Any] = {
        "max_tokens": sampling_params["max_new_tokens"],
        "temperature": sampling_params["temperature"],
        "top_p": sampling_params["top_p"],
        "logprobs": logprobs,
    }
    top_k = sampling_params.get("top_k")
    if top_k is not None and (top_k > 0 or top_k == -1):
        sp["top_k"] = top_k
    for key in ("stop", "stop_token_ids"):
        if sampling_params.get(key):
            sp[key] = list(sampling_params[key])
    for key in ("skip_special_tokens", "spaces_between_special_tokens"):
        if key in sampling_params:
            sp[key] = sampling_params[key]
    return sp


def sampling_params_for_sample(sample: Sample, sampling_params: Mapping[str, Any],
                               logprobs: int = 1) -> dict[str, Any] | None:
    """The vLLM sampling params for one sample, or None when it has no token budget left.

    The budget is ``max_new_tokens − sample.response_length`` (1024 for a new sample of the
    seed). At 0 the sample is marked TRUNCATED and nothing should be sent (seed step 19).
    """
    params = dict(sampling_params)
    params["max_new_tokens"] = int(params["max_new_tokens"]) - sample.response_length
    if params["max_new_tokens"] < 0:
        raise ValueError(f"sample {sample.index} already has {sample.response_length} response tokens, "
                         f"more than max_new_tokens {sampling_params['max_new_tokens']}")
    if params["max_new_tokens"] == 0:
        sample.status = SampleStatus.TRUNCATED
        return None
    return build_inference_sampling_params(params, logprobs)
