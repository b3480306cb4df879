"""Record a measured profile's calibration spread: measured/predicted per quantity over bench/compare_calibration.py's rows.

    python bench/spread.py                 # print the spread of H200-141G-measured
    python bench/spread.py --write         # and write it into the profile's "spread" section
    python bench/spread.py --check         # exit 1 if the profile's section differs from the data (CI)

Each calibration row compares one measured quantity (median of its runs, and their min..max) with
what the simulator predicts from the profile. For the quantities of `vime.sim.spread.QUANTITIES`
the spread is the lowest and highest measured/predicted ratio over their rows, the repeated runs'
min and max included: how far the fitted model misses the machine it was fitted on. The
``whole_step_*`` quantities hold the same ratio for each phase of the whole colocated RL steps
measured on the H200 (bench/data/h200_train_e2e/<run>/: `vime train --backend real`), each step
after the first against `vime simulate` of the run's own flags with today's model and profile. The simulator
turns it into a band on every phase (`vime.sim.spread.PHASE_QUANTITIES` says which phase rests on
which). Run it after bench/calibrate.py re-fits the profile (calibrate does not keep this section).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from compare_calibration import DATA, VLLM_FILES, load_raw, rows_for  # noqa: E402

from vime.config import parse_args  # noqa: E402
from vime.orchestrator import PHASES  # noqa: E402
from vime.runs.sim import simulate  # noqa: E402
from vime.sim.hardware import load_hardware  # noqa: E402
from vime.sim.spread import QUANTITIES  # noqa: E402

PROFILE = "H200-141G-measured"
PROFILE_FILE = ROOT / "vime" / "sim" / "data" / "hardware" / f"{PROFILE}.json"

#: Which compare_calibration rows measure each component quantity: (group prefix, quantity test).
RULES: dict[str, tuple[str, Callable[[str], bool]]] = {
    "engine_generate": ("vLLM 0.25.1", lambda q: True),
    "engine_sleep": ("vLLM sleep/wake", lambda q: q.startswith("sleep")),
    "engine_wake": ("vLLM sleep/wake", lambda q: q.startswith("wake")),
    "weight_update": ("vLLM IPC weight update", lambda q: True),
    "train_compute": ("Megatron-core step", lambda q: q.startswith(("fwd", "bwd", "optimizer"))),
    "trainer_sleep_wake": ("", lambda q: q.startswith(("pause", "resume"))),
    "collective": ("NCCL", lambda q: True),
}
assert set(RULES) == {q for q in QUANTITIES if not q.startswith("whole_step_")}, "one rule per component quantity"


def quantity_of(row: dict) -> str | None:
    for key, (group, test) in RULES.items():
        if row["group"].startswith(group) and test(row["quantity"]) and row.get("unit") == "s":
            return key
    return None


def ratios(row: dict) -> tuple[float, float]:
    """measured/predicted at the row's lowest and highest run (its median when measured once)."""
    lo, hi = row["spread"] if row.get("spread") else (row["measured"], row["measured"])
    return lo / row["predicted"], hi / row["predicted"]


def compute(rows: list[dict], files: str) -> dict[str, dict]:
    """{quantity: {low, high, rows, source}} over `rows`; `files` names the data they came from."""
    out: dict[str, dict] = {}
    for key in RULES:
        mine = [r for r in rows if quantity_of(r) == key and r["predicted"] > 0]
        if not mine:
            continue
        lows, highs = zip(*(ratios(r) for r in mine), strict=True)
        worst_lo = min(mine, key=lambda r: ratios(r)[0])
        worst_hi = max(mine, key=lambda r: ratios(r)[1])
        groups = sorted({r["group"] for r in mine})
        out[key] = {
            "low": round(min(min(lows), 1.0), 4), "high": round(max(max(highs), 1.0), 4), "rows": len(mine),
            "source": (f"min..max of measured/predicted over {len(mine)} rows of bench/compare_calibration.py "
                       f"({'; '.join(groups)}), repeated runs' min and max included; lowest: {worst_lo['quantity']}, "
                       f"highest: {worst_hi['quantity']}; data {files}; bench/spread.py"),
        }
    return out


