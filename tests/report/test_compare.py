"""vime.report.compare with several measured runs: the median, the spread, and the allowance max(spread, tolerance) (issue 26)."""

from __future__ import annotations

import pytest

from vime.config import parse_args
from vime.report.compare import PHASES, compare_runs, format_table
from vime.runs.document import build_document
from vime.runs.sim import simulate


@pytest.fixture(scope="module")
def prediction() -> dict:
    args = parse_args(["--num-rollout", "3", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus-per-engine", "1",
                       "--tensor-model-parallel-size", "1", "--model", "Qwen3-0.6B", "--rollout-batch-size", "4",
                       "--n-samples-per-prompt", "4", "--micro-batch-size", "4"], command="simulate")
    return build_document(simulate(args), deterministic=True)


def _run(prediction: dict, factor: dict[str, float]) -> tuple[dict, list[dict]]:
    """A measured run whose phases are the predicted ones times `factor` (per phase)."""
    steps = []
    for s in prediction["steps"]:
        phases = {p: t * factor.get(p, 1.0) for p, t in s["phases"].items()}
        steps.append({"event": "step", "rollout_id": s["rollout_id"], "phases": phases, "t_gap": 0.0,
                      "t_step": sum(phases.values()), "metrics": {**s["metrics"],
                                                                  "rollout/weight_version": s["rollout_id"] + 1.0}})
    return {"event": "startup", "weight_version": 1, **{k: v for k, v in prediction["startup"].items()}}, steps


def test_several_runs_give_the_median_the_spread_and_the_allowance(prediction: dict) -> None:
    # rollout measured 0.8x, 1.0x, 1.2x the prediction: median = predicted, spread ±20 %;
    # train measured 2x in every run: error −50 %, spread 0 → off (allowed 20 %)
    runs = [_run(prediction, {"rollout": f, "train": 2.0}) for f in (0.8, 1.0, 1.2)]
    doc = compare_runs(runs, prediction, tolerance_pct=20.0)
    assert doc["runs"] == 3 and doc["ok"], doc["problems"]
    mean = doc["mean_steady_steps"]
    r = mean["rollout"]
    assert r["measured_s"] == pytest.approx(r["predicted_s"]) and r["error_pct"] == pytest.approx(0.0, abs=1e-9)
    assert r["spread_pct"] == pytest.approx(20.0) and r["within"] and r["allowed_pct"] == pytest.approx(20.0)
    assert len(r["measured_runs_s"]) == 3
    t = mean["train"]
    assert t["error_pct"] == pytest.approx(-50.0) and t["spread_pct"] == pytest.approx(0.0) and not t["within"]
    assert all(mean[p]["within"] for p in PHASES if p not in ("train",))
    # a wide spread widens the allowance: offload measured 0.5x .. 1.5x, error 0, allowed 50 %
    doc = compare_runs([_run(prediction, {"offload": f}) for f in (0.5, 1.0, 1.5)], prediction)
    assert doc["mean_steady_steps"]["offload"]["allowed_pct"] == pytest.approx(50.0)
    text = format_table(doc, steps=False)
    assert "median of 3 runs" in text and "spread %" in text and "within (allowed 50 %)" in text
    assert "step 1 (" not in text  # steps=False prints start-up and the steady mean only


def test_a_run_missing_a_step_or_a_version_is_a_problem(prediction: dict) -> None:
    good = _run(prediction, {})
    short = (good[0], good[1][:-1])
    doc = compare_runs([good, short], prediction)
    assert not doc["ok"] and any("in run 2" in p and "not measured" in p for p in doc["problems"])
    stale = (good[0], [dict(s, metrics={**s["metrics"], "rollout/weight_version": 1.0}) for s in good[1]])
    doc = compare_runs([good, stale], prediction)
    assert not doc["weight_versions"]["ok"] and any("in run 2" in p for p in doc["problems"])
    assert "calls" not in doc  # neither side recorded calls
