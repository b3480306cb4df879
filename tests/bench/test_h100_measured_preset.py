"""The H100-SXM-80G-measured preset is what bench/h100_measured_preset.py builds from the committed H100 data."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from vime.sim.hardware import load_hardware

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "h100_measured_preset.py"


def test_the_committed_preset_is_the_build():
    out = subprocess.run([sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stdout + out.stderr


def test_chip_fields_are_the_h100s_and_software_fields_the_h200s():
    h100, h200 = load_hardware("H100-SXM-80G-measured"), load_hardware("H200-141G-measured")
    sweep = json.loads((ROOT / "bench/data/h100_calibration_s25/h100_gemm_train_sweep_2026-12-05s25.json").read_text())
    assert sweep["device"].startswith("NVIDIA H100")
    # the chip: its own memory, HBM and GEMM figures, each source naming the H100's files
    assert h100.memory_bytes < 90e9 < h200.memory_bytes
    assert h100.hbm_bytes_per_s < 0.8 * h200.hbm_bytes_per_s
    assert h100.efficiency.train_gemm_call_s > 1.3 * h200.efficiency.train_gemm_call_s
    for key in ("hbm_bytes_per_s", "efficiency.train_mfu", "efficiency.train_gemm_call_s", "efficiency.decode_bw_util",
                "vmm.create_map_s_per_gib"):
        assert h100.source(key).startswith("H100:") and "h100_calibration_s25" in h100.source(key), key
    # the software: the trainer's host floors and the engine's CPU costs are the H200 profile's, said so
    for key in ("efficiency.train_host_fwd_s_per_layer", "efficiency.host_step_s", "efficiency.train_width_bytes_fwd"):
        group, name = key.split(".")
        assert getattr(h100.efficiency, name) == getattr(h200.efficiency, name), key
        assert h100.source(key).startswith("H200-141G-measured's"), key
    assert "H100" in h100.source("nvlink_bytes_per_s")


@pytest.mark.parametrize("gpu, preset", [("NVIDIA H100 80GB HBM3", "H100-SXM-80G-measured"),
                                         ("NVIDIA H200", "H200-141G-measured")])
def test_a_real_run_is_twinned_with_the_measured_preset_of_its_gpu(gpu, preset):
    from vime.runs.twin import hardware_for

    assert hardware_for([gpu]) == preset


@pytest.mark.parametrize("run", ["qwen3-0.6b-cumem-1g-mbs4-h100_2026-12-05s26",
                                 "qwen3-0.6b-cumem-1g-mbs2-r2048-h100_2026-12-05s26"])
def test_the_h100s_own_memory_levels_sit_inside_the_borrowed_memory_spread(run: str):
    """The preset borrows the H200's measured memory spread (the same software): the H100's own whole steps, their
    levels while rolling out and while training against the simulated phases' peaks, fall inside it."""
    sys.path.insert(0, str(ROOT / "bench"))
    from spread import simulate_flags

    from vime.config import parse_args
    from vime.runs.sim import simulate

    folder = ROOT / "bench" / "data" / "h200_train_e2e" / run
    hw = load_hardware("H100-SXM-80G-measured")
    spread = dict(hw.spread)
    sim = simulate(parse_args(simulate_flags((folder / "command.txt").read_text(), "Qwen3-0.6B", hw.name),
                              command="simulate"))
    levels = json.loads((folder / "compare.json").read_text())["memory"]["gpus"]["0"]
    for phase in ("rollout", "train"):
        ratio = max(levels[f"{phase}_mib"]) * 2**20 / sim.backends.recorder.phase_peaks[(0, phase)]
        q = spread[f"whole_step_{phase}_memory"]
        assert q.low <= ratio <= q.high, (phase, ratio, q)
