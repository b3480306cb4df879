"""The simulator's vLLM decode step against the ML.ENERGY leaderboard's (H100 and B200, dense and MoE, 8B-235B): a held-out check.

    python bench/mlenergy_decode.py                  # every row: measured median ITL vs the modelled step
    python bench/mlenergy_decode.py --max-batch 16   # only the small batches (the weights' streaming)
    python bench/mlenergy_decode.py --hypothesis rate_only    # the decode step as the presets had it before

Data: `bench/data/chips/mlenergy_vllm_decode.json` (extracted from the leaderboard's files; the source is named
there). Nothing was fitted on it. Each row is a vLLM server at steady state with `max_num_seqs` requests, so its
median inter-token latency is one decode step of about `avg_batch_size` requests (the median step: the steps that also
prefill a newcomer are the minority below ~32 requests). The modelled step is `IterationModel.time` of the row's model,
preset and parallelism at that batch, each request's context the prompt plus half its mean output. The prompts'
length is not published (LM Arena conversations: short, multi-turn ones longer): the KV read it sets weighs at large
batches only, so the table gives the step at two prompt lengths, and its summary is taken over the small batches,
where the weights dominate the step.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DATA = ROOT / "bench" / "data" / "chips" / "mlenergy_vllm_decode.json"
PRESETS = {"H100": "H100-SXM-80G", "B200": "B200"}
PROMPTS = (128, 1024)
#: Other decode steps than the presets', efficiency fields per GPU kind (rows of other kinds keep their preset).
#: rate_only: the presets until the twenty-ninth session, the weights streamed at one fitted rate with no fixed part
#: (h200_notes.md; the fixed part and the copy rate of fit_whole_step.py section 0a replaced it). per_step: the
#: twenty-ninth session's fixed part, 1.78 ms per step whatever the depth (per layer since the thirtieth).
_NO_FIXED = {"iteration_overhead_s": 0.0, "iteration_layer_s": 0.0}
_PER_STEP = {"iteration_overhead_s": 1.78e-3, "iteration_layer_s": 0.0}
HYPOTHESES = {"rate_only": {"H100": {"decode_weight_bw_util": 0.5506, **_NO_FIXED},
                            "B200": {"decode_weight_bw_util": 0.4289, **_NO_FIXED}},
              "per_step": {"H100": _PER_STEP, "B200": _PER_STEP}}


def modelled_step(row: dict, prompt: int, hypothesis: str | None = None) -> float:
    """Seconds of one decode step of the row's batch on its preset (vLLM's engine model, CUDA graphs), the preset's
    efficiency changed as `hypothesis` (a HYPOTHESES key) says for the row's GPU kind."""
    import dataclasses

    from vime.sim.engine import EngineSettings, IterationModel
    from vime.sim.hardware import load_hardware
    from vime.sim.models import load_model

    hw = load_hardware(PRESETS[row["gpu"]])
    change = HYPOTHESES[hypothesis].get(row["gpu"]) if hypothesis else None
    if change:
        hw = dataclasses.replace(hw, efficiency=dataclasses.replace(hw.efficiency, **change))
    width = max(row["tp"], row["ep"])
    settings = EngineSettings(tp=width, expert_parallel=row["ep"] > 1, max_num_seqs=max(8, row["max_num_seqs"]),
                              max_model_len=8192, **hw.engine_overrides())
    im = IterationModel.build(hw, load_model(row["vime_model"]), settings)
    b = max(1, round(row["avg_batch_size"]))
    ctx = b * (prompt + row["avg_output_len"] / 2)
    return im.time(b, ctx, ctx, seqs=b)


def table(rows: list[dict], hypothesis: str | None = None) -> list[dict]:
    """Each row with its modelled steps (ms) and errors (modelled − measured) / measured at each prompt length."""
    out = []
    for row in rows:
        got = row["median_itl_ms"]
        steps = {p: 1e3 * modelled_step(row, p, hypothesis) for p in PROMPTS}
        out.append(row | {"modelled_ms": steps, "error": {p: (s - got) / got for p, s in steps.items()}})
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-batch", type=int, default=None, help="only rows with max_num_seqs up to this")
    ap.add_argument("--gpu", choices=sorted(PRESETS), default=None)
    ap.add_argument("--hypothesis", choices=sorted(HYPOTHESES), default=None,
                    help="a candidate decode step instead of the presets' (HYPOTHESES)")
    a = ap.parse_args(argv)
    data = json.loads(DATA.read_text())
    rows = [r for r in data["rows"] if (a.max_batch is None or r["max_num_seqs"] <= a.max_batch)
            and (a.gpu is None or r["gpu"] == a.gpu)]
    res = table(rows, a.hypothesis)
    print(f"{'model':24s} {'gpu':5s} {'par':9s} {'B':>5s} {'measured':>9s} " +
          " ".join(f"{'P=' + str(p):>17s}" for p in PROMPTS))
    for r in res:
        par = f"{r['num_gpus']}g tp{r['tp']}" + (f" ep{r['ep']}" if r["ep"] > 1 else "")
        print(f"{r['vime_model']:24s} {r['gpu']:5s} {par:9s} {r['avg_batch_size']:5.0f} {r['median_itl_ms']:7.2f}ms " +
              " ".join(f"{r['modelled_ms'][p]:7.2f} ({100 * r['error'][p]:+6.1f}%)" for p in PROMPTS))
    from vime.sim.models import load_model

    small = [r for r in res if r["max_num_seqs"] <= 16]
    moe = {name: load_model(name).is_moe for name in {r["vime_model"] for r in res}}
    for gpu in sorted({r["gpu"] for r in small}):
        for dense in (True, False):
            errs = [r["error"][PROMPTS[0]] for r in small if r["gpu"] == gpu and moe[r["vime_model"]] != dense]
            if errs:
                print(f"{gpu} {'dense' if dense else 'MoE'} rows at <= 16 requests: median {100 * statistics.median(errs):+.1f} %, "
                      f"{100 * min(errs):+.1f} .. {100 * max(errs):+.1f} % over {len(errs)}")
    # the large batches, where the linear layers' FLOPs meet their weights (the GEMMs' roofline); the prompts' length
    # is not published, so both bracketing assumptions
    large = [r for r in res if r["avg_batch_size"] >= 64]
    for gpu in sorted({r["gpu"] for r in large}):
        for dense in (True, False):
            rows = [r for r in large if r["gpu"] == gpu and moe[r["vime_model"]] != dense]
            if rows:
                print(f"{gpu} {'dense' if dense else 'MoE'} rows at >= 64 requests ({len(rows)}): median " + ", ".join(
                    f"{100 * statistics.median(r['error'][p] for r in rows):+.1f} % (P={p})" for p in PROMPTS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
