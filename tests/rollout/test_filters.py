"""Dynamic sampling filters (seed step 27) and the dotted-path loader."""

from __future__ import annotations

import pytest

from vime.errors import ConfigError
from vime.rollout.filters import (
    DynamicFilterOutput,
    call_dynamic_filter,
    check_reward_nonzero_std,
    load_function,
)
from vime.types import Sample


def group(rewards):
    return [Sample(index=i, reward=r) for i, r in enumerate(rewards)]


def test_nonzero_std_keeps_mixed_groups_and_drops_uniform_ones():
    assert check_reward_nonzero_std(None, group([1, 0, 0, 1, 1, 0, 1, 0])).keep
    out = check_reward_nonzero_std(None, group([1] * 8))
    assert not out.keep and out.reason == "zero_std_1"
    assert not check_reward_nonzero_std(None, group([0.0] * 8)).keep
    assert check_reward_nonzero_std(None, group([{"reward": 1.0}, {"reward": 0.0}])).keep
    with pytest.raises(ConfigError, match="no reward"):
        check_reward_nonzero_std(None, group([None, 1]))


def test_load_function_resolves_short_and_slime_names():
    assert load_function("check_reward_nonzero_std") is check_reward_nonzero_std
    slime = "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std"
    assert load_function(slime) is check_reward_nonzero_std
    assert load_function("vime.rollout.filters:check_reward_nonzero_std") is check_reward_nonzero_std
    with pytest.raises(ConfigError, match="--flag 'nodots'"):
        load_function("nodots", flag="--flag")
    with pytest.raises(ConfigError, match="cannot import module"):
        load_function("no.such.module.fn")
    with pytest.raises(ConfigError, match="not callable"):
        load_function("vime.rollout.filters.annotations")


def test_call_dynamic_filter_normalises_results():
    g = group([1, 0])
    assert call_dynamic_filter(None, g) == DynamicFilterOutput(True)
    assert call_dynamic_filter(lambda s: False, g) == DynamicFilterOutput(False, "filtered")
    with pytest.raises(TypeError, match="return a bool"):
        call_dynamic_filter(lambda s: 3, g)
