"""How a model's weights lie in memory and on the wire: vLLM's allocations per rank and the Hugging Face tensors the trainer exports."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from vime.sim import moe as _moe

if TYPE_CHECKING:
    from vime.sim.models import ModelSpec


class WeightLayout:
    """The weight-export side of `vime.sim.models.ModelSpec` (a mixin, no fields)."""

    dtype_bytes: int
    hidden_size: int
    head_dim: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    vocab_size: int
    num_layers: int
    tie_embeddings: bool
    qk_norm: bool
    qkv_bias: bool
    gated_mlp: bool
    moe_layers: tuple[int, ...]

    if TYPE_CHECKING:
        def kv_heads_per_rank(self, tp: int = 1) -> int: ...

    def vllm_weight_allocations(self, tp: int = 1) -> list[int]:
        """Bytes of each weight tensor one vLLM TP rank allocates, in vLLM's fused layout (QKV and
        gate/up as one parameter each, vocabulary split over TP): one CuMem allocation each, which is
        what its sleep backs up tensor by tensor."""
        b, h, hd, f = self.dtype_bytes, self.hidden_size, self.head_dim, self.ffn_hidden_size // tp
        q, kv = self.num_attention_heads // tp * hd, self.kv_heads_per_rank(tp) * hd
        vocab = -(-self.vocab_size // tp)
        attn = [b * h, b * (q + 2 * kv) * h, b * h * q, b * h]
        if self.qkv_bias:
            attn.append(b * (q + 2 * kv))
        if self.qk_norm:
            attn += [b * hd, b * hd]
        dense = [(2 if self.gated_mlp else 1) * b * f * h, b * h * f]
        moe = _moe.vllm_moe_allocations(cast("ModelSpec", self), tp) if self.moe_layers else []
        out = [b * vocab * h]
        for i in range(self.num_layers):
            out += attn + (moe if i in self.moe_layers else dense)
        out.append(b * h)
        if not self.tie_embeddings:
            out.append(b * vocab * h)
        return out

    def vllm_pinned_scale(self, tp: int = 1) -> float:
        """Pinned host bytes per weight byte of vLLM's sleep backup: each backup is a
        `torch.empty(pin_memory=True)` from PyTorch's caching host allocator, which rounds every
        block up to a power of two (Qwen3-4B: 1.34; the H200's first level-1 sleep pinned at
        0.56-0.89 s per GiB of weights against 0.34-0.72 s/GiB for exact-size pinning)."""
        sizes = self.vllm_weight_allocations(tp)
        return sum(1 << max(0, (n - 1).bit_length()) for n in sizes) / sum(sizes)

    def hf_weight_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """Full (TP-gathered) tensors under their Hugging Face names, in checkpoint order.

        Their element counts sum to `num_params()`; this is what the trainer exports to the
        engines bucket by bucket (seed step 48).
        """
        h, hd, f = self.hidden_size, self.head_dim, self.ffn_hidden_size
        q, kv = self.num_attention_heads * hd, self.num_kv_heads * hd
        out: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (self.vocab_size, h))]
        for i in range(self.num_layers):
            p = f"model.layers.{i}."
            out.append((p + "input_layernorm.weight", (h,)))
            out += [(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                    (p + "self_attn.v_proj.weight", (kv, h))]
            if self.qkv_bias:
                out += [(p + "self_attn.q_proj.bias", (q,)), (p + "self_attn.k_proj.bias", (kv,)),
                        (p + "self_attn.v_proj.bias", (kv,))]
            if self.qk_norm:
                out += [(p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,))]
            out.append((p + "self_attn.o_proj.weight", (h, q)))
            out.append((p + "post_attention_layernorm.weight", (h,)))
            if i in self.moe_layers:
                out += _moe.hf_moe_shapes(cast("ModelSpec", self), p + "mlp.")
                continue
            if self.gated_mlp:
                out.append((p + "mlp.gate_proj.weight", (f, h)))
            out += [(p + "mlp.up_proj.weight", (f, h)), (p + "mlp.down_proj.weight", (h, f))]
        out.append(("model.norm.weight", (h,)))
        if not self.tie_embeddings:
            out.append(("lm_head.weight", (self.vocab_size, h)))
        return out
