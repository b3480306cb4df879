"""Search pruning in closed form: a memory check that rejects configurations that cannot fit, and a T_step lower bound.

Both are sound against the simulator: the memory check counts only bytes the simulator certainly
allocates at once (the trainer's context and state at start-up plus one micro-batch of the shortest
sample; an engine's KV plan, which the simulated engine computes the same way and refuses the same
way), and the lower bound counts only time the simulator certainly spends in the sequential phases
of a synchronous step (rollout and train; offload, onload and weight sync count as 0):

- rollout ≥ the responses' building, one at a time per engine, each after its request's decode iterations
  × the iteration floor (the larger of the GPU's launch overhead + all-reduce latency + one read of the
  engine's weights and the host's step time for one request), plus the request's front-end overhead; ≥ the
  busiest engine's share of the decoded tokens in host time per request and per step; ≥ the decoded tokens'
  body FLOPs ÷ (rollout GPUs × prefill FLOP/s);
- train ≥ forward + backward FLOPs of every trained sequence ÷ (actor GPUs × train FLOP/s), plus the
  optimizer steps, the weight backup and the call's fixed cost, which the cost model gives exactly.

The sample lengths come from one probe simulation (`probe_lengths`): a draw depends only on (seed,
key), never on the layout, so every configuration of a search trains the same sequences.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vime.errors import ConfigError, VimeError

GiB = 1024**3


@dataclass(frozen=True)
class StepLengths:
    """What one simulated step trains: every sample's total and response length, and its optimizer steps."""

    total: tuple[int, ...]
    response: tuple[int, ...]
    optimizer_steps: int


def probe_lengths(args: Any) -> list[StepLengths] | None:
    """Simulate `args` once and keep the lengths each step trained (None when it never trained: an OOM first)."""
    from vime.runs.sim import simulate

    seen: list[StepLengths] = []

    class _Recording:
        """The simulated trainer, noting each batch's lengths on its way in."""

        def __init__(self, inner: Any) -> None:
            self._inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self._inner, name)

        async def train(self, rollout_id: int, batch: Any) -> Any:
            seen.append(StepLengths(tuple(batch.total_lengths), tuple(batch.response_lengths),
                                    int(batch.schedule.num_steps)))
            return await self._inner.train(rollout_id, batch)

    try:
        simulate(args, wrap=lambda b: {"trainer": _Recording(b.trainer)})
    except VimeError:
        return None
    return seen or None


