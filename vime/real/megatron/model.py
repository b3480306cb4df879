"""Megatron GPTModel from a Hugging Face config, and the HF ↔ Megatron weight mapping (QKV fusion, gate/up, TP shards).

Three layouts meet here:

- **HF**: one tensor per projection (`q_proj`, `k_proj`, `v_proj`, `gate_proj`, `up_proj`, ...).
- **Megatron full**: the layout of a TP=1 Megatron model. `linear_qkv` fuses Q, K, V per query
  group (``[q heads of group g, k_g, v_g]`` for every group g) and `linear_fc1` stacks
  ``[gate; up]``.
- **Megatron shard**: what TP rank r holds. Column-parallel weights split dim 0 (QKV groups stay
  whole), row-parallel ones dim 1, the vocabulary dim 0; `linear_fc1` holds ``[gate_r; up_r]``.

`hf_to_megatron` / `megatron_to_hf` convert HF ↔ Megatron full; `shard` / `unshard` convert
Megatron full ↔ shards. Export (seed step 48) is unshard then megatron_to_hf; loading an HF
checkpoint is hf_to_megatron then shard.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch

from vime.errors import ConfigError
from vime.hf_config import parse_hf_config
from vime.inputs import read_json
from vime.real.megatron import moe_mapping

#: HF `model_type`s whose dense decoder this module maps (the seed's model families).
SUPPORTED_MODEL_TYPES = ("qwen3", "qwen2", "llama")
#: MoE `model_type`s whose weights this module maps (`moe_mapping`) and whose layers it builds (any TP, EP, ETP).
MOE_MAPPED_MODEL_TYPES = ("qwen3_moe",)


@dataclass(frozen=True)
class ModelSpec:
    """The architecture facts of a dense decoder, read from an HF `config.json`."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool  # Qwen3: RMSNorm on each head's q and k
    qkv_bias: bool  # Qwen2/2.5: biases on q, k, v
    rope_scaling_factor: float | None = None  # Llama-3.1 style "llama3" rope scaling
    num_experts: int = 0  # MoE: routed experts per layer
    moe_top_k: int = 0
    moe_intermediate_size: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_kv_heads

    def padded_vocab(self, tp: int) -> int:
        """Vocabulary rounded up to a multiple of TP (vocab-parallel layers split it evenly)."""
        return int(math.ceil(self.vocab_size / tp) * tp)

    def check_tp(self, tp: int) -> None:
        """TP must divide the query groups and the MLP width, or the shards are not whole."""
        if tp < 1:
            raise ConfigError(f"--tensor-model-parallel-size must be >= 1, got {tp}")
        if self.num_kv_heads % tp:
            raise ConfigError(
                f"--tensor-model-parallel-size {tp} does not divide num_key_value_heads "
                f"{self.num_kv_heads}; pick a TP size that divides it"
            )
        if self.intermediate_size % tp:
            raise ConfigError(
                f"--tensor-model-parallel-size {tp} does not divide intermediate_size {self.intermediate_size}"
            )

    def check_experts(self, ep: int, etp: int, world: int | None = None) -> None:
        """EP must divide the routed experts, ETP each expert's width, EP × ETP the `world` of ranks when
        given (a dense model takes EP = 1)."""
        if world is not None and world % (ep * etp):
            raise ConfigError(f"{world} trainer ranks cannot be split into expert groups of "
                              f"--expert-model-parallel-size {ep} × --expert-tensor-parallel-size {etp}")
        if not self.num_experts:
            if ep != 1:
                raise ConfigError(f"--expert-model-parallel-size {ep}: the model is dense (no experts); leave it at 1")
            return
        if ep < 1 or self.num_experts % ep:
            raise ConfigError(f"--expert-model-parallel-size {ep} does not divide the {self.num_experts} experts; "
                              f"use a divisor of {self.num_experts}")
        if etp < 1 or self.moe_intermediate_size % etp:
            raise ConfigError(f"--expert-tensor-parallel-size {etp} does not divide the expert width "
                              f"{self.moe_intermediate_size} (moe_intermediate_size); use a divisor of it")


