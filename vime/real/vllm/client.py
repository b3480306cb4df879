"""The real RolloutEngine: an async HTTP client of one `vllm serve` process (seed steps 5–7, 10–13, 20–25, 35, 46–52).

One `VLLMEngine` talks to one server through `EngineHTTP` (pooled connections, transport passed
in: tests give an `httpx.MockTransport`). Every method checks the shared `EngineLifecycle` before
any I/O (`LifecycleError`, same as the simulator) and every failure of the server — connection
refused, timeouts, 4xx/5xx, malformed JSON, responses that break an invariant — is an
`EngineError` naming the engine, the call, the HTTP status and an excerpt of the body.

Server versions differ (shared/VLLM_API.md); what this client met is recorded in
`VLLMEngine.behaviour` (e.g. ``{"reset_prefix_cache": "json-success", "weight_info": "route"}``).
"""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx

from vime.errors import ConfigError, EngineError
from vime.protocols import (
    EngineLifecycle,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    WeightBucket,
)
from vime.real.vllm.http import KEEPALIVE_EXPIRY_S, EngineHTTP
from vime.real.vllm.response import decode_generate, parse_generate_response

GENERATE_PATH = "/inference/v1/generate"
SESSION_HEADER = "X-Session-ID"


def generate_payload(request: GenerateRequest, *, engine: str, model: str | None,
                     detokenize: bool = True) -> dict[str, Any]:
    """The JSON body of /inference/v1/generate (seed step 20): token ids in, vLLM sampling params."""
    if not request.token_ids:
        raise ConfigError(f"engine {engine}: generate needs at least one prompt token id")
    params = request.sampling_params
    if not detokenize:
        params = {**params, "detokenize": False}
    payload: dict[str, Any] = {"token_ids": request.token_ids, "sampling_params": params}
    if model is not None:
        payload["model"] = model
    if request.request_id is not None:
        payload["request_id"] = request.request_id
    return payload


async def post_generate(http: EngineHTTP, payload: Mapping[str, Any], headers: Mapping[str, str] | None, *,
                        engine: str | None) -> tuple[httpx.Response, GenerateResult]:
    """POST one generate and parse its answer (seed steps 20–25); `engine` labels the result (None: via a router)."""
    resp = await http.request("generate", "POST", GENERATE_PATH, json_body=payload, headers=headers)
    data = http.read_json("generate", resp, decode=decode_generate)
    return resp, parse_generate_response(data, engine=engine)


def stamp_client_version(result: GenerateResult, engines: Sequence[VLLMEngine]) -> None:
    """Label a response whose server reports no weight version (vLLM 0.25.1) with the version these
    engines' clients last finished, when they all agree: no update can land while a synchronous
    rollout runs (seed steps 44-53 happen between rollouts), so that is the version that served it."""
    versions = {e.lifecycle.weight_version for e in engines}
    if len(versions) == 1:
        (v,) = versions
        if v is not None:
            result.weight_version = str(v)


