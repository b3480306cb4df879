"""The simulator's terms fitted on the H200 whole RL steps of 2026-12-02 (issue 17), each on named data, the rest held out.

    python bench/fit_whole_step.py           # print the fits and the profile/settings values they give
    python bench/fit_whole_step.py --check   # exit 1 unless the committed values are those fits

Each term is structural (one value for every model, batch and run) and fitted on the data named here:

0a. vLLM's decode step, its GPU part: the weights stream at the GPU's measured copy rate (efficiency.decode_weight_bw_util
   = 1, structural: the H100's 8B and 4B vLLM-alone benches, same depth, differ by their weights at 0.98 of its copy
   rate, bench/data/vllm_bench_s29) beside a fixed part per model layer (efficiency.iteration_layer_s; structural: the
   H100's dense 4B, 8B, 14B and 32B one-request steps fit a per-layer part at the copy rate within 2.2 %, a per-step
   part only below it, bench/data/vllm_bench_s30), solved so that the one-request rows (B=1, GPU-bound: the CPU step
   hides under it) of the H200's 4B vLLM-alone benches (FIXED_STEP_BENCHES) err 0 at their median. Held out: their
   rows at 16+ requests, every whole step, the H100 benches, ML.ENERGY's rows (bench/mlenergy_decode.py). Until the
   twenty-ninth session the weights streamed at 0.54 of the copy rate with no fixed part, fitted on the 4B's shapes
   alone, which cannot tell the two apart (the 8B was 18 % slow); in the twenty-ninth the fixed part was per step
   (1.78 ms: the 32B's step 8.5 % short).
0. vLLM's decode step where it is GPU-bound (/metrics of the whole steps): the attention's KV read rate and the sampler
   per logit, by least squares, under 0a's terms.
1b. vLLM's pool mapping beyond its cheap share (EngineSettings.wake_spill_share, wake_spill_s_per_gib, and the
   cheap rate per GiB): least squares over every mapping call of bench/vllm_cumem_probe.py's session-18 runs
   (bench/data/vmm_sweep/h200_s18_*.json: 47-124 GiB of KV in 28-112 tensors, 0.01-20 GiB of weights mapped first,
   alone or beside a neighbour's 30 GiB), the share (of the GPU less other processes' memory) by a grid search.
   Held out: every whole step's onload KV and vLLM alone's KV wake.
1c. Memory another process handed back and vLLM's pool maps soon after (EngineSettings.wake_ready_s_per_gib): the
   driver makes it ready for another process in the background at a rate per GiB from the hand-back; a wake that maps
   beyond 1b's share of the room less what is not ready yet waits for all of it. Closed form on the session-19 probe
   runs where the neighbour (the trainer) hands back 40-108 GiB 0-0.1 s before the KV wake (bench/data/vmm_sweep/
   h200_s19_*.json), each against the same pool beside the neighbour's leftover alone. Held out: vime's order (handed
   back before the weights' wake, a weight sync's time before the KV wake), longer delays, the MoE, a small KV.
1. vLLM's wake (EngineSettings.wake_call_s, wake_per_gib_s, wake_per_tensor_s): the cost per GiB is 1b's cheap
   rate less the driver's create_map; the call's fixed cost from vLLM alone's level-2 weights wake (7.5 GiB;
   bench/data/h200_vllm_0.25.1*.json, no trainer on the GPU); the level-1 wake of the weights (copied back from the
   host) then the per-tensor restore.
2. (Until session 18, vmm.shared_map_s_per_gib, 1.6 ms per GiB mapped on a GPU another process used, solved on the
   0.6B whole step's onload KV; 1b's structure replaced it: the neighbour's memory acts through the free share.)
3. (Until 2026-12-02, efficiency.hf_convert_bytes_per_s = 1.5 GB/s, fitted on the 4B run's export: the trainer
   split the fused QKV weights into fresh pageable host tensors. The trainer now cuts them on the GPU
   (vime.real.weights.ipc.DeviceCut) and the term is gone; the 2026-12-02 exports below were made the old way.)
3b. The trainer's host work around an export (efficiency.export_call_s once, export_per_tensor_s per HF tensor):
   closed form on what the 0.6B and MoE exports of the second 2026-12-02 lease measured beyond the simulated
   copies. Held out: that lease's 4B export.
3c. The trainer's MoE experts (efficiency.train_host_s_per_expert, the CPU floor per routed expert per micro-batch,
   and train_expert_gemm_efficiency, the experts' GEMMs against a dense GEMM): vime's local-spec Megatron runs a MoE
   layer's experts one by one (SequentialMLP), and their GPU time runs under the same CPU floor as the rest of the pass.
   The floor solved on the host-bound micro-batch-2 run (1152 tokens a sequence), the efficiency on the GPU-bound
   micro-batch-4 run, alternately. Held out: the fourth lease's two 640-token runs (micro-batch 2 and 4). History:
   until the fourth lease one floor per pass fitted on the micro-batch-4 run alone, which the micro-batch-2 run failed
   (+42 %); then the 640-token micro-batch-2 run (pre-registered) showed no token dependence at micro-batch 2, a floor
   per pass and per sequence was fitted on three runs, and the blind micro-batch-4 run at 640 tokens failed it (+52 %):
   the time is max(floor, GPU), GPU-bound only at 4 × 1152 tokens. This structure was chosen after all four were seen.
5. The engine's side of an IPC weight bucket (EngineSettings.ipc_open_s per bucket beside http_rtt_s, and
   load_per_tensor_s per tensor, until then an estimate of 20 us): closed form on vLLM alone (16 buckets of 399
   tensors) and the MoE whole step of the second 2026-12-02 lease (6 buckets, 1,575 tensors). Held out: every dense
   whole step's perf/update_weights_load_time (2..8 buckets of 311 or 399 tensors).
6. Process memory outside the allocators (software.trainer_process_bytes beyond the CUDA context, and
   engine.outside_budget_bytes (EngineSettings) beyond vLLM's --gpu-memory-utilization budget and, where they sit beside
   it (EngineSettings.graphs_beside_budget, vLLM 0.25.1), beyond its CUDA context and graphs): the per-process GPU
   samples (gpu_procs.csv, nvidia-smi) of the third 2026-12-02 lease at the GPU's fullest moment, the trainer
   asleep; the trainer's own count of what its allocator holds then (memory/asleep_* in train.jsonl) is taken
   off. Fitted on the Qwen3-4B `all` run; held out: the MoE run and the 4B run with the trainer resident.
7. The API server's building of the responses (EngineSettings.response_per_request_s + response_per_token_s per token),
   vLLM's CPU step refitted beside it (efficiency.host_step_s, host_step_per_seq_s; 0a's fixed part held) and the front
   end's fixed latency (EngineSettings.request_overhead_s): vLLM builds each finished response in its one API-server
   process, one at a time, so 256 responses finished together reach the client over seconds. Closed form on the
   client's first-to-last response spreads of the fourth lease's Qwen3-4B run (1024 tokens) and MoE micro-batch-2 run
   (512 tokens); then the step's three terms by bench/calibrate.py's least squares over the vLLM-alone decode runs with
   that cost in them (the two are collinear there); then request_overhead_s from the lone request of the vLLM-alone
   runs less its modelled first step and response. Held out: the 0.6B and MoE micro-batch-4 spreads, vLLM's own
   decode steps in the whole steps (section 8), every whole step's rollout. (Fitting the host terms on the vLLM-alone
   runs and the whole steps' decode steps together was tried: it drove the CPU step's fixed part to 0.7 ms, which
   nothing at small batches bounds and the 1×L20 published step contradicts; not kept.)
8. A check, not a fit: vLLM's decode step at 256 requests against the requests' mean context, per 0.25 s /metrics
   interval of every rollout of the fourth lease (inter-token latency from the histogram), beside the IterationModel:
   where the step grows with context the GPU bounds it, and the slope is the attention's KV read rate.
9. The trainer's sleep and wake beyond its allocator (efficiency.state_check_per_tensor_s, state_check_bytes_per_s,
   released_wake_s_per_gib, released_wake_max_s): vime's check that a wake restored the state (a sum of each parameter,
   fp32 main copy and Adam moment at the sleep and after the wake) in closed form on the 0.6B's and the 4B's sleeps
   (the timed parts the actor logs, the tenth lease, PARTS_RUNS); the wake onto memory another process just released on
   bench/colocated_resume.py's rows (bench/data/colocated_resume/). Fitted before 3b and 3c, which simulate with it.
   Held out: the whole steps' resumes beyond the allocator model and their wakes' checks, every other whole step's
   perf/sleep_time and perf/wake_up_time.
4. A check, not a fit: the trainer's CPU floor per layer that the train phase of the b64_r512 run (128
   micro-batches of 2,560 tokens, host-bound) implies, beside the preset's, fitted on 2026-11-29 on
   Megatron steps measured alone (efficiency.train_host_{fwd,bwd}_s_per_layer, their ratio kept).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import io
import json
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts" / "h200_train"))

DATA = ROOT / "bench" / "data"
TOTAL_GIB = 139.80072021484375  # the H200's device memory as cudaMemGetInfo reports it (bench/data/vmm_sweep)
PROFILE = ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G-measured.json"  # the maintained preset
RUNS = DATA / "h200_train_e2e"
GIB = 1 << 30
#: The MoE whole step the bucket terms are fitted on (the dense runs' loads are held out).
MOE_RUN = "qwen3-30b-a3b-4l-cumem-1g_2026-12-02s6"
#: The MoE whole steps the expert terms are fitted on: host-bound (micro-batch 2 × 1152 tokens), GPU-bound (4 × 1152).
MOE_FIT_RUNS = ("qwen3-30b-a3b-4l-cumem-1g_mbs2_2026-12-02s7", MOE_RUN)
#: vLLM 0.25.1 alone on the H200, one GPU (bench/data/h200_notes.md)
VLLM_RUNS = ("h200_vllm_0.25.1.json", "h200_vllm_0.25.1_b1.json", "h200_vllm_0.25.1_b2.json")


#: bench/vllm_cumem_probe.py's call-by-call runs (session 18) that section 1b fits on
SPILL_RUNS = ("h200_s18_calls_47.json", "h200_s18_calls_82_l1.json", "h200_s18_calls_82_l2.json",
              "h200_s18_calls_100.json", "h200_s18_calls_124.json", "h200_s18_calls_124_w0.json",
              "h200_s18_calls_124_x112.json", "h200_s18_calls_82_w20.json", "h200_s18_raw_124.json",
              "h200_s18_neighbour30_82.json")


def spill_calls() -> list[tuple[str, int, float, float, float, float]]:
    """Every KV mapping call of the probe runs: (run, cycle, GiB it mapped, GiB the pool mapped before it since the
    sleep, GiB of the GPU not held by other processes, seconds). The probe's own process holds what the runs without
    a neighbour did not find free; a neighbour holds the rest."""
    runs = {name: json.loads((DATA / "vmm_sweep" / name).read_text()) for name in SPILL_RUNS}
    alone = max(c["free_before_wake_gib"] for r in runs.values() if not r.get("neighbour_gib") for c in r["cycles"])
    rows = []
    for name, run in runs.items():
        per = run["size_gib"] / run["chunks"]
        for k, c in enumerate(run["cycles"]):
            before = run["weights_gib"]  # the weights are mapped first, in their own wake
            ours = TOTAL_GIB - (alone - c["free_before_wake_gib"])  # the GPU less the neighbour's share
            for t in c["wake_kv_calls_s"]:
                rows.append((name, k, per, before, ours, t))
                before += per
    return rows


def spill_over(gib: float, before: float, ours: float, share: float) -> float:
    """GiB of a mapping of `gib` (after `before` GiB) beyond `share` of `ours`."""
    return max(0.0, before + gib - max(before, share * ours))


def spill_terms() -> tuple[dict[str, float], list[str]]:
    """Cheap rate and spill rate by least squares at each share of a 0.01 grid; the share with the least residual."""
    rows = spill_calls()

    def solve(share: float) -> tuple[float, float, float]:
        # t = cheap·gib + spill·over (normal equations of two unknowns)
        a = [(g, spill_over(g, b, f, share)) for _, _, g, b, f, _ in rows]
        y = [t for *_, t in rows]
        s11 = sum(x * x for x, _ in a)
        s12 = sum(x * z for x, z in a)
        s22 = sum(z * z for _, z in a)
        r1 = sum(x * t for (x, _), t in zip(a, y, strict=True))
        r2 = sum(z * t for (_, z), t in zip(a, y, strict=True))
        det = s11 * s22 - s12 * s12
        if s22 == 0 or det <= 1e-12 * s11 * s22:
            return math.inf, 0.0, 0.0  # no call reaches this share: the spill is not identified
        cheap, spill = (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det
        return sum((cheap * x + spill * z - t) ** 2 for (x, z), t in zip(a, y, strict=True)), cheap, spill

    share = min((solve(k / 100)[0], k / 100) for k in range(30, 100))[1]
    _, cheap, spill = solve(share)
    lines = [f"{len(rows)} calls of {len(SPILL_RUNS)} runs; cheap {cheap * 1e3:.3f} ms/GiB, beyond {share:.2f} of the GPU "
             f"less other processes' memory {spill * 1e3:.2f} ms/GiB"]
    wakes: dict[str, dict[int, list[float]]] = {}  # per run and cycle: [measured, modelled] seconds of the KV wake
    for name, k, g, b, f, t in rows:
        w = wakes.setdefault(name, {}).setdefault(k, [0.0, 0.0])
        w[0] += t
        w[1] += cheap * g + spill * spill_over(g, b, f, share)
    for name, cycles in wakes.items():
        run = json.loads((DATA / "vmm_sweep" / name).read_text())
        g, m = (statistics.median(w[i] for w in cycles.values()) for i in (0, 1))
        lines.append(f"{name:32s} {run['size_gib']:g} GiB x{run['chunks']} after {run['weights_gib']:g} GiB, "
                     f"neighbour {run.get('neighbour_gib', 0):g}: calls {g:.3f} s, model {m:.3f} ({100 * (m - g) / g:+.1f} %) [fitted]")
    return {"wake_spill_share": share, "wake_spill_s_per_gib": float(f"{spill:.3g}"), "_cheap_s_per_gib": cheap}, lines


#: bench/vllm_cumem_probe.py's session-19 runs: another process (the neighbour) takes memory after the pool's sleep
#: and hands it back before a wake; section 1c fits on those against the same pool beside the neighbour's leftover
#: alone, and holds out the rest (vime's order, the MoE's four KV tensors, a small KV, delays longer than the work)
READY_BASELINES = {"06b": "h200_s19_06b_leftover.json", "4b": "h200_s19_4b_leftover.json",
                   "moe": "h200_s19_moe_leftover.json"}
READY_FIT_RUNS = ("h200_s19_06b_trainer.json", "h200_s19_06b_trainer_d01.json", "h200_s19_06b_cycle40.json",
                  "h200_s19_4b_trainer.json", "h200_s19_06b_vime_d0.json")
READY_HELD_OUT = ("h200_s19_06b_trainer_d05.json", "h200_s19_06b_trainer_d2.json", "h200_s19_4b_trainer_d05.json",
                  "h200_s19_06b_vime.json", "h200_s19_4b_vime.json", "h200_s19_moe_trainer.json",
                  "h200_s19_moe_vime.json", "h200_s19_small_trainer.json")


def ready_terms(share: float) -> tuple[dict[str, float], list[str]]:
    """What another process handed back is made ready in the background (EngineSettings.wake_ready_s_per_gib): per
    fitted run, the KV wake beyond its model's leftover-alone run plus the time since the hand-back, per GiB handed
    back; the mean. Each run then modelled as its baseline plus what is left of that at the KV wake, if the wake maps
    beyond `share` of the room less what is not ready (the held-out runs test both parts)."""
    def load(name: str) -> dict:
        return json.loads((DATA / "vmm_sweep" / name).read_text())

    def since(run: dict, c: dict) -> float:  # seconds from the hand-back to the KV wake
        return c.get("kv_delay_s", 0.0) + (c["wake_weights_s"] if run.get("give_back_before") == "weights" else 0.0)

    def baseline(run: dict) -> float:
        key = {28: "06b", 36: "4b", 4: "moe"}[run["chunks"]] if run["size_gib"] > 100 else None
        return statistics.median(c["wake_kv_s"] for c in load(READY_BASELINES[key])["cycles"]) if key else 0.0

    rates = []
    for name in READY_FIT_RUNS:
        run = load(name)
        rates += [(c["wake_kv_s"] - baseline(run) + since(run, c)) / run["neighbour_cycle_gib"] for c in run["cycles"]]
    rate = float(f"{statistics.fmean(rates):.3g}")
    lines = [f"{len(rates)} KV wakes of {len(READY_FIT_RUNS)} runs: {rate * 1e3:.2f} ms per GiB handed back "
             f"(per wake {min(rates) * 1e3:.2f}-{max(rates) * 1e3:.2f})"]
    for name in READY_FIT_RUNS + READY_HELD_OUT:
        run = load(name)
        got = statistics.median(c["wake_kv_s"] for c in run["cycles"])
        c = run["cycles"][0]
        # the room at the KV wake: the free memory before it plus what the pool's weights hold
        room, left_s = c["free_before_kv_gib"] + run["weights_gib"], rate * run["neighbour_cycle_gib"] - since(run, c)
        crosses = run["weights_gib"] + run["size_gib"] > share * (room - max(0.0, left_s) / rate)
        wait = max(0.0, left_s) if crosses else 0.0
        tag = "fitted" if name in READY_FIT_RUNS else "held out"
        head = (f"{name:34s} {run['size_gib']:g} GiB, {run['neighbour_cycle_gib']:g} GiB handed back "
                f"{since(run, c):.2f} s before: {got:.3f} s")
        if baseline(run):
            model = baseline(run) + wait
            lines.append(f"{head}, model {model:.3f} ({100 * (model - got) / got:+.1f} %) [{tag}]")
        else:
            lines.append(f"{head}, the model waits {wait:.3f} s [{tag}]")
    lines.append("(where the hand-back was made ready before the KV wake, its first mapping call costs 23-50 ms, which "
                 "the baselines lack: the simulator carries it in wake_call_s)")
    return {"wake_ready_s_per_gib": rate}, lines


def wake_terms(profile: dict, cheap_s_per_gib: float) -> dict[str, float]:
    """Closed form on vLLM alone: the call from the level-2 weights wake less `cheap_s_per_gib` (section 1b) per GiB,
    per tensor from the level-1 weights wake; each figure the median over the TP-1 runs of each run's median (as
    compare_calibration.py). The KV cache's level-1 wake is a check (held out)."""
    from vime.sim.models import load_model

    runs = [json.loads((DATA / f).read_text()) for f in VLLM_RUNS]
    runs = [r for r in runs if r.get("phases", {}).get("sleep_l1") and r.get("phases", {}).get("sleep_l2_ipc")]

    def med(phase: str, value) -> float:
        return statistics.median(statistics.median(value(x) for x in r["phases"][phase]) for r in runs)

    weights = runs[0]["weight_bytes"] / GIB
    kv = med("sleep_l1", lambda x: (x["free_asleep"] - x["free_awake"]) / GIB) - weights
    t_w2 = med("sleep_l2_ipc", lambda x: x["wake_weights_s"])
    # the KV cache's level-1 wake (compare_calibration.py's row; the level-2 one, same bytes, took 20 % longer)
    t_kv = med("sleep_l1", lambda x: x["wake_kv_s"])
    free = med("sleep_l1", lambda x: x["free_asleep"] / GIB)
    per_gib = cheap_s_per_gib  # everything vLLM does per GiB mapped below the spill, the driver's map included
    call = t_w2 - per_gib * weights
    create_map = profile["vmm"]["create_map_s_per_gib"]
    h2d = profile["host_link_h2d_bytes_per_s"] * profile["efficiency"].get("host_copy_util", 1.0)
    t_w1 = med("sleep_l1", lambda x: x["wake_weights_s"])
    tensors = len(load_model("Qwen3-4B").hf_weight_shapes())  # one allocation each in vLLM's restore loop
    per_tensor = (t_w1 - call - per_gib * weights - weights * GIB / h2d) / tensors
    return {"wake_call_s": round(call, 5), "wake_per_gib_s": round(per_gib - create_map, 7),
            "wake_per_tensor_s": round(per_tensor, 7), "_kv_gib": kv, "_weights_gib": weights, "_kv_s": t_kv,
            "_free_gib": free}


