"""Mixture-of-experts costs for the simulator: expert parameters per rank, touched experts, all-to-all (the experts' GEMM efficiency is `Efficiency.train_expert_gemm_efficiency`).

A MoE layer (`vime.sim.models.ModelSpec` with ``num_experts > 0``) replaces the dense MLP by a
router (hidden × experts, replicated), ``num_experts`` routed experts of ``moe_ffn_hidden_size``
each (SwiGLU: gate, up, down) and optionally shared experts that every token passes through.

Sharding follows Megatron-core: the attention and shared experts are split over TP; the routed
experts over EP (whole experts) × ETP (each expert's width), and their gradients and optimizer
state over the expert-data-parallel group world / (EP · ETP · PP). vLLM without expert
parallelism splits every expert over its TP ranks; with ``--enable-expert-parallel`` it places
whole experts on the engine's ranks: the bytes per rank are the same either way, the collectives
are not (an all-reduce after the MLP against a dispatch and a combine all-to-all).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from vime.errors import ConfigError

if TYPE_CHECKING:
    from vime.sim.hardware import HardwareSpec
    from vime.sim.models import ModelSpec

#: Tokens the busiest EP rank's experts receive over the mean (router load imbalance). With an
#: auxiliary load-balancing loss the hottest expert gets ~1.2-1.5× the mean; a rank holding E/EP
#: experts averages that out: 1.15 is the default, --moe-load-imbalance changes it.
DEFAULT_LOAD_IMBALANCE = 1.15


def expected_distinct_experts(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts `tokens` tokens route to in one layer, each choosing `top_k` of
    `num_experts` uniformly: E · (1 − (1 − k/E)^B). One token touches k; B → ∞ touches all E."""
    if num_experts <= 0:
        return 0.0
    if tokens <= 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


def touched_fraction(model: ModelSpec, tokens: float) -> float:
    """The fraction of a MoE layer's expert weights an iteration of `tokens` tokens reads (1 for dense)."""
    if not model.num_experts:
        return 1.0
    return expected_distinct_experts(model.num_experts, model.moe_top_k, tokens) / model.num_experts


def rows_per_expert(model: ModelSpec, tokens: float, *, tp: int, cp: int, ep: int, etp: int) -> float:
    """Routed rows each local expert of an EP rank gets from a micro-batch of `tokens` tokens, routing balanced: every
    EP rank's tokens send k copies spread over E experts, a rank holds E/EP of them; ETP ranks below TP split the
    tokens TP/ETP ways first (sequence-parallel shards)."""
    if not model.num_experts:
        return 0.0
    return tokens * model.moe_top_k * ep * etp / (cp * tp * model.num_experts)


def grouped_gemm_row_factor(rows: float, rows_half: float) -> float:
    """The share of its large-batch rate a grouped GEMM reaches at `rows` rows per expert: r / (r + r½); 1 when
    `rows_half` is 0 (no row dependence modelled) or there are no rows (no work to slow)."""
    if rows_half <= 0 or rows <= 0:
        return 1.0
    return rows / (rows + rows_half)


def expert_params(model: ModelSpec) -> int:
    """Parameters of one routed expert: gate, up and down projections (up and down without gating)."""
    return (3 if model.gated_mlp else 2) * model.hidden_size * model.moe_ffn_hidden_size


def _shared_params(model: ModelSpec, tp: int) -> int:
    return (3 if model.gated_mlp else 2) * model.hidden_size * model.shared_expert_ffn_size // tp


def moe_mlp_params(model: ModelSpec, tp: int = 1, ep: int = 1, etp: int = 1) -> int:
    """A MoE layer's MLP parameters on one rank: the router, its E/EP experts split over ETP, the shared experts over TP."""
    return (model.hidden_size * model.num_experts + model.num_experts // ep * expert_params(model) // etp
            + _shared_params(model, tp))


