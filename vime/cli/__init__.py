"""The `vime` command: `vime train` and `vime simulate` (one parser, lazy dispatch to the commands, which only parse and
print), and `vime compare` (measured runs against their simulation; its own small parser, `vime.cli.compare`)."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Sequence

from vime.config import Args, build_parser, parse_args
from vime.errors import ConfigError, VimeError

#: command -> (module, function). The runner takes the resolved Args and returns an exit code.
#: Modules are imported only when the command runs, so `vime simulate` never imports the real
#: backends and `--dry-run` imports nothing beyond the config.
RUNNERS: dict[str, tuple[str, str]] = {
    "simulate": ("vime.cli.simulate", "run_simulate"),
    "train": ("vime.cli.train", "run_train"),
}

EXIT_USAGE = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report it


def format_table(args: Args) -> str:
    """The resolved configuration as a human table: one section per option group, derived last."""
    lines = [f"vime {args.command}: resolved configuration"]
    width = max(len(name) for _, items in args.groups() for name in items)
    for title, items in args.groups():
        lines.append("")
        lines.append(f"[{title}]")
        for name, value in items.items():
            shown = "-" if value is None else value
            lines.append(f"  {name:<{width}}  {shown}")
    return "\n".join(lines)


def placement_of(args: Args) -> tuple[list[str], dict[str, object]]:
    """The placement `args` would use (`vime.placement`), as table lines and as JSON; a layout the
    real backend cannot place (only `vime simulate` accepts it) says why instead."""
    from vime.placement import plan_placement

    try:
        plan = plan_placement(args.cluster, use_gpus=True)
    except ConfigError as exc:
        return [f"placement: none on real nodes ({exc})"], {"error": str(exc)}
    return plan.describe(), plan.to_dict()


def _load_runner(command: str) -> Callable[[Args], int] | None:
    module_name, func_name = RUNNERS[command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:  # the runner is not written yet; other import failures propagate
            return None
        raise
    runner: Callable[[Args], int] = getattr(module, func_name)
    return runner


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `vime` console script; returns the exit code (2 for configuration errors)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        build_parser().print_help()
        from vime.cli.compare import USAGE

        print(f"\nand: {USAGE}\n  measured runs beside their simulation, per phase (see `vime compare --help`)")
        return 0 if argv else EXIT_USAGE
    if argv[0] == "compare":  # reads documents, not the training configuration: its own parser
        return _compare(argv[1:])
    try:
        args = parse_args(argv)
    except ConfigError as exc:
        print(f"vime: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.dry_run:
        lines, placement = placement_of(args)
        if args.json:
            print(json.dumps({**args.to_dict(), "placement": placement}, indent=2))
        else:
            print(format_table(args) + "\n\n" + "\n".join(lines))
        return 0
    runner = _load_runner(args.command)
    if runner is None:
        print(f"vime {args.command}: not implemented yet (use --dry-run to see the resolved configuration)",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        return int(runner(args) or 0)
    except KeyboardInterrupt:
        # the runners tear down what they started on the way out; no traceback for a Ctrl-C
        print(f"vime {args.command}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except ConfigError as exc:
        print(f"vime: configuration error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except VimeError as exc:
        print(f"vime {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1


def _compare(argv: list[str]) -> int:
    """`vime compare`: exit 0 consistent, 1 problems found, 2 bad input."""
    from vime.cli.compare import run_compare

    try:
        return run_compare(argv)
    except SystemExit as exc:  # --help
        return int(exc.code or 0)
    except ConfigError as exc:
        print(f"vime: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except VimeError as exc:
        print(f"vime compare: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
