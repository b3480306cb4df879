"""The fully-async rollout producer (issue 22): admits groups under a staleness bound, generates them with partial rollout, buffers finished groups.

A background task takes one group at a time from the data source and generates it through the
`Router`, as long as admission is open (the orchestrator closes it around every weight update:
seed steps 44 and 53) and the group could still be trained within ``max_staleness`` versions of
the weights it starts under. Finished groups are scored, passed through the dynamic filter and
queued; the trainer takes them ``batch_groups`` at a time (`take`), oldest first, and a queued
group that has meanwhile grown too stale is handed back to the data source to be generated again.

Partial rollout: with ``abort-resume`` a weight update aborts in-flight requests; each sample keeps
the tokens it got, stamped with the old version, and asks the engine for the rest, which it gets
under the new weights (``Sample.weight_versions`` then holds one version per span). With ``keep`` the
update freezes the requests in place and they finish under the new weights. Either way every sample
taken from the data source is trained, dropped by the filter, or handed back (`stop`): `accounting`.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from vime.algo.sampling import sampling_params_for_sample
from vime.errors import EngineError
from vime.protocols import GenerateRequest
from vime.rollout.filters import call_dynamic_filter
from vime.rollout.generate import Rollout, RolloutError, session_id_for
from vime.types import Sample, SampleStatus

_DONE = (SampleStatus.COMPLETED, SampleStatus.TRUNCATED)
ADMIT_VERSION = "admit_version"  # Sample.metadata: the engines' weight version when its group was admitted
CROSSED_UPDATE = "crossed_update"  # Sample.metadata: in flight (started, unfinished) across a weight update


def oldest_version(sample: Sample) -> int:
    """The oldest weight version that may have produced any of the sample's tokens."""
    versions = [int(v) for v in sample.weight_versions if str(v).lstrip("-").isdigit()]
    admitted = sample.metadata.get(ADMIT_VERSION)
    if admitted is not None:
        versions.append(int(admitted))
    return min(versions) if versions else 0


@dataclass
class ProducerCounts:
    """Groups through the producer since the start (or since `ProducerCounts` was last taken)."""

    admitted_groups: int = 0
    trained_groups: int = 0
    dropped_groups: int = 0  # rejected by the dynamic filter
    stale_groups: int = 0  # queued but too stale when taken: handed back and generated again
    returned_groups: int = 0  # handed back at the end of the run
    request_errors: int = 0
    resumed_requests: int = 0  # abort-resume: requests re-sent after a weight update aborted them


