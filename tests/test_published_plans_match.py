"""Each published-reference plan still resolves to the configuration its committed prediction was simulated with."""

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


@pytest.mark.parametrize("rid", sorted(published.PLANS))
def test_plan_matches_the_pre_registered_prediction(rid):
    path = ROOT / "bench/data/published" / rid / "predicted.json"
    committed = json.loads(path.read_text())["vime_args"]
    now = [*published.PLANS[rid]["args"], "--num-rollout", str(published.STEPS)]
    assert parse_args(now, command="simulate").to_dict() == parse_args(committed, command="simulate").to_dict()
