"""The simulated vLLM engine: continuous batching in closed form, KV blocks, preemption, pause/sleep/weights, faults.

`SimEngine` implements `vime.protocols.RolloutEngine` for one vLLM server (its TP ranks) inside
the virtual clock (seed steps 4–13, 18–28, 33–36, 43–54; VLLM_API.md for the semantics).

Scheduler (vLLM v1, simplified but faithful in what costs time and memory):

- KV cache sized as vLLM does (`plan_kv_cache`), in blocks of 16 tokens, per GPU of the TP group.
- Each iteration gives every running request its tokens under a budget of
  `max_num_batched_tokens` (chunked prefill): decoding requests first (one token each), then
  requests still prefilling in admission order, then new admissions from the FCFS waiting queue
  while `max_num_seqs` and free blocks allow. A request whose prompt does not fit in free blocks
  blocks the queue behind it, as in vLLM.
- When the running requests need more blocks than are free, the most recently admitted request
  is preempted by recompute (its blocks are freed, it goes back to the front of the queue and
  later re-prefills prompt + generated tokens); no admissions happen in an iteration that
  preempted. Every request therefore still finishes.
- Iteration time is a roofline per GPU: max(weights / weight rate + KV bytes read / (HBM ·
  decode_bw_util), FLOPs / (peak · prefill_mfu)) + TP all-reduce (two per layer over NVLink,
  bandwidth and latency) + the GPU launch overhead (more past the CUDA-graph sizes), bounded
  below by the engine's CPU step (a + b · requests), which overlaps the GPU (`IterationModel`).

Closed form (the performance requirement): between events, the running set is decoding in
lockstep, so iteration j costs C + max(m0 + m1·j, f0 + f1·j) and the blocks it needs follow a
16-periodic pattern. The engine computes the number of iterations until the next event — the
first completion, the first iteration that would not find a free block, or an interruption by
an arrival / pause / sleep / fault — sums their times analytically and waits with one simpy
timeout. Requests decoding in lockstep store offsets against a shared tick counter, so a phase
costs O(16 + log n) Python work, not O(tokens) and not O(running requests).

Semantics (VLLM_API.md) that the tests pin down:

- Controls (pause, abort, flush, the quiesce of sleep) take effect at the next iteration boundary.
  pause(abort) ends in-flight requests with finish_reason "abort" and their partial tokens;
  pause(keep) freezes them; pause(wait) returns once they are drained. Requests arriving while
  paused are held until resume. sleep(level, mode) applies `mode` the same way, except that a
  kept request loses its KV (it recomputes after wake_up), and a scheduler that is already paused
  cannot drain, so "wait" then keeps.
- `is_sleeping()` reports memory (weights or KV released), not the pause flag.
- Every generate pays `EngineSettings.request_overhead_s` outside the engine (the API server and
  engine-core IPC, measured on the H200): half before the request reaches the scheduler, half after
  it finishes, so it adds latency but no engine time; pause(wait) returns after the drained
  requests' responses. The first weight-update session of a server process pays `first_update_s`
  more (IPC transfer setup); a restart is a new process.
- A cancelled generate (client gone) aborts its request at the next boundary.
- Responses: the length comes from `LengthSampler` keyed by the request id (or session id), the
  tokens are a window of a seeded pool chosen by the same key, so both are independent of
  routing and scheduling; "stop" ends with EOS, "length" stops at max_tokens; the weight version
  last finished is stamped as a string.
- Not modelled: prefix-cache hits (the n samples of a group arrive together, and vLLM only reuses
  blocks computed in an earlier step, so a rollout sees almost none), speculative decoding,
  stop strings.
- Faults: `inject_failure(at)` / `fail_now()` make every waiting and later call raise
  EngineError(retryable=True) until `restart()` (after `restart_s`).
"""

from __future__ import annotations

import heapq
import math
from bisect import bisect_right
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from vime.errors import ConfigError, EngineError, SimulationError
from vime.protocols import (
    TAG_CUDA_GRAPH,
    TAG_KV_CACHE,
    TAG_RUNTIME,
    TAG_WEIGHTS,
    EngineLifecycle,
    EngineMemory,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    TagState,
    WeightBucket,
    sleep_offload_tags,
)
from vime.sim.lengths import LengthDraw, LengthSampler, key_seed

if TYPE_CHECKING:
    from vime.protocols import StepObserver
    from vime.sim.hardware import HardwareSpec
    from vime.sim.memory import SimAllocator
    from vime.sim.models import ModelSpec

GiB = 1024**3
MiB = 1024**2

#: vLLM's default KV block size (tokens per block).
BLOCK_SIZE = 16
#: Tags vLLM wakes only when asked (DEFERRABLE_TAGS); the others wake with any wake (seed step 7).
DEFERRABLE = (TAG_WEIGHTS, TAG_KV_CACHE)
NON_DEFERRABLE = (TAG_RUNTIME, TAG_CUDA_GRAPH)


