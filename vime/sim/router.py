"""The simulated router in front of the engines (seed steps 20–21, 28): vllm-router's policies, retries, abort_all.

`SimRouter` implements `vime.protocols.Router`. Policies follow vllm-router (VLLM_API.md):
round_robin, random (seeded), consistent_hash (a hash ring keyed by the session id, as the
``X-Session-ID`` header is for the real router), rendezvous_hash, power_of_two (two seeded random
picks, the one with fewer outstanding requests wins), least_load, and cache_aware (approximated
by rendezvous hashing of the prompt's first tokens, so the samples of one GRPO group share an
engine and its prefix cache). Unhealthy engines are skipped. A retryable `EngineError` (the engine
died under the request) is retried once on each other healthy engine and recorded in
`retries`; anything else propagates.
"""

from __future__ import annotations

import asyncio
import bisect
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vime.errors import ConfigError, EngineError
from vime.protocols import GenerateRequest, GenerateResult
from vime.sim.lengths import key_seed

POLICIES = ("round_robin", "random", "consistent_hash", "rendezvous_hash", "power_of_two", "least_load",
            "cache_aware")
_ALIASES = {"least_loaded": "least_load", "least_request": "least_load"}
#: Points per engine on the consistent-hash ring (spreads keys evenly over few engines).
RING_POINTS = 64
#: Prompt tokens the cache_aware approximation hashes.
PREFIX_TOKENS = 64


@dataclass(frozen=True)
class Retry:
    """One request moved to another engine after a retryable failure."""

    time: float
    request_id: str | None
    failed_engine: str
    retried_on: str
    detail: str


class SimRouter:
    """Routes generate requests to `engines` by `policy`; `abort_all` aborts everything in flight everywhere."""

    def __init__(self, engines: Sequence[Any], policy: str = "round_robin", *, seed: int = 0,
                 recorder: Any = None, retry: bool = True) -> None:
        if not engines:
            raise ConfigError("the router needs at least one engine")
        policy = _ALIASES.get(policy, policy)
        if policy not in POLICIES:
            raise ConfigError(f"router policy {policy!r} is unknown; use one of {', '.join(POLICIES)}")
        names = [e.name for e in engines]
        if len(set(names)) != len(names):
            raise ConfigError(f"engine names must be unique, got {names}")
        self.engines = list(engines)
        self.policy = policy
        self.seed = int(seed)
        self.recorder = recorder
        self.retry = retry
        self._rng = random.Random(key_seed(self.seed, "router", policy))
        self._rr = 0
        self.load: dict[str, int] = {n: 0 for n in names}  # outstanding requests per engine
        self.routed: dict[str, int] = {n: 0 for n in names}
        self.retries: list[Retry] = []
        ring = sorted((key_seed("ring", e.name, i), k) for k, e in enumerate(self.engines)
                      for i in range(RING_POINTS))
        self._ring_keys = [h for h, _ in ring]
        self._ring_engines = [k for _, k in ring]

    # --- choice ---------------------------------------------------------------------------------
    @staticmethod
    def _healthy(engine: Any) -> bool:
        return not getattr(engine, "failed", False)

    def _candidates(self, exclude: set[int]) -> list[int]:
        return [k for k, e in enumerate(self.engines) if k not in exclude and self._healthy(e)]

    @staticmethod
    def _key(request: GenerateRequest) -> str:
        if request.session_id:
            return f"session:{request.session_id}"
        if request.request_id:
            return f"id:{request.request_id}"
        return f"prompt:{key_seed(len(request.token_ids), *request.token_ids)}"

    def choose(self, request: GenerateRequest, exclude: set[int] | None = None) -> int | None:
        """Index of the engine the policy picks among the healthy ones not excluded (None if none)."""
        exclude = exclude or set()
        p = self.policy
        if p == "round_robin":  # the common case: no candidate list needed
            n = len(self.engines)
            for step in range(n):
                k = (self._rr + step) % n
                if k not in exclude and self._healthy(self.engines[k]):
                    self._rr = k + 1
                    return k
            return None
        cands = self._candidates(exclude)
        if not cands:
            return None
        if p == "random":
            return cands[self._rng.randrange(len(cands))]
        if p == "consistent_hash":
            allowed = set(cands)
            h = key_seed(self._key(request))
            i = bisect.bisect_left(self._ring_keys, h)
            for step in range(len(self._ring_keys)):
                k = self._ring_engines[(i + step) % len(self._ring_keys)]
                if k in allowed:
                    return k
        if p in ("rendezvous_hash", "cache_aware"):
            key = self._key(request) if p == "rendezvous_hash" else \
                f"prefix:{key_seed(*request.token_ids[:PREFIX_TOKENS])}"
            return max(cands, key=lambda k: (key_seed(key, self.engines[k].name), -k))
        if p == "power_of_two":
            if len(cands) == 1:
                return cands[0]
            a, b = self._rng.sample(cands, 2)
            la, lb = self.load[self.engines[a].name], self.load[self.engines[b].name]
            return a if (la, a) <= (lb, b) else b
        # least_load
        return min(cands, key=lambda k: (self.load[self.engines[k].name], k))

    # --- Router protocol --------------------------------------------------------------------
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Send to the chosen engine; on a retryable EngineError try each other healthy engine once."""
        tried: set[int] = set()
        last: EngineError | None = None
        while True:
            k = self.choose(request, tried)
            if k is None:
                if last is not None:
                    raise last
                raise EngineError("router", "generate", "no healthy engine to route to", status=503,
                                  retryable=True)
            engine = self.engines[k]
            if last is not None:
                self._record_retry(request, last, engine.name)
            tried.add(k)
            self.load[engine.name] += 1
            self.routed[engine.name] += 1
            try:
                return await engine.generate(request)
            except EngineError as exc:
                if not (exc.retryable and self.retry):
                    raise
                last = exc
            finally:
                self.load[engine.name] -= 1

    def _record_retry(self, request: GenerateRequest, error: EngineError, target: str) -> None:
        env = getattr(self.engines[0], "env", None)
        t = float(env.now) if env is not None else 0.0
        self.retries.append(Retry(t, request.request_id, error.engine, target, error.detail))
        if self.recorder is not None and hasattr(self.recorder, "instant"):
            self.recorder.instant("router", "retry", request_id=request.request_id, failed=error.engine,
                                  retried_on=target)

    async def abort_all(self) -> None:
        """Abort every in-flight request on every healthy engine (seed step 28); they return finish_reason "abort"."""
        await asyncio.gather(*(e.abort_all() for e in self.engines if self._healthy(e)))
