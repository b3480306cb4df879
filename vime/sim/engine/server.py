"""The simulated vLLM server: `SimEngine` implements `vime.protocols.RolloutEngine` on the virtual clock, faults included.

One server (its TP ranks; seed steps 4–13, 18–28, 33–36, 43–54; VLLM_API.md for the semantics)
made of a `Scheduler` (continuous batching), an `EngineCore` (its busy loop), an `IterationModel`
(what an iteration costs), a `KVPlan` and the `SimAllocator` its memory lives in. What the tests pin down:

- Controls (pause, abort, flush, the quiesce of sleep) take effect at the next iteration boundary.
  pause(abort) ends in-flight requests with finish_reason "abort" and their partial tokens;
  pause(keep) freezes them; pause(wait) returns once they are drained and their responses are out.
  Requests arriving while paused are held until resume. sleep(level, mode) applies `mode` the same
  way, except that a kept request loses its KV (it recomputes after wake_up), and a scheduler that
  is already paused cannot drain, so "wait" then keeps.
- `is_sleeping()` reports memory (weights or KV released), not the pause flag.
- Every generate pays `EngineSettings.request_overhead_s` outside the engine, half before the
  request reaches the scheduler and half after it finishes, and its response waits for the API server
  to build it and those finished before it (`response_per_request_s` + `response_per_token_s` per generated
  token, one at a time). The first weight-update session of a
  server process pays `first_update_s` more; a restart is a new process.
- A cancelled generate (client gone) aborts its request at the next boundary.
- Responses: the length comes from `LengthSampler` keyed by the request id (or session id), the
  tokens are a window of a seeded pool chosen by the same key, so both are independent of
  routing and scheduling; "stop" ends with EOS, "length" stops at max_tokens; the weight version
  last finished is stamped as a string.
- Not modelled: prefix-cache hits (the n samples of a group arrive together, and vLLM only reuses
  blocks computed in an earlier step, so a rollout sees almost none), speculative decoding, stop strings.
- Faults: `inject_failure(at)` / `fail_now()` make every waiting and later call raise
  EngineError(retryable=True) until `restart()` (after `restart_s`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import simpy

from vime.errors import ConfigError, EngineError
from vime.protocols import (
    TAG_WEIGHTS,
    EngineLifecycle,
    EngineMemory,
    GenerateRequest,
    GenerateResult,
    PauseMode,
    WeightBucket,
    sleep_offload_tags,
)
from vime.sim import clock
from vime.sim.engine.core import EngineCore, pause_for
from vime.sim.engine.costs import IterationModel, bucket_seconds
from vime.sim.engine.faults import EngineFaults
from vime.sim.engine.kv import map_engine_memory, plan_kv_cache, release_memory, remap_memory, tags_to_wake
from vime.sim.engine.scheduler import EngineStats, Request, Scheduler
from vime.sim.lengths import LengthDraw, LengthSampler, key_seed

if TYPE_CHECKING:
    from vime.protocols import StepObserver
    from vime.sim.engine.settings import EngineSettings
    from vime.sim.hardware import HardwareSpec
    from vime.sim.memory import SimAllocator
    from vime.sim.models import ModelSpec


class SimEngine(EngineFaults):
    """A simulated vLLM server implementing `vime.protocols.RolloutEngine` on the simpy environment `env`.

    Its memory (weights, kv_cache, cuda_graph and runtime tags, the CUDA context) lives in `allocator`
    (see `engine_allocator`) on its simulated GPUs; sleep and wake cost what the allocator says plus vLLM's calls.
    """

    def __init__(self, name: str, env: simpy.Environment, hardware: HardwareSpec, model: ModelSpec,
                 settings: EngineSettings, lengths: LengthSampler, *, allocator: SimAllocator, seed: int = 0,
                 observer: StepObserver | None = None, record_events: bool = False) -> None:
        self.name = name
        self.env = env
        self.hardware = hardware
        self.model = model
        self.settings = settings
        self.lengths = lengths
        self.seed = int(seed)
        self.allocator = allocator
        self.observer = observer
        self.lifecycle = EngineLifecycle(name)
        self.kv = plan_kv_cache(hardware, model, settings)
        self.cost = IterationModel.build(hardware, model, settings)
        self._weight_tensors = len(model.hf_weight_shapes())  # allocations vLLM's backup loop walks
        self.stats = EngineStats(kv_blocks_total=self.kv.num_blocks)
        self.events: list[tuple[Any, ...]] | None = [] if record_events else None
        self.eos_token_id = int(getattr(model, "eos_token_id", 151645) or 151645)
        self.vocab_size = int(model.vocab_size)
        self._updated_once = False  # this server process has opened a weight-update session
        self._failed: str | None = None
        self._seq = 0
        self._new_process()
        map_engine_memory(allocator, name, self.kv, model.vllm_pinned_scale(settings.tp))
        self._core.start()

    def _new_process(self) -> None:
        """A fresh scheduler and engine core: the state of a server process that has not run yet."""
        self._sched = Scheduler(self.name, self.settings, self.kv.num_blocks, self.cost, self.stats,
                                self._finish, self._log)
        self._core = EngineCore(self.name, self.env, self.lifecycle, self._sched, self._busy_span, self._log)
        self._tail_until = 0.0  # when the last finished request's response has left the front end
        self._frontend_free = 0.0  # when the API server has built the responses queued so far

    def _log(self, *event: Any) -> None:
        if self.events is not None:
            self.events.append((round(float(self.env.now), 12), *event))

    @property
    def running(self) -> int:
        return len(self._sched.order)

    @property
    def in_flight(self) -> int:
        """Requests accepted and not yet answered (running, queued, held while paused)."""
        return len(self._sched.requests())

    @property
    def used_blocks(self) -> int:
        return self._sched.used_blocks

    @property
    def failed(self) -> bool:
        return self._failed is not None

    def _alive(self, call: str) -> None:
        if self._failed is not None:
            raise EngineError(self.name, call, f"engine is down ({self._failed})", status=503, retryable=True)

    def _busy_span(self, t0: float, t1: float, tokens: int) -> None:
        span = getattr(self.observer, "span", None)
        if span is not None:
            span(self.name, "generate", t0, t1, tokens=tokens)

    def _report(self, call: str, t0: float) -> None:
        if self.observer is not None:
            self.observer.on_call(self.name, call, t0, float(self.env.now))

    # --- generation ---------------------------------------------------------------------------
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Serve one token-in request (seed steps 20–25). Waits while paused; raises EngineError if the server fails."""
        self._alive("generate")
        self.lifecycle.check_generate()
        prompt, max_tokens = _checked_lengths(self.name, request, self.settings.max_model_len)
        half = self.settings.request_overhead_s / 2  # the front end's way in, and (below) out
        await pause_for(self.env, half)
        self._alive("generate")  # the server may have died while the request was on its way in
        key = _sample_key(request, self.lengths)
        done = resumed_tokens(request.request_id)
        if (request.sampling_params or {}).get("ignore_eos"):
            draw = LengthDraw(max_tokens, "length")  # vLLM generates until max_tokens
        elif done:  # a resumed response (partial rollout) ends where the whole response would have
            whole = self.lengths.response(key, max_tokens + done)
            draw = LengthDraw(max(1, whole.length - done), whole.finish_reason)
        else:
            draw = self.lengths.response(key, max_tokens)
        self._seq += 1
        rid = request.request_id or f"{self.name}-{self._seq}"
        req = Request(rid, self._seq, key, prompt, draw.length, draw.finish_reason, max_tokens,
                      self.env.event(), float(self.env.now))
        self.stats.requests += 1
        self._log("arrive", rid, prompt, draw.length)
        if self._sched.submit(req, held=self.lifecycle.paused is not None):
            self._core.poke()
        try:
            outcome = await clock.event_future(req.done)
        except BaseException:
            # The client went away (task cancelled): like vLLM on a disconnect, abort the request
            # at the next iteration boundary so it stops holding a seat and KV blocks.
            if not req.done.triggered and self._failed is None:
                self._core.cancel(req)
            raise
        if isinstance(outcome, BaseException):
            raise outcome
        # output processing, engine core → API server → client, in turn behind the responses finished before it
        await pause_for(self.env, max(req.out_at, float(self.env.now) + half) - float(self.env.now))
        return outcome

    def _finish(self, req: Request, finish: str) -> None:
        """The scheduler ended `req`: its response leaves through the front end (the second half of the overhead),
        after the API server has built it: one process per engine builds finished responses one at a time, at
        `EngineSettings.response_seconds`, so a batch that finishes together leaves one by one."""
        start = max(float(self.env.now), self._frontend_free)
        self._frontend_free = start + self.settings.response_seconds(req.gen)
        out_at = self._frontend_free + self.settings.request_overhead_s / 2
        req.out_at = out_at
        self._tail_until = max(self._tail_until, out_at)
        if finish == "abort":
            self.stats.aborted += 1
        else:
            self.stats.finished += 1
        self._log("finish", req.rid, finish, req.gen)
        version = self.lifecycle.weight_version
        req.done.succeed(_response(self, req, finish, None if version is None else str(version)))

    # --- pause / resume / abort / flush -------------------------------------------------------
    async def pause(self, mode: PauseMode = "abort") -> None:
        """Stop scheduling at the next iteration boundary (seed step 46): abort, keep or wait (drain)."""
        t0 = float(self.env.now)
        self._alive("pause")
        self.lifecycle.check_pause(mode)
        await pause_for(self.env, self.settings.http_rtt_s / 2)
        await self._core.control("pause", mode)
        await pause_for(self.env, self.settings.pause_call_s)
        if mode == "wait":
            # vLLM's drain waits for its output processor, which handles the drained requests'
            # last outputs: their responses are out by the time the pause answers.
            await pause_for(self.env, self._tail_until - float(self.env.now))
        await pause_for(self.env, self.settings.http_rtt_s / 2)
        self._report("pause", t0)

    async def resume(self) -> None:
        """Continue scheduling (seed step 52); requests held while paused join the queue."""
        t0 = float(self.env.now)
        self._alive("resume")
        await pause_for(self.env, self.settings.http_rtt_s)
        self.lifecycle.on_resume()
        self._log("resume")
        self._sched.release_held()
        self._core.poke()
        self._report("resume", t0)

    async def abort_all(self) -> int:
        """POST /abort_requests {} (seed step 28): every request in the engine ends with "abort" and its
        partial tokens; returns how many were aborted (the real client's `abort_all`)."""
        t0 = float(self.env.now)
        self._alive("abort_all")
        await pause_for(self.env, self.settings.http_rtt_s / 2)
        before = self.stats.aborted
        await self._core.control("abort")
        await pause_for(self.env, self.settings.http_rtt_s / 2)
        self._report("abort_all", t0)
        return self.stats.aborted - before

    async def is_paused(self) -> bool:
        self._alive("is_paused")
        return self.lifecycle.paused is not None

    async def flush_cache(self) -> None:
        """Reset the prefix cache and running requests (seed step 46): frozen requests will recompute."""
        t0 = float(self.env.now)
        self._alive("flush_cache")
        self.lifecycle.check_flush()
        await pause_for(self.env, self.settings.http_rtt_s + self.settings.flush_cache_s)
        await self._core.control("flush")
        self._report("flush_cache", t0)

    # --- sleep / wake -------------------------------------------------------------------------
    async def sleep(self, level: int, mode: PauseMode = "keep") -> None:
        """Release GPU memory (seed steps 34–36): level 1 offloads weights, level 2 discards them; KV always discarded."""
        t0 = float(self.env.now)
        self._alive("sleep")
        self.lifecycle.check_sleep(level)
        if mode not in ("abort", "wait", "keep"):  # the real client raises the same
            raise ConfigError(f"engine {self.name}: sleep mode must be abort, wait or keep, got {mode!r}")
        await pause_for(self.env, self.settings.http_rtt_s / 2)
        await self._core.control("quiesce", mode)
        self._core.hold = True
        offload = sleep_offload_tags(level)
        if not self.settings.sleep_backup_runtime:  # vLLM 0.25.1: only the weights' pool is ever copied out
            offload = tuple(t for t in offload if t == TAG_WEIGHTS)
        await release_memory(self.allocator, self.env, offload, self.settings, self._weight_tensors)
        self.lifecycle.on_sleep(level)
        self._log("sleep", level)
        await pause_for(self.env, self.settings.http_rtt_s / 2)
        self._report("sleep", t0)

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Remap `tags` (None = all; vime tags normalised to vLLM's, seed steps 10–13) plus non-deferrable ones."""
        t0 = float(self.env.now)
        self._alive("wake_up")
        normalized = self.lifecycle.check_wake(tags)
        if normalized is not None and not normalized:
            # Only vime's implicit tags (e.g. [cuda_graph]): the real client sends nothing, since vLLM
            # wakes those with any wake and an empty tag list would mean "wake all".
            return
        chosen = tags_to_wake(self.allocator.lifecycle.asleep_tags(), normalized)
        await pause_for(self.env, self.settings.http_rtt_s / 2)
        if chosen:
            await remap_memory(self.allocator, self.env, chosen, self.settings, self._weight_tensors)
        self.lifecycle.on_wake(normalized)
        self._log("wake_up", tuple(chosen))
        if self.lifecycle.memory is EngineMemory.AWAKE:
            self._core.hold = False
            self._core.poke()
        await pause_for(self.env, self.settings.http_rtt_s / 2)
        self._report("wake_up", t0)

    async def is_sleeping(self) -> bool:
        """True while any of weights / kv_cache is released (the memory state, not the pause flag)."""
        self._alive("is_sleeping")
        return self.lifecycle.memory is not EngineMemory.AWAKE

    # --- weights ------------------------------------------------------------------------------
    async def start_weight_update(self) -> None:
        """Open a weight-update session (seed step 47); needs the weights mapped."""
        t0 = float(self.env.now)
        self._alive("start_weight_update")
        self.lifecycle.check_start_update()
        first = 0.0 if self._updated_once else self.settings.first_update_s
        await pause_for(self.env, self.settings.http_rtt_s + self.settings.start_update_call_s + first)
        self._updated_once = True
        self.lifecycle.on_start_update()
        self._report("start_weight_update", t0)

    def bucket_seconds(self, bucket: WeightBucket) -> float:
        """One POST /update_weights (seed steps 48–50); see `costs.bucket_seconds`."""
        return bucket_seconds(self.settings, self.hardware, bucket)

    async def update_weights(self, bucket: WeightBucket) -> None:
        """Load one bucket (seed steps 48–50); needs an open session."""
        t0 = float(self.env.now)
        self._alive("update_weights")
        self.lifecycle.check_update()
        if bucket.nbytes < 0:
            # vLLM's worker closes the update session when a bucket fails; so does the real client's record.
            self.lifecycle.updating = False
            raise EngineError(self.name, "update_weights", f"bucket {bucket.index} has negative size", status=400)
        await pause_for(self.env, self.bucket_seconds(bucket))
        self._log("update_weights", bucket.index, bucket.nbytes)
        self._report("update_weights", t0)

    async def finish_weight_update(self, version: int) -> None:
        """Close the session; later responses carry str(version) (seed step 51)."""
        t0 = float(self.env.now)
        self._alive("finish_weight_update")
        self.lifecycle.check_finish_update(version)
        await pause_for(self.env, self.settings.http_rtt_s + self.settings.finish_update_call_s)
        self.lifecycle.on_finish_update(version)
        self._log("weight_version", version)
        self._report("finish_weight_update", t0)

    async def weight_version(self) -> str | None:
        self._alive("weight_version")
        v = self.lifecycle.weight_version
        return None if v is None else str(v)

    async def health(self) -> bool:
        """GET /health: one HTTP round trip (the orchestrator's check between rollout and offload, in T_gap)."""
        await pause_for(self.env, self.settings.http_rtt_s)
        return self._failed is None


def resumed_tokens(request_id: str | None) -> int:
    """Tokens a resumed request's sample already has: ids ``ID@N`` continue the response of ``ID`` after N tokens."""
    tail = (request_id or "").rpartition("@")[2]
    return int(tail) if "@" in (request_id or "") and tail.isdigit() else 0


def _sample_key(request: GenerateRequest, lengths: LengthSampler) -> str:
    """What identifies the sample for its length and tokens, independent of scheduling order."""
    if request.request_id:
        return f"id:{request.request_id.rpartition('@')[0] or request.request_id}"
    if request.session_id:
        return f"session:{request.session_id}"
    return lengths.auto_key(request.token_ids)


def _checked_lengths(name: str, request: GenerateRequest, max_model_len: int) -> tuple[int, int]:
    """(prompt tokens, max_tokens) of a request vLLM accepts; the errors vLLM (or the real client) gives otherwise."""
    prompt = len(request.token_ids)
    if prompt < 1:  # the caller's bad input, refused before any I/O as the real client does
        raise ConfigError(f"engine {name}: generate needs at least one prompt token id")
    max_tokens = (request.sampling_params or {}).get("max_tokens")
    if max_tokens is None:
        max_tokens = max_model_len - prompt
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise EngineError(name, "generate", f"max_tokens must be a positive integer, got {max_tokens!r}", status=400)
    if prompt + max_tokens > max_model_len:
        raise EngineError(name, "generate",
                          f"this model's maximum context length is {max_model_len} tokens, but the request "
                          f"asks for {prompt} prompt + {max_tokens} completion tokens", status=400)
    return prompt, max_tokens


_POOL_SIZE = 1 << 20
_POOLS: dict[tuple[int, int, int], tuple[list[int], list[float]]] = {}


def _token_pool(seed: int, vocab: int, eos: int) -> tuple[list[int], list[float]]:
    """A seeded pool of token ids (never EOS) and plausible log-probs that responses are cut from."""
    key = (seed, vocab, eos)
    pool = _POOLS.get(key)
    if pool is None:
        rng = np.random.Generator(np.random.PCG64(key_seed(seed, "token-pool", vocab, eos)))
        ids = rng.integers(0, vocab - 1, size=_POOL_SIZE, dtype=np.int64)
        ids[ids >= eos] += 1
        # Sampled tokens at temperature 1: mostly confident, a long tail of surprising ones.
        lps = np.round(-rng.exponential(0.45, size=_POOL_SIZE), 6)
        pool = _POOLS[key] = (ids.tolist(), lps.tolist())
    return pool


def _response(engine: SimEngine, req: Request, finish: str, version: str | None) -> GenerateResult:
    """The response to `req`: a window of the seeded pool chosen by the sample's key.

    Deterministic per (seed, key), independent of scheduling, and a list slice (pointer copies of
    shared immutable ints and floats) instead of a fresh RNG and new objects per token.
    """
    n = req.gen
    ids_pool, lp_pool = _token_pool(engine.seed, engine.vocab_size, engine.eos_token_id)
    start = key_seed(engine.seed, "tokens", req.key) % (_POOL_SIZE - n + 1) if n <= _POOL_SIZE else 0
    ids = ids_pool[start:start + n]
    lps = lp_pool[start:start + n]
    while len(ids) < n:  # longer than the pool: wrap around
        ids += ids_pool[:n - len(ids)]
        lps += lp_pool[:n - len(lps)]
    if finish == "stop" and n:
        ids[-1] = engine.eos_token_id
        lps[-1] = -0.02
    return GenerateResult(
        token_ids=ids, log_probs=lps, finish_reason=finish,  # type: ignore[arg-type]
        prompt_tokens=req.prompt, completion_tokens=n, cached_tokens=0,
        weight_version=version, engine=engine.name)