class VLLMEngine:
    """HTTP client of one vLLM server, implementing `vime.protocols.RolloutEngine`.

    `base_url` is the server's root (``http://host:port``). `model` is sent as the request's
    ``model`` (the served model name; None omits it). `session_header` adds ``X-Session-ID``
    to generate calls (needed when a consistent_hash router sits in front, seed step 21).
    `flush_retries` / `flush_interval_s` bound the reset_prefix_cache retry loop (seed step 46:
    once a second, 60 times). `sleep` is the coroutine used between retries (tests pass a fake).
    `keepalive_expiry_s` must stay below the server's keep-alive timeout (KEEPALIVE_EXPIRY_S).
    """

    def __init__(self, name: str, base_url: str, *, model: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 timeout: httpx.Timeout | None = None, control_timeout_s: float = 300.0,
                 max_concurrency: int = 1024, session_header: bool = False,
                 flush_retries: int = 60, flush_interval_s: float = 1.0,
                 keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S,
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, detokenize: bool = True,
                 relaunch: Callable[[], Awaitable[None]] | None = None) -> None:
        self._http_args = dict(transport=transport, timeout=timeout, max_concurrency=max_concurrency,
                               keepalive_expiry_s=keepalive_expiry_s)
        self.http = EngineHTTP(name, base_url, **self._http_args)  # type: ignore[arg-type]
        #: starts this engine's server again (the session's launcher); None: this client cannot restart it
        self.relaunch = relaunch
        self.name = name
        self.base_url = self.http.base_url
        self.model = model
        #: False for a server started with --skip-tokenizer-init (a model without a tokenizer): every
        #: generate then asks for token ids only, since there is nothing to detokenize with
        self.detokenize = detokenize
        self.lifecycle = EngineLifecycle(name)
        self.session_header = session_header
        self.flush_retries = flush_retries
        self.flush_interval_s = flush_interval_s
        self.control_timeout_s = control_timeout_s
        self._sleep = sleep
        #: which server behaviour was met, per feature (see module docstring)
        self.behaviour: dict[str, str] = {}
        #: the weight version carried by the last generate response (fallback for weight_version())
        self.last_response_version: str | None = None

    # ---------------------------------------------------------------------------------------
    # plumbing
    # ---------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        await self.http.aclose()

    async def restart(self) -> None:
        """Relaunch a dead server (same command, GPUs and log), wait until healthy, and start over with
        fresh connections and a fresh lifecycle: awake, no weight version until the next publication."""
        if self.relaunch is None:
            raise EngineError(self.name, "restart", "this client was not given a way to relaunch its server")
        await self.http.aclose()
        await self.relaunch()
        self.http = EngineHTTP(self.name, self.base_url, **self._http_args)  # type: ignore[arg-type]
        self.lifecycle = EngineLifecycle(self.name)
        self.last_response_version = None

    async def __aenter__(self) -> VLLMEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"VLLMEngine({self.name!r}, {self.base_url!r})"

    async def _control(self, call: str, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One control call with the control timeout."""
        return await self.http.request(call, method, path, timeout=self.control_timeout_s, **kwargs)

    def _read(self, call: str, resp: httpx.Response, key: str, kind: type | tuple[type, ...]) -> Any:
        """`key` of the response's JSON object, of type `kind`."""
        return self.http.field(call, self.http.read_json(call, resp), key, kind)

    # ---------------------------------------------------------------------------------------
    # generation (seed steps 20–25)
    # ---------------------------------------------------------------------------------------

    def generate_payload(self, request: GenerateRequest) -> dict[str, Any]:
        """The JSON body of this engine's /inference/v1/generate (see `generate_payload`)."""
        return generate_payload(request, engine=self.name, model=self.model, detokenize=self.detokenize)

    def generate_headers(self, request: GenerateRequest) -> dict[str, str] | None:
        if self.session_header and request.session_id is not None:
            return {SESSION_HEADER: request.session_id}
        return None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate for one prompt; see `RolloutEngine.generate`. A paused server holds the call until resume."""
        self.lifecycle.check_generate()
        resp, result = await post_generate(self.http, self.generate_payload(request), self.generate_headers(request),
                                           engine=self.name)
        self._note_version(resp, result)
        return result

    def _note_version(self, resp: httpx.Response, result: GenerateResult) -> None:
        server_said = result.weight_version is not None
        if not server_said:
            stamp_client_version(result, [self])
        if server_said:
            self.last_response_version = result.weight_version
        if "weight_version" not in self.behaviour:
            text = resp.text
            self.behaviour["weight_version"] = ("spans" if '"weight_versions"' in text else
                                                "field" if '"weight_version"' in text else
                                                "absent (stamped with this client's finished version)")
            self.behaviour["logprob_token"] = ("numeric token_id" if '"token_id":' in text else
                                               "token_id:<id> string" if '"token_id:' in text else "none")

    # ---------------------------------------------------------------------------------------
    # memory: sleep / wake (seed steps 5–7, 10–13, 34–36)
    # ---------------------------------------------------------------------------------------

    async def sleep(self, level: int, mode: PauseMode = "keep") -> None:
        """POST /sleep?level=L&mode=M (seed step 35). Level 1 or 2 (level 0 = pause, use `pause`)."""
        self.lifecycle.check_sleep(level)
        if mode not in ("abort", "wait", "keep"):
            raise ConfigError(f"engine {self.name}: sleep mode must be abort, wait or keep, got {mode!r}")
        await self._control("sleep", "POST", "/sleep", params={"level": level, "mode": mode})
        self.lifecycle.on_sleep(level)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """POST /wake_up with vLLM's tags only (seed steps 6, 12): [kv_cache, cuda_graph] → tags=kv_cache.

        A list that normalises to nothing (only vime's implicit tags, e.g. [cuda_graph]) sends no
        request: vLLM wakes those with any wake, and an empty tag list would mean "wake all".
        """
        normalized = self.lifecycle.check_wake(tags)
        if normalized is not None and not normalized:
            return
        params = None if normalized is None else [("tags", t) for t in normalized]
        await self._control("wake_up", "POST", "/wake_up", params=params)
        self.lifecycle.on_wake(normalized)

    async def is_sleeping(self) -> bool:
        resp = await self._control("is_sleeping", "GET", "/is_sleeping")
        return bool(self._read("is_sleeping", resp, "is_sleeping", bool))

    # ---------------------------------------------------------------------------------------
    # pause / resume / flush (seed steps 46, 52)
    # ---------------------------------------------------------------------------------------

    async def pause(self, mode: PauseMode = "abort") -> None:
        """POST /pause?mode=M&clear_cache=false: the cache is flushed explicitly by `flush_cache` (seed step 46)."""
        self.lifecycle.check_pause(mode)
        await self._control("pause", "POST", "/pause", params={"mode": mode, "clear_cache": "false"})
        self.lifecycle.on_pause(mode)

    async def resume(self) -> None:
        await self._control("resume", "POST", "/resume")
        self.lifecycle.on_resume()

    async def is_paused(self) -> bool:
        resp = await self._control("is_paused", "GET", "/is_paused")
        return bool(self._read("is_paused", resp, "is_paused", bool))

    async def flush_cache(self) -> None:
        """Reset the prefix cache and running requests; retry while the server says blocks are held (seed step 46).

        Older servers answer an empty 200 (taken as success), newer ``{"success": bool}``.
        """
        self.lifecycle.check_flush()
        params = {"reset_running_requests": "true", "reset_external": "true"}
        for attempt in range(1, self.flush_retries + 1):
            resp = await self._control("flush_cache", "POST", "/reset_prefix_cache", params=params)
            data = self.http.read_json("flush_cache", resp, allow_empty=True)
            if data is None:
                self.behaviour["reset_prefix_cache"] = "empty-200"
                return
            ok = self.http.field("flush_cache", data, "success", bool)
            self.behaviour["reset_prefix_cache"] = "json-success"
            if ok:
                return
            if attempt < self.flush_retries:
                await self._sleep(self.flush_interval_s)
        raise self.http.error("flush_cache", f"reset_prefix_cache still answered success=false after "
                                             f"{self.flush_retries} attempts (blocks held by running requests)",
                              retryable=True)

    async def abort_all(self) -> int | None:
        """POST /abort_requests {} — abort every in-flight request without pausing (seed step 28)."""
        resp = await self._control("abort_all", "POST", "/abort_requests", json_body={})
        data = self.http.read_json("abort_all", resp, allow_empty=True)
        return data.get("aborted") if isinstance(data, Mapping) else None

    # ---------------------------------------------------------------------------------------
    # weight update (seed steps 47–51)
    # ---------------------------------------------------------------------------------------

    async def init_weight_transfer(self, init_info: Mapping[str, Any]) -> None:
        """POST /init_weight_transfer_engine (IPC: ``{"packed": bool}``; NCCL: address, port, ranks)."""
        await self._control("init_weight_transfer", "POST", "/init_weight_transfer_engine",
                            json_body={"init_info": dict(init_info)})

    async def start_weight_update(self) -> None:
        """POST /start_weight_update (seed step 47). The body is ignored by servers that take none."""
        self.lifecycle.check_start_update()
        await self._control("start_weight_update", "POST", "/start_weight_update",
                            json_body={"is_checkpoint_format": True})
        self.lifecycle.on_start_update()

    @staticmethod
    def update_info(bucket: WeightBucket) -> dict[str, Any]:
        """vLLM's update_info for one bucket: names/dtypes/shapes + IPC handles as base64(cloudpickle) (seed step 49)."""
        if bucket.ipc_handles is None:
            raise ConfigError("weight bucket has no ipc_handles: over HTTP vLLM receives CUDA IPC handles "
                              "(colocated GPUs); on CPU use reload_weights_from_disk")
        import cloudpickle

        info = bucket.update_info()
        info["ipc_handles_pickled"] = base64.b64encode(cloudpickle.dumps(bucket.ipc_handles)).decode("ascii")
        sizes = getattr(bucket, "tensor_sizes", None)
        if sizes is not None:
            info["tensor_sizes"] = list(sizes)
        return info

    async def update_weights(self, bucket: WeightBucket) -> None:
        """POST /update_weights for one bucket (seed steps 48–50); needs VLLM_ALLOW_INSECURE_SERIALIZATION=1 server-side."""
        self.lifecycle.check_update()
        info = self.update_info(bucket)
        try:
            await self._control("update_weights", "POST", "/update_weights", json_body={"update_info": info})
        except EngineError as exc:
            if exc.status is not None:
                # vLLM's worker closes the update session when a chunk fails (gpu_worker.update_weights),
                # so the next legal call is start_weight_update again.
                self.lifecycle.updating = False
            raise

    async def finish_weight_update(self, version: int) -> None:
        """POST /finish_weight_update {"weight_version": "<v>"} (seed step 51): later responses carry `version`."""
        self.lifecycle.check_finish_update(version)
        await self._control("finish_weight_update", "POST", "/finish_weight_update",
                            json_body={"weight_version": str(version)})
        self.lifecycle.on_finish_update(version)

    async def set_weight_version(self, version: str) -> None:
        """POST /update_weight_version: label the current weights without loading any (no lifecycle change)."""
        await self._control("set_weight_version", "POST", "/update_weight_version",
                            json_body={"new_version": str(version)})

    async def reload_weights_from_disk(self, path: str, version: int) -> None:
        """Load HF-format weights from `path` on the server and label them `version` (disk mode, issue 8).

        vLLM has no dedicated route; the dev-mode ``/collective_rpc`` calls every worker's
        ``reload_weights(weights_path=...)`` (in-place, layerwise), then ``/update_weight_version``
        stamps the version. Same preconditions as a tensor update: weights mapped, no update open,
        version increasing.
        """
        lc = self.lifecycle
        lc.check_start_update()
        lc.on_start_update()
        try:
            lc.check_finish_update(version)
            await self.collective_rpc("reload_weights", kwargs={"weights_path": str(path)},
                                      call="reload_weights_from_disk")
            await self.set_weight_version(str(version))
        except BaseException:
            lc.updating = False
            raise
        lc.on_finish_update(version)

    async def collective_rpc(self, method: str, *, args: Sequence[str] = (), kwargs: Mapping[str, str] | None = None,
                             timeout_s: float | None = None, call: str = "collective_rpc") -> list[Any] | None:
        """POST /collective_rpc: call `method` on every worker; returns the per-worker results (None if empty)."""
        body: dict[str, Any] = {"method": method, "args": list(args), "kwargs": dict(kwargs or {})}
        if timeout_s is not None:
            body["timeout"] = timeout_s
        resp = await self._control(call, "POST", "/collective_rpc", json_body=body)
        data = self.http.read_json(call, resp, allow_empty=True)
        if data is None:
            return None
        return list(self.http.field(call, data, "results", list))

    async def weight_version(self) -> str | None:
        """GET /weight_info when the server has it; else the version seen on the last response; else
        the version this client last finished (vLLM 0.25.1 has neither the route nor versions in responses)."""
        try:
            resp = await self._control("weight_version", "GET", "/weight_info")
        except EngineError as exc:
            if exc.status == 404:
                self.behaviour["weight_info"] = "absent (version from responses or this client's record)"
                if self.last_response_version is not None:
                    return self.last_response_version
                v = self.lifecycle.weight_version
                return None if v is None else str(v)
            raise
        self.behaviour["weight_info"] = "route"
        value = self._read("weight_version", resp, "weight_version", (str, int))
        return str(value)

    async def world_size(self) -> int:
        resp = await self._control("world_size", "GET", "/get_world_size")
        return int(self._read("world_size", resp, "world_size", int))

    async def health(self) -> bool:
        """GET /health → True on 200; any failure (refused, timeout, 5xx) → False, never raises."""
        return await self.http.health()


__all__ = ["VLLMEngine", "generate_payload", "post_generate", "stamp_client_version", "GENERATE_PATH",
           "SESSION_HEADER"]
