"""The trainer's offload plan in simulation: bytes moved per step, and `--train-offload-plan auto` choosing tags and KV size.

`auto` simulates candidate plans — every choice of which of params, grads and optimizer state stay
resident (the activations' cache always leaves) — each at the highest --gpu-memory-utilization the
resident bytes leave room for and at the lowest that still holds the KV cache the rollout used
under `all`; the fastest fitting candidate wins (ties: fewer bytes moved, then the plan's text).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from vime.errors import ConfigError, VimeError
from vime.tags import TRAINER_OFFLOAD_TAGS

GiB = 1024**3
#: --gpu-memory-utilization values `auto` may choose.
UTILIZATIONS = (0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25, 0.2, 0.15, 0.1)
_KEEPABLE = ("params", "grads", "optimizer")
#: The headroom `auto` keeps on every GPU, as a share of its memory: the simulated peak was up to 2.76 GiB
#: (2.0 %) short of the measured one on the H200 after the process-memory fits (the resident-trainer run of the
#: third 2026-12-02 lease: allocator slack in the optimizer's pool and PyTorch's cache), and a plan 1.6 GiB from
#: the edge ran out of memory there (bench/data/h200_notes.md).
AUTO_HEADROOM = 0.02


def bytes_moved(sim: Any) -> dict[str, float]:
    """GiB copied between GPU and host per step (mean over the simulated steps), trainer and engines apart."""
    from vime.sim.trainer import OWNER

    rec = sim.backends.recorder
    starts = [s.t0 for s in rec.spans if s.track == "phases" and s.name == "rollout"]
    out = {"trainer_to_host": 0.0, "trainer_to_gpu": 0.0, "engines_to_host": 0.0, "engines_to_gpu": 0.0}
    if not starts or not sim.steps:
        return {**out, "total": 0.0}
    first = min(starts)
    for s in rec.spans:
        if s.t0 < first or s.name not in ("allocator.sleep", "allocator.wake_up"):
            continue
        who = "trainer" if s.track == OWNER else "engines"
        if s.name == "allocator.sleep":
            out[f"{who}_to_host"] += s.args.get("offloaded_bytes", 0)
        else:
            out[f"{who}_to_gpu"] += s.args.get("copied_bytes", 0)
    per = {k: round(v / len(sim.steps) / GiB, 3) for k, v in out.items()}
    per["total"] = round(sum(per.values()), 3)
    return per


@dataclass
class Candidate:
    """One simulated plan: its tags, memory fraction, T_step (0 when it did not fit) and bytes moved."""

    plan: str
    gpu_memory_utilization: float
    fits: bool = False
    t_step: float = 0.0
    moved_gib: float = 0.0
    why: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"plan": self.plan, "gpu_memory_utilization": self.gpu_memory_utilization, "fits": self.fits,
                "t_step": self.t_step, "moved_gib_per_step": self.moved_gib, "why": self.why}


@dataclass
class Choice:
    """What `auto` chose, the `all` plan it is measured against, and every candidate it simulated."""

    chosen: Candidate
    baseline: Candidate
    candidates: list[Candidate] = field(default_factory=list)

    def resident(self) -> list[str]:
        offloaded = TRAINER_OFFLOAD_TAGS if self.chosen.plan == "all" else self.chosen.plan.split(",")
        return [t for t in TRAINER_OFFLOAD_TAGS if t not in offloaded]

    def line(self) -> str:
        c, b = self.chosen, self.baseline
        keep = ", ".join(self.resident()) or "nothing"
        return (f"offload plan (auto): --train-offload-plan {c.plan} --gpu-memory-utilization {c.gpu_memory_utilization:g} "
                f"(resident: {keep}) — T_step {c.t_step:.3f} s vs {b.t_step:.3f} s with all at "
                f"{b.gpu_memory_utilization:g}; {c.moved_gib:.1f} GiB moved per step vs {b.moved_gib:.1f} "
                f"(saves {b.moved_gib - c.moved_gib:.1f} GiB); {len(self.candidates)} candidates simulated")

    def to_dict(self) -> dict[str, Any]:
        return {"chosen": self.chosen.to_dict(), "baseline_all": self.baseline.to_dict(), "resident": self.resident(),
                "candidates": [c.to_dict() for c in self.candidates]}


def _plans() -> list[str]:
    """Every choice of resident tags among params, grads, optimizer, as the tags offloaded (`all` first)."""
    out = []
    for n in range(len(_KEEPABLE) + 1):
        for keep in itertools.combinations(_KEEPABLE, n):
            gone = [t for t in TRAINER_OFFLOAD_TAGS if t not in keep]
            out.append("all" if not keep else ",".join(gone))
    return out


def _short_of_margin(sim: Any) -> str:
    """Why `sim` fits with less than AUTO_HEADROOM of some GPU left ("" when it keeps the margin everywhere)."""
    rec = sim.backends.recorder
    for gpu in sim.backends.gpus:
        peak = rec.gpu_peaks.get(gpu.index)
        left = int(gpu.capacity) - (peak.bytes if peak else 0)
        if left < AUTO_HEADROOM * int(gpu.capacity):
            return (f"GPU {gpu.index} keeps {left / GiB:.2f} GiB, under the {AUTO_HEADROOM:.0%} margin "
                    f"({AUTO_HEADROOM * int(gpu.capacity) / GiB:.2f} GiB) auto leaves for what the memory model misses")
    return ""


def run_candidate(args: Any, plan: str, util: float) -> tuple[Candidate, Any]:
    from vime.runs.sim import simulate

    cand = Candidate(plan, util)
    try:
        sim = simulate(args.replace(train_offload_plan=plan, gpu_memory_utilization=util))
    except VimeError as exc:  # an engine with no room for its KV cache
        cand.why = str(exc)
        return cand, None
    cand.fits = sim.fits and bool(sim.steps)
    if cand.fits and (short := _short_of_margin(sim)):
        cand.fits, cand.why = False, short
    elif cand.fits:
        cand.t_step = round(sum(s.t_step for s in sim.steps) / len(sim.steps), 6)
        cand.moved_gib = bytes_moved(sim)["total"]
    else:
        cand.why = str(sim.oom)
    return cand, sim


def choose_plan(args: Any) -> Choice:
    """Simulate the candidate plans of `args` (its --train-offload-plan is auto) and return the fastest that fits."""
    from vime.runs.prune import Screen
    from vime.sim.engine.kv import plan_kv_cache
    from vime.sim.engine.settings import EngineSettings
    from vime.sim.trainer.footprint import trainer_context_bytes

    if not args.offload_train:
        raise ConfigError("--train-offload-plan auto needs a trainer that sleeps (--offload-train, --colocate)")
    user_util = float(args.gpu_memory_utilization)
    baseline, base_sim = run_candidate(args, "all", user_util)
    screen = Screen(args)
    hw = screen.hw
    state = screen.cost_model(args).state_bytes_per_gpu()
    need_kv = 0
    if base_sim is not None and base_sim.steps:
        stats = base_sim.backends.rollout_stats()
        plan0 = base_sim.backends.settings
        kv = plan_kv_cache(hw, screen.model, plan0)
        need_kv = int(stats.get("kv_blocks_peak", 0)) * kv.block_bytes
    cands = [baseline]
    for plan in _plans():
        offloaded = TRAINER_OFFLOAD_TAGS if plan == "all" else plan.split(",")
        resident = max(sum(state[t][i] for t in _KEEPABLE if t not in offloaded) for i in range(len(state["params"])))
        room = [u for u in UTILIZATIONS if u * hw.memory_bytes + resident + trainer_context_bytes(hw) <= hw.memory_bytes]
        holding = []
        for u in room:
            try:
                kv = plan_kv_cache(hw, screen.model, EngineSettings.from_args(args.replace(gpu_memory_utilization=u),
                                                                              **hw.engine_overrides()))
            except ConfigError:
                continue
            if kv.kv_cache_bytes >= need_kv:
                holding.append(u)
        for u in sorted({holding[0], holding[-1]} if holding else set(), reverse=True):
            if (plan, u) != ("all", user_util):
                cands.append(run_candidate(args, plan, u)[0])
    fitting = [c for c in cands if c.fits]
    if not fitting:
        raise ConfigError(f"--train-offload-plan auto: no plan fits ({baseline.why}); lower the memory need "
                          f"(--rollout-max-context-len, --micro-batch-size) or use more GPUs")
    chosen = min(fitting, key=lambda c: (c.t_step, c.moved_gib, c.plan, -c.gpu_memory_utilization))
    return Choice(chosen, baseline, cands)
