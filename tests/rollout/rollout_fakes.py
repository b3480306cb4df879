"""Hand-written fakes of a router and engines for rollout tests: they record what they receive, and run in virtual time."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from vime.errors import EngineError
from vime.protocols import GenerateRequest, GenerateResult


@dataclass
class FakeRouter:
    """A Router whose responses have `length(request)` tokens and take `duration(request)` virtual seconds.

    `fail(request)` returning a string makes that request raise a retryable EngineError from
    engine "e-bad". `abort_all` ends every in-flight request with finish_reason "abort" and the
    tokens produced so far (none here). `ignore_abort` makes abort_all do nothing.
    """

    length: Any = lambda req: 4
    duration: Any = lambda req: 1.0
    fail: Any = lambda req: None
    weight_version: str = "1"
    ignore_abort: bool = False
    requests: list[GenerateRequest] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0
    abort_calls: int = 0
    _abort: asyncio.Event | None = None

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.requests.append(request)
        if self._abort is None:
            self._abort = asyncio.Event()
        abort = self._abort
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            sleeper = asyncio.ensure_future(asyncio.sleep(self.duration(request)))
            waiter = asyncio.ensure_future(abort.wait())
            done, _ = await asyncio.wait({sleeper, waiter}, return_when=asyncio.FIRST_COMPLETED)
            for t in (sleeper, waiter):
                t.cancel()
            if waiter in done:
                return GenerateResult([], [], "abort", len(request.token_ids), 0,
                                      weight_version=self.weight_version, engine="e0")
            problem = self.fail(request)
            if problem:
                raise EngineError("e-bad", "generate", problem, status=503, retryable=True)
            n = self.length(request)
            n = min(n, request.sampling_params["max_tokens"])
            reason = "length" if n == request.sampling_params["max_tokens"] else "stop"
            ids = [(len(request.token_ids) + i) % 250 for i in range(n)]
            return GenerateResult(ids, [-0.5] * n, reason, len(request.token_ids), n,
                                  weight_version=self.weight_version, engine="e0")
        finally:
            self.in_flight -= 1

    async def abort_all(self) -> None:
        self.abort_calls += 1
        if self.ignore_abort:
            return
        if self._abort is not None:
            self._abort.set()
        self._abort = asyncio.Event()  # later requests are not aborted
