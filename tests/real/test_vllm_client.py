"""VLLMEngine against a fake vLLM over httpx.MockTransport: every endpoint, the lifecycle table, every error path."""

from __future__ import annotations

import asyncio
import base64
import pickle

import httpx
import pytest
from fake_vllm import FakeVLLM, answer, generate_response

from vime.errors import ConfigError, EngineError, LifecycleError, ResponseFormatError, UnknownTagError
from vime.protocols import EngineMemory, GenerateRequest, RolloutEngine, WeightBucket
from vime.real.vllm.client import VLLMEngine

SP = {"max_tokens": 4, "temperature": 1.0, "top_p": 1.0, "logprobs": 1, "top_k": -1}


def make(fake: FakeVLLM, **kw) -> VLLMEngine:
    return VLLMEngine("e0", "http://engine0:8000", model="/models/tiny", transport=fake.transport(), **kw)


def run(coro):
    return asyncio.run(coro)


def test_engine_satisfies_the_protocol():
    assert isinstance(make(FakeVLLM()), RolloutEngine)


def test_base_url_must_be_http():
    with pytest.raises(ConfigError, match="http://"):
        VLLMEngine("e0", "engine0:8000")


# ---------------------------------------------------------------------------------------------
# generate
# ---------------------------------------------------------------------------------------------


def test_generate_sends_token_ids_and_parses_tokens_logprobs_version():
    fake = FakeVLLM()
    eng = make(fake)
    res = run(eng.generate(GenerateRequest([1, 2, 3], dict(SP), request_id="rid-1")))
    call = fake.calls[0]
    assert (call.method, call.path) == ("POST", "/inference/v1/generate")
    assert call.body == {"token_ids": [1, 2, 3], "sampling_params": SP, "model": "/models/tiny",
                         "request_id": "rid-1"}
    assert "x-session-id" not in call.headers
    assert res.token_ids == [10, 11, 12, 13]
    assert res.log_probs == [-0.5, -0.51, -0.52, -0.53]
    assert (res.finish_reason, res.prompt_tokens, res.completion_tokens) == ("length", 3, 4)
    assert res.weight_version == "default" and res.engine == "e0"
    assert eng.last_response_version == "default"
    assert eng.behaviour["weight_version"] == "spans"
    assert eng.behaviour["logprob_token"] == "numeric token_id"


def test_generate_session_header_only_when_asked():
    fake = FakeVLLM()
    run(make(fake, session_header=True).generate(GenerateRequest([1], dict(SP), session_id="s-7")))
    run(make(fake).generate(GenerateRequest([1], dict(SP), session_id="s-7")))
    assert fake.calls[0].headers["x-session-id"] == "s-7"
    assert "x-session-id" not in fake.calls[1].headers


def test_generate_tolerates_string_token_ids_and_single_version_field():
    body = {"choices": [{"token_ids": [5, 6], "finish_reason": "stop",
                         "logprobs": {"content": [{"token": "token_id:5", "logprob": -0.1},
                                                  {"token": "token_id:6", "logprob": -0.2}]}}],
            "usage": {"prompt_tokens": 2, "completion_tokens": 2}, "weight_version": "7"}
    fake = FakeVLLM(routes={("POST", "/inference/v1/generate"): answer(200, body)})
    eng = make(fake)
    res = run(eng.generate(GenerateRequest([1, 2], dict(SP))))
    assert (res.token_ids, res.log_probs, res.weight_version) == ([5, 6], [-0.1, -0.2], "7")
    assert eng.behaviour["weight_version"] == "field"
    assert eng.behaviour["logprob_token"] == "token_id:<id> string"


def test_generate_length_mismatch_is_a_response_format_error():
    body = generate_response([1, 2, 3])
    body["choices"][0]["logprobs"]["content"].pop()
    fake = FakeVLLM(routes={("POST", "/inference/v1/generate"): answer(200, body)})
    with pytest.raises(ResponseFormatError, match="3 token_ids but 2") as err:
        run(make(fake).generate(GenerateRequest([1], dict(SP))))
    assert err.value.engine == "e0"


