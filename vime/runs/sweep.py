"""Sweeps and searches for `vime simulate`: many configurations simulated in parallel, ranked by T_step.

`--sweep FLAG=V1,V2` (repeatable) simulates the cross product; `--search fastest|fewest-gpus|cheapest`
explores the axes of `vime.runs.search` (GPU count, TP, PP, GPUs per engine, micro-batch size, memory
utilisation), pruning what cannot fit or cannot win before simulating, and prints the
winning `vime train` command line (`train_command`: real-run flags only, a named placeholder where a
path is needed). Every result carries its cost: GPU-seconds per step and per 1000 samples. Points run in local processes (all cores by default) or as
Ray tasks on a cluster given by `--ray-address`. Results are ordered by a stable key, so the same
inputs print the same table whatever finished first.
"""


from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any

from vime.async_loop import warmup_steps
from vime.config import Args, build_parser
from vime.errors import ConfigError, Interrupted, VimeError
from vime.runs.document import memory_at_risk
from vime.runs.sim import simulate

GiB = 1024**3

#: Options that describe how to report, never what to simulate: not sweepable.
_NOT_SWEEPABLE = {"json", "dry_run", "trace_out", "report", "sweep", "search", "target_step_time", "max_gpus", "max_points",
                  "csv", "workers", "ray_address", "backend", "compare_sim"}
#: What only the simulator reads (SimConfig): a real run measures these, so a `vime train` line leaves them out.
SIMULATOR_ONLY = ("hardware", "model", "response_length", "prompt_length")
#: Search goals: the winner is the fastest fitting layout, the fewest GPUs meeting --target-step-time, or the
#: fewest GPU-seconds per sample (optionally meeting --target-step-time).
GOALS = ("fastest", "fewest-gpus", "cheapest")


@dataclass
class PointResult:
    """One simulated configuration of a sweep or search."""

    changes: dict[str, Any]
    valid: bool = True
    error: str = ""
    fits: bool = False
    t_step: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)
    oom: str = ""
    peak_gib: float = 0.0
    gpus: int = 0
    argv: list[str] = field(default_factory=list)
    capacity_gib: float = 0.0  # the smallest GPU capacity of the layout
    short_by_gib: float = 0.0  # with an OOM: what the failed allocation lacked
    samples: int = 0  # samples trained per step (rollout batch × samples per prompt)
    gpu_s_per_step: float = 0.0  # GPUs × T_step (fitting points)
    gpu_s_per_1k_samples: float = 0.0
    stage: str = "full"  # every step of --num-rollout, or "one-step": a search's first pass (step 0 alone)
    at_risk: bool = False  # fits by less than the profile's measured memory band (vime.sim.spread.memory_band)

    @property
    def status(self) -> str:
        """fits / at risk / OOM / invalid."""
        if not self.valid:
            return "invalid"
        return ("at risk" if self.at_risk else "fits") if self.fits else "OOM"

    def rank_key(self) -> tuple[Any, ...]:
        """Fitting points first by T_step (those inside the memory band after the rest), then OOM points, then
        invalid ones; ties by the changes."""
        group = {"fits": 0, "at risk": 1, "OOM": 2, "invalid": 3}[self.status]
        return (group, self.t_step if group <= 1 else 0.0, json.dumps(self.changes, sort_keys=True, default=str))


# --------------------------------------------------------------------------------------------
# Parsing --sweep
# --------------------------------------------------------------------------------------------


def _dest_of(flag: str) -> str:
    name = flag.strip().lstrip("-").replace("-", "_")
    known = {a.dest for a in _simulate_actions()}
    if name in _NOT_SWEEPABLE or name not in known:
        hint = "" if name in _NOT_SWEEPABLE else " (see `vime simulate --help` for the flags)"
        raise ConfigError(f"--sweep {flag}: not a simulation option that can be swept{hint}")
    return name


def _simulate_actions() -> list[Any]:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    choices: dict[str, Any] = sub.choices  # type: ignore[assignment]
    return list(choices["simulate"]._actions)


