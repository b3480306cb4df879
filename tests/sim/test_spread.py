"""Uncertainty bands: the measured profile's spread comes from the calibration data, and every phase's band from it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from vime.cli.simulate import format_text
from vime.config import parse_args
from vime.errors import ConfigError
from vime.report.bands import uncertainty_section, with_bands
from vime.report.schema import SIMULATE_SCHEMA
from vime.runs.document import build_document
from vime.runs.sim import simulate
from vime.sim.hardware import HardwareSpec, load_hardware
from vime.sim.spread import PHASE_QUANTITIES, QuantitySpread, memory_band, parse_spread, uncertainty
from vime.testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G-measured.json"


def _bench_spread() -> Any:
    sys.path.insert(0, str(ROOT / "bench"))
    return load_script(ROOT / "bench" / "spread.py", "vime_bench_spread")


@pytest.fixture(scope="module")
def measured_doc() -> dict[str, Any]:
    args = parse_args(["--hardware", "H200-141G-measured"], command="simulate")
    return build_document(simulate(args), deterministic=True)


def test_committed_spread_is_what_the_calibration_data_give():
    """The profile's spread section equals bench/spread.py's recomputation from bench/data (calibration rows and
    the whole H200 steps re-simulated): a model change that moves a prediction fails here until the spread is
    recorded again (--write)."""
    recomputed = _bench_spread().measured_spread()
    assert json.loads(PROFILE.read_text())["spread"] == recomputed
    # every quantity a phase rests on has calibration rows on the measured H200
    assert {q for qs in PHASE_QUANTITIES.values() for q in qs} <= set(recomputed)
    for key, q in recomputed.items():
        assert q["low"] <= 1.0 <= q["high"] and q["rows"] >= 1
        assert ("h200_train_e2e" if key.startswith("whole_step_") else "compare_calibration") in q["source"]


def test_whole_step_flags_are_the_runs_own_minus_what_only_a_real_run_takes():
    mod = _bench_spread()
    flags = mod.simulate_flags("+ vime train --backend real --colocate --hf-checkpoint /m --prompt-data /p.jsonl "
                               "--micro-batch-size 2 --model /m/config.json --hardware /x.json "
                               "--custom-rm-path a.b", "Qwen3-4B", "H200-141G-measured")
    assert flags == ["--colocate", "--micro-batch-size", "2", "--model", "Qwen3-4B", "--hardware", "H200-141G-measured"]


def test_both_offload_backends_train_phases_of_the_h200_runs_are_modelled_alike():
    """The whole H200 steps' train phase, measured/predicted, per run: the torch_memory_saver run sits with the
    cumem runs (it was x0.33 while the simulator parked a whole region the real trainer does not have)."""
    ratios = _bench_spread().whole_step_ratios()["train"]
    tms = [r for name, r in ratios if "torch_memory_saver" in name]
    cumem = [r for name, r in ratios if "cumem" in name]
    assert tms and cumem
    assert min(cumem) / 1.25 <= min(tms) and max(tms) <= max(cumem) * 1.25, (tms, cumem)


def test_spread_rows_are_ratios_of_measured_to_predicted():
    mod = _bench_spread()
    rows = [{"group": "vLLM sleep/wake", "quantity": "sleep level 2", "measured": 0.10, "predicted": 0.08, "unit": "s",
             "spread": [0.08, 0.12], "n": 3},
            {"group": "vLLM sleep/wake", "quantity": "wake weights (L1)", "measured": 0.3, "predicted": 0.3, "unit": "s"},
            {"group": "Megatron-core step", "quantity": "peak allocated x", "measured": 9.0, "predicted": 8.0,
             "unit": "B"}]
    out = mod.compute(rows, "test")
    assert out["engine_sleep"]["low"] == pytest.approx(1.0) and out["engine_sleep"]["high"] == pytest.approx(1.5)
    assert out["engine_wake"] == {"low": 1.0, "high": 1.0, "rows": 1, "source": out["engine_wake"]["source"]}
    assert "train_compute" not in out  # a memory row is no time spread


@pytest.mark.parametrize("bad, needle", [
    ({"nonsense": {"low": 0.9, "high": 1.1, "rows": 1, "source": "x"}}, "not a known quantity"),
    ({"engine_sleep": {"low": 1.2, "high": 1.3, "rows": 1, "source": "x"}}, "low ≤ 1 ≤ high"),
    ({"engine_sleep": {"low": 0.9, "high": float("nan"), "rows": 1, "source": "x"}}, "low ≤ 1 ≤ high"),
    ({"engine_sleep": {"low": 0.9, "high": 1.1, "rows": 0, "source": "x"}}, "rows must be"),
    ({"engine_sleep": {"low": 0.9, "high": 1.1, "rows": 2, "source": " "}}, "source must say"),
    ({"engine_sleep": {"low": 0.9, "high": 1.1}}, "must be"),
    ([1, 2], "spread must be an object"),
])
def test_bad_spread_sections_are_refused_naming_the_field(bad, needle):
    with pytest.raises(ConfigError, match="spread") as e:
        parse_spread(bad, "p.json")
    assert needle in str(e.value) and "p.json" in str(e.value)


def test_phase_band_is_the_widest_of_what_it_rests_on():
    spread = (("collective", QuantitySpread(0.95, 1.05, 8, "s")), ("engine_generate", QuantitySpread(0.8, 1.4, 3, "s")),
              ("train_compute", QuantitySpread(0.7, 1.2, 5, "s")), ("trainer_sleep_wake", QuantitySpread(0.9, 1.3, 2, "s")))
    unc = uncertainty("X", spread, {"rollout": 10.0, "train": 4.0, "weight_sync": 1.0, "offload": 0.2, "gap": 0.5}, 15.7)
    assert unc["basis"] == "X"
    assert unc["phases"]["rollout"]["low_s"] == pytest.approx(8.0) and unc["phases"]["rollout"]["high_s"] == pytest.approx(14.0)
    assert unc["phases"]["train"]["low_factor"] == 0.7 and unc["phases"]["train"]["high_factor"] == 1.3
    assert unc["phases"]["train"]["unmeasured"] == ["whole_step_train"]
    ws = unc["phases"]["weight_sync"]  # only the collective measured: its band, the rest named as unmeasured
    assert (ws["low_factor"], ws["high_factor"]) == (0.95, 1.05)
    assert ws["unmeasured"] == ["weight_update", "whole_step_weight_sync"]
    off = unc["phases"]["offload"]  # nothing it rests on measured: no band, and it says why
    assert off["low_s"] is None and "engine_sleep" in off["why"]
    assert unc["phases"]["gap"]["low_s"] is None and "no calibration rows" in unc["phases"]["gap"]["why"]
    assert unc["t_step"]["low_s"] == pytest.approx(8.0 + 2.8 + 0.95 + 0.2 + 0.5)
    assert unc["t_step"]["high_s"] == pytest.approx(14.0 + 5.2 + 1.05 + 0.2 + 0.5)
    assert unc["t_step"]["unbanded"] == ["offload", "gap"]


def _gpu(peak: float, cap: float = 80.0, train: float = 40.0) -> dict[str, Any]:
    return {"gpu": 0, "peak_gib": peak, "capacity_gib": cap, "phase_peaks_gib": {"rollout": peak, "train": train}}


MEMORY_SPREAD = (("whole_step_rollout_memory", QuantitySpread(0.98, 1.01, 40, "s")),
                 ("whole_step_train_memory", QuantitySpread(0.98, 1.09, 40, "s")))


def test_memory_band_flags_a_fit_whose_headroom_the_model_has_missed_by():
    """A GPU that fits is at risk when a phase's peak times what measured levels ran over the model passes the
    capacity: the engines' phases by the rollout level's spread, the train phase by the train level's."""
    tight = memory_band("X", MEMORY_SPREAD, [_gpu(79.5)])["gpus"][0]
    assert tight["at_risk"] and tight["high_phase"] == "rollout"
    assert tight["peak_high_gib"] == pytest.approx(79.5 * 1.01, abs=1e-4) and tight["high_factor"] == 1.01
    assert not memory_band("X", MEMORY_SPREAD, [_gpu(78.0)])["gpus"][0]["at_risk"]  # 78.8 < 80
    trained = memory_band("X", MEMORY_SPREAD, [_gpu(76.0, train=75.0)])["gpus"][0]  # 75 x 1.09 = 81.75
    assert trained["at_risk"] and trained["high_phase"] == "train" and trained["high_factor"] == 1.09
    assert not memory_band("X", MEMORY_SPREAD, [_gpu(81.0)])["gpus"][0]["at_risk"]  # out of memory, not at risk
    none = memory_band("X", MEMORY_SPREAD[:1], [_gpu(79.5)])
    assert none["gpus"] == [] and none["high_factor"] is None and "whole_step_train_memory" in none["why"]


