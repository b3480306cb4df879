"""`--search` at scale: the axis grid, pruning by closed-form rules, and a best-first simulation of what survives.

Every grid point is first screened in closed form (`vime.runs.prune`): an invalid configuration or
one that cannot fit is rejected with its reason, and the rest get a lower bound on T_step. Then a
best-first branch and bound simulates them: the open point with the smallest bound on the goal's
objective runs next — a one-step simulation first when the base simulates several steps (step 0 of
a one-step run is step 0 of the full run, so its T_step with the later steps' lower bounds is a
tighter bound), then the full simulation — until the smallest open bound cannot beat the best full
result. Pruning is sound: a point is dropped only when a lower bound of its objective is worse than
a configuration already simulated in full, so the winner is the exhaustive run's.
"""

from __future__ import annotations

import heapq
import itertools
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from vime.errors import ConfigError, Interrupted
from vime.runs.prune import Screen, probe_lengths
from vime.runs.sweep import GOALS, PointResult, simulate_point


@dataclass(frozen=True)
class Axis:
    """One searched option and its candidate values ("gpus" stands for the actor's nodes × GPUs per node)."""

    dest: str
    values: tuple[Any, ...]


#: The searched axes, in grid order; adding an axis (EP, an async mode) is one line here.
AXES: tuple[Axis, ...] = (
    Axis("gpus", (1, 2, 4, 8, 16, 32, 64, 128)),
    Axis("tensor_model_parallel_size", (1, 2, 4, 8)),
    Axis("pipeline_model_parallel_size", (1, 2, 4, 8)),
    Axis("rollout_num_gpus_per_engine", (1, 2, 4, 8)),
    Axis("micro_batch_size", (16, 8, 4, 2, 1)),
    Axis("gpu_memory_utilization", (0.9, 0.8, 0.7, 0.6)),
)
#: Pruning rules, in the order they are tried.
RULES = ("invalid", "memory", "target", "bound", "bound-after-one-step")
GPUS_PER_NODE = 8
_TOL = 1e-3  # results are rounded to 1 µs (T_step) and 0.1 mGPU·s: a bound must beat them by more to prune


