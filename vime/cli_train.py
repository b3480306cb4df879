"""`vime train`: build the backends (simulated with --backend sim, real GPUs with --backend real) and run the RL loop.

The public entry points other commands build on:

- `simulate_training(args, ...) -> SimRun`: the whole loop (start-up + every step) on the
  simulated backends, in virtual time; deterministic for a given seed.
- `build_sim_orchestrator(args, backends, ...)`: the Orchestrator wired to simulated backends
  (data source of synthetic prompts, the simulator's reward), for callers that drive it themselves.
- `format_step(report)`: one human line of phase times for a StepReport.
- `run_train(args) -> int`: the `vime train` command.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vime.errors import ConfigError
from vime.orchestrator import PHASES, Orchestrator, RunReport, StartupReport, StepReport
from vime.protocols import StepObserver
from vime.rollout.data_source import DataSource, SyntheticDataset
from vime.rollout.generate import Rollout
from vime.rollout.rm_hub import RewardHub

_SHORT = {"rollout": "rollout", "offload": "offload", "train": "train", "onload_weights": "onload_w",
          "weight_sync": "sync", "onload_kv": "onload_kv"}


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------


def format_step(report: StepReport) -> str:
    """One line per step: T_step, each phase in seconds and percent, the gap, and rollout counts."""
    total = report.t_step or 1.0
    phases = "  ".join(f"{_SHORT[p]} {t:8.3f}s {100 * t / total:5.1f}%" for p, t in report.phases().items())
    extra = ""
    if report.t_save:
        extra += f"  save {report.t_save:.3f}s"
    if report.t_eval:
        extra += f"  eval {report.t_eval:.3f}s"
    if report.lost_engines:
        extra += "  LOST " + ",".join(report.lost_engines)
        if report.restarted_engines:
            extra += " (restarted " + ",".join(report.restarted_engines) + ")"
    r = report.rollout
    return (f"step {report.rollout_id:>4}  T_step {report.t_step:9.3f}s  {phases}{extra}  gap {report.t_gap:.3f}s"
            f"  | v{report.rollout_weight_version}→v{report.published_version}"
            f"  samples {report.num_samples} (gen {r.get('generated_samples', 0)}, drop {r.get('dropped_samples', 0)},"
            f" abort {r.get('aborted_samples', 0)})  reward {report.reward_mean:.3f}"
            f"  resp_len {report.response_length_mean:.1f}")


def format_startup(report: StartupReport) -> str:
    return (f"start-up {report.t_total:.3f}s  onload_weights {report.t_onload_weights:.3f}s  "
            f"weight_sync {report.t_weight_sync:.3f}s ({report.buckets} buckets, v{report.weight_version})  "
            f"onload_kv {report.t_onload_kv:.3f}s")


class _Printer:
    """Prints start-up and each step as it finishes: a table line, or one JSON object per line with --json."""

    def __init__(self, as_json: bool, out: Any = None) -> None:
        self.as_json = as_json
        self.out = out or sys.stdout

    def header(self, backend: str, extra: dict[str, Any]) -> None:
        if self.as_json:
            self._emit({"event": "run", "backend": backend, **extra})
        else:
            print(f"vime train --backend {backend}: " + ", ".join(f"{k} {v}" for k, v in extra.items()),
                  file=self.out, flush=True)
            print("phases: " + ", ".join(f"{_SHORT[p]} = T_{p}" for p in PHASES), file=self.out, flush=True)

    def startup(self, report: StartupReport) -> None:
        if self.as_json:
            self._emit({"event": "startup", **report.to_dict()})
        else:
            print(format_startup(report), file=self.out, flush=True)

    def step(self, report: StepReport) -> None:
        if self.as_json:
            self._emit({"event": "step", "rollout_id": report.rollout_id, "phases": report.phases(),
                        "t_gap": report.t_gap, "t_step": report.t_step, "metrics": report.metrics()})
        else:
            print(format_step(report), file=self.out, flush=True)

    def _emit(self, obj: dict[str, Any]) -> None:
        print(json.dumps(obj, sort_keys=True), file=self.out, flush=True)


# --------------------------------------------------------------------------------------------
# Simulated backends
# --------------------------------------------------------------------------------------------


@dataclass
class SimRun:
    """A finished simulated run: the reports and the backends (recorder, engines, GPUs) it ran on."""

    report: RunReport
    backends: Any  # vime.sim.backends.SimBackends
    orchestrator: Orchestrator


def synthetic_data_source(args: Any, backends: Any, *, seed_offset: int = 0,
                          n_samples_per_prompt: int | None = None) -> DataSource:
    """Synthetic prompts for the simulator: lengths from ``--prompt-length``, token ids below the model's vocab."""
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

    Prompts are synthetic (`synthetic_data_source`); the reward is ``--rm-type`` when given, else
    the simulator's seeded Bernoulli reward. The backends' recorder observes every phase.
    """
    engines = list(engines if engines is not None else backends.engines)
    router = router if router is not None else backends.router
    trainer = trainer if trainer is not None else backends.trainer
    reward = RewardHub(args, rm_type=getattr(args, "rm_type", None) or "sim")
    rollout = Rollout(args, router, num_engines=len(engines), reward=reward, progress=progress)
    eval_source = None
    if getattr(args, "eval_interval", None):
        eval_source = synthetic_data_source(args, backends, seed_offset=1,
                                            n_samples_per_prompt=getattr(args, "n_samples_per_eval_prompt", None) or 1)
    return Orchestrator(args, engines=engines, router=router, trainer=trainer,
                        data_source=data_source or synthetic_data_source(args, backends), rollout=rollout,
                        observers=[backends.recorder, *observers], eval_source=eval_source)


def simulate_training(args: Any, *, hardware: Any = None, model: Any = None, seed: int | None = None,
                      observers: Sequence[StepObserver] = (), progress: bool | None = False,
                      wrap: Callable[[Any], dict[str, Any]] | None = None,
                      on_startup: Callable[[StartupReport], None] | None = None,
                      on_step: Callable[[StepReport], None] | None = None) -> SimRun:
    """Run start-up and steps [start_rollout_id, num_rollout) on simulated backends, in virtual time.

    `wrap(backends)` may return replacements ``{"engines": ..., "router": ..., "trainer": ...}``
    (recording wrappers in tests). The same arguments and seed give identical reports.
    """
    from vime.sim import clock
    from vime.sim.backends import build_sim_backends

    backends = build_sim_backends(args, hardware=hardware, model=model, seed=seed, start=False)
    replaced = wrap(backends) if wrap is not None else {}
    orch = build_sim_orchestrator(args, backends, observers=observers, progress=progress, **replaced)

    async def main() -> RunReport:
        await backends.start()
        return await orch.run(on_startup=on_startup, on_step=on_step)

    report = clock.run(main(), env=backends.env)
    return SimRun(report, backends, orch)


# --------------------------------------------------------------------------------------------
# Real backends
# --------------------------------------------------------------------------------------------


def run_real(args: Any, printer: _Printer) -> RunReport:
    """Launch vLLM servers + vllm-router and the Megatron actors, then run the loop on a real event loop."""
    try:
        from vime.real.session import real_session
    except ImportError as exc:
        raise ConfigError(
            "`vime train --backend real` needs the real backends (vime.real.session: vLLM servers behind "
            "vllm-router, Megatron actors on Ray), which are not available in this installation "
            f"({exc}); install `vime[vllm,train]`, or run the loop on the simulator with --backend sim") from exc
    import asyncio

    async def main() -> RunReport:
        async with real_session(args) as session:
            orch = Orchestrator(args, engines=session.engines, router=session.router, trainer=session.trainer,
                                data_source=session.data_source, tokenizer=session.tokenizer,
                                eval_source=getattr(session, "eval_source", None),
                                observers=list(getattr(session, "observers", ())))
            return await orch.run(on_startup=printer.startup, on_step=printer.step)

    return asyncio.run(main())


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def run_train(args: Any) -> int:
    """`vime train`: run the loop on ``--backend sim`` or ``real`` and print each step's phase times."""
    printer = _Printer(bool(getattr(args, "json", False)))
    backend = getattr(args, "backend", "real")
    if backend == "sim":
        printer.header("sim", {"hardware": args.hardware, "model": args.model, "engines": args.rollout_num_engines,
                               "samples_per_rollout": args.samples_per_rollout, "seed": args.seed})
        simulate_training(args, progress=None, on_startup=printer.startup, on_step=printer.step)
        return 0
    if backend == "real":
        printer.header("real", {"hf_checkpoint": args.hf_checkpoint, "engines": args.rollout_num_engines})
        run_real(args, printer)
        return 0
    raise ConfigError(f"--backend {backend!r} is unknown; use sim or real")
