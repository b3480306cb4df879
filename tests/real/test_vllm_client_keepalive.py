"""VLLMEngine's pooled connections against a real uvicorn server: idle connections are dropped before the server's keep-alive closes them."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import pytest
import uvicorn
from fake_vllm import generate_response

from vime.protocols import GenerateRequest
from vime.real.vllm.client import VLLMEngine
from vime.real.vllm.http import KEEPALIVE_EXPIRY_S, default_limits


def test_default_expiry_is_below_vllms_keep_alive():
    # vLLM's API server closes idle connections after VLLM_HTTP_TIMEOUT_KEEP_ALIVE = 5 s.
    assert KEEPALIVE_EXPIRY_S < 5.0
    assert default_limits(8).keepalive_expiry == KEEPALIVE_EXPIRY_S


class _Server:
    """A uvicorn server answering generate like vLLM and recording the client port of every request."""

    def __init__(self, keep_alive_s: float) -> None:
        self.ports: list[int] = []

        async def app(scope, receive, send):
            if scope["type"] != "http":
                return
            while (await receive()).get("more_body"):
                pass
            self.ports.append(scope["client"][1])
            body = json.dumps(generate_response([5, 6])).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": body})

        config = uvicorn.Config(app, host="127.0.0.1", port=0, timeout_keep_alive=keep_alive_s, log_level="error",
                                lifespan="off")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.mark.parametrize(("expiry", "reused"), [(0.2, False), (30.0, True)])
def test_an_idle_connection_is_reused_only_within_the_expiry(expiry: float, reused: bool):
    server = _Server(keep_alive_s=5)
    with server as url:
        async def go() -> None:
            # one pool (max_concurrency 1), so both generates would share its one connection
            async with VLLMEngine("e", url, max_concurrency=1, keepalive_expiry_s=expiry) as eng:
                for _ in range(2):
                    out = await eng.generate(GenerateRequest(token_ids=[1, 2, 3], sampling_params={"max_tokens": 2}))
                    assert out.token_ids == [5, 6]
                    await asyncio.sleep(0.6)

        asyncio.run(go())
    assert len(server.ports) == 2
    # the same client port means the second generate went over the first one's connection
    assert (server.ports[0] == server.ports[1]) is reused