def bucket_terms(profile: dict, work: Path) -> dict[str, float]:
    """Closed form for the engine's side of an IPC bucket, http_rtt_s + ipc_open_s per bucket plus load_per_tensor_s per
    tensor (plus the bytes, read and written at the device rate): two equations, vLLM alone (16 buckets of Qwen3-4B's
    399 tensors; median over the TP-1 runs of each run's later cycles) and the MoE whole step (6 buckets, 1,575 tensors)."""
    import seed_model

    from vime.sim.engine.settings import EngineSettings
    from vime.sim.hardware import load_hardware
    from vime.sim.models import load_model

    (work / "bucket_profile.json").write_text(json.dumps(profile))
    hw = load_hardware(work / "bucket_profile.json")
    rtt = EngineSettings().http_rtt_s
    runs = [json.loads((DATA / f).read_text()) for f in VLLM_RUNS]
    runs = [r for r in runs if r.get("phases", {}).get("sleep_l2_ipc") and r.get("buckets", {}).get("sizes")]
    alone = statistics.median(statistics.median(sum(c["bucket_s"]) for c in r["phases"]["sleep_l2_ipc"][1:])
                              for r in runs)
    b1, n1 = runs[0]["buckets"]["count"], len(load_model("Qwen3-4B").hf_weight_shapes())
    y1 = alone - b1 * rtt - 2 * sum(runs[0]["buckets"]["sizes"]) / hw.decode_bytes_per_s
    run = MOE_RUN
    seed_model.write_body_config(work / "moe", "qwen3-30b-a3b-4l")
    moe = load_model(str(work / "moe" / "config.json"))
    startup = next(json.loads(line) for line in (RUNS / run / "train.jsonl").read_text().splitlines()
                   if '"startup"' in line)
    b2, n2 = startup["buckets"], len(moe.hf_weight_shapes())
    y2 = measured(run, "perf/update_weights_load_time") - b2 * rtt - 2 * moe.weight_bytes() / hw.decode_bytes_per_s
    per_tensor = (y2 - y1 * b2 / b1) / (n2 - n1 * b2 / b1)
    per_bucket = (y1 - n1 * per_tensor) / b1
    return {"ipc_open_s": round(per_bucket, 5), "load_per_tensor_s": round(per_tensor, 7)}


