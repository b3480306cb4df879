"""One rollout as ordinary asyncio code (seed steps 16–28): groups in flight, rewards, dynamic filter, refill, abort.

`Rollout.generate_rollout(rollout_id, data_source)` collects exactly ``rollout_batch_size``
groups of ``n_samples_per_prompt`` samples. It keeps ``over_sampling_batch_size`` groups per
refill in flight, at most ``vllm_server_concurrency × engines`` requests at once, sends each
sample's request through the `Router`, scores samples as they finish (or once per group with
``--group-rm``), collects groups as they complete (``asyncio.wait(FIRST_COMPLETED)`` semantics), drops the groups a
dynamic filter rejects and refills, and, once the target is met, aborts what still runs and
hands those groups back to the data source. Nothing is lost silently: a failed request is
retried (with a new session id, so a hashing router may pick another engine); a sample that
still fails stops the rollout with a `RolloutError` that names the engine and the error, after
every unfinished group has been returned to the data source.
"""

from __future__ import annotations

import asyncio
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from tqdm import tqdm

from vime.algo.sampling import default_sampling_params, logprobs_count, sampling_params_for_sample
from vime.errors import EngineError, VimeError
from vime.protocols import GenerateRequest, GenerateResult, Router
from vime.rollout.filters import call_dynamic_filter
from vime.rollout.rm_hub import RewardHub
from vime.types import Sample, SampleStatus

if TYPE_CHECKING:
    from vime.config import RolloutConfig

_DONE = (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)


class RolloutError(VimeError):
    """A rollout could not produce its batch (a sample failed on every attempt, a filter never passes)."""


@dataclass
class RolloutStats:
    """Counts of one rollout (seed steps 27–28); all in samples unless named groups."""

    rollout_id: int
    target_groups: int
    group_size: int
    submitted_groups: int = 0  # groups taken from the data source (target + refills)
    kept_groups: int = 0
    dropped_groups: int = 0  # rejected by the dynamic filter
    returned_groups: int = 0  # handed back to the data source unused
    generated_samples: int = 0  # samples whose generation finished (kept, dropped or surplus)
    aborted_samples: int = 0  # samples cut off or never started when the target was met
    request_errors: int = 0  # requests that failed (each retried while attempts remain)
    failed_samples: int = 0  # samples that failed on every attempt
    truncated_samples: int = 0  # kept samples that hit max_tokens
    response_tokens: int = 0  # of kept samples
    prompt_tokens: int = 0  # of kept samples: with response_tokens, what a trainer's forward reads
    max_response_length: int = 0
    # When the engines answered, on the rollout's clock from its start (virtual in the simulator): the
    # rollout's time beyond the last response is the client's own (rewards, filter, abort).
    first_request_s: float = -1.0  # when the first request went to the router (-1: none yet)
    last_request_s: float = -1.0  # when the last one went (retries and later turns included)
    first_response_s: float = 0.0
    last_response_s: float = 0.0
    request_time_s: float = 0.0  # summed over answered requests, send to answer
    answered_requests: int = 0
    drop_reasons: dict[str, int] = field(default_factory=dict)
    engine_errors: list[str] = field(default_factory=list)

    @property
    def kept_samples(self) -> int:
        return self.kept_groups * self.group_size

    @property
    def dropped_samples(self) -> int:
        return self.dropped_groups * self.group_size

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k not in ("drop_reasons", "engine_errors")}
        d["kept_samples"] = self.kept_samples
        d["request_time_mean_s"] = self.request_time_s / self.answered_requests if self.answered_requests else 0.0
        d["dropped_samples"] = self.dropped_samples
        d["drop_reasons"] = dict(self.drop_reasons)
        d["engine_errors"] = list(self.engine_errors)
        return d


@dataclass
class RolloutOutput:
    """What a rollout returns to the step loop (seed step 29): the kept groups and the counts."""

    groups: list[list[Sample]]
    stats: RolloutStats

    @property
    def samples(self) -> list[Sample]:
        return [s for g in self.groups for s in g]


def session_id_for(seed: int, index: int | None, attempt: int = 0) -> str:
    """A per-sample session id (seed step 17): unique per sample and attempt, and deterministic
    (the seed uses uuid4; a seeded id keeps simulated runs identical and hashes as well)."""
    return f"vime-{seed}-{index}-{attempt}"


class _Bar(tqdm):  # type: ignore[misc]
    # tqdm's monitor thread would be the only thread in a simulation; it is not needed.
    monitor_interval = 0


