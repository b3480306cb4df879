"""Simulated Megatron actor group: per-rank memory on the shared SimGPUs and fwd/bwd/optimizer time from FLOPs and bytes.

`SimTrainer` implements `vime.protocols.Trainer` for TP × PP × CP × DP ranks placed on the first
``actor_num_nodes × actor_num_gpus_per_node`` GPUs of a `SimCluster` (Megatron's rank order: TP
fastest, then CP, then DP, then PP). What it models, per seed step:

- step 3 (`init`): CUDA context, bf16 params, fp32 main grads, fp32 master + Adam m, v (sharded
  over DP × CP with the distributed optimizer), a pinned host backup of the weights; asleep
  afterwards when ``offload_train``.
- step 37 (`wake_up`) / step 41 (`sleep`): params and optimizer offloaded to pinned host memory
  and back, grads discarded, through a `SimAllocator` at host-link speed with VMM costs.
- step 38: the old-log-prob forward over the whole batch only when `vime.algo.logprob_reuse`
  says the training forward cannot be reused.
- step 40: per DP rank (concurrently), per micro-batch: activations allocated for the
  micro-batch, fwd + bwd time = 3 × forward FLOPs / (TP·PP·CP · peak · MFU) + TP collectives
  (sequence-parallel all-gather / reduce-scatter, 4 per layer and micro-batch); then gradient
  reduce-scatter, a memory-bound Adam step and the parameter all-gather over DP.
- step 41: the weight backup (device → host copy of each rank's params).
- step 48 (`export_weights`): HF-named, TP-gathered tensors packed into buckets; each bucket is
  staged on every actor GPU (a packed buffer the colocated engine reads over CUDA IPC) with the
  cost of its host → device copy and TP all-gather, and freed when the consumer asks for the next.

Times are virtual (`vime.sim.clock`); metrics are deterministic functions of the batch and the seed.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vime.errors import ConfigError, TrainerError
from vime.protocols import TRAINER_TAGS, TrainerLifecycle, TrainMetrics, WeightBucket
from vime.sim.memory import GiB, PinnedMode, SimAllocator, SimCluster, elapse

if TYPE_CHECKING:
    from vime.sim.hardware import HardwareSpec
    from vime.sim.models import ModelSpec, Recompute
    from vime.types import TrainBatch

OWNER = "actor"
#: GPU tags the trainer holds outside its allocator (never released).
TAG_CONTEXT = "context"
TAG_WEIGHT_BUFFER = "weight_buffer"
#: Host tag of the CPU weight backup (seed step 41).
TAG_WEIGHT_BACKUP = "weight_backup"
#: Bytes per parameter of the state that lives on each rank.
PARAM_BYTES = 2  # bf16 model weights
GRAD_BYTES = 4  # fp32 main grads (Megatron accumulates bf16 runs in fp32)
OPTIMIZER_BYTES = 12  # fp32 master weights + Adam m + Adam v
#: HBM bytes an Adam step moves per parameter of its shard: read grad, master, m, v (16), write
#: master, m, v (12), write the bf16 param (2).
ADAM_STEP_BYTES = 30
#: HBM bytes per parameter of a plain torch.optim.AdamW step (foreach, fp32 state) inside Megatron's
#: mixed-precision optimizer, counted kernel by kernel (r = read, w = write, bytes per parameter):
#: param.mul_(1 − lr·wd) r4 w4; exp_avg.lerp_(grad) r8 w4; exp_avg_sq.mul_ r4 w4;
#: exp_avg_sq.addcmul_(grad, grad) r8 w4 (grad passed twice, read once); sqrt r4 w4; div_ by the
#: bias correction r4 w4; add_(eps) r4 w4; param.addcdiv_(exp_avg, denom) r12 w4 → 84; plus
#: Megatron: grad-norm r4, clip (grads × coef) r4 w4, fp32 main params → bf16 model params r4 w2
#: → 98; with 2-byte grads also the copy of the model grads into fp32 main grads (r2 w4) → 104.
#: (The H200 run: Qwen3-1.7B, 60 ms per step, issue 12.) A fused Adam does it all in one pass.
TORCH_ADAMW_STEP_BYTES = 98
#: Unfused core attention (Megatron's local DotProductAttention without TransformerEngine,
#: masked_softmax_fusion off, softmax in fp32), HBM bytes per attention-score element:
#: forward: baddbmm writes bf16 scores (w2), .float() (r2 w4), masked_fill_ (r4 w4 + the bool
#: mask r1), softmax (r4 w4), back to bf16 (r4 w2), the probs·V bmm reads them (r2) → 33;
#: backward: the grad of the probs (w2), grad V reads the probs (r2), bf16 → fp32 (r2 w4),
#: softmax backward (r8 w4), masked_fill backward (r5 w4), fp32 → bf16 (r4 w2), the two
#: matmuls of the baddbmm backward read the score grad (r4) → 41;
#: kept for the backward: the fp32 softmax output (4) and the bf16 probs the bmm saves (2) → 6.
UNFUSED_SCORE_FWD_BYTES = 33
UNFUSED_SCORE_BWD_BYTES = 41
UNFUSED_SCORE_KEPT_BYTES = 6
#: Checkpoint write/read rate per node (simulated filesystem), bytes/s.
CHECKPOINT_BYTES_PER_S = 2e9


#: Bytes per parameter (of the optimizer's shard) alive during a torch AdamW step under Megatron's
#: mixed-precision optimizer with 2-byte model grads: the fp32 copies of the grads it steps on and
#: one fp32 foreach temporary. Measured on the H200 as the optimizer's peak above the idle state:
#: 8.00 B/param for Qwen3-1.7B (8 runs) and 8.01 for Qwen3-4B (5 runs), where it set the step's peak
#: at 1×1024. A fused Adam steps in place on fp32 main grads: 0.
TORCH_ADAMW_TRANSIENT_BYTES = 8


def optimizer_transient_bytes(hw: HardwareSpec) -> int:
    """Bytes per parameter the optimizer step allocates on top of the state (the profile's optimizer)."""
    return TORCH_ADAMW_TRANSIENT_BYTES if hw.software.train_optimizer == "torch" else 0


def grad_bytes(hw: HardwareSpec) -> int:
    """Main-grad bytes per parameter of the profile's training stack (fp32 by default, bf16 when so described)."""
    return int(hw.software.train_grad_bytes)


def optimizer_step_bytes(hw: HardwareSpec) -> int:
    """HBM bytes per parameter of one optimizer step: fused Adam, or torch AdamW kernel by kernel."""
    if hw.software.train_optimizer == "torch":
        return TORCH_ADAMW_STEP_BYTES + (6 if grad_bytes(hw) == 2 else 0)
    return ADAM_STEP_BYTES


def streaming_bytes_per_s(hw: HardwareSpec) -> float:
    """Rate of memory-bound elementwise kernels (optimizer, unfused softmax): HBM × decode_bw_util."""
    return hw.hbm_bytes_per_s * hw.efficiency.decode_bw_util


#: Extra HBM bytes per element of torch's composite RMSNorm over a fused one (the local spec's
#: norms with fp32 weights, and its key norm always; `Software.train_norm`). Counting kernels:
#: forward .float() r2 w4, pow r4 w4, mean r4, × rstd r4 w4, × weight r4 w4, back to bf16 r4 w2
#: → 40 against a fused kernel's r2 w2 (+36); backward ~88 against ~8 (+80). Measured on the
#: H200 as the difference of the same steps with fp32 and with bf16 norm weights (Qwen3-1.7B,
#: 6144 more composite elements per token and layer, at the streaming rate): forward +41 / +39 /
#: +41 and backward +90 / +99 / +100 bytes per element at 1×4096 / 4×2048 / 8×1024
#: (bench/data/h200_megatron_1.7b_accounting*.json); the constants take the measurement.
NORM_COMPOSITE_EXTRA_FWD_BYTES = 40
NORM_COMPOSITE_EXTRA_BWD_BYTES = 96
#: Unfused SwiGLU (`Software.train_elementwise`), per ffn element: silu r2 w2, the gate copy
#: r2 w2, the product r4 w2 → 14 against a fused kernel's r4 w2 (+8); backward: the product's two
#: grads r8 w4, silu's r4 w2, the concatenated fc1 grad r4 w4 → ~26 against ~10 fused (+16).
SWIGLU_UNFUSED_EXTRA_FWD_BYTES = 8
SWIGLU_UNFUSED_EXTRA_BWD_BYTES = 16
#: Unfused RoPE, per q/k element: t·cos r2 w2, rotate_half (neg + cat) r4 w4, ·sin r2 w2, the
#: sum r4 w2 → 22 against a fused kernel's r2 w2 (+18), about the same again backward.
ROPE_UNFUSED_EXTRA_BYTES = 18


def software_stream_bytes_per_token(model: ModelSpec, hw: HardwareSpec) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token, whole model, that the profile's unfused norms and
    elementwise kernels move beyond a fused stack's (0 for the default TransformerEngine stack)."""
    sw = hw.software
    h, hd = model.hidden_size, model.head_dim
    qk = (model.num_attention_heads + model.num_kv_heads) * hd if model.qk_norm else 0
    composite = 0.0
    if sw.train_norm == "torch_fp32_weight":
        composite = 2 * h + qk + h / model.num_layers  # both block norms, q and k, the final norm once
    elif sw.train_norm == "torch" and model.qk_norm:
        composite = model.num_kv_heads * hd  # the key norm's strided input
    fwd = composite * NORM_COMPOSITE_EXTRA_FWD_BYTES
    bwd = composite * NORM_COMPOSITE_EXTRA_BWD_BYTES
    if sw.train_elementwise == "unfused":
        rope = (model.num_attention_heads + model.num_kv_heads) * hd * ROPE_UNFUSED_EXTRA_BYTES
        ffn = model.ffn_hidden_size if model.gated_mlp else 0
        fwd += rope + ffn * SWIGLU_UNFUSED_EXTRA_FWD_BYTES
        bwd += rope + ffn * SWIGLU_UNFUSED_EXTRA_BWD_BYTES
    return fwd * model.num_layers, bwd * model.num_layers


def compute_seconds(model: ModelSpec, hw: HardwareSpec, lengths: Sequence[int], ranks: int = 1) -> tuple[float, float]:
    """(forward, backward) of one micro-batch of sequences `lengths` over `ranks` = TP·PP·CP GPUs, compute only.

    Flash attention (the default): FLOPs of `ModelSpec.sequence_flops` (causal) at train MFU,
    backward = `train_backward_factor` (2) × forward. Unfused attention (`software.train_attention = "unfused"`): the
    score and value matmuls run over the full s × s matrix at `train_attention_mfu`, and every score element costs
    UNFUSED_SCORE_FWD/BWD_BYTES of memory traffic at the streaming rate; the matmuls' backward
    is 2 × their forward (H200, Qwen3-1.7B: fwd 150 / bwd 220 ms at 1×4096, 185 / 300 ms at 4×2048).
    Unfused norms and elementwise kernels add their traffic (`software_stream_bytes_per_token`),
    and neither direction runs faster than the CPU launches it (`train_host_*_s_per_layer`).
    """
    flops = sum(model.sequence_flops(n) for n in lengths)
    rate = ranks * hw.train_flops
    stream = streaming_bytes_per_s(hw)
    tokens = sum(lengths)
    extra_fwd, extra_bwd = software_stream_bytes_per_token(model, hw)
    fwd, bwd = tokens * extra_fwd / ranks / stream, tokens * extra_bwd / ranks / stream
    if hw.software.train_attention != "unfused":
        fwd += flops / rate
        bwd += hw.efficiency.train_backward_factor * flops / rate
    else:
        causal = sum(4.0 * model.num_layers * model.num_attention_heads * model.head_dim * n * (n + 1) / 2
                     for n in lengths)  # what sequence_flops counts for attention
        attn_rate = ranks * hw.bf16_flops * (hw.efficiency.train_attention_mfu or hw.efficiency.train_mfu)
        matmul = (flops - causal) / rate + model.unfused_attention_flops(lengths) / attn_rate
        elements = model.score_elements(lengths) / ranks
        fwd += matmul + elements * UNFUSED_SCORE_FWD_BYTES / stream
        bwd += hw.efficiency.train_backward_factor * matmul + elements * UNFUSED_SCORE_BWD_BYTES / stream
    eff = hw.efficiency
    return (max(fwd, eff.train_host_fwd_s_per_layer * model.num_layers),
            max(bwd, eff.train_host_bwd_s_per_layer * model.num_layers))


def software_terms(hw: HardwareSpec) -> dict[str, str]:
    """The profile's training software as `ModelSpec.activation_bytes_per_token` keywords."""
    sw = hw.software
    return {"attention": sw.train_attention, "norm": sw.train_norm, "elementwise": sw.train_elementwise}


def score_bytes(model: ModelSpec, hw: HardwareSpec, lengths: Sequence[int], tp: int = 1, pp: int = 1,
                recompute: Recompute = "none") -> float:
    """What unfused attention keeps for the backward on one rank beyond `ModelSpec.activation_bytes_per_token`
    (0 with flash attention): UNFUSED_SCORE_KEPT_BYTES per score element, per token and layer
    the RoPE'd query and the K and V expanded to every query head for the baddbmm / bmm
    (3 · b · heads/TP · head_dim; GQA's repeat_interleave), and per layer the boolean causal mask
    of the micro-batch's longest sequence (s² bytes, shared by its sequences). Selective recompute
    drops the core attention (scores, expansions, mask) but keeps its query input; full recompute
    keeps one layer's.
    """
    if hw.software.train_attention != "unfused":
        return 0.0
    layers = model.layers_per_stage(pp)
    per_token = model.dtype_bytes * (model.num_attention_heads // tp) * model.head_dim
    tokens = sum(lengths)
    if recompute == "selective":
        return float(layers * per_token * tokens)
    mask = float(max(lengths, default=0)) ** 2
    kept = (model.score_elements(lengths, tp, pp) * UNFUSED_SCORE_KEPT_BYTES
            + layers * (3 * per_token * tokens + mask))
    return kept / layers if recompute == "full" else kept


def rope_bytes(model: ModelSpec, hw: HardwareSpec, lengths: Sequence[int], pp: int = 1,
               recompute: Recompute = "none") -> float:
    """Unfused RoPE's tables on one rank (0 when fused): every layer keeps cos and sin for q and for
    k, four bf16 [s, head_dim] tensors over the micro-batch's longest sequence, shared by its
    sequences (H200: 1024 B per position per layer for head_dim 128 at every batch size)."""
    if hw.software.train_elementwise != "unfused":
        return 0.0
    per_layer = 4.0 * model.dtype_bytes * model.head_dim * max(lengths, default=0)
    return per_layer if recompute == "full" else per_layer * model.layers_per_stage(pp)


@dataclass(frozen=True)
class Layout:
    """Where the actor ranks sit: sizes of each parallel dimension and the GPU of every rank."""

    tp: int
    pp: int
    cp: int
    dp: int
    gpus: tuple[int, ...]  # cluster GPU index of global rank r
    gpus_per_node: int = 8

    @property
    def dp_crosses_nodes(self) -> bool:
        """Whether a DP×CP group (stride TP) spans more than one node: its collectives use the network."""
        return self.tp * self.cp * self.dp > self.gpus_per_node

    @property
    def tp_crosses_nodes(self) -> bool:
        return self.tp > self.gpus_per_node

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(tp, cp, dp, pp) coordinates of a global rank (Megatron order tp-cp-dp-pp)."""
        tp = rank % self.tp
        cp = (rank // self.tp) % self.cp
        dp = (rank // (self.tp * self.cp)) % self.dp
        pp = rank // (self.tp * self.cp * self.dp)
        return tp, cp, dp, pp

    def ranks_of_dp(self, dp_rank: int) -> list[int]:
        return [r for r in range(self.world) if self.coords(r)[2] == dp_rank]

    @classmethod
    def from_args(cls, args: Any, num_gpus: int) -> Layout:
        tp = int(args.tensor_model_parallel_size)
        pp = int(getattr(args, "pipeline_model_parallel_size", 1) or 1)
        cp = int(getattr(args, "context_parallel_size", 1) or 1)
        world = int(args.actor_num_nodes) * int(args.actor_num_gpus_per_node)
        if world % (tp * pp * cp):
            raise ConfigError(f"actor GPUs {world} (--actor-num-nodes × --actor-num-gpus-per-node) is not a "
                              f"multiple of TP×PP×CP = {tp}×{pp}×{cp}; change the parallel sizes")
        if world > num_gpus:
            raise ConfigError(f"the trainer needs {world} GPUs but the simulated cluster has {num_gpus}")
        return cls(tp, pp, cp, world // (tp * pp * cp), tuple(range(world)), int(args.actor_num_gpus_per_node))


def _recompute_mode(args: Any) -> Recompute:
    gran = getattr(args, "recompute_granularity", None)
    if gran in (None, "", "none"):
        return "none"
    if gran not in ("selective", "full"):
        raise ConfigError(f"--recompute-granularity {gran!r}: expected full or selective")
    return gran  # type: ignore[no-any-return]


def _pinned_mode(args: Any) -> PinnedMode:
    """--train-offload-backend: vime's CuMem allocator keeps its pinned host buffers (allocated once);
    torch_memory_saver pins host memory anew on every pause (vllm-project/vime #442/#444)."""
    backend = getattr(args, "train_offload_backend", "cumem")
    return "cold" if backend == "torch_memory_saver" else "persistent"


class SimTrainer:
    """The actor group as one object (`vime.protocols.Trainer`), with memory on the cluster's GPUs.

    Construct, then ``await init()`` inside the simulation. ``pinned`` chooses how the offload
    buffers behave ("persistent": allocated once, vime's CuMem; "cold": torch_memory_saver,
    pinned again on every sleep). ``reuse_log_probs`` overrides the seed-step-38 decision
    (None: ask `vime.algo.logprob_reuse`). ``recompute`` overrides
    ``args.recompute_granularity`` (none / selective / full activation recomputation).

    With ``use_kl_loss`` (or a non-zero ``kl_coef``) every train call also computes reference
    log-probs: the reference weights are swapped in from host memory over the params (slime keeps
    them in its CPU weight backup), a forward runs over the batch, and the actor's weights are
    swapped back — no extra device memory, 2 × params / h2d plus one forward of time.
    Not modelled: a critic, MoE, and overlap of DP communication with the backward pass.
    """

    def __init__(self, args: Any, model: ModelSpec, cluster: SimCluster, *, name: str = OWNER,
                 pinned: PinnedMode | None = None, reuse_log_probs: bool | None = None,
                 recompute: Recompute | None = None, seed: int | None = None) -> None:
        self.args = args
        self.model = model
        self.cluster = cluster
        self.hw = cluster.hardware
        self.name = name
        self.layout = Layout.from_args(args, len(cluster.gpus))
        self.gpus = [cluster.gpus[g] for g in self.layout.gpus]
        self.recompute: Recompute = recompute if recompute is not None else _recompute_mode(args)
        if self.recompute not in ("none", "selective", "full"):
            raise ConfigError(f"recompute must be none, selective or full, got {self.recompute!r}")
        self.distributed_optimizer = bool(getattr(args, "use_distributed_optimizer", True))
        self.offload_train = bool(getattr(args, "offload_train", False))
        self.reuse_log_probs = reuse_log_probs
        self.seed = int(seed if seed is not None else getattr(args, "seed", 0))
        self.lifecycle = TrainerLifecycle(name)
        self.allocator = SimAllocator(name, self.gpus, self.hw, host=cluster.host, known_tags=TRAINER_TAGS,
                                      pinned=pinned or _pinned_mode(args), recorder=cluster.recorder, env=cluster.env)
        self.initialized = False
        self.train_calls = 0
        self._checkpoints: dict[str, int] = {}
        self.last_timings: dict[str, float] = {}

    # --- static memory ------------------------------------------------------------------------
    def params_per_gpu(self) -> list[int]:
        """Parameters held by the rank on each actor GPU (its TP shard of its pipeline stage)."""
        lay = self.layout
        return [self.model.params_per_rank(lay.tp, lay.pp, lay.coords(r)[3]) for r in range(lay.world)]

    def state_bytes_per_gpu(self) -> dict[str, list[int]]:
        """Bytes per tag on each actor GPU when awake and idle: params, grads, optimizer."""
        shard = self.layout.dp * self.layout.cp if self.distributed_optimizer else 1
        params = self.params_per_gpu()
        return {
            "params": [p * PARAM_BYTES for p in params],
            "grads": [p * grad_bytes(self.hw) for p in params],
            "optimizer": [math.ceil(p / shard) * OPTIMIZER_BYTES for p in params],
        }

    def memory_plan(self, microbatch_tokens: int, lengths: Sequence[int] | None = None) -> dict[str, int]:
        """Peak bytes per tag on the busiest actor GPU while training a micro-batch of `microbatch_tokens`
        tokens (context, params, grads, optimizer, activations with the in-flight PP micro-batches);
        `lengths` are its sequences (None: one sequence), which matter with unfused attention."""
        state = self.state_bytes_per_gpu()
        plan = {TAG_CONTEXT: self.hw.cuda_context_bytes}
        plan.update({tag: max(sizes) for tag, sizes in state.items()})
        # The optimizer step's temporaries come after the activations are freed: the larger of the two.
        plan["activations"] = max(self.activation_bytes(microbatch_tokens, lengths) * self.layout.pp,  # ≤ PP in flight
                                  max(self.optimizer_transient_per_gpu(), default=0))
        plan["total"] = sum(plan.values())
        return plan

    def optimizer_transient_per_gpu(self) -> list[int]:
        """Bytes the optimizer step allocates on each actor GPU on top of the state (its shard's)."""
        shard = self.layout.dp * self.layout.cp if self.distributed_optimizer else 1
        per = optimizer_transient_bytes(self.hw)
        return [math.ceil(p / shard) * per for p in self.params_per_gpu()]

    def activation_bytes(self, tokens: int, lengths: Sequence[int] | None = None) -> int:
        """Activation bytes one micro-batch of `tokens` tokens keeps on one rank (in-flight micro-batches
        included); with unfused attention also the s² scores of its sequences `lengths` (None: one
        sequence), with unfused elementwise kernels the RoPE tables."""
        lay = self.layout
        per_token = self.model.activation_bytes_per_token(lay.tp, lay.pp, self.recompute,
                                                          sequence_parallel=lay.tp > 1, **software_terms(self.hw))
        seqs = [tokens] if lengths is None else lengths
        extra = (score_bytes(self.model, self.hw, seqs, lay.tp, lay.pp, self.recompute)
                 + rope_bytes(self.model, self.hw, seqs, lay.pp, self.recompute))
        return int((per_token * tokens + extra) / lay.cp)

    # --- time ------------------------------------------------------------------------------------
    def _forward_seconds(self, lengths: Sequence[int]) -> float:
        """Forward of one micro-batch on its model-parallel group (the time of one stage × PP stages)."""
        return self._compute_and_comm(lengths)[0]

    def _compute_and_comm(self, lengths: Sequence[int]) -> tuple[float, float]:
        """(forward, backward) of one micro-batch, each with the forward's TP collectives."""
        lay = self.layout
        fwd, bwd = compute_seconds(self.model, self.hw, lengths, lay.tp * lay.pp * lay.cp)
        tokens = sum(lengths) / lay.cp
        # Sequence parallelism: 2 all-gathers + 2 reduce-scatters of tokens·h per layer forward.
        act = tokens * self.model.hidden_size * self.model.dtype_bytes
        comm = 4 * self.model.layers_per_stage(lay.pp) * lay.pp * self.hw.allgather_seconds(
            act, lay.tp, inter_node=lay.tp_crosses_nodes)
        return fwd + comm, bwd + 2.0 * comm

    def _microbatch_seconds(self, lengths: Sequence[int], *, backward: bool) -> tuple[float, float]:
        fwd, bwd = self._compute_and_comm(lengths)
        if not backward:
            return fwd, 0.0
        if self.recompute == "full":
            bwd += fwd
        return fwd, bwd

    def _optimizer_seconds(self) -> float:
        lay = self.layout
        params = max(self.params_per_gpu())
        shard = lay.dp * lay.cp if self.distributed_optimizer else 1
        grads = params * grad_bytes(self.hw)
        net = lay.dp_crosses_nodes
        # Megatron's DDP reduces the grads in buckets of max(40M, 1M·DP) parameters, one call each.
        buckets = max(1, math.ceil(params / max(40_000_000, 1_000_000 * lay.dp * lay.cp)))
        if self.distributed_optimizer:
            reduce = self.hw.allgather_seconds(grads, lay.dp * lay.cp, inter_node=net, calls=buckets)  # reduce-scatter
            gather = self.hw.allgather_seconds(params * PARAM_BYTES, lay.dp * lay.cp, inter_node=net, calls=buckets)
        else:
            reduce, gather = self.hw.allreduce_seconds(grads, lay.dp * lay.cp, inter_node=net, calls=buckets), 0.0
        step = math.ceil(params / shard) * optimizer_step_bytes(self.hw) / streaming_bytes_per_s(self.hw)
        return reduce + step + gather

    # --- lifecycle --------------------------------------------------------------------------------
    async def init(self) -> None:
        """Seed step 3: build the model and optimizer on the GPUs, back the weights up on the host,
        and go to sleep when ``offload_train`` (the engines wake next, seed steps 4–7)."""
        if self.initialized:
            raise TrainerError(f"{self.name}: init() called twice")
        env = self.cluster.env
        t0 = float(env.now)
        for gpu in self.gpus:
            gpu.alloc(self.name, TAG_CONTEXT, self.hw.cuda_context_bytes)
        for tag, sizes in self.state_bytes_per_gpu().items():
            self.allocator.allocate(tag, sizes)
        self.cluster.host.alloc(self.name, TAG_WEIGHT_BACKUP, sum(self.state_bytes_per_gpu()["params"]))
        await elapse(env, self._backup_seconds())
        self.initialized = True
        self.cluster.recorder.span(self.name, "init", t0, float(env.now))
        if self.offload_train:
            await self.sleep()

    def _backup_seconds(self) -> float:
        return max(self.state_bytes_per_gpu()["params"]) / self.hw.d2h_bytes_per_s

    async def sleep(self) -> None:
        """Seed step 41: params and optimizer state to pinned host memory, grads (and activations) dropped."""
        self._require_init("sleep")
        self.lifecycle.check("sleep")
        t0 = float(self.cluster.env.now)
        await self.allocator.sleep(["params", "optimizer"], ["grads", "activations"])
        self.lifecycle.apply("sleep")
        self.cluster.recorder.span(self.name, "sleep", t0, float(self.cluster.env.now))

    async def wake_up(self) -> None:
        """Seed step 37: remap every tag, copy params and optimizer back."""
        self._require_init("wake_up")
        self.lifecycle.check("wake_up")
        t0 = float(self.cluster.env.now)
        await self.allocator.wake_up(None)
        self.lifecycle.apply("wake_up")
        self.cluster.recorder.span(self.name, "wake_up", t0, float(self.cluster.env.now))

    def _require_init(self, call: str) -> None:
        if not self.initialized:
            raise TrainerError(f"{self.name}: {call}() before init(); await trainer.init() first")

    # --- training -------------------------------------------------------------------------------
    def needs_log_prob_recompute(self, batch: TrainBatch) -> bool:
        """Seed step 38: the separate old-log-prob forward runs unless the loss may reuse the training forward."""
        if self.reuse_log_probs is not None:
            return not self.reuse_log_probs
        from vime.algo.logprob_reuse import needs_log_prob_recompute
        return needs_log_prob_recompute(self.args, batch.num_microbatches)

    async def _run_microbatches(self, batch: TrainBatch, step: int | None, *, backward: bool,
                                label: str) -> None:
        """Every DP rank runs its micro-batches concurrently; returns when the slowest is done."""
        lay = self.layout
        env = self.cluster.env

        async def dp_rank(r: int) -> None:
            rank_batch = batch.for_rank(r)
            positions = lay.ranks_of_dp(r)  # rank r sits on self.gpus[r]
            micro_batches = rank_batch.micro_batches(step)
            inflight = min(lay.pp, max(1, len(micro_batches)))
            busy = 0.0
            for mb in micro_batches:
                lengths = [rank_batch.total_lengths[i] for i in mb]
                tokens = sum(lengths)
                if backward:
                    nbytes = self.activation_bytes(tokens, lengths) * inflight
                else:  # forward only: logits for the log-softmax of this micro-batch
                    nbytes = int(self.model.logits_bytes_per_token(lay.tp) * tokens / lay.cp)
                sizes = dict.fromkeys(positions, nbytes)
                self.allocator.allocate("activations", sizes)
                fwd, bwd = self._microbatch_seconds(lengths, backward=backward)
                await elapse(env, fwd + bwd)
                busy += fwd + bwd
                self.allocator.release("activations", sizes)
            if lay.pp > 1 and micro_batches:
                # 1F1B pipeline: (m + pp − 1) stage slots for m micro-batches; the bubble is pp − 1 of them.
                await elapse(env, (lay.pp - 1) * busy / len(micro_batches))

        t0 = float(env.now)
        tasks = [asyncio.ensure_future(dp_rank(r)) for r in range(lay.dp)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
        self.cluster.recorder.span(self.name, label, t0, float(env.now), step=step)

    def needs_ref_log_probs(self) -> bool:
        """A KL term (loss or reward penalty) needs the reference model's log-probs."""
        return bool(getattr(self.args, "use_kl_loss", False)) or float(getattr(self.args, "kl_coef", 0.0)) != 0.0

    async def _ref_log_probs(self, rollout_id: int, batch: TrainBatch) -> float:
        env = self.cluster.env
        t0 = float(env.now)
        swap = max(self.state_bytes_per_gpu()["params"]) / self.hw.h2d_bytes_per_s
        await elapse(env, swap)  # reference weights in
        await self._run_microbatches(batch, None, backward=False, label="compute_ref_log_prob")
        await elapse(env, swap)  # actor weights back
        self.cluster.recorder.span(self.name, "ref_log_probs", t0, float(env.now), rollout_id=rollout_id)
        return float(env.now) - t0

    async def compute_log_prob(self, rollout_id: int, batch: TrainBatch) -> float:
        """The old-log-prob forward over the whole batch (seed step 38); returns its virtual seconds."""
        self._require_init("compute_log_prob")
        self.lifecycle.check("compute_log_prob")
        t0 = float(self.cluster.env.now)
        await self._run_microbatches(batch, None, backward=False, label="compute_log_prob")
        return float(self.cluster.env.now) - t0

    async def train(self, rollout_id: int, batch: TrainBatch) -> TrainMetrics:
        """Seed steps 37–41 for one rollout; requires awake (the orchestrator wakes the trainer first)."""
        self._require_init("train")
        self.lifecycle.check("train")
        env = self.cluster.env
        if batch.dp_size != self.layout.dp:
            raise TrainerError(f"{self.name}: the batch is scheduled for DP={batch.dp_size} but the trainer "
                               f"has DP={self.layout.dp}")
        t_start = float(env.now)
        timings: dict[str, float] = {}
        recompute = self.needs_log_prob_recompute(batch)
        if recompute:
            timings["log_probs_time"] = await self.compute_log_prob(rollout_id, batch)
        if self.needs_ref_log_probs():
            timings["ref_log_probs_time"] = await self._ref_log_probs(rollout_id, batch)
        t_train = float(env.now)
        for step in range(batch.schedule.num_steps):
            await self._run_microbatches(batch, step, backward=True, label=f"train_step{step}")
            t_opt = float(env.now)
            transient = dict(enumerate(self.optimizer_transient_per_gpu()))
            if any(transient.values()):
                self.allocator.allocate("activations", transient)
            await elapse(env, self._optimizer_seconds())
            if any(transient.values()):
                self.allocator.release("activations", transient)
            self.cluster.recorder.span(self.name, "optimizer_step", t_opt, float(env.now), step=step)
        timings["actor_train_time"] = float(env.now) - t_train
        t_backup = float(env.now)
        await elapse(env, self._backup_seconds())  # seed step 41: weights_backuper.backup("actor")
        timings["weight_backup_time"] = float(env.now) - t_backup
        timings["train_time"] = float(env.now) - t_start
        self.train_calls += 1
        self.last_timings = timings
        self.cluster.recorder.span(self.name, "train", t_start, float(env.now), rollout_id=rollout_id,
                                   recompute_log_probs=recompute)
        return self._metrics(rollout_id, batch, recompute, timings)

    def _metrics(self, rollout_id: int, batch: TrainBatch, recomputed: bool,
                 timings: dict[str, float]) -> TrainMetrics:
        """Deterministic, plausible figures. The loss is exact for the first step (ratio 1, seed step 40):
        the per-token mean of −advantage over loss-masked tokens; the rest is seeded noise."""
        num = 0.0
        tokens = 0
        for adv, mask in zip(batch.rewards, batch.loss_masks, strict=True):
            n = len(mask) - mask.count(0)  # C-speed count; masks hold 0/1
            num += -adv * n
            tokens += n
        loss = num / tokens if tokens else 0.0
        rng = random.Random(self.seed * 1_000_003 + rollout_id)
        steps = batch.schedule.num_steps
        clipfrac = 0.0 if steps == 1 else rng.uniform(0.0, 0.02) * (steps - 1) / steps
        grad_norm = 0.5 * math.exp(rng.gauss(0.0, 0.25))
        entropy = max(0.05, 0.6 * math.exp(-0.002 * rollout_id) + rng.gauss(0.0, 0.01))
        flops = 3.0 * sum(self.model.sequence_flops(n) for n in batch.total_lengths)
        if recomputed:
            flops += flops / 3.0
        extra = {f"perf/{k}": v for k, v in timings.items()}
        train_time = timings.get("actor_train_time", 0.0) + timings.get("log_probs_time", 0.0)
        if train_time > 0:
            extra["perf/actor_train_tflops"] = flops / train_time / self.layout.world / 1e12
        return TrainMetrics(rollout_id=rollout_id, loss=loss, pg_clipfrac=clipfrac, grad_norm=grad_norm,
                            entropy=entropy, tokens=tokens, num_steps=steps, recomputed_log_probs=recomputed,
                            extra=extra)

    # --- weights ----------------------------------------------------------------------------------
    async def export_weights(self, bucket_bytes: int) -> AsyncIterator[WeightBucket]:
        """Seed step 48: HF-named full tensors in buckets of at most `bucket_bytes` (a larger tensor
        gets a bucket of its own). Each bucket is staged on every actor GPU while the consumer uses it."""
        self._require_init("export_weights")
        self.lifecycle.check("export_weights")
        if bucket_bytes <= 0:
            raise ConfigError(f"--update-weight-buffer-size must be > 0, got {bucket_bytes}")
        env = self.cluster.env
        lay = self.layout
        index = 0
        for names, shapes, nbytes in self._buckets(bucket_bytes):
            t0 = float(env.now)
            for gpu in self.gpus:
                gpu.alloc(self.name, TAG_WEIGHT_BUFFER, nbytes)
            try:
                # Each rank stages its shard from the CPU backup, then TP ranks gather full tensors.
                await elapse(env, nbytes / (lay.tp * lay.pp) / self.hw.h2d_bytes_per_s
                             + self.hw.allgather_seconds(nbytes / lay.pp, lay.tp))
                self.cluster.recorder.span(self.name, "export_bucket", t0, float(env.now), index=index,
                                           nbytes=nbytes)
                yield WeightBucket(names=names, dtype_names=["bfloat16"] * len(names),
                                   shapes=[list(s) for s in shapes], nbytes=nbytes, index=index)
            finally:
                for gpu in self.gpus:
                    gpu.free(self.name, TAG_WEIGHT_BUFFER, nbytes)
            index += 1

    def _buckets(self, bucket_bytes: int) -> list[tuple[list[str], list[tuple[int, ...]], int]]:
        out: list[tuple[list[str], list[tuple[int, ...]], int]] = []
        names: list[str] = []
        shapes: list[tuple[int, ...]] = []
        size = 0
        for name, shape in self.model.hf_weight_shapes():
            n = math.prod(shape) * self.model.dtype_bytes
            if names and size + n > bucket_bytes:
                out.append((names, shapes, size))
                names, shapes, size = [], [], 0
            names.append(name)
            shapes.append(shape)
            size += n
        if names:
            out.append((names, shapes, size))
        return out

    def export_bytes(self) -> int:
        """Total bytes `export_weights` yields (the bf16 model)."""
        return self.model.num_params() * self.model.dtype_bytes

    # --- checkpoints --------------------------------------------------------------------------
    async def save_checkpoint(self, rollout_id: int, path: str) -> None:
        """Costs the write of params + optimizer at CHECKPOINT_BYTES_PER_S per node; remembers `rollout_id`."""
        self._require_init("save_checkpoint")
        self.lifecycle.check("save_checkpoint")
        t0 = float(self.cluster.env.now)
        await elapse(self.cluster.env, self._checkpoint_seconds())
        self._checkpoints[path] = rollout_id
        self.cluster.recorder.span(self.name, "save_checkpoint", t0, float(self.cluster.env.now),
                                   rollout_id=rollout_id, gib=self.checkpoint_bytes() / GiB)

    def checkpoint_bytes(self) -> int:
        """Bytes of one checkpoint: the bf16 model once plus the Adam state once (not per replica)."""
        lay = self.layout
        state = self.state_bytes_per_gpu()
        replicas = lay.dp * lay.cp
        opt_copies = 1 if self.distributed_optimizer else replicas
        return sum(state["params"]) // replicas + sum(state["optimizer"]) // opt_copies

    def _checkpoint_seconds(self) -> float:
        nodes = max(1, int(getattr(self.args, "actor_num_nodes", 1)))
        return self.checkpoint_bytes() / (CHECKPOINT_BYTES_PER_S * nodes)

    async def load_checkpoint(self, path: str) -> int:
        """Costs the read of a checkpoint; returns the rollout id to resume from: one after the one
        this trainer saved at `path`, else ``args.start_rollout_id`` (a checkpoint made outside the simulation)."""
        t0 = float(self.cluster.env.now)
        await elapse(self.cluster.env, self._checkpoint_seconds())
        self.cluster.recorder.span(self.name, "load_checkpoint", t0, float(self.cluster.env.now))
        if path in self._checkpoints:
            return self._checkpoints[path] + 1
        return int(getattr(self.args, "start_rollout_id", 0) or 0)