def export_terms(profile: dict, work: Path) -> dict[str, float]:
    """Closed form for the trainer's host work per export and per HF tensor: what each run's export measured beyond
    the simulated copies (both terms 0), on the 0.6B (311 tensors) and MoE (1,575) runs of the second lease."""
    import seed_model

    from vime.sim.models import load_model

    zero = with_values(profile, {"efficiency.export_call_s": 0.0, "efficiency.export_per_tensor_s": 0.0})
    rows = []
    for run, model in (("qwen3-0.6b-cumem-1g_2026-12-02s6", "qwen3-0.6b"), (MOE_RUN, "qwen3-30b-a3b-4l")):
        seed_model.write_body_config(work / model, model)
        tensors = len(load_model(str(work / model / "config.json")).hf_weight_shapes())
        beyond = measured(run, "perf/update_weights_export_time") - simulate(run, zero, work)[
            "perf/update_weights_export_time"]
        rows.append((tensors, beyond))
    (n1, y1), (n2, y2) = rows
    per_tensor = (y2 - y1) / (n2 - n1)
    return {"efficiency.export_call_s": round(y1 - n1 * per_tensor, 5),
            "efficiency.export_per_tensor_s": round(per_tensor, 8)}


#: The tenth lease's whole steps, whose trainer logged its sleep's and wake's timed parts (vime.real.megatron.actor).
PARTS_RUNS = {"qwen3-0.6b-cumem-1g-mbs8_2026-12-04s15": "qwen3-0.6b",
              "qwen3-0.6b-cumem-1g-mbs8-r512_2026-12-04s15": "qwen3-0.6b",
              "qwen3-4b-cumem-1g_mbs2_2026-12-04s15": "qwen3-4b"}
#: the eleventh lease's runs with the same timed parts, held out of section 9 (the 0.35-utilization engines release
#: about 49 GiB before the trainer's wake, under the ceiling)
HELD_OUT_PARTS_RUNS = ("qwen3-0.6b-cumem-1g-mbs8-util035_2026-12-04s16", "qwen3-0.6b-cumem-1g-mbs8_2026-12-04s16",
                       "qwen3-0.6b-cumem-1g-mbs8-r512_2026-12-04s16", "qwen3-0.6b-cumem-1g-mbs4_2026-12-04s16",
                       "qwen3-4b-cumem-1g-mbs2_2026-12-04s17", "qwen3-0.6b-cumem-1g-mbs8-util060_2026-12-04s17",
                       "qwen3-0.6b-cumem-1g-mbs8_2026-12-04s17", "qwen3-0.6b-cumem-1g-mbs8-util075_2026-12-04s18",
                       "qwen3-4b-cumem-1g-mbs2-util070_2026-12-04s18")
#: bench/colocated_resume.py rows the released-memory terms are fitted on (the neighbour gave back right before the
#: resume); the others (a 75 GiB neighbour, a settle before the resume) are held out
RESUME_FIT_FILES = ("neighbour25.json", "neighbour50.json", "neighbour100.json")


def offload_parts(run: str) -> dict[str, list[dict[str, float]]]:
    """The "sleep parts" and "wake parts" lines of a run's trainer log, in order (the start-up sleep first)."""
    out: dict[str, list[dict[str, float]]] = {"sleep": [], "wake": []}
    for line in (RUNS / run / "train_stderr.log").read_text().splitlines():
        for what in out:
            marker = f"] {what} parts (s): "
            if marker in line:
                pairs = (p.rsplit(" ", 1) for p in line.split(marker, 1)[1].split(", "))
                out[what].append({k: float(v) for k, v in pairs})
    return out