@dataclass
class _State:
    """Per-rollout state (seed's GenerateState): the semaphore, the abort flag, the pending groups."""

    semaphore: asyncio.Semaphore
    stats: RolloutStats
    t0: float = 0.0  # the rollout's start on the loop's clock
    aborted: bool = False
    remaining_batch_size: int = 0
    pendings: dict[asyncio.Task[list[Sample]], list[Sample]] = field(default_factory=dict)
    finished: list[asyncio.Task[list[Sample]]] = field(default_factory=list)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)

    def add(self, task: asyncio.Task[list[Sample]], group: list[Sample]) -> None:
        self.pendings[task] = group
        task.add_done_callback(self._on_done)

    def _on_done(self, task: asyncio.Task[list[Sample]]) -> None:
        self.finished.append(task)
        self.wakeup.set()

    async def wait_first_completed(self) -> list[asyncio.Task[list[Sample]]]:
        """``asyncio.wait(pendings, FIRST_COMPLETED)`` (seed step 27) in O(finished) instead of O(pending).

        asyncio.wait registers and removes a callback on every pending task per call, which makes
        collecting 1024 groups one by one quadratic; here each task reports itself once.
        """
        while not self.finished:
            self.wakeup.clear()
            await self.wakeup.wait()
        done = [t for t in self.finished if t in self.pendings]
        self.finished.clear()
        return done


