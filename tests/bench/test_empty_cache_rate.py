"""bench/empty_cache_rate.py: the trainer's empty_cache seconds per GiB handed back, read off a run's own logs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vime.sim.hardware import load_hardware
from vime.testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
ecr = load_script(ROOT / "bench" / "empty_cache_rate.py", "vime_bench_empty_cache_rate")


def _run(tmp_path: Path, name: str, trained: list[float], sleeps: list[tuple[float, float]]) -> Path:
    run = tmp_path / name
    run.mkdir()
    rows = [{"rollout_id": i, "metrics": {"memory/trained_torch_cache_gib": c}} for i, c in enumerate(trained)]
    (run / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in [{"event": "start"}, *rows]))
    lines = []
    for left, secs in sleeps:
        lines.append(f"(MegatronActor pid=1) [vime trainer rank 0] asleep: params_gib 0.00, torch_cache_gib {left:.2f}, x 1")
        lines.append(f"(MegatronActor pid=1) [vime trainer rank 0] sleep parts (s): zero_grad 0.0070, pause 0.4, "
                     f"empty_cache {secs:.4f}, memory 0.0030")
    (run / "train_stderr.log").write_text("\n".join(lines) + "\n")
    return run


def test_each_sleep_after_training_pairs_the_cache_it_hands_back_with_its_seconds(tmp_path: Path):
    # the first sleep comes before any training (nothing cached): skipped; sleep k + 1 follows rollout k's training
    run = _run(tmp_path, "qwen3-x-h100_s1", [40.0, 41.0, 1.5], [(0.0, 0.002), (4.0, 0.030), (5.0, 0.018), (0.5, 0.002)])
    rows = ecr.samples(run)
    assert [r["rollout"] for r in rows] == [0, 1]  # rollout 2 freed 1 GiB: below MIN_GIB, its fixed part dominates
    assert rows[0]["freed_gib"] == pytest.approx(36.0) and rows[0]["s_per_gib"] == pytest.approx(0.030 / 36.0)
    assert rows[1]["s_per_gib"] == pytest.approx(0.018 / 36.0)
    assert ecr.kind_of(run) == "H100" and ecr.kind_of(tmp_path / "qwen3-x_s1") == "H200"
    assert ecr.samples(tmp_path / "missing") == []


def test_the_measured_profiles_carry_the_committed_medians():
    """The profiles' field is what the script finds in the committed runs (rerun --write after new runs)."""
    data = json.loads((ROOT / "bench" / "data" / "empty_cache_rate.json").read_text())
    assert load_hardware("H200-141G-measured").vmm.empty_cache_s_per_gib == round(data["median_s_per_gib"]["H200"], 7)
    assert load_hardware("H100-SXM-80G-measured").vmm.empty_cache_s_per_gib == round(data["median_s_per_gib"]["H100"], 7)
    assert data["runs"] == {p.name: ecr.samples(p) for p in sorted(ecr.RUNS.iterdir()) if p.is_dir() and ecr.samples(p)}
