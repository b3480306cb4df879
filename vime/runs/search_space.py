"""The search's space: the axes `--search` tries, which of them apply to a base configuration, and their grid."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vime.errors import ConfigError


@dataclass(frozen=True)
class Axis:
    """One searched option, its candidate values, and the side of the step it changes: "engine" (rollout, engine
    sleep and wake), "trainer" (the train phase) or "both" ("gpus" stands for the actor's nodes × GPUs per node)."""

    dest: str
    values: tuple[Any, ...]
    side: str = "both"


#: The searched axes, in grid order; adding an axis (EP, an async mode) is one line here. An axis that
#: makes the rollout and train phases overlap must say side="both" (see `_branch_and_bound`).
#: `vime simulate --search` searches only what `vime train --backend real` runs, so its winner runs as printed.
AXES: tuple[Axis, ...] = (
    Axis("gpus", (1, 2, 4, 8, 16, 32, 64, 128), "both"),
    Axis("tensor_model_parallel_size", (1, 2, 4, 8), "trainer"),
    Axis("rollout_num_gpus_per_engine", (1, 2, 4, 8), "engine"),
    Axis("micro_batch_size", (16, 8, 4, 2, 1), "trainer"),
    Axis("gpu_memory_utilization", (0.9, 0.8, 0.7, 0.6), "engine"),
)
#: With pipeline stages too, which the simulator models and the real trainer does not run yet (TP × DP
#: only): for planning beyond today's real backend (bench/bench_search.py's 10,240-point searches).
PLANNING_AXES: tuple[Axis, ...] = (*AXES[:2], Axis("pipeline_model_parallel_size", (1, 2, 4, 8), "trainer"), *AXES[2:])
#: Searched for MoE models only (`expert_count`): invalid sizes (not dividing the GPUs or the experts) are
#: pruned as invalid by the configuration check. The real trainer runs EP 1 only: a winner with EP > 1 is
#: a plan for the simulator's backend, and the command line says so.
EXPERT_AXIS = Axis("expert_model_parallel_size", (1, 2, 4, 8, 16, 32, 64), "trainer")
#: Searched when the trainer and the engines have GPUs of their own (--no-colocate) and no mode was chosen:
#: which of the seed's synchronous step and the two asynchronous modes is best (issue 22).
ASYNC_AXIS = Axis("async_mode", ("sync", "one-step-off", "fully-async"), "both")
#: With a KL term, where the reference lives; both sides: its copy-in is train time, a resident trainer's room is KV.
REF_AXIS = Axis("ref_placement", ("gpu", "host"), "both")
GPUS_PER_NODE = 8


def expert_count(base: Any) -> int:
    """Routed experts of the base configuration's model (0: a dense model, or one that does not load)."""
    from vime.sim.models import load_model

    try:
        return int(load_model(base.model).num_experts)
    except ConfigError:
        return 0


def search_axes(base: Any, axes: Sequence[Axis] = AXES) -> tuple[Axis, ...]:
    """`axes`, with EP for a MoE model, the async mode for a disaggregated run, the KL reference's placement."""
    out = tuple(axes)
    if (base.use_kl_loss or base.kl_coef != 0) and REF_AXIS not in out:
        out = (*out, REF_AXIS)
    if expert_count(base) and EXPERT_AXIS not in out:
        out = (*out, EXPERT_AXIS)
    if not base.colocate and base.async_mode == "sync" and ASYNC_AXIS not in out:
        out = (*out, ASYNC_AXIS)
    return out


def changes_of(point: dict[str, Any]) -> dict[str, Any]:
    """A grid point as option changes: "gpus" becomes --actor-num-nodes × --actor-num-gpus-per-node."""
    out = dict(point)
    gpus = out.pop("gpus", None)
    if gpus is not None:
        nodes, per_node = (1, gpus) if gpus <= GPUS_PER_NODE else (gpus // GPUS_PER_NODE, GPUS_PER_NODE)
        out = {"actor_num_nodes": nodes, "actor_num_gpus_per_node": per_node, **out}
    return out


def grid(max_gpus: int, axes: Sequence[Axis] = AXES) -> list[dict[str, Any]]:
    """The cross product of the axes' values (GPU counts above `max_gpus`, or past one node and not whole nodes, left out)."""
    values = []
    for ax in axes:
        vals = ax.values
        if ax.dest == "gpus":
            vals = tuple(g for g in vals if g <= max_gpus and (g <= GPUS_PER_NODE or g % GPUS_PER_NODE == 0))
        values.append(vals)
    return [changes_of(dict(zip([a.dest for a in axes], combo, strict=True))) for combo in itertools.product(*values)]