def test_generate_rejects_empty_prompt_before_io():
    fake = FakeVLLM()
    with pytest.raises(ConfigError, match="at least one prompt token"):
        run(make(fake).generate(GenerateRequest([], dict(SP))))
    assert fake.calls == []


def test_generate_while_asleep_fails_before_any_io():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.sleep(2))
    n = len(fake.calls)
    with pytest.raises(LifecycleError, match="generate"):
        run(eng.generate(GenerateRequest([1], dict(SP))))
    assert len(fake.calls) == n


def test_many_concurrent_generates_share_one_pool():
    fake = FakeVLLM()
    eng = make(fake, max_concurrency=64)

    async def main():
        async with eng:
            return await asyncio.gather(*(eng.generate(GenerateRequest([i + 1], dict(SP))) for i in range(300)))
    results = run(main())
    assert len(results) == 300 and all(r.completion_tokens == 4 for r in results)
    assert len(fake.calls) == 300


# ---------------------------------------------------------------------------------------------
# sleep / wake (seed steps 5–7, 10–13, 35)
# ---------------------------------------------------------------------------------------------


def test_sleep_sends_level_and_mode_and_updates_lifecycle():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.sleep(2))
    assert fake.calls[-1].params == [("level", "2"), ("mode", "keep")]
    assert (eng.lifecycle.memory, eng.lifecycle.sleep_level) == (EngineMemory.ASLEEP, 2)
    with pytest.raises(LifecycleError, match="already asleep"):
        run(eng.sleep(1))
    assert len(fake.calls) == 1


@pytest.mark.parametrize("level", [0, 3])
def test_sleep_level_must_be_1_or_2(level):
    fake = FakeVLLM()
    with pytest.raises(LifecycleError, match="level must be 1 or 2"):
        run(make(fake).sleep(level))
    assert fake.calls == []


def test_sleep_mode_is_checked():
    fake = FakeVLLM()
    with pytest.raises(ConfigError, match="abort, wait or keep"):
        run(make(fake).sleep(1, "drain"))  # type: ignore[arg-type]
    assert fake.calls == []


def test_wake_tags_are_normalised_to_vllm_tags():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.sleep(2))
    run(eng.wake_up(["weights"]))  # seed step 6
    assert fake.calls[-1].params == [("tags", "weights")]
    assert eng.lifecycle.memory is EngineMemory.WEIGHTS_ONLY
    run(eng.wake_up(["kv_cache", "cuda_graph"]))  # seed step 12: cuda_graph is dropped
    assert fake.calls[-1].params == [("tags", "kv_cache")]
    assert eng.lifecycle.memory is EngineMemory.AWAKE


def test_wake_all_sends_no_tags():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.sleep(1))
    run(eng.wake_up())
    assert fake.calls[-1].path == "/wake_up" and fake.calls[-1].params == []
    assert eng.lifecycle.memory is EngineMemory.AWAKE


def test_wake_of_only_implicit_tags_sends_nothing():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.sleep(1))
    run(eng.wake_up(["cuda_graph"]))
    assert fake.paths() == ["/sleep"]
    assert eng.lifecycle.memory is EngineMemory.ASLEEP


def test_wake_unknown_tag_fails_before_io():
    fake = FakeVLLM()
    with pytest.raises(UnknownTagError, match="'gpu_cache'"):
        run(make(fake).wake_up(["gpu_cache"]))
    assert fake.calls == []


@pytest.mark.parametrize("value", [True, False])
def test_is_sleeping_and_is_paused_read_the_flag(value):
    fake = FakeVLLM(routes={("GET", "/is_sleeping"): answer(200, {"is_sleeping": value}),
                            ("GET", "/is_paused"): answer(200, {"is_paused": value})})
    eng = make(fake)
    assert run(eng.is_sleeping()) is value
    assert run(eng.is_paused()) is value