def argv_for(dest: str, value: Any) -> list[str]:
    """The command-line words that set option `dest` to `value` (nothing for an off switch without a --no- form,
    which is off by default)."""
    flag = "--" + dest.replace("_", "-")
    if isinstance(value, bool):
        if value:
            return [flag]
        negatable = any(a.dest == dest and "--no-" + dest.replace("_", "-") in a.option_strings
                        for a in _simulate_actions())
        return ["--no-" + dest.replace("_", "-")] if negatable else []
    return [flag, str(value)]


def _convert(dest: str, text: str) -> Any:
    """A sweep value typed as the parser types it (via parse_args on that one flag)."""
    text = text.strip()
    low = text.lower()
    action = next(a for a in _simulate_actions() if a.dest == dest)
    if action.nargs == 0 or action.type is None and action.const is not None:  # boolean flags
        if low in ("1", "true", "on", "yes"):
            return True
        if low in ("0", "false", "off", "no"):
            return False
        raise ConfigError(f"--sweep {dest.replace('_', '-')}={text}: a boolean flag takes true/false")
    ns = build_parser().parse_args(["simulate", "--" + dest.replace("_", "-"), text])
    return getattr(ns, dest)


#: Options whose values are length specs, which hold commas themselves (``lognormal:6.0,0.6``).
_SPEC_OPTIONS = {"response_length", "prompt_length"}
_SPEC_KINDS = ("fixed:", "uniform:", "lognormal:", "trace:")


def split_values(dest: str, text: str) -> list[str]:
    """The comma-separated values of one --sweep axis; for length specs a comma starts a new value only
    where a new spec kind follows (``uniform:64,512,fixed:128`` is two values)."""
    parts = text.split(",")
    if dest not in _SPEC_OPTIONS:
        return parts
    out: list[str] = []
    for part in parts:
        if out and not part.strip().startswith(_SPEC_KINDS):
            out[-1] += "," + part
        else:
            out.append(part)
    return out


def parse_sweep(specs: Sequence[str], *, max_points: int | None = None) -> list[dict[str, Any]]:
    """``["micro-batch-size=4,8", "tensor-model-parallel-size=1,2"]`` → the cross product of changes."""
    axes: list[tuple[str, list[Any]]] = []
    for spec in specs:
        if "=" not in spec:
            raise ConfigError(f"--sweep {spec!r}: expected FLAG=V1,V2,... (e.g. micro-batch-size=4,8)")
        flag, values = spec.split("=", 1)
        dest = _dest_of(flag)
        items = [v for v in split_values(dest, values) if v.strip()]
        if not items:
            raise ConfigError(f"--sweep {spec!r}: no values after '='")
        if any(d == dest for d, _ in axes):
            raise ConfigError(f"--sweep names {flag} twice; give all its values in one --sweep")
        axes.append((dest, [_convert(dest, v) for v in items]))
    total = 1
    for _, vals in axes:
        total *= len(vals)
    if max_points is not None and total > max_points:
        raise ConfigError(f"--sweep asks for {total:,} configurations, more than --max-points {max_points:,}; "
                          f"sweep fewer values, or raise --max-points if you mean it")
    return [dict(zip([d for d, _ in axes], combo, strict=True))
            for combo in itertools.product(*[vals for _, vals in axes])]


# --------------------------------------------------------------------------------------------
# Running points
# --------------------------------------------------------------------------------------------


