"""vllm-router in front of the engines: start the Rust router process, and a Router client that sends generate through it (seed steps 20–21, 28).

Only generate goes through the router; it picks an engine by `--policy` (consistent_hash keys
on the ``X-Session-ID`` header, which `VLLMRouterClient` sets only under that policy, as the
seed does). Control calls — pause, sleep, wake, weight updates, versions, abort — go to each
engine directly: the router would forward them to one worker only.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
from collections.abc import Sequence
from dataclasses import dataclass

import httpx

from vime.errors import ConfigError
from vime.protocols import GenerateRequest, GenerateResult
from vime.real.ports import free_ports
from vime.real.vllm.client import (
    SESSION_HEADER,
    VLLMEngine,
    generate_payload,
    post_generate,
    stamp_client_version,
)
from vime.real.vllm.http import EngineHTTP
from vime.real.vllm.launcher import Launcher
from vime.real.vllm.processes import ManagedProcess

#: Policies of vllm-router 0.1.17 (`vllm-router --help`); vime's config offers a subset.
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "kv_aware", "power_of_two",
                   "consistent_hash", "sticky_least_loaded")


@dataclass(frozen=True)
class RouterSpec:
    """What one vllm-router process is started with."""

    worker_urls: tuple[str, ...]
    policy: str = "round_robin"
    host: str = "127.0.0.1"
    port: int = 0  # 0: pick a free port in router_command's caller
    request_timeout_s: int = 3600  # a paused engine holds requests; the router must not cut them
    prometheus_port: int = 0  # 0: a free port (the default 29000 clashes when two routers run)
    log_level: str = "warning"
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.policy not in ROUTER_POLICIES:
            raise ConfigError(f"router policy {self.policy!r} is not one of vllm-router's {ROUTER_POLICIES}")
        if not self.worker_urls:
            raise ConfigError("vllm-router needs at least one worker URL")

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"


def router_binary() -> str:
    """Path of the `vllm-router` executable installed by `pip install vllm-router`."""
    path = shutil.which("vllm-router")
    if path is None:
        raise ConfigError("vllm-router is not installed: pip install vllm-router (a Rust binary in the wheel)")
    return path


def router_command(spec: RouterSpec, binary: str | None = None) -> list[str]:
    """The argv of `vllm-router --worker-urls ... --policy ...`."""
    if spec.port == 0 or spec.prometheus_port == 0:
        raise ConfigError("RouterSpec.port / prometheus_port is 0: choose ports (vime.real.ports.free_ports())")
    return [binary or router_binary(), "--host", spec.host, "--port", str(spec.port),
            "--worker-urls", *spec.worker_urls, "--policy", spec.policy,
            "--prometheus-host", spec.host, "--prometheus-port", str(spec.prometheus_port),
            "--request-timeout-secs", str(spec.request_timeout_s), "--log-level", spec.log_level,
            *spec.extra_args]


def start_router(launcher: Launcher, spec: RouterSpec, *, timeout_s: float = 120.0,
                 name: str = "router") -> tuple[ManagedProcess, RouterSpec]:
    """Start vllm-router under `launcher` (stopped with everything else) and wait for its /health."""
    if spec.port == 0 or spec.prometheus_port == 0:
        port, prom = free_ports(2, spec.host)
        spec = dataclasses.replace(spec, port=spec.port or port, prometheus_port=spec.prometheus_port or prom)
    proc = launcher.start_process(name, router_command(spec), dict(os.environ), f"{spec.url}/health")
    try:
        proc.wait_healthy(timeout_s)
    except BaseException:
        proc.stop()
        raise
    return proc, spec


class VLLMRouterClient:
    """`vime.protocols.Router` over a real vllm-router: generate through it, control calls to each engine.

    `engines` are the `VLLMEngine`s behind the router; their lifecycles are checked before a
    generate is sent (all must be awake — the router may pick any of them).
    """

    def __init__(self, url: str, engines: Sequence[VLLMEngine], *, policy: str = "round_robin",
                 model: str | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 timeout: httpx.Timeout | None = None, max_concurrency: int = 2048) -> None:
        if policy not in ROUTER_POLICIES:
            raise ConfigError(f"router policy {policy!r} is not one of vllm-router's {ROUTER_POLICIES}")
        self.url = url.rstrip("/")
        self.engines = list(engines)
        self.policy = policy
        self.model = model
        # The router speaks the engines' generate protocol: the same plumbing (named "router" in
        # errors) does the sending, pooling and error mapping.
        self.http = EngineHTTP("router", self.url, transport=transport, timeout=timeout,
                               max_concurrency=max_concurrency)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> VLLMRouterClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def headers(self, request: GenerateRequest) -> dict[str, str] | None:
        """``X-Session-ID`` only under consistent_hash (seed step 21)."""
        if self.policy == "consistent_hash" and request.session_id is not None:
            return {SESSION_HEADER: request.session_id}
        return None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        for engine in self.engines:
            engine.lifecycle.check_generate()
        # the engines behind the router were all started the same way: detokenize only if they can
        payload = generate_payload(request, engine="router", model=self.model,
                                   detokenize=all(e.detokenize for e in self.engines))
        _, result = await post_generate(self.http, payload, self.headers(request), engine=None)
        if result.weight_version is None:
            stamp_client_version(result, self.engines)
        return result

    async def abort_all(self) -> None:
        """Abort every in-flight request on every engine, each addressed directly (seed step 28)."""
        await asyncio.gather(*(e.abort_all() for e in self.engines))

    async def health(self) -> bool:
        return await self.http.health()

    async def list_workers(self) -> list[str]:
        """GET /list_workers → the worker URLs the router routes to."""
        resp = await self.http.request("list_workers", "GET", "/list_workers")
        return list(self.http.field("list_workers", self.http.read_json("list_workers", resp), "urls", list))
