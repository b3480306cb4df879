"""Transformer model specs (dense and MoE) for the simulator: parameter counts, FLOPs, KV-cache and activation bytes.

A `ModelSpec` is read from a Hugging Face ``config.json`` (any path) or from a preset of the same
form in ``vime/sim/data/models/`` (Qwen3 0.6B…32B, Qwen2.5-7B, Llama-3.1 8B/70B). Only the
architecture matters: a decoder of ``num_layers`` blocks, each RMSNorm → attention (GQA, optional
q/k RMSNorm as in Qwen3, optional q/k/v bias as in Qwen2) → RMSNorm → SwiGLU MLP, a vocabulary
embedding and an output head (tied or not).

Sharding follows Megatron / vLLM tensor parallelism: linear layers and the vocabulary are split
over TP; norms are replicated; when ``num_kv_heads < TP`` each rank keeps one whole KV head
(replication, as vLLM does), so KV bytes stop shrinking once TP passes the KV head count.
Mixture-of-experts layers (``num_experts > 0``: Qwen3-30B-A3B, Qwen3-235B-A22B, Mixtral, GLM-4-MoE)
take their expert counts and sharding from `vime.sim.moe`: FLOPs from the active parameters,
bytes from all of them, routed experts split over EP × ETP.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from vime.errors import ConfigError
from vime.hf_config import HFModelConfig, load_hf_config, parse_hf_config
from vime.inputs import read_json
from vime.sim import moe as _moe
from vime.sim.moe import MoELayers
from vime.sim.weight_layout import WeightLayout

_MODELS_DIR = Path(__file__).parent / "data" / "models"

#: The preset the simulator uses when none is named (the seed's scenario).
DEFAULT_MODEL = "Qwen3-4B"

Recompute = Literal["none", "selective", "full"]


@dataclass(frozen=True)
class ModelSpec(MoELayers, WeightLayout):
    """The architecture numbers of one decoder-only model, dense or MoE (HF config names in comments)."""

    name: str
    num_layers: int  # num_hidden_layers
    hidden_size: int  # hidden_size
    ffn_hidden_size: int  # intermediate_size
    num_attention_heads: int  # num_attention_heads
    num_kv_heads: int  # num_key_value_heads (= heads without GQA)
    head_dim: int  # head_dim (default hidden_size / heads)
    vocab_size: int  # vocab_size
    tie_embeddings: bool = False  # tie_word_embeddings
    qk_norm: bool = False  # Qwen3: RMSNorm over each q and k head
    qkv_bias: bool = False  # Qwen2: bias on the q, k, v projections
    gated_mlp: bool = True  # SwiGLU: gate, up and down projections
    max_position_embeddings: int = 0
    dtype_bytes: int = 2  # bf16 weights, activations and KV cache
    source: str = ""
    num_experts: int = 0  # num_experts / num_local_experts / n_routed_experts (0: dense)
    moe_top_k: int = 0  # num_experts_per_tok
    moe_ffn_hidden_size: int = 0  # moe_intermediate_size (Mixtral: intermediate_size)
    shared_expert_ffn_size: int = 0  # shared experts' width, summed
    moe_layers: tuple[int, ...] = ()  # indices of the MoE layers

    def __post_init__(self) -> None:
        for key in ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_kv_heads",
                    "head_dim", "vocab_size", "dtype_bytes"):
            value = getattr(self, key)
            if not isinstance(value, int) or value <= 0:
                raise ConfigError(f"model {self.name}: {key} must be a positive integer, got {value!r}")
        self._check_moe()
        if self.num_attention_heads % self.num_kv_heads:
            raise ConfigError(f"model {self.name}: num_attention_heads {self.num_attention_heads} is not a "
                              f"multiple of num_key_value_heads {self.num_kv_heads}")

    # --- sharding helpers -----------------------------------------------------------------------
    def kv_heads_per_rank(self, tp: int = 1) -> int:
        """KV heads each TP rank holds: kv_heads / TP, or 1 (replicated) when TP > kv_heads."""
        _check_parallel(tp, 1)
        if self.num_kv_heads >= tp:
            if self.num_kv_heads % tp:
                raise ConfigError(f"model {self.name}: {self.num_kv_heads} KV heads cannot be split over "
                                  f"TP={tp}; use a TP that divides or is a multiple of the KV heads")
            return self.num_kv_heads // tp
        if tp % self.num_kv_heads:
            raise ConfigError(f"model {self.name}: TP={tp} is not a multiple of its {self.num_kv_heads} KV heads")
        return 1

    def layers_per_stage(self, pp: int = 1) -> int:
        """Layers on the busiest pipeline stage (ceil when PP does not divide the layer count)."""
        _check_parallel(1, pp)
        return math.ceil(self.num_layers / pp)

    def _dense_mlp_params(self, tp: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * self.ffn_hidden_size // tp

    def _attn_params(self, tp: int) -> int:
        h, hd = self.hidden_size, self.head_dim
        q_out = self.num_attention_heads * hd // tp
        kv_out = self.kv_heads_per_rank(tp) * hd
        attn = h * q_out + 2 * h * kv_out + q_out * h
        if self.qkv_bias:
            attn += q_out + 2 * kv_out
        if self.qk_norm:
            attn += 2 * hd  # replicated
        return attn + 2 * h  # two RMSNorms, replicated

    def _layers_params(self, layers: range, tp: int, ep: int, etp: int) -> int:
        """Parameters of `layers` on one rank: attention everywhere, the dense MLP or the MoE MLP."""
        n_moe = self._moe_count(layers)
        moe = n_moe * _moe.moe_mlp_params(self, tp, ep, etp) if n_moe else 0
        return len(layers) * self._attn_params(tp) + (len(layers) - n_moe) * self._dense_mlp_params(tp) + moe

    def params_per_rank(self, tp: int = 1, pp: int = 1, stage: int | None = None, *, ep: int = 1,
                        etp: int | None = None) -> int:
        """Parameters on one rank of pipeline `stage` in a TP×PP layout (None: the busiest stage).

        Layers are spread as evenly as possible (the first stages get the remainder); the first
        stage holds the embedding, the last the final norm and the output head. The vocabulary
        is split over TP without Megatron's padding (a < 0.2 % difference). With PP > 1 a tied
        output head is a second copy on the last stage, as in Megatron. Routed experts are split over
        `ep` × `etp` (ETP default: TP, Megatron's).
        """
        _check_parallel(tp, pp)
        etp = tp if etp is None else etp
        if stage is None:
            return max(self.params_per_rank(tp, pp, s, ep=ep, etp=etp) for s in range(pp))
        if not 0 <= stage < pp:
            raise ConfigError(f"pipeline stage {stage} out of range for PP={pp}")
        layers = self._layers_params(self._stage_layers(pp, stage), tp, ep, etp)
        embed = self.vocab_size * self.hidden_size // tp
        total = layers
        if stage == 0:
            total += embed
        if stage == pp - 1:
            total += self.hidden_size + (0 if (self.tie_embeddings and pp == 1) else embed)
        return total

    def num_params(self) -> int:
        """Total parameters (tied embeddings counted once; every expert)."""
        return self.params_per_rank(1, 1)

    def num_non_embedding_params(self) -> int:
        return self._layers_params(range(self.num_layers), 1, 1, 1) + self.hidden_size

    def weight_bytes(self, tp: int = 1, pp: int = 1, stage: int | None = None) -> int:
        """Weight bytes on one GPU at `dtype_bytes` per parameter (seed step 36: ~4 GB for Qwen3-4B, TP=2);
        a MoE engine holds 1/TP of every expert (TP-split or, with expert parallelism, whole experts)."""
        return self.params_per_rank(tp, pp, stage, ep=1, etp=tp) * self.dtype_bytes

    # --- compute ----------------------------------------------------------------------------
    def matmul_params(self) -> int:
        """Parameters that take part in a matmul per token: every linear layer and the output head."""
        return self._matmul_params

    @functools.cached_property
    def _matmul_params(self) -> int:
        n_moe = len(self.moe_layers)
        attn = self._attn_params(1) - 2 * self.hidden_size - (2 * self.head_dim if self.qk_norm else 0)
        mlp = (self.num_layers - n_moe) * self._dense_mlp_params(1) + n_moe * (
            _moe.active_mlp_params(self) if n_moe else 0)
        return self.num_layers * attn + mlp + self.vocab_size * self.hidden_size

    def attention_flops_per_token(self, context_len: int) -> float:
        """Score and value matmuls of one token attending to `context_len` tokens: 4·layers·heads·head_dim·ctx."""
        return 4.0 * self.num_layers * self.num_attention_heads * self.head_dim * max(0, context_len)

    def flops_per_token(self, context_len: int = 0, *, lm_head: bool = True) -> float:
        """Forward FLOPs of one token that attends to `context_len` tokens (itself included).

        2 FLOPs per matmul parameter (the output head only when `lm_head`; an engine computes
        logits for the sampled positions only) plus the attention matmuls.
        """
        dense = self.matmul_params()
        if not lm_head:
            dense -= self.vocab_size * self.hidden_size
        return 2.0 * dense + self.attention_flops_per_token(context_len)

    def sequence_flops(self, seq_len: int, *, lm_head: bool = True) -> float:
        """Forward FLOPs of one causal sequence of `seq_len` tokens: token i attends to i tokens."""
        dense = self.matmul_params() - (0 if lm_head else self.vocab_size * self.hidden_size)
        attn = 4.0 * self.num_layers * self.num_attention_heads * self.head_dim * seq_len * (seq_len + 1) / 2
        return 2.0 * dense * seq_len + attn

    def prefill_flops(self, new_tokens: int, cached_tokens: int = 0) -> float:
        """Forward FLOPs of a prefill chunk of `new_tokens` after `cached_tokens`, logits for its last token only."""
        if new_tokens <= 0:
            return 0.0
        c = cached_tokens
        attn = 4.0 * self.num_layers * self.num_attention_heads * self.head_dim * (
            new_tokens * c + new_tokens * (new_tokens + 1) / 2)
        return 2.0 * (self.matmul_params() - self.vocab_size * self.hidden_size) * new_tokens \
            + 2.0 * self.vocab_size * self.hidden_size + attn

    def lm_head_flops_per_token(self) -> float:
        """FLOPs of the output head for one position (2 · vocab · hidden)."""
        return 2.0 * self.vocab_size * self.hidden_size

    # --- unfused (local-spec) attention --------------------------------------------------------
    def score_elements(self, lengths: Sequence[int], tp: int = 1, pp: int = 1) -> float:
        """Attention-score elements an unfused attention materialises on one rank: layers · heads/TP · Σ s².

        Megatron's local spec without TransformerEngine (DotProductAttention) computes the full
        s × s matrix per head with baddbmm and masks it afterwards, so there is no causal halving.
        """
        _check_parallel(tp, pp)
        return float(self.layers_per_stage(pp) * (self.num_attention_heads // tp) * sum(n * n for n in lengths))

    def unfused_attention_flops(self, lengths: Sequence[int]) -> float:
        """Score and value matmuls over the full s × s matrix (whole model): 4 · layers · heads · hd · Σ s²."""
        return 4.0 * self.num_layers * self.num_attention_heads * self.head_dim * sum(n * n for n in lengths)

    # --- memory per token ---------------------------------------------------------------------
    def kv_bytes_per_token(self, tp: int = 1) -> int:
        """KV-cache bytes per token on one TP rank: 2·layers·kv_heads_per_rank·head_dim·dtype_bytes.

        = 2·layers·kv_heads·head_dim·bytes / TP while TP ≤ kv_heads (Qwen3-4B, TP=2: 73,728 B).
        """
        return 2 * self.num_layers * self.kv_heads_per_rank(tp) * self.head_dim * self.dtype_bytes

    def norm_kept_bytes(self, n: int, rows: int, *, fused: bool) -> float:
        """What one RMSNorm over `n` elements in `rows` rows keeps for its backward, per token.

        Fused kernels (TransformerEngine, apex, torch's fused rms_norm) keep the bf16 input and an
        fp32 rstd per row; torch's composite path keeps an fp32 copy of the input and the fp32
        normalised values (8 bytes per element) and the rstd (measured per module with saved-tensor
        hooks on the H200, megatron-core 0.19.2, bench/data/h200_megatron_1.7b_accounting*.json).
        """
        return (self.dtype_bytes * n if fused else 8.0 * n) + 4.0 * rows

    def activation_bytes_per_layer_token(self, tp: int = 1, *, sequence_parallel: bool = True,
                                         attention: str = "flash", norm: str = "fused",
                                         elementwise: str = "fused", etp: int | None = None,
                                         imbalance: float = 1.0) -> float:
        """Bytes one transformer block keeps per token for the backward pass (no recompute).

        Adapted from Korthikanti et al. 2022, "Reducing Activation Recomputation in Large
        Transformer Models" (sbh·(34 + 5as/h) per layer for GPT with dropout), to what
        Megatron-core keeps for this architecture (SwiGLU, GQA, optional q/k norm, dropout 0 as in
        RL), with b = dtype_bytes; the software terms (`vime.sim.hardware_parts.Software`) were checked
        tensor by tensor on the H200 (bench/megatron_step.py --account):

        - each of the two block norms: what the norm keeps (`norm_kept_bytes`) and its bf16 output,
          which the following linear keeps as its input;
        - q/k norm (Qwen3): what each keeps, per head row; with ``norm="torch"`` the key norm takes
          torch's composite path (Megatron hands it a strided view of the QKV output);
        - attention: ``flash`` keeps q, k, v b·(heads + 2·kv_heads)·hd, its output b·heads·hd and
          an fp32 log-sum-exp per head; ``unfused`` keeps only the output here (the s² scores and
          the K/V expanded to every head are `vime.sim.trainer.score_bytes`);
        - MLP: gate and up outputs 2·b·F and the down projection's input b·F; unfused elementwise
          kernels add the silu output and the copy Megatron's GLU makes of the gate (2·b·F more);
          a MoE layer keeps `vime.sim.moe.moe_activation_bytes_per_token` instead (experts over
          `etp`, the busiest rank's share `imbalance`), averaged over the layers.

        Everything is split over TP; the block-norm terms only with sequence parallelism.
        """
        b, h, hd = self.dtype_bytes, self.hidden_size, self.head_dim
        heads, kv = self.num_attention_heads // tp, self.kv_heads_per_rank(tp)
        ffn = self.ffn_hidden_size // tp
        block_fused = norm != "torch_fp32_weight"
        norms = 2 * (self.norm_kept_bytes(h, 1, fused=block_fused) + b * h) / (tp if sequence_parallel else 1)
        qk = 0.0
        if self.qk_norm:
            qk = (self.norm_kept_bytes(heads * hd, heads, fused=block_fused)
                  + self.norm_kept_bytes(kv * hd, kv, fused=norm == "fused"))
        if attention == "unfused":
            attn = b * heads * hd
        else:
            attn = b * (heads + 2 * kv) * hd + b * heads * hd + 4 * heads
        if self.gated_mlp:
            mlp = (5 if elementwise == "unfused" else 3) * b * ffn
        else:
            mlp = 2 * b * ffn
        if self.is_moe:
            n_moe = len(self.moe_layers)
            moe = _moe.moe_activation_bytes_per_token(self, tp, tp if etp is None else etp, imbalance)
            return norms + qk + attn + ((self.num_layers - n_moe) * mlp + n_moe * moe) / self.num_layers
        return norms + qk + attn + mlp

    def final_bytes_per_token(self, tp: int = 1, *, sequence_parallel: bool = True, norm: str = "fused") -> float:
        """The final norm and the output layer's input, per token (outside the blocks)."""
        kept = self.norm_kept_bytes(self.hidden_size, 1, fused=norm != "torch_fp32_weight") \
            + self.dtype_bytes * self.hidden_size
        return kept / (tp if sequence_parallel else 1)

    def logits_bytes_per_token(self, tp: int = 1) -> float:
        """Output-layer activations per token: bf16 logits + the fp32 copy the vocab-parallel log-softmax keeps."""
        return (self.dtype_bytes + 4) * self.vocab_size / tp

    def activation_bytes_per_token(self, tp: int = 1, pp: int = 1, recompute: Recompute = "none",
                                   *, sequence_parallel: bool = True, attention: str = "flash",
                                   norm: str = "fused", elementwise: str = "fused", etp: int | None = None,
                                   imbalance: float = 1.0) -> float:
        """Training activation bytes per token on the busiest rank of a TP×PP layout.

        ``none``/``selective``: every block keeps `activation_bytes_per_layer_token` (Megatron's
        selective recompute only drops the core attention, whose s² part `score_bytes` counts).
        ``full``: each block keeps its input (b·h / TP with sequence parallelism) and one block's
        activations exist at a time during its recompute. The final norm, the output layer's input
        and its logits are added once (conservatively on the same stage).
        """
        if recompute not in ("none", "selective", "full"):
            raise ConfigError(f"recompute must be none, selective or full, got {recompute!r}")
        layers = self.layers_per_stage(pp)
        per_layer = self.activation_bytes_per_layer_token(tp, sequence_parallel=sequence_parallel,
                                                          attention=attention, norm=norm, elementwise=elementwise,
                                                          etp=etp, imbalance=imbalance)
        if recompute == "full":
            keep = self.dtype_bytes * self.hidden_size / (tp if sequence_parallel else 1)
            body = layers * keep + per_layer
        else:
            body = layers * per_layer
        final = self.final_bytes_per_token(tp, sequence_parallel=sequence_parallel, norm=norm)
        return body + final + self.logits_bytes_per_token(tp)

    # --- (de)serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}

    @classmethod
    def from_hf_config(cls, config: dict[str, Any], *, name: str, source: str = "") -> ModelSpec:
        """The spec of an HF config.json dict, checked by `vime.hf_config` (non-decoder configs and MLA are refused)."""
        return cls.from_hf(parse_hf_config(config, name=name, source=source))

    @classmethod
    def from_hf(cls, hf: HFModelConfig) -> ModelSpec:
        return cls(name=hf.name, num_layers=hf.num_layers, hidden_size=hf.hidden_size,
                   ffn_hidden_size=hf.intermediate_size, num_attention_heads=hf.num_heads,
                   num_kv_heads=hf.num_kv_heads, head_dim=hf.head_dim, vocab_size=hf.vocab_size,
                   tie_embeddings=hf.tie_word_embeddings, qk_norm=hf.qk_norm, qkv_bias=hf.qkv_bias,
                   gated_mlp=hf.gated_mlp, max_position_embeddings=hf.max_position_embeddings,
                   dtype_bytes=hf.dtype_bytes, source=hf.source, num_experts=hf.moe.num_experts,
                   moe_top_k=hf.moe.top_k, moe_ffn_hidden_size=hf.moe.expert_ffn,
                   shared_expert_ffn_size=hf.moe.shared_ffn, moe_layers=hf.moe.moe_layers)


def _check_parallel(tp: int, pp: int) -> None:
    if not isinstance(tp, int) or tp < 1 or not isinstance(pp, int) or pp < 1:
        raise ConfigError(f"tensor/pipeline parallel sizes must be integers >= 1, got TP={tp!r}, PP={pp!r}")


def _preset_files() -> dict[str, Path]:
    return {p.stem: p for p in sorted(_MODELS_DIR.glob("*.json"))}


def list_models() -> list[str]:
    """Names of the built-in model presets, sorted."""
    return sorted(_preset_files())


def load_model(name_or_path: str | Path = DEFAULT_MODEL) -> ModelSpec:
    """A preset by name (case-insensitive; "Qwen/Qwen3-4B" also works) or an HF config.json path.

    A directory holding a config.json (an HF checkpoint) is accepted too. Unknown names raise
    ConfigError listing the presets.
    """
    text = str(name_or_path)
    presets = _preset_files()
    by_lower = {k.lower(): k for k in presets}
    key = text.rsplit("/", 1)[-1].lower() if "/" in text and not Path(text).exists() else text.lower()
    if key in by_lower:
        preset = by_lower[key]
        data = read_json(presets[preset], what="model preset", missing_hint="reinstall vime")
        return ModelSpec.from_hf_config(data, name=preset, source=data.get("_vime_source", f"preset {preset}"))
    path = Path(text)
    if path.is_dir() or path.is_file():
        return ModelSpec.from_hf(load_hf_config(path, what="--model"))
    raise ConfigError(f"--model {text!r}: unknown model; known presets: {', '.join(sorted(presets))}, "
                      f"or pass a Hugging Face config.json path")