def simulate_point(base: Args, changes: dict[str, Any]) -> PointResult:
    """Simulate `base` with `changes`; invalid configurations and OOMs are results, not exceptions."""
    res = PointResult(dict(changes))
    try:
        args = base.replace(**changes)
    except ConfigError as exc:
        res.valid, res.error = False, str(exc)
        return res
    res.gpus = int(args.actor_num_gpus) if args.colocate else int(args.actor_num_gpus) + int(args.rollout_num_gpus)
    res.samples = int(args.samples_per_rollout)
    res.argv = command_line(args)
    try:
        sim = simulate(args)
    except VimeError as exc:  # an unknown model, an engine that cannot hold the weights: a row, not the end
        res.valid, res.error = False, f"{type(exc).__name__}: {exc}"
        return res
    res.fits = sim.fits
    res.at_risk = memory_at_risk(sim)
    if sim.steps:
        # async modes: their warm-up steps (the first rollout, a fully-async pipeline's fill) left out when there are more
        warmup = warmup_steps(args.async_rl)
        steps = sim.steps[warmup:] if len(sim.steps) > warmup else sim.steps
        n = len(steps)
        res.t_step = round(sum(s.t_step for s in steps) / n, 6)
        res.phases = {p: round(sum(s.phases()[p] for s in steps) / n, 6) for p in steps[0].phases()}
    peaks = sim.backends.recorder.gpu_peaks
    res.peak_gib = round(max((p.bytes for g, p in peaks.items() if g >= 0), default=0) / GiB, 3)
    res.capacity_gib = round(min((int(g.capacity) for g in sim.backends.gpus), default=0) / GiB, 3)
    if sim.fits and res.t_step:
        res.gpu_s_per_step = round(res.gpus * res.t_step, 4)
        res.gpu_s_per_1k_samples = round(res.gpu_s_per_step / res.samples * 1000, 4) if res.samples else 0.0
    if sim.oom is not None:
        o = sim.oom
        res.short_by_gib = round((o.requested - o.free) / GiB, 3)
        res.oom = (f"OOM during {o.phase or 'startup'} on GPU {o.gpu}: {o.owner}/{o.tag} short by "
                   f"{(o.requested - o.free) / GiB:.2f} GiB")
    return res


def _run_ray(base: Args, points: list[dict[str, Any]], address: str, out: list[PointResult], bar: Any) -> None:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError("--ray-address needs Ray: pip install 'vime[train]' (or ray)") from exc
    ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
    task = ray.remote(simulate_point)
    refs = [task.remote(base, p) for p in points]
    try:
        for ref in refs:
            out.append(ray.get(ref))
            bar.update(1)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)
        raise


def run_points(base: Args, points: Sequence[dict[str, Any]], *, workers: int | None = None,
               ray_address: str | None = None, progress: bool = False,
               on_result: Callable[[PointResult], None] | None = None) -> list[PointResult]:
    """Simulate every point in parallel; the result list is ranked (fits by T_step, then OOM, then invalid).

    Ctrl-C stops at once: queued points are cancelled, the worker processes terminated, and `Interrupted`
    carries the ranked results that finished. `on_result` sees each result as it finishes.
    """
    from tqdm import tqdm

    points = list(points)
    tqdm_bar = tqdm(total=len(points), unit="config", disable=not progress, file=sys.stderr, desc="simulating")
    results: list[PointResult] = []

    class _Bar:
        def update(self, n: int) -> None:
            tqdm_bar.update(n)
            if on_result is not None and results:
                on_result(results[-1])

        def close(self) -> None:
            tqdm_bar.close()

    bar = _Bar()
    try:
        if ray_address:
            _run_ray(base, points, ray_address, results, bar)
        else:
            n = max(1, min(workers or os.cpu_count() or 1, len(points)))
            if n == 1:
                for p in points:
                    results.append(simulate_point(base, p))
                    bar.update(1)
            else:
                _run_pool(n, simulate_point, [(base, p) for p in points], results, bar)
    except KeyboardInterrupt:
        raise Interrupted(len(points), sorted(results, key=PointResult.rank_key)) from None
    finally:
        bar.close()
    return sorted(results, key=PointResult.rank_key)