def spec_from_hf_config(cfg: Mapping[str, Any], *, source: str = "--hf-checkpoint config.json") -> ModelSpec:
    """The Megatron mapping's spec of a `config.json` dict (or a transformers config's `to_dict()`), read
    and checked by `vime.hf_config` (the same reader the simulator uses), limited to the mapped families
    (the dense ones and Qwen3-MoE)."""
    hf = parse_hf_config(cfg, name="model", source=source)
    if hf.moe.is_moe:
        if hf.model_type not in MOE_MAPPED_MODEL_TYPES:
            raise ConfigError(f"{source}: model_type {hf.model_type!r} with {hf.moe.num_experts} experts: the "
                              f"Megatron trainer maps {', '.join(MOE_MAPPED_MODEL_TYPES)} among MoE models (others "
                              f"are planned with `vime simulate`)")
        return _spec(hf)
    if hf.model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(f"model_type {hf.model_type!r} is not supported by the Megatron trainer; "
                          f"supported dense families: {', '.join(SUPPORTED_MODEL_TYPES)}")
    if hf.mlp_bias:
        raise ConfigError("mlp_bias=True is not supported by the Megatron trainer mapping")
    return _spec(hf)


def _spec(hf: Any) -> ModelSpec:
    return ModelSpec(
        model_type=hf.model_type, vocab_size=hf.vocab_size, hidden_size=hf.hidden_size,
        intermediate_size=hf.intermediate_size, num_layers=hf.num_layers, num_heads=hf.num_heads,
        num_kv_heads=hf.num_kv_heads, head_dim=hf.head_dim, rms_norm_eps=hf.rms_norm_eps, rope_theta=hf.rope_theta,
        max_position_embeddings=hf.max_position_embeddings or 4096, tie_word_embeddings=hf.tie_word_embeddings,
        qk_norm=hf.qk_norm, qkv_bias=hf.qkv_bias, rope_scaling_factor=hf.rope_scaling_factor,
        num_experts=hf.moe.num_experts, moe_top_k=hf.moe.top_k, moe_intermediate_size=hf.moe.expert_ffn)


def load_hf_config(path: str) -> dict[str, Any]:
    """The `config.json` of an HF checkpoint directory (or the file itself), as a dict (actors get it pickled)."""
    file = os.path.join(path, "config.json") if os.path.isdir(path) else path
    data = read_json(file, what="--hf-checkpoint",
                     missing_hint="point --hf-checkpoint at an HF model directory holding config.json")
    if not isinstance(data, dict):
        raise ConfigError(f"--hf-checkpoint {file}: expected a JSON object")
    return data


# --------------------------------------------------------------------------------------------
# Building the Megatron model
# --------------------------------------------------------------------------------------------