def expert_params_per_rank(model: ModelSpec, ep: int = 1, etp: int = 1, layers: int | None = None) -> int:
    """Routed-expert parameters on one rank over `layers` MoE layers (None: all of them)."""
    n = len(model.moe_layers) if layers is None else layers
    return n * (model.num_experts // ep) * expert_params(model) // etp


def active_mlp_params(model: ModelSpec) -> int:
    """A MoE layer's MLP parameters one token uses: the router, k experts and the shared experts."""
    return model.hidden_size * model.num_experts + model.moe_top_k * expert_params(model) + _shared_params(model, 1)


def expert_flops_per_token(model: ModelSpec) -> float:
    """Forward FLOPs of the routed experts for one token, whole model: 2 · MoE layers · k · expert params."""
    return 2.0 * len(model.moe_layers) * model.moe_top_k * expert_params(model)


def moe_activation_bytes_per_token(model: ModelSpec, tp: int = 1, etp: int = 1, imbalance: float = 1.0) -> float:
    """What one MoE layer's MLP keeps on one rank per token of the micro-batch, for the backward.

    With sequence parallelism a rank routes tokens / TP tokens; the token-expert pairs spread over
    the ranks, so a rank's experts receive k · ETP / TP pairs per token (ETP > 1 gathers them over
    the expert-TP group, each rank computing 1/ETP of the width), the busiest rank `imbalance` ×
    that. Kept: the router's fp32 logits and probabilities (8·E per routed token), each pair's
    dispatched input and expert output (2·b·h, the output for the probability-weighted combine),
    gate, up and down inputs (3·b·f / ETP; SwiGLU); the shared experts as a dense MLP over TP.
    """
    b, h, k, f = model.dtype_bytes, model.hidden_size, model.moe_top_k, model.moe_ffn_hidden_size
    per_pair = 2 * b * h + (3 if model.gated_mlp else 2) * b * f / etp
    routed = per_pair * k * etp / tp * imbalance
    shared = (3 if model.gated_mlp else 2) * b * model.shared_expert_ffn_size / tp
    return 8.0 * model.num_experts / tp + routed + shared


def alltoall_seconds(hw: HardwareSpec, nbytes: float, group: int, *, inter_node: bool) -> float:
    """One all-to-all in which each rank sends `nbytes` in total: (g−1)/g of them leave the rank, at
    the per-GPU link rate (NVLink, or the inter-node link when the group spans nodes), plus one
    collective latency; the volume is a ring all-gather's, so its formula is reused."""
    return hw.allgather_seconds(nbytes, group, inter_node=inter_node)


def dispatch_combine_seconds(model: ModelSpec, hw: HardwareSpec, tokens: float, ep: int, *,
                             inter_node: bool, layers: int) -> float:
    """Forward dispatch + combine of `tokens` tokens over `layers` MoE layers in an EP group: each
    token's hidden state goes to its k experts and comes back (2 all-to-alls of tokens·k·h bytes)."""
    if ep <= 1 or layers <= 0 or tokens <= 0:
        return 0.0
    nbytes = tokens * model.moe_top_k * model.hidden_size * model.dtype_bytes
    return 2 * layers * alltoall_seconds(hw, nbytes, ep, inter_node=inter_node)


def hf_moe_shapes(model: ModelSpec, prefix: str) -> list[tuple[str, tuple[int, ...]]]:
    """A MoE layer's MLP tensors under their Hugging Face names (`prefix` = "model.layers.i.mlp."):
    the router, every expert's projections, the shared experts'."""
    h, f, fs = model.hidden_size, model.moe_ffn_hidden_size, model.shared_expert_ffn_size
    out: list[tuple[str, tuple[int, ...]]] = [(prefix + "gate.weight", (model.num_experts, h))]
    for j in range(model.num_experts):
        e = f"{prefix}experts.{j}."
        if model.gated_mlp:
            out.append((e + "gate_proj.weight", (f, h)))
        out += [(e + "up_proj.weight", (f, h)), (e + "down_proj.weight", (h, f))]
    if fs:
        s = prefix + "shared_experts."
        if model.gated_mlp:
            out.append((s + "gate_proj.weight", (fs, h)))
        out += [(s + "up_proj.weight", (fs, h)), (s + "down_proj.weight", (h, fs))]
    return out


def vllm_moe_allocations(model: ModelSpec, tp: int) -> list[int]:
    """Bytes of a MoE layer's MLP tensors on one vLLM rank: the router, the fused gate/up (w13) and
    down (w2) weights of all local experts (1/TP of them, split by width or by expert), the shared experts."""
    b, h = model.dtype_bytes, model.hidden_size
    per = expert_params(model) * model.num_experts // tp
    up = per * (2 if model.gated_mlp else 1) // (3 if model.gated_mlp else 2)
    out = [b * h * model.num_experts, b * up, b * (per - up)]
    if model.shared_expert_ffn_size:
        out.append(b * _shared_params(model, tp))
    return out


def effective_expert_tp(tp: int, ep: int, etp: int | None) -> int:
    """--expert-tensor-parallel-size when given; else 1 with expert parallelism (what slime's MoE
    recipes pass: whole experts per rank, TP for attention only) and TP without (Megatron's default)."""
    if etp is not None:
        return etp
    return 1 if ep > 1 else tp


def check_expert_parallel(model: ModelSpec, *, world: int, tp: int, pp: int, ep: int, etp: int) -> None:
    """Megatron's rules for the expert layout: EP divides the experts, ETP the expert width, and
    ETP × EP × PP the trainer's GPUs; a dense model takes EP = ETP = 1 only."""
    flags = f"--expert-model-parallel-size {ep} × --expert-tensor-parallel-size {etp}"
    if not model.num_experts:
        if ep != 1 or etp != tp:
            raise ConfigError(f"{flags}: model {model.name} is dense (no experts); leave both unset for it")
        return
    if model.num_experts % ep:
        raise ConfigError(f"--expert-model-parallel-size {ep} does not divide the {model.num_experts} experts of "
                          f"{model.name}; use a divisor of {model.num_experts}")
    if model.moe_ffn_hidden_size % etp:
        raise ConfigError(f"--expert-tensor-parallel-size {etp} does not divide the expert width "
                          f"{model.moe_ffn_hidden_size} of {model.name}; use a divisor of it")
    if world % (ep * etp * pp):
        raise ConfigError(f"{flags} × --pipeline-model-parallel-size {pp} = {ep * etp * pp} does not divide the "
                          f"{world} actor GPUs; choose sizes whose product divides {world}")


def check_engine_expert_parallel(model: ModelSpec, engine_gpus: int) -> None:
    """vLLM's --enable-expert-parallel spreads the experts over the engine's GPUs: they must divide the expert count."""
    if not model.num_experts:
        raise ConfigError(f"--enable-expert-parallel: model {model.name} is dense (no experts); drop the flag")
    if model.num_experts % engine_gpus:
        raise ConfigError(f"--enable-expert-parallel: {model.num_experts} experts of {model.name} do not split over "
                          f"--rollout-num-gpus-per-engine {engine_gpus}; use a divisor of {model.num_experts}")


def expert_data_parallel(world: int, pp: int, ep: int, etp: int) -> int:
    """Ranks that hold the same experts and share their gradient reduction and optimizer shards."""
    return max(1, world // (ep * etp * pp))


class MoELayers:
    """The MoE side of `vime.sim.models.ModelSpec` (a mixin, no fields): which layers are MoE, the active parameters."""

    name: str
    num_layers: int
    num_experts: int
    moe_top_k: int
    moe_ffn_hidden_size: int
    moe_layers: tuple[int, ...]
    dtype_bytes: int

    if TYPE_CHECKING:
        def num_params(self) -> int: ...

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    def _check_moe(self) -> None:
        if self.num_experts and not (0 < self.moe_top_k <= self.num_experts and self.moe_ffn_hidden_size > 0
                                     and self.moe_layers):
            raise ConfigError(f"model {self.name}: {self.num_experts} experts need 0 < top-k ≤ experts, an expert "
                              f"width and MoE layers; got top-k {self.moe_top_k}, width {self.moe_ffn_hidden_size}")

    def _stage_layers(self, pp: int, stage: int) -> range:
        """The layer indices of pipeline `stage` (the first stages get the remainder)."""
        base, extra = divmod(self.num_layers, pp)
        start = stage * base + min(stage, extra)
        return range(start, start + base + (1 if stage < extra else 0))

    def _moe_count(self, layers: range) -> int:
        return sum(1 for i in self.moe_layers if i in layers)

    def layers_in_stage(self, pp: int = 1, stage: int = 0) -> int:
        """Layers on pipeline `stage` of `pp`."""
        return len(self._stage_layers(pp, stage))

    def moe_layers_in_stage(self, pp: int = 1, stage: int = 0) -> int:
        """MoE layers on pipeline `stage` of `pp`."""
        return self._moe_count(self._stage_layers(pp, stage))

    def moe_layers_per_stage(self, pp: int = 1) -> int:
        """MoE layers on the busiest pipeline stage of `pp` (one pipeline slot's)."""
        return max(self.moe_layers_in_stage(pp, s) for s in range(pp))

    def num_active_params(self) -> int:
        """Parameters one token uses: all of a dense model's; a MoE layer's router, top-k and shared experts."""
        spec = cast("ModelSpec", self)
        return self.num_params() - len(self.moe_layers) * (moe_mlp_params(spec) - active_mlp_params(spec))

    def expert_weight_bytes(self, tp: int = 1) -> int:
        """The routed experts' share of `weight_bytes` (0 for a dense model): what decode reads only where touched."""
        return expert_params_per_rank(cast("ModelSpec", self), 1, tp) * self.dtype_bytes

