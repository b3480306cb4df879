"""The trainer's time model: fwd/bwd seconds of a micro-batch from FLOPs and bytes, and the optimizer's HBM traffic.

Each constant counts HBM bytes kernel by kernel (r = read, w = write, bytes per element or
parameter); the measurements that set or checked them are in bench/data/h200_megatron_*.json and
the hardware profiles' `sources`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vime.sim.trainer.footprint import GRAD_BYTES

if TYPE_CHECKING:
    from vime.sim.hardware import HardwareSpec
    from vime.sim.models import ModelSpec

#: HBM bytes an Adam step moves per parameter of its shard: read grad, master, m, v (16), write
#: master, m, v (12), write the bf16 param (2).
ADAM_STEP_BYTES = 30
#: HBM bytes per parameter of a plain torch.optim.AdamW step (foreach, fp32 state) inside Megatron's
#: mixed-precision optimizer, counted kernel by kernel:
#: param.mul_(1 − lr·wd) r4 w4; exp_avg.lerp_(grad) r8 w4; exp_avg_sq.mul_ r4 w4;
#: exp_avg_sq.addcmul_(grad, grad) r8 w4 (grad passed twice, read once); sqrt r4 w4; div_ by the
#: bias correction r4 w4; add_(eps) r4 w4; param.addcdiv_(exp_avg, denom) r12 w4 → 84; plus
#: Megatron: grad-norm r4, clip (grads × coef) r4 w4, fp32 main params → bf16 model params r4 w2
#: → 98; with 2-byte grads also the copy of the model grads into fp32 main grads (r2 w4) → 104.
#: A fused Adam does it all in one pass (checked on the H200, issue 12).
TORCH_ADAMW_STEP_BYTES = 98
#: Unfused core attention (Megatron's local DotProductAttention without TransformerEngine,
#: masked_softmax_fusion off, softmax in fp32), HBM bytes per attention-score element:
#: forward: baddbmm writes bf16 scores (w2), .float() (r2 w4), masked_fill_ (r4 w4 + the bool
#: mask r1), softmax (r4 w4), back to bf16 (r4 w2), the probs·V bmm reads them (r2) → 33;
#: backward: the grad of the probs (w2), grad V reads the probs (r2), bf16 → fp32 (r2 w4),
#: softmax backward (r8 w4), masked_fill backward (r5 w4), fp32 → bf16 (r4 w2), the two
#: matmuls of the baddbmm backward read the score grad (r4) → 41.
UNFUSED_SCORE_FWD_BYTES = 33
UNFUSED_SCORE_BWD_BYTES = 41
#: Extra HBM bytes per element of torch's composite RMSNorm over a fused one (the local spec's
#: norms with fp32 weights, and its key norm always; `Software.train_norm`). Counting kernels:
#: forward .float() r2 w4, pow r4 w4, mean r4, × rstd r4 w4, × weight r4 w4, back to bf16 r4 w2
#: → 40 against a fused kernel's r2 w2 (+36); backward ~88 against ~8 (+80). The constants take
#: the H200 measurement (bench/data/h200_megatron_1.7b_accounting*.json).
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
#: vime's policy loss over the vocabulary beyond Megatron's own cross-entropy (`Software.train_loss` "megatron"),
#: HBM bytes per logit element (vime/real/megatron/loss.py on Megatron's logits): forward: Megatron hands back
#: [b, s, v] logits as a contiguous transpose (r2 w2) → 4 in every pass; a training pass also takes the entropy
#: (max r4, shift r4 w4, exp r4 w4, sum r4, e·shift r8 w4, sum r4) → +40; backward: the next-token slice's grad
#: (zeros w2, copy r2 w2) and the transpose's (r2 w2) → 10. The cast to fp32 and the cross-entropy itself are
#: in both losses, so in the measured rates.
VIME_LOSS_EXTRA_FWD_BYTES = 4
VIME_ENTROPY_BYTES = 40
VIME_LOSS_EXTRA_BWD_BYTES = 10
#: Checkpoint write/read rate per node (simulated filesystem), bytes/s.
CHECKPOINT_BYTES_PER_S = 2e9


def optimizer_step_bytes(hw: HardwareSpec, grads: int = GRAD_BYTES) -> int:
    """HBM bytes per parameter of one optimizer step: fused Adam, or torch AdamW kernel by kernel (`grads`
    bytes per main grad)."""
    if hw.software.train_optimizer == "torch":
        return TORCH_ADAMW_STEP_BYTES + (6 if grads == 2 else 0)
    return ADAM_STEP_BYTES


def streaming_bytes_per_s(hw: HardwareSpec) -> float:
    """Rate of memory-bound elementwise kernels (optimizer, unfused softmax): HBM × decode_bw_util."""
    return hw.hbm_bytes_per_s * hw.efficiency.decode_bw_util


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


def loss_stream_bytes_per_token(model: ModelSpec, hw: HardwareSpec, tp: int = 1, *,
                                training: bool) -> tuple[float, float]:
    """(forward, backward) HBM bytes per token on each TP rank of the last stage that vime's policy loss moves over
    its vocabulary slice beyond what the profile's train rates include (0 when they were fitted on vime's actor);
    `training`: a training pass (entropy, backward), else a log-prob forward."""
    if hw.software.train_loss == "vime":
        return 0.0, 0.0
    vocab = model.vocab_size / tp
    if not training:
        return vocab * VIME_LOSS_EXTRA_FWD_BYTES, 0.0
    return vocab * (VIME_LOSS_EXTRA_FWD_BYTES + VIME_ENTROPY_BYTES), vocab * VIME_LOSS_EXTRA_BWD_BYTES


def gemm_calls(model: ModelSpec, unfused_attention: bool) -> int:
    """Matmul kernels of one forward through the whole model: a dense layer's QKV, output, MLP up and down projections,
    a MoE layer's two attention ones (its experts' are the MoE terms'), the output head, and the unfused attention's
    two batched products per layer. A backward runs two of each (input and weight gradients)."""
    moe = len(model.moe_layers)
    return 4 * (model.num_layers - moe) + 2 * moe + 1 + (2 * model.num_layers if unfused_attention else 0)


def layer_width(model: ModelSpec) -> int:
    """Elements per token per layer of the attention's q, k, v and the residual stream (Efficiency.train_width_bytes_*)."""
    return (model.num_attention_heads + 2 * model.num_kv_heads) * model.head_dim + model.hidden_size


