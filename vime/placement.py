"""Where a run's trainer ranks and rollout engines go — nodes, placement-group bundles, GPU ids — computed from the cluster flags alone (seed steps 2–3).

`plan_placement(cluster, use_gpus=...)` (the ClusterConfig group) is a pure function (no Ray, no torch), so the config rules
check it at parse time, ``--dry-run`` prints it, and the real session reserves exactly it
(`vime.real.cluster`). The layout, with G = ``--actor-num-gpus-per-node`` GPUs per node:

- trainer rank r sits on node ``r // G``, GPU ``r % G`` (bundle r);
- colocated (``--colocate``): engine e uses the GPUs of trainer ranks ``[e·g, (e+1)·g)``,
  g = ``--rollout-num-gpus-per-engine``, so its CUDA-IPC weights come from the ranks on its own
  GPUs; an engine whose GPUs would straddle two nodes is refused;
- disaggregated (``--no-colocate``): the engines get their own bundles after the trainer's, on
  rollout nodes of max(G, g) GPUs, never split across nodes.

Bundle b is GPU b of the simulator's global numbering (`vime.sim.backends`), so `vime simulate`
models the same layout. Without GPUs (CPU runs) a bundle holds a share of a node's CPUs instead.
A plan node is a group of bundles that must share one machine; `vime.real.cluster` maps plan
nodes to Ray nodes (several plan nodes may share a large enough machine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vime.errors import ConfigError

if TYPE_CHECKING:
    from vime.config.options import ClusterConfig

#: GPU share of a colocated trainer rank and of a colocated engine on the same bundle (sum < 1,
#: so Ray lets both sit on one GPU; the memory split is handled by sleep/wake, not by Ray).
COLOCATED_ACTOR_GPU = 0.4
COLOCATED_ENGINE_GPU = 0.2


@dataclass(frozen=True)
class Slot:
    """One bundle of the placement group: one GPU (on CPU, one device-sized CPU share) of a plan node."""

    bundle: int
    node: int
    gpu: int  # index among the node's GPUs


@dataclass(frozen=True)
class EnginePlace:
    """One rollout engine: its bundles (one per TP rank), all on `node`."""

    index: int
    node: int
    bundles: tuple[int, ...]
    gpus: tuple[int, ...]  # GPU indices on its node, in TP-rank order
    ranks: tuple[int, ...]  # trainer ranks on the same GPUs (colocated), else ()

    @property
    def name(self) -> str:
        return f"engine{self.index}"


@dataclass(frozen=True)
class PlacementPlan:
    """Bundles and their users. `actor_bundles[r]` is trainer rank r's bundle; `engines[e].bundles`
    are engine e's (the first one hosts its Ray actor); `slots[b]` says where bundle b is."""

    colocate: bool
    gpus_per_node: int
    slots: tuple[Slot, ...]
    actor_bundles: tuple[int, ...]
    engines: tuple[EnginePlace, ...]
    bundles: tuple[dict[str, float], ...]  # Ray resources of each bundle
    actor_options: dict[str, float]  # num_cpus / num_gpus of a trainer actor
    engine_options: dict[str, float]  # num_cpus / num_gpus of an engine's Ray actor
    use_gpus: bool = True
    strategy: str = "PACK"

    @property
    def num_actors(self) -> int:
        return len(self.actor_bundles)

    @property
    def num_nodes(self) -> int:
        return 1 + max(s.node for s in self.slots)

    @property
    def engine_bundles(self) -> list[list[int]]:
        return [list(e.bundles) for e in self.engines]

    @property
    def engine_gpu_share(self) -> float:
        return float(self.engine_options.get("num_gpus", 0.0))

    def rank_node(self, rank: int) -> int:
        return self.slots[self.actor_bundles[rank]].node

    def node_bundles(self, node: int) -> list[int]:
        return [s.bundle for s in self.slots if s.node == node]

    def node_demand(self, node: int) -> dict[str, float]:
        """The resources plan node `node` needs from one machine: the sum of its bundles."""
        need: dict[str, float] = {}
        for b in self.node_bundles(node):
            for k, v in self.bundles[b].items():
                need[k] = need.get(k, 0.0) + v
        return need

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: per node its GPUs, trainer ranks and engines (``--dry-run --json``)."""
        nodes = []
        for k in range(self.num_nodes):
            nodes.append({
                "node": k,
                "gpus": [self.slots[b].gpu for b in self.node_bundles(k)],
                "trainer_ranks": [r for r in range(self.num_actors) if self.rank_node(r) == k],
                "engines": [{"name": e.name, "gpus": list(e.gpus), "bundles": list(e.bundles),
                             "trainer_ranks": list(e.ranks)} for e in self.engines if e.node == k],
            })
        return {"colocate": self.colocate, "devices": "gpu" if self.use_gpus else "cpu",
                "gpus_per_node": self.gpus_per_node, "num_nodes": self.num_nodes,
                "num_bundles": len(self.slots), "nodes": nodes}

    def describe(self) -> list[str]:
        """One line per plan node: its GPUs, the trainer ranks and the engines on it."""
        mode = "colocated: engines on their trainer ranks' GPUs" if self.colocate else \
            "disaggregated: engines on their own GPUs"
        unit = "GPU" if self.use_gpus else "CPU slot"
        lines = [f"placement: {self.num_nodes} node(s), {len(self.slots)} {unit}(s) ({mode})"]
        for k in range(self.num_nodes):
            gpus = [self.slots[b].gpu for b in self.node_bundles(k)]
            ranks = [r for r in range(self.num_actors) if self.rank_node(r) == k]
            parts = [f"{unit}s {_span(gpus)}"]
            if ranks:
                parts.append(f"trainer ranks {_span(ranks)}")
            engines = [e for e in self.engines if e.node == k]
            if engines:
                parts.append("engines " + ", ".join(f"{e.name}@{_span(list(e.gpus))}" for e in engines))
            lines.append(f"  node {k}: " + "; ".join(parts))
        return lines


def _span(xs: list[int]) -> str:
    """``0-7`` for a run of consecutive integers, else ``0,2,5``."""
    if not xs:
        return "-"
    if len(xs) > 1 and xs == list(range(xs[0], xs[0] + len(xs))):
        return f"{xs[0]}-{xs[-1]}"
    return ",".join(str(x) for x in xs)


def plan_placement(cluster: ClusterConfig, *, use_gpus: bool, actor_num_cpus: float = 0.5) -> PlacementPlan:
    """The placement of the cluster flags (`rollout_num_gpus` None: the colocated default, the trainer's GPUs).

    `use_gpus` False gives CPU bundles of `actor_num_cpus` each. Raises ConfigError, naming the
    flags, when the counts do not divide or an engine would span two nodes.
    """
    nodes = int(cluster.actor_num_nodes)
    per_node = int(cluster.actor_num_gpus_per_node)
    colocate = bool(cluster.colocate)
    actors = nodes * per_node
    if nodes < 1 or per_node < 1:
        raise ConfigError(f"--actor-num-nodes {nodes} × --actor-num-gpus-per-node {per_node} gives no trainer rank")
    rollout_gpus = int(cluster.rollout_num_gpus if cluster.rollout_num_gpus is not None else
                       (actors if colocate else 0))
    per_engine = int(cluster.rollout_num_gpus_per_engine)
    if per_engine < 1:
        raise ConfigError(f"--rollout-num-gpus-per-engine must be >= 1, got {per_engine}")
    if rollout_gpus < 0 or rollout_gpus % per_engine:
        raise ConfigError(f"--rollout-num-gpus {rollout_gpus} is not a multiple of "
                          f"--rollout-num-gpus-per-engine {per_engine}")
    if colocate and rollout_gpus != actors:
        raise ConfigError(f"--colocate shares GPUs, so --rollout-num-gpus ({rollout_gpus}) must equal the "
                          f"trainer GPUs ({actors}); drop --rollout-num-gpus or turn off --colocate")
    num_engines = rollout_gpus // per_engine
    slots = [Slot(b, b // per_node, b % per_node) for b in range(actors)]
    engines: list[EnginePlace] = []
    if colocate:
        for e in range(num_engines):
            bundles = tuple(range(e * per_engine, (e + 1) * per_engine))
            on = sorted({slots[b].node for b in bundles})
            if len(on) > 1:
                raise ConfigError(
                    f"engine{e} (--rollout-num-gpus-per-engine {per_engine}) would span nodes {on[0]} and "
                    f"{on[-1]}: colocated, it sits on trainer ranks {bundles[0]}-{bundles[-1]}, and a vLLM "
                    f"engine's TP group must stay on one node; choose --rollout-num-gpus-per-engine dividing "
                    f"--actor-num-gpus-per-node {per_node}")
            engines.append(EnginePlace(e, on[0], bundles, tuple(slots[b].gpu for b in bundles), bundles))
    else:
        # rollout nodes follow the trainer's; each holds whole engines only
        node_gpus = max(per_node, per_engine)
        per_rollout_node = node_gpus // per_engine
        for e in range(num_engines):
            node = nodes + e // per_rollout_node
            first = (e % per_rollout_node) * per_engine
            bundles = tuple(range(len(slots), len(slots) + per_engine))
            slots.extend(Slot(b, node, first + j) for j, b in enumerate(bundles))
            engines.append(EnginePlace(e, node, bundles, tuple(range(first, first + per_engine)), ()))
    unit: dict[str, float] = {"GPU": 1.0, "CPU": 1.0} if use_gpus else {"CPU": float(actor_num_cpus)}
    shared = colocate and num_engines > 0
    if use_gpus:
        # colocated, the bundle's CPU and GPU are split between the trainer rank and its engine's actor
        actor_options = {"num_cpus": 0.5 if shared else 1.0, "num_gpus": COLOCATED_ACTOR_GPU if shared else 1.0}
        engine_options = {"num_cpus": 0.5 if shared else 1.0, "num_gpus": COLOCATED_ENGINE_GPU if shared else 1.0}
    else:
        half = float(actor_num_cpus) / 2
        actor_options = {"num_cpus": half if shared else float(actor_num_cpus)}
        engine_options = {"num_cpus": half if shared else float(actor_num_cpus)}
    return PlacementPlan(colocate=colocate, gpus_per_node=per_node, slots=tuple(slots),
                         actor_bundles=tuple(range(actors)), engines=tuple(engines),
                         bundles=tuple(dict(unit) for _ in slots), actor_options=actor_options,
                         engine_options=engine_options, use_gpus=use_gpus)


__all__ = ["COLOCATED_ACTOR_GPU", "COLOCATED_ENGINE_GPU", "EnginePlace", "PlacementPlan", "Slot", "plan_placement"]