def trainer_offload_terms(profile: dict, work: Path) -> tuple[dict[str, float], list[str]]:
    """The trainer's sleep and wake beyond the allocator (section 9): the state check's per-tensor and per-byte terms in
    closed form from the 0.6B and 4B sleeps' fingerprints of PARTS_RUNS (the start-up sleep's, cold, left out), then the
    wake onto memory another process released from bench/colocated_resume.py's rows; the whole steps' resumes held out."""
    from vime.sim.trainer.sleep_extras import checked_state

    lines, rows = [], {}
    for run, name in PARTS_RUNS.items():
        model = model_of(name)
        parts = offload_parts(run)
        check = statistics.median(p["fingerprint"] for p in parts["sleep"][1:])
        tensors, kept = checked_state(model, model.params_per_rank(1, 1, 0), model.params_per_rank(1, 1, 0))
        rows.setdefault(name, []).append((tensors, kept, check))
        lines.append(f"{run}: {tensors} tensors, {kept / 1e9:.2f} GB kept; sleep's check {1e3 * check:.1f} ms (median of "
                     f"{len(parts['sleep']) - 1}), wake's {1e3 * statistics.median(p['fingerprint'] for p in parts['wake']):.1f}")
    (n1, b1, y1), (n2, b2, y2) = [[statistics.fmean(r[i] for r in rows[m]) for i in range(3)]
                                  for m in ("qwen3-0.6b", "qwen3-4b")]
    # y = n·c + b/rate: two models, two unknowns
    per_byte = (y2 - y1 * n2 / n1) / (b2 - b1 * n2 / n1)
    per_tensor = (y1 - b1 * per_byte) / n1
    fitted = {"efficiency.state_check_per_tensor_s": float(f"{per_tensor:.3g}"),
              "efficiency.state_check_bytes_per_s": float(f"{1 / per_byte:.3g}")}
    # the wake onto memory another process released: closed form on bench/colocated_resume.py's rows (vime's CuMem
    # allocator alone on the H200): per GiB the neighbour released (its 25 and 50 GiB rows), and the 100 GiB rows'
    # mean as the ceiling
    per_gib, ceiling, later = [], [], []
    for path in sorted((DATA / "colocated_resume").glob("neighbour*.json")):
        bench = json.loads(path.read_text())
        alone = statistics.median(c["resume_s"] for c in bench["cycles"] if c["condition"] == "alone")
        extra = [c["resume_s"] - alone for c in bench["cycles"] if c["condition"] != "alone"]
        gib, settle = bench["neighbour_gib"], bench.get("settle_s", 0.0)
        row = (f"{path.name}: resume alone {1e3 * alone:.0f} ms, after a neighbour's {gib:.0f} GiB"
               + (f" and a {settle:g} s settle " if settle else " ") + ", ".join(f"+{1e3 * e:.0f}" for e in extra) + " ms")
        if path.name not in RESUME_FIT_FILES:
            later.append((row, gib, extra))
            continue
        (ceiling if gib >= 100 else per_gib).extend(e / gib if gib < 100 else e for e in extra)
        lines.append(row)
    fitted["efficiency.released_wake_s_per_gib"] = float(f"{statistics.fmean(per_gib):.3g}")
    fitted["efficiency.released_wake_max_s"] = float(f"{statistics.fmean(ceiling):.3g}")
    for row, gib, _extra in later:  # the model has no time in it: a settle that removes the extra is not in it
        model = min(gib * fitted["efficiency.released_wake_s_per_gib"], fitted["efficiency.released_wake_max_s"])
        lines.append(f"{row}; modelled +{1e3 * model:.0f} ms [held out]")
    # held out: the whole steps' resume beyond the simulated allocator wake
    no_release = with_values(profile, {**fitted, "efficiency.released_wake_s_per_gib": 0.0})
    bare = with_values(no_release, {"efficiency.state_check_bytes_per_s": 0.0})
    with_all = with_values(profile, fitted)
    for run in (*PARTS_RUNS, *HELD_OUT_PARTS_RUNS):
        wakes = offload_parts(run)["wake"]
        resume = statistics.median(p["resume"] for p in wakes)
        check = statistics.median(p["fingerprint"] for p in wakes)
        allocator = simulate(run, bare, work)["perf/wake_up_time"]  # trainer_call_s is 0 on the H200
        modelled_check = simulate(run, no_release, work)["perf/wake_up_time"] - allocator
        released = simulate(run, with_all, work)["perf/wake_up_time"] - allocator - modelled_check
        lines.append(f"{run}: resume {1e3 * resume:.0f} ms, simulated allocator wake {1e3 * allocator:.0f} ms, beyond "
                     f"{1e3 * (resume - allocator):.0f} ms, modelled (released memory) {1e3 * released:.0f} ms [held out]; "
                     f"wake's check {1e3 * check:.1f} ms, modelled {1e3 * modelled_check:.1f} [held out]")
    return fitted, lines


def measured(run: str, key: str) -> float:
    """Mean over the steps after the first of a run's metric (`perf/...`)."""
    steps = [json.loads(line) for line in (RUNS / run / "train.jsonl").read_text().splitlines() if '"step"' in line]
    return statistics.fmean(s["metrics"][key] for s in steps if s["rollout_id"] >= 1)


#: run directory → (MODEL, OFFLOAD, environment for run.sh) of the 2026-12-02 lease
RUN_SPECS = {
    "qwen3-4b-cumem-1g_mbs2_2026-12-02": ("qwen3-4b", "cumem", {"MBS": "2"}),
    "qwen3-0.6b-cumem-1g_2026-12-02": ("qwen3-0.6b", "cumem", {}),
    "qwen3-0.6b-tms-1g_2026-12-02": ("qwen3-0.6b", "torch_memory_saver", {}),
    "qwen3-0.6b-cumem-1g_b64_r512_2026-12-02": ("qwen3-0.6b", "cumem",
                                                {"MBS": "4", "RESPONSE_LEN": "512",
                                                 "EXTRA_ARGS": "--rollout-batch-size 64"}),
    # the second lease of 2026-12-02 (the QKV cut on the GPU), predicted on 5838270 before it ran
    "qwen3-4b-cumem-1g_mbs2_2026-12-02s6": ("qwen3-4b", "cumem", {"MBS": "2"}),
    "qwen3-0.6b-cumem-1g_2026-12-02s6": ("qwen3-0.6b", "cumem", {}),
    MOE_RUN: ("qwen3-30b-a3b-4l", "cumem", {}),
    # the third lease (per-process memory samples), predicted on 77859da before it ran (plan040: on the machine)
    "qwen3-4b-cumem-1g_mbs2_2026-12-02s7": ("qwen3-4b", "cumem", {"MBS": "2"}),
    "qwen3-30b-a3b-4l-cumem-1g_mbs2_2026-12-02s7": ("qwen3-30b-a3b-4l", "cumem", {"MBS": "2", "NUM_ROLLOUT": "2"}),
    "qwen3-4b-cumem-1g_mbs2_plan040_2026-12-02s7": ("qwen3-4b", "cumem", {
        "MBS": "2", "EXTRA_ARGS": "--train-offload-plan activations --gpu-memory-utilization 0.4"}),
    # the fourth lease (vLLM's /metrics and the client's response times), predicted on 97ba307 before it ran
    "qwen3-4b-cumem-1g_mbs2_2026-12-02s8": ("qwen3-4b", "cumem", {"MBS": "2"}),
    "qwen3-0.6b-cumem-1g_2026-12-02s8": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    "qwen3-30b-a3b-4l-cumem-1g_mbs2_r512_2026-12-02s8": ("qwen3-30b-a3b-4l", "cumem", {
        "MBS": "2", "RESPONSE_LEN": "512", "NUM_ROLLOUT": "2"}),
    # run blind (its output withheld); predicted on 78a563e before its files were opened
    "qwen3-30b-a3b-4l-cumem-1g_mbs4_r512_2026-12-02s8": ("qwen3-30b-a3b-4l", "cumem", {
        "MBS": "4", "RESPONSE_LEN": "512", "NUM_ROLLOUT": "2"}),
    # the fifth lease (2026-12-03), predicted on 53c53a5 before it ran; nothing fitted on it
    "qwen3-4b-cumem-1g_mbs2_2026-12-03s10": ("qwen3-4b", "cumem", {"MBS": "2"}),
    "qwen3-0.6b-cumem-1g_2026-12-03s10": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    "qwen3-30b-a3b-4l-cumem-1g_mbs4_r512_n4_2026-12-03s10": ("qwen3-30b-a3b-4l", "cumem", {
        "MBS": "4", "RESPONSE_LEN": "512", "NUM_ROLLOUT": "4"}),
    "qwen3-4b-cumem-1g_mbs2_b8_2026-12-03s10": ("qwen3-4b", "cumem", {
        "MBS": "2", "NUM_ROLLOUT": "2", "EXTRA_ARGS": "--rollout-batch-size 8"}),
    # the sixth lease (2026-12-03, host.json beside each run), predicted on eaf8fc1 before it ran; nothing fitted on it
    "qwen3-4b-cumem-1g_mbs2_2026-12-03s11": ("qwen3-4b", "cumem", {"MBS": "2"}),
    "qwen3-0.6b-cumem-1g_2026-12-03s11": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    # the seventh lease, predicted on 3ebe948's parent before it ran; nothing fitted on it
    "qwen3-4b-cumem-1g_mbs2_n2_2026-12-03s12": ("qwen3-4b", "cumem", {"MBS": "2", "NUM_ROLLOUT": "2"}),
    "qwen3-0.6b-cumem-1g_2026-12-03s12": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    # the eighth lease (a second machine: the first was lost; a vLLM-alone 0.6B bench ran beside these on it),
    # the b8 run predicted on 76e03f6, the other on 3ebe948's parent, both before they ran; nothing fitted on them
    "qwen3-0.6b-cumem-1g-mbs8_2026-12-03s13": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    "qwen3-0.6b-cumem-1g-mbs8-b8_2026-12-03s13": ("qwen3-0.6b", "cumem", {
        "MBS": "8", "NUM_ROLLOUT": "2", "EXTRA_ARGS": "--rollout-batch-size 8"}),
    # the ninth lease, one machine in this order (QUIET=1: no nvidia-smi or /metrics sampler), the b16 run predicted on
    # 76e03f6, the others on 3ebe948's parent, all before they ran; nothing fitted on them
    "qwen3-0.6b-cumem-1g-mbs8-quiet_2026-12-04s14": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    "qwen3-0.6b-cumem-1g-mbs8_2026-12-04s14": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    "qwen3-0.6b-cumem-1g-mbs8-b16_2026-12-04s14": ("qwen3-0.6b", "cumem", {
        "MBS": "8", "NUM_ROLLOUT": "2", "EXTRA_ARGS": "--rollout-batch-size 16"}),
    "qwen3-0.6b-cumem-1g-mbs8-quiet2_2026-12-04s14": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    "qwen3-0.6b-cumem-1g-mbs8-2_2026-12-04s14": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    # the tenth lease, one machine in this order (the 0.6B bench ran between the first two), predicted on 4865bac's
    # records (predicted_2026-12-04s14b_next_*) before it ran; nothing fitted on them
    "qwen3-0.6b-cumem-1g-mbs8_2026-12-04s15": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    "qwen3-0.6b-cumem-1g-mbs8-r512_2026-12-04s15": ("qwen3-0.6b", "cumem", {"MBS": "8", "RESPONSE_LEN": "512"}),
    "qwen3-4b-cumem-1g_mbs2_2026-12-04s15": ("qwen3-4b", "cumem", {"MBS": "2"}),
    # the eleventh lease, one machine in this order, the util035 and mbs8 runs predicted on 7a0f8a1's profile
    # (predicted_2026-12-04s15_next_*), mbs4 and mbs2 on da66cfd (predicted_2026-12-04s16_next_*), r512 and mbs1 by the
    # committed model of da66cfd (their files written after the runs); nothing fitted on them
    "qwen3-0.6b-cumem-1g-mbs8-util035_2026-12-04s16": ("qwen3-0.6b", "cumem", {
        "MBS": "8", "EXTRA_ARGS": "--gpu-memory-utilization 0.35"}),
    "qwen3-0.6b-cumem-1g-mbs8_2026-12-04s16": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    "qwen3-0.6b-cumem-1g-mbs4_2026-12-04s16": ("qwen3-0.6b", "cumem", {"MBS": "4"}),
    "qwen3-0.6b-cumem-1g-mbs2_2026-12-04s16": ("qwen3-0.6b", "cumem", {"MBS": "2"}),
    "qwen3-0.6b-cumem-1g-mbs8-r512_2026-12-04s16": ("qwen3-0.6b", "cumem", {"MBS": "8", "RESPONSE_LEN": "512"}),
    "qwen3-0.6b-cumem-1g-mbs1_2026-12-04s16": ("qwen3-0.6b", "cumem", {"MBS": "1"}),
    # the twelfth lease, one machine in this order, predicted on 54639c6's profile (predicted_2026-12-04s16_next_*)
    # before it ran; nothing fitted on them
    "qwen3-4b-cumem-1g-mbs2_2026-12-04s17": ("qwen3-4b", "cumem", {"MBS": "2"}),
    "qwen3-0.6b-cumem-1g-mbs8-util060_2026-12-04s17": ("qwen3-0.6b", "cumem", {
        "MBS": "8", "EXTRA_ARGS": "--gpu-memory-utilization 0.6"}),
    "qwen3-0.6b-cumem-1g-mbs8_2026-12-04s17": ("qwen3-0.6b", "cumem", {"MBS": "8"}),
    # the thirteenth lease, one machine, predicted on 9903434's model (predicted_2026-12-04s18_next_*) before it ran:
    # the KV wake's spill between the utilizations already run; nothing fitted on them
    "qwen3-0.6b-cumem-1g-mbs8-util075_2026-12-04s18": ("qwen3-0.6b", "cumem", {
        "MBS": "8", "EXTRA_ARGS": "--gpu-memory-utilization 0.75"}),
    "qwen3-4b-cumem-1g-mbs2-util070_2026-12-04s18": ("qwen3-4b", "cumem", {
        "MBS": "2", "EXTRA_ARGS": "--gpu-memory-utilization 0.7"}),
    # the fourteenth lease, predicted (predicted_2026-12-04s19_next_06b_nooffload) before it ran: the trainer resident
    "qwen3-0.6b-cumem-1g-mbs4-nooffload-util030_2026-12-04s19": ("qwen3-0.6b", "cumem", {
        "MBS": "4", "EXTRA_ARGS": "--no-offload-train --gpu-memory-utilization 0.3"}),
    # the fifteenth lease, predicted (predicted_2026-12-04s19_next_06b_nooffload_emptied) before it ran: the resident
    # trainer now empties its cache after training; nothing fitted on it
    "qwen3-0.6b-cumem-1g-mbs4-nooffload-emptied-util030_2026-12-04s20": ("qwen3-0.6b", "cumem", {
        "MBS": "4", "EXTRA_ARGS": "--no-offload-train --gpu-memory-utilization 0.3"}),
    # the same lease, a second machine, predicted (predicted_2026-12-04s20_next_*) before they ran: responses of 2048
    # tokens, the 4B's resident trainer; nothing fitted on them
    "qwen3-0.6b-cumem-1g-mbs4-r2048_2026-12-04s20": ("qwen3-0.6b", "cumem", {
        "MBS": "4", "RESPONSE_LEN": "2048", "NUM_ROLLOUT": "2"}),
    "qwen3-4b-cumem-1g-mbs2-nooffload-emptied-util040_2026-12-04s20": ("qwen3-4b", "cumem", {
        "MBS": "2", "NUM_ROLLOUT": "2", "EXTRA_ARGS": "--no-offload-train --gpu-memory-utilization 0.4"}),
    # the sixteenth lease, predicted (predicted_2026-12-04s21_*) before they ran: full recompute at micro-batch 4 (OOM
    # without it), a KL loss against a reference model, vLLM eager; nothing here is fitted on them (the eager engine's
    # dispatch is fitted on the vLLM-alone bench, bench/eager_dispatch.py)
    "qwen3-4b-cumem-1g-mbs4-recompute_2026-12-04s21": ("qwen3-4b", "cumem", {
        "MBS": "4", "NUM_ROLLOUT": "2", "EXTRA_ARGS": "--recompute-granularity full"}),
    "qwen3-0.6b-cumem-1g-mbs4-kl_2026-12-04s21": ("qwen3-0.6b", "cumem", {
        "MBS": "4", "EXTRA_ARGS": "--use-kl-loss --kl-loss-coef 0.01"}),
    "qwen3-0.6b-cumem-1g-mbs4-eager_2026-12-04s21": ("qwen3-0.6b", "cumem", {
        "MBS": "4", "NUM_ROLLOUT": "2", "EXTRA_ARGS": "--enforce-eager"}),
}