def _run_pool(n: int, fn: Callable[..., Any], calls: list[tuple[Any, ...]], out: list[Any], bar: Any) -> None:
    """`fn(*call)` for every call in `n` forked processes, answers appended to `out` as they finish.
    On Ctrl-C the queued calls are cancelled and the workers terminated before the interrupt propagates."""
    import multiprocessing as mp

    pool = ProcessPoolExecutor(n, mp_context=mp.get_context("fork"))
    try:
        futures = [pool.submit(fn, *call) for call in calls]
        for f in as_completed(futures):
            r = f.result()
            if r is not None:
                out.append(r)
            bar.update(1)
    except BaseException:
        procs = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.join(5)
        raise
    pool.shutdown()


# --------------------------------------------------------------------------------------------
# Search
# --------------------------------------------------------------------------------------------


def search(base: Args, *, goal: str = "fastest", max_gpus: int = 64, target_step_time: float | None = None,
           workers: int | None = None, progress: bool = False) -> tuple[PointResult | None, list[PointResult]]:
    """Find the fastest fitting configuration, the fewest GPUs meeting `target_step_time`, or the cheapest
    (fewest GPU-seconds per sample; meeting `target_step_time` when given): `vime.runs.search.run_search`
    over its axes, returning (winner or None, every simulated point ranked)."""
    from vime.runs.search import run_search

    best, ranked, _ = run_search(base, goal=goal, max_gpus=max_gpus, target_step_time=target_step_time,
                                 workers=workers, progress=progress)
    return best, ranked


def command_line(args: Args) -> list[str]:
    """`vime train` words that reproduce `args` on real GPUs: the options given explicitly, in a stable order,
    without what only the simulator reads (`SIMULATOR_ONLY`) or what only `vime simulate` takes. Without
    ``--hf-checkpoint`` the words name a placeholder for it (`placeholders` says what it stands for), or
    the directory of a ``--model .../config.json`` that is one; without ``--prompt-data``, a placeholder for the
    prompts. Once the placeholders name real files the words run as `vime train` arguments."""
    raw = args._raw_options()
    words = ["vime", "train"]
    if not raw.get("hf_checkpoint"):
        words += ["--hf-checkpoint", hf_checkpoint_for(args)]
    if not raw.get("prompt_data"):  # a real run has no prompts without it; the simulator drew lengths instead
        words += ["--prompt-data", PROMPTS_PLACEHOLDER]
    for dest in sorted(raw):
        if dest in _NOT_SWEEPABLE or dest in SIMULATOR_ONLY or dest == "num_rollout":
            continue
        value = raw[dest]
        if value is None or value == () or value == []:
            continue
        if isinstance(value, (list, tuple)):
            words += ["--" + dest.replace("_", "-"), *map(str, value)]
            continue
        words += argv_for(dest, value)
    return words


#: The placeholders' spelling: a path no one has. A run refuses it in one line (``--prompt-data`` when parsed,
#: ``--hf-checkpoint`` when the run starts), naming the flag to fill in.
PLACEHOLDER_PREFIX = "/path/to/"
PROMPTS_PLACEHOLDER = PLACEHOLDER_PREFIX + "prompts.jsonl"


def hf_checkpoint_for(args: Args) -> str:
    """The ``--hf-checkpoint`` of a printed `vime train` line: the directory of a ``--model`` config.json
    that lies in a checkpoint directory, else a placeholder named after the model."""
    import os

    model = str(args.model)
    if model.endswith("config.json") and os.path.isfile(model):
        return os.path.dirname(os.path.abspath(model))
    name = os.path.basename(model[:-len(".json")] if model.endswith(".json") else model) or "model"
    return f"{PLACEHOLDER_PREFIX}{name}-hf-checkpoint"


def placeholders(argv: Sequence[str]) -> dict[str, str]:
    """The placeholder words of a printed command and what the user puts there."""
    what = {"--hf-checkpoint": "the Hugging Face checkpoint directory of the model (config.json, tokenizer, weights)",
            "--prompt-data": "your prompts, one JSON object per line with the prompt under --input-key (default "
                             "'prompt'); the simulation drew prompt lengths from --prompt-length instead"}
    return {word: what[argv[i - 1]] for i, word in enumerate(argv)
            if i and word.startswith(PLACEHOLDER_PREFIX) and argv[i - 1] in what}
