"""bench/calibrate.py's profile fit, on a CPU: the H200 raw data kept in bench/data rebuilds the H200-141G-measured preset (issue 12)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from vime.errors import ConfigError
from vime.sim.engine import EngineSettings, IterationModel
from vime.sim.hardware import HardwareSpec, load_hardware
from vime.sim.hardware_parts import DiskCosts, Efficiency, Software, VmmCosts
from vime.sim.models import load_model
from vime.testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "bench" / "data"
RAW_PATH = DATA / "h200_calibration.json"
#: The later leases' raw files the preset was also fitted from (pinning, NCCL, the TP pair, Megatron steps).
EXTRA_RAW_PATHS = [DATA / f for f in ("h200_pin_cost.json", "h200x2_nccl.json", "h200x2_vllm_0.25.1_tp1.json",
                                     "h200x2_vllm_0.25.1_tp2.json", "h200_megatron_qwen3-0.6b_cumem.json", "h200_megatron_1.7b_accounting.json",
                                     "h200_megatron_1.7b_accounting_cast_bf16.json", "h200_gemm_train_sweep.json",
                                     "h200_gemm_train_sweep_repeat.json")]
VLLM_PATH = DATA / "h200_vllm_0.25.1.json"
BASE_PATH = ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G.json"
PRESET = load_hardware("H200-141G-measured")
PRESET_JSON = json.loads((ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G-measured.json").read_text())

#: Relative tolerance of each rebuilt value against the hand-fitted preset, and why it is that wide.
#: Measured rates and the exact fits (two unknowns from the same rows) must agree to rounding; the
#: preset rounded some values by hand (train_mfu to 3 digits, pinned_free to 3 significant digits,
#: the host step to 0.1 ms / 1 us, from a minimax the fit replaces by least squares: 3.57 ms + 60.8 us
#: per request vs 3.5 ms + 62 us). iteration_overhead_s is left out here: the 7 vLLM runs barely
#: constrain it (0.08 ms fitted vs 0.3 ms by hand; only the B=1 run feels it), so it is judged by the
#: predictions it gives (test_host_step_fit_predicts_the_vllm_runs_as_well_as_the_preset).
TOLERANCE = {
    "memory_bytes": 1e-12, "bf16_flops": 1e-12, "hbm_bytes_per_s": 1e-12, "host_link_h2d_bytes_per_s": 1e-12,
    "host_link_d2h_bytes_per_s": 1e-12, "nvlink_bytes_per_s": 1e-12, "internode_bytes_per_s": 1e-12,
    "cuda_context_bytes": 1e-12,
    "efficiency.decode_bw_util": 1e-9, "efficiency.decode_weight_bw_util": 1e-9, "efficiency.prefill_mfu": 1e-9,
    "efficiency.eager_iteration_s": 1e-9, "efficiency.host_copy_util": 1e-12, "efficiency.allreduce_bw_util": 1e-12,
    "efficiency.allgather_bw_util": 1e-12, "efficiency.collective_latency_s": 1e-12,
    "efficiency.host_step_tp_scale": 1e-12, "efficiency.trainer_call_s": 1e-12,
    "efficiency.train_host_step_s": 1e-12, "vmm.shared_map_s_per_gib": 1e-12,
    "efficiency.export_call_s": 1e-12, "efficiency.export_per_tensor_s": 1e-12,
    "efficiency.train_mfu": 0.005, "efficiency.train_attention_mfu": 1e-9, "efficiency.train_backward_factor": 1e-9,
    "efficiency.train_host_fwd_s_per_layer": 1e-9, "efficiency.train_host_bwd_s_per_layer": 1e-9,
    "efficiency.train_gemm_call_s": 1e-9, "efficiency.train_width_bytes_fwd": 1e-9, "efficiency.train_width_bytes_bwd": 1e-9,
    "vmm.create_map_s_per_gib": 1e-12, "vmm.unmap_release_s_per_gib": 1e-12, "vmm.pinned_alloc_s_per_gib": 1e-12,
    "vmm.pinned_free_s_per_gib": 0.001,
}
#: iteration_overhead_s: see above; train_host_s_per_expert and the trainer's state check and colocated wake: fitted on
#: whole RL steps (bench/fit_whole_step.py), not on calibrate.py's inputs;
#: host_step_s and host_step_per_seq_s: fitted by bench/fit_whole_step.py on calibrate.py's vLLM runs together with
#: vLLM's own decode steps in whole RL steps (/metrics), which calibrate.py does not read (its fit of the vLLM runs
#: alone is judged by test_host_step_fit_predicts_the_vllm_runs_as_well_as_the_preset);
#: uncompiled_host_s_per_layer: fitted by bench/eager_dispatch.py on a vLLM-alone bench under --enforce-eager;
#: train_expert_rows_half: the base preset's (a grouped-GEMM stack) in the rebuild, 0 in the preset, whose experts run
#: one by one as the whole steps it was fitted on (like train_expert_gemm_efficiency)
NOT_COMPARED = {"efficiency.iteration_overhead_s", "efficiency.iteration_layer_s", "efficiency.train_host_s_per_expert",
                "efficiency.state_check_per_tensor_s", "efficiency.state_check_bytes_per_s",
                "efficiency.released_wake_s_per_gib", "efficiency.released_wake_max_s",
                "efficiency.train_expert_gemm_efficiency", "efficiency.host_step_s", "efficiency.host_step_per_seq_s",
                "efficiency.uncompiled_host_s_per_layer", "efficiency.train_expert_rows_half",
                "vmm.empty_cache_s_per_gib",  # the whole steps' own sleeps (bench/empty_cache_rate.py)
                "efficiency.gemm_roofline_p"}  # vLLM's dense decode benches (bench/decode_roofline.py)


def _calibrate() -> Any:
    return load_script(ROOT / "bench" / "calibrate.py", "vime_bench_calibrate", register=True)


CAL = _calibrate()
RAW = json.loads(RAW_PATH.read_text())
VLLM = json.loads(VLLM_PATH.read_text())
BASE = json.loads(BASE_PATH.read_text())


@pytest.fixture(scope="module")
def rebuilt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The profile the CLI writes from the committed raw JSON (what a user re-running the fit gets)."""
    out = tmp_path_factory.mktemp("profile") / "H200-141G-measured.json"
    rc = CAL.main(["--from-raw", ",".join(map(str, [RAW_PATH, *EXTRA_RAW_PATHS])), "--vllm-raw", str(VLLM_PATH), "--base", str(BASE_PATH),
                   "--out", str(out)])
    assert rc == 0
    return out