def simulate(run: str, profile: dict, work: Path) -> dict:
    """`vime simulate` of `run` (run.sh's arguments) on `profile`; returns the mean step's metrics."""
    import predict  # scripts/h200_train/predict.py: run.sh's arguments with this machine's paths
    import seed_model

    from vime.cli import main as vime_main
    from vime.rollout.toy_task import ToyTask, write_prompts

    model, offload, env = RUN_SPECS[run]
    model_dir = work / model
    if not (model_dir / "config.json").exists():
        seed_model.write_body_config(model_dir, model)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    prompts = work / f"toy-{vocab}.jsonl"
    if not prompts.exists():
        write_prompts(prompts, ToyTask(vocab_size=vocab, num_prompts=256, prompt_len=128))
    hw = work / "profile.json"
    hw.write_text(json.dumps(profile))
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        args = predict.run_args("1", model, offload, model_dir, prompts)
    finally:
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
    args[args.index("--hardware") + 1] = str(hw)
    args[args.index("--model") + 1] = str(model_dir / "config.json")
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        vime_main(["simulate", *args])
    steps = json.loads(buf.getvalue())["steps"]
    later = [s["metrics"] for s in steps if s["rollout_id"] >= 1] or [s["metrics"] for s in steps]
    return {k: statistics.fmean(m[k] for m in later) for k in later[0]}


#: Section 0a: the H200's Qwen3-4B vLLM-alone benches (three leases); their B=1 rows are fitted on.
FIXED_STEP_BENCHES = ("h200_vllm_0.25.1.json", "h200_vllm_0.25.1_b0_keepalive_failure.json", "h200_vllm_0.25.1_b1.json",
                      "h200_vllm_0.25.1_b2.json", "vllm_bench_s13/vllm_4b_host1.json", "vllm_bench_s15/vllm_4b_s15.json")


def fixed_step_terms(profile: dict) -> tuple[dict[str, float], list[str]]:
    """Section 0a: the weights at the copy rate and the step's fixed GPU part, solved on the 4B benches' B=1 rows."""
    import predict_vllm_bench  # noqa: PLC0415 - bench/predict_vllm_bench.py: a bench's rows as the simulator gives them

    model = model_of("qwen3-4b")
    base = with_values(profile, {"efficiency.decode_weight_bw_util": 1.0})
    benches = {f: json.loads((DATA / f).read_text())["phases"].get("decode", []) for f in FIXED_STEP_BENCHES}

    def errors(o: float, batch: int | None) -> list[tuple[str, str, float]]:
        prof = with_values(base, {"efficiency.iteration_overhead_s": 0.0, "efficiency.iteration_layer_s": o})
        out = []
        for f, rows in benches.items():
            keep = [r for r in rows if (r["batch"] == 1) == (batch == 1)]
            pred = predict_vllm_bench.predict(prof, model, [(r["batch"], r["max_tokens"]) for r in keep], [])["wall_s"]
            for r in keep:
                row = f"generate B={r['batch']} x {r['max_tokens']} tokens"
                out.append((f, row, (pred[row] - r["wall_s"]) / r["wall_s"]))
        return out

    o = solve(lambda x: statistics.median(e for _, _, e in errors(x, 1)), 0.0, 1e-7, 1e-3, increasing=True)
    o = float(f"{o:.3g}")
    lines = [f"{f:45s} {row:28s} {100 * e:+6.1f} %  [{tag}]"
             for tag, batch in (("fitted", 1), ("held out", None)) for f, row, e in errors(o, batch)]
    return {"efficiency.decode_weight_bw_util": 1.0, "efficiency.iteration_overhead_s": 0.0,
            "efficiency.iteration_layer_s": o}, lines


def solve(f, target: float, lo: float, hi: float, *, increasing: bool, iters: int = 22) -> float:
    """Bisection of a monotone f(x) = target on [lo, hi] (geometric: the terms span decades)."""
    for _ in range(iters):
        mid = (lo * hi) ** 0.5
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo * hi) ** 0.5


#: The runs with per-process samples; the first is fitted on.
PROC_RUNS = ("qwen3-4b-cumem-1g_mbs2_2026-12-02s7", "qwen3-30b-a3b-4l-cumem-1g_mbs2_2026-12-02s7",
             "qwen3-4b-cumem-1g_mbs2_plan040_2026-12-02s7")
MIB = 1 << 20