#: Whole-step runs (bench/data/h200_train_e2e/) and the model preset each ran; the OOM run has no step.
E2E_RUNS = {"qwen3-0.6b-cumem-1g_hf-init": "Qwen3-0.6B", "qwen3-0.6b-torch_memory_saver-1g": "Qwen3-0.6B",
            "qwen3-4b-cumem-1g_mbs2": "Qwen3-4B",
            # the 2026-12-02 rerun (the trainer learns; weight sync split)
            "qwen3-4b-cumem-1g_mbs2_2026-12-02": "Qwen3-4B", "qwen3-0.6b-cumem-1g_2026-12-02": "Qwen3-0.6B",
            "qwen3-0.6b-tms-1g_2026-12-02": "Qwen3-0.6B", "qwen3-0.6b-cumem-1g_b64_r512_2026-12-02": "Qwen3-0.6B",
            # the second lease of 2026-12-02: the export cuts QKV on the GPU
            "qwen3-4b-cumem-1g_mbs2_2026-12-02s6": "Qwen3-4B", "qwen3-0.6b-cumem-1g_2026-12-02s6": "Qwen3-0.6B",
            # the third lease: per-process memory; the trainer resident at 0.4 (its MoE run is out, as the second's)
            "qwen3-4b-cumem-1g_mbs2_2026-12-02s7": "Qwen3-4B", "qwen3-4b-cumem-1g_mbs2_plan040_2026-12-02s7": "Qwen3-4B",
            # the fourth lease: vLLM's /metrics beside the client's times (its MoE runs are out, as before)
            "qwen3-4b-cumem-1g_mbs2_2026-12-02s8": "Qwen3-4B", "qwen3-0.6b-cumem-1g_2026-12-02s8": "Qwen3-0.6B",
            # the fifth lease (2026-12-03): a host ~1.3x slower at single-thread work than the fourth's, the GPU the same
            "qwen3-4b-cumem-1g_mbs2_2026-12-03s10": "Qwen3-4B", "qwen3-0.6b-cumem-1g_2026-12-03s10": "Qwen3-0.6B",
            "qwen3-4b-cumem-1g_mbs2_b8_2026-12-03s10": "Qwen3-4B",
            # the sixth lease: a host slower again (vLLM's 0.6B step at 256 requests 14–15 ms against 12 and 8–10)
            "qwen3-4b-cumem-1g_mbs2_2026-12-03s11": "Qwen3-4B", "qwen3-0.6b-cumem-1g_2026-12-03s11": "Qwen3-0.6B",
            # the seventh lease: a host whose single-thread probe halved and doubled within it; vLLM's 0.6B step 10-12 ms
            "qwen3-4b-cumem-1g_mbs2_n2_2026-12-03s12": "Qwen3-4B", "qwen3-0.6b-cumem-1g_2026-12-03s12": "Qwen3-0.6B",
            # the eighth to tenth leases: the two host classes (lockstep k 60-67 us and 84-88 us) and drift within a lease
            "qwen3-0.6b-cumem-1g-mbs8_2026-12-03s13": "Qwen3-0.6B", "qwen3-0.6b-cumem-1g-mbs8-b8_2026-12-03s13": "Qwen3-0.6B",
            "qwen3-0.6b-cumem-1g-mbs8-quiet_2026-12-04s14": "Qwen3-0.6B", "qwen3-0.6b-cumem-1g-mbs8_2026-12-04s14": "Qwen3-0.6B",
            "qwen3-0.6b-cumem-1g-mbs8-b16_2026-12-04s14": "Qwen3-0.6B",
            "qwen3-0.6b-cumem-1g-mbs8-quiet2_2026-12-04s14": "Qwen3-0.6B", "qwen3-0.6b-cumem-1g-mbs8-2_2026-12-04s14": "Qwen3-0.6B",
            "qwen3-0.6b-cumem-1g-mbs8_2026-12-04s15": "Qwen3-0.6B", "qwen3-0.6b-cumem-1g-mbs8-r512_2026-12-04s15": "Qwen3-0.6B",
            "qwen3-4b-cumem-1g_mbs2_2026-12-04s15": "Qwen3-4B",
            # the eleventh lease: the fastest host yet, micro-batches 1 to 8 (the host-bound trainer among them)
            **{f"qwen3-0.6b-cumem-1g-{tag}_2026-12-04s16": "Qwen3-0.6B"
               for tag in ("mbs8-util035", "mbs8", "mbs4", "mbs2", "mbs8-r512", "mbs1")},
            # the twelfth lease: a fast host again (the 0.6B rollouts 14-19 s against 22.4 modelled)
            "qwen3-4b-cumem-1g-mbs2_2026-12-04s17": "Qwen3-4B", "qwen3-0.6b-cumem-1g-mbs8-util060_2026-12-04s17": "Qwen3-0.6B",
            "qwen3-0.6b-cumem-1g-mbs8_2026-12-04s17": "Qwen3-0.6B",
            # the thirteenth lease: the KV wake's spill at utilizations 0.75 (0.6B) and 0.7 (4B)
            "qwen3-0.6b-cumem-1g-mbs8-util075_2026-12-04s18": "Qwen3-0.6B",
            "qwen3-4b-cumem-1g-mbs2-util070_2026-12-04s18": "Qwen3-4B",
            "qwen3-0.6b-cumem-1g-mbs4-nooffload-util030_2026-12-04s19": "Qwen3-0.6B",
            # the fifteenth lease: the resident trainer emptying its cache after training
            "qwen3-0.6b-cumem-1g-mbs4-nooffload-emptied-util030_2026-12-04s20": "Qwen3-0.6B",
            "qwen3-0.6b-cumem-1g-mbs4-r2048_2026-12-04s20": "Qwen3-0.6B",
            "qwen3-4b-cumem-1g-mbs2-nooffload-emptied-util040_2026-12-04s20": "Qwen3-4B",
            # the sixteenth lease: full recompute, a KL loss against a reference model, vLLM without graphs or compile
            "qwen3-4b-cumem-1g-mbs4-recompute_2026-12-04s21": "Qwen3-4B",
            "qwen3-0.6b-cumem-1g-mbs4-kl_2026-12-04s21": "Qwen3-0.6B",
            "qwen3-0.6b-cumem-1g-mbs4-eager_2026-12-04s21": "Qwen3-0.6B",
            # the twentieth lease: a model size never run whole before (its host floor on the slow side, notes)
            "qwen3-1.7b-cumem-1g-mbs4_2026-12-05s27": "Qwen3-1.7B"}