def transformer_config(spec: ModelSpec, *, tp: int, dtype: torch.dtype = torch.float32,
                       cpu_init: bool = False, ep: int = 1, etp: int | None = None, **overrides: Any) -> Any:
    """Megatron `TransformerConfig` for `spec` (local layer spec: no TransformerEngine); `ep` / `etp`
    are the expert-parallel sizes parallel_state was initialised with (`etp` None: TP, Megatron's default)."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    spec.check_tp(tp)
    etp = tp if etp is None else etp
    spec.check_experts(ep, etp)
    kwargs: dict[str, Any] = dict(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        ffn_hidden_size=spec.intermediate_size,
        num_attention_heads=spec.num_heads,
        num_query_groups=spec.num_kv_heads,
        kv_channels=spec.head_dim,
        normalization="RMSNorm",
        layernorm_epsilon=spec.rms_norm_eps,
        gated_linear_unit=True,
        activation_func=torch.nn.functional.silu,
        add_bias_linear=False,
        add_qkv_bias=spec.qkv_bias,
        qk_layernorm=spec.qk_norm,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        tensor_model_parallel_size=tp,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        # CPU init draws each full weight from one generator and slices it, so a TP=2 model starts
        # from exactly the weights of a TP=1 model with the same seed.
        use_cpu_initialization=cpu_init,
        cuda_graph_scope=[],
    )
    if spec.num_experts:  # Qwen3-MoE: softmax over the top-k logits = norm_topk_prob's renormalised gates
        kwargs.update(num_moe_experts=spec.num_experts, moe_router_topk=spec.moe_top_k,
                      moe_ffn_hidden_size=spec.moe_intermediate_size, moe_router_pre_softmax=False,
                      moe_aux_loss_coeff=0.0, moe_grouped_gemm=False,
                      expert_model_parallel_size=ep, expert_tensor_parallel_size=etp,
                      # Megatron refuses to train MoE layers under TP without it (MoELayer.forward)
                      sequence_parallel=tp > 1,
                      # the all-to-all dispatcher makes CUDA streams; the all-gather one runs on CPU too
                      moe_token_dispatcher_type="alltoall" if torch.cuda.is_available() else "allgather")
    kwargs.update(overrides)
    return TransformerConfig(**kwargs)


def recompute_overrides(granularity: str | None) -> dict[str, Any]:
    """TransformerConfig fields for --recompute-granularity (what the simulator's cost model assumes)."""
    if granularity is None:
        return {}
    if granularity == "full":
        return {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 1}
    if granularity == "selective":
        return {"recompute_granularity": "selective"}
    raise ConfigError(f"--recompute-granularity {granularity!r}: pick full or selective")


def build_gpt_model(spec: ModelSpec, config: Any) -> Any:
    """A Megatron `GPTModel` (pre and post process; PP = 1) for `spec` under `config`."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    if spec.num_experts:
        from vime.real.megatron import compat

        compat.moe_without_te()
    layer_spec: Any = get_gpt_layer_local_spec(num_experts=spec.num_experts or None, moe_grouped_gemm=False,
                                               qk_layernorm=spec.qk_norm, normalization="RMSNorm")
    if config.sequence_parallel:
        from vime.real.megatron import compat

        layer_spec = compat.block_spec(layer_spec, spec.num_layers)
    return GPTModel(
        config=config,
        transformer_layer_spec=layer_spec,
        vocab_size=spec.padded_vocab(config.tensor_model_parallel_size),
        max_sequence_length=spec.max_position_embeddings,
        pre_process=True,
        post_process=True,
        share_embeddings_and_output_weights=spec.tie_word_embeddings,
        position_embedding_type="rope",
        rotary_base=int(spec.rope_theta),
        rope_scaling=spec.rope_scaling_factor is not None,
        rope_scaling_factor=spec.rope_scaling_factor or 8.0,
    )


# --------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------

_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.+)$")
_HF_LAYER = re.compile(r"^model\.layers\.(\d+)\.(.+)$")

# Megatron per-layer suffix -> HF per-layer suffix, for the one-to-one tensors.
_LAYER_DIRECT = {
    "input_layernorm.weight": "input_layernorm.weight",
    "pre_mlp_layernorm.weight": "post_attention_layernorm.weight",
    "self_attention.linear_proj.weight": "self_attn.o_proj.weight",
    "self_attention.q_layernorm.weight": "self_attn.q_norm.weight",
    "self_attention.k_layernorm.weight": "self_attn.k_norm.weight",
    "mlp.linear_fc2.weight": "mlp.down_proj.weight",
}
_HF_LAYER_DIRECT = {v: k for k, v in _LAYER_DIRECT.items()}
_TOP_DIRECT = {
    "embedding.word_embeddings.weight": "model.embed_tokens.weight",
    "decoder.final_layernorm.weight": "model.norm.weight",
    "output_layer.weight": "lm_head.weight",
}
_HF_TOP_DIRECT = {v: k for k, v in _TOP_DIRECT.items()}
_VOCAB = ("embedding.word_embeddings.weight", "output_layer.weight")

#: TP split dimension of each Megatron parameter (by suffix); absent = replicated.
_COLUMN = ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight")
_ROW = ("linear_proj.weight", "linear_fc2.weight")


def partition_dim(name: str) -> int | None:
    """The dim along which TP splits Megatron parameter `name`, or None when it is replicated."""
    if name in _VOCAB or name.endswith(_COLUMN):
        return 0
    if name.endswith(_ROW):
        return 1
    return None


def shard(name: str, full: torch.Tensor, tp_rank: int, tp: int) -> torch.Tensor:
    """TP rank `tp_rank`'s shard of the Megatron-full tensor `full`."""
    dim = partition_dim(name)
    if dim is None or tp == 1:
        return full
    if name.endswith("linear_fc1.weight"):
        gate, up = full.chunk(2, dim=0)
        return torch.cat([gate.chunk(tp, 0)[tp_rank], up.chunk(tp, 0)[tp_rank]], dim=0)
    return full.chunk(tp, dim=dim)[tp_rank]


def unshard(name: str, shards: list[torch.Tensor]) -> torch.Tensor:
    """The Megatron-full tensor from all TP ranks' shards (in rank order)."""
    dim = partition_dim(name)
    if dim is None or len(shards) == 1:
        return shards[0]
    if name.endswith("linear_fc1.weight"):
        halves = [s.chunk(2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(shards, dim=dim)


def megatron_to_hf(spec: ModelSpec, name: str, full: torch.Tensor, *,
                   cut_on_device: bool = False) -> list[tuple[str, Any]]:
    """HF (name, tensor) pairs for one Megatron-full tensor (QKV and gate/up are split). `cut_on_device`: QKV's
    pieces stay `DeviceCut`s of the fused tensor, cut where they are staged (the IPC export)."""
    if name in _TOP_DIRECT:
        if name in _VOCAB:
            full = full[: spec.vocab_size]
        return [(_TOP_DIRECT[name], full)]
    m = _LAYER.match(name)
    if m is None:
        raise KeyError(f"no HF name for Megatron parameter {name!r}")
    i, rest = m.group(1), m.group(2)
    pre = f"model.layers.{i}."
    if rest.startswith(moe_mapping.MEGATRON_PREFIXES):
        return moe_mapping.megatron_to_hf(pre, rest, full)
    if rest in _LAYER_DIRECT:
        return [(pre + _LAYER_DIRECT[rest], full)]
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        kind = rest.rsplit(".", 1)[1]
        if cut_on_device:
            from vime.real.weights.ipc import DeviceCut

            rows = (spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim,
                    spec.num_kv_heads * spec.head_dim)
            q, k, v = (DeviceCut(full, partial(qkv_piece, spec, j), (rows[j], *full.shape[1:])) for j in range(3))
        else:
            q, k, v = split_qkv(spec, full)
        return [(f"{pre}self_attn.q_proj.{kind}", q), (f"{pre}self_attn.k_proj.{kind}", k),
                (f"{pre}self_attn.v_proj.{kind}", v)]
    if rest == "mlp.linear_fc1.weight":
        gate, up = full.chunk(2, dim=0)
        return [(pre + "mlp.gate_proj.weight", gate), (pre + "mlp.up_proj.weight", up)]
    raise KeyError(f"no HF name for Megatron parameter {name!r}")


def qkv_piece(spec: ModelSpec, which: int, fused: torch.Tensor) -> torch.Tensor:
    """View of HF q (0), k (1) or v (2) inside Megatron's per-group fused QKV, grouped [g, rows, ...] (no copy)."""
    g, d, hpg = spec.num_kv_heads, spec.head_dim, spec.heads_per_group
    grouped = fused.reshape(g, (hpg + 2) * d, *fused.shape[1:])
    lo, hi = ((0, hpg * d), (hpg * d, (hpg + 1) * d), ((hpg + 1) * d, (hpg + 2) * d))[which]
    return grouped[:, lo:hi]


def split_qkv(spec: ModelSpec, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Megatron's per-group fused QKV → HF q, k, v (weights or biases)."""
    pieces = [qkv_piece(spec, j, fused) for j in range(3)]
    return tuple(p.reshape(-1, *fused.shape[1:]).contiguous() for p in pieces)  # type: ignore[return-value]


def fuse_qkv(spec: ModelSpec, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """HF q, k, v → Megatron's per-group fused QKV."""
    g, d, hpg = spec.num_kv_heads, spec.head_dim, spec.heads_per_group
    rest = q.shape[1:]
    parts = [q.reshape(g, hpg * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)]
    return torch.cat(parts, dim=1).reshape(g * (hpg + 2) * d, *rest).contiguous()


def hf_to_megatron(spec: ModelSpec, hf: Mapping[str, torch.Tensor], *, tp: int = 1) -> dict[str, torch.Tensor]:
    """Megatron-full tensors from an HF state dict (vocab padded for `tp`). Unknown names raise."""
    out: dict[str, torch.Tensor] = {}
    pending: dict[tuple[str, str], dict[str, torch.Tensor]] = {}  # (layer prefix, group) -> pieces
    moe: dict[str, dict[str, torch.Tensor]] = {}  # layer prefix -> its MoE tensors (moe_mapping)
    padded = spec.padded_vocab(tp)
    for hf_name, tensor in hf.items():
        if hf_name in _HF_TOP_DIRECT:
            name = _HF_TOP_DIRECT[hf_name]
            if name == "output_layer.weight" and spec.tie_word_embeddings:
                continue  # tied checkpoints may still store lm_head; Megatron shares the embedding
            if name in _VOCAB and padded > tensor.shape[0]:
                pad = tensor.new_zeros(padded - tensor.shape[0], *tensor.shape[1:])
                tensor = torch.cat([tensor, pad], dim=0)
            out[name] = tensor
            continue
        if hf_name.endswith("rotary_emb.inv_freq"):
            continue  # a buffer some old checkpoints carry; recomputed from rope_theta
        m = _HF_LAYER.match(hf_name)
        if m is None:
            raise KeyError(f"HF tensor {hf_name!r} has no Megatron counterpart")
        i, rest = m.group(1), m.group(2)
        pre = f"decoder.layers.{i}."
        if rest in _HF_LAYER_DIRECT:
            out[pre + _HF_LAYER_DIRECT[rest]] = tensor
            continue
        if rest.startswith(moe_mapping.HF_PREFIXES):
            moe.setdefault(pre, {})[rest] = tensor
            continue
        parts = re.match(r"^(self_attn\.[qkv]_proj|mlp\.gate_proj|mlp\.up_proj)\.(weight|bias)$", rest)
        if parts is None:
            raise KeyError(f"HF tensor {hf_name!r} has no Megatron counterpart")
        group = "qkv." + parts.group(2) if parts.group(1).startswith("self_attn") else "fc1"
        pending.setdefault((pre, group), {})[parts.group(1).split(".")[1]] = tensor
    for (pre, group), pieces in pending.items():
        if group.startswith("qkv"):
            kind = group.split(".")[1]
            missing = {"q_proj", "k_proj", "v_proj"} - pieces.keys()
            if missing:
                raise KeyError(f"{pre}: HF checkpoint lacks {sorted(missing)} ({kind})")
            out[f"{pre}self_attention.linear_qkv.{kind}"] = fuse_qkv(
                spec, pieces["q_proj"], pieces["k_proj"], pieces["v_proj"])
        else:
            if {"gate_proj", "up_proj"} - pieces.keys():
                raise KeyError(f"{pre}: HF checkpoint lacks gate_proj or up_proj")
            out[pre + "mlp.linear_fc1.weight"] = torch.cat([pieces["gate_proj"], pieces["up_proj"]], dim=0)
    for pre, tensors in moe.items():
        out.update(moe_mapping.hf_to_megatron(pre, tensors))
    return out


# --------------------------------------------------------------------------------------------
# Safetensors I/O
# --------------------------------------------------------------------------------------------


def read_hf_safetensors(path: str, keep: Callable[[str], bool] | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of an HF checkpoint directory (single file or sharded with an index), or those
    whose name `keep` accepts (the others are never read: an EP rank skips other ranks' experts)."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise ConfigError(f"--hf-checkpoint {path!r} holds no *.safetensors files")
    out: dict[str, torch.Tensor] = {}
    for f in files:
        if keep is None:
            out.update(load_file(os.path.join(path, f)))
            continue
        with safe_open(os.path.join(path, f), framework="pt") as fh:
            out.update({k: fh.get_tensor(k) for k in fh.keys() if keep(k)})  # noqa: SIM118 - safe_open has no __iter__
    return out


def write_hf_safetensors(path: str, tensors: Iterable[tuple[str, torch.Tensor]], *,
                         config: Mapping[str, Any] | None = None) -> None:
    """Write an HF checkpoint directory: `model.safetensors` (+ `config.json` when given)."""
    from safetensors.torch import save_file

    os.makedirs(path, exist_ok=True)
    state = {name: t.detach().to("cpu").contiguous() for name, t in tensors}
    save_file(state, os.path.join(path, "model.safetensors"), metadata={"format": "pt"})
    if config is not None:
        with open(os.path.join(path, "config.json"), "w") as fh:
            json.dump(dict(config), fh, indent=2, sort_keys=True)


def hf_export_order(spec: ModelSpec, megatron_names: Iterable[str]) -> Iterator[str]:
    """Megatron names in a stable export order: embedding, layers by index, final norm, head."""

    def key(name: str) -> tuple[int, int, str]:
        m = _LAYER.match(name)
        if m:
            return (1, int(m.group(1)), m.group(2))
        return ({"embedding.word_embeddings.weight": 0, "decoder.final_layernorm.weight": 2}.get(name, 3), 0, name)

    return iter(sorted(megatron_names, key=key))
