"""Simulated runs: the RL loop on the simulator's backends in virtual time, one entry point for both commands.

`simulate(args)` builds the simulated cluster (`vime.sim.backends`), an Orchestrator over it with
synthetic prompts and the simulator's reward, runs start-up and the steps, and returns a
`Simulation` (reports, backends, an OOM if one happened). Identical inputs and seed give identical
reports. `build_sim_orchestrator` is the wiring alone, for callers that drive the loop themselves.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vime.errors import OutOfMemoryError
from vime.faults import FaultStop
from vime.orchestrator import Orchestrator, RunReport, StartupReport, StepReport
from vime.protocols import StepObserver
from vime.rollout.data_source import DataSource, EvalSet, SyntheticDataset, eval_sets_from_files
from vime.runs.loop import build_orchestrator, build_rollout


@dataclass
class Simulation:
    """One simulated configuration: its reports, the backends and orchestrator it ran on, and the OOM if one happened."""

    args: Any
    backends: Any  # vime.sim.backends.SimBackends
    orchestrator: Orchestrator
    startup: StartupReport | None = None
    steps: list[StepReport] = field(default_factory=list)
    oom: OutOfMemoryError | None = None
    wall_s: float = 0.0
    fixes: list[str] = field(default_factory=list)
    fix_results: list[dict[str, Any]] = field(default_factory=list)  # vime.runs.fixes.simulate_fixes
    offload_choice: Any = None  # vime.runs.offload.Choice, when --train-offload-plan auto chose the plan
    faults: Any = None  # vime.sim.faults.SimFaults with --fault (its log says what happened)

    @property
    def fits(self) -> bool:
        return self.oom is None

    @property
    def report(self) -> RunReport:
        if self.startup is None:
            raise self.oom or RuntimeError("the simulation did not finish start-up")
        return RunReport(self.startup, list(self.steps))


def sim_data_source(args: Any, backends: Any, *, seed_offset: int = 0,
                    n_samples_per_prompt: int | None = None) -> DataSource:
    """The simulator's prompts: the ``--prompt-data`` dataset when given (its prompt lengths are what the
    engines are charged for; text prompts need the ``--hf-checkpoint`` tokenizer), else synthetic prompts
    with lengths from ``--prompt-length`` and token ids below the model's vocabulary."""
    if args.prompt_data:
        import os

        from vime.rollout.data_source import load_tokenizer

        # a tokenizer only from a local checkpoint: the simulator never downloads one
        local = bool(args.hf_checkpoint) and os.path.isdir(args.hf_checkpoint)
        source = DataSource.from_config(args.data, args.rollout, seed=args.seed,
                                        tokenizer=load_tokenizer(args.hf_checkpoint) if local else None)
        if n_samples_per_prompt:
            source.n_samples_per_prompt = n_samples_per_prompt
        return source
    seed = int(args.seed) + seed_offset
    lengths = backends.lengths
    cap = int(args.rollout_max_prompt_len)
    size = int(args.rollout_batch_size) * max(1, int(args.num_rollout)) * 4

    def prompt_length(i: int) -> int:
        return int(lengths.prompt(f"{seed_offset}/{i}", cap))

    dataset = SyntheticDataset(size, prompt_length, vocab_size=int(backends.model.vocab_size), seed=seed,
                               max_prompt_len=cap)
    return DataSource(dataset, n_samples_per_prompt=n_samples_per_prompt or int(args.n_samples_per_prompt),
                      seed=seed)


def build_sim_orchestrator(args: Any, backends: Any, *, engines: Sequence[Any] | None = None,
                           router: Any = None, trainer: Any = None, observers: Sequence[StepObserver] = (),
                           progress: bool | None = False, data_source: DataSource | None = None) -> Orchestrator:
    """An Orchestrator over simulated backends (or over wrappers of them given as engines/router/trainer).

    Prompts come from `sim_data_source`; the reward is ``--rm-type`` when given, else
    the simulator's seeded Bernoulli reward. The backends' recorder observes every phase.
    """
    engines = list(engines if engines is not None else backends.engines)
    router = router if router is not None else backends.router
    trainer = trainer if trainer is not None else backends.trainer
    rollout = build_rollout(args, router, num_engines=len(engines), rm_type=args.rm_type or "sim", progress=progress)
    return build_orchestrator(args, engines=engines, router=router, trainer=trainer,
                              data_source=data_source or sim_data_source(args, backends), rollout=rollout,
                              observers=[backends.recorder, *observers], eval_sources=sim_eval_sets(args, backends))


def sim_eval_sets(args: Any, backends: Any) -> dict[str, EvalSet]:
    """The ``--eval-prompt-data`` sets (each evaluated whole), or, with only ``--eval-interval``, one
    synthetic set named "synthetic" of --rollout-batch-size prompts."""
    if not args.eval_interval:
        return {}
    n = int(args.n_samples_per_eval_prompt)
    if not args.eval_prompt_data:
        return {"synthetic": EvalSet(sim_data_source(args, backends, seed_offset=1, n_samples_per_prompt=n))}
    return eval_sets_from_files(args.data, args.train, max_prompt_len=args.rollout_max_prompt_len, tokenizer=None)


def simulate(args: Any, *, hardware: Any = None, model: Any = None, seed: int | None = None,
             observers: Sequence[StepObserver] = (), progress: bool | None = False,
             wrap: Callable[[Any], dict[str, Any]] | None = None,
             on_startup: Callable[[StartupReport], None] | None = None,
             on_step: Callable[[StepReport], None] | None = None) -> Simulation:
    """Run start-up and steps [start_rollout_id, num_rollout) on simulated backends, in virtual time.

    An out-of-memory ends the run and is kept in the result (`Simulation.oom`); other errors
    propagate. `wrap(backends)` may return replacements ``{"engines": ..., "router": ...,
    "trainer": ...}`` (recording wrappers in tests). The same arguments and seed give identical reports.
    """
    from vime.sim import clock
    from vime.sim.backends import build_sim_backends

    t0 = time.perf_counter()
    choice = None
    if getattr(args, "train_offload_plan", "all") == "auto":  # the simulator chooses, then runs the choice
        from vime.runs.offload import choose_plan

        choice = choose_plan(args)
        args = args.replace(train_offload_plan=choice.chosen.plan,
                            gpu_memory_utilization=choice.chosen.gpu_memory_utilization)
    backends = build_sim_backends(args, hardware=hardware, model=model, seed=seed, start=False)
    replaced = wrap(backends) if wrap is not None else {}
    faults = None
    if getattr(args, "fault", ()):
        from vime.sim.faults import SimFaults

        faults = SimFaults(args, backends)
        replaced = faults.wrap(backends, replaced)
        observers = [*observers, faults]
    orch = build_sim_orchestrator(args, backends, observers=observers, progress=progress, **replaced)
    result = Simulation(args, backends, orch, offload_choice=choice, faults=faults)

    def startup_done(report: StartupReport) -> None:
        result.startup = report
        if on_startup is not None:
            on_startup(report)

    def step_done(report: StepReport) -> None:
        result.steps.append(report)
        if on_step is not None:
            on_step(report)

    async def main() -> None:
        await backends.start()
        await orch.run(on_startup=startup_done, on_step=step_done)

    try:
        clock.run(main(), env=backends.env)
    except OutOfMemoryError as exc:
        result.oom = backends.recorder.oom or exc
    except FaultStop:
        if faults is None:
            raise
        # the run ended as its --fault said (faults.log.stopped); the steps before it are kept
    result.wall_s = time.perf_counter() - t0
    return result
