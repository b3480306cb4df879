"""The trainer's bytes model: state bytes per parameter and what unfused attention and RoPE keep for the backward.

The measurements that set or checked these are in bench/data/h200_megatron_*.json.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vime.sim.hardware import HardwareSpec
    from vime.sim.models import ModelSpec, Recompute

#: GPU tags the trainer holds outside its allocator (never released).
TAG_CONTEXT = "context"
TAG_WEIGHT_BUFFER = "weight_buffer"
#: What the first train step leaves mapped in the trainer process outside its offload pools (kept across sleeps).
TAG_STEP_RESIDUE = "step_residue"
#: Host tag of the CPU weight backup (seed step 41).
TAG_WEIGHT_BACKUP = "weight_backup"
#: Host tag of a KL reference kept in pinned host memory (--ref-placement host).
TAG_REFERENCE = "reference"
#: Bytes per parameter of the state that lives on each rank.
PARAM_BYTES = 2  # bf16 model weights
GRAD_BYTES = 4  # fp32 main grads (Megatron accumulates bf16 runs in fp32)
OPTIMIZER_BYTES = 12  # fp32 master weights + Adam m + Adam v
#: Bytes per parameter (of the optimizer's shard) alive during a torch AdamW step under Megatron's
#: mixed-precision optimizer: one fp32 foreach temporary, and with 2-byte model grads the fp32 copies
#: of the grads it steps on (8.00–8.01 measured with 2-byte grads on the H200, issue 12; with fp32
#: main grads `.float()` is the grad itself). A fused Adam steps in place: 0.
TORCH_ADAMW_TRANSIENT_BYTES = 4
TORCH_ADAMW_BF16_GRAD_COPY_BYTES = 4
#: Unfused core attention keeps for the backward, per score element, the fp32 softmax output (4)
#: and the bf16 probs the bmm saves (2).
UNFUSED_SCORE_KEPT_BYTES = 6
#: vime's policy loss (vime/real/megatron/loss.py) takes the entropy of the fp32 logits before its cross-entropy:
#: the shifted logits, their exp and the product of the two, three fp32 tensors the size of the logits alive on
#: top of everything the forward kept (bytes per logit element; the sixth H200 lease's 0.6B ran out of memory
#: allocating the product at 8448 tokens a micro-batch, bench/data/h200_notes.md).
ENTROPY_TRANSIENT_BYTES = 3 * 4
#: The first train step's residue (TAG_STEP_RESIDUE) beyond the profile's base, fitted on nothing: two fp32
#: tensors of the (tied) embedding's size (bytes per embedding element) and one fp32 block of the largest
#: micro-batch's attention scores (bytes per score element of one layer). Read from the trainer's
#: torch_cache after each sleep in 35 H200 runs of the 0.6B, 1.7B and 4B (bench/data/h200_notes.md, 27th session).
RESIDUE_EMBEDDING_BYTES = 2 * 4
RESIDUE_SCORE_BYTES = 4


def trainer_context_bytes(hw: HardwareSpec) -> int:
    """What a trainer process holds outside its allocator on each GPU: the CUDA context and the stack's libraries."""
    return int(hw.cuda_context_bytes) + int(hw.software.trainer_process_bytes)


def optimizer_transient_bytes(hw: HardwareSpec, grads: int = GRAD_BYTES) -> int:
    """Bytes per parameter the optimizer step allocates on top of the state (the profile's optimizer, `grads`
    bytes per main grad)."""
    if hw.software.train_optimizer != "torch":
        return 0
    return TORCH_ADAMW_TRANSIENT_BYTES + (TORCH_ADAMW_BF16_GRAD_COPY_BYTES if grads == 2 else 0)


def grad_bytes(bf16_grads: bool = False) -> int:
    """Main-grad bytes per parameter: fp32, as Megatron accumulates and reduces a bf16 run's grads, or bf16
    with --grad-reduce-in-bf16 (the run's choice, not the profile's)."""
    return 2 if bf16_grads else GRAD_BYTES


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


def step_residue_bytes(model: ModelSpec, hw: HardwareSpec, micro_batches: Sequence[Sequence[int]],
                       tp: int = 1) -> int:
    """What the first train step leaves mapped on a rank outside the offload pools (sleep's empty_cache
    cannot return it): the profile's base, plus RESIDUE_EMBEDDING_BYTES per element of this rank's embedding
    slice and, with unfused attention, one layer's fp32 scores of the micro-batch with the most of them
    (b · heads/TP · s_max²). 0 where the profile measured none (its stack's residue is unknown)."""
    base = hw.software.train_step_residue_bytes
    if base == 0:
        return 0
    embedding = RESIDUE_EMBEDDING_BYTES * model.vocab_size // tp * model.hidden_size
    scores = 0
    if hw.software.train_attention == "unfused":
        heads = model.num_attention_heads // tp
        scores = max((RESIDUE_SCORE_BYTES * len(mb) * heads * max(mb) ** 2 for mb in micro_batches if mb), default=0)
    return base + embedding + scores


def loss_transient_bytes(model: ModelSpec, tokens: int, tp: int = 1, cp: int = 1) -> float:
    """What the training loss allocates for a moment on the last stage beyond what the forward keeps (the
    logits and their fp32 copy, `ModelSpec.logits_bytes_per_token`): the entropy's temporaries over this
    rank's vocabulary slice for the micro-batch's `tokens` (split over CP). A log-prob forward takes no entropy."""
    return ENTROPY_TRANSIENT_BYTES * model.vocab_size / tp * tokens / cp


def rope_bytes(model: ModelSpec, hw: HardwareSpec, lengths: Sequence[int], pp: int = 1,
               recompute: Recompute = "none") -> float:
    """Unfused RoPE's tables on one rank (0 when fused): every layer keeps cos and sin for q and for
    k, four bf16 [s, head_dim] tensors over the micro-batch's longest sequence, shared by its
    sequences."""
    if hw.software.train_elementwise != "unfused":
        return 0.0
    per_layer = 4.0 * model.dtype_bytes * model.head_dim * max(lengths, default=0)
    return per_layer if recompute == "full" else per_layer * model.layers_per_stage(pp)
