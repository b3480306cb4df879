"""Colocated sync vs one-step-off vs fully-async in the simulator (issue 22): the seed scenario and a 64-GPU Qwen3-8B one, every split tried.

For each scenario the same GPU count is used three ways: colocated (the seed's synchronous step on
every GPU), and split into trainer GPUs + engine GPUs (--no-colocate) run sync, one-step-off and
fully-async (--max-staleness 1 and 2). Each split is simulated for --steps steps; figures are steady
state, the steps after the first --warmup ones, the same window for every mode: the first step also
waits for the first rollout, and a fully-async producer fills its pipeline (up to max-staleness + 1
batches) during it, which the next steps drain without waiting. Figures: T_step, samples/s, engine
and trainer idle shares, staleness. The best split of each mode is the one with the most samples/s.
Run from the repository root:

    PYTHONPATH=$PWD python bench/bench_async.py [--steps 12] [--warmup 4] [--out bench/data/async_modes.json]

Prints a markdown table (best split per mode, then every point) and writes every point as JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from vime.config import parse_args
from vime.runs.sim import simulate

SCENARIOS: dict[str, dict[str, Any]] = {
    # the seed: Qwen3-4B on one node of 8 H100s, 32 prompts × 8 samples, TP 2, engines of 2 GPUs
    # (6 trainer GPUs would be DP 3, which 256 samples do not divide)
    "seed (Qwen3-4B, 8×H100)": {"base": [], "gpus_per_node": 8, "nodes": 1, "actor_gpus": [2, 4]},
    # 64 H100s (8 nodes), Qwen3-8B, 96 prompts × 8 samples (768 divide evenly over DP 4, 8, 12, 16, 24 and 32);
    # the trainer takes whole nodes (40 and 56 GPUs would be DP 20 and 28, which 768 samples do not divide)
    "Qwen3-8B, 64×H100": {"base": ["--model", "Qwen3-8B", "--rollout-batch-size", "96"], "gpus_per_node": 8,
                          "nodes": 8, "actor_gpus": [8, 16, 24, 32, 48]},
}
MODES: list[tuple[str, list[str]]] = [
    ("sync (split)", ["--async-mode", "sync"]),
    ("one-step-off", ["--async-mode", "one-step-off"]),
    ("fully-async S=1", ["--async-mode", "fully-async", "--max-staleness", "1"]),
    ("fully-async S=2", ["--async-mode", "fully-async", "--max-staleness", "2"]),
]


def layout(actor_gpus: int, total: int, per_node: int) -> list[str]:
    """Flags for a trainer on `actor_gpus` GPUs and engines on the rest of `total`."""
    nodes, per = (actor_gpus // per_node, per_node) if actor_gpus >= per_node else (1, actor_gpus)
    return ["--actor-num-nodes", str(nodes), "--actor-num-gpus-per-node", str(per), "--no-colocate",
            "--rollout-num-gpus", str(total - actor_gpus)]


def point(argv: list[str], warmup: int) -> dict[str, Any]:
    """One simulation: steady-state figures (the steps after the first `warmup`) or the reason it did not run."""
    try:
        args = parse_args(argv, command="simulate")
    except Exception as exc:  # an impossible layout is a row of the table, not the end of the benchmark
        return {"argv": argv, "ok": False, "reason": str(exc)}
    sim = simulate(args)
    if sim.oom is not None:
        return {"argv": argv, "ok": False, "reason": f"OOM: {sim.oom}"}
    steady = sim.steps[warmup:] or sim.steps
    t = sum(s.t_step for s in steady)
    samples = sum(s.num_samples for s in steady)
    out = {"argv": argv, "ok": True, "t_step": t / len(steady), "samples_per_s": samples / t,
           "t_step_all": sum(s.t_step for s in sim.steps) / len(sim.steps),
           "t_rollout": sum(s.t_rollout for s in steady) / len(steady),
           "t_train": sum(s.t_train for s in steady) / len(steady),
           "t_weight_sync": sum(s.t_weight_sync for s in steady) / len(steady)}
    if hasattr(steady[0], "staleness_mean"):
        out.update({"staleness_mean": sum(s.staleness_mean * s.num_samples for s in steady) / samples,
                    "staleness_max": max(s.staleness_max for s in steady),
                    "partial_share": sum(s.partial_share * s.num_samples for s in steady) / samples,
                    "engine_idle_share": sum(s.engine_idle_share * s.t_step for s in steady) / t,
                    "trainer_idle_share": sum(s.trainer_idle_share * s.t_step for s in steady) / t})
    else:  # the seed's step: the engines idle outside the rollout, the trainer outside train
        out.update({"staleness_mean": 0.0, "staleness_max": 0, "partial_share": 0.0,
                    "engine_idle_share": 1 - sum(s.t_rollout for s in steady) / t,
                    "trainer_idle_share": 1 - sum(s.t_train for s in steady) / t})
    return out


def run(steps: int, warmup: int) -> list[dict[str, Any]]:
    rows = []
    for name, sc in SCENARIOS.items():
        total = sc["gpus_per_node"] * sc["nodes"]
        common = [*sc["base"], "--num-rollout", str(steps)]
        colocated = ["--actor-num-nodes", str(sc["nodes"]), "--actor-num-gpus-per-node", str(sc["gpus_per_node"])]
        todo = [("colocated sync", f"{total} shared", [*common, *colocated])]
        for a in sc["actor_gpus"]:
            for mode, flags in MODES:
                todo.append((mode, f"{a} train + {total - a} rollout", [*common, *layout(a, total, sc["gpus_per_node"]),
                                                                        *flags]))
        for mode, split, argv in todo:
            t0 = time.perf_counter()
            r = point(argv, warmup)
            r.update(scenario=name, mode=mode, split=split, wall_s=round(time.perf_counter() - t0, 2))
            print(f"{name} | {mode} | {split}: " + (f"T_step {r['t_step']:.3f} s" if r["ok"] else r["reason"][:80]),
                  file=sys.stderr, flush=True)
            rows.append(r)
    return rows


def table(rows: list[dict[str, Any]], *, best_only: bool) -> str:
    head = ("| scenario | mode | split (GPUs) | T_step steady (s) | samples/s | vs colocated | engines idle | "
            "trainer idle | staleness mean / max | partial |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for name in SCENARIOS:
        ok = [r for r in rows if r["scenario"] == name and r["ok"]]
        base = next((r for r in ok if r["mode"] == "colocated sync"), None)
        shown = ok
        if best_only:
            shown = [max((r for r in ok if r["mode"] == m), key=lambda r: r["samples_per_s"])
                     for m in ["colocated sync", *(m for m, _ in MODES)] if any(r["mode"] == m for r in ok)]
        for r in shown:
            speed = f"{r['samples_per_s'] / base['samples_per_s']:.2f}×" if base else "-"
            lines.append(f"| {name} | {r['mode']} | {r['split']} | {r['t_step']:.3f} | {r['samples_per_s']:.1f} | {speed} | "
                         f"{100 * r['engine_idle_share']:.0f} % | {100 * r['trainer_idle_share']:.0f} % | "
                         f"{r['staleness_mean']:.2f} / {r['staleness_max']} | {100 * r['partial_share']:.0f} % |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=12, help="simulated steps per point")
    p.add_argument("--warmup", type=int, default=4, help="first steps left out of the steady-state figures")
    p.add_argument("--out", default="bench/data/async_modes.json", help="where to write every point (JSON)")
    a = p.parse_args()
    rows = run(a.steps, a.warmup)
    with open(a.out, "w") as f:
        json.dump({"steps": a.steps, "warmup": a.warmup, "points": rows}, f, indent=1)
    failed = [r for r in rows if not r["ok"]]
    print(f"Best split per mode (most samples/s, steady state: steps {a.warmup}–{a.steps - 1}):\n")
    print(table(rows, best_only=True))
    print("\nEvery point:\n")
    print(table(rows, best_only=False))
    if failed:
        print("\nNot run:\n" + "\n".join(f"- {r['scenario']} | {r['mode']} | {r['split']}: {r['reason']}" for r in failed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
