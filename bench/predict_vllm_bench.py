"""Predictions of record for a `scripts/h200/vllm_bench.py` run on the H200, written before it runs (issue 17).

The vLLM-alone bench drives one engine through a decode grid (B requests of 128-token prompts, B = 1..256,
256 or 1024 new tokens each, no EOS), long prefills and lone requests. Each row is predicted by the same
functions `compare_calibration.py` holds the earlier runs against, under several hypotheses about vLLM's step,
so the run says which one holds on its host:

- ``profile``: the measured H200 profile as committed;
- ``gpu_terms``: plus the GPU terms `fit_whole_step.py` section 0 fitted on GPU-bound decode (the attention's
  KV read rate, the sampler per logit), the profile's CPU step unchanged;
- ``gpu_terms+fast_host`` / ``gpu_terms+median_host``: plus a CPU step of the fast hosts (2.5 ms + 27 us per
  request: the first lease's vLLM-alone runs, the fourth lease's flat 0.6B decode) or of the median lease
  (3.85 ms + 30.4 us), the iteration's serial overhead 0 — the two candidates of `h200_notes.md`'s twelfth
  session.

Every row also carries the flat part's step (the mean decode iteration, engine only), which vLLM's own
/metrics of a whole step can be set beside.

    python bench/predict_vllm_bench.py --preset qwen3-0.6b --out bench/data/predicted_vllm_bench_06b_2026-12-03s13.json
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts" / "h200"))
sys.path.insert(0, str(ROOT / "scripts" / "h200_train"))

from compare_calibration import _iter_model, decode_run_seconds, prefill_seconds  # noqa: E402

from vime.sim.engine import EngineSettings  # noqa: E402
from vime.sim.hardware import HardwareSpec  # noqa: E402

PROFILE = ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G-measured.json"
PROMPT = 128  # vllm_bench.py's decode prompts
HOSTS = {  # candidate CPU steps (efficiency fields), h200_notes.md twelfth session
    "fast_host": {"host_step_s": 2.5e-3, "host_step_per_seq_s": 27e-6, "iteration_overhead_s": 0.0},
    "median_host": {"host_step_s": 3.85e-3, "host_step_per_seq_s": 30.4e-6, "iteration_overhead_s": 0.0},
}


def hypotheses(profile: dict) -> dict[str, dict]:
    """Name -> profile dict, each a variant of the committed profile."""
    from fit_whole_step import gpu_step_terms  # noqa: PLC0415 - reads the whole-step runs in bench/data

    fitted, _ = gpu_step_terms(profile)
    gpu = copy.deepcopy(profile)
    gpu.setdefault("engine", {}).update({k.split(".", 1)[1]: v for k, v in fitted.items()})
    out = {"profile": profile, "gpu_terms": gpu}
    for name, eff in HOSTS.items():
        p = copy.deepcopy(gpu)
        p["efficiency"].update(eff)
        out[f"gpu_terms+{name}"] = p
    return out


def predict(profile: dict, model, grid: list[tuple[int, int]], prefill_lens: list[int]) -> dict:
    hw = HardwareSpec.from_dict(profile, origin="hypothesis")
    im = _iter_model(hw, model)
    s = EngineSettings(max_model_len=20480)
    fe = s.request_overhead_s
    rows = {"lone request, 16 tokens, max_tokens 1":
            im.first_time(16, 0, 16 * 17 / 2, seqs=1) + fe + s.response_seconds(1)}
    steps = {}
    for b, n in grid:
        rows[f"generate B={b} x {n} tokens"] = decode_run_seconds(
            im, b, PROMPT, n, s.response_per_token_s, s.response_per_request_s) + fe
        mids = [b * (PROMPT + j + 1) for j in range(n - 1)]
        steps[f"B={b} x {n}"] = sum(im.time(b, c, c) for c in mids) / len(mids)
    for n in prefill_lens:
        rows[f"prefill {n} tokens, max_tokens 1"] = prefill_seconds(im, n) + fe + s.response_seconds(1)
    return {"wall_s": rows, "mean_decode_step_s": steps}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", required=True, help="vllm_bench.py's --preset (qwen3-0.6b, qwen3-4b)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    import vllm_bench  # noqa: PLC0415 - scripts/h200: its grid, as the run will use it
    from fit_whole_step import model_of  # noqa: PLC0415

    bench_args = vllm_bench.parse_args(["--out", "/dev/null", "--preset", args.preset, "--skip-sleep"])
    model = model_of(args.preset)
    profile = json.loads(PROFILE.read_text())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    res = {"preset": args.preset, "commit": commit,
           "command": f"python3 scripts/h200/vllm_bench.py --preset {args.preset} --skip-sleep",
           "grid": bench_args.decode_grid, "prefill_lens": bench_args.prefill_lens,
           "hypotheses": {name: predict(p, model, bench_args.decode_grid, bench_args.prefill_lens)
                          for name, p in hypotheses(profile).items()}}
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    names = list(res["hypotheses"])
    print(f"{'row':42s} " + " ".join(f"{n:>22s}" for n in names))
    for row in res["hypotheses"]["profile"]["wall_s"]:
        print(f"{row:42s} " + " ".join(f"{res['hypotheses'][n]['wall_s'][row]:22.4f}" for n in names))
    for row in res["hypotheses"]["profile"]["mean_decode_step_s"]:
        print(f"{'step ' + row:42s} " + " ".join(
            f"{1e3 * res['hypotheses'][n]['mean_decode_step_s'][row]:20.2f}ms" for n in names))
    return 0


if __name__ == "__main__":
    sys.exit(main())