def process_outside(run: str, profile: dict) -> tuple[int, int]:
    """(trainer bytes outside its allocator, engine bytes beyond its budget) at the run's fullest GPU sample."""
    d = RUNS / run
    totals: dict[str, dict[str, int]] = {}
    for line in (d / "gpu_procs.csv").read_text().splitlines():
        t, pid, mib = line.split(",")
        totals.setdefault(f"{float(t):.1f}", {})[pid] = int(mib)
    events = [json.loads(x) for x in (d / "train.jsonl").read_text().splitlines() if x.startswith("{")]
    trainer_pid = str(next(e for e in events if e.get("event") == "placement")["trainer_ranks"][0]["pid"])
    sample = max((s for s in totals.values() if len(s) == 2), key=lambda s: sum(s.values()))
    engine_mib = next(m for p, m in sample.items() if p != trainer_pid)
    m = [e for e in events if e.get("event") == "step"][-1]["metrics"]
    held = sum(m[f"memory/asleep_{k}_gib"] for k in ("params", "grads", "optimizer", "torch_cache")) * GIB
    util = json.loads((d / "sim.json").read_text())["config"]["gpu_memory_utilization"]
    from vime.sim.engine.settings import EngineSettings

    engine = profile.get("engine", {})
    # vLLM 0.25.1 keeps its CUDA context and graphs beside the budget (EngineSettings.graphs_beside_budget): not outside it
    beside = (profile["cuda_context_bytes"] + engine.get("cuda_graph_bytes", EngineSettings().cuda_graph_bytes)
              if engine.get("graphs_beside_budget") else 0)
    return (int(sample[trainer_pid] * MIB - held), int(engine_mib * MIB - int(util * profile["memory_bytes"]) - beside))


def process_terms(profile: dict) -> tuple[dict[str, int], list[str]]:
    """The two process-memory terms from PROC_RUNS[0], and measured vs committed on every run."""
    trainer, engine = process_outside(PROC_RUNS[0], profile)
    fitted = {"software.trainer_process_bytes": round((trainer - profile["cuda_context_bytes"]) / MIB) * MIB,
              "engine.outside_budget_bytes": round(engine / MIB) * MIB}
    have_t = profile["cuda_context_bytes"] + profile.get("software", {}).get("trainer_process_bytes", 0)
    have_e = profile.get("engine", {}).get("outside_budget_bytes", 0)
    lines = []
    for run in PROC_RUNS:
        t, e = process_outside(run, profile)
        lines.append(f"{run:44s} trainer outside its allocator {t / GIB:5.2f} GiB (model {have_t / GIB:5.2f}), "
                     f"engine beyond its budget, context and graphs {e / GIB:5.2f} GiB (model {have_e / GIB:5.2f})"
                     + ("  [fitted]" if run == PROC_RUNS[0] else "  [held out]"))
    return fitted, lines


#: The whole step whose response spread fitted EngineSettings.response_per_token_s alone until 2026-12-02 (session 9);
#: with the MoE r512 run its spreads fitted the response's two terms until the fourteenth session (now the benches').
FRONTEND_RUN = "qwen3-4b-cumem-1g_mbs2_2026-12-02s8"
#: The runs with vLLM's /metrics (the fourth lease), FRONTEND_RUN first.
METRICS_RUNS = (FRONTEND_RUN, "qwen3-0.6b-cumem-1g_2026-12-02s8", "qwen3-30b-a3b-4l-cumem-1g_mbs2_r512_2026-12-02s8")
#: runs with /metrics that no fit read: the blind MoE run and the fifth and sixth leases' (256 requests each)
HELD_OUT_METRICS_RUNS = ("qwen3-30b-a3b-4l-cumem-1g_mbs4_r512_2026-12-02s8", "qwen3-4b-cumem-1g_mbs2_2026-12-03s10",
                         "qwen3-0.6b-cumem-1g_2026-12-03s10", "qwen3-30b-a3b-4l-cumem-1g_mbs4_r512_n4_2026-12-03s10",
                         "qwen3-4b-cumem-1g_mbs2_2026-12-03s11", "qwen3-0.6b-cumem-1g_2026-12-03s11",
                         "qwen3-4b-cumem-1g_mbs2_n2_2026-12-03s12", "qwen3-0.6b-cumem-1g_2026-12-03s12",
                         "qwen3-0.6b-cumem-1g-mbs8_2026-12-03s13", "qwen3-0.6b-cumem-1g-mbs8_2026-12-04s14",
                         "qwen3-0.6b-cumem-1g-mbs8-2_2026-12-04s14")


def _later_steps(run: str) -> list[dict]:
    steps = [json.loads(x) for x in (RUNS / run / "train.jsonl").read_text().splitlines() if '"step"' in x]
    return [s["metrics"] for s in steps if s["rollout_id"] >= 1]


def engine_metrics(run: str) -> list[dict]:
    """vLLM's /metrics samples of a run (`vllm_metrics.jsonl`, kept gzipped in bench/data to keep the device's working tree small)."""
    path = RUNS / run / "vllm_metrics.jsonl.gz"
    text = gzip.decompress(path.read_bytes()).decode() if path.exists() else (RUNS / run / "vllm_metrics.jsonl").read_text()
    return [json.loads(x) for x in text.splitlines()]


def engine_itl(run: str) -> list[float]:
    """vLLM's mean inter-token latency over each rollout after the first (`vllm_metrics.jsonl`, counters' differences)."""
    rows = engine_metrics(run)
    wins, start = [], None
    for i, r in enumerate(rows):
        running = r["m"].get("vllm:num_requests_running", 0)
        if running > 0 and start is None:
            start = max(i - 1, 0)
        elif running == 0 and start is not None:
            wins.append((rows[start]["m"], r["m"]))
            start = None

    def d(a: dict, b: dict, k: str) -> float:
        return b.get(k, 0.0) - a.get(k, 0.0)

    return [d(a, b, "vllm:inter_token_latency_seconds_sum") / d(a, b, "vllm:inter_token_latency_seconds_count")
            for a, b in wins[1:]]


def response_spread_per_response(metrics: dict) -> float:
    """Seconds per response between the client's first and last response of a rollout whose responses all have
    the same length and finished together (run.sh's fixed lengths): (last − first) / (responses − 1)."""
    spread = metrics["perf/rollout_last_response_time"] - metrics["perf/rollout_first_response_time"]
    return spread / (metrics["rollout/generated_samples"] - 1)


def model_of(name: str) -> Any:
    """The simulator's model of a run.sh preset (`seed_model.py`'s config.json of it)."""
    import seed_model

    from vime.sim.models import load_model

    with tempfile.TemporaryDirectory() as d:
        seed_model.write_body_config(Path(d), name)
        return load_model(str(Path(d) / "config.json"))


def lone_request_s() -> float:
    """The lone 16-token, one-token generate of the one-GPU vLLM-alone runs that have the phase `frontend`
    (bench/compare_calibration.py's row), the median of their medians."""
    runs = [json.loads((DATA / f).read_text()) for f in ("h200_vllm_0.25.1.json", "h200_vllm_0.25.1_b0_keepalive_failure.json",
                                                        "h200_vllm_0.25.1_b1.json", "h200_vllm_0.25.1_b2.json")]
    return statistics.median(r["phases"]["frontend"]["summary"]["gen1_s"]["median"] for r in runs if "frontend" in r["phases"])


def frontend_terms(profile: dict) -> tuple[dict[str, float], list[str]]:
    """The API server's building of a response (per response, per token) from the vLLM-alone benches' own first and
    last response times, vLLM's CPU step refitted beside it on the 0.6B benches (host-bound at every batch, so the
    per-request cost shows whole; the 4B's steps at 256 requests are GPU-bound and hide it), the front end's fixed
    latency from the lone request; the whole steps' response spreads as held-out checks."""
    import predict_vllm_bench  # bench/predict_vllm_bench.py: the benches, the response fit, the CPU step's refit

    from vime.sim.engine import EngineSettings, IterationModel
    from vime.sim.hardware import HardwareSpec

    (per_request, per_token), prof = predict_vllm_bench.fit_cpu_step(profile)
    settings = EngineSettings(response_per_request_s=per_request, response_per_token_s=per_token)
    eff = prof["efficiency"]
    fitted = {"EngineSettings.response_per_request_s": per_request, "EngineSettings.response_per_token_s": per_token}
    fitted.update({f"efficiency.{k}": float(f"{eff[k]:.3g}")
                   for k in ("host_step_s", "host_step_per_seq_s")})
    hw = HardwareSpec.from_dict(with_values(profile, {k: v for k, v in fitted.items() if k.startswith("eff")}))

    # the lone request: the engine's first step, the fixed latency, the one-token response's building
    im4 = IterationModel.build(hw, model_of("qwen3-4b"), settings)
    overhead = lone_request_s() - im4.first_time(16, 0, 16 * 17 / 2, 1) - settings.response_seconds(1)
    fitted["EngineSettings.request_overhead_s"] = float(f"{overhead:.3g}")
    lines = [f"the benches' response spreads (B ≥ {predict_vllm_bench.RESPONSE_MIN_BATCH}), "
             f"{', '.join(predict_vllm_bench.BENCH_06B)}: the rows with first/last response times  [fitted]"]
    for run in (*METRICS_RUNS, *HELD_OUT_METRICS_RUNS):
        length = _later_steps(run)[0]["rollout/response_len/mean"]
        spreads = [1e3 * response_spread_per_response(m) for m in _later_steps(run)]
        im = IterationModel.build(hw, model_of(RUN_SPECS[run][0]), settings)
        ctx = 256 * (128 + length / 2)  # mid-rollout: every request half way through its response
        itl = engine_itl(run)
        lines.append(f"{run:50s} spread {', '.join(f'{x:.2f}' for x in spreads)} ms per {length:.0f}-token response "
                     f"(model {1e3 * settings.response_seconds(int(length)):.2f}); vLLM's inter-token latency "
                     f"{', '.join(f'{1e3 * x:.2f}' for x in itl)} ms, modelled step at 256 requests "
                     f"{1e3 * im.time(256, ctx, ctx):.2f} ms  [held out]")
    return fitted, lines


