"""The reward hub (seed step 26): rule-based rewards, the simulator's reward, a remote RM over HTTP, custom paths."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from rollout_fakes import FakeRouter

from vime.config import defaults
from vime.errors import ConfigError
from vime.rollout.plugins import load_plugins
from vime.rollout.rm_hub import (
    RewardError,
    RewardHub,
    extract_answer,
    math_reward,
    sim_reward,
    token_reward,
)
from vime.runs.loop import build_rollout
from vime.types import Sample


def sample(response="", label=None, tokens=(1, 2), response_tokens=(), index=0, group_index=0):
    s = Sample(group_index=group_index, index=index, label=label, tokens=list(tokens))
    s.append_response_tokens(list(response_tokens), [0.0] * len(response_tokens), text=response)
    return s


@pytest.mark.parametrize("text, label, reward", [
    ("so the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{x^{2}} done", "x^{2}", 1.0),
    ("The answer is 42.", "42", 1.0),
    ("I think 3, then 4", "4", 1.0),
    ("\\boxed{7}", "8", 0.0),
    ("no number here", "8", 0.0),
    ("total: 1,000", "1000", 1.0),
])
def test_math_reward(text, label, reward):
    assert math_reward(text, label) == reward


def test_extract_answer_takes_the_last_boxed_with_nested_braces():
    assert extract_answer("\\boxed{1} then \\boxed{\\frac{a}{b}}") == "\\frac{a}{b}"


def test_token_reward_for_tiny_random_models():
    assert token_reward([5, 9, 11], [11, 12]) == 1.0
    assert token_reward([5, 9], 7) == 0.0
    with pytest.raises(ConfigError, match="label"):
        token_reward([1], None)


def test_sim_reward_is_seeded_and_leaves_some_groups_uniform():
    groups = [[sim_reward(1, g, g * 8 + k) for k in range(8)] for g in range(400)]
    assert groups == [[sim_reward(1, g, g * 8 + k) for k in range(8)] for g in range(400)]
    uniform = sum(len(set(g)) == 1 for g in groups) / len(groups)
    assert 0.12 < uniform < 0.35  # 2/9 in expectation
    assert groups != [[sim_reward(2, g, g * 8 + k) for k in range(8)] for g in range(400)]


def test_hub_dispatch_exact_math_token():
    args = defaults("train")
    assert asyncio.run(RewardHub(args.data, seed=args.seed, rm_type="exact").score(sample(" yes ", "yes"))) == 1.0
    assert asyncio.run(RewardHub(args.data, seed=args.seed).score(sample("\\boxed{3}", "3"))) == 1.0  # math by default
    assert asyncio.run(RewardHub(args.data, seed=args.seed, rm_type="token").score(sample(label=[4], response_tokens=[3, 4]))) == 1.0
    with pytest.raises(ConfigError, match="--rm-type"):
        RewardHub(args.data, seed=args.seed, rm_type="nope")
    with pytest.raises(ConfigError, match="--rm-url"):
        RewardHub(args.data, seed=args.seed, rm_type="remote")


def test_text_rewards_decode_with_the_tokenizer_when_no_text():
    class Tok:
        def decode(self, ids, skip_special_tokens=False):
            return "answer is " + "".join(str(i) for i in ids)

    hub = RewardHub(defaults("train").data, seed=defaults("train").seed, rm_type="math", tokenizer=Tok())
    assert asyncio.run(hub.score(sample(label="12", response_tokens=[1, 2]))) == 1.0
    with pytest.raises(ConfigError, match="tokenizer"):
        asyncio.run(RewardHub(defaults("train").data, seed=defaults("train").seed, rm_type="math").score(sample(label="1", response_tokens=[1])))


def test_remote_reward_model_over_http():
    seen = []
    failures = iter([True, False])

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append(body)
        if next(failures, False):
            return httpx.Response(503, text="warming up")
        return httpx.Response(200, json={"reward": 0.25 if body["label"] == "L" else 0.0})

    hub = RewardHub(defaults("train").data, seed=defaults("train").seed, rm_type="remote", url="http://rm/score", transport=httpx.MockTransport(handler))

    async def go():
        try:
            return await hub.score(sample("resp", "L"))
        finally:
            await hub.aclose()

    assert asyncio.run(go()) == 0.25
    assert len(seen) == 2 and seen[1]["response"] == "resp" and seen[1]["label"] == "L"


def test_remote_reward_model_failure_is_a_clear_error():
    hub = RewardHub(defaults("train").data, seed=defaults("train").seed, rm_type="remote", url="http://rm/score", max_attempts=2,
                    transport=httpx.MockTransport(lambda r: httpx.Response(500, text="boom")))
    with pytest.raises(RewardError, match="http://rm/score failed 2 times; last: HTTP 500: boom"):
        asyncio.run(hub.score(sample("r", "l")))
    bad = RewardHub(defaults("train").data, seed=defaults("train").seed, rm_type="remote", url="http://rm/score",
                    transport=httpx.MockTransport(lambda r: httpx.Response(200, json={"x": 1})))
    with pytest.raises(RewardError, match="expected a number"):
        asyncio.run(bad.score(sample("r", "l")))


def length_reward(args, s):
    assert args.custom_rm_path == "test_rm_hub.length_reward"  # slime's signature: the run's options first
    return float(s.response_length)


def test_custom_reward_by_dotted_path():
    args = defaults("train").replace(custom_rm_path="test_rm_hub.length_reward")
    hub = build_rollout(args, FakeRouter(), num_engines=1).reward
    assert hub.name == "custom"
    assert asyncio.run(hub.score(sample(response_tokens=[1, 2, 3]))) == 3.0
    args = defaults("train").replace(custom_rm_path="test_rm_hub.missing")
    with pytest.raises(ConfigError, match="--custom-rm-path .*no attribute 'missing'"):
        load_plugins(args)
