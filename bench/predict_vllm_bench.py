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

Every decode row also carries vLLM's step as its /metrics count it (the mean inter-token latency of the row
scheduled as vLLM schedules it, `compare_calibration.decode_schedule`: at large B the early requests decode beside
the later prompts' prefill chunks, so the mean latency is well above a pure decode step).

    python bench/predict_vllm_bench.py --preset qwen3-0.6b --out bench/data/vllm_bench_s13/predicted_06b.json
    python bench/predict_vllm_bench.py --compare bench/data/vllm_bench_s13/predicted_06b.json \
        bench/data/vllm_bench_s13/vllm_06b_host1.json [more runs]   # measured vs each hypothesis, error %; rows
                                                                    # `step B=..`: vLLM's own step (its ITL)
    python bench/predict_vllm_bench.py --fit bench/data/vllm_bench_s13/vllm_06b_host*.json   # the lockstep fit

The lockstep fit: a decode row of B requests × n tokens (all finish together) takes
(n − 1) · a + B · n · k + B · r0: a step's fixed part, a cost per request and token, one per response. The
CPU step's per-request part and the API server's per-token building of the responses both scale as B · n in
such a grid, so no wall-clock grid of lockstep requests can tell them apart — only k, their sum, is measured
(a whole step's first and last response times split it).
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

from compare_calibration import _iter_model, decode_run_seconds, decode_schedule, prefill_seconds  # noqa: E402

from vime.sim.engine import EngineSettings  # noqa: E402
from vime.sim.hardware import HardwareSpec  # noqa: E402

PROFILE = ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G-measured.json"
PROMPT = 128  # vllm_bench.py's decode prompts
HOSTS = {  # candidate CPU steps (efficiency fields), h200_notes.md twelfth session
    "fast_host": {"host_step_s": 2.5e-3, "host_step_per_seq_s": 27e-6, "iteration_overhead_s": 0.0,
                  "iteration_layer_s": 0.0},
    "median_host": {"host_step_s": 3.85e-3, "host_step_per_seq_s": 30.4e-6, "iteration_overhead_s": 0.0,
                    "iteration_layer_s": 0.0},
}
#: The lockstep fit's k (CPU step per request + response building per token) at the fastest host measured,
#: ~60 us, split as the s13 whole steps' first/last response times split it (h200_notes.md, thirteenth session).
K_SPLIT = {"efficiency": {**HOSTS["fast_host"], "host_step_per_seq_s": 30e-6},
           "engine": {"response_per_token_s": 30e-6}}
#: The same without the fixed part of building a response: the benches' lockstep fits put it at 0 ± 3.6 ms (not 6.4).
K_SPLIT_R0 = {"efficiency": K_SPLIT["efficiency"], "engine": {**K_SPLIT["engine"], "response_per_request_s": 0.0}}


#: The 0.6B vLLM-alone benches (host-bound at every batch: the CPU step shows whole), three hosts, two leases.
BENCH_06B = ("vllm_bench_s13/vllm_06b_host1.json", "vllm_bench_s13/vllm_06b_host2.json", "vllm_bench_s14/vllm_06b_s14.json")
#: Rows whose responses queue at the API server (below this batch the first-to-last spread is not one response per build:
#: B=16 × 256 spread 0.86 ms per response on the ninth lease's bench, B ≥ 64 6.2–8.3 ms).
RESPONSE_MIN_BATCH = 64


def response_fit(runs: list[dict]) -> tuple[float, float]:
    """(per response, per token) of the API server's building of a response, least squares over the bench rows that
    record their first and last response times: (last − first) / (B − 1) against the response length, the fixed part
    held ≥ 0 (a negative intercept refits through the origin)."""
    pts = [((r["last_response_s"] - r["first_response_s"]) / (r["batch"] - 1), r["max_tokens"])
           for run in runs for r in run["phases"]["decode"]
           if "first_response_s" in r and r["batch"] >= RESPONSE_MIN_BATCH]
    if len({n for _, n in pts}) < 2:
        raise ValueError("the response fit needs rows of two lengths with first/last response times (vllm_bench.py ≥ aeedc2f)")
    n = len(pts)
    mx, my = sum(x for _, x in pts) / n, sum(y for y, _ in pts) / n
    slope = sum((x - mx) * (y - my) for y, x in pts) / sum((x - mx) ** 2 for _, x in pts)
    icpt = my - slope * mx
    if icpt < 0:
        icpt, slope = 0.0, sum(x * y for y, x in pts) / sum(x * x for _, x in pts)
    return float(f"{icpt:.3g}"), float(f"{slope:.3g}")


def fit_cpu_step(profile: dict) -> tuple[tuple[float, float], dict]:
    """The response building (per response, per token) from the 0.6B benches' own first/last response times, and
    `profile` with vLLM's CPU step refitted under it on those benches (all three hosts, least squares; calibrate.py's
    fit). bench/fit_whole_step.py section 7 holds the committed profile to this fit."""
    import calibrate  # noqa: PLC0415 - bench/calibrate.py: the CPU step's fit
    from fit_whole_step import model_of  # noqa: PLC0415

    runs = [json.loads((ROOT / "bench" / "data" / f).read_text()) for f in BENCH_06B]
    response = response_fit(runs)
    raw = {"phases": {"decode": [r for run in runs for r in run["phases"]["decode"]]}}
    p = copy.deepcopy(profile)
    calibrate._fit_host(p, raw, f"the 0.6B benches {', '.join(BENCH_06B)}", response, model=model_of("qwen3-0.6b"),
                        hold_overhead=True)
    return response, p


def bench_fit(gpu_profile: dict) -> dict:
    """The profile with the GPU terms, its CPU step and response building as `fit_cpu_step` gives them: the candidate
    that became the committed profile in the fourteenth session."""
    response, p = fit_cpu_step(gpu_profile)
    p["engine"].update({"response_per_request_s": response[0], "response_per_token_s": response[1]})
    return p


def hypotheses(profile: dict, with_fit: bool = False) -> dict[str, dict]:
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
    for name, change in (("k_split", K_SPLIT), ("k_split_r0", K_SPLIT_R0)):
        p = copy.deepcopy(gpu)
        for section, fields in change.items():
            p[section].update(fields)
        out[f"gpu_terms+{name}"] = p
    if with_fit:
        out["gpu_terms+bench_fit"] = bench_fit(gpu)
    return out


def predict(profile: dict, model, grid: list[tuple[int, int]], prefill_lens: list[int]) -> dict:
    hw = HardwareSpec.from_dict(profile, origin="hypothesis")
    im = _iter_model(hw, model)
    s = EngineSettings(max_model_len=20480, **hw.engine_overrides())
    fe = s.request_overhead_s
    rows = {"lone request, 16 tokens, max_tokens 1":
            im.first_time(16, 0, 16 * 17 / 2, seqs=1) + fe + s.response_seconds(1)}
    steps, ttfts = {}, {}
    for b, n in grid:
        rows[f"generate B={b} x {n} tokens"] = decode_run_seconds(
            im, b, PROMPT, n, s.response_per_token_s, s.response_per_request_s) + fe
        # vLLM's step as its /metrics count it: the mean inter-token latency, prefill-mixed steps included; and the
        # mean time to the first token of requests that all arrive at once
        _, steps[f"B={b} x {n}"], ttfts[f"B={b} x {n}"] = decode_schedule(im, b, PROMPT, n)
    for n in prefill_lens:
        rows[f"prefill {n} tokens, max_tokens 1"] = prefill_seconds(im, n) + fe + s.response_seconds(1)
    return {"wall_s": rows, "mean_decode_step_s": steps, "mean_ttft_s": ttfts}


def measured_rows(run: dict) -> dict[str, float]:
    """A vllm_bench.py result as the prediction's row names -> seconds (prefill: the median of its repeats)."""
    ph = run["phases"]
    rows = {"lone request, 16 tokens, max_tokens 1": ph["frontend"]["summary"]["gen1_s"]["median"]}
    for r in ph.get("decode", []):
        rows[f"generate B={r['batch']} x {r['max_tokens']} tokens"] = r["wall_s"]
    for n in sorted({r["prompt_len"] for r in ph.get("prefill", [])}):
        walls = sorted(r["wall_s"] for r in ph["prefill"] if r["prompt_len"] == n)
        rows[f"prefill {n} tokens, max_tokens 1"] = walls[len(walls) // 2]
    return rows


def lockstep_fit(run: dict, fixed_s: float = 0.02) -> dict[str, float]:
    """(a, k, r0) of the module docstring's lockstep model, relative least squares over `run`'s decode rows
    (each less `fixed_s`: the prefill and the front end), and the largest relative error of the fit."""
    import numpy as np  # noqa: PLC0415 - only this analysis needs it

    rows = run.get("phases", {}).get("decode", [])
    if len({(r["batch"], r["max_tokens"]) for r in rows}) < 3:
        raise ValueError(f"{len(rows)} decode rows: the lockstep fit needs 3 shapes at least (a run with --skip-decode?)")
    a = np.array([[r["max_tokens"] - 1, r["batch"] * r["max_tokens"], r["batch"]] for r in rows], float)
    y = np.array([r["wall_s"] - fixed_s for r in rows])
    x, *_ = np.linalg.lstsq(a / y[:, None], np.ones_like(y), rcond=None)
    return {"step_s": float(x[0]), "per_request_token_s": float(x[1]), "per_response_s": float(x[2]),
            "max_error": float(np.max(np.abs(a @ x - y) / y))}


def compare(pred_path: str, run_paths: list[str]) -> int:
    pred = json.loads(Path(pred_path).read_text())
    names = list(pred["hypotheses"])
    for path in run_paths:
        meas = measured_rows(json.loads(Path(path).read_text()))
        print(f"--- {path} against {pred_path} (predicted at {pred['commit']}); error % = (predicted - measured) / measured")
        print(f"{'row':40s} {'measured':>9s} " + " ".join(f"{n[:21]:>21s}" for n in names))
        errs: dict[str, list[float]] = {n: [] for n in names}
        for row, m in meas.items():
            cells = []
            for n in names:
                p = pred["hypotheses"][n]["wall_s"].get(row)
                if p is None:
                    cells.append(f"{'-':>21s}")
                    continue
                e = 100 * (p - m) / m
                errs[n].append(abs(e))
                cells.append(f"{p:12.4f} {e:+7.1f} %")
            print(f"{row:40s} {m:9.4f} " + " ".join(cells))
        print(f"{'largest |error|':50s} " + " ".join(f"{max(errs[n]):19.1f} %" for n in names))
        for r in json.loads(Path(path).read_text())["phases"].get("decode", []):
            # vLLM's own step (its inter-token latency), beside each hypothesis's mean decode step of the row
            key = f"B={r['batch']} x {r['max_tokens']}"
            if not r.get("itl_mean_s") or key not in pred["hypotheses"][names[0]].get("mean_decode_step_s", {}):
                continue
            m = r["itl_mean_s"]
            print(f"{'step ' + key:40s} {1e3 * m:7.2f}ms " + " ".join(
                f"{1e3 * p:10.2f}ms {100 * (p - m) / m:+7.1f} %"
                for p in (pred["hypotheses"][n]["mean_decode_step_s"][key] for n in names)))
            if r.get("ttft_mean_s") and key in pred["hypotheses"][names[0]].get("mean_ttft_s", {}):
                m = r["ttft_mean_s"]  # the engine's; the model's requests all arrive at once
                print(f"{'ttft ' + key:40s} {1e3 * m:7.1f}ms " + " ".join(
                    f"{1e3 * p:10.1f}ms {100 * (p - m) / m:+7.1f} %"
                    for p in (pred["hypotheses"][n]["mean_ttft_s"][key] for n in names)))
        fits = {"measured": lockstep_fit(json.loads(Path(path).read_text()))}
        for n in names:  # the same fit of each hypothesis's rows: where the model's k stands
            walls = pred["hypotheses"][n]["wall_s"]
            fits[n] = lockstep_fit({"phases": {"decode": [
                {"batch": b, "max_tokens": t, "wall_s": walls[f"generate B={b} x {t} tokens"]} for b, t in pred["grid"]]}})
        print("lockstep fit (step ms, per request and token us): " + ", ".join(
            f"{n} {1e3 * f['step_s']:.2f} / {1e6 * f['per_request_token_s']:.1f}" for n, f in fits.items()))
    return 0


#: The one-GPU vLLM-alone benches no fit here reads, by preset: the 4B's (four on the first lease, one on the eighth,
#: one on the tenth) and the tenth lease's two 0.6B benches (run after the fit of BENCH_06B).
HELD_OUT_BENCHES = {"h200_vllm_0.25.1.json": "qwen3-4b", "h200_vllm_0.25.1_b0_keepalive_failure.json": "qwen3-4b",
                    "h200_vllm_0.25.1_b1.json": "qwen3-4b", "h200_vllm_0.25.1_b2.json": "qwen3-4b",
                    "vllm_bench_s13/vllm_4b_host1.json": "qwen3-4b", "vllm_bench_s15/vllm_4b_s15.json": "qwen3-4b",
                    "vllm_bench_s15/vllm_06b_s15.json": "qwen3-0.6b", "vllm_bench_s15/vllm_06b_s15b.json": "qwen3-0.6b",
                    "vllm_bench_s16/vllm_06b_s16.json": "qwen3-0.6b"}
HELD_OUT_NAMES = ("profile", "gpu_terms+k_split", "gpu_terms+bench_fit")


def held_out(out: Path) -> int:
    """The candidate profiles against what no fit of theirs read: HELD_OUT_BENCHES' decode rows and every whole step of
    bench/fit_whole_step.py's RUN_SPECS (rollout and step, mean of the later steps). Writes `out` (JSON), prints a table."""
    import statistics
    import tempfile

    import fit_whole_step  # noqa: PLC0415

    hyps = hypotheses(json.loads(PROFILE.read_text()), with_fit=True)
    hyps = {n: hyps[n] for n in HELD_OUT_NAMES}
    res: dict = {"benches": {}, "whole_steps": {}}
    for f, preset in HELD_OUT_BENCHES.items():
        model = fit_whole_step.model_of(preset)
        run = json.loads((ROOT / "bench" / "data" / f).read_text())
        grid = [(r["batch"], r["max_tokens"]) for r in run["phases"].get("decode", [])]
        meas = {f"generate B={r['batch']} x {r['max_tokens']} tokens": r["wall_s"] for r in run["phases"].get("decode", [])}
        preds = {n: predict(p, model, grid, [])["wall_s"] for n, p in hyps.items()}
        res["benches"][f] = {row: {"measured": m, **{n: preds[n][row] for n in hyps}} for row, m in meas.items()}
    with tempfile.TemporaryDirectory() as d:
        for run in fit_whole_step.RUN_SPECS:
            row = {}
            for key in ("perf/rollout_time", "perf/step_time"):
                row[key] = {"measured": fit_whole_step.measured(run, key)}
            for n, p in hyps.items():
                sim = fit_whole_step.simulate(run, p, Path(d))
                for key in row:
                    row[key][n] = sim[key]
            res["whole_steps"][run] = row
    out.write_text(json.dumps(res, indent=1) + "\n")

    def err(p: float, m: float) -> float:
        return 100 * (p - m) / m

    print(f"{'held out':62s} " + " ".join(f"{n:>20s}" for n in hyps))
    summary: dict[str, list[float]] = {n: [] for n in hyps}
    for f, rows in res["benches"].items():
        for row, v in rows.items():
            print(f"{f[:28] + ' ' + row:62s} " + " ".join(f"{err(v[n], v['measured']):+19.1f}%" for n in hyps))
            for n in hyps:
                summary[n].append(abs(err(v[n], v["measured"])))
    for run, keys in res["whole_steps"].items():
        for key, v in keys.items():
            print(f"{run[:44] + ' ' + key.split('/')[1]:62s} " + " ".join(f"{err(v[n], v['measured']):+19.1f}%" for n in hyps))
            for n in hyps:
                summary[n].append(abs(err(v[n], v["measured"])))
    print(f"{'median |error| over ' + str(len(summary['profile'])) + ' rows':62s} "
          + " ".join(f"{statistics.median(summary[n]):19.1f}%" for n in hyps))
    print(f"{'rows within 15 %':62s} " + " ".join(f"{sum(e <= 15 for e in summary[n]):20d}" for n in hyps))
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", help="vllm_bench.py's --preset (qwen3-0.6b, qwen3-4b)")
    ap.add_argument("--out", help="write the predictions here")
    ap.add_argument("--profile", default=str(PROFILE),
                    help="the hardware profile the bench runs on (default: the measured H200's)")
    ap.add_argument("--bench-args", default="",
                    help="extra vllm_bench.py arguments the run will be given (recorded in the predictions' command)")
    ap.add_argument("--compare", nargs="+", metavar=("PREDICTED", "RUN"),
                    help="a predictions file, then vllm_bench.py results: measured vs each hypothesis")
    ap.add_argument("--fit", nargs="+", metavar="RUN", help="vllm_bench.py results: the lockstep fit of each")
    ap.add_argument("--held-out", metavar="OUT", help="the committed profile, k_split and the bench fit against the held-out "
                                                      "benches and every whole step (none fitted on them); JSON to OUT")
    args = ap.parse_args()
    if args.held_out:
        return held_out(Path(args.held_out))
    if args.fit:
        for path in args.fit:
            try:
                f = lockstep_fit(json.loads(Path(path).read_text()))
            except ValueError as e:
                print(f"{path}: {e}")
                continue
            print(f"{path}: step {1e3 * f['step_s']:.2f} ms, per request and token {1e6 * f['per_request_token_s']:.1f} us, "
                  f"per response {1e3 * f['per_response_s']:+.2f} ms (largest error {100 * f['max_error']:.1f} %)")
        return 0
    if args.compare:
        if len(args.compare) < 2:
            ap.error("--compare takes a predictions file and at least one vllm_bench.py result")
        return compare(args.compare[0], args.compare[1:])
    if not (args.preset and args.out):
        ap.error("--preset and --out (or --compare)")
    import vllm_bench  # noqa: PLC0415 - scripts/h200: its grid, as the run will use it
    from fit_whole_step import model_of  # noqa: PLC0415

    extra = args.bench_args.split()
    bench_args = vllm_bench.parse_args(["--out", "/dev/null", "--preset", args.preset, "--skip-sleep", *extra])
    model = model_of(args.preset)
    profile = json.loads(Path(args.profile).read_text())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    res = {"preset": args.preset, "commit": commit, "profile": Path(args.profile).name,
           "command": " ".join(["python3 scripts/h200/vllm_bench.py --preset", args.preset, "--skip-sleep", *extra]),
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