def _numbers(spec: HardwareSpec) -> dict[str, float]:
    d = spec.to_dict()
    flat = {k: v for k, v in d.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    for section in ("efficiency", "vmm"):
        flat.update({f"{section}.{k}": v for k, v in d[section].items()})
    return flat


def _schema_keys() -> set[str]:
    # `engine` holds optional EngineSettings overrides (none measured on the H200 beyond the defaults);
    # `spread` is recorded afterwards by bench/spread.py from the rows the fitted profile predicts
    top = {f.name for f in dataclasses.fields(HardwareSpec)} - {"efficiency", "vmm", "software", "sources",
                                                                   "provenance", "path", "description", "engine",
                                                                   "disk", "spread"}
    return (top | {f"efficiency.{f.name}" for f in dataclasses.fields(Efficiency)}
            | {f"vmm.{f.name}" for f in dataclasses.fields(VmmCosts)}
            | {f"software.{f.name}" for f in dataclasses.fields(Software)}
            | {f"disk.{f.name}" for f in dataclasses.fields(DiskCosts)})


def test_rebuilt_profile_loads_and_writes_every_field(rebuilt: Path):
    data = json.loads(rebuilt.read_text())
    spec = load_hardware(str(rebuilt))
    assert spec.name == "H200-141G-measured"
    # every schema field is written out, not left to the loader's defaults
    written = {k for k in data if not isinstance(data[k], dict)}
    for section in ("efficiency", "vmm", "software", "disk"):
        written |= {f"{section}.{k}" for k in data[section]}
    assert _schema_keys() <= written, sorted(_schema_keys() - written)
    # every value the hand-fitted preset explains has a note, and every measured/fitted one says how
    # (the process-memory terms are fitted on whole RL steps by bench/fit_whole_step.py, not by calibrate.py)
    whole_step = {"software.trainer_process_bytes", "engine.outside_budget_bytes", "engine.sleep_backup_runtime",
                  "engine.graphs_beside_budget", "engine.kv_read_bytes_per_s", "engine.sample_s_per_logit"}
    missing = set(PRESET_JSON["sources"]) - whole_step - set(data["sources"])
    assert not missing, sorted(missing)
    for key in ("efficiency.train_mfu", "efficiency.decode_bw_util", "efficiency.prefill_mfu",
                "efficiency.eager_iteration_s", "efficiency.host_step_s", "efficiency.iteration_overhead_s"):
        assert "fit" in data["sources"][key], key
    prov = dict(spec.provenance)
    assert {"machine", "driver", "date", "command"} <= set(prov)
    assert prov["driver"] == RAW["env"]["driver"] and "H200" in prov["machine"]
    assert "calibrate.py" in prov["command"] and "vllm_bench.py" in prov["command"]


def test_rebuilt_profile_agrees_with_the_hand_fitted_preset(rebuilt: Path):
    spec = load_hardware(str(rebuilt))
    # the first-step residue is fitted on whole RL steps (bench/fit_trainer_residue.py), not on calibrate.py's inputs
    # and so is the trainer process's memory outside its allocator (bench/fit_whole_step.py)
    assert dataclasses.replace(spec.software, trainer_process_bytes=0) \
        == dataclasses.replace(PRESET.software, train_step_residue_bytes=0, trainer_process_bytes=0) \
        == Software("unfused", "torch", "torch", "unfused")
    ours, theirs = _numbers(spec), _numbers(PRESET)
    assert set(ours) == set(theirs) == set(TOLERANCE) | NOT_COMPARED
    off = {k: (ours[k], theirs[k]) for k, tol in TOLERANCE.items()
           if abs(ours[k] - theirs[k]) > tol * abs(theirs[k])}
    assert not off, off


def _decode_errors(hw: HardwareSpec) -> list[float]:
    im = IterationModel.build(hw, load_model("Qwen3-4B"),
                              EngineSettings(max_model_len=20480, max_num_seqs=256, max_num_batched_tokens=8192,
                                             **CAL.gpu_step_overrides(hw)))
    return [abs(CAL.vllm_decode_seconds(im, r["batch"], r["prompt_len"], r["max_tokens"]) - r["wall_s"]) / r["wall_s"]
            for r in VLLM["phases"]["decode"]]


def test_host_step_fit_predicts_the_vllm_runs_as_well_as_the_preset(rebuilt: Path):
    ours, theirs = _decode_errors(load_hardware(str(rebuilt))), _decode_errors(PRESET)
    assert len(ours) == 7
    # least squares over these runs alone: no worse in squares than the committed values. Its worst run: 10.6 % under
    # the benches' response building (0 + 32.2 us per token; 5.8 % under the whole steps' 6.4 ms + 19.5 us it replaced).
    # The committed values are fitted on the three 0.6B benches (bench/fit_whole_step.py section 7), this 4B run held
    # out: its host was a fast one (lockstep k 63 us against the fitted benches' 62-88), so within 20 %. The last row
    # (256 x 1024) is 17-18 % over under both since the GEMMs run in series with the KV read (bench/decode_roofline.py)
    assert sum(e * e for e in ours) <= sum(e * e for e in theirs)
    assert max(map(abs, ours[:-1])) < 0.12 and max(map(abs, theirs)) < 0.20 and abs(ours[-1]) < 0.20, (ours, theirs)


def _compare() -> Any:
    return load_script(ROOT / "bench" / "compare_calibration.py", "vime_bench_compare")


def test_engine_decode_helper_matches_compare_calibration():
    cmp_mod = _compare()
    im = cmp_mod._iter_model(PRESET, load_model("Qwen3-4B"))
    for r in VLLM["phases"]["decode"]:
        loop = cmp_mod.decode_run_seconds(im, r["batch"], r["prompt_len"], r["max_tokens"],
                                          EngineSettings().response_per_token_s, EngineSettings().response_per_request_s)
        assert CAL.vllm_decode_seconds(im, r["batch"], r["prompt_len"], r["max_tokens"]) == pytest.approx(loop, rel=1e-9)


def test_fit_is_deterministic():
    a = CAL.build_profile(RAW, VLLM, base=BASE)
    b = CAL.build_profile(json.loads(json.dumps(RAW)), json.loads(json.dumps(VLLM)), base=json.loads(json.dumps(BASE)))
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def test_without_vllm_json_the_host_step_comes_from_the_base_with_a_note():
    prof = CAL.build_profile(RAW, None, base=BASE)
    spec = HardwareSpec.from_dict(prof)
    for k in ("iteration_overhead_s", "host_step_s", "host_step_per_seq_s"):
        assert getattr(spec.efficiency, k) == load_hardware("H200-141G").to_dict()["efficiency"][k]
        assert "no vLLM bench JSON" in spec.source(f"efficiency.{k}")
    # the rest is fitted as with it
    assert spec.efficiency.prefill_mfu == pytest.approx(PRESET.efficiency.prefill_mfu, rel=1e-9)
    assert "vllm_bench.py" not in dict(spec.provenance)["command"]


@pytest.mark.parametrize(("result", "packages", "expected", "grads"), [
    # the committed run: local spec, bf16 grads (16 B/param of state), torch AdamW
    # (an older run: no classes recorded, norm weights never cast → torch's composite norms)
    ({"params": 1000, "state_bytes_after_init": 16000, "torch_optimizer": "AdamW"}, {},
     Software("unfused", "torch", "torch_fp32_weight", "unfused"), 2),
    # fp32 main grads: 18 B/param; apex / TE fused Adam
    ({"params": 1000, "state_bytes_after_init": 18000, "torch_optimizer": "FusedAdam"},
     {"apex": "0.1"}, Software("unfused", "fused", "torch_fp32_weight", "unfused"), 4),
    # the model cast to bf16 as vime's actor does: torch's RMSNorm takes its fused kernel
    ({"params": 1000, "state_bytes_after_init": 16000, "torch_optimizer": "AdamW", "cast_bf16": True,
      "software": {"layer0_classes": {"input_layernorm": "torch.nn.modules.normalization.RMSNorm"}}}, {},
     Software("unfused", "torch", "torch", "unfused"), 2),
    # a step that reports its stack explicitly wins over the inference
    ({"params": 1000, "state_bytes_after_init": 16000, "torch_optimizer": "AdamW", "transformer_engine": True,
      "grad_dtype": "fp32"}, {"transformer_engine": "2.4"}, Software("flash", "torch"), 4),
])
def test_software_section_follows_what_the_megatron_step_ran(result, packages, expected, grads):
    sw, notes = CAL._megatron_software(result, {"packages": packages})
    assert Software(**sw) == expected
    assert set(notes) == {f"software.{k}" for k in sw}
    # the grads' dtype is the run's: the bench's rows are predicted with it, the profile does not carry it
    assert CAL.bench_grad_bytes(result)[0] == grads


def test_cli_names_a_missing_raw_file(tmp_path: Path):
    with pytest.raises(SystemExit, match="--from-raw .*no such file"):
        CAL.main(["--from-raw", str(tmp_path / "nope.json"), "--out", str(tmp_path / "p.json")])
    with pytest.raises(SystemExit, match="--base .*no such file"):
        CAL.main(["--from-raw", str(RAW_PATH), "--base", str(tmp_path / "nope.json"), "--out", str(tmp_path / "p.json")])


def test_raw_data_without_a_base_for_the_unmeasured_rates_is_refused():
    # NVLink, network and the CUDA context are not measured on one GPU: without a base preset the
    # profile cannot be complete, and the loader names the field.
    with pytest.raises(ConfigError, match="nvlink_bytes_per_s"):
        CAL.build_profile({"env": RAW["env"], "hbm": RAW["hbm"], "gemm": RAW["gemm"], "host": RAW["host"]}, None)


def test_rebuilt_profile_scores_the_comparison_table_like_the_preset(rebuilt: Path):
    """bench/compare_calibration.py's 80 measured-vs-predicted rows: the re-fit profile keeps at least as
    many within 10 % as the hand-fitted preset, none of the preset's rows within 10 % leaves the band, and
    no row's error grows by more than 2 points (the host-step refit moves the vLLM runs by up to 1.2)."""
    cmp_mod = _compare()
    # the host step's terms and the GPU terms it was fitted under are the committed ones (see NOT_COMPARED; both are
    # bench/fit_whole_step.py's): the rest is what calibrate.py rebuilds
    data = json.loads(rebuilt.read_text())
    for k in ("host_step_s", "host_step_per_seq_s", "iteration_overhead_s"):
        data["efficiency"][k] = PRESET_JSON["efficiency"][k]
    for k in ("kv_read_bytes_per_s", "sample_s_per_logit"):
        data.setdefault("engine", {})[k] = PRESET_JSON["engine"][k]
    ours = [r for r in cmp_mod.rows_for(HardwareSpec.from_dict(data), RAW, VLLM) if r["group"] != "hardware"]
    theirs = [r for r in cmp_mod.rows_for(PRESET, RAW, VLLM) if r["group"] != "hardware"]
    assert [r["quantity"] for r in ours] == [r["quantity"] for r in theirs]

    def within(rows: list[dict]) -> int:
        return sum(abs(r["error_pct"]) <= 10 for r in rows)

    assert within(ours) >= within(theirs)
    pairs = list(zip(ours, theirs, strict=True))
    left = [o["quantity"] for o, t in pairs if abs(t["error_pct"]) <= 10 < abs(o["error_pct"])]
    assert not left, left
    worse = [(o["quantity"], o["error_pct"], t["error_pct"]) for o, t in pairs
             if abs(o["error_pct"]) > abs(t["error_pct"]) + 2.0]
    assert not worse, worse


def test_cli_merges_raw_files_of_several_calls(tmp_path: Path, rebuilt: Path):
    """The H200 raw came from three calibrate.py calls; split again, --from-raw a,b gives the same profile,
    and the older form (--out merged.json --profile p.json) also writes the merged raw."""
    first = {k: v for k, v in RAW.items() if k not in ("megatron", "cumem")}
    second = {"env": RAW["env"], "megatron": RAW["megatron"], "cumem": RAW["cumem"],
              "sections": {k: RAW["sections"][k] for k in ("megatron", "cumem")}}
    first["sections"] = {k: v for k, v in RAW["sections"].items() if k not in ("megatron", "cumem")}
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(first))
    b.write_text(json.dumps(second))
    merged, prof = tmp_path / "merged.json", tmp_path / "p.json"
    assert CAL.main(["--from-raw", ",".join(map(str, [a, b, *EXTRA_RAW_PATHS])), "--vllm-raw", str(VLLM_PATH), "--base", str(BASE_PATH),
                     "--out", str(merged), "--profile", str(prof)]) == 0
    assert json.loads(merged.read_text())["sections"] == RAW["sections"]
    ours, want = load_hardware(str(prof)), load_hardware(str(rebuilt))
    assert (ours.efficiency, ours.vmm, ours.software) == (want.efficiency, want.vmm, want.software)
    assert _numbers(ours) == _numbers(want)


