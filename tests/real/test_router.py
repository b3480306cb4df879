"""vllm-router: its command line, and the Router client (generate via the router, control calls to each engine)."""

from __future__ import annotations

import asyncio

import pytest
from fake_vllm import FakeVLLM

from vime.errors import ConfigError, EngineError, LifecycleError
from vime.protocols import GenerateRequest, Router
from vime.real.vllm.client import VLLMEngine
from vime.real.vllm.router import RouterSpec, VLLMRouterClient, router_command

SP = {"max_tokens": 3, "temperature": 1.0, "logprobs": 1}


def run(coro):
    return asyncio.run(coro)


def setup(policy: str = "consistent_hash"):
    router, e0, e1 = FakeVLLM(), FakeVLLM(), FakeVLLM()
    engines = [VLLMEngine("e0", "http://e0:1", transport=e0.transport()),
               VLLMEngine("e1", "http://e1:1", transport=e1.transport())]
    client = VLLMRouterClient("http://router:30000", engines, policy=policy, model="/m",
                              transport=router.transport())
    return client, router, e0, e1


def test_router_command_line():
    spec = RouterSpec(("http://a:1", "http://b:2"), "consistent_hash", port=30001, prometheus_port=29001)
    argv = router_command(spec, binary="vllm-router")
    assert argv[0] == "vllm-router"
    i = argv.index("--worker-urls")
    assert argv[i + 1:i + 3] == ["http://a:1", "http://b:2"]
    assert argv[argv.index("--policy") + 1] == "consistent_hash"
    assert argv[argv.index("--port") + 1] == "30001"
    assert argv[argv.index("--prometheus-port") + 1] == "29001"


def test_router_spec_validation():
    with pytest.raises(ConfigError, match="not one of"):
        RouterSpec(("http://a:1",), "least_loaded")
    with pytest.raises(ConfigError, match="at least one worker"):
        RouterSpec((), "round_robin")
    with pytest.raises(ConfigError, match="choose ports"):
        router_command(RouterSpec(("http://a:1",)), binary="x")


def test_client_is_a_router():
    client, *_ = setup()
    assert isinstance(client, Router)


def test_generate_goes_through_the_router_with_the_session_header():
    client, router, e0, e1 = setup("consistent_hash")
    res = run(client.generate(GenerateRequest([1, 2], dict(SP), session_id="group-3")))
    assert res.token_ids == [10, 11, 12] and res.engine is None
    assert router.paths() == ["/inference/v1/generate"] and e0.calls == [] == e1.calls
    assert router.calls[0].headers["x-session-id"] == "group-3"
    assert router.calls[0].body["model"] == "/m"


def test_no_session_header_under_other_policies():
    client, router, *_ = setup("round_robin")
    run(client.generate(GenerateRequest([1], dict(SP), session_id="group-3")))
    assert "x-session-id" not in router.calls[0].headers


def test_router_asks_for_token_ids_only_when_its_engines_have_no_tokenizer():
    client, router, *_ = setup("round_robin")
    run(client.generate(GenerateRequest([1], dict(SP))))
    assert "detokenize" not in router.calls[0].body["sampling_params"]
    for e in client.engines:
        e.detokenize = False  # servers started with --skip-tokenizer-init
    run(client.generate(GenerateRequest([1], dict(SP))))
    assert router.calls[1].body["sampling_params"]["detokenize"] is False


def test_generate_refused_before_io_when_an_engine_sleeps():
    client, router, e0, _ = setup()
    run(client.engines[1].sleep(2))
    with pytest.raises(LifecycleError, match="engine e1"):
        run(client.generate(GenerateRequest([1], dict(SP))))
    assert router.calls == []


def test_abort_all_goes_to_every_engine_directly():
    client, router, e0, e1 = setup()
    run(client.abort_all())
    assert router.calls == []
    assert e0.paths() == ["/abort_requests"] == e1.paths()


def test_router_errors_name_the_router():
    client, router, *_ = setup()
    router.routes[("POST", "/inference/v1/generate")] = lambda call: __import__("httpx").Response(
        503, json={"error": "No available workers"})
    with pytest.raises(EngineError, match="engine router: generate -> HTTP 503") as err:
        run(client.generate(GenerateRequest([1], dict(SP))))
    assert err.value.retryable


def test_health_and_list_workers():
    client, *_ = setup()
    assert run(client.health()) is True
    assert run(client.list_workers()) == ["http://a", "http://b"]
