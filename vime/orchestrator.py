"""The RL step loop (seed steps 1–55) written once against the protocols, with its phase timers and StepReport.

Read `Orchestrator.start` and `Orchestrator.step` next to the seed's sequence diagram: each
line is one arrow (or one group of arrows) of it. The backends — rollout engines, the router,
the trainer — are passed in; this module never imports `vime.sim` or `vime.real`, so the same
loop runs on GPUs and in the simulator. Time comes from the running loop's clock
(``asyncio.get_running_loop().time()``): monotonic seconds on a real loop, virtual seconds in
the simulator.

T_step = T_rollout (14–32) + T_offload (33–36) + T_train (37–42) + T_onload_weights (43)
       + T_weight_sync (44–53) + T_onload_kv (54) + T_save + T_eval + T_gap,
where T_gap is whatever lies between the phases (bookkeeping, the health check), reported
explicitly so that the sum is exact.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from vime.checkpoint_io import EvalAndCheckpoints
from vime.errors import ConfigError, EngineError
from vime.protocols import (
    TAG_CUDA_GRAPH,
    TAG_KV_CACHE,
    TAG_WEIGHTS,
    RolloutEngine,
    Router,
    StepObserver,
    Trainer,
    TrainerState,
    TrainMetrics,
)
from vime.rollout.batch_builder import BatchBuilder
from vime.rollout.data_source import EvalSet
from vime.rollout.generate import Rollout, RolloutOutput
from vime.types import TrainBatch

if TYPE_CHECKING:
    from vime.config import ClusterConfig, TrainConfig, WeightSyncConfig
from vime.weight_sync import publish_weights, should_flush_cache

#: The six phases of T_step, in seed order, with the ecosystem's metric names.
PHASES: tuple[str, ...] = ("rollout", "offload", "train", "onload_weights", "weight_sync", "onload_kv")
#: perf/sleep_time, perf/wake_up_time, perf/train_time and perf/actor_train_time keep slime's meaning
#: (the trainer's sleep and wake, its train() call, the update inside it); the engines' own are apart.
PHASE_METRICS: dict[str, str] = {
    "rollout": "perf/rollout_time",
    "offload": "perf/engine_sleep_time",
    "train": "perf/train_phase_time",
    "onload_weights": "perf/onload_weights_time",
    "weight_sync": "perf/update_weights_time",
    "onload_kv": "perf/onload_kv_time",
}
#: Trainer timings (TrainMetrics.extra, with or without the perf/ prefix) logged under perf/.
TRAINER_TIMINGS = ("train_time", "actor_train_time", "log_probs_time", "ref_log_probs_time",
                   "weight_backup_time", "data_preprocess_time")
ROLLOUT_MANAGER = "rollout_manager"  # the component name of the orchestrator's own bookkeeping calls


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------


@dataclass
class StartupReport:
    """Start-up (seed steps 1–13): onload weights, first publication v0 → v1, onload KV."""

    t_onload_weights: float = 0.0
    t_weight_sync: float = 0.0
    t_onload_kv: float = 0.0
    t_total: float = 0.0
    weight_version: int = 0
    flushed_cache: bool = False
    buckets: int = 0
    start_rollout_id: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class StepReport:
    """One RL step (seed steps 14–55): the six phase times, the gap, and what the step produced.

    Times are in the loop's seconds (virtual in the simulator). ``t_step`` is measured from the
    start of the rollout to the end of the step and equals ``sum(phases) + t_save + t_eval +
    t_gap`` up to float rounding.
    """

    rollout_id: int
    t_begin: float
    t_rollout: float = 0.0
    t_offload: float = 0.0
    t_train: float = 0.0
    t_onload_weights: float = 0.0
    t_weight_sync: float = 0.0
    t_onload_kv: float = 0.0
    t_save: float = 0.0
    t_eval: float = 0.0
    t_gap: float = 0.0
    t_step: float = 0.0
    t_trainer_wake_up: float = 0.0  # inside t_train: the trainer's wake (slime's perf/wake_up_time)
    t_trainer_sleep: float = 0.0  # inside t_train: the trainer's sleep (slime's perf/sleep_time)
    rollout_weight_version: str | None = None  # the version stamped on this rollout's responses
    published_version: int = 0  # the version the engines hold after the step
    flushed_cache: bool = False
    sleep_level: int | None = None
    buckets: int = 0
    weight_sync_parts: dict[str, float] = field(default_factory=dict)  # PublishReport.parts()
    num_samples: int = 0
    num_microbatches: list[int] = field(default_factory=list)
    reward_mean: float = 0.0
    response_length_mean: float = 0.0
    rollout: dict[str, Any] = field(default_factory=dict)  # RolloutStats.as_dict()
    train: dict[str, Any] = field(default_factory=dict)  # TrainMetrics as a dict
    eval: dict[str, float] = field(default_factory=dict)
    lost_engines: list[str] = field(default_factory=list)  # found dead after the rollout
    restarted_engines: list[str] = field(default_factory=list)  # of those, restarted and back in service

    def phases(self) -> dict[str, float]:
        """The six phases of T_step by name, in seed order."""
        return {p: getattr(self, f"t_{p}") for p in PHASES}

    def metrics(self) -> dict[str, float]:
        """Flat metrics under the names slime / vime users log (perf/…, rollout/…, train/…)."""
        m: dict[str, float] = {PHASE_METRICS[p]: t for p, t in self.phases().items()}
        m["perf/engine_wake_up_time"] = self.t_onload_weights + self.t_onload_kv
        m["perf/sleep_time"] = self.t_trainer_sleep
        m["perf/wake_up_time"] = self.t_trainer_wake_up
        m["perf/save_model_time"] = self.t_save
        m["perf/eval_time"] = self.t_eval
        m["perf/gap_time"] = self.t_gap
        for part, t in self.weight_sync_parts.items():
            m[f"perf/update_weights_{part}_time"] = t
        m["perf/step_time"] = self.t_step
        r = self.rollout
        if self.t_rollout > 0:
            m["perf/rollout_tokens_per_sec"] = r.get("response_tokens", 0) / self.t_rollout
        m["rollout/raw_reward"] = self.reward_mean
        m["rollout/response_len/mean"] = self.response_length_mean
        m["rollout/response_len/max"] = float(r.get("max_response_length", 0))
        m["rollout/truncated_ratio"] = r.get("truncated_samples", 0) / self.num_samples if self.num_samples else 0.0
        for key in ("kept_samples", "generated_samples", "dropped_samples", "aborted_samples",
                    "request_errors", "failed_samples", "submitted_groups", "returned_groups"):
            m[f"rollout/{key}"] = float(r.get(key, 0))
        m["rollout/weight_version"] = float(self.rollout_weight_version or 0)
        if r.get("answered_requests"):
            # where the rollout's time goes: until the first and the last answer, and a request's mean time
            m["perf/rollout_first_request_time"] = float(r["first_request_s"])
            m["perf/rollout_last_request_time"] = float(r["last_request_s"])
            m["perf/rollout_first_response_time"] = float(r["first_response_s"])
            m["perf/rollout_last_response_time"] = float(r["last_response_s"])
            m["perf/rollout_request_time_mean"] = float(r["request_time_mean_s"])
        for key in ("loss", "pg_clipfrac", "grad_norm", "entropy"):
            if key in self.train:
                m[f"train/{key}"] = float(self.train[key])
        for key, value in self.train.get("extra", {}).items():
            name = key.removeprefix("perf/")
            if name.startswith("memory/"):
                m[name] = float(value)
            else:
                m[f"perf/{name}" if name in TRAINER_TIMINGS else f"train/{name}"] = float(value)
        if "perf/train_time" in m:  # slime: the step is train_wait + train
            m["perf/train_wait_time"] = self.t_step - m["perf/train_time"]
        for key, value in self.eval.items():
            m[f"eval/{key}"] = float(value)
        return m

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunReport:
    """A whole run: start-up and every step, in order."""

    startup: StartupReport
    steps: list[StepReport]

    def to_dict(self) -> dict[str, Any]:
        return {"startup": self.startup.to_dict(), "steps": [s.to_dict() for s in self.steps]}


# --------------------------------------------------------------------------------------------
# The orchestrator
# --------------------------------------------------------------------------------------------


class Orchestrator(EvalAndCheckpoints):
    """Drives start-up and the RL loop over the given backends (the seed's train.py + RolloutManager).

    `engines` receive control calls (sleep, wake, pause, weights) one by one; `router` receives
    the rollout's generate requests. `observers` get every phase boundary and the
    orchestrator's own bookkeeping calls; backends report their protocol calls themselves.
    `engines_receive_weights` chooses sleep level 2 (weights discarded, re-pushed after
    training) over level 1 (weights offloaded to host) — seed step 34.
    """

    def __init__(self, train: TrainConfig, cluster: ClusterConfig, weight_sync: WeightSyncConfig, *,
                 engines: Sequence[RolloutEngine], router: Router, trainer: Trainer, data_source: Any,
                 rollout: Rollout, batch_builder: BatchBuilder, observers: Sequence[StepObserver] = (),
                 eval_sources: Mapping[str, EvalSet] | None = None, engines_receive_weights: bool = True) -> None:
        if not engines:
            raise ConfigError("the orchestrator needs at least one rollout engine")
        if train.eval_interval and not eval_sources:
            raise ConfigError(f"--eval-interval {train.eval_interval} needs evaluation prompts; give "
                              f"--eval-prompt-data NAME PATH (or leave --eval-interval out)")
        self.train_cfg = train  # the loop: rollouts, evaluation, checkpoints
        self.cluster = cluster  # which side sleeps (offload_train / offload_rollout)
        self.weight_sync = weight_sync
        self.trainer_times = {"wake_up": 0.0, "sleep": 0.0}  # the last train phase's trainer wake and sleep
        self.engines = list(engines)
        self.router = router
        self.trainer = trainer
        self.data_source = data_source
        self.eval_sources = dict(eval_sources or {})
        self.observers = list(observers)
        self.engines_receive_weights = engines_receive_weights
        self.rollout = rollout
        self.batch_builder = batch_builder
        self.weight_version = 0
        self.initial_weight_version = 0
        self.lost_engines: list[str] = []
        self._last_flush = False
        self._last_buckets = 0
        self._last_publish_parts: dict[str, float] = {}

    # --- clock and observers ----------------------------------------------------------------------
    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    @contextlib.asynccontextmanager
    async def _phase(self, name: str, rollout_id: int | None, times: dict[str, float]) -> AsyncIterator[None]:
        t0 = self.now()
        for o in self.observers:
            o.on_phase(name, True, t0, rollout_id)
        try:
            yield
        finally:
            t1 = self.now()
            times[name] = times.get(name, 0.0) + (t1 - t0)
            for o in self.observers:
                o.on_phase(name, False, t1, rollout_id)

    def _note(self, call: str, t0: float | None = None) -> None:
        """Report one of the orchestrator's own (RolloutManager) calls to the observers."""
        t1 = self.now()
        for o in self.observers:
            o.on_call(ROLLOUT_MANAGER, call, t1 if t0 is None else t0, t1)

    # --- seed steps 1–13 --------------------------------------------------------------------------
    async def start(self) -> StartupReport:
        """Start-up: trainer asleep when offloading, onload weights, publish v1, training_ready, onload KV.

        Steps 1–3 (parse args, create engines and trainer) happen before: the backends are built
        by the caller and passed in.
        """
        report = StartupReport(start_rollout_id=self.train_cfg.start_rollout_id)
        times: dict[str, float] = {}
        t0 = self.now()
        async with self._phase("startup", None, times):
            await self._load_checkpoint(report)
            if self.cluster.offload_train and self.trainer.lifecycle.state is TrainerState.AWAKE:
                await self.trainer.sleep()  # seed step 3: actors hand the GPUs to the engines
            if self.cluster.offload_rollout:
                async with self._phase("onload_weights", None, times):
                    await self.onload_weights()  # seed steps 4–7
            async with self._phase("weight_sync", None, times):
                await self.update_weights()  # seed step 8: v0 → v1, flushed
            self.training_ready()  # seed step 9
            if self.cluster.offload_rollout:
                async with self._phase("onload_kv", None, times):
                    await self.onload_kv()  # seed steps 10–13
        report.t_onload_weights = times.get("onload_weights", 0.0)
        report.t_weight_sync = times.get("weight_sync", 0.0)
        report.t_onload_kv = times.get("onload_kv", 0.0)
        report.t_total = self.now() - t0
        report.weight_version = self.weight_version
        report.flushed_cache = self._last_flush
        report.buckets = self._last_buckets
        return report

    # --- seed steps 14–55 -------------------------------------------------------------------------
    async def step(self, rollout_id: int) -> StepReport:
        """One RL step; returns its report. Raises (after returning unused prompts) when it cannot finish."""
        report = StepReport(rollout_id=rollout_id, t_begin=self.now())
        times: dict[str, float] = {}
        async with self._phase("rollout", rollout_id, times):  # 14–32
            out, batch = await self.generate(rollout_id)
        report.lost_engines, report.restarted_engines = await self._check_engines(rollout_id)
        async with self._phase("offload", rollout_id, times):  # 33–36
            report.sleep_level = await self.offload()
        async with self._phase("train", rollout_id, times):  # 37–42
            metrics = await self.train(rollout_id, batch)
            report.t_trainer_wake_up, report.t_trainer_sleep = self.trainer_times["wake_up"], self.trainer_times["sleep"]
            self.training_completed(rollout_id)
        if _periodic(rollout_id, self.train_cfg.save_interval, self.train_cfg.num_rollout):
            async with self._phase("save", rollout_id, times):
                await self.save(rollout_id)
        if self.cluster.offload_rollout:
            async with self._phase("onload_weights", rollout_id, times):  # 43
                await self.onload_weights()
        async with self._phase("weight_sync", rollout_id, times):  # 44–53
            was_paused = self.pause_rollout_admission()
            await self.update_weights()
            if rollout_id + 1 < self.train_cfg.num_rollout:
                self.resume_rollout_admission(was_paused)
        if self.cluster.offload_rollout:
            async with self._phase("onload_kv", rollout_id, times):  # 54
                await self.onload_kv()
        if _periodic(rollout_id, self.train_cfg.eval_interval, self.train_cfg.num_rollout):
            async with self._phase("eval", rollout_id, times):
                report.eval = await self.evaluate(rollout_id)
        self._fill(report, times, out, batch, metrics)
        return report  # 55: the caller moves on to rollout_id + 1

    async def run(self, *, on_startup: Callable[[StartupReport], None] | None = None,
                  on_step: Callable[[StepReport], None] | None = None) -> RunReport:
        """Start-up, then every step in [start_rollout_id, num_rollout); callbacks see each report as it is made."""
        startup = await self.start()
        if on_startup is not None:
            on_startup(startup)
        steps = []
        for rollout_id in range(startup.start_rollout_id, self.train_cfg.num_rollout):
            steps.append(await self.step(rollout_id))
            if on_step is not None:
                on_step(steps[-1])
        return RunReport(startup, steps)

    # --- the arrows, one method each ----------------------------------------------------------------
    async def generate(self, rollout_id: int) -> tuple[RolloutOutput, TrainBatch]:
        """Seed steps 14–32: one rollout, the column batch split per DP rank."""
        out = await self.rollout.generate_rollout(rollout_id, self.data_source)
        batch = self.batch_builder.build(rollout_id, out.samples)
        return out, batch

    async def offload(self) -> int | None:
        """Seed steps 33–36: every engine sleeps (level 2 if it receives weights). The engines' health is
        checked before, after the rollout (`_check_engines`): a sleeping engine answers slowly or not at all."""
        if not self.cluster.offload_rollout:
            return None
        level = 2 if self.engines_receive_weights else 1
        await asyncio.gather(*(e.sleep(level, "keep") for e in self.engines))
        return level

    async def train(self, rollout_id: int, batch: TrainBatch) -> TrainMetrics:
        """Seed steps 37–41: wake the actors, train on the batch, put them back to sleep when offloading."""
        self.trainer_times = {"wake_up": 0.0, "sleep": 0.0}
        if self.cluster.offload_train:
            t0 = self.now()
            await self.trainer.wake_up()
            self.trainer_times["wake_up"] = self.now() - t0
        metrics = await self.trainer.train(rollout_id, batch)
        if self.cluster.offload_train:
            t0 = self.now()
            await self.trainer.sleep()
            self.trainer_times["sleep"] = self.now() - t0
        return metrics

    def training_completed(self, rollout_id: int) -> None:
        """Seed step 42: the batch was consumed; its slot in the BatchBuilder is free."""
        t0 = self.now()
        self.batch_builder.training_completed(rollout_id)
        self._note("training_completed", t0)

    async def onload_weights(self) -> None:
        """Seed steps 4–7 and 43: map the engines' weight memory (contents arrive with the next publication)."""
        await asyncio.gather(*(e.wake_up([TAG_WEIGHTS]) for e in self.engines))

    async def onload_kv(self) -> None:
        """Seed steps 10–13 and 54: map the KV cache; vime asks for [kv_cache, cuda_graph] (engines normalise)."""
        await asyncio.gather(*(e.wake_up([TAG_KV_CACHE, TAG_CUDA_GRAPH]) for e in self.engines))

    async def update_weights(self) -> None:
        """Seed steps 8 and 45–52: publish the trainer's weights as the next version."""
        version = self.weight_version + 1
        flush = should_flush_cache(self.weight_sync.flush_cache_interval, version, self.initial_weight_version)
        published = await publish_weights(self.trainer, self.engines, version, flush_cache=flush,
                                          bucket_bytes=self.weight_sync.update_weight_buffer_size)
        self.weight_version = version
        self._last_flush = flush
        self._last_buckets = published.buckets
        self._last_publish_parts = published.parts()

    def training_ready(self) -> None:
        """Seed step 9: resume admission a recovery paused; with no recovery (this loop has none) it only marks the step."""
        self._note("training_ready")

    def pause_rollout_admission(self) -> bool:
        """Seed step 44: synchronous rollouts have no background producer, so nothing to pause (True)."""
        self._note("pause_rollout_admission")
        return True

    def resume_rollout_admission(self, was_paused: bool) -> None:
        """Seed step 53: the counterpart of step 44 (skipped after the last rollout)."""
        self._note("resume_rollout_admission")

    async def _check_engines(self, rollout_id: int) -> tuple[list[str], list[str]]:
        """After a rollout, before the engines give their memory away: find dead engines and deal with them.

        A dead engine is restarted (the protocol's ``restart()``) and rejoins: it sleeps with the others
        and gets the next weights. If it cannot be restarted, with engines and trainer colocated, its memory cannot be released for
        training, so the run stops here with an EngineError naming it; without colocation it is
        left out of every later control call. Returns (lost, restarted) engine names.
        """
        alive = await asyncio.gather(*(self._healthy(e) for e in self.engines))
        dead = [e for e, ok in zip(self.engines, alive, strict=True) if not ok]
        lost = [e.name for e in dead]
        restarted: list[str] = []
        for engine in dead:
            t0 = self.now()
            try:
                await engine.restart()
            except EngineError as exc:
                cause = exc
            else:
                restarted.append(engine.name)
                self._note("restart_engine", t0)
                continue
            if self.cluster.offload_rollout:
                raise EngineError(engine.name, "health",
                                  f"the engine died during rollout {rollout_id}; every sample was completed on the "
                                  f"other engines, but with colocated training its GPU memory cannot be released "
                                  f"and it could not be restarted ({cause}) — restart the run from the last "
                                  f"checkpoint (--load)") from cause
        if dead:
            self.lost_engines.extend(lost)
            gone = {e.name for e in dead} - set(restarted)
            self.engines = [e for e in self.engines if e.name not in gone]
            self._note("engine_lost")
            if not self.engines:
                raise EngineError(",".join(lost), "health", "every rollout engine is down; the run cannot go on")
        return lost, restarted

    @staticmethod
    async def _healthy(engine: RolloutEngine) -> bool:
        try:
            return bool(await engine.health())
        except EngineError:
            return False

    # --- the report ---------------------------------------------------------------------------------
    def _fill(self, report: StepReport, times: dict[str, float], out: RolloutOutput, batch: TrainBatch,
              metrics: TrainMetrics) -> None:
        for name in (*PHASES, "save", "eval"):
            setattr(report, f"t_{name}", times.get(name, 0.0))
        report.t_step = self.now() - report.t_begin
        accounted = sum(times.get(p, 0.0) for p in (*PHASES, "save", "eval"))
        gap = report.t_step - accounted
        # float rounding of the sum is not a gap; keep the sign clean for reports
        report.t_gap = 0.0 if abs(gap) <= 1e-9 * max(1.0, report.t_step) else gap
        samples = out.samples
        versions = sorted({v for s in samples for v in s.weight_versions[-1:]})
        report.rollout_weight_version = versions[0] if len(versions) == 1 else ",".join(versions) or None
        report.published_version = self.weight_version
        report.flushed_cache = self._last_flush
        report.buckets = self._last_buckets
        report.weight_sync_parts = dict(self._last_publish_parts)
        report.num_samples = len(samples)
        report.num_microbatches = list(batch.num_microbatches)
        report.reward_mean = sum(batch.raw_rewards) / len(batch.raw_rewards) if batch.raw_rewards else 0.0
        report.response_length_mean = sum(batch.response_lengths) / len(samples) if samples else 0.0
        report.rollout = out.stats.as_dict()
        report.train = asdict(metrics)


def _periodic(rollout_id: int, interval: int | None, num_rollout: int) -> bool:
    """Every `interval` rollouts, and after the last one (slime's periodic save/eval rule)."""
    if not interval:
        return False
    return (rollout_id + 1) % interval == 0 or rollout_id + 1 == num_rollout
