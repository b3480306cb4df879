"""The Ray side of a placement (seed step 3): join or start Ray, map plan nodes to Ray nodes, reserve the bundles, pin actors to them.

`vime.placement.plan_placement` says which bundles exist and which plan node each belongs to;
here `init_ray` joins the cluster a run names (or starts a private one), `assign_nodes` (pure)
picks a Ray node for every plan node — the driver's node first, then the others in a stable
order, several plan nodes on one machine when it has room — and
`reserve` creates one placement group whose bundles are pinned to those nodes with Ray's
``ray.io/node-id`` label selector, so an engine's TP group never straddles machines and the
trainer ranks land where the plan says. With GPUs, one probe task per bundle reads which
physical GPU Ray gave it (an engine's server needs CUDA_VISIBLE_DEVICES of all its bundles,
but its Ray actor sits in the first one only).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vime.errors import ConfigError, NodeLostError
from vime.placement import PlacementPlan

#: Ray's built-in node label (Ray >= 2.49), the key of the per-bundle label selector.
NODE_ID_LABEL = "ray.io/node-id"
_EPS = 1e-6


def init_ray(address: str | None = None, *, num_cpus: int | None = None, num_gpus: int | None = None) -> None:
    """Join the cluster at `address` ("auto" finds a running one), or start a private local Ray.

    Without an address a fresh local instance is started even when another cluster runs on this
    machine or $RAY_ADDRESS is set: joining one that nobody asked for would run on someone else's
    cluster (and Ray refuses num_cpus there). Who wants a cluster says so (`vime train
    --ray-address`, `ray_address_of`). Idempotent: an initialised Ray is kept (tests share one).
    """
    import ray

    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    ray.init(address="local", num_cpus=num_cpus if num_cpus is not None else os.cpu_count(), num_gpus=num_gpus,
             include_dashboard=False, log_to_driver=True)


def ray_address_of(flag: str | None, environ: Mapping[str, str] | None = None) -> str | None:
    """The cluster a run joins: ``--ray-address``, else $RAY_ADDRESS when the user set it, else None (private Ray)."""
    env = os.environ if environ is None else environ
    return flag or env.get("RAY_ADDRESS") or None


@dataclass(frozen=True)
class NodeInfo:
    """One alive Ray node: its id, the IP Ray reports, its total resources."""

    node_id: str
    ip: str
    resources: dict[str, float] = field(default_factory=dict)

    @property
    def short(self) -> str:
        return f"{self.ip} ({self.node_id[:8]})"


def ray_nodes() -> list[NodeInfo]:
    """The alive nodes of the connected cluster."""
    import ray

    return [NodeInfo(n["NodeID"], n["NodeManagerAddress"], dict(n.get("Resources") or {}))
            for n in ray.nodes() if n.get("Alive")]


def _fits(need: dict[str, float], free: dict[str, float]) -> bool:
    return all(free.get(k, 0.0) + _EPS >= v for k, v in need.items())


def assign_nodes(plan: PlacementPlan, nodes: list[NodeInfo], *, prefer: str | None = None) -> list[NodeInfo]:
    """The Ray node of each plan node: first fit over the driver's node (`prefer`), then the rest by IP and id.

    Plan nodes are taken largest demand first, so a big node is not filled by small groups before
    the group that needs all of it. Raises ConfigError naming what does not fit and what the
    cluster has.
    """
    order = sorted(nodes, key=lambda n: (n.node_id != prefer, n.ip, n.node_id))
    free = {n.node_id: dict(n.resources) for n in order}
    demand = {k: plan.node_demand(k) for k in range(plan.num_nodes)}
    chosen: dict[int, NodeInfo] = {}
    for k in sorted(demand, key=lambda k: (-sum(demand[k].values()), k)):
        for n in order:
            if _fits(demand[k], free[n.node_id]):
                for key, v in demand[k].items():
                    free[n.node_id][key] = free[n.node_id].get(key, 0.0) - v
                chosen[k] = n
                break
        else:
            have = "; ".join(f"{n.short}: " + ", ".join(f"{key} {n.resources.get(key, 0):g}" for key in sorted(demand[k]))
                             for n in order) or "no alive node"
            raise ConfigError(
                f"the placement needs {plan.num_nodes} node(s) and plan node {k} ({_fmt(demand[k])}) fits on no Ray "
                f"node that is left (nodes: {have}); start more nodes (see README, 'Ray clusters') or lower "
                f"--actor-num-nodes / --actor-num-gpus-per-node / --rollout-num-gpus")
    return [chosen[k] for k in range(plan.num_nodes)]


def _fmt(need: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in sorted(need.items()))


@dataclass
class ReservedPlacement:
    """A plan reserved on the cluster: its placement group, the Ray node of each plan node and, with
    GPUs, the physical GPU id of each bundle on its node."""

    plan: PlacementPlan
    pg: Any
    nodes: list[NodeInfo]  # Ray node of each plan node
    driver_node_id: str | None = None
    bundle_gpu_ids: list[int] | None = None  # per bundle; None without GPUs

    def bundle_node(self, bundle: int) -> NodeInfo:
        return self.nodes[self.plan.slots[bundle].node]

    def scheduling(self, bundle: int) -> Any:
        """Ray scheduling strategy pinning an actor to `bundle`."""
        return actor_scheduling(self.pg, bundle)

    def cuda_devices(self, bundles: tuple[int, ...] | list[int]) -> str | None:
        """CUDA_VISIBLE_DEVICES for a process that uses `bundles` (all on one node), or None without GPUs."""
        if self.bundle_gpu_ids is None:
            return None
        return ",".join(str(self.bundle_gpu_ids[b]) for b in bundles)

    def describe(self) -> list[str]:
        """The plan's lines with the Ray node each plan node landed on."""
        lines = self.plan.describe()
        return [lines[0]] + [f"{line}  [{self.nodes[k].short}]" for k, line in enumerate(lines[1:])]

    def lost_nodes(self, *, probe_timeout_s: float = 1.0) -> list[tuple[int, str]]:
        """The plan nodes whose Ray node is gone, each with how that shows: dead in Ray's node table, or
        its raylet refusing connections (Ray declares a node dead only after its health checks fail,
        seconds after the node's processes died, and a run's error can come first)."""
        import ray

        table = {n["NodeID"]: n for n in ray.nodes()}
        lost = []
        for k, node in enumerate(self.nodes):
            entry = table.get(node.node_id)
            if entry is None or not entry.get("Alive"):
                lost.append((k, "Ray marks it dead"))
            elif not _answers(entry.get("NodeManagerAddress", node.ip), entry.get("NodeManagerPort"), probe_timeout_s):
                lost.append((k, "its raylet does not answer"))
        return lost

    def on_node(self, k: int) -> str:
        """What the plan put on plan node `k`: its trainer ranks and engines."""
        plan = self.plan
        ranks = [str(r) for r, b in enumerate(plan.actor_bundles) if plan.slots[b].node == k]
        engines = [e.name for e in plan.engines if plan.slots[e.bundles[0]].node == k]
        parts = ([f"trainer rank{'s' if len(ranks) > 1 else ''} {', '.join(ranks)}"] if ranks else []) + \
                ([f"engine{'s' if len(engines) > 1 else ''} {', '.join(engines)}"] if engines else [])
        return " and ".join(parts) or "nothing of the run"

    def release(self) -> None:
        """Remove the placement group (idempotent; never raises)."""
        if self.pg is None:
            return
        import ray

        pg, self.pg = self.pg, None
        try:
            ray.util.remove_placement_group(pg)
        except Exception:  # noqa: BLE001 - teardown goes on whatever Ray says
            pass