class Producer:
    """The continuous producer of `--async-mode fully-async`; `start`, then `take` per train step, then `stop`."""

    def __init__(self, rollout: Rollout, data_source: Any, *, batch_groups: int, max_staleness: int,
                 partial_rollout: str, engine_version: Callable[[], int], dynamic_filter: Any = None) -> None:
        self.rollout = rollout
        self.router = rollout.router
        self.data_source = data_source
        self.batch_groups = batch_groups
        self.max_staleness = max_staleness
        self.partial_rollout = partial_rollout
        self.engine_version = engine_version
        self.dynamic_filter = dynamic_filter
        self.counts = ProducerCounts()
        self.queue: deque[list[Sample]] = deque()  # finished, kept groups, in the order they finished
        self.inflight: dict[asyncio.Task[list[Sample]], list[Sample]] = {}
        self.taken = 0  # batches the trainer has taken
        self.base_version = 0  # the trainer's weight version at its first batch
        self._open = True  # admission (pause_rollout_admission / resume_rollout_admission)
        self._stopping = False
        self._changed = asyncio.Event()
        self._semaphore = asyncio.Semaphore(rollout.cfg.vllm_server_concurrency * rollout.num_engines)
        self._error: BaseException | None = None
        self._task: asyncio.Task[None] | None = None

    # --- the orchestrator's side ------------------------------------------------------------------
    @property
    def admitting(self) -> bool:
        return self._open

    @property
    def stopped(self) -> bool:
        return self._stopping

    def counts_snapshot(self) -> ProducerCounts:
        return dataclasses.replace(self.counts)

    def start(self) -> None:
        self.base_version = self.engine_version()
        self._task = asyncio.create_task(self._admit())

    def pause(self) -> None:
        """Seed step 44: admit nothing new; requests that run now and have tokens are marked as crossing the update."""
        self._open = False
        for group in self.inflight.values():
            for s in group:
                if s.metadata.get("started") and s.status not in _DONE:
                    s.metadata[CROSSED_UPDATE] = True

    def resume(self) -> None:
        """Seed step 53 (and step 9 after a recovery): admission open again, under the new version."""
        self._open = True
        self._changed.set()

    async def take(self) -> list[list[Sample]]:
        """The next `batch_groups` groups for the trainer, none older than ``max_staleness`` versions."""
        trainer_version = self.base_version + self.taken
        while True:
            self._raise_error()
            stale = [g for g in self.queue if trainer_version - min(map(oldest_version, g)) > self.max_staleness]
            if stale:
                self.queue = deque(g for g in self.queue if all(g is not t for t in stale))
                self.counts.stale_groups += len(stale)
                self._hand_back(stale)  # reset and served first: generated again, fresher
            if len(self.queue) >= self.batch_groups:
                break
            self._changed.clear()
            await self._wait()
        groups = [self.queue.popleft() for _ in range(self.batch_groups)]
        self.taken += 1
        self.counts.trained_groups += len(groups)
        self._changed.set()
        return groups

    async def stop(self) -> int:
        """End production: abort what runs, wait for it, hand every unfinished or untrained group back; returns how many."""
        self._stopping = True
        self._changed.set()
        if self._task is not None:
            await self._task
        if self.inflight:
            try:
                await self.router.abort_all()
            except EngineError:
                pass  # the requests still end (the engine's own abort or its failure); waited for below
            await asyncio.wait(list(self.inflight))
        groups = [*self.queue, *sorted(self.inflight.values(), key=lambda g: g[0].group_index or 0)]
        self.queue.clear()
        self.inflight.clear()
        if groups:
            self._hand_back(groups)
        self.counts.returned_groups += len(groups)
        return len(groups)

    def _hand_back(self, groups: list[list[Sample]]) -> None:
        for group in groups:
            for s in group:
                for key in (ADMIT_VERSION, CROSSED_UPDATE, "started", "admission"):
                    s.metadata.pop(key, None)
        self.data_source.add_samples(groups)

    def _raise_error(self) -> None:
        if self._error is not None:
            raise self._error

    async def _wait(self) -> None:
        # a task that ends wakes every waiter through _changed
        await self._changed.wait()

    # --- admission ----------------------------------------------------------------------------------
    def _lag_if_admitted(self) -> int:
        """The version lag a group admitted now would have when trained, if groups are trained in admission order."""
        ahead = len(self.queue) + len(self.inflight)
        return self.base_version + self.taken + ahead // self.batch_groups - self.engine_version()

    async def _admit(self) -> None:
        while not self._stopping:
            if not self._open or self._error is not None or self._lag_if_admitted() > self.max_staleness:
                self._changed.clear()
                await self._changed.wait()
                continue
            group = self.data_source.get_samples(1)[0]
            version = self.engine_version()
            for s in group:
                s.metadata[ADMIT_VERSION] = version
                s.metadata["admission"] = self.counts.admitted_groups
                s.session_id = s.session_id or session_id_for(self.rollout.seed, s.index)
            self.counts.admitted_groups += 1
            task = asyncio.create_task(self._group(group))
            self.inflight[task] = group
            task.add_done_callback(self._finished)
            await asyncio.sleep(0)  # let the group's requests go out before the next admission

    def _finished(self, task: asyncio.Task[list[Sample]]) -> None:
        group = self.inflight.get(task)
        if group is None or self._stopping:
            self._changed.set()
            return  # stop() hands it back with the others
        del self.inflight[task]
        exc = task.exception() if not task.cancelled() else asyncio.CancelledError()
        failed = [s for s in group if s.status not in _DONE]
        if exc is None and failed:
            s = failed[0]
            exc = RolloutError(f"fully-async producer: sample {s.index} (group {s.group_index}) ended "
                               f"{s.status.value}: {s.metadata.get('error', 'no error recorded')}")
        if exc is not None:
            self._error = self._error or exc
            self._hand_back([group])  # not lost: handed back
            self.counts.returned_groups += 1
        elif call_dynamic_filter(self.dynamic_filter, group).keep:
            self.queue.append(group)
        else:
            self.counts.dropped_groups += 1
        self._changed.set()

    # --- generation with partial rollout --------------------------------------------------------------
    async def _group(self, group: list[Sample]) -> list[Sample]:
        params = dict(self.rollout.sampling_params)
        await asyncio.gather(*(self._sample(s, params) for s in group))
        reward = self.rollout.reward
        if all(s.status in _DONE for s in group) and not self._stopping:
            if reward.group_rm:
                for s, r in zip(group, await reward.score_group(group), strict=True):
                    s.reward = r
            else:
                for s in group:
                    s.reward = await reward.score(s)
        return group

    @staticmethod
    def _request_id(sample: Sample) -> str:
        """``a<admission>-s<index>``, with ``@N`` when it resumes a response that has N tokens (the simulator continues it)."""
        base = f"a{sample.metadata.get('admission', 0)}-s{sample.index}"
        return f"{base}@{sample.response_length}" if sample.response_length else base

    async def _sample(self, sample: Sample, params: dict[str, Any]) -> None:
        async with self._semaphore:
            errors = 0
            while not self._stopping:
                wire = sampling_params_for_sample(sample, params, self.rollout.logprobs)
                if wire is None:  # no token budget left: truncated
                    return
                request = GenerateRequest(token_ids=sample.tokens, sampling_params=wire,
                                          session_id=sample.session_id if self.rollout.use_session_header else None,
                                          request_id=self._request_id(sample))
                sample.metadata["started"] = True
                try:
                    result = await self.router.generate(request)
                except EngineError as exc:
                    result = None
                    sample.metadata["error"] = str(exc)
                if result is None or result.finish_reason == "error":
                    errors += 1
                    self.counts.request_errors += 1
                    if errors >= self.rollout.max_attempts:
                        sample.status = SampleStatus.FAILED
                        return
                    continue
                if result.finish_reason != "abort":
                    sample.append_response_tokens(result.token_ids, result.log_probs, meta_info=result.meta_info())
                    return
                if result.token_ids:  # an empty aborted span says nothing about the weights
                    sample.append_response_tokens(result.token_ids, result.log_probs, meta_info=result.meta_info())
                if self._stopping:
                    sample.status = SampleStatus.ABORTED
                    return
                # aborted by a weight update: resume from the tokens it has, under the new weights
                sample.status = SampleStatus.PENDING
                self.counts.resumed_requests += 1
            sample.status = SampleStatus.ABORTED
