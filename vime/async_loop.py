"""Asynchronous RL loops (issue 22): one-step-off and fully-async, written once against the protocols, with staleness and idle metrics.

Both run on GPUs apart (``--no-colocate``): nothing sleeps, the trainer and the engines stay awake.
A step's phases are the parts of its critical path, so T_step = rollout + train + weight_sync + gap
still holds exactly; rollout is the time the trainer waited for its batch, while generation itself
overlaps training (its share is ``engine_idle_share``'s complement).

- one-step-off: step k waits for rollout k, publishes the weights of train k−1 (the engines idle,
  paused only for the update), starts rollout k+1 and trains on rollout k meanwhile; every sample
  after the first batch is one version old. The last step publishes its own weights at its end.
- fully-async: `vime.rollout.producer.Producer` generates continuously; each step takes a full batch,
  trains, and publishes with admission closed (seed steps 44 and 53: pause_rollout_admission /
  resume_rollout_admission), in-flight requests aborted and resumed (or kept) under the new weights.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vime.orchestrator import Orchestrator, RunReport, StartupReport, StepReport
from vime.protocols import GenerateRequest, GenerateResult, Router, TrainMetrics
from vime.rollout.generate import RolloutOutput, RolloutStats
from vime.rollout.producer import CROSSED_UPDATE, Producer, oldest_version
from vime.types import Sample, SampleStatus, TrainBatch

if TYPE_CHECKING:
    from vime.config import AsyncConfig


@dataclass
class AsyncStepReport(StepReport):
    """A StepReport with what asynchrony adds: staleness of the trained samples, throughput, idle shares."""

    async_mode: str = "sync"
    trainer_version: int = 0  # the weight version the trainer held when it trained this batch
    staleness_mean: float = 0.0  # version lag (trainer version − oldest version of a sample), mean over samples
    staleness_max: int = 0
    partial_share: float = 0.0  # share of trained samples whose generation crossed a weight update
    samples_per_s: float = 0.0
    tokens_per_s: float = 0.0  # response tokens trained per second of the step
    engine_idle_share: float = 0.0  # share of the step with no request generating (none in flight, or paused)
    trainer_idle_share: float = 0.0  # share of the step outside the trainer's train()
    stale_groups: int = 0  # fully-async: groups too stale when taken, generated again

    def metrics(self) -> dict[str, float]:
        # the batch may span versions ("2,3"): rollout/weight_version is the newest, async/… says how old the rest are
        versions = [int(v) for v in (self.rollout_weight_version or "").split(",") if v.strip().isdigit()]
        newest = str(max(versions)) if versions else None
        m = StepReport.metrics(dataclasses.replace(self, rollout_weight_version=newest))
        m.update({"async/trainer_version": float(self.trainer_version), "async/staleness_mean": self.staleness_mean,
                  "async/staleness_max": float(self.staleness_max), "async/partial_share": self.partial_share,
                  "async/stale_groups": float(self.stale_groups), "perf/samples_per_sec": self.samples_per_s,
                  "perf/tokens_per_sec": self.tokens_per_s, "perf/engine_idle_share": self.engine_idle_share,
                  "perf/trainer_idle_share": self.trainer_idle_share})
        return m


class InflightRouter:
    """The router, counting the time some generate request is in flight and the engines are not paused for an update."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.inflight = 0
        self.paused = False
        self.busy_s = 0.0
        self._since: float | None = None

    @staticmethod
    def _now() -> float:
        return asyncio.get_running_loop().time()

    def _account(self) -> None:
        now = self._now()
        if self._since is not None:
            self.busy_s += now - self._since
        self._since = now if self.inflight and not self.paused else None

    def set_paused(self, paused: bool) -> None:
        self._account()
        self.paused = paused
        self._account()

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.inflight += 1
        self._account()
        try:
            return await self.router.generate(request)
        finally:
            self.inflight -= 1
            self._account()

    async def abort_all(self) -> None:
        await self.router.abort_all()

    def take_busy(self) -> float:
        """Busy seconds since the last call."""
        self._account()
        busy, self.busy_s = self.busy_s, 0.0
        return busy

    def __getattr__(self, name: str) -> Any:
        return getattr(self.router, name)


