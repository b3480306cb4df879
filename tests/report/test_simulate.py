"""`vime simulate`: the default scenario, the JSON schema, golden output, trace file, HTML report, sweeps and search."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import jsonschema
import pytest

from vime.cli.simulate import format_text
from vime.config import parse_args
from vime.report.schema import SIMULATE_SCHEMA, TRACE_EVENT_SCHEMA
from vime.report.trace import recorder_trace
from vime.runs.document import build_document
from vime.runs.sim import simulate
from vime.runs.sweep import parse_sweep, run_points, search

GiB = 1024**3
GOLDEN = Path(__file__).parent / "golden" / "simulate_default.json"


@pytest.fixture(scope="module")
def default_sim():
    return simulate(parse_args([], command="simulate"))


@pytest.fixture(scope="module")
def default_doc(default_sim):
    return build_document(default_sim, deterministic=True)


def test_default_scenario_is_the_seed_and_fits(default_doc):
    cfg = default_doc["config"]
    assert (cfg["rollout_batch_size"], cfg["n_samples_per_prompt"], cfg["global_batch_size"]) == (32, 8, 256)
    assert (cfg["tensor_model_parallel_size"], cfg["data_parallel_size"], cfg["rollout_num_engines"]) == (2, 4, 4)
    assert default_doc["model"]["name"] == "Qwen3-4B" and default_doc["hardware"]["name"] == "H100-SXM-80G"
    assert default_doc["verdict"] == {"fits": True, "oom": None, "fixes": [], "fix_results": [], "at_risk": False}
    assert len(default_doc["memory"]["gpus"]) == 8
    for g in default_doc["memory"]["gpus"]:
        assert 0 < g["peak_gib"] <= g["capacity_gib"]
        assert g["headroom_gib"] == pytest.approx(g["capacity_gib"] - g["peak_gib"], abs=2e-3)
        # the breakdown at the peak adds up to the peak
        assert sum(g["by_owner_tag_gib"].values()) == pytest.approx(g["peak_gib"], abs=0.02)


def test_phases_sum_to_t_step_and_percentages_to_100(default_doc):
    for step in default_doc["steps"]:
        assert sum(step["phases"].values()) + step["t_gap"] == pytest.approx(step["t_step"], rel=1e-6)
        assert all(v >= 0 for v in step["phases"].values())
    summary = default_doc["summary"]
    assert sum(p["percent"] for p in summary["phases"].values()) == pytest.approx(100, abs=0.05)
    assert summary["phases"]["rollout"]["seconds"] > 0 and summary["phases"]["train"]["seconds"] > 0
    r = default_doc["rollout"]
    assert 0 < r["longest_sample_tokens"] <= 1024
    assert r["tokens_generated"] > 256  # 256 samples, most longer than one token
    assert 0 < r["engine_busy_share"] <= 1.0 + 1e-9


def test_json_document_validates_against_its_schema(default_doc):
    jsonschema.validate(default_doc, SIMULATE_SCHEMA)


def test_same_seed_gives_identical_documents(default_doc):
    again = build_document(simulate(parse_args([], command="simulate")), deterministic=True)
    assert json.dumps(again, sort_keys=True) == json.dumps(default_doc, sort_keys=True)


def test_golden_default_document(default_doc):
    """The default scenario's document is stable; VIME_UPDATE_GOLDEN=1 rewrites it after a deliberate model change."""
    text = json.dumps(default_doc, indent=1, sort_keys=True) + "\n"
    if os.environ.get("VIME_UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(text)
    assert GOLDEN.exists(), "no golden file: run with VIME_UPDATE_GOLDEN=1 once"
    assert json.loads(GOLDEN.read_text()) == json.loads(text)


def test_text_report_names_every_phase_and_the_verdict(default_doc):
    text = format_text(default_doc)
    for label in ("rollout (14–32)", "offload (33–36)", "train (37–42)", "onload weights (43)",
                  "weight sync (44–53)", "onload KV (54)", "T_step", "Verdict: FITS", "GPU 7:", "host pinned"):
        assert label in text


def test_trace_is_well_formed(default_sim):
    trace = recorder_trace(default_sim.backends.recorder)
    events = trace["traceEvents"]
    assert events
    stacks: dict[tuple[int, int], list[str]] = defaultdict(list)
    last_ts: dict[tuple[int, int], float] = {}
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert {"phases", "GPU 0", "GPU 7"} <= names
    assert any(n.startswith("engine") for n in names) and any("actor" in n or "trainer" in n for n in names)
    counters = 0
    for e in events:
        jsonschema.validate(e, TRACE_EVENT_SCHEMA)
        key = (e["pid"], e["tid"])
        if e["ph"] in ("B", "E"):
            assert e["ts"] >= last_ts.get(key, float("-inf")), f"timestamps go back on track {key}"
            last_ts[key] = e["ts"]
            if e["ph"] == "B":
                stacks[key].append(e["name"])
            else:
                assert stacks[key] and stacks[key].pop() == e["name"], f"unbalanced end {e}"
        counters += e["ph"] == "C"
    assert all(not s for s in stacks.values()), "every begin has its end"
    assert counters > 0
    phase_names = {e["name"] for e in events if e["ph"] == "B" and e.get("cat") == "phases"}
    assert {"rollout", "offload", "train", "onload_weights", "weight_sync", "onload_kv"} <= phase_names


def test_cli_json_and_files(tmp_path):
    trace, report = tmp_path / "t.json", tmp_path / "r.html"
    out = subprocess.run([sys.executable, "-m", "vime.cli", "simulate", "--num-rollout", "1", "--json",
                          "--trace-out", str(trace), "--report", str(report)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    jsonschema.validate(doc, SIMULATE_SCHEMA)
    assert len(doc["steps"]) == 1
    assert json.loads(trace.read_text())["traceEvents"]
    html = report.read_text()
    # self-contained: the renderer and its data inline, nothing to fetch (the charts themselves: test_pages.py)
    assert 'id="vime-data"' in html and "<script src" not in html and "<link" not in html
    assert "http://" not in html.replace("http://www.w3.org", "") and "https://" not in html


def test_unknown_model_lists_known_ones():
    out = subprocess.run([sys.executable, "-m", "vime.cli", "simulate", "--model", "Qwen9-1T"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "Qwen3-4B" in out.stderr and "Traceback" not in out.stderr


def test_impossible_configuration_fails_at_parse_time():
    out = subprocess.run([sys.executable, "-m", "vime.cli", "simulate", "--tensor-model-parallel-size", "3"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "--tensor-model-parallel-size" in out.stderr and "Traceback" not in out.stderr


# --------------------------------------------------------------------------------------------
# OOM, fixes, sweeps, search
# --------------------------------------------------------------------------------------------


def test_oom_verdict_names_gpu_tag_and_a_fix_that_the_simulator_confirms():
    args = parse_args(["--model", "Qwen3-14B", "--num-rollout", "1"], command="simulate")
    from vime.runs.fixes import check_fixes

    sim = simulate(args)
    assert not sim.fits
    sim.fixes = check_fixes(sim)
    doc = build_document(sim, deterministic=True)
    # the colocated IPC staging buffer stays mapped (issue 17), so 4 falls 0.7 GiB short and 2 is the fix
    assert "lower --micro-batch-size to 2: fits" in " ".join(sim.fixes)
    jsonschema.validate(doc, SIMULATE_SCHEMA)
    o = doc["verdict"]["oom"]
    assert o["short_by_gib"] > 0 and o["owner"] and o["tag"] and 0 <= o["gpu"] < 8
    assert any(": fits" in f for f in doc["verdict"]["fixes"]), doc["verdict"]["fixes"]
    assert "Verdict: OOM" in format_text(doc)


def test_a_resident_trainers_kl_reference_is_offered_to_the_host_and_that_fix_is_simulated():
    """Qwen3-8B, resident trainer with a KL loss at 0.5: the engines' KV lacks what the reference's copy takes."""
    from vime.runs.fixes import check_fixes

    flags = ["--model", "Qwen3-8B", "--no-offload-train", "--use-kl-loss", "--kl-loss-coef", "0.01",
             "--gpu-memory-utilization", "0.5", "--num-rollout", "1"]
    sim = simulate(parse_args(flags, command="simulate"))
    assert not sim.fits and sim.oom.tag == "kv_cache"
    fixes = check_fixes(sim)
    assert any(f.startswith("keep the KL reference on the host (--ref-placement host") and ": fits" in f for f in fixes)
    assert simulate(parse_args([*flags, "--ref-placement", "host"], command="simulate")).fits
    # without a KL term there is no reference to move, and no such fix
    plain = simulate(parse_args(["--model", "Qwen3-14B", "--num-rollout", "1"], command="simulate"))
    assert not any("--ref-placement" in f for f in check_fixes(plain))


def test_sweep_oom_rows_match_hand_computed_memory():
    """Qwen3-14B on 80 GB GPUs: at TP 1 each rank holds bf16 params + fp32 grads = 6 bytes × 14.8 B params
    ≈ 82.5 GiB > 79.65 GiB before any activation, so it must OOM; at TP 4 that is 20.6 GiB and it fits."""
    from vime.sim.hardware import load_hardware
    from vime.sim.models import load_model

    n = load_model("Qwen3-14B").num_params()
    cap = load_hardware("H100-SXM-80G").memory_bytes
    assert 6 * n > cap > 6 * n / 4 + 12 * n / 8  # the hand computation itself
    base = parse_args(["--model", "Qwen3-14B", "--num-rollout", "1"], command="simulate")
    results = run_points(base, parse_sweep(["tensor-model-parallel-size=1,4"]), workers=1)
    by_tp = {r.changes["tensor_model_parallel_size"]: r for r in results}
    assert not by_tp[1].fits and ("grads" in by_tp[1].oom or "params" in by_tp[1].oom), by_tp[1].oom
    assert by_tp[4].fits and by_tp[4].t_step > 0
    assert results[0] is by_tp[4]  # ranked: fitting first


def test_sweep_rejects_unknown_flags_and_reports_invalid_points():
    from vime.errors import ConfigError

    with pytest.raises(ConfigError, match="not a simulation option"):
        parse_sweep(["no-such-flag=1,2"])
    with pytest.raises(ConfigError, match="FLAG=V1"):
        parse_sweep(["micro-batch-size"])
    base = parse_args(["--num-rollout", "1"], command="simulate")
    res = run_points(base, parse_sweep(["tensor-model-parallel-size=3"]), workers=1)
    assert not res[0].valid and "tensor-model-parallel-size" in res[0].error


def test_search_returns_a_configuration_the_simulator_confirms():
    base = parse_args(["--num-rollout", "1", "--model", "Qwen3-0.6B", "--rollout-batch-size", "8"],
                      command="simulate")
    best, ranked = search(base, goal="fastest", max_gpus=2, workers=1)
    assert best is not None and ranked[0] is best
    # Re-simulate the winner from its printed command line (plus what only the simulator reads, which a
    # `vime train` line leaves out, and less the prompts' placeholder: the search drew prompt lengths): it
    # fits and gives the same T_step.
    assert best.argv[:2] == ["vime", "train"]
    i = best.argv.index("--prompt-data")
    words = best.argv[2:i] + best.argv[i + 2:]
    again = simulate(parse_args(words + ["--num-rollout", "1", "--model", "Qwen3-0.6B"], command="simulate"))
    assert again.fits
    assert again.steps[0].t_step == pytest.approx(best.t_step, abs=1e-5)  # the table rounds to 1 µs


def test_offload_backend_choice_shows_in_the_train_phase():
    """torch_memory_saver pins host memory on every pause; vime's CuMem allocator keeps its buffers."""
    times = {}
    for backend in ("cumem", "torch_memory_saver"):
        sim = simulate(parse_args(["--num-rollout", "1", "--train-offload-backend", backend], command="simulate"))
        times[backend] = sim.steps[0]
    assert times["torch_memory_saver"].t_train > times["cumem"].t_train
    assert times["torch_memory_saver"].t_rollout == pytest.approx(times["cumem"].t_rollout)


def test_enforce_eager_slows_the_engines_steps_and_frees_the_graph_memory():
    """--enforce-eager: vLLM captures no CUDA graphs and compiles nothing, so every iteration launches its kernels
    (the profile's eager_iteration_s) and dispatches its layers' ops from Python (uncompiled_host_s_per_layer), and
    the graph pool's bytes go to the KV cache instead."""
    from vime.protocols import TAG_CUDA_GRAPH, TAG_KV_CACHE

    runs = {}
    for words in ([], ["--enforce-eager"]):
        sim = simulate(parse_args(["--num-rollout", "1", "--model", "Qwen3-0.6B", *words], command="simulate"))
        peaks = {tag: b.bytes for (gpu, owner, tag), b in sim.backends.recorder.tag_peaks.items()
                 if gpu == 0 and owner == "engine0"}
        runs[bool(words)] = (sim.steps[0], peaks)
    (graphs, with_graphs), (eager, without) = runs[False], runs[True]
    assert eager.t_rollout > graphs.t_rollout
    assert eager.t_train == pytest.approx(graphs.t_train)
    assert with_graphs[TAG_CUDA_GRAPH] > 0 and without.get(TAG_CUDA_GRAPH, 0) == 0
    # whole KV blocks: the pool grows by the graphs' bytes less what does not fill a block
    assert without[TAG_KV_CACHE] == pytest.approx(with_graphs[TAG_KV_CACHE] + with_graphs[TAG_CUDA_GRAPH], abs=2 << 20)


def test_without_async_scheduling_the_engines_cpu_step_follows_its_gpu_step():
    """--no-async-scheduling (vLLM before 0.10 had no other way): each iteration takes its GPU time plus its CPU step
    instead of the longer of the two, so the rollout is longer; the trainer's work is the same samples (packed into
    micro-batches in the order they finish, which the engines' timing moves: within 2 %)."""
    runs = {}
    for words in ([], ["--no-async-scheduling"]):
        sim = simulate(parse_args(["--num-rollout", "1", "--hardware", "H200-141G-measured", *words],
                                  command="simulate"))
        runs[bool(words)] = sim.steps[0]
    overlapped, serial = runs[False], runs[True]
    assert serial.t_rollout > overlapped.t_rollout * 1.05
    assert serial.t_train == pytest.approx(overlapped.t_train, rel=0.02)


def test_colocated_trainer_may_stay_resident_and_the_memory_check_decides():
    """--colocate --no-offload-train: no trainer offload/onload per step; the engines still sleep around training.

    With the default 0.9 memory budget the engines' KV cache no longer fits beside the resident trainer
    (an OOM at the first KV onload); at 0.5 it fits (the resident trainer empties PyTorch's cache after each train
    call) and the step is cheaper than offloading the trainer."""
    base = ["--num-rollout", "1"]
    tight = simulate(parse_args([*base, "--no-offload-train"], command="simulate"))
    assert not tight.fits and tight.oom.tag == "kv_cache"
    resident = simulate(parse_args([*base, "--no-offload-train", "--gpu-memory-utilization", "0.5"],
                                   command="simulate"))
    offloaded = simulate(parse_args([*base, "--gpu-memory-utilization", "0.5"], command="simulate"))
    assert resident.fits and offloaded.fits
    r, o = resident.steps[-1], offloaded.steps[-1]
    # the engines still sleep (the same offload phase); the trainer's wake and parking are gone from train
    assert r.t_offload == pytest.approx(o.t_offload) and r.t_offload > 0
    assert r.t_train < o.t_train
    assert r.t_step < o.t_step


def test_recompute_granularity_reaches_the_trainer_cost_model():
    """--recompute-granularity full reruns each layer's forward in the backward (≈ +1/3 of the matmuls) and
    keeps only layer inputs; selective with flash attention recomputes nothing that costs matmul time."""
    from vime.sim.trainer.cost_model import ActorCostModel

    def run(*extra: str):
        return simulate(parse_args(["--num-rollout", "1", *extra], command="simulate"))

    plain, selective, full = run(), run("--recompute-granularity", "selective"), run("--recompute-granularity", "full")
    assert full.backends.trainer.recompute == "full" and selective.backends.trainer.recompute == "selective"
    ratio = full.steps[-1].t_train / plain.steps[-1].t_train
    assert 1.1 < ratio < 1.4, ratio
    assert selective.steps[-1].t_train == pytest.approx(plain.steps[-1].t_train, rel=0.02)
    args = parse_args(["--recompute-granularity", "full"], command="simulate")
    from vime.sim.hardware import load_hardware
    from vime.sim.models import load_model

    m, hw = load_model("Qwen3-4B"), load_hardware("H100-SXM-80G")
    kept = ActorCostModel(args.cluster, args.parallel, m, hw, 8).activation_bytes(8 * 2048, [2048] * 8)
    dense = ActorCostModel(args.cluster, args.parallel, m, hw, 8, recompute="none").activation_bytes(8 * 2048, [2048] * 8)
    assert kept < dense / 4


def test_weight_sync_parts_add_up_to_the_phase(default_sim):
    """The publication's split (control calls, the trainer's export, the engines' loads) covers the whole phase."""
    for step in default_sim.steps:
        parts = step.weight_sync_parts
        assert set(parts) == {"control", "export", "load"} and all(t > 0 for t in parts.values())
        assert sum(parts.values()) == pytest.approx(step.t_weight_sync, rel=1e-9)
        m = step.metrics()
        assert m["perf/update_weights_export_time"] == parts["export"]