# --------------------------------------------------------------------------------------------
# Settings and KV sizing
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EngineSettings:
    """Server arguments of one engine (seed step 2) and the costs the simulator cannot derive.

    The cost constants are estimates (documented per field) until calibration replaces them.
    """

    tp: int = 1
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    block_size: int = BLOCK_SIZE
    #: CUDA graphs captured for decode batch sizes up to 512: vLLM logs ~0.3–1 GiB per GPU
    #: ("Graph capturing finished ... took X GiB") for 1–14B models; estimate.
    cuda_graph_bytes: int = 512 * MiB
    #: Largest iteration (tokens) that replays a captured CUDA graph; larger ones launch kernel by
    #: kernel and pay `Efficiency.eager_iteration_s` (vLLM's default capture sizes end at 512).
    cuda_graph_max_tokens: int = 512
    #: Latency of one NCCL/custom all-reduce on NVLink (small messages); estimate.
    allreduce_latency_s: float = 8e-6
    #: One HTTP control round trip (pause, resume, sleep/wake request, weight-update call); estimate.
    http_rtt_s: float = 0.002
    #: Fixed latency of every generate request outside the engine's iterations: vLLM's API server
    #: (HTTP, JSON parse and serialise), the ZMQ hops to the engine core and back, output
    #: processing, and vime's client. Paid half before the request reaches the scheduler and half
    #: after it finishes; it occupies no engine time, so concurrent requests still batch together.
    #: Measured on the H200 with vLLM 0.25.1 (bench/data/h200_vllm_0.25.1_b{0,1,2}*.json, phase
    #: `frontend`): a lone 16-token request with max_tokens 1 through vime's client took
    #: 18.4 / 22.0 / 18.8 ms (median of 20 per run; /health 1.1–1.5 ms); the median over runs,
    #: 18.8 ms, minus the modelled first step of 16 tokens on an idle engine (IterationModel.first_time
    #: with H200-141G-measured and Qwen3-4B: 7.5 ms = 4.0 GPU + 3.6 host) → 11.3 ms.
    request_overhead_s: float = 0.0113
    #: Per weight bucket: opening the CUDA IPC handles on every TP rank and vLLM's per-call work
    #: around load_weights; measured 10–22 ms per bucket with vLLM 0.25.1's IPC backend on the
    #: H200 (8 GB in 16 buckets, bench/data/h200_vllm_0.25.1.json), ~13 ms once transfer is taken out.
    ipc_open_s: float = 0.013
    #: Fixed engine-side cost of one sleep call beyond the copies and unmaps (collective RPC to the
    #: workers, gc + empty_cache): vLLM 0.25.1 on the H200 slept at level 2 (nothing to copy) in
    #: 0.07–0.10 s of which ~0.03 s unmapping.
    sleep_call_s: float = 0.05
    #: Fixed engine-side cost of one wake_up call that maps something: waking the KV cache (map
    #: only) took 0.11–0.12 s on the H200 with vLLM 0.25.1, ~0.012 s of it mapping.
    wake_call_s: float = 0.1
    #: vLLM's CuMem allocator backs up and restores allocation by allocation (a Python loop with a
    #: synchronous cudaMemcpy and the (un)map of each); one weight tensor is one allocation. Per
    #: tensor, beyond the bytes at the host-link rate, on the H200 with vLLM 0.25.1 (Qwen3-4B,
    #: 399 tensors, 8 GB): level-1 sleep after the first 0.26 s against 0.225 s of copy, unmap and
    #: call → ~80 µs; waking the weights 0.32 s against 0.245 s → ~180 µs. Only offloaded
    #: (copied) weights pay it: a level-2 sleep, which copies nothing, measured no such term.
    sleep_per_tensor_s: float = 80e-6
    wake_per_tensor_s: float = 180e-6
    #: Extra cost of the first weight-update session a server process opens (the IPC weight-transfer
    #: setup on first use); `restart()` brings it back. vLLM 0.25.1 on the H200 (three runs,
    #: bench/data/h200_vllm_0.25.1{,_b1,_b2}.json, phase sleep_l2_ipc): start_update_s 31.2 / 36.6 /
    #: 34.0 ms on cycle 0 against a median of 12.1 / 17.3 / 15.4 ms on the later cycles → 19.2 /
    #: 19.3 / 18.6 ms extra; median 19.2 ms.
    first_update_s: float = 0.0192
    #: Engine-side cost of opening and of closing a weight-update session beyond the HTTP round
    #: trip (a collective RPC to the workers each): the later cycles' start_update_s medians were
    #: 12.1 / 17.3 / 15.4 ms and finish_update_s 7.8 / 12.4 / 9.3 ms over the three H200 runs
    #: (median 15.4 and 9.3 ms) → 13.4 and 7.3 ms on top of http_rtt_s.
    start_update_call_s: float = 0.0134
    finish_update_call_s: float = 0.0073
    #: Per tensor in a bucket: vLLM's load_weights Python dispatch; estimate.
    load_per_tensor_s: float = 20e-6
    #: Bytes/s a TP rank reads weights from the trainer's buffer and writes its shard: None =
    #: device-to-device (HBM × decode_bw_util; CUDA IPC on the same GPU, colocated); set it to a
    #: network rate for NCCL weight transfer between separate GPUs.
    weight_transfer_bytes_per_s: float | None = None
    #: reset_prefix_cache on the server (block pool reset); estimate.
    flush_cache_s: float = 0.001
    #: Time a failed server takes to come back (process start, weights load, graph capture); estimate.
    restart_s: float = 60.0

    def __post_init__(self) -> None:
        if self.tp < 1:
            raise ConfigError(f"engine TP size must be ≥ 1, got {self.tp}")
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(f"--gpu-memory-utilization must be in (0, 1], got {self.gpu_memory_utilization}")
        if self.max_num_seqs < 1:
            raise ConfigError(f"--max-num-seqs must be ≥ 1, got {self.max_num_seqs}")
        if self.max_num_batched_tokens < self.max_num_seqs:
            # vLLM refuses this too: a decode step of max_num_seqs requests would not fit the budget.
            raise ConfigError(f"--max-num-batched-tokens ({self.max_num_batched_tokens}) must be ≥ "
                              f"--max-num-seqs ({self.max_num_seqs}); raise it or lower --max-num-seqs")
        if self.max_model_len < 2:
            raise ConfigError(f"max_model_len must be ≥ 2, got {self.max_model_len}")
        if self.block_size < 1:
            raise ConfigError(f"block size must be ≥ 1, got {self.block_size}")
        for name in ("request_overhead_s", "first_update_s", "start_update_call_s", "finish_update_call_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"EngineSettings.{name} must be a finite number of seconds ≥ 0, got {value!r}")

    @classmethod
    def from_args(cls, args: Any, **overrides: Any) -> EngineSettings:
        """Settings from a `vime.config.Args` (slime names: rollout_num_gpus_per_engine, ...)."""
        values: dict[str, Any] = dict(
            tp=int(args.rollout_num_gpus_per_engine),
            gpu_memory_utilization=float(args.gpu_memory_utilization),
            max_num_seqs=int(args.max_num_seqs),
            max_num_batched_tokens=int(args.max_num_batched_tokens),
            max_model_len=int(args.rollout_max_context_len),
        )
        values.update(overrides)
        return cls(**values)


@dataclass(frozen=True)
class KVPlan:
    """How vLLM splits one GPU of the engine (all values per GPU, bytes), and the resulting block pool.

    kv_cache = floor(utilization × capacity) − weights − activation peak − CUDA graphs − CUDA context;
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
    kv = budget - weights - act - graphs - ctx
    per_token = model.kv_bytes_per_token(tp)
    block_bytes = settings.block_size * per_token
    if kv <= 0:
        raise ConfigError(
            f"engine with {model.name} TP={tp} on {hardware.name}: no memory left for the KV cache "
            f"({settings.gpu_memory_utilization} × {hardware.memory_bytes / GiB:.1f} GiB − weights "
            f"{weights / GiB:.2f} − activations {act / GiB:.2f} − graphs {graphs / GiB:.2f} − context "
            f"{ctx / GiB:.2f} = {kv / GiB:.2f} GiB); raise --gpu-memory-utilization or "
            f"--rollout-num-gpus-per-engine, or lower --max-num-batched-tokens")
    num_blocks = kv // block_bytes
    if num_blocks * settings.block_size < settings.max_model_len:
        raise ConfigError(
            f"engine with {model.name} TP={tp} on {hardware.name}: the KV cache holds "
            f"{num_blocks * settings.block_size} tokens, fewer than max_model_len "
            f"{settings.max_model_len} (vLLM refuses to start); lower --rollout-max-context-len or "
            f"give the engine more memory (--gpu-memory-utilization, --rollout-num-gpus-per-engine)")
    return KVPlan(hardware.memory_bytes, settings.gpu_memory_utilization, budget, weights, act, graphs,
                  ctx, kv, per_token, settings.block_size, block_bytes, num_blocks)


# --------------------------------------------------------------------------------------------
# Iteration cost
# --------------------------------------------------------------------------------------------


def _line_sum(a0: float, a1: float, p: int, q: int) -> float:
    """Σ_{j=p}^{q-1} (a0 + a1·j)."""
    if q <= p:
        return 0.0
    return a0 * (q - p) + a1 * (q * (q - 1) - p * (p - 1)) / 2.0


def sum_max_lines(m0: float, m1: float, f0: float, f1: float, k: int) -> float:
    """Σ_{j=0}^{k-1} max(m0 + m1·j, f0 + f1·j), exactly, in O(1)."""
    if k <= 0:
        return 0.0
    g0, g1 = m0 - f0, m1 - f1  # m − f at j
    if g1 == 0:
        return _line_sum(m0, m1, 0, k) if g0 >= 0 else _line_sum(f0, f1, 0, k)
    cross = -g0 / g1
    if g1 > 0:  # f leads first, m from the crossing on
        s = min(k, max(0, math.ceil(cross)))
        return _line_sum(f0, f1, 0, s) + _line_sum(m0, m1, s, k)
    s = min(k, max(0, math.floor(cross) + 1))  # m leads first
    return _line_sum(m0, m1, 0, s) + _line_sum(f0, f1, s, k)


@dataclass(frozen=True)
class IterationModel:
    """Per-iteration time of one engine (per GPU of its TP group, all ranks in lockstep).

    GPU time = overhead (+ eager launch cost past the CUDA-graph sizes) + all-reduce(tokens)
    + max(weights / weight rate + KV bytes read / KV rate, FLOPs / (TP · prefill FLOP/s)),
    KV bytes = kv_bytes_per_token · (context tokens read), and FLOPs = the body for
    every computed token, the output head once per scheduled request (vLLM computes logits only
    at each request's last position, so a prefill chunk pays it once, not per prompt token) and
    the attention, linear in the attended context.

    The iteration takes max(GPU time, host time), host time = host_s + host_per_seq_s · requests:
    vLLM's CPU work of a step (scheduling, input preparation, output processing) runs while the
    GPU executes (async scheduling), so it only shows when it is the longer one — at large
    batches (H200 + vLLM 0.25.1, issue 10: 20.9 ms per decode step at 256 requests, 7.8 ms of
    roofline; 3.8 ms at 1 request, 2.9 ms of roofline).
    """

    weight_bytes: float
    kv_bytes_per_token: float
    bytes_per_s: float  # KV reads (and the weights unless weight_bytes_per_s is set)
    flops_per_s: float  # per GPU, effective
    flops_base: float  # per token, whole model, without attention and without the output head
    flops_per_ctx: float  # per token per attended context token, whole model
    tp: int
    overhead_s: float  # GPU-serial per iteration (launches), added to the GPU time
    allreduce_per_token_s: float
    allreduce_latency_s: float
    flops_head: float = 0.0  # per sampled position (one per scheduled request), whole model
    host_s: float = 0.0  # CPU work per step, overlapped with the GPU
    host_per_seq_s: float = 0.0  # + per scheduled request
    weight_bytes_per_s: float = 0.0  # weights streamed per step (0: bytes_per_s)
    eager_s: float = 0.0  # launch cost of an iteration past the CUDA graphs
    graph_max_tokens: int = 512

    @classmethod
    def build(cls, hardware: HardwareSpec, model: ModelSpec, settings: EngineSettings) -> IterationModel:
        tp = settings.tp
        base = model.flops_per_token(0, lm_head=False)
        per_ctx = (model.flops_per_token(4096, lm_head=False) - base) / 4096.0
        # Two all-reduces per layer (after attention and after the MLP) of hidden-size bf16 activations.
        ar_bytes = 2 * model.num_layers * model.hidden_size * model.dtype_bytes
        lat = 2 * model.num_layers * settings.allreduce_latency_s if tp > 1 else 0.0
        eff = hardware.efficiency
        # TP > 1: the workers prepare their inputs in their own processes (Efficiency.host_step_tp_scale)
        host_scale = eff.host_step_tp_scale if tp > 1 else 1.0
        return cls(float(model.weight_bytes(tp)), float(model.kv_bytes_per_token(tp)),
                   hardware.decode_bytes_per_s, hardware.prefill_flops, base, per_ctx, tp,
                   eff.iteration_overhead_s, hardware.allreduce_seconds(ar_bytes, tp, calls=0), lat,
                   model.lm_head_flops_per_token(), eff.host_step_s * host_scale, eff.host_step_per_seq_s * host_scale,
                   hardware.decode_weight_bytes_per_s, eff.eager_iteration_s, settings.cuda_graph_max_tokens)

    def host(self, seqs: int) -> float:
        """The engine's CPU time of one step with `seqs` scheduled requests."""
        return self.host_s + self.host_per_seq_s * seqs

    def fixed(self, tokens: int) -> float:
        eager = self.eager_s if tokens > self.graph_max_tokens else 0.0
        return self.overhead_s + eager + self.allreduce_latency_s + self.allreduce_per_token_s * tokens

    def _weights_s(self) -> float:
        return self.weight_bytes / (self.weight_bytes_per_s or self.bytes_per_s)

    def gpu_time(self, tokens: int, kv_read_tokens: float, attn_ctx: float, seqs: int | None = None) -> float:
        """The GPU's part of an iteration (what a bare PyTorch forward of the same shapes takes)."""
        seqs = tokens if seqs is None else seqs
        mem = self._weights_s() + self.kv_bytes_per_token * kv_read_tokens / self.bytes_per_s
        comp = (self.flops_base * tokens + self.flops_head * seqs + self.flops_per_ctx * attn_ctx) \
            / self.tp / self.flops_per_s
        return self.fixed(tokens) + max(mem, comp)

    def time(self, tokens: int, kv_read_tokens: float, attn_ctx: float, seqs: int | None = None) -> float:
        """One iteration computing `tokens` tokens of `seqs` requests (None: one token each, decode),
        reading `kv_read_tokens` of KV, attending `attn_ctx` in total."""
        seqs = tokens if seqs is None else seqs
        return max(self.gpu_time(tokens, kv_read_tokens, attn_ctx, seqs), self.host(seqs))

    def first_time(self, tokens: int, kv_read_tokens: float, attn_ctx: float, seqs: int | None = None) -> float:
        """The first iteration after the engine was idle: no earlier GPU step hides its CPU part, so
        host + GPU (H200, vLLM 0.25.1: a lone 2048-token prefill took 36.9 ms, ~3.6 ms over the
        GPU's prefill alone, as at 8192 tokens)."""
        seqs = tokens if seqs is None else seqs
        return self.gpu_time(tokens, kv_read_tokens, attn_ctx, seqs) + self.host(seqs)

    def decode_lines(self, n: int, ctx0: float) -> tuple[float, float, float, float, float]:
        """(C, m0, m1, f0, f1) of the GPU time for n requests decoding in lockstep whose contexts sum
        to ctx0 at j = 0 (the host floor is `host(n)`)."""
        m0 = self._weights_s() + self.kv_bytes_per_token * ctx0 / self.bytes_per_s
        m1 = self.kv_bytes_per_token * n / self.bytes_per_s
        scale = 1.0 / (self.tp * self.flops_per_s)
        f0 = ((self.flops_base + self.flops_head) * n + self.flops_per_ctx * ctx0) * scale
        f1 = self.flops_per_ctx * n * scale
        return self.fixed(n), m0, m1, f0, f1


def sum_max_of_lines(lines: Sequence[tuple[float, float]], k: int) -> float:
    """Σ_{j=0}^{k-1} max_i (a_i + b_i·j), exactly: split [0, k) where two lines cross, one line leads in each piece."""
    if k <= 0:
        return 0.0
    cuts = {0, k}
    for i, (a0, a1) in enumerate(lines):
        for b0, b1 in lines[i + 1:]:
            if a1 != b1:
                x = (b0 - a0) / (a1 - b1)
                if 0 < x < k:
                    cuts.add(math.ceil(x))
    edges = sorted(cuts)
    total = 0.0
    for p, q in zip(edges, edges[1:], strict=False):
        if q <= p:
            continue
        mid = (p + q - 1) / 2.0  # no crossing strictly inside [p, q-1]: the leader at the middle leads throughout
        a0, a1 = max(lines, key=lambda ln: ln[0] + ln[1] * mid)
        total += _line_sum(a0, a1, p, q)
    return total


@dataclass(frozen=True)
class _Phase:
    """K lockstep decode iterations; `elapsed(k)` is the time of the first k."""

    k: int
    c: float
    m0: float
    m1: float
    f0: float
    f1: float
    host: float = 0.0  # the CPU floor of every iteration (IterationModel.host)

    def elapsed(self, k: int) -> float:
        if self.host <= 0.0:
            return self.c * k + sum_max_lines(self.m0, self.m1, self.f0, self.f1, k)
        return sum_max_of_lines(((self.c + self.m0, self.m1), (self.c + self.f0, self.f1), (self.host, 0.0)), k)

    def done_by(self, t: float) -> int:
        """Largest k ≤ K with elapsed(k) ≤ t (binary search on the closed form)."""
        lo, hi = 0, self.k
        tol = 1e-12 * max(1.0, abs(t))
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.elapsed(mid) <= t + tol:
                lo = mid
            else:
                hi = mid - 1
        return lo


# --------------------------------------------------------------------------------------------
# Requests and statistics
# --------------------------------------------------------------------------------------------

_WAITING, _PREFILL, _DECODE, _DONE = 0, 1, 2, 3


class _Req:
    """One request inside the engine. In decode mode gen/computed are offsets against the engine tick."""

    __slots__ = ("rid", "seq", "key", "prompt", "target", "reason", "max_tokens", "gen", "computed",
                 "goff", "coff", "mode", "done", "arrival", "preemptions")

    def __init__(self, rid: str, seq: int, key: str, prompt: int, target: int, reason: str,
                 max_tokens: int, done: simpy.Event, arrival: float) -> None:
        self.rid = rid
        self.seq = seq
        self.key = key
        self.prompt = prompt
        self.target = target  # tokens this response will have (EOS included when it stops)
        self.reason = reason
        self.max_tokens = max_tokens
        self.gen = 0  # generated tokens (absolute, outside decode mode)
        self.computed = 0  # tokens whose KV is in the cache (absolute, outside decode mode)
        self.goff = 0  # decode mode: gen = goff + tick
        self.coff = 0  # decode mode: computed = coff + tick
        self.mode = _WAITING
        self.done = done
        self.arrival = arrival
        self.preemptions = 0


@dataclass
class EngineStats:
    """What one engine did, for reports (cumulative over the engine's life)."""

    requests: int = 0
    finished: int = 0
    aborted: int = 0
    failed: int = 0
    tokens_generated: int = 0
    prefill_tokens: int = 0  # prompt tokens computed, recomputation included
    iterations: int = 0
    phases: int = 0  # simpy waits the scheduler needed (closed-form phases + single iterations)
    busy_s: float = 0.0
    preemptions: int = 0
    kv_blocks_total: int = 0
    kv_blocks_peak: int = 0
    batch_iterations: dict[int, int] = field(default_factory=dict)  # running requests → iterations

    def mean_batch(self) -> float:
        n = sum(self.batch_iterations.values())
        return sum(b * k for b, k in self.batch_iterations.items()) / n if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "batch_iterations"}
        d["batch_iterations"] = dict(sorted(self.batch_iterations.items()))
        d["mean_batch"] = self.mean_batch()
        return d


# --------------------------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------------------------


class SimEngine:
    """A simulated vLLM server implementing `vime.protocols.RolloutEngine`.

    Construct it inside or outside a running simulation; `env` is the shared simpy environment.
    With an `allocator` (a `vime.sim.memory.SimAllocator` over the engine's GPUs) its memory —
    weights, kv_cache, cuda_graph, runtime tags and the CUDA context — lives on the simulated
    GPUs and sleep/wake cost what the allocator says; without one, the same costs are computed
    from the hardware profile and nothing is accounted.
    """

    def __init__(self, name: str, env: simpy.Environment, hardware: HardwareSpec, model: ModelSpec,
                 settings: EngineSettings, lengths: LengthSampler, *, seed: int = 0,
                 allocator: SimAllocator | None = None, observer: StepObserver | None = None,
                 record_events: bool = False) -> None:
        self.name = name
        self.env = env
        self.hardware = hardware
        self.model = model
        self.settings = settings
        self.lengths = lengths
        self.seed = int(seed)
        self.allocator = allocator
        self.observer = observer
        self.lifecycle = EngineLifecycle(name)
        self.kv = plan_kv_cache(hardware, model, settings)
        self.cost = IterationModel.build(hardware, model, settings)
        self._weight_tensors = len(model.hf_weight_shapes())  # allocations vLLM's backup loop walks
        self._pinned_scale = model.vllm_pinned_scale(settings.tp)  # power-of-two host blocks per weight byte
        if allocator is not None:  # the allocator pins the weights' backup in the same blocks
            allocator.pinned_scale.setdefault(TAG_WEIGHTS, self._pinned_scale)
        self.stats = EngineStats(kv_blocks_total=self.kv.num_blocks)
        self.events: list[tuple[Any, ...]] | None = [] if record_events else None
        self.eos_token_id = int(getattr(model, "eos_token_id", 151645) or 151645)
        self.vocab_size = int(model.vocab_size)
        self._tags_asleep: dict[str, str] = {}  # tag → "offloaded" | "discarded" (allocator-less mode)
        self._host_pinned: dict[str, int] = {}  # tag → pinned host bytes kept across cycles (allocator-less mode)
        self._updated_once = False  # this server process has opened a weight-update session
        self._failed: str | None = None
        self._epoch = 0
        self._seq = 0
        self._reset_scheduler()
        self._allocate_memory()
        self._proc = env.process(self._loop(self._epoch))

    # --- state -----------------------------------------------------------------------------------
    def _reset_scheduler(self) -> None:
        bs = self.settings.block_size
        self._tick = 0
        self._waiting: deque[_Req] = deque()
        self._held: deque[_Req] = deque()  # arrived while paused; enter the queue on resume
        self._order: dict[_Req, None] = {}  # running, in admission order (last = preemption victim)
        self._prefill: dict[_Req, None] = {}  # running requests still computing their prompt
        self._decode: dict[_Req, None] = {}
        self._heap: list[tuple[int, int, _Req]] = []  # (target − goff, seq, req): finishes at that tick
        self._hist = [0] * bs  # decode requests by coff mod block_size
        self._sum_coff = 0
        self._used_blocks = 0
        self._controls: deque[tuple[str, Any, simpy.Event]] = deque()
        self._drain_waiters: list[tuple[simpy.Event, bool]] = []  # (event, hold the scheduler after)
        self._hold = False  # scheduler held for sleep (apart from an explicit pause)
        self._first_step = False  # the next explicit iteration starts a busy period
        self._wake: simpy.Event | None = None
        self._busy_since: float | None = None
        self._busy_tokens = 0
        self._tail_until = 0.0  # when the last finished request's response has left the front end

    def _allocate_memory(self) -> None:
        if self.allocator is None:
            return
        kv = self.kv
        for gpu in self.allocator.gpus:
            gpu.alloc(self.name, "context", kv.context_bytes)
        self.allocator.allocate(TAG_WEIGHTS, kv.weight_bytes)
        self.allocator.allocate(TAG_RUNTIME, kv.activation_peak_bytes)
        self.allocator.allocate(TAG_CUDA_GRAPH, kv.cuda_graph_bytes)
        self.allocator.allocate(TAG_KV_CACHE, kv.kv_allocated_bytes)

    def _log(self, *event: Any) -> None:
        if self.events is not None:
            self.events.append((round(float(self.env.now), 12), *event))

    @property
    def running(self) -> int:
        return len(self._order)

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet answered (running, queued, held while paused)."""
        return len(self._order) + len(self._waiting) + len(self._held)

    @property
    def used_blocks(self) -> int:
        return self._used_blocks

    @property
    def failed(self) -> bool:
        return self._failed is not None

    def _poke(self) -> None:
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _alive(self, call: str) -> None:
        if self._failed is not None:
            raise EngineError(self.name, call, f"engine is down ({self._failed})", status=503, retryable=True)

    async def _await(self, event: simpy.Event) -> Any:
        from vime.sim import clock

        return await clock.wait_event(event)

    async def _pause_for(self, seconds: float) -> None:
        if seconds > 0:
            await self._await(self.env.timeout(seconds))

    def _report(self, call: str, t0: float) -> None:
        if self.observer is not None:
            self.observer.on_call(self.name, call, t0, float(self.env.now))

    # --- generation ---------------------------------------------------------------------------
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Serve one token-in request (seed steps 20–25). Waits while paused; raises EngineError if the server fails."""
        self._alive("generate")
        self.lifecycle.check_generate()
        prompt = len(request.token_ids)
        if prompt < 1:  # the caller's bad input, refused before any I/O as the real client does
            raise ConfigError(f"engine {self.name}: generate needs at least one prompt token id")
        sp = request.sampling_params or {}
        limit = self.settings.max_model_len
        max_tokens = sp.get("max_tokens")
        if max_tokens is None:
            max_tokens = limit - prompt
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise EngineError(self.name, "generate", f"max_tokens must be a positive integer, got {max_tokens!r}",
                              status=400)
        if prompt + max_tokens > limit:
            raise EngineError(self.name, "generate",
                              f"this model's maximum context length is {limit} tokens, but the request "
                              f"asks for {prompt} prompt + {max_tokens} completion tokens", status=400)
        # The front end's way in (API server, engine-core IPC): the request reaches the scheduler
        # after half the fixed per-request latency, the response leaves after the other half.
        half = self.settings.request_overhead_s / 2
        await self._pause_for(half)
        self._alive("generate")  # the server may have died while the request was on its way in
        key = self._sample_key(request)
        if sp.get("ignore_eos"):
            draw = LengthDraw(max_tokens, "length")  # vLLM generates until max_tokens
        else:
            draw = self.lengths.response(key, max_tokens)
        self._seq += 1
        rid = request.request_id or f"{self.name}-{self._seq}"
        req = _Req(rid, self._seq, key, prompt, draw.length, draw.finish_reason, max_tokens,
                   self.env.event(), float(self.env.now))
        self.stats.requests += 1
        self._log("arrive", rid, prompt, draw.length)
        if self.lifecycle.paused is not None:
            self._held.append(req)
        else:
            # Only a request at the head of the queue can change the plan of a running phase.
            head = not self._waiting and len(self._order) < self.settings.max_num_seqs
            self._waiting.append(req)
            if head:
                self._poke()
        try:
            outcome = await self._await(req.done)
        except BaseException:
            # The client went away (task cancelled): like vLLM on a disconnect, abort the request
            # at the next iteration boundary so it stops holding a seat and KV blocks.
            if not req.done.triggered and self._failed is None:
                self._controls.append(("cancel", req, self.env.event()))
                self._poke()
            raise
        if isinstance(outcome, BaseException):
            raise outcome
        await self._pause_for(half)  # output processing, engine core → API server → client
        return outcome

    def _sample_key(self, request: GenerateRequest) -> str:
        """What identifies the sample for its length and tokens, independent of scheduling order."""
        if request.request_id:
            return f"id:{request.request_id}"
        if request.session_id:
            return f"session:{request.session_id}"
        return self.lengths.auto_key(request.token_ids)

    def _result(self, req: _Req, finish: str) -> GenerateResult:
        n = req.gen
        ids_pool, lp_pool = _token_pool(self.seed, self.vocab_size, self.eos_token_id)
        # A window of the seeded pool chosen by the sample's key: deterministic per (seed, key),
        # independent of scheduling, and a list slice (pointer copies of shared immutable ints and
        # floats) instead of a fresh RNG and new objects per token.
        start = key_seed(self.seed, "tokens", req.key) % (_POOL_SIZE - n + 1) if n <= _POOL_SIZE else 0
        ids = ids_pool[start:start + n]
        lps = lp_pool[start:start + n]
        while len(ids) < n:  # longer than the pool: wrap around
            ids += ids_pool[:n - len(ids)]
            lps += lp_pool[:n - len(lps)]
        if finish == "stop" and n:
            ids[-1] = self.eos_token_id
            lps[-1] = -0.02
        version = self.lifecycle.weight_version
        return GenerateResult(
            token_ids=ids, log_probs=lps, finish_reason=finish,  # type: ignore[arg-type]
            prompt_tokens=req.prompt, completion_tokens=n, cached_tokens=0,
            weight_version=None if version is None else str(version), engine=self.name)

    def _finish(self, req: _Req, finish: str) -> None:
        req.mode = _DONE
        # Its response still crosses the front end (generate's second half of request_overhead_s).
        self._tail_until = max(self._tail_until, float(self.env.now) + self.settings.request_overhead_s / 2)
        if finish == "abort":
            self.stats.aborted += 1
        else:
            self.stats.finished += 1
        self._log("finish", req.rid, finish, req.gen)
        req.done.succeed(self._result(req, finish))

    # --- scheduler bookkeeping --------------------------------------------------------------
    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self.settings.block_size)

    def _to_decode(self, req: _Req) -> None:
        bs = self.settings.block_size
        req.mode = _DECODE
        req.goff = req.gen - self._tick
        req.coff = req.computed - self._tick
        self._decode[req] = None
        self._hist[req.coff % bs] += 1
        self._sum_coff += req.coff
        heapq.heappush(self._heap, (req.target - req.goff, req.seq, req))

    def _from_decode(self, req: _Req) -> None:
        """Take a request out of lockstep (absolute counters again); the heap entry is dropped lazily."""
        bs = self.settings.block_size
        del self._decode[req]
        self._hist[req.coff % bs] -= 1
        self._sum_coff -= req.coff
        req.gen = req.goff + self._tick
        req.computed = req.coff + self._tick
        req.mode = _WAITING

    def _remove_running(self, req: _Req) -> None:
        """Out of the running set with its blocks freed; counters absolute."""
        if req.mode == _DECODE:
            self._from_decode(req)
        elif req.mode == _PREFILL:
            del self._prefill[req]
        del self._order[req]
        self._used_blocks -= self._blocks(req.computed)
        req.mode = _WAITING

    def _preempt(self, req: _Req) -> None:
        """Recompute preemption: free the blocks, back to the front of the queue (vLLM v1)."""
        self._remove_running(req)
        req.computed = 0
        req.preemptions += 1
        self.stats.preemptions += 1
        self._waiting.appendleft(req)
        self._log("preempt", req.rid, req.gen)

    def _abort_all(self, include_held: bool = False) -> None:
        for req in list(self._order):
            self._remove_running(req)
            self._finish(req, "abort")
        while self._waiting:
            self._finish(self._waiting.popleft(), "abort")
        if include_held:
            while self._held:
                self._finish(self._held.popleft(), "abort")
        self._heap.clear()

    def _preempt_all(self) -> None:
        """KV contents are gone (sleep, cache reset with running requests): everyone recomputes."""
        for req in reversed(list(self._order)):
            self._preempt(req)
        self._heap.clear()

    def _complete_due(self) -> None:
        """Finish every decoding request whose last token was produced at the current tick."""
        heap, tick = self._heap, self._tick
        while heap and heap[0][0] <= tick:
            key, _, req = heapq.heappop(heap)
            if req.mode != _DECODE or key != req.target - req.goff:
                continue  # stale entry: preempted or aborted since it was pushed
            self._remove_running(req)
            self._finish(req, req.reason)

    def _heap_min(self) -> int | None:
        heap = self._heap
        while heap:
            key, _, req = heap[0]
            if req.mode == _DECODE and req.target - req.goff == key:
                return key
            heapq.heappop(heap)
        return None

    def _runnable(self) -> bool:
        if self._failed is not None or self._hold:
            return False
        if self.lifecycle.memory is not EngineMemory.AWAKE:
            return False
        if self.lifecycle.paused in ("abort", "keep"):
            return False
        return bool(self._order or self._waiting)

    def _admissible(self, budget_left: int, free_blocks: int) -> bool:
        if not self._waiting or len(self._order) >= self.settings.max_num_seqs or budget_left <= 0:
            return False
        head = self._waiting[0]
        chunk = min(head.prompt + head.gen - head.computed, budget_left)
        return self._blocks(chunk) <= free_blocks

    # --- control requests handled at iteration boundaries -------------------------------------
    def _apply_controls(self) -> None:
        while self._controls:
            kind, arg, ev = self._controls.popleft()
            if kind == "pause":
                self.lifecycle.on_pause(arg)
                self._log("pause", arg)
                if arg == "abort":
                    self._abort_all()
                if arg == "wait":
                    self._drain_waiters.append((ev, False))
                else:
                    ev.succeed()
            elif kind == "quiesce":  # sleep: what happens to requests still in the scheduler
                if arg == "wait" and self.lifecycle.paused in ("abort", "keep"):
                    arg = "keep"  # a paused scheduler cannot drain: its requests stay frozen
                self._log("quiesce", arg)
                if arg == "abort":
                    self._abort_all()
                if arg == "wait":
                    self._drain_waiters.append((ev, True))
                else:
                    self._preempt_all()
                    self._hold = True
                    ev.succeed()
            elif kind == "abort":
                self._abort_all(include_held=True)
                ev.succeed()
            elif kind == "cancel":
                req = arg
                if req.mode in (_DECODE, _PREFILL):
                    self._remove_running(req)
                elif req in self._waiting:
                    self._waiting.remove(req)
                elif req in self._held:
                    self._held.remove(req)
                if req.mode != _DONE:
                    self._finish(req, "abort")
                ev.succeed()
            elif kind == "flush":
                self._preempt_all()
                self._log("flush")
                ev.succeed()
            else:  # pragma: no cover - programming error
                raise SimulationError(f"engine {self.name}: unknown control {kind!r}")
        if self._drain_waiters and not self._order and not self._waiting:
            for ev, hold in self._drain_waiters:
                self._hold = self._hold or hold
                ev.succeed()
            self._drain_waiters.clear()

    async def _control(self, kind: str, arg: Any = None) -> None:
        """Hand a control to the scheduler process and wait until it took effect at an iteration boundary."""
        ev = self.env.event()
        self._controls.append((kind, arg, ev))
        self._poke()
        outcome = await self._await(ev)
        if isinstance(outcome, BaseException):
            raise outcome

    # --- the scheduler process ----------------------------------------------------------------
    def _loop(self, epoch: int):  # simpy process
        env = self.env
        idle_plans = 0
        while True:
            if epoch != self._epoch:
                return
            self._apply_controls()
            if not self._runnable():
                self._end_busy()
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            if self._busy_since is None:
                self._busy_since = float(env.now)
                self._busy_tokens = self.stats.tokens_generated
                self._first_step = True  # its CPU work has no earlier GPU step to hide behind
            phase = self._plan_phase()
            if phase is not None:
                self._first_step = False  # (a phase resumed after a pause: its lead-in is not modelled)
                self.stats.phases += 1
                start = float(env.now)
                total = phase.elapsed(phase.k)
                self._wake = env.event()
                timer = env.timeout(total)
                yield timer | self._wake
                self._wake = None
                if epoch != self._epoch:
                    return
                if timer.processed:
                    k = phase.k
                else:
                    elapsed = float(env.now) - start
                    k = min(phase.done_by(elapsed) + 1, phase.k)
                    rest = phase.elapsed(k) - elapsed
                    if rest > 0:
                        yield env.timeout(rest)
                        if epoch != self._epoch:
                            return
                self._advance_decode(k, phase.elapsed(k))
                continue
            # One explicit iteration: prefill chunks, admissions or preemption.
            dt = self._iterate()
            if dt is None:
                idle_plans += 1
                if idle_plans > 2:  # pragma: no cover - a scheduler bug must not hang the simulation
                    raise SimulationError(f"engine {self.name}: requests queued but none can be scheduled "
                                          f"({len(self._waiting)} waiting, {self.kv.num_blocks - self._used_blocks} "
                                          f"free blocks)")
                continue
            idle_plans = 0
            self.stats.phases += 1
            yield env.timeout(dt)
            if epoch != self._epoch:
                return
            self._commit_iteration()

    def _end_busy(self) -> None:
        """Close the current busy period as one trace span (one per stretch of work, not per iteration)."""
        if self._busy_since is None:
            return
        span = getattr(self.observer, "span", None)
        if span is not None:
            span(self.name, "generate", self._busy_since, float(self.env.now),
                 tokens=self.stats.tokens_generated - self._busy_tokens)
        self._busy_since = None

    def _plan_phase(self) -> _Phase | None:
        """K lockstep decode iterations up to the next event, or None when an explicit iteration is due."""
        n = len(self._decode)
        if n == 0 or self._prefill:
            return None
        kmin = self._heap_min()
        if kmin is None:
            raise SimulationError(f"engine {self.name}: decoding requests without a finish tick")
        k_done = kmin - self._tick
        if k_done < 1:
            raise SimulationError(f"engine {self.name}: a request overran its target length")
        bs = self.settings.block_size
        free = self.kv.num_blocks - self._used_blocks
        cum = self._slack_cum()
        # First-iteration block need is cum[0]; a waiting request admissible now takes an explicit iteration.
        if self._admissible(self.settings.max_num_batched_tokens - n, free - cum[0]):
            return None
        k = _feasible_iterations(n, cum, free, bs, k_done)
        if k == 0:
            return None  # the next iteration must preempt
        c, m0, m1, f0, f1 = self.cost.decode_lines(n, self._sum_coff + n * (self._tick + 1))
        return _Phase(k, c, m0, m1, f0, f1, self.cost.host(n))

    def _slack_cum(self) -> list[int]:
        """cum[r] = decoding requests whose next new block is needed within r iterations (0-based)."""
        bs = self.settings.block_size
        tick = self._tick
        counts = [0] * bs
        for m, h in enumerate(self._hist):
            if h:
                counts[(-(m + tick)) % bs] += h
        cum, acc = [], 0
        for c in counts:
            acc += c
            cum.append(acc)
        return cum

    def _advance_decode(self, k: int, dt: float) -> None:
        n = len(self._decode)
        bs = self.settings.block_size
        cum = self._slack_cum()
        new_blocks = n * ((k - 1) // bs) + cum[(k - 1) % bs]
        self._used_blocks += new_blocks
        self.stats.kv_blocks_peak = max(self.stats.kv_blocks_peak, self._used_blocks)
        self._tick += k
        self.stats.iterations += k
        self.stats.tokens_generated += n * k
        self.stats.busy_s += dt
        self.stats.batch_iterations[n] = self.stats.batch_iterations.get(n, 0) + k
        self._complete_due()

    def _iterate(self) -> float | None:
        """Plan one explicit iteration (preempting as needed); returns its time, or None if nothing runs."""
        s = self.settings
        preempted = False
        while True:
            budget = s.max_num_batched_tokens
            n_dec = len(self._decode)
            need = self._slack_cum()[0] if n_dec else 0
            budget -= n_dec
            chunks: list[tuple[_Req, int]] = []
            for req in self._prefill:
                if budget <= 0:
                    break
                todo = req.prompt + req.gen - req.computed
                take = min(todo, budget)
                need += self._blocks(req.computed + take) - self._blocks(req.computed)
                chunks.append((req, take))
                budget -= take
            free = self.kv.num_blocks - self._used_blocks
            if need <= free or not self._order:
                break
            self._preempt(next(reversed(self._order)))
            preempted = True
        free -= need
        if not preempted:
            while self._admissible(budget, free):
                req = self._waiting.popleft()
                take = min(req.prompt + req.gen - req.computed, budget)
                nb = self._blocks(take)
                req.mode = _PREFILL
                self._order[req] = None
                self._prefill[req] = None
                chunks.append((req, take))
                budget -= take
                free -= nb
                self._log("admit", req.rid, req.gen)
        if not n_dec and not chunks:
            return None
        tokens = n_dec + sum(t for _, t in chunks)
        dec_ctx = self._sum_coff + n_dec * (self._tick + 1)
        kv_read = dec_ctx + sum(r.computed + t for r, t in chunks)
        attn = dec_ctx + sum(t * r.computed + t * (t + 1) / 2 for r, t in chunks)
        self._pending = (n_dec, chunks)
        seqs = n_dec + len(chunks)
        if self._first_step:
            dt = self.cost.first_time(tokens, kv_read, attn, seqs)
            self._first_step = False
        else:
            dt = self.cost.time(tokens, kv_read, attn, seqs)
        self._pending_dt = dt
        self._pending_blocks = self.kv.num_blocks - free - self._used_blocks
        return dt

    def _commit_iteration(self) -> None:
        n_dec, chunks = self._pending
        self._used_blocks += self._pending_blocks
        self.stats.kv_blocks_peak = max(self.stats.kv_blocks_peak, self._used_blocks)
        self._tick += 1
        self.stats.iterations += 1
        self.stats.busy_s += self._pending_dt
        batch = n_dec + len(chunks)
        self.stats.batch_iterations[batch] = self.stats.batch_iterations.get(batch, 0) + 1
        generated = n_dec
        for req, take in chunks:
            req.computed += take
            self.stats.prefill_tokens += take
            if req.computed == req.prompt + req.gen:
                # The chunk ended the prompt: the first (next) token is sampled in this iteration.
                req.gen += 1
                generated += 1
                del self._prefill[req]
                self._to_decode(req)
        self.stats.tokens_generated += generated
        self._complete_due()

    # --- pause / resume / flush ---------------------------------------------------------------
    async def pause(self, mode: PauseMode = "abort") -> None:
        """Stop scheduling at the next iteration boundary (seed step 46): abort, keep or wait (drain)."""
        t0 = float(self.env.now)
        self._alive("pause")
        self.lifecycle.check_pause(mode)
        await self._pause_for(self.settings.http_rtt_s / 2)
        await self._control("pause", mode)
        if mode == "wait":
            # vLLM's drain waits for its output processor, which handles the drained requests'
            # last outputs: their responses are out by the time the pause answers.
            await self._pause_for(self._tail_until - float(self.env.now))
        await self._pause_for(self.settings.http_rtt_s / 2)
        self._report("pause", t0)

    async def resume(self) -> None:
        """Continue scheduling (seed step 52); requests held while paused join the queue."""
        t0 = float(self.env.now)
        self._alive("resume")
        await self._pause_for(self.settings.http_rtt_s)
        self.lifecycle.on_resume()
        self._log("resume")
        while self._held:
            self._waiting.append(self._held.popleft())
        self._poke()
        self._report("resume", t0)

    async def abort_all(self) -> int:
        """POST /abort_requests {} (seed step 28): every request in the engine ends with "abort" and its
        partial tokens; returns how many were aborted (the real client's `abort_all`)."""
        t0 = float(self.env.now)
        self._alive("abort_all")
        await self._pause_for(self.settings.http_rtt_s / 2)
        before = self.stats.aborted
        await self._control("abort")
        await self._pause_for(self.settings.http_rtt_s / 2)
        self._report("abort_all", t0)
        return self.stats.aborted - before

    abort_requests = abort_all

    async def is_paused(self) -> bool:
        self._alive("is_paused")
        return self.lifecycle.paused is not None

    async def flush_cache(self) -> None:
        """Reset the prefix cache and running requests (seed step 46): frozen requests will recompute."""
        t0 = float(self.env.now)
        self._alive("flush_cache")
        self.lifecycle.check_flush()
        await self._pause_for(self.settings.http_rtt_s + self.settings.flush_cache_s)
        await self._control("flush")
        self._report("flush_cache", t0)

    # --- sleep / wake -------------------------------------------------------------------------
    async def sleep(self, level: int, mode: PauseMode = "keep") -> None:
        """Release GPU memory (seed steps 34–36): level 1 offloads weights, level 2 discards them; KV always discarded."""
        t0 = float(self.env.now)
        self._alive("sleep")
        self.lifecycle.check_sleep(level)
        if mode not in ("abort", "wait", "keep"):  # the real client raises the same
            raise ConfigError(f"engine {self.name}: sleep mode must be abort, wait or keep, got {mode!r}")
        await self._pause_for(self.settings.http_rtt_s / 2)
        await self._control("quiesce", mode)
        self._hold = True
        offload = sleep_offload_tags(level)
        discard = tuple(t for t in (TAG_WEIGHTS, TAG_KV_CACHE) if t not in offload)
        await self._mem_sleep(offload, discard)
        copies = self._weight_tensors if TAG_WEIGHTS in offload else 0
        await self._pause_for(self.settings.sleep_call_s + self.settings.sleep_per_tensor_s * copies)
        self.lifecycle.on_sleep(level)
        self._log("sleep", level)
        await self._pause_for(self.settings.http_rtt_s / 2)
        self._report("sleep", t0)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Remap `tags` (None = all; vime tags normalised to vLLM's, seed steps 10–13) plus non-deferrable ones."""
        t0 = float(self.env.now)
        self._alive("wake_up")
        normalized = self.lifecycle.check_wake(tags)
        if normalized is not None and not normalized:
            # Only vime's implicit tags (e.g. [cuda_graph]): the real client sends nothing, since vLLM
            # wakes those with any wake and an empty tag list would mean "wake all".
            return
        wanted = list(DEFERRABLE) if normalized is None else list(normalized)
        asleep = self._asleep_tags()
        chosen = [t for t in wanted if t in asleep]
        if chosen or any(t in asleep for t in NON_DEFERRABLE):
            chosen += [t for t in NON_DEFERRABLE if t in asleep]
        await self._pause_for(self.settings.http_rtt_s / 2)
        if chosen:
            restored = TAG_WEIGHTS in chosen and self._offloaded(TAG_WEIGHTS)
            await self._mem_wake(chosen)
            copies = self._weight_tensors if restored else 0
            await self._pause_for(self.settings.wake_call_s + self.settings.wake_per_tensor_s * copies)
        self.lifecycle.on_wake(normalized)
        self._log("wake_up", tuple(chosen))
        if self.lifecycle.memory is EngineMemory.AWAKE:
            self._hold = False
            self._poke()
        await self._pause_for(self.settings.http_rtt_s / 2)
        self._report("wake_up", t0)

    async def is_sleeping(self) -> bool:
        """True while any of weights / kv_cache is released (the memory state, not the pause flag)."""
        self._alive("is_sleeping")
        return self.lifecycle.memory is not EngineMemory.AWAKE

    def _offloaded(self, tag: str) -> bool:
        """`tag` is asleep with its contents in host memory (it will be copied back on wake)."""
        if self.allocator is not None:
            return self.allocator.lifecycle.state(tag) is TagState.OFFLOADED
        return self._tags_asleep.get(tag) == "offloaded"

    def _asleep_tags(self) -> list[str]:
        if self.allocator is not None:
            return self.allocator.lifecycle.asleep_tags()
        return sorted(self._tags_asleep)

    def _tag_bytes(self) -> dict[str, int]:
        kv = self.kv
        return {TAG_WEIGHTS: kv.weight_bytes, TAG_KV_CACHE: kv.kv_allocated_bytes,
                TAG_CUDA_GRAPH: kv.cuda_graph_bytes, TAG_RUNTIME: kv.activation_peak_bytes}

    async def _mem_sleep(self, offload: Sequence[str], discard: Sequence[str]) -> None:
        if self.allocator is not None:
            await self.allocator.sleep(offload, discard)
            return
        hw, sizes = self.hardware, self._tag_bytes()
        copy = sum(sizes[t] for t in offload)
        unmap = copy + sum(sizes[t] for t in discard)
        # Same formula as SimAllocator with persistent pinned buffers (the GPUs of the group work in
        # parallel): vLLM's CPU backup comes from PyTorch's caching host allocator, which keeps the
        # pinned blocks after wake, so only the first sleep (or a larger tag) pays the pinning —
        # measured on the H200: level-1 sleep 4.21 s the first time, 0.26 s after (issue 10).
        # The host blocks are rounded up to powers of two per tensor (ModelSpec.vllm_pinned_scale).
        grow = 0
        for t in offload:
            need = math.ceil(sizes[t] * (self._pinned_scale if t == TAG_WEIGHTS else 1.0))
            grow += max(0, need - self._host_pinned.get(t, 0))
            self._host_pinned[t] = max(need, self._host_pinned.get(t, 0))
        seconds = (grow / GiB * hw.vmm.pinned_alloc_s_per_gib + copy / hw.d2h_bytes_per_s
                   + unmap / GiB * hw.vmm.unmap_release_s_per_gib)
        for t in offload:
            self._tags_asleep[t] = "offloaded"
        for t in discard:
            self._tags_asleep[t] = "discarded"
        await self._pause_for(seconds)

    async def _mem_wake(self, tags: Sequence[str]) -> None:
        if self.allocator is not None:
            await self.allocator.wake_up(tags)
            return
        hw, sizes = self.hardware, self._tag_bytes()
        mapped = sum(sizes[t] for t in tags)
        copy = sum(sizes[t] for t in tags if self._tags_asleep.get(t) == "offloaded")
        for t in tags:
            self._tags_asleep.pop(t, None)
        await self._pause_for(mapped / GiB * hw.vmm.create_map_s_per_gib + copy / hw.h2d_bytes_per_s)

    # --- weights ------------------------------------------------------------------------------
    async def start_weight_update(self) -> None:
        """Open a weight-update session (seed step 47); needs the weights mapped."""
        t0 = float(self.env.now)
        self._alive("start_weight_update")
        self.lifecycle.check_start_update()
        first = 0.0 if self._updated_once else self.settings.first_update_s
        await self._pause_for(self.settings.http_rtt_s + self.settings.start_update_call_s + first)
        self._updated_once = True
        self.lifecycle.on_start_update()
        self._report("start_weight_update", t0)

    def bucket_seconds(self, bucket: WeightBucket) -> float:
        """One POST /update_weights (seed steps 48–50): HTTP + handle open + per-tensor dispatch + transfer + load.

        Every TP rank receives the whole bucket — over CUDA IPC from the trainer's buffer on the
        same GPU (colocated: read at the device-to-device rate) or by NCCL broadcast
        (`weight_transfer_bytes_per_s`) — and writes its 1/TP shard into its parameters at the
        device rate; the ranks work in parallel.
        """
        s = self.settings
        device = self.hardware.decode_bytes_per_s
        transfer = bucket.nbytes / (s.weight_transfer_bytes_per_s or device)
        load = bucket.nbytes / s.tp / device
        return s.http_rtt_s + s.ipc_open_s + s.load_per_tensor_s * len(bucket.names) + transfer + load

    async def update_weights(self, bucket: WeightBucket) -> None:
        """Load one bucket (seed steps 48–50); needs an open session."""
        t0 = float(self.env.now)
        self._alive("update_weights")
        self.lifecycle.check_update()
        if bucket.nbytes < 0:
            # vLLM's worker closes the update session when a bucket fails; so does the real client's record.
            self.lifecycle.updating = False
            raise EngineError(self.name, "update_weights", f"bucket {bucket.index} has negative size", status=400)
        await self._pause_for(self.bucket_seconds(bucket))
        self._log("update_weights", bucket.index, bucket.nbytes)
        self._report("update_weights", t0)

    async def finish_weight_update(self, version: int) -> None:
        """Close the session; later responses carry str(version) (seed step 51)."""
        t0 = float(self.env.now)
        self._alive("finish_weight_update")
        self.lifecycle.check_finish_update(version)
        await self._pause_for(self.settings.http_rtt_s + self.settings.finish_update_call_s)
        self.lifecycle.on_finish_update(version)
        self._log("weight_version", version)
        self._report("finish_weight_update", t0)

    async def weight_version(self) -> str | None:
        self._alive("weight_version")
        v = self.lifecycle.weight_version
        return None if v is None else str(v)

    async def health(self) -> bool:
        return self._failed is None

    # --- faults -------------------------------------------------------------------------------
    def inject_failure(self, at: float, detail: str = "injected failure") -> None:
        """Make the server die at virtual time `at`: in-flight and later calls raise EngineError(retryable=True)."""
        if at < self.env.now:
            raise SimulationError(f"engine {self.name}: failure time {at} is in the past (now {self.env.now})")

        def crash():  # simpy process
            yield self.env.timeout(at - self.env.now)
            self.fail_now(detail)

        self.env.process(crash())

    def fail_now(self, detail: str = "injected failure") -> None:
        """The server process dies now: every waiting caller gets EngineError(retryable=True)."""
        if self._failed is not None:
            return
        self._failed = detail
        self._epoch += 1
        self._log("fail", detail)
        err = EngineError(self.name, "generate", f"engine died: {detail}", status=503, retryable=True)
        reqs = list(self._order) + list(self._waiting) + list(self._held)
        for req in reqs:
            self.stats.failed += 1
            req.mode = _DONE
            req.done.succeed(err)
        for _, _, ev in self._controls:
            ev.succeed(err)
        for ev, _ in self._drain_waiters:
            ev.succeed(err)
        wake = self._wake
        self._end_busy()
        self._reset_scheduler()
        if wake is not None and not wake.triggered:
            wake.succeed()

    async def restart(self) -> None:
        """Bring a failed server back (after `restart_s`): awake, empty, no weight version, paused by nothing."""
        if self._failed is None:
            raise EngineError(self.name, "restart", "engine is healthy; restart only a failed engine")
        await self._pause_for(self.settings.restart_s)
        self._failed = None
        lc = self.lifecycle
        lc.memory, lc.sleep_level, lc.paused, lc.updating, lc.weight_version = \
            EngineMemory.AWAKE, 0, None, False, None
        # The dead process's memory stays accounted; the new one maps all of it again.
        if self.allocator is not None and self.allocator.lifecycle.asleep_tags():
            await self.allocator.wake_up(None)
        self._tags_asleep.clear()
        self._host_pinned.clear()  # a new server process: its pinned pool is gone
        self._updated_once = False  # ... and its weight-transfer setup
        self._epoch += 1
        self._reset_scheduler()
        self._proc = self.env.process(self._loop(self._epoch))
        self._log("restart")


_POOL_SIZE = 1 << 20
_POOLS: dict[tuple[int, int, int], tuple[list[int], list[float]]] = {}


def _token_pool(seed: int, vocab: int, eos: int) -> tuple[list[int], list[float]]:
    """A seeded pool of token ids (never EOS) and plausible log-probs that responses are cut from."""
    key = (seed, vocab, eos)
    pool = _POOLS.get(key)
    if pool is None:
        rng = np.random.Generator(np.random.PCG64(key_seed(seed, "token-pool", vocab, eos)))
        ids = rng.integers(0, vocab - 1, size=_POOL_SIZE, dtype=np.int64)
        ids[ids >= eos] += 1
        # Sampled tokens at temperature 1: mostly confident, a long tail of surprising ones.
        lps = np.round(-rng.exponential(0.45, size=_POOL_SIZE), 6)
        pool = _POOLS[key] = (ids.tolist(), lps.tolist())
    return pool


def _feasible_iterations(n: int, cum: list[int], free: int, bs: int, limit: int) -> int:
    """Largest J ≤ limit such that the first J lockstep iterations need at most `free` new blocks.

    Iterations 0..j need n·(j // bs) + cum[j % bs] new blocks (each request takes a block every
    bs iterations, starting at its slack), which is non-decreasing in j.
    """
    if n == 0:
        return limit
    q, rem = divmod(free, n)
    r = bisect_right(cum, rem) - 1
    jmax = q * bs + r if r >= 0 else q * bs - 1
    return max(0, min(limit, jmax + 1))