# ---------------------------------------------------------------------------------------------
# pause / resume / flush (seed step 46)
# ---------------------------------------------------------------------------------------------


def test_pause_and_resume():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.pause("abort"))
    assert fake.calls[-1].params == [("mode", "abort"), ("clear_cache", "false")]
    assert eng.lifecycle.paused == "abort"
    run(eng.resume())
    assert fake.calls[-1].path == "/resume" and eng.lifecycle.paused is None


def test_pause_bad_mode_fails_before_io():
    fake = FakeVLLM()
    with pytest.raises(LifecycleError, match="mode must be"):
        run(make(fake).pause("in_place"))  # type: ignore[arg-type]
    assert fake.calls == []


def test_flush_requires_pause():
    fake = FakeVLLM()
    with pytest.raises(LifecycleError, match="pause generation before flushing"):
        run(make(fake).flush_cache())
    assert fake.calls == []


def test_flush_sends_reset_running_and_external():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.pause("abort"))
    run(eng.flush_cache())
    assert fake.calls[-1].path == "/reset_prefix_cache"
    assert fake.calls[-1].params == [("reset_running_requests", "true"), ("reset_external", "true")]
    assert eng.behaviour["reset_prefix_cache"] == "json-success"


def test_flush_retries_once_a_second_while_blocks_are_held():
    answers = iter([False, False, True])
    fake = FakeVLLM(routes={("POST", "/reset_prefix_cache"):
                            lambda call: httpx.Response(200, json={"success": next(answers)})})
    slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)
    eng = make(fake, sleep=fake_sleep)
    run(eng.pause("abort"))
    run(eng.flush_cache())
    assert fake.paths().count("/reset_prefix_cache") == 3
    assert slept == [1.0, 1.0]


def test_flush_gives_up_after_the_limit():
    fake = FakeVLLM(routes={("POST", "/reset_prefix_cache"): answer(200, {"success": False})})
    slept: list[float] = []

    async def fake_sleep(s: float) -> None:
        slept.append(s)
    eng = make(fake, sleep=fake_sleep, flush_retries=5)
    run(eng.pause("abort"))
    with pytest.raises(EngineError, match="after 5 attempts") as err:
        run(eng.flush_cache())
    assert err.value.retryable
    assert fake.paths().count("/reset_prefix_cache") == 5 and len(slept) == 4


def test_flush_accepts_the_old_empty_200():
    fake = FakeVLLM(routes={("POST", "/reset_prefix_cache"): answer(200)})
    eng = make(fake)
    run(eng.pause("keep"))
    run(eng.flush_cache())
    assert eng.behaviour["reset_prefix_cache"] == "empty-200"


def test_abort_all_posts_an_empty_body():
    fake = FakeVLLM(routes={("POST", "/abort_requests"): answer(200, {"status": "aborted", "aborted": 3})})
    assert run(make(fake).abort_all()) == 3
    assert fake.calls[-1].body == {}


# ---------------------------------------------------------------------------------------------
# weight update (seed steps 47–51) and disk reload
# ---------------------------------------------------------------------------------------------


def bucket(handles=None) -> WeightBucket:
    return WeightBucket(names=["w"], dtype_names=["bfloat16"], shapes=[[2, 2]], nbytes=8, ipc_handles=handles)


def test_weight_update_sequence_and_version():
    fake = FakeVLLM()
    eng = make(fake)
    handles = [{"GPU-uuid": ("rebuild", 1, 2)}]
    run(eng.init_weight_transfer({"packed": False}))
    run(eng.start_weight_update())
    run(eng.update_weights(bucket(handles)))
    run(eng.finish_weight_update(2))
    assert fake.paths() == ["/init_weight_transfer_engine", "/start_weight_update", "/update_weights",
                            "/finish_weight_update"]
    assert fake.calls[0].body == {"init_info": {"packed": False}}
    assert fake.calls[1].body == {"is_checkpoint_format": True}
    info = fake.calls[2].body["update_info"]
    assert (info["names"], info["dtype_names"], info["shapes"]) == (["w"], ["bfloat16"], [[2, 2]])
    assert "ipc_handles" not in info
    assert pickle.loads(base64.b64decode(info["ipc_handles_pickled"])) == handles
    assert fake.calls[3].body == {"weight_version": "2"}
    assert eng.lifecycle.weight_version == 2 and not eng.lifecycle.updating
    assert run(eng.weight_version()) == "2" and eng.behaviour["weight_info"] == "route"
    assert run(eng.generate(GenerateRequest([1], dict(SP)))).weight_version == "2"


