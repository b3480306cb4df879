"""Conformance checks for any `vime.protocols.RolloutEngine` (simulated engine, real client on a fake server).

A factory returns an `EngineSubject`: a fresh engine that is awake with weights and KV mapped, a
way to run a coroutine (the virtual clock for the simulator, `asyncio.run` for a real client on a
fake or real server), how long to wait so that a "long" request is surely running after
`settle_s`, and how to build a weight bucket the engine's transport can carry (the simulator
needs only the size, the HTTP client CUDA IPC handles). Each `check_*` builds a fresh subject and asserts one part of the contract (seed steps
10–13, 20–25, 34–36, 46–52; VLLM_API.md), so another implementation's test module only writes
the factory and calls these — `ALL_CHECKS` lists them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import pytest

from vime.errors import ConfigError, EngineError, LifecycleError, UnknownTagError
from vime.protocols import GenerateRequest, RolloutEngine, WeightBucket


def default_bucket(index: int = 0, nbytes: int = 1 << 20) -> WeightBucket:
    """A one-tensor bucket described by size only (enough for the simulator)."""
    return WeightBucket(names=[f"model.layers.{index}.mlp.down_proj.weight"], dtype_names=["bfloat16"],
                        shapes=[[nbytes // 2]], nbytes=nbytes, index=index)


def negative_bucket() -> WeightBucket:
    """A bucket no engine can load (a negative size: the simulator answers it as vLLM answers a bad bucket)."""
    return WeightBucket(names=["model.norm.weight"], dtype_names=["bfloat16"], shapes=[[8]], nbytes=-16, index=0)


@dataclass
class EngineSubject:
    engine: Any
    run: Callable[[Coroutine[Any, Any, Any]], Any]
    #: Time to wait so that a just-submitted long request is surely running (prefill done).
    settle_s: float = 0.5
    #: max_tokens of a request that is still running after settle_s (and far from done).
    long_tokens: int = 2048
    prompt: tuple[int, ...] = tuple(range(100, 164))
    #: Builds bucket `index` of a weight update in the form this engine's transport accepts.
    make_bucket: Callable[[int], WeightBucket] = default_bucket
    #: Builds a bucket the engine accepts on the wire but fails to load (the server answers an error).
    bad_bucket: Callable[[], WeightBucket] = negative_bucket
    #: Extra sampling params of the long requests (a real random model: ignore_eos, so it runs to max_tokens).
    long_params: dict[str, Any] = field(default_factory=dict)
    #: Waits until a just-submitted long request is decoding, where a real server can tell (a streamed
    #: probe request sharing its batches); None: sleep settle_s.
    until_running: Callable[[], Awaitable[None]] | None = None


async def _until_running(s: EngineSubject) -> None:
    await asyncio.sleep(0)  # let the request under test go out first
    if s.until_running is not None:
        await s.until_running()
    else:
        await asyncio.sleep(s.settle_s)


Factory = Callable[[], EngineSubject]


def _request(s: EngineSubject, max_tokens: int, rid: str) -> GenerateRequest:
    params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 1.0, "logprobs": 1}
    if max_tokens == s.long_tokens:
        params.update(s.long_params)
    return GenerateRequest(list(s.prompt), params, request_id=rid)


async def _publish(s: EngineSubject, version: int) -> None:
    await s.engine.start_weight_update()
    await s.engine.update_weights(s.make_bucket(0))
    await s.engine.update_weights(s.make_bucket(1))
    await s.engine.finish_weight_update(version)


def check_is_protocol(make: Factory) -> None:
    s = make()
    assert isinstance(s.engine, RolloutEngine)
    assert isinstance(s.engine.name, str) and s.engine.name


def check_generate_result_shape(make: Factory) -> None:
    """Tokens and log-probs zip by position; usage matches; finish is stop (EOS) or length (= max_tokens)."""
    s = make()

    async def go() -> list[Any]:
        return list(await asyncio.gather(*(s.engine.generate(_request(s, 64, f"shape-{i}")) for i in range(8))))

    for r in s.run(go()):
        assert len(r.token_ids) == len(r.log_probs) == r.completion_tokens
        assert 1 <= r.completion_tokens <= 64
        assert r.prompt_tokens == len(s.prompt)
        assert r.finish_reason in ("stop", "length")
        if r.finish_reason == "length":
            assert r.completion_tokens == 64
        assert all(isinstance(t, int) for t in r.token_ids)
        assert all(lp <= 0.0 for lp in r.log_probs)


def check_generate_while_asleep_raises(make: Factory) -> None:
    s = make()

    async def go() -> None:
        await s.engine.sleep(2)
        assert await s.engine.is_sleeping()
        with pytest.raises(LifecycleError):
            await s.engine.generate(_request(s, 8, "asleep"))
        await s.engine.wake_up(["weights"])
        with pytest.raises(LifecycleError):  # weights only: may receive weights, may not generate
            await s.engine.generate(_request(s, 8, "weights-only"))
        await s.engine.wake_up(["kv_cache", "cuda_graph"])  # vime tags, normalised (seed 10–13)
        assert not await s.engine.is_sleeping()
        r = await s.engine.generate(_request(s, 8, "awake"))
        assert r.completion_tokens >= 1

    s.run(go())


def check_sleep_twice_raises(make: Factory) -> None:
    s = make()

    async def go() -> None:
        await s.engine.sleep(1)
        with pytest.raises(LifecycleError):
            await s.engine.sleep(1)

    s.run(go())


def check_wake_unknown_tag_raises(make: Factory) -> None:
    s = make()

    async def go() -> None:
        await s.engine.sleep(2)
        with pytest.raises(UnknownTagError):
            await s.engine.wake_up(["activations"])

    s.run(go())


def check_weight_update_lifecycle(make: Factory) -> None:
    """update without start, start twice, and a non-increasing version are LifecycleErrors."""
    s = make()

    async def go() -> None:
        with pytest.raises(LifecycleError):
            await s.engine.update_weights(s.make_bucket(0))
        await s.engine.start_weight_update()
        with pytest.raises(LifecycleError):
            await s.engine.start_weight_update()
        await s.engine.update_weights(s.make_bucket(0))
        await s.engine.finish_weight_update(3)
        await s.engine.start_weight_update()
        with pytest.raises(LifecycleError):
            await s.engine.finish_weight_update(3)

    s.run(go())


def check_failed_bucket_ends_the_session(make: Factory) -> None:
    """A bucket the engine fails to load raises EngineError and closes the session, as vLLM's worker
    does: the next legal call is start_weight_update, and a new session can finish."""
    s = make()

    async def go() -> None:
        await s.engine.start_weight_update()
        with pytest.raises(EngineError):
            await s.engine.update_weights(s.bad_bucket())
        with pytest.raises(LifecycleError):
            await s.engine.update_weights(s.make_bucket(0))
        await s.engine.start_weight_update()
        await s.engine.finish_weight_update(1)
        assert await s.engine.weight_version() == "1"

    s.run(go())


def check_empty_prompt_is_refused(make: Factory) -> None:
    """An empty prompt is the caller's bad input: ConfigError, before any request (issue 3: same type in sim and real)."""
    s = make()

    async def go() -> None:
        with pytest.raises(ConfigError, match="prompt token"):
            await s.engine.generate(GenerateRequest([], {"max_tokens": 8}, request_id="empty"))

    s.run(go())


