"""Record a measured profile's calibration spread: measured/predicted per quantity over bench/compare_calibration.py's rows.

    python bench/spread.py                 # print the spread of H200-141G-measured
    python bench/spread.py --write         # and write it into the profile's "spread" section
    python bench/spread.py --check         # exit 1 if the profile's section differs from the data (CI)

Each calibration row compares one measured quantity (median of its runs, and their min..max) with
what the simulator predicts from the profile. For the quantities of `vime.sim.spread.QUANTITIES`
the spread is the lowest and highest measured/predicted ratio over their rows, the repeated runs'
min and max included: how far the fitted model misses the machine it was fitted on. The simulator
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

from vime.sim.hardware import load_hardware  # noqa: E402
from vime.sim.spread import QUANTITIES  # noqa: E402

PROFILE = "H200-141G-measured"
PROFILE_FILE = ROOT / "vime" / "sim" / "data" / "hardware" / f"{PROFILE}.json"

#: Which compare_calibration rows measure each quantity: (group prefix, quantity test).
RULES: dict[str, tuple[str, Callable[[str], bool]]] = {
    "engine_generate": ("vLLM 0.25.1", lambda q: True),
    "engine_sleep": ("vLLM sleep/wake", lambda q: q.startswith("sleep")),
    "engine_wake": ("vLLM sleep/wake", lambda q: q.startswith("wake")),
    "weight_update": ("vLLM IPC weight update", lambda q: True),
    "train_compute": ("Megatron-core step", lambda q: q.startswith(("fwd", "bwd", "optimizer"))),
    "trainer_sleep_wake": ("", lambda q: q.startswith(("pause", "resume"))),
    "collective": ("NCCL", lambda q: True),
}
assert set(RULES) == set(QUANTITIES), "every recorded quantity has a rule, every rule a quantity"


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


def measured_spread(profile: str = PROFILE) -> dict[str, dict]:
    """The spread of `profile` from the committed H200 data (what --write records)."""
    raw = load_raw(str(DATA / "h200_calibration.json"))
    vllm = [json.loads((DATA / f).read_text()) for f in VLLM_FILES if (DATA / f).exists()]
    rows = rows_for(load_hardware(profile), raw, vllm)
    return compute(rows, "bench/data/h200_calibration.json and the vLLM runs (compare_calibration.VLLM_FILES)")


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