def compute_seconds(model: ModelSpec, hw: HardwareSpec, lengths: Sequence[int], ranks: int = 1,
                    local_experts: int = 0, gpu_extra: tuple[float, float] = (0.0, 0.0), *,
                    pp: int = 1) -> tuple[float, float]:
    """(forward, backward) of one micro-batch of sequences `lengths` over `ranks` = TP·PP·CP GPUs, compute only: one
    pipeline slot of `pp` stages, so the fixed costs per layer (kernel calls, the CPU floor) are the busiest stage's.

    Flash attention (the default): FLOPs of `ModelSpec.sequence_flops` (causal) at train MFU,
    backward = `train_backward_factor` (2) × forward. Unfused attention (`software.train_attention = "unfused"`): the
    score and value matmuls run over the full s × s matrix at `train_attention_mfu`, and every score element costs
    UNFUSED_SCORE_FWD/BWD_BYTES of memory traffic at the streaming rate; the matmuls' backward
    is 2 × their forward (fitted on the H200: bench/data/h200_megatron_1.7b_accounting.json).
    Unfused norms and elementwise kernels add their traffic (`software_stream_bytes_per_token`), each matmul kernel
    its fixed time (`train_gemm_call_s`, `gemm_calls`) and the eager stack's small kernels theirs per token
    (`train_width_bytes_*` per element of `layer_width`),
    and neither direction runs faster than the CPU launches it (`train_host_*_s_per_layer`, plus
    `train_host_s_per_expert` for each of a MoE layer's `local_experts` where the stack runs them one by one); the
    GPU time counted elsewhere (`gpu_extra`, forward and backward: the experts' beyond the dense rate, the loss's
    traffic) runs under the same floor; on a CPU
    device (`HardwareSpec.host_overlaps_compute` false) that CPU work adds to the kernels' instead.
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
    # each matmul kernel's fixed time (the busiest stage's share of the model's) and the small kernels' traffic per token
    stage_layers = math.ceil(model.num_layers / pp)
    stage_moe = model.moe_layers_per_stage(pp)
    calls = (gemm_calls(model, hw.software.train_attention == "unfused") * eff.train_gemm_call_s
             * stage_layers / model.num_layers)
    # (an eager stack's: a fused one's kernels do these copies and adds inside others)
    eager = hw.software.train_elementwise == "unfused"
    width = tokens * layer_width(model) * model.num_layers / ranks / stream if eager else 0.0
    fwd += calls + width * eff.train_width_bytes_fwd
    bwd += eff.train_backward_factor * calls + width * eff.train_width_bytes_bwd
    fwd, bwd = fwd + gpu_extra[0], bwd + gpu_extra[1]
    experts = eff.train_host_s_per_expert * local_experts * stage_moe
    host_fwd = eff.train_host_fwd_s_per_layer * stage_layers + experts
    host_bwd = eff.train_host_bwd_s_per_layer * stage_layers + experts
    if not hw.host_overlaps_compute:  # a CPU: the Python and the kernels it launches share the cores
        return fwd + host_fwd, bwd + host_bwd
    return max(fwd, host_fwd), max(bwd, host_bwd)
