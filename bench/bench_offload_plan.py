"""Figures of `--train-offload-plan auto` against `all` (issue 25): T_step, GiB moved per step, the plan chosen.

Run once (about a minute): `PYTHONPATH=$PWD python bench/bench_offload_plan.py [--out FILE]`. Scenarios: the
default one (Qwen3-4B on 8 × H100-SXM-80G) and the same on 141 GB GPUs (--hardware H200-141G-measured).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from vime.config import parse_args
from vime.runs.document import build_document
from vime.runs.sim import simulate

SCENARIOS = {"default (H100-SXM-80G)": [], "H200-141G-measured": ["--hardware", "H200-141G-measured"]}


def figures(argv: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for plan in ("all", "auto"):
        doc = build_document(simulate(parse_args([*argv, "--train-offload-plan", plan], command="simulate")),
                             deterministic=True)
        off = doc["offload"]
        out[plan] = {"plan": off["plan"], "gpu_memory_utilization": doc["config"]["gpu_memory_utilization"],
                     "t_step_s": doc["summary"]["t_step"], "moved_gib_per_step": off["moved_gib_per_step"],
                     "phases_s": {k: v["seconds"] for k, v in doc["summary"]["phases"].items()}}
        if "auto" in off:
            out[plan]["resident"] = off["auto"]["resident"]
            out[plan]["candidates_simulated"] = len(off["auto"]["candidates"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    table = {name: figures(argv) for name, argv in SCENARIOS.items()}
    for name, f in table.items():
        for plan in ("all", "auto"):
            r = f[plan]
            print(f"{name:24s} {plan:4s} → --train-offload-plan {r['plan']} --gpu-memory-utilization "
                  f"{r['gpu_memory_utilization']:g}: T_step {r['t_step_s']:.3f} s, {r['moved_gib_per_step']['total']:.1f} GiB "
                  f"moved per step" + (f" (resident: {', '.join(r['resident'])})" if "resident" in r else ""))
    if a.out:
        with open(a.out, "w") as fh:
            json.dump(table, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
