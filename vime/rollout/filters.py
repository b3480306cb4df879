"""Dynamic sampling filters (seed step 27) and the dotted-path loader shared by the rollout's plug-ins.

A dynamic filter looks at one finished group and decides whether it reaches training. A dropped
group makes the rollout fetch a new prompt (refill). The filter is named on the command line by
a dotted path (``--dynamic-sampling-filter-path``); ``check_reward_nonzero_std`` is built in and
is also found under its slime name, so existing launch scripts keep working.
"""

from __future__ import annotations

import importlib
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vime.errors import ConfigError

#: Short and foreign names that resolve to the built-in filters.
_ALIASES = {
    "check_reward_nonzero_std": "vime.rollout.filters.check_reward_nonzero_std",
    "slime.rollout.filter_hub.dynamic_sampling_filters.check_reward_nonzero_std":
        "vime.rollout.filters.check_reward_nonzero_std",
}


def load_function(path: str, *, flag: str = "") -> Callable[..., Any]:
    """Import ``package.module.function`` (or ``package.module:function``) and return the callable.

    Raises ConfigError naming the flag, the path and what went wrong, never a bare ImportError.
    """
    where = f"{flag} {path!r}" if flag else repr(path)
    path = _ALIASES.get(path, path)
    if ":" in path:
        module_name, _, attr = path.partition(":")
    else:
        module_name, _, attr = path.rpartition(".")
    if not module_name or not attr:
        raise ConfigError(f"{where} is not a dotted path; write it as package.module.function")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{where}: cannot import module {module_name!r} ({exc}); check the path and "
                          f"that the module is on PYTHONPATH") from exc
    fn = getattr(module, attr, None)
    if fn is None:
        raise ConfigError(f"{where}: module {module_name!r} has no attribute {attr!r}")
    if not callable(fn):
        raise ConfigError(f"{where}: {attr!r} in {module_name!r} is not callable")
    return fn


@dataclass(frozen=True)
class DynamicFilterOutput:
    """A filter's verdict on one group: keep it or drop it, and why (counted in rollout stats)."""

    keep: bool
    reason: str | None = None


def check_reward_nonzero_std(args: Any, samples: Sequence[Any], **kwargs: Any) -> DynamicFilterOutput:
    """Keep a group only if its rewards are not all equal (seed step 27).

    An all-equal group has zero advantage after group normalisation (seed step 30), so it adds no
    gradient; dropping it and sampling another prompt makes the batch informative.
    """
    key = getattr(args, "reward_key", None)  # slime's filters read --reward-key from the args they get
    rewards = [_scalar_reward(s, key) for s in samples]
    if len(rewards) > 1 and statistics.pstdev(rewards) > 0.0:
        return DynamicFilterOutput(True)
    mean = rewards[0] if rewards else 0.0
    return DynamicFilterOutput(False, f"zero_std_{mean:g}")


def _scalar_reward(sample: Any, key: str | None) -> float:
    reward = sample.reward
    if reward is None:
        raise ConfigError(f"sample {getattr(sample, 'index', '?')} has no reward when the dynamic filter "
                          f"runs; rewards must be computed before filtering (seed step 26)")
    if isinstance(reward, dict):
        # multi-key rewards: the --reward-key score, else "reward", else the first (as the batch builder)
        reward = reward[key] if key in reward else reward.get("reward", next(iter(reward.values())))
    return float(reward)


def call_dynamic_filter(fn: Callable[[Sequence[Any]], Any] | None, group: Sequence[Any]) -> DynamicFilterOutput:
    """Run a filter (its options already bound, `vime.rollout.plugins`) and normalise what it returns
    (a bool or a DynamicFilterOutput)."""
    if fn is None:
        return DynamicFilterOutput(True)
    out = fn(group)
    if isinstance(out, DynamicFilterOutput):
        return out
    if isinstance(out, bool):
        return DynamicFilterOutput(out, None if out else "filtered")
    keep = getattr(out, "keep", None)
    if isinstance(keep, bool):  # a look-alike from a user module
        return DynamicFilterOutput(keep, getattr(out, "reason", None))
    raise TypeError(f"dynamic filter {getattr(fn, '__qualname__', fn)!r} returned {type(out).__name__}; "
                    f"return a bool or a DynamicFilterOutput(keep, reason)")