def test_update_without_start_fails_before_io():
    fake = FakeVLLM()
    with pytest.raises(LifecycleError, match="start_weight_update first"):
        run(make(fake).update_weights(bucket([{}])))
    assert fake.calls == []


def test_start_twice_and_non_increasing_version_fail_before_io():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.start_weight_update())
    with pytest.raises(LifecycleError, match="already in progress"):
        run(eng.start_weight_update())
    run(eng.finish_weight_update(3))
    run(eng.start_weight_update())
    n = len(fake.calls)
    with pytest.raises(LifecycleError, match="version must increase"):
        run(eng.finish_weight_update(3))
    assert len(fake.calls) == n


def test_start_while_asleep_needs_weights_woken_first():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.sleep(2))
    with pytest.raises(LifecycleError, match="tags=\\[weights\\]"):
        run(eng.start_weight_update())
    run(eng.wake_up(["weights"]))
    run(eng.start_weight_update())
    assert eng.lifecycle.updating


def test_bucket_without_ipc_handles_is_refused():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.start_weight_update())
    with pytest.raises(ConfigError, match="ipc_handles"):
        run(eng.update_weights(bucket(None)))
    assert fake.paths() == ["/start_weight_update"]


def test_packed_bucket_sends_tensor_sizes():
    b = bucket([{"GPU-0": ("x",)}])
    object.__setattr__(b, "tensor_sizes", [8])
    assert VLLMEngine.update_info(b)["tensor_sizes"] == [8]


def test_failed_chunk_ends_the_session_like_the_server_does():
    fake = FakeVLLM(routes={("POST", "/update_weights"):
                            answer(500, {"error": {"message": "Worker failed with error 'CUDA unavailable'"}})})
    eng = make(fake)
    run(eng.start_weight_update())
    with pytest.raises(EngineError, match="CUDA unavailable") as err:
        run(eng.update_weights(bucket([{}])))
    assert err.value.status == 500
    assert eng.lifecycle.updating is False
    run(eng.start_weight_update())  # legal again, as on the server


def test_reload_weights_from_disk_uses_collective_rpc_then_labels_the_version():
    fake = FakeVLLM()
    eng = make(fake)
    run(eng.reload_weights_from_disk("/ckpt/v5", 5))
    assert fake.paths() == ["/collective_rpc", "/update_weight_version"]
    assert fake.calls[0].body == {"method": "reload_weights", "args": [], "kwargs": {"weights_path": "/ckpt/v5"}}
    assert fake.calls[1].body == {"new_version": "5"}
    assert eng.lifecycle.weight_version == 5 and not eng.lifecycle.updating
    with pytest.raises(LifecycleError, match="version must increase"):
        run(eng.reload_weights_from_disk("/ckpt/v4", 4))
    assert len(fake.calls) == 2 and not eng.lifecycle.updating


def test_reload_failure_leaves_no_open_session():
    fake = FakeVLLM(routes={("POST", "/collective_rpc"): answer(500, {"error": "no such file"})})
    eng = make(fake)
    with pytest.raises(EngineError, match="no such file") as err:
        run(eng.reload_weights_from_disk("/missing", 1))
    assert err.value.call == "reload_weights_from_disk"
    assert not eng.lifecycle.updating and eng.lifecycle.weight_version is None