class Rollout:
    """Generates rollouts against a `Router`; built once per run (the seed's RolloutManager side).

    `custom_generate` (or ``--custom-generate-function-path``) replaces `generate` for one
    sample: ``async fn(rollout, sample, sampling_params) -> Sample``; it may call
    ``rollout.generate_once`` any number of times (multi-turn agents), appending turns with
    ``sample.append_response_tokens(..., trainable=False)`` for tool output.
    """

    def __init__(self, cfg: RolloutConfig, router: Router, *, num_engines: int, reward: RewardHub, seed: int,
                 tokenizer: Any = None, dynamic_filter: Callable[[Sequence[Sample]], Any] | None = None,
                 custom_generate: Callable[..., Any] | None = None, progress: bool | None = None,
                 max_attempts: int = 3, max_oversubmit: int = 16, abort_timeout_s: float = 120.0) -> None:
        self.cfg = cfg
        self.router = router
        self.num_engines = num_engines
        self.tokenizer = tokenizer
        self.reward = reward
        # the functions --dynamic-sampling-filter-path / --custom-generate-function-path name (vime.rollout.plugins)
        self.dynamic_filter = dynamic_filter
        self.custom_generate = custom_generate
        self.progress = sys.stderr.isatty() if progress is None else progress
        self.max_attempts = max_attempts
        self.max_oversubmit = max_oversubmit
        self.abort_timeout_s = abort_timeout_s
        self.sampling_params = default_sampling_params(cfg)  # seed step 19, vime names
        self._sampling = self.sampling_params  # this rollout's (generate_rollout's overrides applied)
        self.logprobs = logprobs_count(cfg)
        self.use_session_header = cfg.router_policy == "consistent_hash"
        self.seed = seed
        self.rollout_id = -1
        self._state: _State | None = None

    # --- seed steps 16, 27, 28 ------------------------------------------------------------------
    async def generate_rollout(self, rollout_id: int, data_source: Any, *, evaluation: bool = False,
                               target_groups: int | None = None,
                               sampling: Mapping[str, Any] | None = None) -> RolloutOutput:
        """Collect `target_groups` (default ``rollout_batch_size``) groups; see the module docstring.

        `sampling` overrides some of the rollout's sampling params for this rollout (evaluation sets).
        """
        cfg = self.cfg
        self._sampling = {**self.sampling_params, **(sampling or {})}
        n = data_source.n_samples_per_prompt
        target = cfg.rollout_batch_size if target_groups is None else target_groups
        self.rollout_id = rollout_id
        stats = RolloutStats(rollout_id, target, n)
        state = _State(asyncio.Semaphore(cfg.vllm_server_concurrency * self.num_engines), stats,
                       asyncio.get_running_loop().time())
        self._state = state
        dynamic_filter = None if evaluation else self.dynamic_filter
        refill = target if evaluation else cfg.over_sampling_batch_size
        data: list[list[Sample]] = []
        leftovers: list[list[Sample]] = []
        bar = _Bar(total=target * n, unit="sample", desc=f"rollout {rollout_id}", disable=not self.progress,
                   leave=False, dynamic_ncols=True)
        try:
            while len(data) < target:
                while state.remaining_batch_size < target:
                    if stats.submitted_groups >= self.max_oversubmit * target:
                        raise RolloutError(
                            f"rollout {rollout_id}: {stats.submitted_groups} groups submitted for a target of "
                            f"{target}, {stats.dropped_groups} dropped by the dynamic filter "
                            f"({dict(stats.drop_reasons)}); the filter almost never passes — check "
                            f"--dynamic-sampling-filter-path and the reward")
                    self._submit(state, data_source.get_samples(refill))
                done = await state.wait_first_completed()
                # Like asyncio.wait's set, the batch has no order: sort by group index so every run collects alike.
                for task in sorted(done, key=lambda t: state.pendings[t][0].group_index or 0):
                    group = state.pendings.pop(task)
                    try:
                        task.result()  # re-raise what the group task raised (reward errors, misuse)
                        self._check_group(group, n)
                    except BaseException:
                        leftovers.append(group)  # returned to the data source with the others
                        raise
                    stats.generated_samples += n
                    verdict = call_dynamic_filter(dynamic_filter, group)
                    if not verdict.keep:
                        state.remaining_batch_size -= 1
                        stats.dropped_groups += 1
                        reason = verdict.reason or "filtered"
                        stats.drop_reasons[reason] = stats.drop_reasons.get(reason, 0) + 1
                        continue
                    if len(data) < target:
                        data.append(group)
                        bar.update(n)
                    else:
                        leftovers.append(group)  # finished after the target was met: surplus
        except BaseException as exc:
            returned = await self._abort(state, leftovers)
            if returned:
                data_source.add_samples(returned)
                note = f"{len(returned)} unfinished groups of rollout {rollout_id} were returned to the data source"
                if isinstance(exc, RolloutError) and exc.args:
                    exc.args = (f"{exc.args[0]}; {note}", *exc.args[1:])
                elif isinstance(exc, Exception):
                    exc.add_note(f"vime: {note}")
            raise
        else:
            returned = await self._abort(state, leftovers)  # seed step 28
            if returned:
                data_source.add_samples(returned)
        finally:
            bar.close()
            self._state = None
        self._finalize(stats, data)
        return RolloutOutput(data, stats)

    def _submit(self, state: _State, groups: list[list[Sample]]) -> None:
        for group in groups:
            task = asyncio.create_task(self._generate_and_rm_group(group, dict(self._sampling)))
            state.add(task, group)
        state.remaining_batch_size += len(groups)
        state.stats.submitted_groups += len(groups)

    def _check_group(self, group: list[Sample], n: int) -> None:
        if len(group) != n:
            raise RolloutError(f"group {group[0].group_index if group else '?'} has {len(group)} samples, "
                               f"expected --n-samples-per-prompt {n}")
        failed = [s for s in group if s.status is SampleStatus.FAILED]
        if failed:
            s = failed[0]
            raise RolloutError(
                f"rollout {self.rollout_id}: sample {s.index} (group {s.group_index}) failed after "
                f"{self.max_attempts} attempts: {s.metadata.get('error', 'unknown error')}; "
                f"{len(failed)} of its group's samples failed. Engine errors so far: "
                f"{'; '.join(self._state.stats.engine_errors[-3:]) if self._state else '-'}")
        bad = [s for s in group if s.status not in _DONE]
        if bad:
            raise RolloutError(f"rollout {self.rollout_id}: group {group[0].group_index} finished with sample "
                               f"{bad[0].index} in status {bad[0].status.value} (expected completed or "
                               f"truncated); this is a bug in the generate function")

    async def _abort(self, state: _State, leftovers: list[list[Sample]]) -> list[list[Sample]]:
        """Seed step 28: stop admitting, abort in-flight requests, wait for their groups, return them all."""
        state.aborted = True
        groups = list(leftovers)
        leftovers.clear()
        if state.pendings:
            try:
                await self.router.abort_all()
            except EngineError as exc:  # an engine that cannot abort is waited for (bounded) below
                state.stats.engine_errors.append(f"abort_all: {exc}")
            tasks = list(state.pendings)
            done, still = await asyncio.wait(tasks, timeout=self.abort_timeout_s)
            for task in still:  # an engine that ignores the abort must not hang the run
                task.cancel()
            if still:
                await asyncio.wait(still)
            for task in done:
                if not task.cancelled():
                    task.exception()  # retrieved: these groups are being given back anyway
            groups.extend(sorted(state.pendings.values(), key=lambda g: g[0].group_index or 0))
            state.pendings.clear()
        for group in groups:
            state.stats.aborted_samples += sum(1 for s in group if s.status not in _DONE)
            state.stats.generated_samples += sum(1 for s in group if s.status in _DONE)
        state.stats.returned_groups += len(groups)
        return groups

    def _finalize(self, stats: RolloutStats, data: list[list[Sample]]) -> None:
        stats.kept_groups = len(data)
        for group in data:
            for s in group:
                stats.response_tokens += s.response_length
                stats.prompt_tokens += s.prompt_length
                if s.response_length > stats.max_response_length:
                    stats.max_response_length = s.response_length
                if s.status is SampleStatus.TRUNCATED:
                    stats.truncated_samples += 1

    # --- seed steps 17–18, 26 -------------------------------------------------------------------
    async def _generate_and_rm_group(self, group: list[Sample], sampling_params: dict[str, Any]) -> list[Sample]:
        for sample in group:
            if sample.session_id is None:
                sample.session_id = session_id_for(self.seed, sample.index)
        await asyncio.gather(*(self._generate_and_rm(s, dict(sampling_params)) for s in group))
        state = self._state
        if self.reward.group_rm and (state is None or not state.aborted) \
                and all(s.status in _DONE for s in group):
            rewards = await self.reward.score_group(group)
            for s, r in zip(group, rewards, strict=True):
                s.reward = r
        return group

    async def _generate_and_rm(self, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
        if sample.status in _DONE and sample.reward is not None:
            return sample
        state = self._state
        if state is None:  # the rollout has ended; nothing may start any more
            sample.status = SampleStatus.ABORTED
            return sample
        async with state.semaphore:
            if state.aborted:
                sample.status = SampleStatus.ABORTED
                return sample
            if self.custom_generate is not None:
                sample = await self.custom_generate(self, sample, sampling_params)
            else:
                await self.generate(sample, sampling_params)
        if sample.status in _DONE and not self.reward.group_rm and sample.reward is None:
            sample.reward = await self.reward.score(sample)
        return sample

    # --- seed steps 19–25 -----------------------------------------------------------------------
    async def generate(self, sample: Sample, sampling_params: dict[str, Any]) -> Sample:
        """Generate one sample's response through the router, retrying failed requests."""
        wire = sampling_params_for_sample(sample, sampling_params, self.logprobs)
        if wire is None:  # no token budget left: TRUNCATED without a request
            return sample
        for attempt in range(self.max_attempts):
            result = await self.generate_once(sample, wire, attempt=attempt)
            if result is None:
                continue
            if result.finish_reason == "abort":
                state = self._state
                if state is None or state.aborted:
                    sample.status = SampleStatus.ABORTED
                    return sample
                self._note_failure(sample, f"engine {result.engine}: request aborted outside the rollout's "
                                           f"own abort (engine paused or restarted)")
                continue
            text = ""
            if self.tokenizer is not None and result.token_ids:
                text = self.tokenizer.decode(result.token_ids,
                                             skip_special_tokens=self.sampling_params.get("skip_special_tokens", False))
            sample.append_response_tokens(result.token_ids, result.log_probs, meta_info=result.meta_info(),
                                          text=text)
            if result.engine is not None:
                sample.metadata["engine"] = result.engine
            return sample
        sample.status = SampleStatus.FAILED
        if self._state is not None:
            self._state.stats.failed_samples += 1
        return sample

    async def generate_once(self, sample: Sample, wire_params: dict[str, Any], *,
                            attempt: int = 0) -> GenerateResult | None:
        """One request for `sample` via the router; None (and the error recorded) when it failed."""
        if attempt:
            # A fresh session id lets a hashing router send the retry to another engine.
            sample.session_id = session_id_for(self.seed, sample.index, attempt)
        # The request borrows the sample's token list: nothing appends to it until the call returns.
        request = GenerateRequest(
            token_ids=sample.tokens, sampling_params=wire_params,
            session_id=sample.session_id if self.use_session_header else None,
            request_id=f"r{self.rollout_id}-s{sample.index}" + (f"-a{attempt}" if attempt else ""))
        loop = asyncio.get_running_loop()
        sent = loop.time()
        state = self._state
        if state is not None:
            if state.stats.first_request_s < 0:
                state.stats.first_request_s = sent - state.t0
            state.stats.last_request_s = sent - state.t0
        try:
            result = await self.router.generate(request)
        except EngineError as exc:
            self._note_failure(sample, str(exc))
            return None
        self._note_answer(sent, loop.time())
        if result.finish_reason == "error":
            self._note_failure(sample, f"engine {result.engine}: generate finished with an error")
            return None
        return result

    def _note_answer(self, sent: float, answered: float) -> None:
        state = self._state
        if state is None:
            return
        st = state.stats
        if not st.answered_requests:
            st.first_response_s = answered - state.t0
        st.last_response_s = max(st.last_response_s, answered - state.t0)
        st.request_time_s += answered - sent
        st.answered_requests += 1

    def _note_failure(self, sample: Sample, message: str) -> None:
        sample.metadata["error"] = message
        state = self._state
        if state is not None:
            state.stats.request_errors += 1
            state.stats.engine_errors.append(f"sample {sample.index}: {message}")
            if len(state.stats.engine_errors) > 50:
                del state.stats.engine_errors[:-50]


def drop_reason_counts(stats: Sequence[RolloutStats]) -> dict[str, int]:
    """Sum the drop reasons of several rollouts (for reports over a run)."""
    total: Counter[str] = Counter()
    for s in stats:
        total.update(s.drop_reasons)
    return dict(total)
