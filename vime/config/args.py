"""`Args`, the resolved read-only configuration, and `parse_args` / `defaults` that make it."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import fields
from typing import Any

from vime.config.lengths import LengthSpec
from vime.config.options import (
    _GROUP_ATTR,
    _INDEX,
    COMMANDS,
    GROUPS,
    AlgoConfig,
    AsyncConfig,
    ClusterConfig,
    DataConfig,
    DerivedConfig,
    EngineConfig,
    LoggingConfig,
    OutputConfig,
    ParallelConfig,
    RolloutConfig,
    SimConfig,
    TrainConfig,
    WeightSyncConfig,
)
from vime.config.parser import build_parser
from vime.config.passthrough import split_vllm_args
from vime.config.rules import resolve
from vime.errors import ConfigError


class Args:
    """The resolved, validated configuration; read-only.

    Flat attribute access uses slime's names (``args.rollout_batch_size``,
    ``args.global_batch_size``, ``args.tensor_model_parallel_size``); the groups are also
    reachable (``args.rollout``, ``args.parallel`` ...). Optional options that the seed derives
    (global_batch_size, eps_clip_high, over_sampling_batch_size, rollout_num_gpus, offloads,
    length specs) hold their resolved values. Use `replace` to get a changed, re-validated copy.
    """

    cluster: ClusterConfig
    parallel: ParallelConfig
    train: TrainConfig
    rollout: RolloutConfig
    data: DataConfig
    algo: AlgoConfig
    engine: EngineConfig
    weight_sync: WeightSyncConfig
    sim: SimConfig
    output: OutputConfig
    logging: LoggingConfig
    async_rl: AsyncConfig
    derived: DerivedConfig

    def __init__(self, groups: dict[str, Any]) -> None:
        for name, value in groups.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        group = _INDEX.get(name)
        if group is None:
            raise AttributeError(f"Args has no option {name!r}")
        return getattr(object.__getattribute__(self, group), name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Args is read-only; use args.replace({name}=...) for a changed copy")

    def __repr__(self) -> str:
        return f"Args(command={self.command!r}, {len(_INDEX)} options)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Args) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    @property
    def dp_size(self) -> int:
        return int(self.derived.data_parallel_size)

    @property
    def command(self) -> str:
        return self.derived.command

    def groups(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(title, {name: JSON-able value}) per group, derived last — for tables."""
        for cls in (*GROUPS, DerivedConfig):
            group = getattr(self, _GROUP_ATTR[cls])
            yield cls.title, {f.name: _jsonable(getattr(group, f.name)) for f in fields(group)}

    def to_dict(self) -> dict[str, Any]:
        """Every option and derived value by its slime name, JSON-able (length specs as strings)."""
        out: dict[str, Any] = {}
        for _, items in self.groups():
            out.update(items)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def replace(self, **changes: Any) -> Args:
        """A copy with some options changed, re-validated and re-derived (derived values cannot be set)."""
        raw = self._raw_options()
        for name, value in changes.items():
            if name not in _INDEX or _INDEX[name] == "derived":
                raise ConfigError(f"{name!r} cannot be set: it is derived or not an option")
            raw[name] = value
        return _make(raw, self.command)

    def _raw_options(self) -> dict[str, Any]:
        return dict(object.__getattribute__(self, "_raw"))


def _jsonable(value: Any) -> Any:
    if isinstance(value, LengthSpec):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def parse_args(argv: Sequence[str] | None = None, command: str | None = None) -> Args:
    """Parse a command line into validated `Args`; every inconsistency raises ConfigError.

    With `command` ("train" or "simulate") `argv` holds only options; without it `argv[0]` is
    the subcommand. ``argv=None`` reads ``sys.argv[1:]``.
    """
    import sys

    args_list = list(sys.argv[1:] if argv is None else argv)
    if command is not None:
        if command not in COMMANDS:
            raise ConfigError(f"unknown command {command!r}; use one of {', '.join(COMMANDS)}")
        args_list = [command, *args_list]
    parser = build_parser()
    vllm: list[str] = []
    if args_list and args_list[0] in COMMANDS:
        sub = parser._subparsers._group_actions[0].choices[args_list[0]]  # type: ignore[union-attr]
        rest, vllm = split_vllm_args(args_list[1:], sub._option_string_actions)
        args_list = [args_list[0], *rest]
    ns = parser.parse_args(args_list)
    raw = {k: v for k, v in vars(ns).items() if k != "command"}
    if vllm:
        raw["vllm_extra_args"] = tuple(vllm)
    return _make(raw, ns.command)


def defaults(command: str = "simulate") -> Args:
    """The seed scenario: `parse_args([], command)`."""
    return parse_args([], command=command)



def _make(raw: dict[str, Any], command: str) -> Args:
    """Validated, derived `Args` from the options given (`raw`)."""
    v = resolve(raw, command)
    groups: dict[str, Any] = {"derived": v["derived"]}
    for cls in GROUPS:
        groups[_GROUP_ATTR[cls]] = cls(**{f.name: v[f.name] for f in fields(cls)})
    args = Args(groups)
    object.__setattr__(args, "_raw", dict(raw))
    return args
