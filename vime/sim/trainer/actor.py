"""SimTrainer: the simulated Megatron actor group's protocol calls and lifecycle, with memory on the shared SimGPUs.

`SimTrainer` implements `vime.protocols.Trainer` for TP × PP × CP × DP ranks placed on the first
``actor_num_nodes × actor_num_gpus_per_node`` GPUs of a `SimCluster` (`Layout`). What it does, per
seed step (the bytes and seconds come from `ActorCostModel`):

- step 3 (`init`): CUDA context, bf16 params, fp32 main grads, fp32 master + Adam m, v (sharded
  over DP × CP with the distributed optimizer), a pinned host backup of the weights; asleep
  afterwards when ``offload_train``.
- step 37 (`wake_up`) / step 41 (`sleep`): params and optimizer offloaded to pinned host memory
  and back, grads discarded, through a `SimAllocator` at host-link speed with VMM costs.
- step 38: the old-log-prob forward over the whole batch only when `vime.algo.logprob_reuse`
  says the training forward cannot be reused.
- step 40: per DP rank (concurrently), per micro-batch: activations allocated for the
  micro-batch, fwd + bwd time; then gradient reduce-scatter, the optimizer step (its temporaries
  allocated meanwhile) and the parameter all-gather over DP. Freed activations stay in PyTorch's
  cache (the tag keeps its largest size) until the sleep empties it, or, on a resident trainer
  (no ``offload_train``), the end of the train call.
- step 41: the weight backup (device → host copy of each rank's params).
- step 48 (`export_weights`): HF-named, TP-gathered tensors packed into buckets; each bucket is
  staged on every actor GPU (a packed buffer the colocated engine reads over CUDA IPC) with the
  cost of its host → device copy and TP all-gather, and freed when the consumer asks for the next.

Times are virtual (`vime.sim.clock`); metrics are deterministic functions of the batch and the seed.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import AsyncIterator, Sequence
from typing import TYPE_CHECKING

from vime.errors import ConfigError, TrainerError
from vime.protocols import TRAINER_TAGS, TrainerLifecycle, TrainMetrics, WeightBucket
from vime.sim.memory import GiB, PinnedMode, SimAllocator, SimCluster, elapse
from vime.sim.trainer.cost_model import ActorCostModel
from vime.sim.trainer.footprint import (
    TAG_CONTEXT,
    TAG_REFERENCE,
    TAG_STEP_RESIDUE,
    TAG_WEIGHT_BACKUP,
    TAG_WEIGHT_BUFFER,
    trainer_context_bytes,
)
from vime.sim.trainer.sleep_extras import SleepWakeExtras, cache_at_least, empty_cache
from vime.tags import offload_plan_sets

if TYPE_CHECKING:
    from vime.config import AlgoConfig, ClusterConfig, ParallelConfig
    from vime.sim.models import ModelSpec, Recompute
    from vime.types import TrainBatch

OWNER = "actor"


def _pinned_mode(backend: str) -> PinnedMode:
    """--train-offload-backend: vime's CuMem allocator keeps its pinned host buffers (allocated once);
    torch_memory_saver pins host memory anew on every pause (vllm-project/vime #442/#444)."""
    return "cold" if backend == "torch_memory_saver" else "persistent"


class SimTrainer(ActorCostModel):
    """The actor group as one object (`vime.protocols.Trainer`), with memory on the cluster's GPUs.

    Construct, then ``await init()`` inside the simulation. ``pinned`` chooses how the offload
    buffers behave ("persistent": allocated once, vime's CuMem; "cold": torch_memory_saver,
    pinned again on every sleep). ``reuse_log_probs`` overrides the seed-step-38 decision
    (None: ask `vime.algo.logprob_reuse`). ``recompute``: none / selective / full activation
    recomputation. ``start_rollout_id`` is where a checkpoint made outside the simulation resumes.

    With ``use_kl_loss`` (or a non-zero ``kl_coef``) every train call also computes reference
    log-probs: one forward over the batch through the frozen reference model, which lives beside
    the policy as vime's real trainer keeps it (a second bf16 copy in the params tag: GPU memory
    while awake, copied to the host and back with the policy's weights when the trainer sleeps), or
    with ``--ref-placement host`` in pinned host memory, copied in for that forward and dropped.
    Not modelled: a critic, routing replay, and overlap of DP communication with the backward pass.
    """

    def __init__(self, placement: ClusterConfig, parallel: ParallelConfig, algo: AlgoConfig, model: ModelSpec,
                 cluster: SimCluster, *, seed: int, start_rollout_id: int = 0, name: str = OWNER,
                 pinned: PinnedMode | None = None, reuse_log_probs: bool | None = None,
                 recompute: Recompute | None = None, moe_load_imbalance: float | None = None) -> None:
        reference = algo.use_kl_loss or algo.kl_coef != 0.0
        super().__init__(placement, parallel, model, cluster.hardware, len(cluster.gpus), recompute=recompute,
                         reference=reference, reference_on_host=getattr(algo, "ref_placement", "gpu") == "host",
                         moe_load_imbalance=moe_load_imbalance)
        self.cluster = cluster
        self.name = name
        self.gpus = [cluster.gpus[g] for g in self.layout.gpus]
        #: colocated: weights are published by CUDA IPC from one persistent staging buffer (seed steps 48–50)
        self.colocated = bool(placement.colocate)
        self.staging_bytes = 0
        self.reference_model = reference
        self.reuse_log_probs = reuse_log_probs
        self.seed = seed
        self.start_rollout_id = start_rollout_id
        self.lifecycle = TrainerLifecycle(name)
        self.allocator = SimAllocator(name, self.gpus, self.hw, host=cluster.host, known_tags=TRAINER_TAGS,
                                      pinned=pinned or _pinned_mode(placement.train_offload_backend),
                                      recorder=cluster.recorder, env=cluster.env)
        offload_plan_sets(self.offload_plan)  # "auto" must be resolved before a trainer is built
        self.initialized = False
        self.train_calls = 0
        self._checkpoints: dict[str, int] = {}
        self.last_timings: dict[str, float] = {}
        self.extras = SleepWakeExtras(self, self.gpus, name)

    # --- lifecycle --------------------------------------------------------------------------------
    async def init(self, *, sleep: bool | None = None) -> None:
        """Seed step 3: build the model and optimizer on the GPUs, back the weights up on the host,
        and go to sleep when `sleep` (None: ``offload_train``; the engines wake next, seed steps 4–7).
        `SimBackends.start` passes False: like the real actors, the trainer comes up awake and the
        orchestrator's start-up puts it to sleep."""
        if self.initialized:
            raise TrainerError(f"{self.name}: init() called twice")
        env = self.cluster.env
        t0 = float(env.now)
        for gpu in self.gpus:
            gpu.alloc(self.name, TAG_CONTEXT, trainer_context_bytes(self.hw))
        for tag, sizes in self.state_bytes_per_gpu().items():
            self.allocator.allocate(tag, sizes)
        self.cluster.host.alloc(self.name, TAG_WEIGHT_BACKUP, sum(self.policy_param_bytes_per_gpu()))
        if self.reference_on_host:  # every rank's shard of the reference, pinned
            self.cluster.host.alloc(self.name, TAG_REFERENCE, sum(self.policy_param_bytes_per_gpu()))
        await elapse(env, self._backup_seconds())
        self.initialized = True
        self.cluster.recorder.span(self.name, "init", t0, float(env.now))
        if self.offload_train if sleep is None else sleep:
            await self.sleep()

    async def sleep(self) -> None:
        """Seed step 41: params and optimizer state to pinned host memory, grads (and activations) dropped.

        Both backends, as vime's real trainer uses them (vime/real/megatron/offload.py): only the state
        tags live under the region (torch_memory_saver's grads without a CPU backup) and the CUDA cache is
        emptied at sleep, so activations' cached blocks are freed, not parked. (Upstream slime/vime builds
        its whole actor under torch_memory_saver's region and parks those blocks too: vime #442.)"""
        self._require_init("sleep")
        self.lifecycle.check("sleep")
        t0 = float(self.cluster.env.now)
        await self._call()
        if self.allocator.device_bytes("activations"):
            self.allocator.release("activations")  # the sleep's empty_cache: the cached blocks go, nothing to remap
        # --train-offload-plan: the tags it leaves out stay resident ("all": params and optimizer to host)
        await self.extras.sleep(self.allocator, offload_plan_sets(self.offload_plan))
        self.lifecycle.apply("sleep")
        self.cluster.recorder.span(self.name, "sleep", t0, float(self.cluster.env.now))

    async def wake_up(self) -> None:
        """Seed step 37: remap every tag, copy params and optimizer back."""
        self._require_init("wake_up")
        self.lifecycle.check("wake_up")
        t0 = float(self.cluster.env.now)
        await self._call()
        await self.extras.wake_up(self.allocator)
        self.lifecycle.apply("wake_up")
        self.cluster.recorder.span(self.name, "wake_up", t0, float(self.cluster.env.now))

    async def _call(self) -> None:
        """The fixed cost of one protocol call reaching the ranks (`Efficiency.trainer_call_s`)."""
        await elapse(self.cluster.env, self.hw.efficiency.trainer_call_s)

    def _require_init(self, call: str) -> None:
        if not self.initialized:
            raise TrainerError(f"{self.name}: {call}() before init(); await trainer.init() first")

    # --- training -------------------------------------------------------------------------------
    def needs_log_prob_recompute(self, batch: TrainBatch) -> bool:
        """Seed step 38: the separate old-log-prob forward runs unless the loss may reuse the training forward."""
        if self.reuse_log_probs is not None:
            return not self.reuse_log_probs
        return bool(batch.recompute_log_probs)  # decided once, by the batch builder

    async def _run_microbatches(self, batch: TrainBatch, step: int | None, *, backward: bool,
                                label: str, resident: Sequence[int] | None = None) -> None:
        """Every DP rank runs its micro-batches concurrently; returns when the slowest is done. `resident`:
        bytes per actor GPU held in the activations' cache under this pass's own (a host-placed reference)."""
        lay = self.layout
        env = self.cluster.env

        async def dp_rank(r: int) -> None:
            rank_batch = batch.for_rank(r)
            positions = lay.ranks_of_dp(r)  # rank r sits on self.gpus[r]
            micro_batches = rank_batch.micro_batches(step)
            inflight = min(lay.pp, max(1, len(micro_batches)))
            busy = 0.0
            for mb in micro_batches:
                lengths = [rank_batch.total_lengths[i] for i in mb]
                tokens = sum(lengths)
                if backward:
                    nbytes = self.activation_bytes(tokens, lengths) * inflight + self.loss_transient_bytes(tokens)
                else:  # forward only: logits for the log-softmax of this micro-batch
                    nbytes = int(self.model.logits_bytes_per_token(lay.tp) * tokens / lay.cp)
                if resident is None:
                    cache_at_least(self.allocator, positions, nbytes)
                else:
                    for p in positions:
                        cache_at_least(self.allocator, [p], nbytes + resident[p])
                fwd, bwd = self._microbatch_seconds(lengths, backward=backward)
                await elapse(env, fwd + bwd)
                busy += fwd + bwd
            if lay.pp > 1 and micro_batches:
                # 1F1B pipeline: (m + pp − 1) stage slots for m micro-batches; the bubble is pp − 1 of them.
                await elapse(env, (lay.pp - 1) * busy / len(micro_batches))

        t0 = float(env.now)
        tasks = [asyncio.ensure_future(dp_rank(r)) for r in range(lay.dp)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for t in tasks:
                t.cancel()
        self.cluster.recorder.span(self.name, label, t0, float(env.now), step=step)

    def needs_ref_log_probs(self) -> bool:
        """A KL term (loss or reward penalty) needs the reference model's log-probs."""
        return self.reference_model

    async def _ref_log_probs(self, rollout_id: int, batch: TrainBatch) -> float:
        env = self.cluster.env
        t0 = float(env.now)
        resident = None
        if self.reference_on_host:
            # its weights come in through PyTorch's cache and are dropped there after: the cache holds them
            # under this forward's logits, and the training's activations reuse the blocks
            resident = self.policy_param_bytes_per_gpu()
            for i, n in enumerate(resident):
                cache_at_least(self.allocator, [i], n)
            await elapse(env, self.reference_copy_seconds())
        await self._run_microbatches(batch, None, backward=False, label="compute_ref_log_prob", resident=resident)
        self.cluster.recorder.span(self.name, "ref_log_probs", t0, float(env.now), rollout_id=rollout_id)
        return float(env.now) - t0

    async def compute_log_prob(self, rollout_id: int, batch: TrainBatch) -> float:
        """The old-log-prob forward over the whole batch (seed step 38); returns its virtual seconds."""
        self._require_init("compute_log_prob")
        self.lifecycle.check("compute_log_prob")
        t0 = float(self.cluster.env.now)
        await self._run_microbatches(batch, None, backward=False, label="compute_log_prob")
        return float(self.cluster.env.now) - t0

    async def train(self, rollout_id: int, batch: TrainBatch) -> TrainMetrics:
        """Seed steps 37–41 for one rollout; requires awake (the orchestrator wakes the trainer first)."""
        self._require_init("train")
        self.lifecycle.check("train")
        env = self.cluster.env
        if batch.dp_size != self.layout.dp:
            raise TrainerError(f"{self.name}: the batch is scheduled for DP={batch.dp_size} but the trainer "
                               f"has DP={self.layout.dp}")
        t_start = float(env.now)
        await self._call()
        timings: dict[str, float] = {}
        recompute = self.needs_log_prob_recompute(batch)
        if recompute:
            timings["log_probs_time"] = await self.compute_log_prob(rollout_id, batch)
        if self.needs_ref_log_probs():
            timings["ref_log_probs_time"] = await self._ref_log_probs(rollout_id, batch)
        t_train = float(env.now)
        for step in range(batch.schedule.num_steps):
            await self._run_microbatches(batch, step, backward=True, label=f"train_step{step}")
            t_opt = float(env.now)
            for i, n in enumerate(self.optimizer_transient_per_gpu()):
                cache_at_least(self.allocator, [i], n)
            await elapse(env, self._optimizer_seconds())
            self.cluster.recorder.span(self.name, "optimizer_step", t_opt, float(env.now), step=step)
        timings["actor_train_time"] = float(env.now) - t_train
        self.extras.trained(batch)
        if self.train_calls == 0:
            # What the first train step leaves mapped outside the offload pools: flat from then on in the H200 runs
            residue = self.step_residue_bytes(batch)
            for gpu in self.gpus:
                gpu.alloc(self.name, TAG_STEP_RESIDUE, residue)
        t_backup = float(env.now)
        await elapse(env, self._backup_seconds())  # seed step 41: weights_backuper.backup("actor")
        if not self.offload_train:
            await empty_cache(self.allocator, self.gpus, self.hw)  # resident: no sleep will (as vime's real trainer)
        timings["weight_backup_time"] = float(env.now) - t_backup
        timings["train_time"] = float(env.now) - t_start
        self.train_calls += 1
        self.last_timings = timings
        self.cluster.recorder.span(self.name, "train", t_start, float(env.now), rollout_id=rollout_id,
                                   recompute_log_probs=recompute)
        return _train_metrics(self, rollout_id, batch, recompute, timings)

    # --- weights ----------------------------------------------------------------------------------
    async def export_weights(self, bucket_bytes: int) -> AsyncIterator[WeightBucket]:
        """Seed step 48: HF-named full tensors in buckets of at most `bucket_bytes` (a larger tensor
        gets a bucket of its own). Each bucket is staged on every actor GPU while the consumer uses it."""
        self._require_init("export_weights")
        self.lifecycle.check("export_weights")
        if bucket_bytes <= 0:
            raise ConfigError(f"--update-weight-buffer-size must be > 0, got {bucket_bytes}")
        env = self.cluster.env
        await self._call()
        await elapse(env, self._convert_seconds())
        buckets = self._buckets(bucket_bytes)
        if self.colocated:
            self._reserve_staging(max((nbytes for _, _, nbytes in buckets), default=0))
        index = 0
        for names, shapes, nbytes in buckets:
            t0 = float(env.now)
            if not self.colocated:
                for gpu in self.gpus:
                    gpu.alloc(self.name, TAG_WEIGHT_BUFFER, nbytes)
            try:
                # Each rank stages its shard from the CPU backup, then TP ranks gather full tensors.
                await elapse(env, self._bucket_seconds(nbytes))
                self.cluster.recorder.span(self.name, "export_bucket", t0, float(env.now), index=index,
                                           nbytes=nbytes)
                yield WeightBucket(names=names, dtype_names=["bfloat16"] * len(names),
                                   shapes=[list(s) for s in shapes], nbytes=nbytes, index=index)
            finally:
                if not self.colocated:
                    for gpu in self.gpus:
                        gpu.free(self.name, TAG_WEIGHT_BUFFER, nbytes)
            index += 1

    def _reserve_staging(self, nbytes: int) -> None:
        """The CUDA-IPC staging buffer (vime/real/weights/ipc.py `StagingBuffer.reserve`): sized to the largest
        bucket, allocated by the first export outside the offload regions and kept, so it stays mapped through
        every later sleep and rollout (the 2026-12-02 H200 runs: the start-up sync rises 1.0 GiB more than later ones)."""
        if nbytes <= self.staging_bytes:
            return
        for gpu in self.gpus:
            gpu.free(self.name, TAG_WEIGHT_BUFFER, self.staging_bytes)  # the smaller one goes first, as in reserve()
            gpu.alloc(self.name, TAG_WEIGHT_BUFFER, nbytes)
        self.staging_bytes = nbytes

    # --- checkpoints --------------------------------------------------------------------------
    async def save_checkpoint(self, rollout_id: int, path: str) -> None:
        """Costs the write of params + optimizer at CHECKPOINT_BYTES_PER_S per node; remembers `rollout_id`."""
        self._require_init("save_checkpoint")
        self.lifecycle.check("save_checkpoint")
        t0 = float(self.cluster.env.now)
        await self._call()
        await elapse(self.cluster.env, self._checkpoint_seconds())
        self._checkpoints[path] = rollout_id
        self.cluster.recorder.span(self.name, "save_checkpoint", t0, float(self.cluster.env.now),
                                   rollout_id=rollout_id, gib=self.checkpoint_bytes() / GiB)

    async def load_checkpoint(self, path: str) -> int:
        """Costs the read of a checkpoint; returns the rollout id to resume from: one after the one
        this trainer saved at `path`, else ``start_rollout_id`` (a checkpoint made outside the simulation)."""
        t0 = float(self.cluster.env.now)
        await self._call()
        await elapse(self.cluster.env, self._checkpoint_seconds())
        self.cluster.recorder.span(self.name, "load_checkpoint", t0, float(self.cluster.env.now))
        if path in self._checkpoints:
            return self._checkpoints[path] + 1
        return self.start_rollout_id


def _train_metrics(trainer: SimTrainer, rollout_id: int, batch: TrainBatch, recomputed: bool,
                   timings: dict[str, float]) -> TrainMetrics:
    """Deterministic, plausible figures. The loss is exact for the first step (ratio 1, seed step 40):
    the per-token mean of −advantage over loss-masked tokens; the rest is seeded noise."""
    num = 0.0
    tokens = 0
    for adv, mask in zip(batch.rewards, batch.loss_masks, strict=True):
        n = len(mask) - mask.count(0)  # C-speed count; masks hold 0/1
        num += -adv * n
        tokens += n
    loss = num / tokens if tokens else 0.0
    rng = random.Random(trainer.seed * 1_000_003 + rollout_id)
    steps = batch.schedule.num_steps
    clipfrac = 0.0 if steps == 1 else rng.uniform(0.0, 0.02) * (steps - 1) / steps
    grad_norm = 0.5 * math.exp(rng.gauss(0.0, 0.25))
    entropy = max(0.05, 0.6 * math.exp(-0.002 * rollout_id) + rng.gauss(0.0, 0.01))
    flops = 3.0 * sum(trainer.model.sequence_flops(n) for n in batch.total_lengths)
    if recomputed:
        flops += flops / 3.0
    extra = {f"perf/{k}": v for k, v in timings.items()}
    train_time = timings.get("actor_train_time", 0.0) + timings.get("log_probs_time", 0.0)
    if train_time > 0:
        extra["perf/actor_train_tflops"] = flops / train_time / trainer.layout.world / 1e12
    return TrainMetrics(rollout_id=rollout_id, loss=loss, pg_clipfrac=clipfrac, grad_norm=grad_norm,
                        entropy=entropy, tokens=tokens, num_steps=steps, recomputed_log_probs=recomputed,
                        extra=extra)