def test_weight_version_falls_back_to_responses_without_weight_info():
    fake = FakeVLLM(version="4", routes={("GET", "/weight_info"): answer(404, {"detail": "Not Found"})})
    eng = make(fake)
    assert run(eng.weight_version()) is None
    run(eng.generate(GenerateRequest([1], dict(SP))))
    assert run(eng.weight_version()) == "4"
    assert eng.behaviour["weight_info"].startswith("absent")


def test_weight_version_of_a_server_without_route_or_response_versions():
    """vLLM 0.25.1: no /weight_info, no version in responses → the version this client finished,
    on the response too (no update lands during a synchronous rollout); none before any update."""
    body = generate_response([1], version=None)
    fake = FakeVLLM(routes={("GET", "/weight_info"): answer(404, {"detail": "Not Found"}),
                            ("POST", "/inference/v1/generate"): answer(200, body)})
    eng = make(fake)
    assert run(eng.generate(GenerateRequest([1], dict(SP)))).weight_version is None
    run(eng.start_weight_update())
    run(eng.finish_weight_update(6))
    assert run(eng.generate(GenerateRequest([1], dict(SP)))).weight_version == "6"
    assert eng.behaviour["weight_version"].startswith("absent")
    assert eng.last_response_version is None  # what the server said: nothing
    assert run(eng.weight_version()) == "6"


def test_tokenizer_less_engine_asks_for_token_ids_only():
    """A server started with --skip-tokenizer-init cannot detokenize: every generate says detokenize false."""
    body = generate_response([1], version=None)
    fake = FakeVLLM(routes={("POST", "/inference/v1/generate"): answer(200, body)})
    eng = make(fake)
    assert "detokenize" not in eng.generate_payload(GenerateRequest([1], dict(SP)))["sampling_params"]
    eng.detokenize = False
    payload = eng.generate_payload(GenerateRequest([1], dict(SP)))
    assert payload["sampling_params"]["detokenize"] is False
    assert payload["sampling_params"]["max_tokens"] == SP["max_tokens"]


def test_weight_version_other_errors_propagate():
    fake = FakeVLLM(routes={("GET", "/weight_info"): answer(500, {"error": "dead"})})
    with pytest.raises(EngineError, match="dead"):
        run(make(fake).weight_version())


def test_collective_rpc_and_world_size():
    fake = FakeVLLM(routes={("POST", "/collective_rpc"): answer(200, {"results": [1, 2]})})
    eng = make(fake)
    assert run(eng.collective_rpc("ping", args=["a"], timeout_s=3.0)) == [1, 2]
    assert fake.calls[-1].body == {"method": "ping", "args": ["a"], "kwargs": {}, "timeout": 3.0}
    assert run(eng.world_size()) == 1


@pytest.mark.parametrize("body", [
    generate_response([1, 2, 3]),
    generate_response([1, 2], logprobs=[None, -0.5], version=None) | {"weight_version": "3"},
    {"choices": [{"token_ids": None, "finish_reason": "abort",
                  "logprobs": {"content": [{"token": "token_id:9", "logprob": -1.0}]}}]},
    {"choices": [{"token_ids": [4], "logprobs": {"content": [{"token_id": 4}]}}]},  # no logprob key
    {"choices": {"0": "not a list"}},
    {"choices": [{"token_ids": [4], "logprobs": None}], "usage": None},
])
def test_fast_decoder_and_json_give_the_same_answer(body):
    """The msgspec fast path must be invisible: same result or same error as json.loads + parser."""
    import json

    from vime.real.vllm.response import decode_generate, parse_generate_response

    def outcome(data):
        try:
            return parse_generate_response(data, engine="e0")
        except ResponseFormatError as exc:
            return str(exc)
    raw = json.dumps(body).encode()
    assert outcome(json.loads(raw)) == outcome(decode_generate(raw)) == outcome(raw)
    fake = FakeVLLM(routes={("POST", "/inference/v1/generate"): answer(200, body)})
    try:
        got = run(make(fake).generate(GenerateRequest([1], dict(SP))))
    except ResponseFormatError as exc:
        got = str(exc)
    assert got == outcome(json.loads(raw))