def changes_of(point: dict[str, Any]) -> dict[str, Any]:
    """A grid point as option changes: "gpus" becomes --actor-num-nodes × --actor-num-gpus-per-node."""
    out = dict(point)
    gpus = out.pop("gpus", None)
    if gpus is not None:
        nodes, per_node = (1, gpus) if gpus <= GPUS_PER_NODE else (gpus // GPUS_PER_NODE, GPUS_PER_NODE)
        out = {"actor_num_nodes": nodes, "actor_num_gpus_per_node": per_node, **out}
    return out


def grid(max_gpus: int, axes: Sequence[Axis] = AXES) -> list[dict[str, Any]]:
    """The cross product of the axes' values (GPU counts above `max_gpus`, or past one node and not whole nodes, left out)."""
    values = []
    for ax in axes:
        vals = ax.values
        if ax.dest == "gpus":
            vals = tuple(g for g in vals if g <= max_gpus and (g <= GPUS_PER_NODE or g % GPUS_PER_NODE == 0))
        values.append(vals)
    return [changes_of(dict(zip([a.dest for a in axes], combo, strict=True))) for combo in itertools.product(*values)]


@dataclass
class SearchStats:
    """What a search did: points considered, pruned per rule (with each pruned point's reason), simulated per stage."""

    considered: int = 0
    pruned: dict[str, int] = field(default_factory=lambda: dict.fromkeys(RULES, 0))
    reasons: list[tuple[dict[str, Any], str, str]] = field(default_factory=list)  # (changes, rule, reason)
    one_step: int = 0
    full: int = 0
    probe_s: float = 0.0
    wall_s: float = 0.0

    def prune(self, changes: dict[str, Any], rule: str, reason: str) -> None:
        self.pruned[rule] += 1
        self.reasons.append((changes, rule, reason))

    def summary(self) -> str:
        rules = ", ".join(f"{n:,} {r}" for r, n in self.pruned.items() if n)
        return (f"searched {self.considered:,} configurations in {self.wall_s:.1f} s: pruned {rules or 'none'}; "
                f"simulated {self.one_step:,} one-step, {self.full:,} in full")

    def to_dict(self) -> dict[str, Any]:
        first = {}
        for changes, rule, reason in self.reasons:
            first.setdefault(rule, {"changes": changes, "reason": reason})
        return {"considered": self.considered, "pruned": dict(self.pruned), "simulated_one_step": self.one_step,
                "simulated_full": self.full, "wall_s": round(self.wall_s, 3), "first_pruned_by_rule": first}


def objective(goal: str, r: PointResult) -> tuple[float, ...]:
    """What the goal minimises, for a fitting result."""
    if goal == "cheapest":
        return (r.gpu_s_per_1k_samples, r.gpus, r.t_step)
    if goal == "fewest-gpus":
        return (r.gpus, r.t_step)
    return (r.t_step,)


def bound_key(goal: str, gpus: int, samples: int, t_lb: float) -> tuple[float, ...]:
    """The objective a point with T_step ≥ `t_lb` cannot beat."""
    if goal == "cheapest":
        return (gpus * t_lb / max(1, samples) * 1000, gpus, t_lb)
    if goal == "fewest-gpus":
        return (gpus, t_lb)
    return (t_lb,)


def worse(key: Sequence[float], best: Sequence[float]) -> bool:
    """Whether every objective with lower bound `key` is worse than `best` (beyond rounding)."""
    for k, b in zip(key, best, strict=True):
        if k > b + _TOL * max(1.0, abs(b)):
            return True
        if k < b - _TOL * max(1.0, abs(b)):
            return False
    return False


def _simulate(base: Any, changes: dict[str, Any], one_step: bool) -> PointResult:
    """One point in full, or its first step alone (`stage` says which)."""
    first = {"num_rollout": int(base.start_rollout_id) + 1}
    r = simulate_point(base, {**changes, **first} if one_step else changes)
    r.changes = dict(changes)
    r.stage = "one-step" if one_step else "full"
    return r


class _Serial:
    """An executor that runs each call when submitted (one worker: no processes to fork)."""

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        f: Future[Any] = Future()
        f.set_result(fn(*args))
        return f

    def shutdown(self, **_: Any) -> None:
        pass


@dataclass(order=True)
class _Open:
    key: tuple[float, ...]
    tie: str
    changes: dict[str, Any] = field(compare=False)
    one_step: bool = field(compare=False)
    step_lbs: list[float] = field(compare=False, default_factory=list)


def run_search(base: Any, *, goal: str = "fastest", max_gpus: int = 64, target_step_time: float | None = None,
               workers: int | None = None, progress: bool = False, axes: Sequence[Axis] = AXES,
               points: Sequence[dict[str, Any]] | None = None, exhaustive: bool = False,
               one_step: bool = False) -> tuple[PointResult | None, list[PointResult], SearchStats]:
    """Search `points` (default: the `axes` grid up to `max_gpus`) for the goal's best fitting configuration.

    Returns (winner or None, every simulated point ranked, stats). ``exhaustive`` simulates every point
    in full with no pruning (the reference the pruned search must agree with). ``one_step`` simulates each
    survivor's first step before its full run (pays off when the later steps' bounds are tight). Ctrl-C raises
    `Interrupted` with the ranked results so far (the best so far first).
    """
    if goal not in GOALS:
        raise ConfigError(f"--search {goal!r}: use one of {', '.join(GOALS)}")
    if goal == "fewest-gpus" and target_step_time is None:
        raise ConfigError("--search fewest-gpus needs --target-step-time SECONDS")
    t0 = time.perf_counter()
    pts = list(points) if points is not None else grid(max_gpus, axes)
    if not pts:
        raise ConfigError(f"--search: no GPU count up to --max-gpus {max_gpus}; raise --max-gpus")
    stats = SearchStats(considered=len(pts))
    # step 0 of a one-step run is step 0 of the full run unless the last step evaluates or saves
    one_step = one_step and base.eval_interval is None and base.save_interval is None
    opened = _screen(base, goal, pts, target_step_time, stats, exhaustive, one_step=one_step)
    n = max(1, min(workers or os.cpu_count() or 1, len(opened) or 1))
    done: dict[str, PointResult] = {}
    best: list[PointResult] = []
    from tqdm import tqdm

    bar = tqdm(total=len(opened), unit="config", disable=not progress, file=sys.stderr, desc="searching")
    pool: Any = _Serial() if n == 1 else _pool(n)
    try:
        _branch_and_bound(base, goal, opened, target_step_time, stats, pool, n, done, best, bar, exhaustive)
    except KeyboardInterrupt:
        _stop(pool)
        raise Interrupted(len(pts), _ranked(goal, done, best)) from None
    finally:
        bar.close()
    pool.shutdown()
    stats.wall_s = time.perf_counter() - t0
    return (best[0] if best else None), _ranked(goal, done, best), stats


def _ranked(goal: str, done: dict[str, PointResult], best: list[PointResult]) -> list[PointResult]:
    ranked = sorted(done.values(), key=PointResult.rank_key)
    if best:  # the winner first, then the rest as ranked
        ranked = [best[0], *[r for r in ranked if r is not best[0]]]
    return ranked


def _screen(base: Any, goal: str, pts: Sequence[dict[str, Any]], target: float | None, stats: SearchStats,
            exhaustive: bool, *, one_step: bool) -> list[_Open]:
    """Closed-form rules over every point: what is left, keyed by a lower bound of its objective."""
    if exhaustive:
        return [_Open((0.0,), _tie(c), dict(c), False) for c in pts]
    t = time.perf_counter()
    screen = Screen(base, _probe(base, pts))
    stats.probe_s = time.perf_counter() - t
    opened = []
    for changes in pts:
        try:
            args = base.replace(**changes)
            cm = screen.cost_model(args)
        except ConfigError as exc:
            stats.prune(changes, "invalid", str(exc))
            continue
        reason = screen.memory(args, cm)
        if reason:
            stats.prune(changes, "memory", reason)
            continue
        lbs = screen.step_lower_bounds(args, cm)
        t_lb = sum(lbs) / len(lbs) if lbs else 0.0
        if target is not None and t_lb > target * (1 + _TOL):
            stats.prune(changes, "target", f"T_step ≥ {t_lb:.3f} s > --target-step-time {target:g}")
            continue
        gpus = _gpus(args)
        opened.append(_Open(bound_key(goal, gpus, int(args.samples_per_rollout), t_lb), _tie(changes), dict(changes),
                            one_step and len(lbs) > 1, lbs))
    return opened


def _probe(base: Any, pts: Sequence[dict[str, Any]], tries: int = 3) -> Any:
    """The trained lengths from the base configuration, else from the first points that pass the memory check."""
    found = probe_lengths(base)
    if found is not None:
        return found
    screen = Screen(base)
    for changes in pts:
        try:
            args = base.replace(**changes)
            cm = screen.cost_model(args)
        except ConfigError:
            continue
        if screen.memory(args, cm):
            continue
        found = probe_lengths(args)
        tries -= 1
        if found is not None or tries == 0:
            return found
    return None


def _gpus(args: Any) -> int:
    actor = int(args.actor_num_gpus)
    return actor if args.colocate else actor + int(args.rollout_num_gpus)


def _tie(changes: dict[str, Any]) -> str:
    return json.dumps(changes, sort_keys=True, default=str)


def _meets(r: PointResult, target: float | None) -> bool:
    return r.valid and r.fits and r.t_step > 0 and (target is None or r.t_step <= target)


def _branch_and_bound(base: Any, goal: str, opened: list[_Open], target: float | None, stats: SearchStats,
                      pool: Any, n: int, done: dict[str, PointResult], best: list[PointResult], bar: Any,
                      exhaustive: bool) -> None:
    """Best-first: run the open point with the smallest bound until none can beat the best full result."""
    heap = list(opened)
    heapq.heapify(heap)
    running: dict[Future[Any], _Open] = {}
    while heap or running:
        while heap and len(running) < n:
            item = heap[0]
            if best and not exhaustive and worse(item.key, objective(goal, best[0])):
                for rest in heap:  # every open key is at least this one's
                    stats.prune(rest.changes, "bound-after-one-step" if rest.tie in done else "bound",
                                f"objective ≥ {rest.key[0]:.3f}, worse than the best simulated {objective(goal, best[0])[0]:.3f}")
                    bar.update(1)
                heap.clear()
                break
            heapq.heappop(heap)
            running[pool.submit(_simulate, base, item.changes, item.one_step)] = item
        if not running:
            break
        finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
        for fut in sorted(finished, key=lambda f: running[f].tie):
            item = running.pop(fut)
            r: PointResult = fut.result()
            done[item.tie] = r
            if item.one_step:
                stats.one_step += 1
                if _meets_one_step(r, target, item):
                    t_lb = (r.t_step + sum(item.step_lbs[1:])) / len(item.step_lbs)
                    heapq.heappush(heap, _Open(bound_key(goal, r.gpus, r.samples, t_lb), item.tie, item.changes, False))
                    continue
            else:
                stats.full += 1
                if _meets(r, target) and (not best or (objective(goal, r), item.tie) < (objective(goal, best[0]),
                                                                                        _tie(best[0].changes))):
                    best[:] = [r]
                    bar.set_postfix_str(f"best {r.t_step:.3f} s on {r.gpus} GPUs")
            bar.update(1)


def _meets_one_step(r: PointResult, target: float | None, item: _Open) -> bool:
    """Whether a one-step result may still win in full (its first step fits, and within the target's bound)."""
    if not (r.valid and r.fits and r.t_step > 0):
        return False
    if target is None:
        return True
    return (r.t_step + sum(item.step_lbs[1:])) / len(item.step_lbs) <= target * (1 + _TOL)


def _pool(n: int) -> ProcessPoolExecutor:
    import multiprocessing as mp

    return ProcessPoolExecutor(n, mp_context=mp.get_context("fork"))


def _stop(pool: Any) -> None:
    """Cancel what is queued and end the worker processes (Ctrl-C)."""
    if not isinstance(pool, ProcessPoolExecutor):
        return
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(5)