def with_values(profile: dict, values: dict[str, float]) -> dict:
    out = json.loads(json.dumps(profile))
    for key, v in values.items():
        group, name = key.split(".")
        out.setdefault(group, {})[name] = v
    return out


def fit(profile: dict, work: Path) -> tuple[dict[str, float], list[str]]:
    """Sections 2, 9, 3b and 3c in that order (each simulates with the ones before it); the fits and section 9's lines."""
    fitted: dict[str, float] = {}
    base = {"vmm.shared_map_s_per_gib": 0.0, "efficiency.train_host_s_per_expert": 0.0,
            "efficiency.train_expert_gemm_efficiency": 0.7, "efficiency.state_check_per_tensor_s": 0.0,
            "efficiency.state_check_bytes_per_s": 0.0, "efficiency.released_wake_s_per_gib": 0.0,
            "efficiency.released_wake_max_s": 0.0}

    def sim(run: str, **extra: float) -> dict:
        return simulate(run, with_values(profile, {**base, **fitted, **extra}), work)

    fitted["vmm.shared_map_s_per_gib"] = 0.0  # section 1b's spill replaced it (session 18)
    offload, lines = trainer_offload_terms(with_values(profile, {**base, **fitted}), work)
    fitted.update(offload)
    fitted.update(export_terms(with_values(profile, fitted), work))
    fitted.update(moe_terms(lambda run, x, y: sim(run, **{"efficiency.train_host_s_per_expert": x,
                                                           "efficiency.train_expert_gemm_efficiency": y}), work))
    return fitted, lines


def moe_terms(sim, work: Path) -> dict[str, float]:
    """The expert floor and the experts' GEMM efficiency (see 3c): `sim(run, per_expert, efficiency)` → metrics.
    The floor on the host-bound run, the efficiency on the GPU-bound one, alternately until both settle."""
    host_run, gpu_run = MOE_FIT_RUNS
    x, e = 5e-4, 0.7
    for _ in range(3):
        x = solve(lambda v, e=e: sim(host_run, v, e)["perf/train_phase_time"],
                  measured(host_run, "perf/train_phase_time"), 1e-6, 1e-2, increasing=True)
        e = solve(lambda v, x=x: sim(gpu_run, x, v)["perf/train_phase_time"],
                  measured(gpu_run, "perf/train_phase_time"), 1e-3, 1.0, increasing=False)
    return {"efficiency.train_host_s_per_expert": float(f"{x:.4g}"),
            "efficiency.train_expert_gemm_efficiency": float(f"{e:.4g}")}


def implied_floor(profile: dict, fitted: dict[str, float], work: Path) -> tuple[float, float]:
    """(implied, preset) forward CPU floor per layer: the b64_r512 run's train phase solved for the floor."""
    eff = profile["efficiency"]
    fwd, bwd = eff["train_host_fwd_s_per_layer"], eff["train_host_bwd_s_per_layer"]
    run = "qwen3-0.6b-cumem-1g_b64_r512_2026-12-02"

    def train(x: float) -> float:
        floor = {"efficiency.train_host_fwd_s_per_layer": x, "efficiency.train_host_bwd_s_per_layer": x * bwd / fwd}
        return simulate(run, with_values(profile, {**fitted, **floor}), work)["perf/train_phase_time"]

    return solve(train, measured(run, "perf/train_phase_time"), 1e-5, 1e-1, increasing=True), fwd


def step_vs_context(run: str, batch: int = 256, min_tokens: int = 3) -> list[tuple[float, float, float]]:
    """vLLM's step while `batch` requests decode, against their mean context: (context, mean inter-token latency,
    tokens) per /metrics interval (0.25 s) of every rollout, the latency from the histogram's sum and count differences."""
    rows = engine_metrics(run)
    prompt = 128  # run.sh's toy prompts
    out, g0 = [], None
    for a, b in zip(rows, rows[1:], strict=False):
        if a["m"].get("vllm:num_requests_running", 0) == 0:
            g0 = b["m"]["vllm:generation_tokens_total"]  # a rollout starts after an idle sample
            continue
        if g0 is None or min(a["m"]["vllm:num_requests_running"], b["m"]["vllm:num_requests_running"]) < batch:
            continue
        count = b["m"]["vllm:inter_token_latency_seconds_count"] - a["m"]["vllm:inter_token_latency_seconds_count"]
        total = b["m"]["vllm:inter_token_latency_seconds_sum"] - a["m"]["vllm:inter_token_latency_seconds_sum"]
        if count < batch * min_tokens:
            continue
        gen = (a["m"]["vllm:generation_tokens_total"] + b["m"]["vllm:generation_tokens_total"]) / 2 - g0
        out.append((prompt + gen / batch, total / count, count))
    return out


def step_quarters(run: str) -> list[tuple[float, float]]:
    """`step_vs_context` of `run` grouped by rollout and quarter of its response length: (mean context, mean step)."""
    length = _later_steps(run)[0]["rollout/response_len/mean"]
    groups: dict[tuple[int, int], list[tuple[float, float, float]]] = {}
    k, last = 0, None
    for p in step_vs_context(run):
        if last is not None and p[0] < last:
            k += 1  # the context fell: the next rollout
        last = p[0]
        groups.setdefault((k, min(3, int(4 * (p[0] - 128) / length))), []).append(p)
    out = []
    for _, pts in sorted(groups.items()):
        w = sum(p[2] for p in pts)
        out.append((sum(p[0] * p[2] for p in pts) / w, sum(p[1] * p[2] for p in pts) / w))
    return out


def _line(points: list[tuple[float, float, float]]) -> tuple[float, float]:
    """Weighted least-squares (intercept, slope) of y on x over (x, y, weight)."""
    w = sum(p[2] for p in points)
    mx = sum(p[0] * p[2] for p in points) / w
    my = sum(p[1] * p[2] for p in points) / w
    sxx = sum(p[2] * (p[0] - mx) ** 2 for p in points)
    slope = sum(p[2] * (p[0] - mx) * (p[1] - my) for p in points) / sxx if sxx else 0.0
    return my - slope * mx, slope


#: vLLM's decode steps that rise with their context (GPU-bound: the CPU step is under them), as (run, quarters of
#: the response, requests): the 0.6B at 4096-token responses past its first quarter (the seventh lease) and the 4B
#: of the fourth lease (8.4 us per token of context over its whole 1024). The fit's data; the rest are checks.
GPU_STEP_FIT = (("qwen3-0.6b-cumem-1g_mbs1_r4096_n1_2026-12-03s12", "qwen3-0.6b", (1, 2, 3), 256),
                ("qwen3-4b-cumem-1g_mbs2_2026-12-02s8", "qwen3-4b", (0, 1, 2, 3), 256))
#: Held out: the sixth lease's 0.6B at 4096 tokens (another host; its last half GPU-bound) and the 4B at 64 requests.
GPU_STEP_HELD_OUT = (("qwen3-0.6b-cumem-1g_mbs2_r4096_n1_2026-12-03s11", "qwen3-0.6b", (2, 3), 256),
                     ("qwen3-4b-cumem-1g_mbs2_b8_2026-12-03s10", "qwen3-4b", (3,), 64))


def _quarters(run: str, batch: int) -> list[tuple[int, float, float]]:
    """(quarter of the response, mean context, mean step) of `run`'s decode at `batch` requests, every rollout."""
    argv = (RUNS / run / "command.txt").read_text().split()
    length = int(argv[argv.index("--rollout-max-response-len") + 1])  # run.sh's responses all reach the cap
    groups: dict[int, list[tuple[float, float, float]]] = {}
    for p in step_vs_context(run, batch=batch):
        groups.setdefault(min(3, int(4 * (p[0] - 128) / length)), []).append(p)
    return [(q, sum(p[0] * p[2] for p in g) / sum(p[2] for p in g), sum(p[1] * p[2] for p in g) / sum(p[2] for p in g))
            for q, g in sorted(groups.items())]


