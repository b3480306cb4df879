"""The mixture-of-experts part of a Hugging Face `config.json` (Qwen2/3-MoE, Mixtral, GLM-4-MoE), every value checked.

Three spellings of the same facts:

- Qwen2-MoE / Qwen3-MoE: ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size`` (each
  expert's width), ``shared_expert_intermediate_size`` (Qwen2-MoE), ``decoder_sparse_step`` (layer
  i is MoE when (i + 1) % step == 0) and ``mlp_only_layers`` (dense despite the step);
- Mixtral: ``num_local_experts``, ``num_experts_per_tok``, every layer MoE, each expert
  ``intermediate_size`` wide (transformers 5 saves Qwen3-MoE's expert count under
  ``num_local_experts`` too, beside its ``moe_intermediate_size``, which then sets the width);
- GLM-4-MoE (and DeepSeek-V2/V3's spelling): ``n_routed_experts``, ``n_shared_experts`` (shared
  experts of ``moe_intermediate_size`` each), ``first_k_dense_replace`` (the first k layers dense).

DeepSeek-V2/V3's multi-head latent attention (``kv_lora_rank``) is refused: its KV cache and
projections are not the GQA the cost model counts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from vime.errors import ConfigError
from vime.inputs import count, flag

#: Keys naming the routed-expert count, by family.
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


@dataclass(frozen=True)
class MoEFields:
    """What a config.json says about its experts (all zero for a dense model)."""

    num_experts: int = 0  # routed experts per MoE layer
    top_k: int = 0  # num_experts_per_tok
    expert_ffn: int = 0  # one routed expert's intermediate size
    shared_ffn: int = 0  # the shared experts' intermediate size, summed (0: none)
    moe_layers: tuple[int, ...] = ()  # indices of the MoE layers; the others have the dense MLP
    norm_topk_prob: bool = False  # the top-k gate weights renormalised to sum to 1

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0


def parse_moe(data: Mapping[str, Any], *, where: str, num_layers: int, intermediate_size: int | None) -> MoEFields:
    """The checked MoE fields of a config.json (a dense config gives `MoEFields()`)."""
    if data.get("kv_lora_rank") is not None:
        raise ConfigError(f"{where}: kv_lora_rank={data['kv_lora_rank']!r}: multi-head latent attention "
                          f"(DeepSeek-V2/V3) is not modelled (its KV cache is not GQA's); use a GQA model")
    given = [k for k in EXPERT_COUNT_KEYS if data.get(k)]
    if not given:
        return MoEFields()
    if len(given) > 1:
        raise ConfigError(f"{where}: both {given[0]} and {given[1]} are set; keep the one of the model's family")
    key = given[0]
    experts = count(data, key, where=where, maximum=1 << 16)
    top_k = count(data, "num_experts_per_tok", where=where, maximum=experts)
    if key == "num_local_experts" and data.get("moe_intermediate_size") is None:
        # Mixtral: every expert is a full-width MLP (transformers 5 also writes Qwen3-MoE's count under
        # this key, with its moe_intermediate_size)
        if intermediate_size is None:
            raise ConfigError(f"{where}: num_local_experts needs 'intermediate_size' (each expert's width)")
        expert_ffn = intermediate_size
    else:
        expert_ffn = count(data, "moe_intermediate_size", where=where, maximum=1 << 22)
    shared = 0
    if key == "n_routed_experts":
        n_shared = count(data, "n_shared_experts", where=where, default=0, minimum=0, maximum=1 << 10)
        shared = n_shared * expert_ffn
        first_dense = count(data, "first_k_dense_replace", where=where, default=0, minimum=0, maximum=num_layers)
        layers = tuple(range(first_dense, num_layers))
    else:
        shared = count(data, "shared_expert_intermediate_size", where=where, default=0, minimum=0,
                       maximum=1 << 22) if data.get("shared_expert_intermediate_size") else 0
        step = count(data, "decoder_sparse_step", where=where, default=1, maximum=max(1, num_layers))
        dense_only = data.get("mlp_only_layers") or []
        if not isinstance(dense_only, list) or not all(
                isinstance(i, int) and not isinstance(i, bool) and 0 <= i < num_layers for i in dense_only):
            raise ConfigError(f"{where}: 'mlp_only_layers' must be a list of layer indices in [0, {num_layers}), "
                              f"got {dense_only!r}")
        layers = tuple(i for i in range(num_layers) if i not in set(dense_only) and (i + 1) % step == 0)
    if not layers:
        raise ConfigError(f"{where}: {key}={experts} but no layer is a MoE layer (check decoder_sparse_step, "
                          f"mlp_only_layers or first_k_dense_replace)")
    return MoEFields(num_experts=experts, top_k=top_k, expert_ffn=expert_ffn, shared_ffn=shared,
                     moe_layers=layers, norm_topk_prob=flag(data, "norm_topk_prob", where=where))
