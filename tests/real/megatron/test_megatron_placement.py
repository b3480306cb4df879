"""Placement plans for trainer actors and engines: colocated, disaggregated, CPU-only (seed step 3)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vime.errors import ConfigError
from vime.real.megatron.placement import COLOCATED_ACTOR_GPU, COLOCATED_ENGINE_GPU, plan_placement


def _args(**kw):
    base = dict(actor_num_nodes=1, actor_num_gpus_per_node=8, colocate=True, rollout_num_gpus=None,
                rollout_num_gpus_per_engine=2)
    base.update(kw)
    return SimpleNamespace(**base)


def test_colocated_seed_scenario_shares_each_gpu_bundle():
    plan = plan_placement(_args(), use_gpus=True)
    assert plan.bundles == [{"GPU": 1.0, "CPU": 1.0}] * 8
    assert plan.actor_bundles == list(range(8))
    assert plan.engine_bundles == [[0, 1], [2, 3], [4, 5], [6, 7]]  # 4 engines × TP 2 on the same GPUs
    assert plan.actor_options["num_gpus"] == COLOCATED_ACTOR_GPU
    assert plan.engine_gpu_share == COLOCATED_ENGINE_GPU
    assert COLOCATED_ACTOR_GPU + COLOCATED_ENGINE_GPU <= 1.0


def test_disaggregated_gives_engines_their_own_bundles():
    plan = plan_placement(_args(actor_num_gpus_per_node=4, colocate=False, rollout_num_gpus=4), use_gpus=True)
    assert len(plan.bundles) == 8
    assert plan.actor_bundles == [0, 1, 2, 3]
    assert plan.engine_bundles == [[4, 5], [6, 7]]
    assert plan.actor_options["num_gpus"] == 1.0


def test_cpu_plan_fits_two_actors_on_two_cores():
    plan = plan_placement(_args(actor_num_gpus_per_node=2, colocate=False, rollout_num_gpus=0), use_gpus=False,
                          actor_num_cpus=0.5)
    assert plan.bundles == [{"CPU": 0.5}, {"CPU": 0.5}]
    assert "num_gpus" not in plan.actor_options
    assert sum(b["CPU"] for b in plan.bundles) <= 2


@pytest.mark.parametrize("kw, match", [
    ({"rollout_num_gpus": 4}, "must equal the trainer GPUs"),
    ({"colocate": False, "rollout_num_gpus": 3}, "not a multiple"),
    ({"actor_num_gpus_per_node": 0}, "no trainer rank"),
])
def test_inconsistent_cluster_flags_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        plan_placement(_args(**kw), use_gpus=True)


def test_plan_from_the_real_config():
    from vime.config import defaults

    plan = plan_placement(defaults("train"), use_gpus=True)
    assert plan.num_actors == 8 and len(plan.engine_bundles) == 4