def gpu_step_terms(profile: dict) -> tuple[dict[str, float], list[str]]:
    """The attention's KV read rate and the sampler's time per logit: least squares over GPU_STEP_FIT's quarters of
    step − (the iteration's fixed cost + its linear layers) = KV bytes / rate + requests · vocabulary · per-logit, each
    model's own weights and KV bytes per token. The calibration's 3.04 TB/s was torch's unfused attention
    (bench/calibrate.py); vLLM reads the KV with FlashAttention, and samples over the vocabulary after the forward."""
    from vime.sim.engine import EngineSettings, IterationModel
    from vime.sim.hardware import HardwareSpec

    hw = HardwareSpec.from_dict(profile)

    def rows(spec: tuple) -> list[tuple[str, int, float, float, float, float]]:
        out = []
        for run, name, keep, batch in spec:
            model = model_of(name)
            im = IterationModel.build(hw, model, EngineSettings())
            for q, ctx, step in _quarters(run, batch):
                if q in keep:  # the memory side only: where the step rises with its context, the reads bound it
                    out.append((run, q, step - im.fixed(batch) - im.gemm_time(batch, batch),
                                batch * ctx * model.kv_bytes_per_token(), batch * model.vocab_size, step))
        return out

    fit_rows = rows(GPU_STEP_FIT)
    # two unknowns, x = 1/rate and s = per logit: y = x·kv + s·logits (normal equations)
    skk = sum(r[3] * r[3] for r in fit_rows)
    sll = sum(r[4] * r[4] for r in fit_rows)
    skl = sum(r[3] * r[4] for r in fit_rows)
    sky = sum(r[3] * r[2] for r in fit_rows)
    sly = sum(r[4] * r[2] for r in fit_rows)
    det = skk * sll - skl * skl
    x, s = (sky * sll - sly * skl) / det, (skk * sly - skl * sky) / det
    fitted = {"engine.kv_read_bytes_per_s": float(f"{1 / x:.3g}"), "engine.sample_s_per_logit": float(f"{s:.3g}")}
    rate, per = fitted["engine.kv_read_bytes_per_s"], fitted["engine.sample_s_per_logit"]
    lines = [f"KV read {rate / 1e12:.2f} TB/s (the profile's streaming rate {hw.decode_bytes_per_s / 1e12:.2f}), "
             f"sampler {per * 1e12:.1f} ps per logit ({256 * 151936 * per * 1e3:.2f} ms for 256 requests of a 151 936 vocabulary)"]
    for tag, spec in (("fitted", GPU_STEP_FIT), ("held out", GPU_STEP_HELD_OUT)):
        for run, q, y, kv, logits, step in rows(spec):
            model_step = step - y + kv / rate + logits * per
            lines.append(f"{run:50s} quarter {q + 1}: measured {1e3 * step:6.2f} ms, GPU model {1e3 * model_step:6.2f} ms "
                         f"({100 * (model_step - step) / step:+.1f} %)  [{tag}]")
    return fitted, lines


def step_terms(profile: dict) -> list[str]:
    """vLLM's decode step against context at 256 requests (/metrics) beside the simulator's IterationModel: a check."""
    from vime.sim.engine import EngineSettings, IterationModel
    from vime.sim.hardware import HardwareSpec

    hw = HardwareSpec.from_dict(profile)
    lines = []
    for run in (*METRICS_RUNS, *HELD_OUT_METRICS_RUNS):
        pts = step_vs_context(run)
        model = model_of(RUN_SPECS[run][0])
        im = IterationModel.build(hw, model, EngineSettings(**hw.engine_overrides()))
        modelled = [(c, im.time(256, 256 * c, 256 * c), n) for c, _, n in pts]
        a, b = _line(pts)
        ma, mb = _line(modelled)
        mean = sum(y * n for _, y, n in pts) / sum(n for *_, n in pts)
        mmean = sum(y * n for _, y, n in modelled) / sum(n for *_, n in modelled)
        # a step that barely grows over the context range (host-bound) has no KV rate to show
        rise = b * (max(p[0] for p in pts) - min(p[0] for p in pts)) / mean if pts else 0.0
        rate = f"KV read {256 * model.kv_bytes_per_token() / b / 1e12:.2f} TB/s" if rise > 0.2 else "flat: no KV rate"
        lines.append(f"{run:50s} {len(pts):3d} intervals, context {min(p[0] for p in pts):.0f}..{max(p[0] for p in pts):.0f}: "
                     f"measured {1e3 * a:.2f} ms + {1e6 * b:.2f} us/token of context ({rate}), mean "
                     f"{1e3 * mean:.2f} ms; modelled {1e3 * ma:.2f} ms + {1e6 * mb:.2f} us, mean {1e3 * mmean:.2f} ms "
                     f"({100 * (mmean - mean) / mean:+.1f} %); host floor {1e3 * im.host(256):.2f} ms")
    return lines


def held_out(profile: dict, work: Path) -> list[str]:
    """Measured vs simulated (committed profile) for every 2026-12-02 run and the phases the fits touch."""
    keys = ("perf/onload_weights_time", "perf/onload_kv_time", "perf/update_weights_export_time",
            "perf/update_weights_load_time", "perf/update_weights_time", "perf/sleep_time", "perf/wake_up_time",
            "perf/train_phase_time", "perf/rollout_time", "perf/step_time")
    lines = []
    for run in RUN_SPECS:
        s = simulate(run, profile, work)
        for k in keys:
            m = measured(run, k)
            err = f"{100 * (s[k] - m) / m:+7.1f} %" if m else "  (none measured)" if not s[k] else "  (only simulated)"
            lines.append(f"{run:42s} {k:34s} measured {m:8.3f}  simulated {s[k]:8.3f}  {err}")
    return lines


def section(title: str, lines: list[str]) -> None:
    print(title)
    for line in lines:
        print("   " + line)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="fail unless the committed values are the fits")
    a = ap.parse_args(argv)
    from vime.sim.engine.settings import EngineSettings

    profile = json.loads(PROFILE.read_text())
    fixed_step, fixed_lines = fixed_step_terms(profile)
    section("0a. vLLM's decode step, its GPU part: the weights at the copy rate, the fixed part per layer solved on the "
            "4B benches' one-request rows (their wall time, prefill and response included):",
            [f"{k} = {v}" for k, v in fixed_step.items()] + fixed_lines)
    gpu_step, gpu_lines = gpu_step_terms(profile)
    # the CPU step (section 7) is fitted under these GPU terms: they move together (h200_notes.md, seventh lease)
    section("0. vLLM's decode step where it is GPU-bound (/metrics of the whole steps), the attention's KV rate and the "
            "sampler, by least squares:", [f"{k} = {v}" for k, v in gpu_step.items()] + gpu_lines)
    spill, spill_lines = spill_terms()
    cheap = spill.pop("_cheap_s_per_gib")
    section("1b. vLLM's pool mapping its KV call by call (bench/vllm_cumem_probe.py, session 18), by least squares:",
            [f"EngineSettings.{k} = {v}" for k, v in spill.items()] + spill_lines)
    ready, ready_lines = ready_terms(spill["wake_spill_share"])
    section("1c. Memory another process handed back, made ready in the background (bench/vllm_cumem_probe.py, session 19):",
            [f"EngineSettings.{k} = {v}" for k, v in ready.items()] + ready_lines)
    wake = wake_terms(profile, cheap)
    kv_gib, w_gib, t_kv, free = (wake.pop(k) for k in ("_kv_gib", "_weights_gib", "_kv_s", "_free_gib"))
    model_kv = (wake["wake_call_s"] + cheap * kv_gib
                + spill["wake_spill_s_per_gib"] * spill_over(kv_gib, w_gib, TOTAL_GIB, spill["wake_spill_share"]))
    print(f"1. vLLM alone (no other process; {free:.1f} GiB free asleep): KV {kv_gib:.1f} GiB, weights {w_gib:.2f} GiB; its KV wake "
          f"{t_kv:.3f} s, model {model_kv:.3f} ({100 * (model_kv - t_kv) / t_kv:+.1f} %) [held out]")
    for k, v in wake.items():
        print(f"   EngineSettings.{k} = {v}")
    wake.update(spill)
    wake.update(ready)
    with tempfile.TemporaryDirectory() as d:
        fitted, offload_lines = fit(profile, Path(d))
        for k, v in fitted.items():
            print(f"   {k} = {v}")
        section("9. The trainer's sleep and wake beyond the allocator: vime's state check (the tenth lease's timed parts) "
                "and the wake onto memory another process released (bench/colocated_resume.py):", offload_lines)
        implied, preset = implied_floor(profile, fitted, Path(d))
        print(f"4. CPU floor per layer, forward: the b64_r512 train phase implies {implied * 1e3:.2f} ms, "
              f"the preset has {preset * 1e3:.2f} ms ({100 * (implied - preset) / preset:+.1f} %)")
        buckets = bucket_terms(profile, Path(d))
        print(f"5. The engine's side of an IPC bucket (vLLM alone + the MoE whole step {MOE_RUN}):")
        for k, v in buckets.items():
            print(f"   EngineSettings.{k} = {v}")
        wake.update(buckets)
        procs, proc_lines = process_terms(profile)
        section("6. Process memory outside the allocators (the third lease's per-process samples):",
                [f"{k} = {v} ({v / GIB:.3f} GiB)" for k, v in procs.items()] + proc_lines)
        fitted.update(procs)
        front, front_lines = frontend_terms(profile)
        section("7. The API server's building of a response (per response, per token), vLLM's step refitted beside it, the "
                "front end's fixed latency (the fourth lease's spreads):",
                [f"{k} = {v}" for k, v in front.items()] + front_lines)
        for k in ("response_per_request_s", "response_per_token_s", "request_overhead_s"):
            wake[k] = front.pop(f"EngineSettings.{k}")
        section("8. A check, not a fit: vLLM's decode step at 256 requests against their context (/metrics, every "
                "rollout) beside the IterationModel of the committed profile:", step_terms(profile))
        fitted.update(front)
        fitted.update(gpu_step)
        fitted.update(fixed_step)
        committed = {k: profile[k.split(".")[0]].get(k.split(".")[1]) for k in fitted}
        settings = EngineSettings()
        bad = [f"{k}: committed {committed[k]}, fit {v}" for k, v in fitted.items() if committed[k] != v]
        bad += [f"EngineSettings.{k}: committed {getattr(settings, k)}, fit {v}" for k, v in wake.items()
                if abs(getattr(settings, k) - v) > 1e-9]
        print("held out and fitted, on the committed profile:")
        for line in held_out(profile, Path(d)):
            print("  " + line)
    if bad:
        print("differs from the fits:\n  " + "\n  ".join(bad))
        return 1 if a.check else 0
    print("the committed values are the fits")
    return 0


if __name__ == "__main__":
    sys.exit(main())