def _answers(host: str, port: Any, timeout_s: float) -> bool:
    """Whether a TCP connection to host:port opens within `timeout_s` (True when no port is known)."""
    import socket

    if not port:
        return True
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return True
    except OSError:
        return False


def node_lost_error(reserved: ReservedPlacement, lost: list[tuple[int, str]], exc: BaseException) -> NodeLostError:
    """The error that ends a run whose node(s) `lost` left: which node, what ran there, what stopped the run."""
    gone = "; ".join(f"node {reserved.nodes[k].short} with {reserved.on_node(k)} ({how})" for k, how in lost)
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return NodeLostError(f"{gone} left the cluster and the run cannot go on without it (it stopped on: "
                         f"{type(exc).__name__}: {first}) — restart from the last checkpoint (--load) once the node "
                         f"is back, or on the nodes left")


def reserve(plan: PlacementPlan, *, timeout_s: float = 120.0) -> ReservedPlacement:
    """Reserve `plan` on the connected cluster: assign nodes, create the placement group, probe GPU ids."""
    import ray
    from ray.util.placement_group import placement_group

    driver = ray.get_runtime_context().get_node_id()
    nodes = assign_nodes(plan, ray_nodes(), prefer=driver)
    selectors = [{NODE_ID_LABEL: nodes[s.node].node_id} for s in plan.slots]
    pg = placement_group(list(plan.bundles), strategy=plan.strategy, bundle_label_selector=selectors)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        ray.util.remove_placement_group(pg)
        raise ConfigError(f"Ray could not reserve {len(plan.bundles)} bundles on "
                          + ", ".join(f"node {k} = {n.short} ({_fmt(plan.node_demand(k))})" for k, n in enumerate(nodes))
                          + f" within {timeout_s:.0f}s (free now: {ray.available_resources()}); other work holds "
                            "them, or reduce the actor/engine GPU counts")
    reserved = ReservedPlacement(plan, pg, nodes, driver_node_id=driver)
    if plan.use_gpus:
        try:
            reserved.bundle_gpu_ids = _probe_gpus(reserved)
        except BaseException:
            reserved.release()
            raise
    return reserved


def _probe_gpus(reserved: ReservedPlacement) -> list[int]:
    """The physical GPU index (on its node) that Ray gave each bundle, read by a tiny task in it."""
    import ray

    @ray.remote(num_cpus=0, num_gpus=0.01)
    def where() -> tuple[str, list[int]]:
        ctx = ray.get_runtime_context()
        return ctx.get_node_id(), [int(g) for g in ray.get_gpu_ids()]

    got = ray.get([where.options(scheduling_strategy=reserved.scheduling(b)).remote()
                   for b in range(len(reserved.plan.slots))])
    ids = []
    for b, (node_id, gpus) in enumerate(got):
        want = reserved.bundle_node(b).node_id
        if node_id != want or len(gpus) != 1:
            raise ConfigError(f"bundle {b} landed on node {node_id[:8]} with GPUs {gpus}, not on {want[:8]} "
                              "with one GPU as reserved; Ray's placement disagrees with the plan")
        ids.append(gpus[0])
    return ids


def actor_scheduling(pg: Any, bundle_index: int) -> Any:
    """Ray scheduling strategy that pins an actor to one bundle of `pg`."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    return PlacementGroupSchedulingStrategy(placement_group=pg, placement_group_bundle_index=bundle_index,
                                            placement_group_capture_child_tasks=True)


__all__ = ["NODE_ID_LABEL", "NodeInfo", "ReservedPlacement", "actor_scheduling", "assign_nodes", "init_ray",
           "ray_address_of", "ray_nodes", "reserve"]
