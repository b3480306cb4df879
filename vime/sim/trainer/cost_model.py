"""One actor group's cost and bytes model: state and activation bytes per GPU, and the seconds of each part of a step."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from vime.errors import ConfigError
from vime.sim import moe
from vime.sim.trainer.costs import (
    CHECKPOINT_BYTES_PER_S,
    compute_seconds,
    loss_stream_bytes_per_token,
    optimizer_step_bytes,
    streaming_bytes_per_s,
)
from vime.sim.trainer.footprint import (
    OPTIMIZER_BYTES,
    PARAM_BYTES,
    TAG_CONTEXT,
    grad_bytes,
    loss_transient_bytes,
    optimizer_transient_bytes,
    rope_bytes,
    score_bytes,
    software_terms,
    step_residue_bytes,
    trainer_context_bytes,
)
from vime.sim.trainer.layout import Layout

if TYPE_CHECKING:
    from vime.config import ClusterConfig, ParallelConfig
    from vime.sim.hardware import HardwareSpec
    from vime.sim.models import ModelSpec, Recompute
    from vime.types import TrainBatch

#: One weight-sync bucket: HF names, shapes, bytes.
Bucket = tuple[list[str], list[tuple[int, ...]], int]



@functools.lru_cache(maxsize=256)
def hf_tensor_count(model: ModelSpec) -> int:
    """How many HF tensors an export of `model` moves (a MoE's per-expert tensors included); cached: a search asks per point."""
    return len(model.hf_weight_shapes())


def export_host_seconds(model: ModelSpec, hw: HardwareSpec) -> float:
    """The trainer's host work around one weight export: once, and per HF tensor (efficiency.export_*)."""
    return hw.efficiency.export_call_s + hw.efficiency.export_per_tensor_s * hf_tensor_count(model)


class ActorCostModel:
    """What the actor group's state takes on each GPU and how long each part of its step lasts.

    Pure: it depends on the placement and parallel options, the model, the hardware and the layout
    only, and changes nothing. `SimTrainer` extends it with memory on the cluster's GPUs and the
    virtual clock. ``recompute``: none / selective / full activation recomputation.
    MoE models: routed experts split over EP × ETP, their grads reduced and their optimizer state
    sharded over the expert-data-parallel ranks; `moe_load_imbalance` is the busiest rank's share.
    """

    def __init__(self, placement: ClusterConfig, parallel: ParallelConfig, model: ModelSpec, hardware: HardwareSpec,
                 num_gpus: int, *, recompute: Recompute | None = None, reference: bool = False,
                 reference_on_host: bool = False, moe_load_imbalance: float | None = None) -> None:
        self.model = model
        # The KL loss's frozen reference model: a second bf16 copy of the model on each rank, in the params
        # tag (vime/real/megatron/reference.py), so it sleeps and wakes with the policy's weights; or, with
        # --ref-placement host, in pinned host memory and on the GPU only for its forward.
        self.reference = reference
        self.reference_on_host = reference and reference_on_host
        self.hw = hardware
        self.layout = Layout.of(placement, parallel, num_gpus)
        # (a pricing-only caller may pass a placement without the sleep options: a trainer that never sleeps)
        self.offload_train = bool(getattr(placement, "offload_train", False))
        self.offload_plan = getattr(placement, "train_offload_plan", "all")
        lay = self.layout
        self.ep = int(getattr(parallel, "expert_model_parallel_size", 1) or 1)
        self.etp = moe.effective_expert_tp(lay.tp, self.ep, getattr(parallel, "expert_tensor_parallel_size", None))
        moe.check_expert_parallel(model, world=lay.world, tp=lay.tp, pp=lay.pp, ep=self.ep, etp=self.etp)
        self.imbalance = moe.DEFAULT_LOAD_IMBALANCE if moe_load_imbalance is None else float(moe_load_imbalance)
        #: ranks sharing the same experts: their grads are reduced and their optimizer state sharded over them
        self.expert_dp = moe.expert_data_parallel(lay.world, lay.pp, self.ep, self.etp)
        self.nodes = placement.actor_num_nodes
        if recompute is None:  # what --recompute-granularity asks for
            recompute = parallel.recompute_granularity or "none"
        if recompute not in ("none", "selective", "full"):
            raise ConfigError(f"recompute must be none, selective or full, got {recompute!r}")
        self.recompute: Recompute = recompute
        self.distributed_optimizer = parallel.use_distributed_optimizer
        self.grad_bytes = grad_bytes(bool(getattr(parallel, "grad_reduce_in_bf16", False)))
        # --sequence-parallel (resolved: on when TP > 1 unless --no-sequence-parallel) splits the norm and
        # dropout activations over the TP ranks
        sp = getattr(parallel, "sequence_parallel", None)
        self.sequence_parallel = self.layout.tp > 1 if sp is None else bool(sp) and self.layout.tp > 1

    # --- bytes -----------------------------------------------------------------------------------
    def params_per_gpu(self) -> list[int]:
        """Parameters held by the rank on each actor GPU (its TP shard of its pipeline stage)."""
        lay = self.layout
        return [self.model.params_per_rank(lay.tp, lay.pp, lay.coords(r)[3], ep=self.ep, etp=self.etp)
                for r in range(lay.world)]

    def expert_params_per_gpu(self) -> list[int]:
        """The routed-expert part of `params_per_gpu` (0 for a dense model)."""
        lay, m = self.layout, self.model
        if not m.is_moe:
            return [0] * lay.world
        per_stage = [moe.expert_params_per_rank(m, self.ep, self.etp, m.moe_layers_in_stage(lay.pp, s))
                     for s in range(lay.pp)]
        return [per_stage[lay.coords(r)[3]] for r in range(lay.world)]

    def _optimizer_shards(self) -> list[int]:
        """Parameters of the optimizer shard on each GPU: the dense part over DP × CP, the experts over
        the expert-data-parallel ranks (the distributed optimizer); everything without it."""
        if not self.distributed_optimizer:
            return self.params_per_gpu()
        shard = self.layout.dp * self.layout.cp
        return [math.ceil((p - e) / shard) + math.ceil(e / self.expert_dp)
                for p, e in zip(self.params_per_gpu(), self.expert_params_per_gpu(), strict=True)]

    def state_bytes_per_gpu(self) -> dict[str, list[int]]:
        """Bytes per tag on each actor GPU when awake and idle: params, grads, optimizer."""
        params = self.params_per_gpu()
        copies = 2 if self.reference and not self.reference_on_host else 1
        return {
            "params": [p * PARAM_BYTES * copies for p in params],
            "grads": [p * self.grad_bytes for p in params],
            "optimizer": [p * OPTIMIZER_BYTES for p in self._optimizer_shards()],
        }

    def memory_plan(self, microbatch_tokens: int, lengths: Sequence[int] | None = None) -> dict[str, int]:
        """Peak bytes per tag on the busiest actor GPU while training a micro-batch of `microbatch_tokens`
        tokens (context, params, grads, optimizer, activations with the in-flight PP micro-batches);
        `lengths` are its sequences (None: one sequence), which matter with unfused attention."""
        state = self.state_bytes_per_gpu()
        plan = {TAG_CONTEXT: trainer_context_bytes(self.hw)}
        plan.update({tag: max(sizes) for tag, sizes in state.items()})
        # The optimizer step's temporaries come after the activations are freed: the larger of the two.
        plan["activations"] = max(self.activation_bytes(microbatch_tokens, lengths) * self.layout.pp  # ≤ PP in flight
                                  + self.loss_transient_bytes(microbatch_tokens),
                                  max(self.optimizer_transient_per_gpu(), default=0))
        plan["total"] = sum(plan.values())
        return plan

    def policy_param_bytes_per_gpu(self) -> list[int]:
        """The policy's own weights on each actor GPU (the params tag without a reference model)."""
        return [p * PARAM_BYTES for p in self.params_per_gpu()]

    def reference_copy_seconds(self) -> float:
        """A host-placed reference's weights to every actor GPU at once (each rank its shard, its own link)."""
        return max(self.policy_param_bytes_per_gpu(), default=0) / self.hw.h2d_bytes_per_s

    def optimizer_transient_per_gpu(self) -> list[int]:
        """Bytes the optimizer step allocates on each actor GPU on top of the state (its shard's)."""
        per = optimizer_transient_bytes(self.hw, self.grad_bytes)
        return [p * per for p in self._optimizer_shards()]

    def activation_bytes(self, tokens: int, lengths: Sequence[int] | None = None) -> int:
        """Activation bytes one micro-batch of `tokens` tokens keeps on one rank (in-flight micro-batches
        included); with unfused attention also the s² scores of its sequences `lengths` (None: one
        sequence), with unfused elementwise kernels the RoPE tables."""
        lay = self.layout
        per_token = self.model.activation_bytes_per_token(lay.tp, lay.pp, self.recompute,
                                                          sequence_parallel=self.sequence_parallel,
                                                          **software_terms(self.hw), etp=self.etp,
                                                          imbalance=self._imbalance())
        seqs = [tokens] if lengths is None else lengths
        extra = (score_bytes(self.model, self.hw, seqs, lay.tp, lay.pp, self.recompute)
                 + rope_bytes(self.model, self.hw, seqs, lay.pp, self.recompute))
        return int((per_token * tokens + extra) / lay.cp)

    def step_residue_bytes(self, batch: TrainBatch) -> int:
        """What the first train step on `batch` leaves mapped on each rank (`footprint.step_residue_bytes`,
        over the micro-batches of every DP rank and optimizer step)."""
        mbs = [[rb.total_lengths[i] for i in mb]
               for rb in (batch.for_rank(r) for r in range(batch.dp_size))
               for step in range(batch.schedule.num_steps) for mb in rb.micro_batches(step)]
        return step_residue_bytes(self.model, self.hw, mbs, self.layout.tp)

    def loss_transient_bytes(self, tokens: int) -> int:
        """What the policy loss of a training micro-batch of `tokens` tokens allocates for a moment on top of
        its activations (`footprint.loss_transient_bytes`; once per stage, not per in-flight micro-batch)."""
        return int(loss_transient_bytes(self.model, tokens, self.layout.tp, self.layout.cp))

    def checkpoint_bytes(self) -> int:
        """Bytes of one checkpoint: the bf16 model once plus the Adam state once (not per replica)."""
        lay = self.layout
        if self.model.is_moe:  # experts and dense parts are replicated over different groups: count once
            return self.model.num_params() * (PARAM_BYTES + OPTIMIZER_BYTES)
        state = self.state_bytes_per_gpu()
        replicas = lay.dp * lay.cp
        opt_copies = 1 if self.distributed_optimizer else replicas
        return sum(self.policy_param_bytes_per_gpu()) // replicas + sum(state["optimizer"]) // opt_copies

    def export_bytes(self) -> int:
        """Total bytes `export_weights` yields (the bf16 model)."""
        return self.model.num_params() * self.model.dtype_bytes

    def _buckets(self, bucket_bytes: int) -> list[Bucket]:
        """HF tensors packed in order into buckets of at most `bucket_bytes` (a larger tensor alone)."""
        out: list[Bucket] = []
        names: list[str] = []
        shapes: list[tuple[int, ...]] = []
        size = 0
        for name, shape in self.model.hf_weight_shapes():
            n = math.prod(shape) * self.model.dtype_bytes
            if names and size + n > bucket_bytes:
                out.append((names, shapes, size))
                names, shapes, size = [], [], 0
            names.append(name)
            shapes.append(shape)
            size += n
        if names:
            out.append((names, shapes, size))
        return out

    # --- time ------------------------------------------------------------------------------------
    def _compute_and_comm(self, lengths: Sequence[int], *, training: bool) -> tuple[float, float]:
        """(forward, backward) of one micro-batch in one pipeline slot (the busiest stage's share), each with the
        forward's TP collectives; `training`: a training pass (its loss takes the entropy too), else a log-prob forward."""
        lay = self.layout
        local = self.model.num_experts // self.ep if self.model.is_moe else 0
        e_fwd, a2a = self._moe_seconds(lengths) if self.model.is_moe else (0.0, 0.0)
        tokens = sum(lengths) / lay.cp
        # the loss's traffic over the vocabulary: the last stage's, once per micro-batch
        stream = streaming_bytes_per_s(self.hw)
        l_fwd, l_bwd = (tokens * b / stream for b in loss_stream_bytes_per_token(self.model, self.hw, lay.tp,
                                                                                 training=training))
        # the experts' slow GEMMs and the loss's traffic are GPU time: under the CPU floor, not after it
        extra = (e_fwd + l_fwd, self.hw.efficiency.train_backward_factor * e_fwd + l_bwd)
        fwd, bwd = compute_seconds(self.model, self.hw, lengths, lay.tp * lay.pp * lay.cp, local, extra,
                                   pp=lay.pp)
        # Sequence parallelism: 2 all-gathers + 2 reduce-scatters of tokens·h per layer forward; the result is one
        # pipeline slot (compute over TP·PP ranks), so the busiest stage's layers, not all of them
        act = tokens * self.model.hidden_size * self.model.dtype_bytes
        comm = 4 * self.model.layers_per_stage(lay.pp) * self.hw.allgather_seconds(
            act, lay.tp, inter_node=lay.tp_crosses_nodes)
        return fwd + a2a + comm, bwd + a2a + 2.0 * comm

    def _moe_seconds(self, lengths: Sequence[int]) -> tuple[float, float]:
        """(extra expert compute, dispatch + combine) of one micro-batch's forward on a MoE model.

        `compute_seconds` already counts the experts' FLOPs at the dense rate, spread evenly; the
        busiest EP rank gets `imbalance` × the mean tokens and its expert GEMMs run at
        `efficiency.train_expert_gemm_efficiency` of a dense GEMM, times r / (r + `train_expert_rows_half`) for the r
        rows each of its experts gets, which adds expert time × (imbalance / efficiency − 1).
        Each MoE layer of the busiest stage sends every token's k copies out and back (sequence-parallel shards of
        tokens / (TP · CP) per rank) over the EP group, which crosses nodes when ETP × EP does;
        the backward repeats the two all-to-alls."""
        lay, m = self.layout, self.model
        tokens = sum(lengths)
        ranks = lay.tp * lay.pp * lay.cp
        expert = moe.expert_flops_per_token(m) * tokens / (ranks * self.hw.train_flops)
        eff = self.hw.efficiency
        rows = moe.rows_per_expert(m, tokens, tp=lay.tp, cp=lay.cp, ep=self.ep, etp=self.etp) * self._imbalance()
        efficiency = eff.train_expert_gemm_efficiency * moe.grouped_gemm_row_factor(rows, eff.train_expert_rows_half)
        extra = expert * (self._imbalance() / efficiency - 1.0)
        per_rank_tokens = tokens / (lay.tp * lay.cp)
        a2a = moe.dispatch_combine_seconds(m, self.hw, per_rank_tokens, self.ep, layers=m.moe_layers_per_stage(lay.pp),
                                           inter_node=self.ep * self.etp > lay.gpus_per_node)
        return extra, a2a * self._imbalance()

    def _imbalance(self) -> float:
        """The busiest EP rank's share of routed tokens over the mean: 1 without expert parallelism (one rank gets them all)."""
        return self.imbalance if self.ep > 1 else 1.0

    def _microbatch_seconds(self, lengths: Sequence[int], *, backward: bool) -> tuple[float, float]:
        fwd, bwd = self._compute_and_comm(lengths, training=backward)
        if not backward:
            return fwd, 0.0
        if self.recompute == "full":
            bwd += fwd
        return fwd, bwd

    def _optimizer_seconds(self) -> float:
        lay = self.layout
        params = max(self.params_per_gpu())
        shard = lay.dp * lay.cp if self.distributed_optimizer else 1
        grads = params * self.grad_bytes
        net = lay.dp_crosses_nodes
        # Megatron's DDP reduces the grads in buckets of max(40M, 1M·DP) parameters, one call each.
        buckets = max(1, math.ceil(params / max(40_000_000, 1_000_000 * lay.dp * lay.cp)))
        experts = max(self.expert_params_per_gpu())
        if experts:  # the experts reduce over their own data-parallel group, after the dense part
            reduce, gather = self._grad_sync_seconds(experts, self.expert_dp,
                                                     lay.world // lay.pp > lay.gpus_per_node)
            dense_reduce, dense_gather = self._grad_sync_seconds(params - experts, lay.dp * lay.cp, net)
            reduce, gather = reduce + dense_reduce, gather + dense_gather
        elif self.distributed_optimizer:
            reduce = self.hw.allgather_seconds(grads, lay.dp * lay.cp, inter_node=net, calls=buckets)  # reduce-scatter
            gather = self.hw.allgather_seconds(params * PARAM_BYTES, lay.dp * lay.cp, inter_node=net, calls=buckets)
        else:
            reduce, gather = self.hw.allreduce_seconds(grads, lay.dp * lay.cp, inter_node=net, calls=buckets), 0.0
        shard_params = max(self._optimizer_shards()) if experts else math.ceil(params / shard)
        step = shard_params * optimizer_step_bytes(self.hw, self.grad_bytes) / streaming_bytes_per_s(self.hw)
        host = self.hw.efficiency.train_host_step_s
        step = max(step, host) if self.hw.host_overlaps_compute else step + host
        return reduce + step + gather

    def _grad_sync_seconds(self, params: int, group: int, inter_node: bool) -> tuple[float, float]:
        """(grad reduce, param gather) of `params` parameters over a data-parallel `group` (MoE models)."""
        buckets = max(1, math.ceil(params / max(40_000_000, 1_000_000 * group)))
        grads = params * self.grad_bytes
        if self.distributed_optimizer:
            return (self.hw.allgather_seconds(grads, group, inter_node=inter_node, calls=buckets),
                    self.hw.allgather_seconds(params * PARAM_BYTES, group, inter_node=inter_node, calls=buckets))
        return self.hw.allreduce_seconds(grads, group, inter_node=inter_node, calls=buckets), 0.0

    def _backup_seconds(self) -> float:
        """The weight backup (seed step 41): the largest rank's params device → host."""
        return max(self.policy_param_bytes_per_gpu()) / self.hw.d2h_bytes_per_s

    def _bucket_seconds(self, nbytes: int) -> float:
        """Staging one weight bucket: each rank's shard host → device, then the TP all-gather of full tensors."""
        lay = self.layout
        seconds = nbytes / (lay.tp * lay.pp) / self.hw.h2d_bytes_per_s + self.hw.allgather_seconds(nbytes / lay.pp, lay.tp)
        if self.model.is_moe and self.ep > 1:  # the experts' share is gathered over the EP group too
            share = moe.expert_params_per_rank(self.model) / self.model.num_params()
            seconds += self.hw.allgather_seconds(nbytes * share / lay.pp, self.ep,
                                                 inter_node=self.ep * self.etp > lay.gpus_per_node)
        return seconds

    def _convert_seconds(self) -> float:
        """The host work of an export (once, and per HF tensor) and its HF conversion: each rank cuts q, k, v out of
        its staged fused QKV weights on the GPU (read and written once at HBM speed; the fused bytes cross the host
        link as the bucket's)."""
        m = self.model
        qkv = m.num_layers * m.hidden_size * (m.num_attention_heads + 2 * m.num_kv_heads) * m.head_dim * m.dtype_bytes
        return export_host_seconds(m, self.hw) + 2 * qkv / self.layout.pp / self.hw.hbm_bytes_per_s

    def _checkpoint_seconds(self) -> float:
        return self.checkpoint_bytes() / (CHECKPOINT_BYTES_PER_S * self.nodes)
