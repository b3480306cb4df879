"""The B200 and GB200 presets hold what bench/blackwell_presets.py derives from the published chip figures."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from vime.sim.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "blackwell_presets.py"
sys.path.insert(0, str(ROOT / "bench"))

import blackwell_presets  # noqa: E402


def test_the_committed_presets_are_the_derivation():
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_blackwell_rates_are_the_h100s_scaled_by_the_published_ratios():
    data = json.loads(blackwell_presets.DATA.read_text())
    r = blackwell_presets.decode_ratio(data)
    assert 0.7 < r < 0.85  # a Blackwell GPU reads a smaller share of its HBM in vLLM's decode than an H100
    h100 = load_hardware("H100-SXM-80G")
    for chip in blackwell_presets.CHIPS:
        hw = load_hardware(chip)
        g = blackwell_presets.gemm_ratio(data, chip)
        assert hw.efficiency.train_mfu == round(h100.efficiency.train_mfu * g, 3)
        assert hw.efficiency.decode_weight_bw_util == round(h100.efficiency.decode_weight_bw_util * r, 4)
        # the decode's bytes per second still beat the H100's: a faster chip, used less fully
        assert hw.hbm_bytes_per_s * hw.efficiency.decode_bw_util > 1.5 * h100.hbm_bytes_per_s * h100.efficiency.decode_bw_util
        for key in ("efficiency.train_mfu", "efficiency.decode_bw_util", "efficiency.prefill_mfu"):
            assert hw.source(key).startswith("derived (bench/blackwell_presets.py)"), key
    gb200 = load_hardware("GB200")
    assert gb200.host_link_h2d_bytes_per_s == 201e9 and "nvbandwidth" in gb200.source("host_link_h2d_bytes_per_s")


def test_the_check_fails_when_a_preset_drifts(tmp_path, monkeypatch):
    for chip in blackwell_presets.CHIPS:
        (tmp_path / f"{chip}.json").write_text((blackwell_presets.HW / f"{chip}.json").read_text())
    (tmp_path / "H100-SXM-80G.json").write_text((blackwell_presets.HW / "H100-SXM-80G.json").read_text())
    gb = json.loads((tmp_path / "GB200.json").read_text())
    gb["efficiency"]["decode_bw_util"] = 0.75
    (tmp_path / "GB200.json").write_text(json.dumps(gb, indent=2) + "\n")
    monkeypatch.setattr(blackwell_presets, "HW", tmp_path)
    assert blackwell_presets.main(["--check"]) == 1
    assert blackwell_presets.main([]) == 0 and blackwell_presets.main(["--check"]) == 0
