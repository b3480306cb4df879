"""The backend-neutral parts of a run, made from the options: reward, rollout, batch builder and the Orchestrator.

Both assemblers (`vime.runs.sim`, `vime.runs.real`) hand their backends to `build_orchestrator`;
this is the one place that splits the options into the config groups each component reads.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from vime.orchestrator import Orchestrator
from vime.protocols import RolloutEngine, Router, StepObserver, Trainer
from vime.rollout.batch_builder import BatchBuilder
from vime.rollout.data_source import EvalSet
from vime.rollout.generate import Rollout
from vime.rollout.plugins import load_plugins
from vime.rollout.rm_hub import RewardHub


def build_rollout(args: Any, router: Router, *, num_engines: int, tokenizer: Any = None,
                  rm_type: str | None = None, progress: bool | None = None) -> Rollout:
    """The rollout (seed steps 16–28) with its reward and the user functions the flags name."""
    plugins = load_plugins(args)
    reward = RewardHub(args.data, seed=args.seed, rm_type=rm_type, custom=plugins.reward, tokenizer=tokenizer)
    if progress is None and args.json:
        progress = False  # a progress bar would interleave with the JSON on a terminal
    return Rollout(args.rollout, router, num_engines=num_engines, reward=reward, seed=args.seed, tokenizer=tokenizer,
                   dynamic_filter=plugins.dynamic_filter, custom_generate=plugins.generate, progress=progress)


def build_batch_builder(args: Any) -> BatchBuilder:
    """Samples → TrainBatch (seed steps 30–31), split over the trainer's DP ranks."""
    return BatchBuilder(args.train, args.algo, dp_size=args.dp_size, reward_key=args.reward_key)


def build_orchestrator(args: Any, *, engines: Sequence[RolloutEngine], router: Router, trainer: Trainer,
                       data_source: Any, rollout: Rollout, observers: Sequence[StepObserver] = (),
                       eval_sources: Mapping[str, EvalSet] | None = None) -> Orchestrator:
    """The RL loop over these backends (`vime.async_loop` with --async-mode one-step-off / fully-async)."""
    if args.async_mode != "sync":
        from vime.async_loop import AsyncOrchestrator

        return AsyncOrchestrator(args.train, args.cluster, args.weight_sync, async_rl=args.async_rl, engines=engines,
                                 router=router, trainer=trainer, data_source=data_source, rollout=rollout,
                                 batch_builder=build_batch_builder(args), observers=observers,
                                 eval_sources=eval_sources)
    return Orchestrator(args.train, args.cluster, args.weight_sync, engines=engines, router=router, trainer=trainer,
                        data_source=data_source, rollout=rollout, batch_builder=build_batch_builder(args),
                        observers=observers, eval_sources=eval_sources)