def check_version_stamped(make: Factory) -> None:
    """Every response carries the version finished last, as a string (seed steps 24, 51)."""
    s = make()

    async def go() -> tuple[Any, Any, Any]:
        await _publish(s, 1)
        a = await s.engine.generate(_request(s, 16, "v1"))
        await s.engine.pause("abort")
        await s.engine.flush_cache()
        await _publish(s, 2)
        await s.engine.resume()
        b = await s.engine.generate(_request(s, 16, "v2"))
        return a, b, await s.engine.weight_version()

    a, b, v = s.run(go())
    assert (a.weight_version, b.weight_version, v) == ("1", "2", "2")


def check_pause_abort_returns_partial(make: Factory) -> None:
    """pause(abort) ends in-flight requests with finish_reason "abort" and their partial tokens (seed 46)."""
    s = make()

    async def go() -> Any:
        task = asyncio.ensure_future(s.engine.generate(_request(s, s.long_tokens, "long")))
        await _until_running(s)
        assert not task.done()
        await s.engine.pause("abort")
        assert await s.engine.is_paused()
        return await task

    r = s.run(go())
    assert r.finish_reason == "abort"
    assert 0 < r.completion_tokens < s.long_tokens
    assert len(r.token_ids) == len(r.log_probs) == r.completion_tokens


def check_pause_keep_then_resume(make: Factory) -> None:
    """pause(keep) freezes a request; resume lets it finish normally."""
    s = make()

    async def go() -> Any:
        task = asyncio.ensure_future(s.engine.generate(_request(s, s.long_tokens, "kept")))
        await _until_running(s)
        await s.engine.pause("keep")
        await asyncio.sleep(2 * s.settle_s)
        assert not task.done()
        await s.engine.resume()
        return await task

    r = s.run(go())
    assert r.finish_reason in ("stop", "length")


def check_request_waits_while_paused(make: Factory) -> None:
    """A request arriving while paused is held until resume (VLLM_API.md)."""
    s = make()

    async def go() -> Any:
        await s.engine.pause("abort")
        task = asyncio.ensure_future(s.engine.generate(_request(s, 8, "held")))
        await asyncio.sleep(s.settle_s)
        assert not task.done()
        await s.engine.resume()
        return await task

    r = s.run(go())
    assert r.finish_reason in ("stop", "length")


def check_pause_and_sleep_are_independent(make: Factory) -> None:
    """EngineLifecycle keeps memory and pause apart: sleep does not pause, a pause is not sleep, and
    a full wake does not end a pause (is_paused / is_sleeping report those two flags)."""
    s = make()

    async def go() -> None:
        await s.engine.sleep(1)
        assert not await s.engine.is_paused()
        await s.engine.wake_up()
        await s.engine.pause("keep")
        assert not await s.engine.is_sleeping()
        await s.engine.sleep(1)
        await s.engine.wake_up()
        assert await s.engine.is_paused()
        await s.engine.resume()

    s.run(go())


def check_flush_requires_pause(make: Factory) -> None:
    s = make()

    async def go() -> None:
        with pytest.raises(LifecycleError):
            await s.engine.flush_cache()
        await s.engine.pause("abort")
        await s.engine.flush_cache()
        await s.engine.resume()

    s.run(go())


def check_health(make: Factory) -> None:
    s = make()
    assert s.run(s.engine.health()) is True


ALL_CHECKS = (
    check_is_protocol,
    check_generate_result_shape,
    check_generate_while_asleep_raises,
    check_sleep_twice_raises,
    check_wake_unknown_tag_raises,
    check_weight_update_lifecycle,
    check_failed_bucket_ends_the_session,
    check_empty_prompt_is_refused,
    check_version_stamped,
    check_pause_abort_returns_partial,
    check_pause_keep_then_resume,
    check_request_waits_while_paused,
    check_flush_requires_pause,
    check_pause_and_sleep_are_independent,
    check_health,
)
