"""Build a tiny Qwen3-MoE Hugging Face model directory locally (issue 21): the tiny Qwen3's tokenizer, MoE layers, no downloads.

The directory is `vime.testing.tiny_model.build_tiny_qwen3`'s (tokenizer, generation config) with
`config.json` and `model.safetensors` replaced by a `Qwen3MoeForCausalLM` of the same shape whose
MLPs are `num_experts` routed experts of `moe_intermediate_size`, top-`top_k`. transformers saves the
experts one tensor per projection (``mlp.experts.{j}.gate_proj.weight``), the layout of the Hub
checkpoints, which is what vLLM and `vime.real.megatron.moe_mapping` read.
"""

from __future__ import annotations

from pathlib import Path

from vime.testing.tiny_model import TinyModelSpec, build_tiny_qwen3


def build_tiny_qwen3_moe(path: str | Path, spec: TinyModelSpec | None = None, *, num_experts: int = 4,
                         top_k: int = 2, moe_intermediate_size: int = 64) -> Path:
    """Write a loadable tiny Qwen3-MoE to `path` and return it (same spec and seed: same files)."""
    import torch
    from transformers import Qwen3Config, Qwen3MoeConfig, Qwen3MoeForCausalLM

    spec = spec or TinyModelSpec()
    out = build_tiny_qwen3(path, spec)
    dense = Qwen3Config.from_pretrained(out)
    keep = {k: getattr(dense, k) for k in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                                           "num_attention_heads", "num_key_value_heads", "head_dim",
                                           "max_position_embeddings", "tie_word_embeddings", "bos_token_id",
                                           "eos_token_id", "pad_token_id")}
    config = Qwen3MoeConfig(**keep, num_experts=num_experts, num_experts_per_tok=top_k,
                            moe_intermediate_size=moe_intermediate_size, norm_topk_prob=True,
                            decoder_sparse_step=1, mlp_only_layers=[])
    config.architectures = ["Qwen3MoeForCausalLM"]
    for f in out.glob("*.safetensors"):
        f.unlink()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3MoeForCausalLM(config).to(getattr(torch, spec.dtype))
    model.eval()
    model.save_pretrained(out, safe_serialization=True)
    return out
