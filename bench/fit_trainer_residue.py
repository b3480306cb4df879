"""The GPU memory that stays mapped after step 0 in the 2026-12-02 H200 whole-step runs (issue 17): measured per phase, the trainer's residue fitted, and the simulator's memory per phase beside it.

    python bench/fit_trainer_residue.py            # tables on stdout; bench/data/trainer_residue.json
    python bench/fit_trainer_residue.py --base DIR  # also simulate with the vime tree in DIR (before the change)

Measured: gpu_mem.csv (nvidia-smi, every 0.5 s) cut at the phase boundaries of train.jsonl (each step ends
at its wall_time; its phases run in PHASES order from wall_time - t_step; start-up: trainer sleep, onload
weights, weight sync, onload KV, ending at its wall_time); vLLM's own count from engine0.log ("Sleep mode
freed X GiB memory, Y GiB memory is still in use": Y is the whole device while the engine is asleep, so Y minus
the first sleep's Y is what other processes, here the trainer, hold). Fitted: `software.train_step_residue_bytes`
= the rise of the rollout level from step 0 to steps 1-2 of the Qwen3-0.6B cumem run, less the terms
`vime.sim.trainer.footprint.step_residue_bytes` adds for that run (two fp32 embedding-sized tensors, one layer's
fp32 scores of the largest micro-batch); the other three runs are held out.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from spread import simulate_flags  # noqa: E402

from vime.report.compare import phase_windows, read_mem, read_train  # noqa: E402

DATA = ROOT / "bench" / "data"
PROFILE = "H200-141G-measured"
RUNS = ("qwen3-4b-cumem-1g_mbs2_2026-12-02", "qwen3-0.6b-cumem-1g_2026-12-02", "qwen3-0.6b-tms-1g_2026-12-02",
        "qwen3-0.6b-cumem-1g_b64_r512_2026-12-02")
MODELS = {"qwen3-4b": "Qwen3-4B", "qwen3-0.6b": "Qwen3-0.6B"}
FIT_RUN = "qwen3-0.6b-cumem-1g_2026-12-02"
GIB = 1 << 30
MIB = 1 << 20


def model_of(run: str) -> str:
    return MODELS["qwen3-4b" if run.startswith("qwen3-4b") else "qwen3-0.6b"]


def windows(run_dir: Path) -> list[tuple[str, dict[str, tuple[float, float]]]]:
    """[(step name, {phase: (t0, t1)})]: the start-up's four parts, then every step's phases."""
    out = []
    for line in (run_dir / "train.jsonl").read_text().splitlines():
        ev = json.loads(line)
        if ev.get("event") == "startup":
            end = float(ev["wall_time"])
            kv0 = end - float(ev["t_onload_kv"])
            ws0 = kv0 - float(ev["t_weight_sync"])
            ow0 = ws0 - float(ev["t_onload_weights"])
            out.append(("startup", {"trainer_sleep": (end - float(ev["t_total"]), ow0), "onload_weights": (ow0, ws0),
                                    "weight_sync": (ws0, kv0), "onload_kv": (kv0, end)}))
    for step in read_train(run_dir / "train.jsonl")[1]:
        out.append((f"step{step['rollout_id']}", phase_windows(step)))
    return out


def measured_levels(run_dir: Path) -> dict[str, dict[str, dict[str, float] | None]]:
    """{step: {phase: {"median": GiB, "max": GiB, "last": GiB, "n": samples} or None (no sample)}}."""
    samples = read_mem(run_dir / "gpu_mem.csv")[0]
    out: dict[str, dict[str, dict[str, float] | None]] = {}
    for name, win in windows(run_dir):
        row: dict[str, dict[str, float] | None] = {}
        for ph, (a, b) in win.items():
            seen = [u for t, u in samples if a <= t <= b]
            row[ph] = None if not seen else {"median": statistics.median(seen) * MIB / GIB,
                                             "max": max(seen) * MIB / GIB, "last": seen[-1] * MIB / GIB,
                                             "n": len(seen)}
        out[name] = row
    out["after_run"] = {"level": {"median": samples[-3][1] * MIB / GIB, "max": samples[-3][1] * MIB / GIB,
                                  "last": samples[-3][1] * MIB / GIB, "n": 1}}
    return out


def vllm_sleeps(run_dir: Path) -> list[dict[str, float]]:
    """vLLM's account of each of its sleeps: GiB it freed (its own) and GiB still in use on the device (everyone's)."""
    pat = re.compile(r"Sleep mode freed ([\d.]+) GiB memory, ([\d.]+) GiB memory is still in use")
    return [{"freed_gib": float(m[1]), "still_in_use_gib": float(m[2])}
            for m in pat.finditer((run_dir / "engine0.log").read_text())]


def rollout_rise_gib(levels: dict[str, dict[str, dict[str, float] | None]]) -> float:
    """Median rollout level of the steps after the first, minus the first step's."""
    later = [r["rollout"]["median"] for k, r in levels.items() if k.startswith("step") and k != "step0" and r["rollout"]]
    return statistics.median(later) - levels["step0"]["rollout"]["median"]  # type: ignore[index]


