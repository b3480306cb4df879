"""HF ↔ Megatron-core names and layouts of MoE layers (router, routed experts, shared experts), and their EP/ETP shards.

Megatron-core's MoE layer (local spec, ``moe_grouped_gemm`` off: `SequentialMLP`) holds, per layer:

- ``mlp.router.weight`` [E, h]: HF ``mlp.gate.weight`` (Qwen-MoE, Mixtral's ``block_sparse_moe.gate``
  is not mapped), replicated on every rank;
- ``mlp.experts.local_experts.{j}.linear_fc1.weight`` [2f, h] = [gate; up] of expert j and
  ``...linear_fc2.weight`` [h, f] = its down projection: HF ``mlp.experts.{j}.gate_proj/up_proj/down_proj``;
- ``mlp.shared_experts.linear_fc1/linear_fc2.weight``: HF ``mlp.shared_experts.*`` (GLM-4-MoE's
  spelling; Qwen2-MoE's ``shared_expert`` too).

"Megatron full" names experts by their global index j (0..E−1). Expert parallelism gives rank
r of EP the experts [r·E/EP, (r+1)·E/EP) under local indices 0..E/EP−1 (`to_local` / `to_global`);
expert tensor parallelism splits each expert's fc1/fc2 as TP splits a dense MLP, so
`vime.real.megatron.model.shard` / `unshard` apply to them with ETP in place of TP.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import torch

_ROUTER = "mlp.router.weight"
_EXPERT = re.compile(r"^mlp\.experts\.local_experts\.(\d+)\.(linear_fc1|linear_fc2)\.weight$")
_SHARED = re.compile(r"^mlp\.shared_experts\.(linear_fc1|linear_fc2)\.weight$")
_HF_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_HF_SHARED = re.compile(r"^mlp\.shared_experts?\.(gate_proj|up_proj|down_proj)\.weight$")
#: Per-layer HF suffixes this module maps (the dense mapping hands them over).
HF_PREFIXES = ("mlp.gate.weight", "mlp.experts.", "mlp.shared_expert.", "mlp.shared_experts.")
MEGATRON_PREFIXES = ("mlp.router.", "mlp.experts.", "mlp.shared_experts.")


def megatron_to_hf(layer: str, rest: str, full: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """HF (name, tensor) pairs of one Megatron-full MoE tensor of layer prefix `layer` ("model.layers.i.")."""
    if rest == _ROUTER:
        return [(layer + "mlp.gate.weight", full)]
    m = _EXPERT.match(rest) or _SHARED.match(rest)
    if m is None:
        raise KeyError(f"no HF name for Megatron MoE parameter {rest!r}")
    base = f"{layer}mlp.experts.{m.group(1)}." if m.re is _EXPERT else f"{layer}mlp.shared_experts."
    if rest.endswith("linear_fc2.weight"):
        return [(base + "down_proj.weight", full)]
    gate, up = full.chunk(2, dim=0)
    return [(base + "gate_proj.weight", gate), (base + "up_proj.weight", up)]


def hf_to_megatron(layer: str, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Megatron-full tensors (suffixes under `layer`, "decoder.layers.i.") from one layer's HF MoE
    tensors (suffixes after "model.layers.i."); a missing gate or up projection raises."""
    out: dict[str, torch.Tensor] = {}
    fc1: dict[str, dict[str, torch.Tensor]] = {}
    for rest, t in tensors.items():
        if rest == "mlp.gate.weight":
            out[layer + _ROUTER] = t
            continue
        m = _HF_EXPERT.match(rest)
        if m:
            base, proj = f"{layer}mlp.experts.local_experts.{m.group(1)}.", m.group(2)
        else:
            s = _HF_SHARED.match(rest)
            if s is None:
                raise KeyError(f"HF MoE tensor {rest!r} has no Megatron counterpart")
            base, proj = f"{layer}mlp.shared_experts.", s.group(1)
        if proj == "down_proj":
            out[base + "linear_fc2.weight"] = t
        else:
            fc1.setdefault(base, {})[proj] = t
    for base, pieces in fc1.items():
        if {"gate_proj", "up_proj"} - pieces.keys():
            raise KeyError(f"{base}: HF checkpoint lacks gate_proj or up_proj")
        out[base + "linear_fc1.weight"] = torch.cat([pieces["gate_proj"], pieces["up_proj"]], dim=0)
    return out


def expert_index(name: str) -> int | None:
    """The expert index in a Megatron name (None for non-expert tensors)."""
    m = re.search(r"\.local_experts\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def _with_index(name: str, j: int) -> str:
    return re.sub(r"\.local_experts\.\d+\.", f".local_experts.{j}.", name, count=1)


def to_local(name: str, *, ep_rank: int, ep: int, num_experts: int) -> str | None:
    """The name EP rank `ep_rank` holds a Megatron-full expert tensor under, or None when another
    rank holds it; non-expert names are unchanged."""
    j = expert_index(name)
    if j is None:
        return name
    per = num_experts // ep
    return _with_index(name, j - ep_rank * per) if j // per == ep_rank else None


def to_global(name: str, *, ep_rank: int, ep: int, num_experts: int) -> str:
    """The Megatron-full name of EP rank `ep_rank`'s local expert tensor `name`."""
    j = expert_index(name)
    if j is None:
        return name
    return _with_index(name, ep_rank * (num_experts // ep) + j)


def hf_held(hf_name: str, *, ep_rank: int, ep: int, num_experts: int) -> bool:
    """Whether EP rank `ep_rank` needs HF tensor `hf_name` (any name but another rank's routed expert)."""
    m = re.search(r"\.mlp\.experts\.(\d+)\.", hf_name)
    return m is None or int(m.group(1)) // (num_experts // ep) == ep_rank


def ep_shards(full: Mapping[str, torch.Tensor], *, ep: int, num_experts: int) -> list[dict[str, torch.Tensor]]:
    """What each EP rank holds of a Megatron-full state (its experts under local names, the rest whole)."""
    if num_experts % ep:
        raise ValueError(f"EP {ep} does not divide {num_experts} experts")
    out: list[dict[str, torch.Tensor]] = []
    for r in range(ep):
        held = {}
        for name, t in full.items():
            local = to_local(name, ep_rank=r, ep=ep, num_experts=num_experts)
            if local is not None:
                held[local] = t
        out.append(held)
    return out


def ep_gather(shards: list[dict[str, torch.Tensor]], *, num_experts: int) -> dict[str, torch.Tensor]:
    """The Megatron-full state from every EP rank's (the non-expert tensors from rank 0)."""
    ep = len(shards)
    out: dict[str, torch.Tensor] = {}
    for r, held in enumerate(shards):
        for name, t in held.items():
            if expert_index(name) is None and r:
                continue
            out[to_global(name, ep_rank=r, ep=ep, num_experts=num_experts)] = t
    return out
