"""The one reader of a Hugging Face `config.json`: the architecture facts of a decoder (dense or MoE), every value checked.

Both the simulator's cost model (`vime.sim.models.ModelSpec`) and the Megatron mapping
(`vime.real.megatron.model`) derive their specs from `HFModelConfig`, so a file means the same
model to both. Bad values (a missing key, ``num_attention_heads: 0``, ``hidden_size: 2560.7``, a
boolean where a count belongs, ``NaN``, heads that do not divide the hidden size without a
``head_dim``, an unknown ``torch_dtype``) raise one-line `ConfigError`s naming the file, the key and
the fix. The experts of a mixture-of-experts config are read by `vime.hf_moe` (Qwen-MoE, Mixtral,
GLM-4-MoE; DeepSeek's latent attention is refused).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from vime.errors import ConfigError
from vime.hf_moe import MoEFields, parse_moe
from vime.inputs import count, flag, number, read_json

#: Weight dtype names of config.json (torch_dtype / dtype) and their bytes per element.
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
#: Activations of a gated (SwiGLU-style) MLP.
GATED_ACTS = ("silu", "swiglu", "gelu_pytorch_tanh", "gelu")
#: Generous upper bounds: beyond them a value is a typo, not a model.
_MAX = {"num_hidden_layers": 4096, "hidden_size": 1 << 20, "intermediate_size": 1 << 22,
        "num_attention_heads": 4096, "num_key_value_heads": 4096, "head_dim": 4096, "vocab_size": 1 << 24,
        "max_position_embeddings": 1 << 28}


@dataclass(frozen=True)
class HFModelConfig:
    """A decoder's architecture as its config.json states it (HF key names in comments)."""

    name: str
    source: str
    model_type: str
    num_layers: int  # num_hidden_layers
    hidden_size: int
    intermediate_size: int
    num_heads: int  # num_attention_heads
    num_kv_heads: int  # num_key_value_heads (= heads without GQA)
    head_dim: int  # head_dim (default hidden_size / heads)
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool  # Qwen3: RMSNorm over each q and k head
    qkv_bias: bool  # attention_bias; Qwen2 always has q/k/v biases
    mlp_bias: bool
    gated_mlp: bool  # hidden_act is a gated activation (SwiGLU)
    rms_norm_eps: float
    rope_theta: float
    rope_type: str  # "default" or "llama3"
    rope_scaling_factor: float | None
    dtype: str  # torch_dtype / dtype
    moe: MoEFields = MoEFields()  # the experts (empty for a dense model)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_hf_config(data: Any, *, name: str, source: str = "") -> HFModelConfig:
    """Check a config.json value and read its architecture; `source` names it in errors (a path or preset)."""
    where = f"model {source or name}"
    if not isinstance(data, Mapping):
        raise ConfigError(f"{where}: expected a JSON object (a Hugging Face config.json), got {type(data).__name__}")
    if "text_config" in data and "num_hidden_layers" not in data:  # multimodal wrappers keep the LM inside
        inner = data["text_config"]
        if not isinstance(inner, Mapping):
            raise ConfigError(f"{where}: 'text_config' must be an object")
        data = {**inner, "model_type": data.get("model_type", inner.get("model_type", ""))}
    layers = count(data, "num_hidden_layers", where=where, maximum=_MAX["num_hidden_layers"])
    hidden = count(data, "hidden_size", where=where, maximum=_MAX["hidden_size"])
    ffn = count(data, "intermediate_size", where=where, maximum=_MAX["intermediate_size"])
    heads = count(data, "num_attention_heads", where=where, maximum=_MAX["num_attention_heads"])
    kv = count(data, "num_key_value_heads", where=where, default=heads, maximum=_MAX["num_key_value_heads"])
    if heads % kv:
        raise ConfigError(f"{where}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv}")
    if data.get("head_dim") is None and hidden % heads:
        raise ConfigError(f"{where}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
                          f"add 'head_dim' (the per-head size)")
    head_dim = count(data, "head_dim", where=where, default=hidden // heads, maximum=_MAX["head_dim"])
    vocab = count(data, "vocab_size", where=where, maximum=_MAX["vocab_size"])
    max_pos = count(data, "max_position_embeddings", where=where, default=0, minimum=0,
                    maximum=_MAX["max_position_embeddings"])
    model_type = data.get("model_type", "")
    if not isinstance(model_type, str):
        raise ConfigError(f"{where}: 'model_type' must be a string, got {model_type!r}")
    model_type = model_type.lower()
    dtype = data.get("torch_dtype") or data.get("dtype") or "bfloat16"
    if dtype == "auto":
        dtype = "bfloat16"
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ConfigError(f"{where}: torch_dtype {dtype!r} is not one of {', '.join(DTYPE_BYTES)}")
    act = data.get("hidden_act", "silu")
    if not isinstance(act, str):
        raise ConfigError(f"{where}: 'hidden_act' must be a string, got {act!r}")
    rope_type, theta, factor = _rope(data, where)
    moe = parse_moe(data, where=where, num_layers=layers, intermediate_size=ffn)
    qk_default = model_type.startswith("qwen3")
    qk_norm = flag(data, "qk_norm", where=where, default=flag(data, "use_qk_norm", where=where, default=qk_default))
    qkv_bias = model_type == "qwen2" or flag(data, "attention_bias", where=where)
    return HFModelConfig(
        name=name, source=source, model_type=model_type, num_layers=layers, hidden_size=hidden,
        intermediate_size=ffn, num_heads=heads, num_kv_heads=kv, head_dim=head_dim, vocab_size=vocab,
        max_position_embeddings=max_pos, tie_word_embeddings=flag(data, "tie_word_embeddings", where=where),
        qk_norm=qk_norm, qkv_bias=qkv_bias, mlp_bias=flag(data, "mlp_bias", where=where),
        gated_mlp=act in GATED_ACTS, rms_norm_eps=number(data, "rms_norm_eps", where=where, default=1e-6, high=1.0),
        rope_theta=theta, rope_type=rope_type, rope_scaling_factor=factor, dtype=dtype, moe=moe)


def _rope(data: Mapping[str, Any], where: str) -> tuple[str, float, float | None]:
    """(rope type, theta, llama3 scaling factor): transformers ≥ 5 keeps them in `rope_parameters`,
    older configs in `rope_theta` / `rope_scaling`."""
    rope = data.get("rope_parameters") or {}
    scaling = data.get("rope_scaling") or {}
    if not isinstance(rope, Mapping) or not isinstance(scaling, Mapping):
        raise ConfigError(f"{where}: 'rope_parameters' / 'rope_scaling' must be objects")
    rope_type = rope.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    theta_src = rope if "rope_theta" in rope else data
    theta = number(theta_src, "rope_theta", where=where, default=10000.0)
    factor = None
    if rope_type == "llama3":
        factor = number({**scaling, **rope}, "factor", where=where, default=8.0)
    elif rope_type != "default":
        raise ConfigError(f"{where}: rope type {rope_type!r} is not supported (default and llama3 are)")
    return str(rope_type), theta, factor


def load_hf_config(path: str | Path, *, what: str = "--model") -> HFModelConfig:
    """The checked `HFModelConfig` of an HF checkpoint directory or a config.json file."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    data = read_json(file, what=what, missing_hint="give a Hugging Face config.json or a directory holding one")
    name = file.parent.name if file.name == "config.json" else file.stem
    return parse_hf_config(data, name=name or str(path), source=str(file))
