"""The execution cost of one engine in closed form: iteration time from a roofline, lockstep decode phases, weight buckets."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from vime.sim.moe import check_engine_expert_parallel, expected_distinct_experts

if TYPE_CHECKING:
    from vime.protocols import WeightBucket
    from vime.sim.engine.settings import EngineSettings
    from vime.sim.hardware import HardwareSpec
    from vime.sim.models import ModelSpec


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
    + the sampler (requests · vocabulary · sample_s_per_logit)
    + GEMMs(weights / weight rate, GEMM FLOPs / (TP · prefill FLOP/s)), the larger of the two roofs or, with
      `efficiency.gemm_roofline_p`, their p-norm (near the ridge the two add in part)
    + max(KV bytes read / KV rate, attention FLOPs / (TP · prefill FLOP/s)):
    the GEMMs and the attention are separate kernels in sequence, so the tensor cores of the GEMMs
    cannot hide the attention's KV read (the dense 14B/32B decode at 256 requests, vllm_bench_s31).
    KV bytes = kv_bytes_per_token · (context tokens read); GEMM FLOPs = the body for every computed
    token and the output head once per scheduled request (vLLM computes logits only at each
    request's last position, so a prefill chunk pays it once, not per prompt token); attention
    FLOPs are linear in the attended context.

    The iteration takes max(GPU time, host time), host time = host_s + host_per_seq_s · requests:
    vLLM's CPU work of a step (scheduling, input preparation, output processing) runs while the
    GPU executes (async scheduling), so it only shows when it is the longer one — at large
    batches (issue 10; bench/data/h200_notes.md). An engine without torch.compile (--enforce-eager)
    adds the Python dispatch of its forward, layers · uncompiled_host_s_per_layer, to that CPU time:
    the GPU cannot run ahead of ops not yet issued, so it shows at every batch. Without async scheduling
    (vLLM before 0.10, or --no-async-scheduling) the CPU step and the GPU's add (an uncompiled forward's
    dispatch still overlaps the kernels it launches).

    MoE models: `weight_bytes` is the part every iteration reads; the routed experts
    (`expert_bytes` per rank) are read only where the iteration's tokens go, the expected
    fraction 1 − (1 − k/E)^tokens of them (`vime.sim.moe.expected_distinct_experts`): a small
    decode batch reads far less than all weights, a prefill chunk all of them.
    """

    weight_bytes: float
    kv_bytes_per_token: float
    bytes_per_s: float  # KV reads (and the weights unless weight_bytes_per_s is set)
    flops_per_s: float  # per GPU, effective
    flops_base: float  # per token, whole model, without attention and without the output head
    flops_per_ctx: float  # per token per attended context token, whole model
    tp: int
    overhead_s: float  # GPU-serial per iteration (per step and per layer: launches, small kernels), added to the GPU time
    allreduce_per_token_s: float
    allreduce_latency_s: float
    flops_head: float = 0.0  # per sampled position (one per scheduled request), whole model
    host_s: float = 0.0  # CPU work per step, overlapped with the GPU
    host_per_seq_s: float = 0.0  # + per scheduled request
    weight_bytes_per_s: float = 0.0  # weights streamed per step (0: bytes_per_s)
    eager_s: float = 0.0  # launch cost of an iteration past the CUDA graphs
    graph_max_tokens: int = 512
    expert_bytes: float = 0.0  # routed-expert weights per rank (MoE), read where touched
    num_experts: int = 0
    top_k: int = 0
    kv_bytes_per_s: float = 0.0  # the attention's KV read rate (0: bytes_per_s)
    sample_s: float = 0.0  # the sampler per sampled position (vocabulary · sample_s_per_logit)
    dispatch_s: float = 0.0  # the forward's op-by-op Python dispatch per iteration (no torch.compile)
    overlap: bool = True  # async scheduling: the CPU step beside the GPU's (False: after it)
    roofline_p: float = 0.0  # the GEMMs' two roofs combined as a p-norm (0: the larger one)

    @classmethod
    def build(cls, hardware: HardwareSpec, model: ModelSpec, settings: EngineSettings) -> IterationModel:
        tp = settings.tp
        base = model.flops_per_token(0, lm_head=False)
        per_ctx = (model.flops_per_token(4096, lm_head=False) - base) / 4096.0
        # Two all-reduces per layer (after attention and after the MLP) of hidden-size bf16 activations.
        ar_bytes = 2 * model.num_layers * model.hidden_size * model.dtype_bytes
        collectives = 2 * model.num_layers
        a2a_s = 0.0
        if settings.expert_parallel:
            check_engine_expert_parallel(model, tp)
            # MoE layers: the MLP all-reduce becomes a dispatch and a combine all-to-all of k copies
            n_moe = len(model.moe_layers)
            ar_bytes -= n_moe * model.hidden_size * model.dtype_bytes
            collectives += n_moe
            a2a_bytes = model.moe_top_k * model.hidden_size * model.dtype_bytes
            a2a_s = 2 * n_moe * hardware.allgather_seconds(a2a_bytes, tp, calls=0)
        lat = collectives * settings.allreduce_latency_s if tp > 1 else 0.0
        experts = float(model.expert_weight_bytes(tp))
        eff = hardware.efficiency
        # TP > 1: the workers prepare their inputs in their own processes (Efficiency.host_step_tp_scale)
        host_scale = eff.host_step_tp_scale if tp > 1 else 1.0
        return cls(float(model.weight_bytes(tp)) - experts, float(model.kv_bytes_per_token(tp)),
                   hardware.decode_bytes_per_s, hardware.prefill_flops, base, per_ctx, tp,
                   eff.iteration_overhead_s + model.num_layers * eff.iteration_layer_s, hardware.allreduce_seconds(ar_bytes, tp, calls=0) + a2a_s, lat,
                   model.lm_head_flops_per_token(), eff.host_step_s * host_scale, eff.host_step_per_seq_s * host_scale,
                   hardware.decode_weight_bytes_per_s, eff.eager_iteration_s, settings.cuda_graph_max_tokens,
                   experts, model.num_experts, model.moe_top_k, settings.kv_read_bytes_per_s,
                   model.vocab_size * settings.sample_s_per_logit,
                   0.0 if settings.compiled else model.num_layers * eff.uncompiled_host_s_per_layer,
                   settings.async_scheduling, eff.gemm_roofline_p)

    def host(self, seqs: int) -> float:
        """The engine's CPU time of one step with `seqs` scheduled requests."""
        return self.host_s + self.dispatch_s + self.host_per_seq_s * seqs

    def fixed(self, tokens: int) -> float:
        eager = self.eager_s if tokens > self.graph_max_tokens else 0.0
        return self.overhead_s + eager + self.allreduce_latency_s + self.allreduce_per_token_s * tokens

    def _weights_s(self, tokens: float) -> float:
        """Weights one iteration of `tokens` tokens reads: all of a dense model's; a MoE model's
        shared part and the expected touched share of its experts."""
        nbytes = self.weight_bytes
        if self.expert_bytes:
            nbytes += self.expert_bytes * expected_distinct_experts(self.num_experts, self.top_k, tokens) \
                / self.num_experts
        return nbytes / (self.weight_bytes_per_s or self.bytes_per_s)

    def gpu_time(self, tokens: int, kv_read_tokens: float, attn_ctx: float, seqs: int | None = None) -> float:
        """The GPU's part of an iteration (what a bare PyTorch forward of the same shapes takes)."""
        seqs = tokens if seqs is None else seqs
        kv = self.kv_bytes_per_token * kv_read_tokens / (self.kv_bytes_per_s or self.bytes_per_s)
        attention = self.flops_per_ctx * attn_ctx / self.tp / self.flops_per_s
        return self.fixed(tokens) + self.sample_s * seqs + self.gemm_time(tokens, seqs) + max(kv, attention)

    def gemm_time(self, tokens: int, seqs: int) -> float:
        """The linear layers of an iteration: their weights streamed once against their FLOPs, the larger one, or
        near the ridge, where the two roofs add in part, their p-norm (`roofline_p`)."""
        comp, weights = (self.flops_base * tokens + self.flops_head * seqs) / self.tp / self.flops_per_s, self._weights_s(tokens)
        if self.roofline_p <= 0.0:
            return max(weights, comp)
        hi, lo = max(weights, comp), min(weights, comp)
        return hi * (1.0 + (lo / hi) ** self.roofline_p) ** (1.0 / self.roofline_p) if hi > 0.0 else 0.0

    def time(self, tokens: int, kv_read_tokens: float, attn_ctx: float, seqs: int | None = None) -> float:
        """One iteration computing `tokens` tokens of `seqs` requests (None: one token each, decode),
        reading `kv_read_tokens` of KV, attending `attn_ctx` in total."""
        seqs = tokens if seqs is None else seqs
        gpu, host = self.gpu_time(tokens, kv_read_tokens, attn_ctx, seqs), self.host(seqs)
        if self.overlap:
            return max(gpu, host)
        # in series: the step's CPU work, then the forward, whose kernels run as fast as they are dispatched
        return host - self.dispatch_s + max(gpu, self.dispatch_s)

    def first_time(self, tokens: int, kv_read_tokens: float, attn_ctx: float, seqs: int | None = None) -> float:
        """The first iteration after the engine was idle: no earlier GPU step hides its CPU part, so
        host + GPU (a lone prefill on the H200, bench/data/h200_vllm_0.25.1*.json)."""
        seqs = tokens if seqs is None else seqs
        return self.gpu_time(tokens, kv_read_tokens, attn_ctx, seqs) + self.host(seqs)

    def decode_phase(self, k: int, n: int, ctx0: float) -> _Phase:
        """k lockstep decode iterations of n requests whose contexts sum to ctx0 at the first (closed form of `time`)."""
        lines = self.decode_lines(n, ctx0)
        if self.overlap:
            return _Phase(k, *lines, self.host(n))
        return _Phase(k, *lines, self.dispatch_s, serial=self.host(n) - self.dispatch_s)

    def decode_lines(self, n: int, ctx0: float) -> tuple[float, float, float, float, float]:
        """(C, m0, m1, f0, f1) of the GPU time for n requests decoding in lockstep whose contexts sum
        to ctx0 at j = 0: C the part that does not grow with the context (fixed, sampler, the GEMMs), then
        the attention's KV read m0 + m1·j against its FLOPs f0 + f1·j (the host floor is `host(n)`)."""
        kv_rate = self.kv_bytes_per_s or self.bytes_per_s
        m0 = self.kv_bytes_per_token * ctx0 / kv_rate
        m1 = self.kv_bytes_per_token * n / kv_rate
        scale = 1.0 / (self.tp * self.flops_per_s)
        f0 = self.flops_per_ctx * ctx0 * scale
        f1 = self.flops_per_ctx * n * scale
        return self.fixed(n) + self.sample_s * n + self.gemm_time(n, n), m0, m1, f0, f1


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
    serial: float = 0.0  # CPU time every iteration adds outside the max (no async scheduling)

    def elapsed(self, k: int) -> float:
        if self.host <= 0.0:
            return (self.c + self.serial) * k + sum_max_lines(self.m0, self.m1, self.f0, self.f1, k)
        return self.serial * k + sum_max_of_lines(((self.c + self.m0, self.m1), (self.c + self.f0, self.f1),
                                                   (self.host, 0.0)), k)

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


def bucket_seconds(settings: EngineSettings, hardware: HardwareSpec, bucket: WeightBucket) -> float:
    """One POST /update_weights (seed steps 48–50): HTTP + handle open + per-tensor dispatch + transfer + load.

    Every TP rank receives the whole bucket — over CUDA IPC from the trainer's buffer on the
    same GPU (colocated: read at the device-to-device rate) or by NCCL broadcast
    (`weight_transfer_bytes_per_s`) — and writes its 1/TP shard into its parameters at the
    device rate; the ranks work in parallel.
    """
    s = settings
    device = hardware.decode_bytes_per_s
    transfer = bucket.nbytes / (s.weight_transfer_bytes_per_s or device)
    load = bucket.nbytes / s.tp / device
    return s.http_rtt_s + s.ipc_open_s + s.load_per_tensor_s * len(bucket.names) + transfer + load