class Screen:
    """The closed-form checks of one search: specs loaded once, each configuration judged in microseconds."""

    def __init__(self, base: Any, steps: Sequence[StepLengths] | None = None) -> None:
        from vime.sim.hardware import load_hardware
        from vime.sim.models import load_model

        self.hw = load_hardware(base.hardware)
        self.model = load_model(base.model)
        self.steps = list(steps or [])
        self.shortest = min((min(s.total) for s in self.steps if s.total), default=0)

    # --- memory ---------------------------------------------------------------------------------
    def cost_model(self, args: Any) -> Any:
        from vime.sim.trainer import ActorCostModel

        actor = int(args.actor_num_nodes) * int(args.actor_num_gpus_per_node)
        rollout = int(args.rollout_num_gpus)
        total = max(actor, rollout) if args.colocate else actor + rollout
        return ActorCostModel(args.cluster, args.parallel, self.model, self.hw, total)

    def memory(self, args: Any, cm: Any) -> str:
        """Why `args` cannot fit ("" when it may): the trainer's state, or the engine's KV plan."""
        return self.trainer_memory(cm) or self.engine_memory(args)

    def trainer_memory(self, cm: Any) -> str:
        """Why the trainer cannot fit on its busiest GPU ("" when it may): context + params + grads +
        optimizer at start-up, and training adds at least one micro-batch of the shortest sample."""
        state = cm.state_bytes_per_gpu()
        from vime.sim.trainer.footprint import trainer_context_bytes

        ctx = trainer_context_bytes(self.hw)
        cap = int(self.hw.memory_bytes)
        worst = max(range(len(state["params"])), key=lambda i: sum(v[i] for v in state.values()))
        held = {tag: v[worst] for tag, v in state.items()}
        act = (cm.activation_bytes(self.shortest, [self.shortest]) + cm.loss_transient_bytes(self.shortest)
               if self.shortest else 0)
        need = ctx + sum(held.values()) + act
        if need <= cap:
            return ""
        parts = ", ".join(f"{t} {b / GiB:.1f}" for t, b in held.items())
        return (f"trainer needs ≥ {need / GiB:.1f} GiB on a GPU ({parts}, context {ctx / GiB:.1f}, "
                f"activations ≥ {act / GiB:.1f}) of {cap / GiB:.1f}")

    def engine_memory(self, args: Any) -> str:
        """Why an engine cannot start ("" when it may): vLLM's KV plan, as the simulated engine computes it."""
        from vime.sim.engine.kv import plan_kv_cache
        from vime.sim.engine.settings import EngineSettings

        try:
            plan_kv_cache(self.hw, self.model, EngineSettings.from_args(args, **self.hw.engine_overrides()))
        except ConfigError as exc:
            return str(exc)
        return ""

    # --- time -----------------------------------------------------------------------------------
    def step_lower_bounds(self, args: Any, cm: Any) -> list[float]:
        """Per probed step, a T_step no simulation of `args` beats (none without a probe)."""
        sync = self.sync_bound(args) if getattr(args, "async_mode", "sync") == "sync" else 0.0
        return [r + t + sync for r, t in zip(self.rollout_bounds(args), self.train_bounds(cm), strict=True)]

    def sync_bound(self, args: Any) -> float:
        """Seconds a weight sync of `args` lasts at least: the trainer's host work around its export and the engines'
        per-tensor load, both paid in turn for every HF tensor (bucket by bucket); a disk sync is not bounded here."""
        from vime.sim.engine.settings import EngineSettings
        from vime.sim.trainer.cost_model import export_host_seconds, hf_tensor_count

        if getattr(args, "update_weight_mode", "tensor") == "disk":
            return 0.0
        settings = EngineSettings.from_args(args, **self.hw.engine_overrides())
        return export_host_seconds(self.model, self.hw) + settings.load_per_tensor_s * hf_tensor_count(self.model)

    def rollout_bounds(self, args: Any) -> list[float]:
        """Per probed step, seconds the rollout phase of `args` lasts at least (engine options only)."""
        return [self._rollout(args, s) for s in self.steps]

    def train_bounds(self, cm: Any) -> list[float]:
        """Per probed step, seconds the train phase lasts at least (the trainer's layout only)."""
        return [self._train(cm, s) for s in self.steps]

    def _rollout(self, args: Any, step: StepLengths) -> float:
        from vime.sim.engine.costs import IterationModel
        from vime.sim.engine.settings import EngineSettings

        settings = EngineSettings.from_args(args, **self.hw.engine_overrides())
        im = IterationModel.build(self.hw, self.model, settings)
        eg = int(args.rollout_num_gpus_per_engine)
        engines = max(1, int(args.rollout_num_gpus) // eg)
        decoded = sum(max(0, r - 1) for r in step.response)  # the first token comes with the prefill
        gpu = im.overhead_s + im.allreduce_latency_s + im.weight_bytes / (im.weight_bytes_per_s or im.bytes_per_s)
        # an iteration takes ≥ max(GPU floor, host(requests)): along each response (≥ 1 request per iteration),
        # and on the busiest engine (≥ decoded / engines tokens, ≤ --max-num-seqs per iteration)
        floor = max(gpu, im.host(1))
        per_engine = decoded / engines
        iterations = math.ceil(per_engine / settings.max_num_seqs)
        busiest = max(iterations * gpu, iterations * im.host_s + im.host_per_seq_s * per_engine)
        compute = im.flops_base * decoded / (engines * eg * im.flops_per_s)
        # each engine's one API server builds a response once its request has finished, one at a time: of the k
        # requests that finish last (each ≥ its decode iterations × the floor), some engine holds ⌈k / engines⌉, and
        # builds them after the earliest of those k can have finished (a one-machine schedule with release times;
        # k = 1 is the longest response's decode and its building)
        building, cheapest = 0.0, math.inf
        latest_first = sorted(((r - 1) * floor, settings.response_seconds(r)) for r in step.response)[::-1]
        for k, (release, seconds) in enumerate(latest_first, 1):
            cheapest = min(cheapest, seconds)
            building = max(building, release + math.ceil(k / engines) * cheapest)
        # the longest request also crosses the front end (half on the way in, half out)
        return max(building, busiest, compute) + (settings.request_overhead_s if step.response else 0.0)

    def _train(self, cm: Any, step: StepLengths) -> float:
        from vime.sim.trainer.sleep_extras import offload_floor_seconds

        hw, model = self.hw, self.model
        flops = sum(model.sequence_flops(n) for n in step.total)
        if hw.software.train_attention == "unfused":  # the attention matmuls run at another rate: count the rest
            flops -= sum(4.0 * model.num_layers * model.num_attention_heads * model.head_dim * n * (n + 1) / 2
                         for n in step.total)
        compute = (1.0 + hw.efficiency.train_backward_factor) * flops / (cm.layout.world * hw.train_flops)
        return (hw.efficiency.trainer_call_s + compute + step.optimizer_steps * cm._optimizer_seconds()
                + cm._backup_seconds() + offload_floor_seconds(cm))


def trainer_wake_slack(base: Any) -> float:
    """How much of a step's train phase may depend on the engines' options: the trainer's wake onto memory they just
    released (0 when the trainer never sleeps or the profile has no such cost)."""
    from vime.sim.hardware import load_hardware

    if not getattr(base, "offload_train", False):
        return 0.0
    return load_hardware(base.hardware).efficiency.released_wake_max_s