def test_the_h100_run_that_ran_out_would_have_been_flagged():
    """The 27th session's Qwen3-1.7B on an H100: the flat residue of record predicted 0.07 GiB of headroom (it ran
    out at the KV wake); the measured memory spread marks such a fit at risk, and the text says so."""
    args = parse_args(["--model", "Qwen3-1.7B", "--hardware", "H100-SXM-80G-measured", "--actor-num-gpus-per-node", "1",
                       "--tensor-model-parallel-size", "1", "--rollout-num-gpus", "1", "--rollout-num-gpus-per-engine",
                       "1", "--micro-batch-size", "4", "--rollout-batch-size", "32", "--n-samples-per-prompt", "8",
                       "--global-batch-size", "256", "--response-length", "fixed:1024", "--prompt-length", "fixed:128",
                       "--gpu-memory-utilization", "0.89", "--num-rollout", "2"], command="simulate")
    sim = simulate(args)
    doc = build_document(sim, deterministic=True)
    jsonschema.validate(doc, SIMULATE_SCHEMA)
    g = doc["memory"]["gpus"][0]
    assert doc["verdict"]["fits"] and g["headroom_gib"] < 0.5 and doc["verdict"]["at_risk"]
    assert doc["uncertainty"]["memory"]["gpus"][0]["peak_high_gib"] > g["capacity_gib"]
    assert "AT RISK" in format_text(doc)
    from vime.report.html import render_html

    assert 'class="kpi warn"><div class="kpi-label">At risk' in render_html(doc, sim.backends.recorder)


