"""The `vime.protocols.Trainer` implemented by a group of Megatron actors on Ray (seed steps 3, 37–41, 45–52).

`MegatronTrainer.launch` starts (or joins) Ray, reserves a placement group, starts one
`MegatronActor` per trainer rank, picks a rendezvous address on rank 0 and lets every rank join
torch.distributed and build its model. After that each protocol call fans out to all ranks
(they are collective) and folds their answers into one result.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from typing import Any

from vime.config.options import ClusterConfig
from vime.errors import ConfigError, TrainerError
from vime.placement import PlacementPlan, plan_placement
from vime.protocols import TrainerLifecycle, TrainMetrics, WeightBucket
from vime.real.cluster import ReservedPlacement, init_ray, reserve
from vime.real.megatron.actor import ActorConfig, MegatronActor


class MegatronTrainer:
    """Trainer protocol over `world_size` Ray actors (TP × DP, PP = 1)."""

    def __init__(self, actors: list[Any], cfg: ActorConfig, *, ranks: list[dict[str, Any]],
                 reserved: ReservedPlacement | None = None, owns_placement: bool = False,
                 plan: PlacementPlan | None = None, name: str = "trainer",
                 weight_transport: str = "tensors") -> None:
        self.actors = actors
        self.cfg = cfg
        self.ranks = ranks  # what each actor's setup() reported (dp_rank, tp_rank, node, setup time)
        #: the placement the actors sit in; released at shutdown only when the trainer reserved it itself
        self.reserved = reserved
        self.owns_placement = owns_placement
        self.plan = plan if plan is not None else (reserved.plan if reserved is not None else None)
        self.lifecycle = TrainerLifecycle(name=name)
        self.tp = cfg.tensor_model_parallel_size
        self.dp = len(actors) // self.tp
        self.setup_s = max(r["setup_s"] for r in ranks)
        #: Wait on the actors with a plain blocking ray.get instead of awaiting them. Mixed mode
        #: (a simulated clock driving this real trainer) needs it: the simulated event loop refuses
        #: the threads through which Ray completes awaited refs, and the call costs no virtual time.
        self.blocking = False
        #: "ipc": export_weights stages buckets on every rank's GPU and yields CUDA-IPC handles
        #: (colocated, --update-weight-mode tensor, CUDA); "tensors": rank 0 returns CPU tensors.
        if weight_transport not in ("ipc", "tensors"):
            raise ConfigError(f"weight_transport {weight_transport!r} is not 'ipc' or 'tensors'")
        self.weight_transport = weight_transport

    # --- start / stop -------------------------------------------------------------------------
    @classmethod
    def launch(cls, cfg: ActorConfig, world_size: int, *, cluster: ClusterConfig | None = None,
               update_weight_mode: str = "tensor", address: str | None = None, actor_num_cpus: float = 0.5,
               use_gpus: bool | None = None, ray_num_cpus: int | None = None,
               reserved: ReservedPlacement | None = None) -> MegatronTrainer:
        """Start `world_size` actors on the trainer bundles of `reserved` (the session's placement, shared
        with the engines) or of a placement of `cluster` (default: one node, no engines) reserved here,
        rendezvous on rank 0's node, set up (blocking). Ray: the cluster at `address`, else a private
        local one (`vime.real.cluster.init_ray`)."""
        import ray

        init_ray(address, num_cpus=ray_num_cpus)
        if world_size % cfg.tensor_model_parallel_size:
            raise ConfigError(f"{world_size} trainer ranks are not a multiple of --tensor-model-parallel-size "
                              f"{cfg.tensor_model_parallel_size}")
        owns = reserved is None
        if reserved is None:
            if use_gpus is None:
                use_gpus = ray.cluster_resources().get("GPU", 0) > 0
            if cluster is None:
                cluster = ClusterConfig(actor_num_nodes=1, actor_num_gpus_per_node=world_size, colocate=False,
                                        rollout_num_gpus=0, rollout_num_gpus_per_engine=1)
            reserved = reserve(plan_placement(cluster, use_gpus=use_gpus, actor_num_cpus=actor_num_cpus))
        plan = reserved.plan
        if plan.num_actors != world_size:
            if owns:
                reserved.release()
            raise ConfigError(f"the placement has {plan.num_actors} trainer bundles for {world_size} ranks")
        remote_cls: Any = ray.remote(MegatronActor)
        actors: list[Any] = [
            remote_cls.options(scheduling_strategy=reserved.scheduling(plan.actor_bundles[r]),
                               **plan.actor_options).remote(cfg, r, world_size)
            for r in range(world_size)
        ]
        try:
            ray.get([a.exit_with_node.remote() for a in actors])
            # torch.distributed's rendezvous: rank 0's node address and a port free there
            addr, port = ray.get(actors[0].master_address.remote())
            ranks = ray.get([a.setup.remote(addr, port) for a in actors])
            where = ray.get([a.where.remote() for a in actors])
        except Exception as exc:
            for a in actors:
                ray.kill(a)
            if owns:
                reserved.release()
            import ray.exceptions

            if isinstance(exc, ray.exceptions.RayActorError):
                raise TrainerError(f"a trainer rank died during set-up (its node failed or the process was "
                                   f"killed): {_first_line(exc)}") from exc
            raise
        for info, w in zip(ranks, where, strict=True):
            info.update(w)
        ipc = plan.use_gpus and plan.colocate and bool(plan.engines) and update_weight_mode == "tensor"
        return cls(actors, cfg, ranks=ranks, reserved=reserved, owns_placement=owns,
                   weight_transport="ipc" if ipc else "tensors")

    @classmethod
    def from_args(cls, args: Any, *, address: str | None = None,
                  hf_config: dict[str, Any] | None = None) -> MegatronTrainer:
        """The trainer of a `vime train --backend real` run: one rank per trainer GPU
        (--actor-num-nodes × --actor-num-gpus-per-node), model from --hf-checkpoint, placement per
        --colocate. Joins the Ray cluster at `address` when one is given, else starts a private one."""
        cfg = ActorConfig.from_args(args, hf_config)
        world = int(args.actor_num_nodes) * int(args.actor_num_gpus_per_node)
        return cls.launch(cfg, world, cluster=args.cluster, update_weight_mode=args.update_weight_mode,
                          address=address)

    def shutdown(self) -> None:
        """Kill the actors and release their placement group if the trainer reserved it (never raises)."""
        import ray

        actors, self.actors = self.actors, []
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - an actor on a dead node is gone already
                pass
        if self.owns_placement and self.reserved is not None:
            self.reserved.release()

    def _where(self, rank: int) -> str:
        info = self.ranks[rank] if rank < len(self.ranks) else {}
        return f"rank {rank} on node {info.get('ip', '?')}"

    def _rank_error(self, method: str, rank: int, exc: BaseException) -> TrainerError:
        """A failed call on `rank` as a TrainerError that names the rank and its node."""
        import ray.exceptions

        if isinstance(exc, ray.exceptions.RayActorError):
            return TrainerError(f"trainer {method}() failed: {self._where(rank)} died (its node failed or the "
                                f"process was killed); the run cannot go on: {_first_line(exc)}")
        return TrainerError(f"trainer {method}() failed on {self._where(rank)}: {exc}")

    # --- fan-out ------------------------------------------------------------------------------
    async def call(self, method: str, *args: Any, ranks: Sequence[int] | None = None) -> list[Any]:
        """Run `method` on every actor (or `ranks`) and return their answers in rank order."""
        chosen = list(range(len(self.actors)) if ranks is None else ranks)
        refs = [getattr(self.actors[r], method).remote(*args) for r in chosen]
        return await self._gather(refs, method, chosen)

    async def _gather(self, refs: list[Any], method: str, ranks: Sequence[int] | None = None) -> list[Any]:
        """The answers of `refs` (one per rank of `ranks`) in order. The first failure raises at once,
        naming its rank and node: the other ranks may wait in a collective for the one that died."""
        import ray

        ranks = list(range(len(refs))) if ranks is None else list(ranks)
        if self.blocking:
            pending = list(refs)
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                try:
                    ray.get(done[0])
                except Exception as exc:
                    raise self._rank_error(method, ranks[refs.index(done[0])], exc) from exc
            return list(ray.get(refs))

        async def one(ref: Any) -> Any:
            return await ref

        tasks = [asyncio.ensure_future(one(r)) for r in refs]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
        finally:
            for t in tasks:
                t.cancel() if not t.done() else None
        for rank, t in zip(ranks, tasks, strict=True):
            if not t.cancelled() and t.exception() is not None:
                raise self._rank_error(method, rank, t.exception()) from t.exception()  # type: ignore[arg-type]
        return [t.result() for t in tasks]

    async def full_logits(self, rows: Sequence[Sequence[int]]) -> Any:
        """Full-vocabulary logits [b, s, vocab] of equal-length rows (every rank runs the TP forward)."""
        return (await self.call("full_logits", [list(r) for r in rows]))[0]

    # --- Trainer protocol ---------------------------------------------------------------------
    async def train(self, rollout_id: int, batch: Any) -> TrainMetrics:
        """Each actor trains on its DP rank's partition of `batch` (seed steps 37–41)."""
        self.lifecycle.check("train")
        if batch.dp_size != self.dp:
            raise ConfigError(f"the batch is scheduled for {batch.dp_size} DP ranks but the trainer has {self.dp} "
                              f"(world {len(self.actors)} / TP {self.tp}); build the DP schedule with dp_size={self.dp}")
        refs = [a.train.remote(rollout_id, batch.for_rank(r["dp_rank"])) for a, r in zip(self.actors, self.ranks, strict=True)]
        results = await self._gather(refs, f"train(rollout {rollout_id})")
        self.lifecycle.apply("train")
        # TrainMetrics.tokens counts the trained (loss-masked) tokens, as the simulator does (the
        # conformance suite); what the ranks processed, prompts and padding included, goes to extra.
        trained = sum(len(m) - m.count(0) for m in batch.loss_masks)
        return fold_metrics(rollout_id, results, trained_tokens=trained)

    async def compute_log_prob(self, batch: Any) -> list[list[float]]:
        """Log-probs of every row's response tokens under the current weights, in batch row order."""
        self.lifecycle.check("compute_log_prob")
        refs = [a.compute_log_prob.remote(batch.for_rank(r["dp_rank"]))
                for a, r in zip(self.actors, self.ranks, strict=True)]
        results = await self._gather(refs, "compute_log_prob")
        out: list[list[float] | None] = [None] * len(batch.tokens)
        for r, rows in zip(self.ranks, results, strict=True):
            if r["tp_rank"] == 0:
                for pos, row in enumerate(batch.partitions[r["dp_rank"]]):
                    out[row] = rows[pos]
        return [x if x is not None else [] for x in out]

    async def sleep(self) -> None:
        self.lifecycle.check("sleep")
        await self.call("sleep")
        self.lifecycle.apply("sleep")

    async def wake_up(self) -> None:
        self.lifecycle.check("wake_up")
        await self.call("wake_up")
        self.lifecycle.apply("wake_up")

    async def export_weights(self, bucket_bytes: int) -> AsyncIterator[WeightBucket]:
        """HF-named buckets from the weight backup (seed step 48); TP shards gathered by the actors."""
        self.lifecycle.check("export_weights")
        if self.weight_transport == "ipc":
            async for bucket in self._export_ipc(bucket_bytes):
                yield bucket
            return
        results = await self.call("export_weights", bucket_bytes)
        for bucket in results[0]:
            yield bucket

    async def _export_ipc(self, bucket_bytes: int) -> AsyncIterator[WeightBucket]:
        """Colocated CUDA-IPC export (seed steps 48–50): every rank stages bucket i in its reused
        buffer; rank 0's fold carries every rank's handle, keyed by GPU UUID, so each engine worker
        opens the copy on its own GPU. The consumer asks for bucket i+1 only after every engine has
        loaded bucket i (vime.weight_sync.publish_weights), which is the acknowledgement that lets the
        ranks overwrite their buffers."""
        from vime.real.weights import ipc

        begun = await self.call("ipc_export_begin", bucket_bytes)
        layouts = begun[0][0]
        uuids = [u for _, u in begun]
        need: set[str] = set()
        if self.plan is not None and self.plan.engines and all(u is not None for u in uuids):
            ranks = ipc.engine_gpu_ranks(self.plan.actor_bundles, self.plan.engine_bundles)
            need = {uuids[r] for group in ranks for r in group}
        prev: int | None = None
        done = False
        try:
            for layout in layouts:
                bucket = ipc.fill_bucket(layout, await self.call("ipc_export_stage", layout.index, prev))
                if bucket.ipc_handles is not None and need:
                    ipc.check_coverage(bucket, need)
                yield bucket
                prev = layout.index
            done = True
        finally:
            await self.call("ipc_export_end", prev, not done)

    async def save_checkpoint(self, rollout_id: int, path: str) -> None:
        self.lifecycle.check("save_checkpoint")
        await self.call("save_checkpoint", rollout_id, path)

    async def load_checkpoint(self, path: str) -> int:
        """Load weights from `path` (a vime checkpoint) on every rank; returns the rollout id to resume from."""
        ids = await self.call("load_checkpoint", path)
        if len(set(ids)) != 1:
            raise TrainerError(f"ranks disagree on the resume rollout id: {ids}")
        return int(ids[0])


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def fold_metrics(rollout_id: int, results: list[dict[str, Any]], *, trained_tokens: int | None = None) -> TrainMetrics:
    """One TrainMetrics from every rank's answer: means over DP ranks (TP rank 0 of each), token sums.

    `tokens` is `trained_tokens` (the batch's loss-masked tokens) when given, else the processed
    tokens the ranks report; ``extra["tokens_per_s"]`` is always processed tokens per second.
    """
    heads = [r for r in results if r["tp_rank"] == 0] or results
    n = len(heads)
    processed = sum(int(r["tokens"]) for r in heads)
    tokens = processed if trained_tokens is None else trained_tokens
    elapsed = max(float(r["train_time"]) for r in results)
    extra = {"train_time": elapsed, "processed_tokens": float(processed),
             "tokens_per_s": processed / elapsed if elapsed > 0 else 0.0}
    for key in ("log_probs_time", "ref_log_probs_time", "actor_train_time", "weight_backup_time"):
        if key in heads[0]:  # the slowest rank's, as train_time
            extra[key] = max(float(r.get(key, 0.0)) for r in results)
    for key in ("kl_loss", "tis_weight", "train_rollout_logprob_abs_diff"):  # means over DP ranks
        if key in heads[0]:
            extra[key] = sum(float(r[key]) for r in heads) / n
    for key in results[0].get("memory", {}):  # the fullest GPU decides whether the engines fit
        extra[key] = max(float(r.get("memory", {}).get(key, 0.0)) for r in results)
    return TrainMetrics(
        rollout_id=rollout_id,
        loss=sum(r["loss"] for r in heads) / n,
        pg_clipfrac=sum(r["pg_clipfrac"] for r in heads) / n,
        grad_norm=float(heads[0]["grad_norm"]),  # already global: Megatron reduces it over all ranks
        entropy=sum(r["entropy"] for r in heads) / n,
        tokens=tokens,
        num_steps=int(heads[0]["num_steps"]),
        recomputed_log_probs=bool(heads[0]["recomputed_log_probs"]),
        extra=extra,
    )
