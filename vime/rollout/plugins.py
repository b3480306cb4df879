"""The user functions a run's flags name, loaded once and bound to the run's options.

slime's convention, kept so existing functions run unchanged: a custom reward is called as
``fn(args, sample)`` (``fn(args, samples)`` with ``--group-rm``) and a dynamic filter as
``fn(args, group)``, `args` being the run's whole configuration. The rollout components never see
that object: they get these functions with it already bound, and read only their own config groups.
A custom generate function has vime's signature ``async fn(rollout, sample, sampling_params)``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vime.rollout.filters import load_function


@dataclass(frozen=True)
class Plugins:
    """What ``--custom-rm-path``, ``--dynamic-sampling-filter-path`` and ``--custom-generate-function-path`` name."""

    reward: Callable[[Any], Any] | None = None
    dynamic_filter: Callable[[Any], Any] | None = None
    generate: Callable[..., Any] | None = None


def load_plugins(args: Any) -> Plugins:
    """Import the named functions (a ConfigError names the flag if one cannot be loaded) and bind `args`."""

    def bound(path: str | None, flag: str) -> Callable[[Any], Any] | None:
        return functools.partial(load_function(path, flag=flag), args) if path else None

    gpath = args.custom_generate_function_path
    return Plugins(reward=bound(args.custom_rm_path, "--custom-rm-path"),
                   dynamic_filter=bound(args.dynamic_sampling_filter_path, "--dynamic-sampling-filter-path"),
                   generate=load_function(gpath, flag="--custom-generate-function-path") if gpath else None)