def test_a_profile_without_spread_says_its_error_is_unknown():
    unc = uncertainty("H100-SXM-80G", (), {"rollout": 1.0, "train": 2.0}, 3.0)
    assert unc["basis"] is None and unc["t_step"] is None and unc["quantities"] == {}
    assert all(p["low_s"] is None for p in unc["phases"].values())
    assert "no measured spread" in unc["note"]


def test_measured_profile_bands_every_phase_of_a_simulation(measured_doc):
    jsonschema.validate(measured_doc, SIMULATE_SCHEMA)
    assert measured_doc["schema"] == "vime.simulate/1.3"
    unc, phases = measured_doc["uncertainty"], measured_doc["summary"]["phases"]
    spread = dict(load_hardware("H200-141G-measured").spread)
    assert unc["basis"] == "H200-141G-measured" and set(unc["quantities"]) == set(spread)
    for name, p in phases.items():
        b = unc["phases"][name]
        if not PHASE_QUANTITIES[name]:
            assert b["low_s"] is None
            continue
        lo = min(spread[q].low for q in PHASE_QUANTITIES[name])
        hi = max(spread[q].high for q in PHASE_QUANTITIES[name])
        assert b["low_s"] == pytest.approx(p["seconds"] * lo, abs=1e-4)
        assert b["high_s"] == pytest.approx(p["seconds"] * hi, abs=1e-4)
        assert b["low_s"] <= p["seconds"] <= b["high_s"]
    assert unc["t_step"]["low_s"] < measured_doc["summary"]["t_step"] < unc["t_step"]["high_s"]
    mem = unc["memory"]  # the seed scenario on the measured H200 has room beyond the memory model's spread
    assert mem["high_factor"] >= 1.0 and not measured_doc["verdict"]["at_risk"]
    assert all(m["peak_low_gib"] <= g["peak_gib"] <= m["peak_high_gib"] < g["capacity_gib"]
               for m, g in zip(mem["gpus"], measured_doc["memory"]["gpus"], strict=True))


def test_band_follows_the_profile_file(tmp_path):
    """The band is the profile's recorded spread, not a constant: a profile with a wider rollout spread widens it."""
    data = json.loads(PROFILE.read_text())
    data["name"] = "H200-wider"
    # wider than every quantity the rollout's band rests on (engine_generate, whole_step_rollout)
    data["spread"]["engine_generate"] = {**data["spread"]["engine_generate"], "low": 0.3, "high": 3.0}
    path = tmp_path / "wider.json"
    path.write_text(json.dumps(data))
    doc = build_document(simulate(parse_args(["--hardware", str(path)], command="simulate")), deterministic=True)
    band = doc["uncertainty"]["phases"]["rollout"]
    assert (band["low_factor"], band["high_factor"]) == (0.3, 3.0)
    assert band["high_s"] == pytest.approx(3.0 * doc["summary"]["phases"]["rollout"]["seconds"], abs=1e-4)


def test_profile_round_trips_its_spread():
    hw = load_hardware("H200-141G-measured")
    again = HardwareSpec.from_dict(json.loads(json.dumps(hw.to_dict())), origin="round trip")
    assert again.spread == hw.spread and hw.spread


def test_text_and_page_show_the_bands(measured_doc):
    text = format_text(measured_doc)
    rollout = measured_doc["uncertainty"]["phases"]["rollout"]
    assert "band: measured spread" in text and f"{rollout['low_s']:7.3f}–{rollout['high_s']:7.3f}" in text
    page_doc = with_bands(measured_doc)
    assert page_doc["summary"]["phases"]["rollout"]["band"] == [rollout["low_s"], rollout["high_s"]]
    assert "band" not in measured_doc["summary"]["phases"]["rollout"]  # the document itself is not changed
    section = uncertainty_section(measured_doc)
    assert "How firm each phase is" in section and f"engine_generate ({measured_doc['uncertainty']['quantities']['engine_generate']['rows']} rows)" in section


def test_default_preset_text_says_no_band():
    doc = build_document(simulate(parse_args(["--num-rollout", "1"], command="simulate")), deterministic=True)
    assert "no band: H100-SXM-80G records no measured spread" in format_text(doc)
    assert with_bands(doc) is doc
    assert "No band" in uncertainty_section(doc)
