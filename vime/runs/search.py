"""`--search` at scale: the grid of `vime.runs.search_space`, pruned by closed-form rules, and a best-first simulation.

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
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from vime.errors import ConfigError, Interrupted
from vime.runs.prune import Screen, probe_lengths, trainer_wake_slack
from vime.runs.search_space import (  # noqa: F401  (the space's names, re-exported for callers of the search)
    ASYNC_AXIS,
    AXES,
    EXPERT_AXIS,
    GPUS_PER_NODE,
    PLANNING_AXES,
    REF_AXIS,
    Axis,
    changes_of,
    expert_count,
    grid,
    search_axes,
)
from vime.runs.sweep import GOALS, PointResult, simulate_point

#: Pruning rules, in the order they are tried.
RULES = ("invalid", "memory", "target", "bound", "bound-after-one-step")
#: The phases only the engines' options change, and the one only the trainer's options change.
ENGINE_PHASES = ("rollout", "offload", "onload_weights", "onload_kv")
TRAINER_PHASES = ("train",)
_TOL = 1e-3  # results are rounded to 1 µs (T_step) and 0.1 mGPU·s: a bound must beat them by more to prune


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


class _RayPool:
    """An executor over a Ray cluster: each call a Ray task; as many in flight as the cluster has CPUs."""

    def __init__(self, address: str) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ConfigError("--ray-address needs Ray: pip install 'vime[train]' (or ray)") from exc
        self._ray = ray
        ray.init(address=address, ignore_reinit_error=True, log_to_driver=False)
        self.size = max(1, int(ray.cluster_resources().get("CPU", 1)))
        self._refs: list[Any] = []
        self._tasks: dict[Callable[..., Any], Any] = {}

    def submit(self, fn: Callable[..., Any], *args: Any) -> Future[Any]:
        task = self._tasks.get(fn)
        if task is None:
            task = self._tasks[fn] = self._ray.remote(fn)
        ref = task.remote(*args)
        self._refs.append(ref)
        return ref.future()

    def shutdown(self, wait: bool = True, cancel_futures: bool = False) -> None:
        if cancel_futures:  # Ctrl-C: what is still queued or running stops
            for ref in self._refs:
                self._ray.cancel(ref, force=True)
        self._refs.clear()


@dataclass(order=True)
class _Open:
    """A point not yet decided, ordered by a lower bound of its objective."""

    key: tuple[float, ...]
    tie: str
    changes: dict[str, Any] = field(compare=False)
    one_step: bool = field(compare=False, default=False)
    gpus: int = field(compare=False, default=0)
    samples: int = field(compare=False, default=0)
    engine_key: str = field(compare=False, default="")
    trainer_key: str = field(compare=False, default="")
    engine_lb: float = field(compare=False, default=0.0)  # rollout roofline, mean over steps
    trainer_lb: float = field(compare=False, default=0.0)  # train roofline, mean over steps
    step_lbs: list[float] = field(compare=False, default_factory=list)
    after_one_step: float = field(compare=False, default=0.0)  # the bound its step 0 gave
    overlap: bool = field(compare=False, default=False)  # an async mode: rollout and train overlap


def run_search(base: Any, *, goal: str = "fastest", max_gpus: int = 64, target_step_time: float | None = None,
               workers: int | None = None, progress: bool = False, axes: Sequence[Axis] = AXES,
               points: Sequence[dict[str, Any]] | None = None, exhaustive: bool = False,
               one_step: bool = False, ray_address: str | None = None,
               ) -> tuple[PointResult | None, list[PointResult], SearchStats]:
    """Search `points` (default: the `axes` grid up to `max_gpus`) for the goal's best fitting configuration.

    Returns (winner or None, every simulated point ranked, stats). ``exhaustive`` simulates every point
    in full with no pruning (the reference the pruned search must agree with). ``one_step`` simulates each
    survivor's first step before its full run (pays off when the later steps' bounds are tight).
    ``ray_address`` runs the simulations as tasks on that Ray cluster (as many at once as it has CPUs)
    instead of local processes; the pruning stays here. Ctrl-C raises `Interrupted` with the ranked
    results so far (the best so far first).
    """
    if goal not in GOALS:
        raise ConfigError(f"--search {goal!r}: use one of {', '.join(GOALS)}")
    if goal == "fewest-gpus" and target_step_time is None:
        raise ConfigError("--search fewest-gpus needs --target-step-time SECONDS")
    t0 = time.perf_counter()
    if points is None:
        axes = search_axes(base, axes)
    pts = list(points) if points is not None else grid(max_gpus, axes)
    if not pts:
        raise ConfigError(f"--search: no GPU count up to --max-gpus {max_gpus}; raise --max-gpus")
    stats = SearchStats(considered=len(pts))
    # step 0 of a one-step run is step 0 of the full run unless the last step evaluates or saves
    one_step = one_step and base.eval_interval is None and base.save_interval is None
    sides = {ax.dest: ax.side for ax in axes}
    opened = _screen(base, goal, pts, target_step_time, stats, exhaustive, one_step=one_step, sides=sides)
    ray_pool = _RayPool(ray_address) if ray_address else None
    n = max(1, min((ray_pool.size if ray_pool else workers or os.cpu_count() or 1), len(opened) or 1))
    search = _Search(base, goal, target_step_time, stats, exhaustive)
    from tqdm import tqdm

    search.bar = tqdm(total=len(opened), unit="config", disable=not progress, file=sys.stderr, desc="searching")
    pool: Any = ray_pool or (_Serial() if n == 1 else _pool(n))
    try:
        search.run(opened, pool, n)
    except KeyboardInterrupt:
        _stop(pool)
        raise Interrupted(len(pts), search.ranked()) from None
    finally:
        search.bar.close()
    pool.shutdown()
    stats.wall_s = time.perf_counter() - t0
    return search.best, search.ranked(), stats


def _side_key(changes: dict[str, Any], side: str, sides: dict[str, str]) -> str:
    """The changes that touch `side` of the step (an option no axis names counts for both)."""
    return _tie({k: v for k, v in changes.items() if sides.get(k, "both") in (side, "both")})


def _screen(base: Any, goal: str, pts: Sequence[dict[str, Any]], target: float | None, stats: SearchStats,
            exhaustive: bool, *, one_step: bool, sides: dict[str, str]) -> list[_Open]:
    """Closed-form rules over every point: what is left, keyed by a lower bound of its objective. The
    trainer's and the engines' parts are computed once per distinct trainer and engine configuration."""
    if exhaustive:
        return [_Open((0.0,), _tie(c), dict(c)) for c in pts]
    t = time.perf_counter()
    screen = Screen(base, _probe(base, pts))
    stats.probe_s = time.perf_counter() - t
    trainer: dict[str, tuple[str, str, list[float]]] = {}  # key → (rule, reason, per-step train bounds)
    engine: dict[str, tuple[str, str, list[float]]] = {}
    opened = []
    for changes in pts:
        try:
            args = base.replace(**changes)
        except ConfigError as exc:
            stats.prune(changes, "invalid", str(exc))
            continue
        tk, ek = _side_key(changes, "trainer", sides), _side_key(changes, "engine", sides)
        if tk not in trainer:
            trainer[tk] = _trainer_part(screen, args)
        if ek not in engine:
            reason = screen.engine_memory(args)
            engine[ek] = ("memory", reason, []) if reason else ("", "", screen.rollout_bounds(args))
        rule, reason, t_lbs = trainer[tk]
        if not rule:
            rule, reason, e_lbs = engine[ek]
        if rule:
            stats.prune(changes, rule, reason)
            continue
        # an async step overlaps rollout and train (and fully-async pipelines rollouts across versions):
        # only the trainer's roofline bounds it
        overlap = args.async_mode != "sync"
        sync = 0.0 if overlap else screen.sync_bound(args)
        lbs = list(t_lbs) if overlap else [a + b + sync for a, b in zip(e_lbs, t_lbs, strict=True)]
        t_lb = sum(lbs) / len(lbs) if lbs else 0.0
        if target is not None and t_lb > target * (1 + _TOL):
            stats.prune(changes, "target", f"T_step ≥ {t_lb:.3f} s > --target-step-time {target:g}")
            continue
        gpus, samples = _gpus(args), int(args.samples_per_rollout)
        opened.append(_Open(bound_key(goal, gpus, samples, t_lb), _tie(changes), dict(changes),
                            one_step and len(lbs) > 1 and not overlap,
                            gpus, samples, ek, tk, _mean(e_lbs), _mean(t_lbs), lbs, overlap=overlap))
    return opened


def _mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def _trainer_part(screen: Screen, args: Any) -> tuple[str, str, list[float]]:
    try:
        cm = screen.cost_model(args)
    except ConfigError as exc:
        return "invalid", str(exc), []
    reason = screen.trainer_memory(cm)
    return ("memory", reason, []) if reason else ("", "", screen.train_bounds(cm))


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
        if screen.trainer_memory(cm) or screen.engine_memory(args):
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


class _Search:
    """Best-first branch and bound over the open points.

    A point's bound is its roofline for each side of the step, raised to what a fully simulated point
    with the same engine options measured for the engines' phases (rollout, engine sleep and wake) and
    with the same trainer options for the train phase: in a synchronous step those phases follow one
    another and each depends on its own side's options only (but for `trainer_wake_slack`, taken off the train phase),
    so they add up to a lower bound of T_step (weight sync and the gap count as 0). The open point with the smallest
    bound runs next; when that bound cannot beat the best full result, neither can any other open point.
    """

    def __init__(self, base: Any, goal: str, target: float | None, stats: SearchStats, exhaustive: bool) -> None:
        self.base, self.goal, self.target, self.stats, self.exhaustive = base, goal, target, stats, exhaustive
        self.wake_slack = trainer_wake_slack(base)
        self.done: dict[str, PointResult] = {}
        self.best_safe: PointResult | None = None
        self.best_at_risk: PointResult | None = None
        self.engine_seen: dict[str, float] = {}
        self.trainer_seen: dict[str, float] = {}
        self.bar: Any = None

    @property
    def best(self) -> PointResult | None:
        """The winner: the best clear of the memory band, else the best at risk."""
        return self.best_safe or self.best_at_risk

    def ranked(self) -> list[PointResult]:
        ranked = sorted(self.done.values(), key=PointResult.rank_key)
        if self.best is not None:  # the winner first, then the rest as ranked
            ranked = [self.best, *[r for r in ranked if r is not self.best]]
        return ranked

    def _t_bound(self, item: _Open) -> float:
        if item.overlap:  # measured sync phases bound nothing here; the train roofline does
            return item.trainer_lb
        t = (max(item.engine_lb, self.engine_seen.get(item.engine_key, 0.0))
             + max(item.trainer_lb, self.trainer_seen.get(item.trainer_key, 0.0)))
        return max(t, item.after_one_step)

    def _prune(self, item: _Open, rule: str, why: str) -> None:
        self.stats.prune(item.changes, rule, why)
        self.bar.update(1)

    def _next(self, heap: list[_Open]) -> _Open | None:
        """The open point to simulate next, pruning what cannot win (None: nothing left to run)."""
        while heap:
            item = heapq.heappop(heap)
            if self.exhaustive:
                return item
            t = self._t_bound(item)
            key = bound_key(self.goal, item.gpus, item.samples, t)
            if worse(key, item.key):  # raised by what was measured since it was queued: back in line
                item.key = key
                heapq.heappush(heap, item)
                continue
            if self.target is not None and t > self.target * (1 + _TOL):
                self._prune(item, "target", f"T_step ≥ {t:.3f} s > --target-step-time {self.target:g}")
                continue
            # only a winner clear of the memory band bounds the rest: an at-risk one may yet lose to a safe point
            if self.best_safe is not None and worse(item.key, objective(self.goal, self.best_safe)):
                best = objective(self.goal, self.best_safe)[0]
                for rest in [item, *heap]:  # every open bound is at least this one's
                    self._prune(rest, "bound-after-one-step" if rest.after_one_step else "bound",
                                f"objective ≥ {rest.key[0]:.3f}, the best simulated has {best:.3f}")
                heap.clear()
                return None
            return item
        return None

    def run(self, opened: list[_Open], pool: Any, n: int) -> None:
        heap = list(opened)
        heapq.heapify(heap)
        running: dict[Future[Any], _Open] = {}
        while heap or running:
            while len(running) < n:
                item = self._next(heap)
                if item is None:
                    break
                running[pool.submit(_simulate, self.base, item.changes, item.one_step)] = item
            if not running:
                break
            finished, _ = wait(list(running), return_when=FIRST_COMPLETED)
            for fut in sorted(finished, key=lambda f: running[f].tie):
                item = running.pop(fut)
                self._finished(item, fut.result(), heap)

    def _finished(self, item: _Open, r: PointResult, heap: list[_Open]) -> None:
        self.done[item.tie] = r
        fits = r.valid and r.fits and r.t_step > 0
        if item.one_step:
            self.stats.one_step += 1
            if fits:  # its first step, with the later steps' bounds: back in line for the full run
                item.after_one_step = (r.t_step + sum(item.step_lbs[1:])) / len(item.step_lbs)
                item.one_step = False
                heapq.heappush(heap, item)
                return
        else:
            self.stats.full += 1
            if fits and not item.overlap:  # an async point's phases are waits, not bounds for other points
                self.engine_seen.setdefault(item.engine_key, sum(r.phases.get(p, 0.0) for p in ENGINE_PHASES))
                self.trainer_seen.setdefault(item.trainer_key, sum(r.phases.get(p, 0.0) for p in TRAINER_PHASES)
                                             - self.wake_slack)
            meets = fits and (self.target is None or r.t_step <= self.target)
            slot = "best_at_risk" if r.at_risk else "best_safe"
            ref = getattr(self, slot)
            if meets and (ref is None or (objective(self.goal, r), item.tie)
                          < (objective(self.goal, ref), _tie(ref.changes))):
                setattr(self, slot, r)
                best = self.best or r
                self.bar.set_postfix_str(f"best {best.t_step:.3f} s on {best.gpus} GPUs")
        self.bar.update(1)


def _pool(n: int) -> ProcessPoolExecutor:
    import multiprocessing as mp

    return ProcessPoolExecutor(n, mp_context=mp.get_context("fork"))


def _stop(pool: Any) -> None:
    """Cancel what is queued and end the worker processes (Ctrl-C)."""
    if isinstance(pool, _RayPool):
        pool.shutdown(cancel_futures=True)
        return
    if not isinstance(pool, ProcessPoolExecutor):
        return
    procs = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in procs:
        proc.terminate()
    for proc in procs:
        proc.join(5)
