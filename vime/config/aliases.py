"""slime's spellings of vime options: extra flags that set the same option, so a slime command line parses unchanged."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

#: slime's `--update-weight-transport` carrier → vime's --update-weight-mode (nccl: slime's in-memory path,
#: which vime sends as tensor buckets: CUDA IPC to colocated engines)
_TRANSPORT = {"nccl": "tensor", "disk": "disk"}


class _StoreMapped(argparse.Action):
    """Stores ``mapping[value]`` in `dest` (slime's word for a value → vime's)."""

    def __init__(self, option_strings: Sequence[str], dest: str, mapping: dict[str, str], **kwargs: Any) -> None:
        self.mapping = mapping
        super().__init__(option_strings, dest, choices=tuple(mapping), **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        setattr(namespace, self.dest, self.mapping[values])


class _StoreTrueBoth(argparse.Action):
    """slime's ``--offload``: ``--offload-train --offload-rollout`` in one flag."""

    def __init__(self, option_strings: Sequence[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: str | None = None) -> None:
        namespace.offload_train = True
        namespace.offload_rollout = True


@dataclass(frozen=True)
class Alias:
    """One slime flag: the vime option (`dest`) it sets, and the vime command line it equals (`same_as`)."""

    flag: str
    dest: str
    same_as: tuple[str, ...]  # for a value flag the value is appended: ("--update-weight-dir",)
    kwargs: tuple[tuple[str, Any], ...] = ()
    example: str | None = None  # a value to test the alias with (None: a switch)
    note: str = ""  # how slime's values map to vime's, for --help


#: slime's names where they differ from vime's (checked against THUDM/slime's slime/utils/arguments.py).
#: A plain rename is an extra option string of the vime flag itself (`RENAMES`); these need their own action.
ALIASES: tuple[Alias, ...] = (
    Alias("--disable-grpo-std-normalization", "grpo_std_normalization", ("--no-grpo-std-normalization",),
          (("action", "store_false"),)),
    Alias("--offload", "offload_train", ("--offload-train", "--offload-rollout"), (("action", _StoreTrueBoth),)),
    Alias("--update-weight-transport", "update_weight_mode", ("--update-weight-mode",),
          (("action", _StoreMapped), ("mapping", _TRANSPORT), ("metavar", "{nccl,disk}")), example="disk",
          note=" (nccl → tensor)"),
)

#: vime flag → slime's other spelling of it (same values, same help line)
RENAMES: dict[str, str] = {
    "--update-weight-dir": "--update-weight-disk-dir",
    "--tensorboard-dir": "--tb-project-name",
}


def add_aliases(parser: argparse.ArgumentParser, dests: set[str]) -> None:
    """slime's flags on `parser` (those whose option the command has)."""
    grp = parser.add_argument_group("slime spellings", "slime's names for the options above (same effect)")
    for a in ALIASES:
        if a.dest not in dests:
            continue
        kw = dict(a.kwargs)
        kw["help"] = f"= {' '.join(a.same_as)}{a.note}"
        grp.add_argument(a.flag, dest=a.dest, default=argparse.SUPPRESS, **kw)
