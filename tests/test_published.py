"""The published-reference plans (bench/published.py): every expressible reference has one, and each parses."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from vime.config import parse_args
from vime.runs.sim import simulate

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("published", ROOT / "bench" / "published.py")
published = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(published)
REFERENCES = {p.parent.name: json.loads(p.read_text()) for p in (ROOT / "bench/data/published").glob("*/reference.json")}


def test_every_expressible_reference_has_a_plan_and_no_plan_is_orphaned():
    expressible = {rid for rid, ref in REFERENCES.items() if ref.get("expressible")}
    assert expressible == set(published.PLANS)


@pytest.mark.parametrize("rid", sorted(published.PLANS))
def test_each_plan_is_a_valid_vime_simulate_command_on_the_references_gpus(rid):
    plan = published.PLANS[rid]
    args = parse_args([*plan["args"], "--num-rollout", "1"], command="simulate")
    ref = REFERENCES[rid]
    gpus = args.actor_num_nodes * args.actor_num_gpus_per_node + (0 if args.colocate else args.rollout_num_gpus)
    assert gpus == ref["hardware"]["num_gpus"]
    assert set(plan["map"]) and all(plan["map"].values())


@pytest.mark.parametrize("rid", sorted(published.REVISIONS))
def test_each_revision_names_a_plan_says_why_and_parses(rid):
    assert rid in published.PLANS
    words = [w for ws, why in published.REVISIONS[rid] for w in ws]
    assert all(why for _, why in published.REVISIONS[rid])
    parse_args([*published.PLANS[rid]["args"], *words, "--num-rollout", "1"], command="simulate")


def test_implied_mean_reads_the_mean_off_a_monotone_curve_and_refuses_outside_it():
    curve = [(250, 10.0), (1000, 40.0), (4000, 160.0)]  # time proportional to the mean
    assert published._implied_mean(curve, 20.0) == pytest.approx(500.0)
    assert published._implied_mean(curve, 160.0) == pytest.approx(4000.0)
    assert published._implied_mean(curve, 5.0) is None and published._implied_mean(curve, 200.0) is None


def test_the_capped_mean_response_averages_the_target_after_the_engines_cap():
    from vime.sim.lengths import make_distribution

    for mean, cap in ((1019, 3796), (3251, 3796), (5671, 7892)):
        assert make_distribution(published._capped_mean_response(mean, cap)).mean(cap) == pytest.approx(mean, rel=1e-3)
    # near the cap the cut takes much off a lognormal with that mean before it: the reason for the revision
    assert make_distribution(published._mean_response(3251)).mean(3796) < 0.85 * 3251


@pytest.mark.parametrize("rid", sorted(published.MAP_REVISIONS))
def test_each_map_revision_renames_a_reported_metric_to_a_simulated_quantity(rid):
    remap, why = published.MAP_REVISIONS[rid]
    assert why and set(remap) <= set(published.PLANS[rid]["map"])
    sim = simulate(parse_args(["--model", "Qwen3-0.6B", "--rollout-batch-size", "4", "--num-rollout", "1"],
                              command="simulate"))
    q = published._quantities(sim)
    assert all(k in q for keys in remap.values() for k in keys)
    # prompt + response tokens per step-second per GPU, above the trained (response) tokens' rate
    assert q["sequence_tokens_per_s_per_gpu"] > q["tokens_per_s_per_gpu"] > 0
