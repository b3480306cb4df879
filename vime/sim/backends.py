"""Assemble the simulated backends the orchestrator drives: GPUs, engines, router, trainer, in their start-up state.

`build_sim_backends(args)` places the pieces the way slime / vime do on real hardware (seed
section 0 and steps 2–4):

- colocate: engine k on GPUs [k·g, (k+1)·g) with g = --rollout-num-gpus-per-engine, sharing
  each GPU with the trainer ranks there (the trainer holds GPUs [0, actor GPUs));
- disaggregated (--no-colocate): the trainer on GPUs [0, A), engine k on [A + k·g, A + (k+1)·g).

Start-up (before the orchestrator's seed step 4): every engine is created — weights, runtime
workspace, CUDA graphs and KV cache mapped on its GPUs — and, with --offload-rollout, put to sleep
at level 2 before Megatron initialises (its weights are pushed by seed step 8 anyway); then the
trainer initialises, awake like the real actors (the orchestrator's start-up puts it to sleep with
--offload-train, seed step 3). The virtual clock therefore starts the first step at `startup_s`, not 0.
The profile's ``engine`` costs become the engines' `EngineSettings`; on a CPU profile sleep and
wake release nothing (`SimAllocator.sleep_mode`, from `HardwareSpec.sleep_mode`); with --update-weight-mode disk the engines
and the trainer are wrapped as the real session wraps them (`vime.sim.disk_sync`).
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any

import simpy

from vime.errors import SimulationError
from vime.protocols import STARTUP_SLEEP_LEVEL
from vime.report.recorder import Recorder
from vime.sim.engine import EngineSettings, SimEngine, engine_allocator
from vime.sim.hardware import HardwareSpec, load_hardware
from vime.sim.lengths import LengthSampler
from vime.sim.memory import SimCluster, SimGPU, SimHost
from vime.sim.models import ModelSpec, load_model
from vime.sim.router import SimRouter
from vime.sim.trainer import SimTrainer


@dataclass
class SimBackends:
    """Everything one simulation runs on; the orchestrator receives it instead of real backends."""

    env: simpy.Environment
    engines: list[Any]  # SimEngine, or its disk-sync wrapper (vime.sim.disk_sync) with --update-weight-mode disk
    router: SimRouter
    trainer: Any  # SimTrainer, or its disk-sync wrapper
    gpus: list[SimGPU]
    host: SimHost
    recorder: Recorder
    hardware: HardwareSpec
    model: ModelSpec
    cluster: SimCluster | None = None
    lengths: LengthSampler | None = None
    settings: EngineSettings | None = None
    engine_gpus: dict[str, list[int]] = field(default_factory=dict)
    startup_s: float = 0.0
    started: bool = False
    colocate: bool = True
    offload_rollout: bool = True

    async def start(self) -> None:
        """The start-up state: engines asleep (with --offload-rollout), then the trainer initialised."""
        if self.started:
            raise SimulationError("SimBackends.start() called twice")
        t0 = float(self.env.now)
        if self.offload_rollout:
            await asyncio.gather(*(e.sleep(STARTUP_SLEEP_LEVEL) for e in self.engines))
        # Awake, as the real actors come up: the orchestrator's start-up puts it to sleep (seed step 3).
        await self.trainer.init(sleep=False)
        self.started = True
        self.startup_s = float(self.env.now) - t0

    def engine_stats(self) -> dict[str, dict[str, Any]]:
        """Per-engine statistics (tokens, busy time, KV blocks, preemptions, batch sizes) for reports."""
        return {e.name: e.stats.to_dict() for e in self.engines}

    def rollout_stats(self) -> dict[str, Any]:
        """Engine statistics summed over the engines, plus the router's view."""
        stats = [e.stats for e in self.engines]
        busy = [s.busy_s for s in stats]
        return {
            "engines": len(stats),
            "tokens_generated": sum(s.tokens_generated for s in stats),
            "prefill_tokens": sum(s.prefill_tokens for s in stats),
            "requests": sum(s.requests for s in stats),
            "aborted": sum(s.aborted for s in stats),
            "preemptions": sum(s.preemptions for s in stats),
            "iterations": sum(s.iterations for s in stats),
            "busy_s_max": max(busy, default=0.0),
            "busy_s_mean": sum(busy) / len(busy) if busy else 0.0,
            "kv_blocks_total": stats[0].kv_blocks_total if stats else 0,
            "kv_blocks_peak": max((s.kv_blocks_peak for s in stats), default=0),
            "routed": dict(self.router.routed),
            "retries": len(self.router.retries),
        }


