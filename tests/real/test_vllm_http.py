"""The HTTP plumbing under VLLMEngine (`vime.real.vllm.http`): error mapping, health, connection reuse, pool shards."""

from __future__ import annotations

import asyncio

import httpx
import pytest
from fake_vllm import FakeVLLM, answer, raising

from vime.errors import EngineError
from vime.protocols import GenerateRequest
from vime.real.vllm.client import VLLMEngine

SP = {"max_tokens": 4, "temperature": 1.0, "top_p": 1.0, "logprobs": 1, "top_k": -1}


def make(fake: FakeVLLM, **kw) -> VLLMEngine:
    return VLLMEngine("e0", "http://engine0:8000", model="/models/tiny", transport=fake.transport(), **kw)


def run(coro):
    return asyncio.run(coro)


# ---------------------------------------------------------------------------------------------
# error mapping
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("exc, kind", [
    (httpx.ConnectError("connection refused"), "ConnectError"),
    (httpx.ReadTimeout("read timed out"), "ReadTimeout"),
    (httpx.RemoteProtocolError("server disconnected"), "RemoteProtocolError"),
])
def test_transport_failures_become_retryable_engine_errors(exc, kind):
    fake = FakeVLLM(routes={("POST", "/inference/v1/generate"): raising(exc)})
    with pytest.raises(EngineError) as err:
        run(make(fake).generate(GenerateRequest([1], dict(SP))))
    e = err.value
    assert (e.engine, e.call, e.status, e.retryable) == ("e0", "generate", None, True)
    assert kind in str(e) and "engine0:8000" in str(e)


@pytest.mark.parametrize("status, retryable", [(400, False), (500, False), (503, True)])
def test_http_errors_carry_status_and_body_excerpt(status, retryable):
    fake = FakeVLLM(routes={("POST", "/inference/v1/generate"):
                            answer(status, {"error": {"message": "boom " + "x" * 1000}})})
    with pytest.raises(EngineError) as err:
        run(make(fake).generate(GenerateRequest([1], dict(SP))))
    e = err.value
    assert (e.status, e.retryable, e.call) == (status, retryable, "generate")
    assert "boom" in str(e) and f"HTTP {status}" in str(e)
    assert len(str(e)) < 600  # excerpt, not the whole body


def test_scale_out_disabled_403_says_which_flag():
    msg = {"error": {"message": "Scale-out endpoints are disabled. Restart vllm serve with --enable-scale-out"
                                " to enable them.", "code": 403}}
    fake = FakeVLLM(routes={("POST", "/inference/v1/generate"): answer(403, msg)})
    with pytest.raises(EngineError, match="start the server with --enable-scale-out"):
        run(make(fake).generate(GenerateRequest([1], dict(SP))))


def test_dev_route_404_names_dev_mode():
    fake = FakeVLLM(routes={("POST", "/pause"): answer(404, {"detail": "Not Found"})})
    eng = make(fake)
    with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1") as err:
        run(eng.pause("abort"))
    assert err.value.status == 404
    assert eng.lifecycle.paused is None


def test_wake_up_out_of_memory_names_what_to_change():
    """The H200 run whose trainer kept its state resident (--train-offload-plan activations) died here: say what to change."""
    msg = {"error": {"message": "Call to wake_up method failed: CUDA Error: out of memory at "
                                "/workspace/csrc/cumem_allocator.cpp:163", "code": 500}}
    fake = FakeVLLM(routes={("POST", "/wake_up"): answer(500, msg)})
    eng = make(fake)
    with pytest.raises(EngineError, match="lower --gpu-memory-utilization or offload more of the trainer") as err:
        run(eng.wake_up(["weights"]))
    assert err.value.status == 500 and not err.value.retryable and "\n" not in str(err.value)


def test_weight_transfer_not_configured_names_the_flag():
    msg = {"error": {"message": "Call to collective_rpc method failed: Worker failed with error 'Weight transfer "
                                "not configured. Please set weight_transfer_config to enable weight transfer.'"}}
    fake = FakeVLLM(routes={("POST", "/start_weight_update"): answer(500, msg)})
    eng = make(fake)
    with pytest.raises(EngineError, match="--weight-transfer-config"):
        run(eng.start_weight_update())
    assert eng.lifecycle.updating is False


@pytest.mark.parametrize("text", ["{not json", "<html>502</html>"])
def test_malformed_json_is_an_engine_error(text):
    fake = FakeVLLM(routes={("GET", "/is_paused"): answer(200, text=text)})
    with pytest.raises(EngineError, match="malformed JSON") as err:
        run(make(fake).is_paused())
    assert err.value.call == "is_paused"


def test_wrong_json_shape_is_an_engine_error():
    fake = FakeVLLM(routes={("GET", "/is_sleeping"): answer(200, {"sleeping": True})})
    with pytest.raises(EngineError, match="'is_sleeping'"):
        run(make(fake).is_sleeping())


def test_empty_body_where_json_is_needed():
    fake = FakeVLLM(routes={("POST", "/inference/v1/generate"): answer(200)})
    with pytest.raises(EngineError, match="empty body"):
        run(make(fake).generate(GenerateRequest([1], dict(SP))))


# ---------------------------------------------------------------------------------------------
# health
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("route, healthy", [
    (answer(200), True),
    (answer(503, {"error": "starting"}), False),
    (raising(httpx.ConnectError("refused")), False),
    (raising(httpx.ReadTimeout("slow")), False),
])
def test_health_never_raises(route, healthy):
    fake = FakeVLLM(routes={("GET", "/health"): route})
    assert run(make(fake).health()) is healthy


def test_control_calls_use_fresh_connections_generate_keeps_alive():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.pause("keep"))
    run(eng.generate(GenerateRequest([1], dict(SP))))
    assert fake.calls[0].headers["connection"] == "close"
    assert fake.calls[1].headers.get("connection", "keep-alive") == "keep-alive"


def test_pool_is_sharded_for_high_concurrency_and_single_with_an_injected_transport():
    """httpcore's pool is quadratic in its size under load, so big concurrency gets several small pools."""
    from vime.real.vllm.http import POOL_SHARD_SIZE

    big = VLLMEngine("e0", "http://e0:1", max_concurrency=256)
    small = VLLMEngine("e1", "http://e1:1", max_concurrency=POOL_SHARD_SIZE)
    injected = make(FakeVLLM(), max_concurrency=256)
    assert len(big.http.clients) == 256 // POOL_SHARD_SIZE
    assert len(small.http.clients) == 1 and len(injected.http.clients) == 1
    for eng in (big, small, injected):
        run(eng.aclose())
