"""Hardware presets: every preset loads, every value has a source, user files round-trip, bad files fail clearly."""

from __future__ import annotations

import json

import pytest

from vime.errors import ConfigError
from vime.sim.hardware import DEFAULT_HARDWARE, HardwareSpec, list_hardware, load_hardware

PRESETS = ["A100-80G", "B200", "H100-SXM-80G", "H200-141G", "L20"]
VALUE_KEYS = ["memory_bytes", "bf16_flops", "hbm_bytes_per_s", "nvlink_bytes_per_s", "internode_bytes_per_s",
              "host_link_h2d_bytes_per_s",
              "host_link_d2h_bytes_per_s", "cuda_context_bytes"]


def test_presets_are_listed_and_the_default_is_h100():
    assert set(PRESETS) <= set(list_hardware())  # calibrated profiles may join them
    assert list_hardware() == sorted(list_hardware())
    assert DEFAULT_HARDWARE == "H100-SXM-80G"
    assert load_hardware().name == "H100-SXM-80G"


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_value_names_its_source(name):
    hw = load_hardware(name)
    keys = VALUE_KEYS + [f"efficiency.{k}" for k in hw.to_dict()["efficiency"]] + \
        [f"vmm.{k}" for k in hw.to_dict()["vmm"]]
    missing = [k for k in keys if not hw.source(k)]
    assert missing == []
    assert 0 < hw.efficiency.train_mfu <= 1 and 0 < hw.efficiency.decode_bw_util <= 1


def test_datasheet_peaks():
    """Dense bf16 is half the datasheet's sparsity figure (1,979 TFLOPS rounded); bandwidths as published."""
    h100, h200, a100 = load_hardware("H100-SXM-80G"), load_hardware("H200-141G"), load_hardware("A100-80G")
    assert h100.bf16_flops == 989.4e12 and h200.bf16_flops == h100.bf16_flops
    assert (h100.hbm_bytes_per_s, h200.hbm_bytes_per_s, a100.hbm_bytes_per_s) == (3.35e12, 4.8e12, 2.039e12)
    assert a100.bf16_flops == 312e12
    assert 79 * 2**30 < h100.memory_bytes < 80 * 2**30
    assert 139 * 2**30 < h200.memory_bytes < 141 * 2**30


def test_effective_rates_are_peak_times_efficiency():
    hw = load_hardware("H100")  # alias
    assert hw.train_flops == hw.bf16_flops * hw.efficiency.train_mfu
    assert hw.d2h_bytes_per_s == hw.host_link_d2h_bytes_per_s * hw.efficiency.host_copy_util
    assert hw.decode_bytes_per_s == hw.hbm_bytes_per_s * hw.efficiency.decode_bw_util
    # ring all-reduce moves 2(g-1)/g of the buffer; a group of one costs nothing
    assert hw.allreduce_seconds(1e9, 2, calls=0) == pytest.approx(1e9 / hw.allreduce_bytes_per_s)
    assert hw.allreduce_seconds(1e9, 1) == 0.0
    assert hw.allgather_seconds(1e9, 4, calls=0) == pytest.approx(0.75e9 / hw.allreduce_bytes_per_s)
    # a group spanning nodes runs at the network's rate
    assert hw.allgather_seconds(1e9, 16, inter_node=True, calls=0) == pytest.approx(
        15 / 16 * 1e9 / (hw.internode_bytes_per_s * hw.efficiency.allreduce_bw_util))


def test_unknown_name_lists_the_presets():
    with pytest.raises(ConfigError) as info:
        load_hardware("H300")
    for name in PRESETS:
        assert name in str(info.value)


def test_user_file_round_trips(tmp_path):
    hw = load_hardware("H200-141G")
    data = hw.to_dict()
    data["name"] = "H200-calibrated"
    data["efficiency"]["decode_bw_util"] = 0.81
    path = tmp_path / "h200.json"
    path.write_text(json.dumps(data))
    loaded = load_hardware(str(path))
    assert loaded.name == "H200-calibrated" and loaded.efficiency.decode_bw_util == 0.81
    assert loaded.to_dict() == data
    assert loaded.path == str(path)


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d.pop("bf16_flops"), "missing field"),
    (lambda d: d.update(bf16_flops=-1), "must be > 0"),
    (lambda d: d["efficiency"].update(train_mfu=1.5), "in \\(0, 1\\]"),
    (lambda d: d["efficiency"].update(mfu=0.4), "unknown efficiency field"),
    (lambda d: d.update(clock_ghz=1.9), "unknown field"),
    (lambda d: d.update(memory_bytes="80GB"), "must be a number"),
])
def test_bad_profiles_fail_naming_the_field(tmp_path, mutate, message):
    data = load_hardware("L20").to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=message):
        load_hardware(str(path))


def test_optional_fields_take_their_defaults(tmp_path):
    data = load_hardware("H100").to_dict()
    for key in ("internode_bytes_per_s", "description", "sources", "vmm"):
        data.pop(key)
    data["efficiency"] = {"train_mfu": 0.5}
    path = tmp_path / "minimal.json"
    path.write_text(json.dumps(data))
    hw = load_hardware(str(path))
    assert hw.internode_bytes_per_s == 50e9 and hw.efficiency.train_mfu == 0.5
    assert hw.efficiency.host_copy_util == 1.0 and hw.vmm.create_map_s_per_gib > 0 and hw.source("bf16_flops") == ""