def _in_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def build_sim_backends(args: Any, *, env: simpy.Environment | None = None,
                       hardware: HardwareSpec | str | None = None, model: ModelSpec | str | None = None,
                       seed: int | None = None, start: bool = True, record_events: bool = False) -> SimBackends:
    """Build the simulated cluster for `args` (a `vime.config.Args`) in its start-up state.

    `hardware` / `model` override ``args.hardware`` / ``args.model`` (a spec or a preset name);
    `seed` overrides ``args.seed``. With ``start=True`` (default) the start-up (engines asleep,
    trainer initialised) runs now on the virtual clock, which must not be running yet; inside a
    running simulation pass ``start=False`` and ``await backends.start()``. A placement that does
    not fit raises OutOfMemoryError naming the GPU, owner and tag.
    """
    hw = hardware if isinstance(hardware, HardwareSpec) else load_hardware(hardware or args.hardware)
    mdl = model if isinstance(model, ModelSpec) else load_model(model or args.model)
    seed = int(args.seed if seed is None else seed)
    env = env if env is not None else simpy.Environment()

    actor_gpus = int(args.actor_num_nodes) * int(args.actor_num_gpus_per_node)
    rollout_gpus = int(args.rollout_num_gpus)
    per_engine = int(args.rollout_num_gpus_per_engine)
    colocate = bool(args.colocate)
    first = 0 if colocate else actor_gpus
    total = max(actor_gpus, rollout_gpus) if colocate else actor_gpus + rollout_gpus
    cluster = SimCluster.create(env, hw, total)

    response = args.response_length
    if response is None:
        from vime.config import default_response_spec

        response = default_response_spec(int(args.rollout_max_response_len))
    lengths = LengthSampler(response, args.prompt_length, seed=seed)
    settings = EngineSettings.from_args(args, **hw.engine_overrides())
    if not colocate:
        # Disaggregated: weights reach the engines by NCCL broadcast, not CUDA IPC (seed step 3).
        settings = dataclasses.replace(settings, weight_transfer_bytes_per_s=hw.bus_bytes_per_s(inter_node=True))

    engines: list[SimEngine] = []
    placement: dict[str, list[int]] = {}
    for k in range(rollout_gpus // per_engine):
        name = f"engine{k}"
        ids = list(range(first + k * per_engine, first + (k + 1) * per_engine))
        allocator = engine_allocator(name, [cluster.gpus[i] for i in ids], hw, host=cluster.host,
                                     recorder=cluster.recorder, env=env)
        engines.append(SimEngine(name, env, hw, mdl, settings, lengths, seed=seed, allocator=allocator,
                                 observer=cluster.recorder, record_events=record_events))
        placement[name] = ids
    router = SimRouter(engines, str(args.router_policy), seed=seed, recorder=cluster.recorder)
    trainer: Any = SimTrainer(args.cluster, args.parallel, args.algo, mdl, cluster, seed=seed,
                              start_rollout_id=args.start_rollout_id,
                              moe_load_imbalance=getattr(args, "moe_load_imbalance", None))
    exposed: list[Any] = list(engines)
    if args.update_weight_mode == "disk":
        from vime.sim.disk_sync import wrap_disk_sync

        exposed, trainer = wrap_disk_sync(engines, trainer)
    backends = SimBackends(env, exposed, router, trainer, cluster.gpus, cluster.host, cluster.recorder, hw, mdl,
                           cluster=cluster, lengths=lengths, settings=settings, engine_gpus=placement,
                           colocate=colocate, offload_rollout=bool(args.offload_rollout))
    if start:
        if _in_running_loop():
            raise SimulationError("build_sim_backends(start=True) cannot run the start-up inside a running "
                                  "event loop; pass start=False and `await backends.start()`")
        from vime.sim import clock

        clock.run(backends.start(), env=env)
    return backends
