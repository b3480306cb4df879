"""The published-reference plans (bench/published.py): every expressible reference has one, and each parses."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from vime.config import parse_args

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