#: Phases of a run its trainer no longer measures the same way: the runs before the second lease of 2026-12-02
#: split the fused QKV weights on the host (0.75 s of a 4B export), which the trainer no longer does.
#: The MoE run of that lease is in none of the bands: its trainer runs the 128 experts one by one (Megatron's
#: SequentialMLP), a host cost the simulator does not model (train −86 %, issue 21).
SUPERSEDED = {run: ("weight_sync",) for run in E2E_RUNS if not run.endswith(("s6", "s7", "s8", "s10", "s11", "s12", "s13", "s14", "s15", "s16", "s17", "s18", "s19", "s20", "s21"))}
#: Runs whose trainer kept memory vime's no longer does: the resident trainer before it emptied its cache after
#: training (the fifteenth lease's "emptied" runs are the same configurations with today's trainer).
MEMORY_SUPERSEDED = {"qwen3-0.6b-cumem-1g-mbs4-nooffload-util030_2026-12-04s19"}
#: `vime train` flags a simulation does not take (the real checkpoint, prompts, reward, backend), with their arity.
_TRAIN_ONLY = {"--backend": 1, "--hf-checkpoint": 1, "--prompt-data": 1, "--custom-rm-path": 1}


def simulate_flags(command: str, model: str, profile: str) -> list[str]:
    """The run's own flags (its command.txt) as `vime simulate` takes them, on `model` and `profile`."""
    argv = command.replace("+ vime train", "").split()
    out: list[str] = []
    i = 0
    while i < len(argv):
        flag = argv[i]
        if flag in _TRAIN_ONLY:
            i += 1 + _TRAIN_ONLY[flag]
            continue
        if flag in ("--model", "--hardware"):
            out += [flag, model if flag == "--model" else profile]
            i += 2
            continue
        out.append(flag)
        i += 1
    if "--model" not in out:  # run.sh since 2026-12-02 keeps the simulator's inputs out of `vime train`'s command
        caps = [argv[j + 1] for j, f in enumerate(argv) if f == "--rollout-max-response-len"]
        out += ["--model", model, "--hardware", profile, "--prompt-length", "fixed:128",
                "--response-length", f"fixed:{caps[-1] if caps else 1024}"]
    return out


