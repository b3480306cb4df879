"""The rollout engines of a run as Ray actors on their placement bundles: start them, restart one, stop all (seed step 2).

`EngineFleet(reserved, log_dir).start(specs)` puts one `EngineHost` actor on each engine's first
bundle of the reserved placement (`vime.real.cluster`), gives its server the GPUs of all its
bundles, and waits until every server is healthy (the first failure stops the wait and names
the engine, its node and its log). The returned specs carry each server's address: loopback on
the driver's node, the node's IP elsewhere — what the router and the clients connect to.
`stop_all()` asks every actor to stop its server, waits for that, and kills the actors; a
server whose actor or node is gone is stopped by its guard.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.errors import EngineError, VimeError
from vime.real.cluster import ReservedPlacement
from vime.real.vllm.host import CommandFn, EngineHost
from vime.real.vllm.launcher import ServerSpec
from vime.real.vllm.processes import GUARD_GRACE_S

#: Threads of an EngineHost actor: stop and log_tail must not queue behind a long wait_healthy.
HOST_CONCURRENCY = 4


@dataclass
class HostedEngine:
    """One engine of the fleet: its name, actor, final spec and where it runs."""

    name: str
    actor: Any
    spec: ServerSpec | None = None
    node_ip: str = "?"
    node_id: str = ""
    pid: int | None = None  # the server's guard (its process group holds the server)
    actor_pid: int | None = None


def engine_error(name: str, call: str, exc: BaseException, node_ip: str = "?") -> VimeError:
    """A Ray failure of an engine actor as the vime error it stands for: the actor's own error as is,
    a dead actor (its node failed, or it was killed) as an EngineError naming the node."""
    import ray

    if isinstance(exc, ray.exceptions.RayTaskError) and isinstance(exc.cause, VimeError):
        return exc.cause
    if isinstance(exc, VimeError):
        return exc
    if isinstance(exc, ray.exceptions.RayActorError):
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return EngineError(name, call, f"its Ray actor on node {node_ip} is gone (the node failed or the process "
                           f"was killed): {first}")
    return EngineError(name, call, f"{type(exc).__name__}: {exc}")


class EngineFleet:
    """The engines of `reserved.plan`, each hosted by a Ray actor on its bundles (see the module docstring)."""

    def __init__(self, reserved: ReservedPlacement, log_dir: str | Path, *, command: CommandFn | None = None) -> None:
        self.reserved = reserved
        self.log_dir = Path(log_dir)
        self.command = command
        self.engines: list[HostedEngine] = []

    def start(self, specs: Sequence[ServerSpec], *, timeout_s: float = 600.0,
              need_paths: Sequence[str] = ()) -> list[ServerSpec]:
        """Start one server per spec (spec i is engine i of the plan) and wait until all are healthy."""
        import ray

        plan = self.reserved.plan
        if len(specs) != len(plan.engines):
            raise EngineError("fleet", "start", f"{len(specs)} server specs for the plan's {len(plan.engines)} engines")
        remote: Any = ray.remote(EngineHost)
        for place, spec in zip(plan.engines, specs, strict=True):
            devices = self.reserved.cuda_devices(place.bundles)
            if devices is not None:
                spec = dataclasses.replace(spec, cuda_visible_devices=devices)
            actor = remote.options(scheduling_strategy=self.reserved.scheduling(place.bundles[0]),
                                   max_concurrency=HOST_CONCURRENCY, **plan.engine_options
                                   ).remote(place.name, str(self.log_dir))
            node = self.reserved.bundle_node(place.bundles[0])
            self.engines.append(HostedEngine(place.name, actor, node_ip=node.ip, node_id=node.node_id))
            self.engines[-1].spec = spec
        started = self._each("start", lambda e: e.actor.start.remote(
            e.spec, driver_node_id=self.reserved.driver_node_id, need_paths=list(need_paths), command=self.command))
        for e, info in zip(self.engines, started, strict=True):
            e.spec, e.pid, e.actor_pid = info["spec"], info["server_pid"], info["actor_pid"]
            e.node_ip, e.node_id = info["ip"], info["node_id"]
        self._each("start", lambda e: e.actor.wait_healthy.remote(timeout_s))
        return [e.spec for e in self.engines if e.spec is not None]

    def _each(self, call: str, submit: Any) -> list[Any]:
        """Run one call on every engine's actor; the first failure raises (naming that engine) without
        waiting for the others."""
        import ray

        refs = [submit(e) for e in self.engines]
        owner = {ref.hex(): e for ref, e in zip(refs, self.engines, strict=True)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except Exception as exc:  # noqa: BLE001 - converted into the vime error it stands for
                e = owner[done[0].hex()]
                raise engine_error(e.name, call, exc, e.node_ip) from exc
        return ray.get(refs)

    def _find(self, name: str) -> HostedEngine:
        for e in self.engines:
            if e.name == name:
                return e
        raise EngineError(name, "restart", f"no engine named {name!r} in this fleet")

    def restart(self, name: str, *, timeout_s: float = 600.0) -> float:
        """Restart engine `name`'s server through its actor (same command, GPUs, port and log)."""
        import ray

        e = self._find(name)
        try:
            took = float(ray.get(e.actor.restart.remote(timeout_s)))
            e.pid = ray.get(e.actor.server_pid.remote())
        except Exception as exc:  # noqa: BLE001 - converted into the vime error it stands for
            raise engine_error(name, "restart", exc, e.node_ip) from exc
        return took

    def log_tail(self, name: str, lines: int = 40) -> str:
        import ray

        e = self._find(name)
        try:
            return str(ray.get(e.actor.log_tail.remote(lines), timeout=30))
        except Exception as exc:  # noqa: BLE001 - a log that cannot be read is reported, not raised
            return f"(log of {name} on node {e.node_ip} unreadable: {engine_error(name, 'log_tail', exc, e.node_ip)})"

    def describe(self) -> list[str]:
        return [f"  {e.name}: {e.spec.url if e.spec else '-'} on node {e.node_ip} ({e.node_id[:8]}), pid {e.pid}"
                for e in self.engines]

    def stop_all(self, grace_s: float = 15.0) -> None:
        """Stop every server (waiting for it, bounded), then kill the actors; never raises."""
        import ray

        engines, self.engines = self.engines, []
        if not engines:
            return
        refs = []
        for e in engines:
            try:
                refs.append(e.actor.stop.remote(grace_s))
            except Exception:  # noqa: BLE001 - teardown goes on
                pass
        deadline = time.monotonic() + grace_s + GUARD_GRACE_S + 10.0
        try:
            ray.wait(refs, num_returns=len(refs), timeout=max(0.0, deadline - time.monotonic()))
        except Exception:  # noqa: BLE001 - a dead actor answers with an error, which is fine here
            pass
        for e in engines:
            try:
                ray.kill(e.actor)  # a server not yet stopped dies with its guard's owner
            except Exception:  # noqa: BLE001 - teardown goes on
                pass


__all__ = ["EngineFleet", "HostedEngine", "engine_error"]