def test_tp_host_scale_needs_a_tp_pair(tmp_path: Path):
    """--from-raw with vLLM runs: one at TP=1 and one at TP>1 of the same machine, or a clear refusal."""
    tp1 = json.loads((DATA / "h200x2_vllm_0.25.1_tp1.json").read_text())
    raw = CAL.merge_raw([RAW, tp1])
    with pytest.raises(SystemExit, match="pair from one machine"):
        CAL.build_profile(raw, VLLM, base=BASE)
    tp2 = json.loads((DATA / "h200x2_vllm_0.25.1_tp2.json").read_text())
    spec = HardwareSpec.from_dict(CAL.build_profile(CAL.merge_raw([RAW, tp1, tp2]), VLLM, base=BASE))
    # each step less its share of the API server's response building, which is one process whatever the TP
    s = EngineSettings()

    def step(d: dict) -> float:
        return d["s_per_step"] - d["batch"] * s.response_seconds(d["max_tokens"]) / d["max_tokens"]

    steps = {(d["batch"], d["max_tokens"]): step(d) for d in tp1["phases"]["decode"]}
    ratios = sorted(step(d) / steps[(d["batch"], d["max_tokens"])] for d in tp2["phases"]["decode"])
    assert spec.efficiency.host_step_tp_scale == pytest.approx(ratios[len(ratios) // 2])
    assert all(r < 1 for r in ratios)  # every decode run stepped faster at TP=2 on the same machine
    # the engine applies it only past TP=1
    hw = load_hardware("H200-141G-measured")
    im1 = IterationModel.build(hw, load_model("Qwen3-4B"), EngineSettings(tp=1))
    im2 = IterationModel.build(hw, load_model("Qwen3-4B"), EngineSettings(tp=2))
    assert im2.host(64) == pytest.approx(im1.host(64) * hw.efficiency.host_step_tp_scale)


def test_gemm_rows_give_their_rate_and_fixed_time_and_a_prediction_file_is_not_read():
    rate, fixed = 700e12, 15e-6
    rows = [{"preset": "p", "op": "o", "kind": "fwd", "m": m, "k": k, "n": n,
             "median_s": 2 * m * k * n / rate + fixed} for m in (1024, 8192) for k, n in ((1024, 4096), (2048, 2048))]
    got_rate, got_fixed = CAL._fit_gemm(rows)
    assert got_rate == pytest.approx(rate, rel=1e-9) and got_fixed == pytest.approx(fixed, rel=1e-9)
    raw = CAL.merge_raw([{"rows": rows, "predicted": False}, {"rows": rows[:1], "predicted": True}])
    assert raw["gemm_train"] == rows


def test_the_measured_train_terms_come_from_the_gemm_rows(rebuilt: Path):
    data = json.loads(rebuilt.read_text())
    eff, src = data["efficiency"], data["sources"]
    assert eff["train_backward_factor"] == 2.0 and eff["train_gemm_call_s"] > 0
    assert "gemm_train_sweep" in src["efficiency.train_mfu"] and "1.7b" in src["efficiency.train_width_bytes_fwd"]
    # fitted on the 1.7B steps only: the 0.6B and 4B steps are held out
    assert "qwen3-0.6b 8x" not in src["efficiency.train_width_bytes_fwd"]