def whole_step_ratios(profile: str = PROFILE) -> dict[str, list[tuple[str, float]]]:
    """{phase: [(run/step, measured/predicted)]} over the H200 runs' steps after the first, and under
    ``rollout_memory`` / ``train_memory`` each run's most GPU level while rolling out / training (nvidia-smi,
    cut at the phases by `vime compare` when the run was compared) over the simulated phase's peak."""
    out: dict[str, list[tuple[str, float]]] = {p: [] for p in (*PHASES, "rollout_memory", "train_memory")}
    for run, model in E2E_RUNS.items():
        folder = DATA / "h200_train_e2e" / run
        flags = simulate_flags((folder / "command.txt").read_text(), model, profile)
        sim = simulate(parse_args(flags, command="simulate"))
        compared = json.loads((folder / "compare.json").read_text()) if (folder / "compare.json").exists() else {}
        levels = (compared.get("memory") or {}).get("gpus", {})
        for (gpu, phase), predicted in sorted(sim.backends.recorder.phase_peaks.items()):
            seen = [v for v in (levels.get(str(gpu)) or {}).get(f"{phase}_mib", []) if v is not None]
            if phase in ("rollout", "train") and seen and run not in MEMORY_SUPERSEDED:
                out[f"{phase}_memory"].append((f"{run} GPU {gpu}", max(seen) * 2**20 / predicted))
        steady = [s for s in sim.steps if s.rollout_id >= 1]
        predicted = {p: sum(getattr(s, f"t_{p}") for s in steady) / len(steady) for p in PHASES}
        for line in (folder / "train.jsonl").read_text().splitlines():
            event = json.loads(line)
            if event.get("event") != "step" or event["rollout_id"] < 1:
                continue
            for p in PHASES:
                if predicted[p] > 0 and p not in SUPERSEDED.get(run, ()):
                    out[p].append((f"{run} step {event['rollout_id']}", event["phases"][p] / predicted[p]))
    return out


def whole_step_spread(profile: str = PROFILE) -> dict[str, dict]:
    out = {}
    for phase, ratios in whole_step_ratios(profile).items():
        if not ratios:
            continue
        lo, hi = min(ratios, key=lambda r: r[1]), max(ratios, key=lambda r: r[1])
        doing = {"rollout_memory": "rolling out", "train_memory": "training"}.get(phase)
        what = (f"GPU level while {doing} "
                f"over {len(ratios)} whole colocated RL runs (nvidia-smi every 0.5 s; their compare.json) on one H200 "
                f"(runs " if doing else
                f"{phase} over {len(ratios)} whole colocated RL steps on one H200 (steps after the first of runs ")
        out[f"whole_step_{phase}"] = {
            "low": round(min(lo[1], 1.0), 4), "high": round(max(hi[1], 1.0), 4), "rows": len(ratios),
            "source": (f"min..max of measured/predicted {what}{', '.join(E2E_RUNS)}: bench/data/h200_train_e2e/, "
                       f"vime train --backend real, vLLM 0.25.1, Megatron-core, trained on zero-valued weights) "
                       f"against vime simulate of each run's own flags on {profile}; lowest: {lo[0]}, highest: "
                       f"{hi[0]}; bench/spread.py"),
        }
    return out


def measured_spread(profile: str = PROFILE) -> dict[str, dict]:
    """The spread of `profile` from the committed H200 data (what --write records)."""
    raw = load_raw(str(DATA / "h200_calibration.json"))
    vllm = [json.loads((DATA / f).read_text()) for f in VLLM_FILES if (DATA / f).exists()]
    rows = rows_for(load_hardware(profile), raw, vllm)
    spread = compute(rows, "bench/data/h200_calibration.json and the vLLM runs (compare_calibration.VLLM_FILES)")
    spread.update(whole_step_spread(profile))
    return spread


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write the section into {PROFILE_FILE.name}")
    ap.add_argument("--check", action="store_true", help="exit 1 when the profile's section is not what the data give")
    args = ap.parse_args()
    spread = measured_spread()
    for key, q in spread.items():
        print(f"{key:20s} {q['low']:6.3f} .. {q['high']:6.3f}  ({q['rows']} rows)")
    prof = json.loads(PROFILE_FILE.read_text())
    if args.check:
        if prof.get("spread") != spread:
            print(f"{PROFILE_FILE.name}: its spread section differs from the data; run bench/spread.py --write")
            return 1
        print(f"{PROFILE_FILE.name}: spread section matches the data")
    if args.write:
        prof["spread"] = spread
        PROFILE_FILE.write_text(json.dumps(prof, indent=2) + "\n")
        print(f"wrote {PROFILE_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
