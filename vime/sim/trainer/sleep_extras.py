"""What a simulated trainer's sleep and wake cost beyond its allocator's copies and mappings: what vime's real actor does around them, and the wake onto memory the engines just released."""

from __future__ import annotations

from typing import TYPE_CHECKING

from vime.sim.memory import GiB, elapse
from vime.sim.trainer.footprint import OPTIMIZER_BYTES, PARAM_BYTES
from vime.tags import offload_plan_sets

if TYPE_CHECKING:
    from vime.sim.hardware import HardwareSpec
    from vime.sim.memory import SimAllocator
    from vime.sim.memory.pools import SimGPU
    from vime.sim.models import ModelSpec
    from vime.sim.trainer.cost_model import ActorCostModel
    from vime.types import TrainBatch


def megatron_param_tensors(model: ModelSpec, pp: int = 1, stage: int = 0, ep: int = 1) -> int:
    """Parameter tensors of a rank of pipeline `stage` in Megatron's layout: fused QKV and fc1; a MoE layer's router and
    its local experts' fc1 and fc2 one by one (SequentialMLP); the embedding on the first stage, the final norm and an
    untied (or pipelined) output layer on the last."""
    m = model
    attention = 4 + (2 if m.qk_norm else 0) + (1 if m.qkv_bias else 0)
    moe_mlp = 1 + 2 * (m.num_experts // ep) + (2 if m.shared_expert_ffn_size else 0) if m.is_moe else 0
    layers, moe_layers = m.layers_in_stage(pp, stage), m.moe_layers_in_stage(pp, stage)
    n = layers * attention + moe_layers * moe_mlp + (layers - moe_layers) * 2
    return n + (stage == 0) + (stage == pp - 1) * (1 + (not m.tie_embeddings or pp > 1))


def checked_state(model: ModelSpec, params: int, optimizer_params: int, pp: int = 1, stage: int = 0,
                  ep: int = 1) -> tuple[int, int]:
    """(tensors, bytes) the state check sums on one rank: each parameter, its fp32 main copy and Adam's two moments."""
    return 4 * megatron_param_tensors(model, pp, stage, ep), params * PARAM_BYTES + optimizer_params * OPTIMIZER_BYTES


def state_check_seconds(cost: ActorCostModel) -> float:
    """vime's real actor proves each wake restored what its sleep kept: a sum of every parameter, fp32 main copy and
    Adam moment, at the sleep and again after the wake (efficiency.state_check_*; the slowest rank)."""
    eff, lay = cost.hw.efficiency, cost.layout
    if not eff.state_check_bytes_per_s:
        return 0.0
    ranks = (checked_state(cost.model, p, o, lay.pp, lay.coords(r)[3], cost.ep)
             for r, (p, o) in enumerate(zip(cost.params_per_gpu(), cost._optimizer_shards(), strict=True)))
    return max(n * eff.state_check_per_tensor_s + b / eff.state_check_bytes_per_s for n, b in ranks)


def offload_floor_seconds(cost: ActorCostModel) -> float:
    """What one sleep and the next wake take at least: the state check twice and the offloaded tags' copies to the host
    and back (0 when the trainer never sleeps; mappings, pinning and the wake onto memory the engines released are left
    out: they depend on the engines or the pinning mode)."""
    if not cost.offload_train:
        return 0.0
    offloaded, _ = offload_plan_sets(cost.offload_plan) if cost.offload_plan != "auto" else ([], [])
    state = cost.state_bytes_per_gpu()
    copied = max((sum(state[t][i] for t in offloaded if t in state) for i in range(cost.layout.world)), default=0)
    return 2 * state_check_seconds(cost) + copied / cost.hw.d2h_bytes_per_s + copied / cost.hw.h2d_bytes_per_s


def largest_microbatch_bytes(cost: ActorCostModel, batch: TrainBatch) -> int:
    """A training micro-batch's activations, for the micro-batch of the batch's longest rows: the blocks PyTorch keeps
    cached until the sleep. Taken over the sorted lengths, not the schedule's micro-batches, so the cost does not depend
    on the order the rollout finished in (the search prices the trainer apart from the engines)."""
    lay = cost.layout
    rows = max((len(mb) for r in range(lay.dp) for mb in batch.for_rank(r).micro_batches()), default=0)
    lengths = sorted(batch.total_lengths, reverse=True)[:rows]
    if not lengths:
        return 0
    inflight = min(lay.pp, max(1, max(batch.schedule.num_microbatches)))
    return cost.activation_bytes(sum(lengths), lengths) * inflight + cost.loss_transient_bytes(sum(lengths))


class SleepWakeExtras:
    """One trainer's extras (vime.real.megatron.actor): at the sleep, the state check (a sum of every kept tensor) and
    `torch.cuda.empty_cache()` handing the cached activation blocks back (`vmm.torch_free_s_per_gib`); at the wake, a slower resume onto memory the
    other processes on its GPUs released since the sleep (efficiency.released_wake_*), then the state check again."""

    def __init__(self, cost: ActorCostModel, gpus: list[SimGPU], owner: str) -> None:
        self.cost, self.gpus, self.owner = cost, gpus, owner
        #: the largest micro-batch's activations since the last sleep: PyTorch keeps their blocks cached until then
        self.cached_activations = 0
        #: what the other processes on each GPU had released when the trainer last slept, and whether it freed state
        self._others_freed = [0] * len(gpus)
        self._remaps = False

    def trained(self, batch: TrainBatch) -> None:
        self.cached_activations = max(self.cached_activations, largest_microbatch_bytes(self.cost, batch))

    async def sleep(self, allocator: SimAllocator, sets: tuple[list[str], list[str]]) -> None:
        """The check and the cache's unmapping (none on a CPU) before the state leaves, then `allocator.sleep(*sets)`."""
        hw = self.cost.hw
        release = self.cached_activations / GiB * hw.vmm.torch_free_s_per_gib if hw.sleep_mode else 0.0
        self.cached_activations = 0
        await elapse(allocator.env, state_check_seconds(self.cost) + release)
        await allocator.sleep(*sets)
        self._others_freed = [g.freed_by_others(self.owner) for g in self.gpus]
        self._remaps = any(sum(allocator.tag_bytes(t)) for t in allocator.lifecycle.asleep_tags())

    async def wake_up(self, allocator: SimAllocator) -> None:
        """`allocator.wake_up()`, then per GiB the others released since the sleep (the slowest GPU, up to the ceiling;
        a wake that maps nothing back, as a plan with all state resident, pays none), then the check."""
        eff = self.cost.hw.efficiency
        freed = [g.freed_by_others(self.owner) - before for g, before in zip(self.gpus, self._others_freed, strict=True)]
        released = min(max(freed, default=0) / GiB * eff.released_wake_s_per_gib, eff.released_wake_max_s)
        await allocator.wake_up(None)
        await elapse(allocator.env, (released if self._remaps else 0.0) + state_check_seconds(self.cost))


def cache_at_least(allocator: SimAllocator, positions: list[int], nbytes: int) -> None:
    """A micro-batch's activations (or the optimizer step's temporaries) on these GPUs: PyTorch's caching allocator
    reuses the blocks earlier ones freed and keeps them until an empty_cache, so the tag only grows, to the largest so
    far (the 2026-12-04 H200 run with --no-offload-train, before its trainer emptied the cache after training, held
    52 GiB through the rollout)."""
    held = allocator.device_bytes_per_gpu("activations")
    grow = {p: nbytes - held[p] for p in positions if nbytes > held[p]}
    if grow:
        allocator.allocate("activations", grow)


async def empty_cache(allocator: SimAllocator, gpus: list[SimGPU], hw: HardwareSpec) -> None:
    """PyTorch's empty_cache on a resident trainer: the cached activations' blocks unmapped and handed back."""
    cached = max(allocator.device_bytes_per_gpu("activations"), default=0)
    if cached:
        allocator.release("activations")
        for gpu in gpus:
            gpu.hand_back(allocator.owner)
        if hw.sleep_mode:
            await elapse(allocator.env, cached / GiB * hw.vmm.torch_free_s_per_gib)