def simulated(run: str, residue_bytes: int | None, base: Path | None = None) -> dict[str, object]:
    """The simulator's level per phase (max while the phase runs, GiB) for each step, and its peak, on the
    preset (with `residue_bytes` as software.train_step_residue_bytes) — in a child process, so `base` (another
    vime tree) can run too."""
    flags = simulate_flags((DATA / "h200_train_e2e" / run / "command.txt").read_text(), model_of(run), PROFILE)
    code = f"""
import json, sys, dataclasses
from vime.config import parse_args
from vime.runs.sim import simulate
from vime.sim.hardware import load_hardware
hw = load_hardware({PROFILE!r})
residue = {residue_bytes!r}
if residue is not None:
    hw = dataclasses.replace(hw, software=dataclasses.replace(hw.software, train_step_residue_bytes=residue))
sim = simulate(parse_args({flags!r}, command="simulate"), hardware=hw)
rec = sim.backends.recorder
levels = {{}}
gpu0 = [s for s in rec.samples if s.gpu == 0]
for name, rid, t0, t1 in rec.phase_spans:
    key = "startup" if rid is None else f"step{{rid}}"
    held = [s.total for s in gpu0 if s.t <= t0][-1:]  # the level the phase starts at
    seen = held + [s.total for s in gpu0 if t0 < s.t <= t1]
    if seen:
        levels.setdefault(key, {{}})[name] = max(seen) / 2**30
peak = rec.gpu_peaks[0]
print(json.dumps({{"levels": levels, "peak_gib": peak.bytes / 2**30, "peak_phase": peak.phase,
                  "peak_by_tag_gib": {{f"{{o}}/{{t}}": b / 2**30 for o, t, b in peak.breakdown}}}}))
"""
    tree = base or ROOT
    done = subprocess.run([sys.executable, "-c", code], cwd=tree, env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", type=Path, help="a vime tree to simulate with as 'before' (e.g. git archive of main)")
    ap.add_argument("--out", type=Path, default=DATA / "trainer_residue.json")
    a = ap.parse_args(argv)

    doc: dict[str, object] = {"fit_run": FIT_RUN, "held_out": [r for r in RUNS if r != FIT_RUN], "runs": {}}
    measured = {run: measured_levels(DATA / "h200_train_e2e" / run) for run in RUNS}
    rise = {run: rollout_rise_gib(lv) for run, lv in measured.items()}
    # the base: the fit run's rise less what footprint.step_residue_bytes adds for its model and micro-batches
    probe = simulated(FIT_RUN, MIB)["peak_by_tag_gib"]["actor/step_residue"] * GIB - MIB  # type: ignore[index]
    fitted = int(round((rise[FIT_RUN] * GIB - probe) / MIB)) * MIB  # whole MiB: nvidia-smi's unit
    doc["train_step_residue_bytes"] = fitted
    doc["structural_bytes_of_fit_run"] = int(probe)
    print(f"fitted software.train_step_residue_bytes = {fitted} ({fitted / GIB:.3f} GiB) on {FIT_RUN} (its rise "
          f"{rise[FIT_RUN]:.3f} GiB less the embedding and score terms, {probe / GIB:.3f} GiB)\n")
    for run in RUNS:
        sleeps = vllm_sleeps(DATA / "h200_train_e2e" / run)
        first = sleeps[0]["still_in_use_gib"]
        others = [round(s["still_in_use_gib"] - first, 2) for s in sleeps[1:]]
        after = simulated(run, fitted)
        before = simulated(run, None, a.base) if a.base else None
        meas = measured[run]
        peak = max(v["max"] for r in meas.values() for v in r.values() if v)
        entry = {"rollout_rise_gib": rise[run], "measured_gib": meas, "vllm_sleeps": sleeps,
                 "trainer_gib_at_engine_sleeps": others, "measured_peak_gib": peak,
                 "simulated_after": after, "simulated_before": before}
        doc["runs"][run] = entry  # type: ignore[index]
        print(f"== {run}  (rollout level rise after step 0: {rise[run]:.2f} GiB; the trainer's GiB at each engine "
              f"sleep, from vLLM's log: {others}; level after the engine exits: {meas['after_run']['level']['last']:.2f})")
        print(f"{'step':8} {'phase':15} {'measured med/max':>18} {'sim before':>11} {'sim after':>10}")
        for step, row in meas.items():
            if step == "after_run":
                continue
            for ph, v in row.items():
                sim_a = after["levels"].get(step, {}).get(ph)  # type: ignore[union-attr]
                sim_b = before["levels"].get(step, {}).get(ph) if before else None  # type: ignore[union-attr]
                m = f"{v['median']:7.2f} / {v['max']:7.2f}" if v else "      (no sample)"
                fb = f"{sim_b:11.2f}" if sim_b is not None else f"{'-':>11}"
                fa = f"{sim_a:10.2f}" if sim_a is not None else f"{'-':>10}"
                print(f"{step:8} {ph:15} {m:>18} {fb} {fa}")
        err = lambda p, peak=peak: 100.0 * (p - peak) / peak  # noqa: E731
        b = f"{before['peak_gib']:.2f} GiB ({err(before['peak_gib']):+.1f} %)" if before else "-"
        print(f"peak: measured {peak:.2f} GiB; simulated before {b}, after {after['peak_gib']:.2f} GiB "
              f"({err(after['peak_gib']):+.1f} %) in {after['peak_phase']}\n")
    a.out.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"wrote {a.out.relative_to(ROOT) if a.out.is_relative_to(ROOT) else a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
