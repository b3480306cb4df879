"""The RolloutEngine conformance suite (tests/conformance/engine.py) against VLLMEngine on the stateful fake vLLM."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conformance import engine as conformance
from fake_vllm import StatefulFakeVLLM

from vime.protocols import WeightBucket
from vime.real.vllm.client import VLLMEngine


def ipc_bucket(index: int) -> WeightBucket:
    """The suite's bucket with stand-in IPC handles: over HTTP vLLM receives handles, never bare sizes."""
    b = conformance.default_bucket(index)
    b.ipc_handles = [{"GPU-fake": ("handle", index)}]
    return b


def unopenable_bucket() -> WeightBucket:
    """Handles no worker can open (the fake answers 500, as vLLM does for a tensor it cannot rebuild)."""
    b = conformance.default_bucket(0)
    b.ipc_handles = [{"GPU-fake": ("not-a-cuda-tensor",)}]
    return b


def fake_subject() -> conformance.EngineSubject:
    fake = StatefulFakeVLLM(token_s=0.001)
    engine = VLLMEngine("engine0", "http://engine0:8000", model="/models/tiny", transport=fake.transport())
    # 2048 tokens at 1 ms each: still decoding 50 ms after submission, done ~2 s after resume.
    return conformance.EngineSubject(engine=engine, run=asyncio.run, settle_s=0.05, long_tokens=2048,
                                     make_bucket=ipc_bucket, bad_bucket=unopenable_bucket)


#: What vLLM 0.32 does differently from the lifecycle table, open for a decision (see the report of this suite).
VLLM_PAUSE_IS_SLEEP = ("vLLM 0.32's engine core pauses its scheduler on sleep, resumes it on a full wake and "
                       "reports is_sleeping = paused or asleep; the client passes both answers through")


def _known(check: Any) -> Any:
    if check is conformance.check_pause_and_sleep_are_independent:
        return pytest.param(check, marks=pytest.mark.xfail(strict=True, reason=VLLM_PAUSE_IS_SLEEP))
    return check


@pytest.mark.parametrize("check", [_known(c) for c in conformance.ALL_CHECKS], ids=lambda c: c.__name__)
def test_vllm_client_conformance_on_stateful_fake(check: Any) -> None:
    check(fake_subject)
