"""Ray start-up and placement groups for trainer actors and rollout engines (seed step 3).

`plan_placement` is pure: from the cluster flags it computes the bundles and which bundle each
trainer rank and each engine GPU uses. Colocated, a bundle is one GPU shared by a trainer rank
and its engine's share; disaggregated, trainers and engines get separate bundles. Without GPUs
(CPU CI) the bundles hold fractional CPUs only, so two actors fit on a 2-core machine.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from vime.errors import ConfigError

#: GPU share of a colocated trainer rank and of a colocated engine on the same bundle (sum < 1,
#: so Ray lets both sit on one GPU; the memory split is handled by sleep/wake, not by Ray).
COLOCATED_ACTOR_GPU = 0.4
COLOCATED_ENGINE_GPU = 0.2


@dataclass(frozen=True)
class PlacementPlan:
    """Bundles and their users. `actor_bundles[r]` is trainer rank r's bundle; `engine_bundles[e]`
    lists engine e's bundles (one per GPU of its TP group)."""

    bundles: list[dict[str, float]]
    actor_bundles: list[int]
    engine_bundles: list[list[int]]
    actor_options: dict[str, float] = field(default_factory=dict)  # num_cpus / num_gpus per actor
    engine_gpu_share: float = 0.0
    colocate: bool = True
    strategy: str = "PACK"

    @property
    def num_actors(self) -> int:
        return len(self.actor_bundles)


def _arg(args: Any, name: str, default: Any) -> Any:
    value = getattr(args, name, None)
    return default if value is None else value


def plan_placement(args: Any, *, use_gpus: bool, actor_num_cpus: float = 0.5) -> PlacementPlan:
    """Placement for `args` (vime.config.Args or any object with the cluster flag names)."""
    nodes = int(_arg(args, "actor_num_nodes", 1))
    per_node = int(_arg(args, "actor_num_gpus_per_node", 1))
    colocate = bool(_arg(args, "colocate", True))
    actors = nodes * per_node
    if actors < 1:
        raise ConfigError(f"--actor-num-nodes {nodes} × --actor-num-gpus-per-node {per_node} gives no trainer rank")
    rollout_gpus = int(_arg(args, "rollout_num_gpus", actors if colocate else 0))
    per_engine = int(_arg(args, "rollout_num_gpus_per_engine", 1))
    if rollout_gpus and per_engine < 1:
        raise ConfigError(f"--rollout-num-gpus-per-engine must be >= 1, got {per_engine}")
    if rollout_gpus % max(per_engine, 1):
        raise ConfigError(f"--rollout-num-gpus {rollout_gpus} is not a multiple of "
                          f"--rollout-num-gpus-per-engine {per_engine}")
    if colocate and rollout_gpus != actors:
        raise ConfigError(f"--colocate shares GPUs, so --rollout-num-gpus ({rollout_gpus}) must equal the "
                          f"trainer GPUs ({actors}); drop --rollout-num-gpus or turn off --colocate")
    engines = rollout_gpus // per_engine if rollout_gpus else 0
    unit: dict[str, float] = {"GPU": 1.0, "CPU": 1.0} if use_gpus else {"CPU": actor_num_cpus}
    if colocate:
        bundles = [dict(unit) for _ in range(actors)]
        actor_bundles = list(range(actors))
        engine_first = 0
        actor_gpu, engine_gpu = COLOCATED_ACTOR_GPU, COLOCATED_ENGINE_GPU
    else:
        bundles = [dict(unit) for _ in range(actors + rollout_gpus)]
        actor_bundles = list(range(actors))
        engine_first = actors
        actor_gpu, engine_gpu = 1.0, 1.0
    engine_bundles = [list(range(engine_first + e * per_engine, engine_first + (e + 1) * per_engine))
                      for e in range(engines)]
    if use_gpus:
        # Colocated, the bundle's CPU is shared with the engine's Ray actor as well.
        options = {"num_cpus": 0.5 if colocate else 1.0, "num_gpus": actor_gpu}
    else:
        options = {"num_cpus": actor_num_cpus / 2 if colocate and engines else actor_num_cpus}
    return PlacementPlan(bundles=bundles, actor_bundles=actor_bundles, engine_bundles=engine_bundles,
                         actor_options=options, engine_gpu_share=engine_gpu if use_gpus else 0.0,
                         colocate=colocate)


def init_ray(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """Join the cluster at `address` ("auto" finds a running one), or start a private local Ray.

    Without an address a fresh local instance is started even when another cluster runs on this
    machine: joining whatever /tmp/ray/ray_current_cluster names would run on someone else's
    cluster and make Ray refuse num_cpus. Idempotent: an initialised Ray is kept (tests share one).
    """
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    ray.init(address="local", num_cpus=num_cpus if num_cpus is not None else os.cpu_count(), num_gpus=num_gpus,
             include_dashboard=False, log_to_driver=True)


def create_placement_group(plan: PlacementPlan, *, timeout_s: float = 120.0) -> Any:
    """Reserve the plan's bundles; raise a clear error when the cluster cannot hold them."""
    import ray
    from ray.util.placement_group import placement_group

    pg = placement_group(plan.bundles, strategy=plan.strategy)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(pg)
        need: dict[str, float] = {}
        for b in plan.bundles:
            for k, v in b.items():
                need[k] = need.get(k, 0.0) + v
        raise ConfigError(f"Ray could not reserve {len(plan.bundles)} bundles ({need}) within {timeout_s:.0f}s; "
                          f"cluster has {ray.cluster_resources()}; reduce the actor/engine GPU counts")
    return pg


def actor_scheduling(pg: Any, bundle_index: int) -> Any:
    """Ray scheduling strategy that pins an actor to one bundle of `pg`."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle_index,
                                            placement_group_capture_child_tasks=True)
