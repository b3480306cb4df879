"""The `vime` argparse parser, built from the option declarations (subcommands train and simulate)."""

from __future__ import annotations

import argparse
from dataclasses import fields
from typing import Any

from vime.config.aliases import RENAMES, add_aliases
from vime.config.options import GROUPS, _flag
from vime.errors import ConfigError


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of exiting, so library callers get an exception."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def _add_options(parser: argparse.ArgumentParser, command: str) -> None:
    dests: set[str] = set()
    for group_cls in GROUPS:
        doc = (group_cls.__doc__ or "").strip().splitlines()[0]
        grp = parser.add_argument_group(group_cls.title, doc)
        for f in fields(group_cls):
            meta = f.metadata["cli"]
            if command not in meta["commands"]:
                continue
            kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": meta["help"]}
            if f.type in ("bool", "bool | None"):
                kw["action"] = argparse.BooleanOptionalAction if meta["negatable"] else "store_true"
                if f.default is not None:
                    kw["help"] += f" (default: {'on' if f.default else 'off'})"
            else:
                if meta["type"] is not None:
                    kw["type"] = meta["type"]
                if meta["choices"]:
                    kw["choices"] = meta["choices"]
                if meta["nargs"]:
                    kw["nargs"] = meta["nargs"]
                if meta["action"]:
                    kw["action"] = meta["action"]
                metavar = meta["metavar"] or {int: "N", float: "X"}.get(meta["type"])
                if metavar:
                    kw["metavar"] = metavar
                if f.default is not None and not isinstance(f.default, bool):
                    kw["help"] += f" (default: {f.default})"
            flag = _flag(f)
            grp.add_argument(*[flag, *([RENAMES[flag]] if flag in RENAMES else [])], **kw)
            dests.add(f.name)
    add_aliases(parser, dests)


def build_parser() -> argparse.ArgumentParser:
    """The `vime` parser: subcommands `train` and `simulate`, built from the same option declarations."""
    # no prefix matching (`--micro 4`), as Megatron and slime: an abbreviation breaks when a flag is added
    parser = _Parser(prog="vime", allow_abbrev=False, description="RL post-training on real GPUs (train) or in a "
                                              "simulator of GPU memory and timing (simulate).")
    sub = parser.add_subparsers(dest="command", metavar="{train,simulate}", required=True)
    for command, help_ in (("train", "run RL training (real GPUs, or --backend sim)"),
                           ("simulate", "simulate the RL step: time per phase, memory per GPU, OOM")):
        epilog = ("vLLM server flags: --vllm-<flag> [VALUE ...] is passed to every `vllm serve` as --<flag> [VALUE ...] "
                  "(--backend real; the flags vime sets itself are refused)") if command == "train" else None
        p = sub.add_parser(command, help=help_, description=help_, allow_abbrev=False, epilog=epilog)
        _add_options(p, command)
    return parser