def test_missing_file_and_bad_json(tmp_path):
    with pytest.raises(ConfigError, match="no such file"):
        load_hardware(str(tmp_path / "nope.json"))
    bad = tmp_path / "x.json"
    bad.write_text("{")
    with pytest.raises(ConfigError, match="is not JSON"):
        load_hardware(str(bad))


def test_spec_is_frozen():
    hw = load_hardware()
    with pytest.raises(AttributeError):
        hw.bf16_flops = 1.0  # type: ignore[misc]
    assert isinstance(HardwareSpec.from_dict(hw.to_dict()), HardwareSpec)


def test_collectives_pay_a_latency_per_call_and_all_gather_its_own_bandwidth():
    """H200 pair (bench/data/h200x2_nccl.json): ~42 us per call, all-gather slower than all-reduce."""
    hw = load_hardware("H200-141G-measured")
    eff = hw.efficiency
    assert 30e-6 < eff.collective_latency_s < 60e-6
    assert 0 < eff.allgather_bw_util < eff.allreduce_bw_util
    nbytes = 1 << 30
    bare = hw.allreduce_seconds(nbytes, 2, calls=0)
    assert bare == pytest.approx(nbytes / (hw.nvlink_bytes_per_s * eff.allreduce_bw_util))
    assert hw.allreduce_seconds(nbytes, 2, calls=3) == pytest.approx(bare + 3 * eff.collective_latency_s)
    assert hw.allgather_seconds(nbytes, 2, calls=0) == pytest.approx(
        nbytes / 2 / (hw.nvlink_bytes_per_s * eff.allgather_bw_util))
    # a datasheet preset carries the measured per-call latency (NCCL software) but keeps one bandwidth for both
    h100 = load_hardware("H100-SXM-80G")
    assert h100.efficiency.collective_latency_s == eff.collective_latency_s
    assert h100.allgather_seconds(nbytes, 2, calls=0) * 2 == pytest.approx(h100.allreduce_seconds(nbytes, 2, calls=0))
    assert h100.allreduce_seconds(nbytes, 1) == 0.0


@pytest.mark.parametrize("preset", ["H100-SXM-80G", "H200-141G", "A100-80G", "B200", "L20"])
def test_datasheet_presets_carry_the_measured_driver_costs(preset):
    """Mapping memory and pinning pages are driver/host work: every datasheet preset uses the H200's measurement,
    unless its own chip measured them (the H100's VMM, pinning and eager-launch costs, 2026-12-05; its trainer's
    empty_cache on its own whole steps)."""
    from vime.sim.hardware import CARRIABLE

    measured, hw = load_hardware("H200-141G-measured"), load_hardware(preset)
    own = 0
    for key in CARRIABLE:
        group, name = key.split(".")
        if hw.source(key).startswith("measured:"):  # on this chip, with the file it came from
            own += 1
            assert preset == "H100-SXM-80G", key
            assert any(f in hw.source(key) for f in ("bench/data/h100_calibration_s25", "bench/data/empty_cache_rate")), key
            continue
        assert getattr(getattr(hw, group), name) == getattr(getattr(measured, group), name), key
        assert hw.source(key).startswith("carried from H200-141G-measured"), key
    assert own == (6 if preset == "H100-SXM-80G" else 0)
    # what a datasheet does give stays the chip's own
    assert hw.source("bf16_flops") and "carried" not in hw.source("bf16_flops")
    assert hw.to_dict()["vmm"]["create_map_s_per_gib"] < 0.001  # the 0.02 s/GiB estimate is gone


def _with_carry(tmp_path, carry, **extra):
    import json

    data = load_hardware("H100-SXM-80G").to_dict()
    for key in carry.get("fields", []):
        group, name = key.split(".")
        data.get(group, {}).pop(name, None)
    for key, value in extra.items():
        group, name = key.split(".")
        data[group][name] = value
    data["carry"] = carry
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_user_profile_may_carry_driver_costs_and_bad_carries_are_named(tmp_path):
    good = _with_carry(tmp_path, {"from": "H200-141G-measured", "fields": ["vmm.create_map_s_per_gib"], "why": "same driver"})
    hw = load_hardware(good)
    assert hw.vmm.create_map_s_per_gib == load_hardware("H200-141G-measured").vmm.create_map_s_per_gib
    assert "same driver" in hw.source("vmm.create_map_s_per_gib")
    with pytest.raises(ConfigError, match="not a driver/software cost"):
        load_hardware(_with_carry(tmp_path, {"from": "H200-141G-measured", "fields": ["efficiency.train_mfu"]}))
    with pytest.raises(ConfigError, match="is not a preset"):
        load_hardware(_with_carry(tmp_path, {"from": "H999", "fields": ["vmm.create_map_s_per_gib"]}))
    with pytest.raises(ConfigError, match="both set and carried"):
        load_hardware(_with_carry(tmp_path, {"from": "H200-141G-measured", "fields": ["vmm.create_map_s_per_gib"]},
                                  **{"vmm.create_map_s_per_gib": 0.5}))
    with pytest.raises(ConfigError, match="carry must be"):
        load_hardware(_with_carry(tmp_path, {"from": "H200-141G-measured"}))
