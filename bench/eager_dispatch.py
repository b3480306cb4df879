"""vLLM under --enforce-eager: the per-layer Python dispatch of an uncompiled forward, fitted on one bench, checked on the rest.

`--enforce-eager` turns off CUDA graphs *and* torch.compile. The profile's `eager_iteration_s` (2.78 ms) was fitted on
prefills past the capture sizes, which still run compiled code; the twenty-first session's whole step with
`--enforce-eager` took 54.3 s of rollout where the simulator said 22.4 (`h200_train_e2e/…-eager_2026-12-04s21`), and
the vLLM-alone bench written for it (hypotheses in `vllm_bench_s21/predicted_eager.md`, before the run) put ~19 ms
per iteration on a lone request: a CPU cost of the forward, not of the batch.

The fit: `uncompiled_host_s_per_layer` from the 0.6B bench's two smallest batches (1 and 16, where every step is
CPU-bound and the GPU term cannot hide it): (measured wall − the committed profile's wall with graphs and compile)
/ (decode iterations · layers), averaged. Held out: the same bench's batches 64–256, the 4B bench (36 layers, 2.5×
the width), and the whole step. Prints the table `bench/data/vllm_bench_s21/eager_fit.txt` keeps.

    python bench/eager_dispatch.py            # fit and table
    python bench/eager_dispatch.py --check    # exit 1 if the committed profile's value is not the fit's
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from compare_calibration import _iter_model, decode_run_seconds  # noqa: E402

from vime.sim.engine import EngineSettings  # noqa: E402
from vime.sim.hardware import HardwareSpec  # noqa: E402

DATA = ROOT / "bench" / "data" / "vllm_bench_s21"
PROFILE = ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G-measured.json"
FIT_BENCH, FIT_BATCHES = "vllm_06b_eager.json", (1, 16)
BENCHES = {"vllm_06b_eager.json": "qwen3-0.6b", "vllm_4b_eager_quick.json": "qwen3-4b"}
PROMPT = 128  # vllm_bench.py's decode prompts
WHOLE_STEP = "qwen3-0.6b-cumem-1g-mbs4-eager_2026-12-04s21"


def with_dispatch(profile: dict, value: float) -> dict:
    """`profile` with `uncompiled_host_s_per_layer` set to `value`."""
    return {**profile, "efficiency": {**profile["efficiency"], "uncompiled_host_s_per_layer": value}}


def row_seconds(profile: dict, preset: str, batch: int, new: int, eager: bool) -> float:
    """The bench's wall time of B lockstep requests under `profile`, with or without --enforce-eager."""
    from fit_whole_step import model_of  # noqa: PLC0415 - reads bench/data

    hw = HardwareSpec.from_dict(profile, origin=str(PROFILE))
    kw = {"cuda_graph_max_tokens": 0, "compiled": False} if eager else {}
    im = _iter_model(hw, model_of(preset), **kw)
    s = EngineSettings(max_model_len=20480, **hw.engine_overrides())
    return decode_run_seconds(im, batch, PROMPT, new, s.response_per_token_s, s.response_per_request_s) \
        + s.request_overhead_s


def fit(profile: dict) -> float:
    """The per-layer dispatch the fit batches imply over `profile`'s compiled, graphed rows (its own dispatch unused)."""
    from fit_whole_step import model_of  # noqa: PLC0415

    run = json.loads((DATA / FIT_BENCH).read_text())
    layers = model_of(BENCHES[FIT_BENCH]).num_layers
    per = [(r["wall_s"] - row_seconds(profile, BENCHES[FIT_BENCH], r["batch"], r["max_tokens"], eager=False))
           / ((r["max_tokens"] - 1) * layers) for r in run["phases"]["decode"] if r["batch"] in FIT_BATCHES]
    return float(f"{statistics.mean(per):.3g}")


def whole_step(profile: dict) -> tuple[float, float]:
    """(measured, simulated) rollout of the eager whole step, mean of the steps after the first."""
    import tempfile  # noqa: PLC0415

    import fit_whole_step  # noqa: PLC0415

    with tempfile.TemporaryDirectory() as d:
        sim = fit_whole_step.simulate(WHOLE_STEP, profile, Path(d))
    return fit_whole_step.measured(WHOLE_STEP, "perf/rollout_time"), sim["perf/rollout_time"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 unless the committed profile carries the fit")
    args = ap.parse_args()
    profile = json.loads(PROFILE.read_text())
    committed = profile["efficiency"].get("uncompiled_host_s_per_layer", 0.0)
    value = fit(profile)
    print(f"uncompiled_host_s_per_layer fitted on {FIT_BENCH} batches {FIT_BATCHES}: {value * 1e3:.3f} ms "
          f"(committed {committed * 1e3:.3f} ms)")
    if args.check:
        return 0 if abs(value - committed) <= 1e-12 else 1
    before, fitted = with_dispatch(profile, 0.0), with_dispatch(profile, value)
    print("error % = (predicted - measured) / measured; 'as committed' = the model before this fit (2.78 ms on the GPU "
          "side, hidden under the CPU step)")
    print(f"{'row':38s} {'measured':>9s} {'as committed':>20s} {'fitted':>20s}  use")
    for name, preset in BENCHES.items():
        run = json.loads((DATA / name).read_text())
        for r in run["phases"]["decode"]:
            b, n = r["batch"], r["max_tokens"]
            old = row_seconds(before, preset, b, n, eager=True)
            new = row_seconds(fitted, preset, b, n, eager=True)
            m = r["wall_s"]
            use = "fit" if name == FIT_BENCH and b in FIT_BATCHES else "held out"
            print(f"{preset + f' B={b} x {n}':38s} {m:9.3f} {old:10.3f} {100 * (old - m) / m:+8.1f} % "
                  f"{new:10.3f} {100 * (new - m) / m:+8.1f} %  {use}")
    m, old = whole_step(before)
    _, new = whole_step(fitted)
    print(f"{'whole step rollout (steps >= 1)':38s} {m:9.3f} {old:10.3f} {100 * (old - m) / m:+8.1f} % "
          f"{new:10.3f} {100 * (new - m) / m:+8.1f} %  held out")
    return 0


if __name__ == "__main__":
    sys.exit(main())