class AsyncOrchestrator(Orchestrator):
    """The Orchestrator with `--async-mode one-step-off | fully-async` loops; start-up, publication and hooks are the seed's."""

    def __init__(self, *args: Any, async_rl: AsyncConfig, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.async_rl = async_rl
        self.tracker = InflightRouter(self.rollout.router)
        self.rollout.router = self.tracker  # the rollout's requests are counted; control calls go to engines
        self.producer: Producer | None = None

    # --- the seed's hooks, acting on the producer ------------------------------------------------------
    def pause_rollout_admission(self) -> bool:
        """Seed step 44: the producer admits nothing new until step 53; returns whether it was admitting."""
        self._note("pause_rollout_admission")
        if self.producer is None:
            return True
        was_open = self.producer.admitting
        self.producer.pause()
        return was_open

    def resume_rollout_admission(self, was_paused: bool) -> None:
        """Seed step 53: admission opens again (if it was open before step 44)."""
        self._note("resume_rollout_admission")
        if self.producer is not None and was_paused:
            self.producer.resume()

    def training_ready(self) -> None:
        """Seed step 9: admission may open (the producer starts after start-up, so there is nothing to reopen here)."""
        self._note("training_ready")
        if self.producer is not None:
            self.producer.resume()

    async def publish(self, rollout_id: int, times: dict[str, float], *, last: bool = False) -> None:
        """Seed steps 44–53 with the engines' busy time stopped while they are paused for the update."""
        async with self._phase("weight_sync", rollout_id, times):
            self.tracker.set_paused(True)
            was_open = self.pause_rollout_admission()
            if last and self.producer is not None:
                await self.producer.stop()  # nothing more to train on: hand the rest back before the update
            await self.update_weights()
            if not last:
                self.resume_rollout_admission(was_open)
            self.tracker.set_paused(False)

    # --- the loops -------------------------------------------------------------------------------------
    async def run(self, *, on_startup: Callable[[StartupReport], None] | None = None,
                  on_step: Callable[[StepReport], None] | None = None) -> RunReport:
        startup = await self.start()
        if on_startup is not None:
            on_startup(startup)
        ids = range(startup.start_rollout_id, self.train_cfg.num_rollout)
        loop = self._one_step_off if self.async_rl.async_mode == "one-step-off" else self._fully_async
        steps: list[StepReport] = []
        await loop(list(ids), steps, on_step)
        return RunReport(startup, steps)

    async def _one_step_off(self, ids: list[int], steps: list[StepReport],
                            on_step: Callable[[StepReport], None] | None) -> None:
        pending: asyncio.Task[RolloutOutput] | None = None
        try:
            for n, rid in enumerate(ids):
                report, times = self._begin(rid)
                async with self._phase("rollout", rid, times):
                    if pending is None:
                        pending = asyncio.create_task(self.rollout.generate_rollout(rid, self.data_source))
                    out = await pending
                    pending = None
                report.lost_engines, report.restarted_engines = await self._check_engines(rid)
                if n:
                    await self.publish(rid, times)  # the weights of train k−1, the engines idle
                if n + 1 < len(ids):
                    pending = asyncio.create_task(self.rollout.generate_rollout(ids[n + 1], self.data_source))
                trained = await self._train_step(rid, report, times, out)
                if n + 1 == len(ids):
                    await self.publish(rid, times, last=True)
                self._end(report, times, out, trained, steps, on_step)
        finally:
            if pending is not None:  # an error: the rollout in flight hands its groups back to the data source
                pending.cancel()
                await asyncio.gather(pending, return_exceptions=True)

    async def _fully_async(self, ids: list[int], steps: list[StepReport],
                           on_step: Callable[[StepReport], None] | None) -> None:
        cfg = self.rollout.cfg
        self.producer = Producer(self.rollout, self.data_source, batch_groups=cfg.rollout_batch_size,
                                 max_staleness=self.async_rl.max_staleness,
                                 partial_rollout=self.async_rl.partial_rollout,
                                 engine_version=lambda: self.weight_version,
                                 dynamic_filter=self.rollout.dynamic_filter)
        self.producer.start()
        before = self.producer.counts_snapshot()  # counts at the end of the last step: each step reports its own
        try:
            for n, rid in enumerate(ids):
                report, times = self._begin(rid)
                async with self._phase("rollout", rid, times):
                    groups = await self.producer.take()
                report.lost_engines, report.restarted_engines = await self._check_engines(rid)
                out = RolloutOutput(groups, RolloutStats(rid, len(groups), self.data_source.n_samples_per_prompt))
                trained = await self._train_step(rid, report, times, out)
                await self.publish(rid, times, last=n + 1 == len(ids))
                out = RolloutOutput(groups, self._stats(rid, groups, before))
                report.stale_groups = self.producer.counts.stale_groups - before.stale_groups
                before = self.producer.counts_snapshot()
                self._end(report, times, out, trained, steps, on_step)
        finally:
            if not self.producer.stopped:
                await self.producer.stop()

    # --- one step's parts ------------------------------------------------------------------------------
    def _begin(self, rid: int) -> tuple[AsyncStepReport, dict[str, float]]:
        self.tracker.take_busy()
        return AsyncStepReport(rollout_id=rid, t_begin=self.now(), async_mode=self.async_rl.async_mode), {}

    async def _train_step(self, rid: int, report: AsyncStepReport, times: dict[str, float],
                          out: RolloutOutput) -> tuple[TrainBatch, TrainMetrics]:
        samples = out.samples
        report.trainer_version = self.weight_version  # what the trainer holds: every publication follows a train
        lags = [self.weight_version - oldest_version(s) for s in samples]
        report.staleness_mean = sum(lags) / len(lags) if lags else 0.0
        report.staleness_max = max(lags, default=0)
        report.partial_share = sum(1 for s in samples if s.metadata.get(CROSSED_UPDATE)) / len(samples) if samples else 0.0
        batch = self.batch_builder.build(rid, samples)
        async with self._phase("train", rid, times):
            metrics = await self.train(rid, batch)
            self.training_completed(rid)
        return batch, metrics

    def _end(self, report: AsyncStepReport, times: dict[str, float], out: RolloutOutput,
             trained: tuple[TrainBatch, TrainMetrics], steps: list[StepReport],
             on_step: Callable[[StepReport], None] | None) -> None:
        batch, metrics = trained
        self._fill(report, times, out, batch, metrics)
        t = report.t_step
        busy = self.tracker.take_busy()
        report.samples_per_s = report.num_samples / t if t > 0 else 0.0
        report.tokens_per_s = sum(batch.response_lengths) / t if t > 0 else 0.0
        report.engine_idle_share = max(0.0, 1.0 - busy / t) if t > 0 else 0.0
        report.trainer_idle_share = max(0.0, 1.0 - report.t_train / t) if t > 0 else 0.0
        steps.append(report)
        if on_step is not None:
            on_step(report)

    def _stats(self, rid: int, groups: list[list[Sample]], before: Any) -> RolloutStats:
        """The step's rollout counts: the kept batch, and what the producer dropped or regenerated since the last step."""
        assert self.producer is not None
        counts = self.producer.counts
        n = len(groups[0]) if groups else self.data_source.n_samples_per_prompt
        stats = RolloutStats(rid, len(groups), n, submitted_groups=counts.admitted_groups - before.admitted_groups,
                             kept_groups=len(groups), dropped_groups=counts.dropped_groups - before.dropped_groups,
                             request_errors=counts.request_errors - before.request_errors,
                             returned_groups=counts.returned_groups + counts.stale_groups
                             - before.returned_groups - before.stale_groups)
        stats.generated_samples = (len(groups) + stats.dropped_groups) * n
        for s in (s for g in groups for s in g):
            stats.response_tokens += s.response_length
            stats.max_response_length = max(stats.max_response_length, s.response_length)
            stats.truncated_samples += s.status is SampleStatus.TRUNCATED
        return stats


def warmup_steps(async_rl: AsyncConfig) -> int:
    """Steps before steady state: none for the seed's step; the first waits for the first rollout; a fully-async
    producer also fills its pipeline (up to max_staleness + 1 batches) during it, which the next max_staleness
    steps drain without waiting."""
    if async_rl.async_mode == "sync":
        return 0
    return 1 if async_rl.async_mode == "one-step-off" else async_rl.max_staleness + 1


def async_summary(steps: list[Any], async_rl: AsyncConfig | None = None) -> dict[str, Any] | None:
    """The run's asynchrony figures (``--json``'s "async"): over every step, and in steady state (after
    `warmup_steps`); None for the seed's synchronous steps."""
    steps = [s for s in steps if isinstance(s, AsyncStepReport)]
    if not steps:
        return None
    warmup = warmup_steps(async_rl) if async_rl is not None else 1

    def over(part: list[AsyncStepReport]) -> dict[str, float]:
        t = sum(s.t_step for s in part)
        n = sum(s.num_samples for s in part)
        return {"steps": len(part), "t_step": t / len(part) if part else 0.0,
                "samples_per_s": n / t if t > 0 else 0.0,
                "tokens_per_s": sum(s.tokens_per_s * s.t_step for s in part) / t if t > 0 else 0.0,
                "engine_idle_share": sum(s.engine_idle_share * s.t_step for s in part) / t if t > 0 else 0.0,
                "trainer_idle_share": sum(s.trainer_idle_share * s.t_step for s in part) / t if t > 0 else 0.0,
                "staleness_mean": sum(s.staleness_mean * s.num_samples for s in part) / n if n else 0.0,
                "staleness_max": max((s.staleness_max for s in part), default=0),
                "partial_share": sum(s.partial_share * s.num_samples for s in part) / n if n else 0.0,
                "stale_groups": sum(s.stale_groups for s in part)}

    return {"mode": steps[0].async_mode, "warmup_steps": warmup, "all": over(steps), "steady": over(steps[warmup:])}
