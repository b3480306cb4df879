"""Continuous batching of one engine in pure Python: queues, KV blocks, admission, chunked prefill, preemption, lockstep decode.

vLLM v1's scheduler, simplified but faithful in what costs time and memory (VLLM_API.md):

- Each iteration gives every running request its tokens under `max_num_batched_tokens` (chunked
  prefill): decoding requests first (one token each), then requests still prefilling in admission
  order, then admissions from the FCFS waiting queue while `max_num_seqs` and free blocks allow. A
  request whose prompt does not fit in free blocks blocks the queue behind it, as in vLLM.
- When the running requests need more blocks than are free, the most recently admitted one is
  preempted by recompute (blocks freed, back to the front of the queue, later re-prefills prompt
  + generated tokens); an iteration that preempted admits nothing, so every request still finishes.
- Closed form: between events the running set decodes in lockstep, so the scheduler plans the
  iterations up to the next event (first completion, first iteration without a free block) as one
  `_Phase`. Decoding requests store offsets against a shared tick and are counted by their offset
  modulo the block size, so a phase costs O(block_size + log n) work, not O(tokens) or O(requests).

Nothing here knows about time or simpy: `EngineCore` runs the plans on the virtual clock.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import TYPE_CHECKING, Any

from vime.errors import SimulationError
from vime.sim.engine.costs import _Phase

if TYPE_CHECKING:
    import simpy

    from vime.sim.engine.costs import IterationModel
    from vime.sim.engine.settings import EngineSettings

#: Where a request is: queued (or held, or preempted), computing its prompt, decoding, answered.
WAITING, PREFILL, DECODE, DONE = 0, 1, 2, 3


class Request:
    """One request inside the engine. In decode mode gen/computed are offsets against the scheduler's tick."""

    __slots__ = ("rid", "seq", "key", "prompt", "target", "reason", "max_tokens", "gen", "computed",
                 "goff", "coff", "mode", "done", "arrival", "preemptions", "out_at")

    def __init__(self, rid: str, seq: int, key: str, prompt: int, target: int, reason: str,
                 max_tokens: int, done: simpy.Event, arrival: float) -> None:
        self.rid = rid
        self.seq = seq
        self.key = key
        self.prompt = prompt
        self.target = target  # tokens this response will have (EOS included when it stops)
        self.reason = reason
        self.max_tokens = max_tokens
        self.gen = 0  # generated tokens (absolute, outside decode mode)
        self.computed = 0  # tokens whose KV is in the cache (absolute, outside decode mode)
        self.goff = 0  # decode mode: gen = goff + tick
        self.coff = 0  # decode mode: computed = coff + tick
        self.out_at = -1.0  # when its response reaches the client (set when it finishes)
        self.mode = WAITING
        self.done = done
        self.arrival = arrival
        self.preemptions = 0


@dataclass
class EngineStats:
    """What one engine did, for reports (cumulative over the engine's life)."""

    requests: int = 0
    finished: int = 0
    aborted: int = 0
    failed: int = 0
    tokens_generated: int = 0
    prefill_tokens: int = 0  # prompt tokens computed, recomputation included
    iterations: int = 0
    phases: int = 0  # simpy waits the scheduler needed (closed-form phases + single iterations)
    busy_s: float = 0.0
    preemptions: int = 0
    kv_blocks_total: int = 0
    kv_blocks_peak: int = 0
    batch_iterations: dict[int, int] = field(default_factory=dict)  # running requests → iterations

    def mean_batch(self) -> float:
        n = sum(self.batch_iterations.values())
        return sum(b * k for b, k in self.batch_iterations.items()) / n if n else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "batch_iterations"}
        d["batch_iterations"] = dict(sorted(self.batch_iterations.items()))
        d["mean_batch"] = self.mean_batch()
        return d


def _feasible_iterations(n: int, cum: list[int], free: int, bs: int, limit: int) -> int:
    """Largest J ≤ limit such that the first J lockstep iterations need at most `free` new blocks.

    Iterations 0..j need n·(j // bs) + cum[j % bs] new blocks (each request takes a block every
    bs iterations, starting at its slack), which is non-decreasing in j.
    """
    if n == 0:
        return limit
    q, rem = divmod(free, n)
    r = bisect_right(cum, rem) - 1
    jmax = q * bs + r if r >= 0 else q * bs - 1
    return max(0, min(limit, jmax + 1))


class Scheduler:
    """The request queues and KV block pool of one engine; plans the next phase or iteration and commits it.

    `finish(req, reason)` is called for every request that ends here (completed, aborted); `log`
    records scheduler events. `held` keeps requests that arrived while the server was paused.
    """

    def __init__(self, name: str, settings: EngineSettings, num_blocks: int, cost: IterationModel,
                 stats: EngineStats, finish: Callable[[Request, str], None], log: Callable[..., None]) -> None:
        self.name = name
        self.block_size = settings.block_size
        self.max_num_seqs = settings.max_num_seqs
        self.max_num_batched_tokens = settings.max_num_batched_tokens
        self.num_blocks = num_blocks
        self.cost = cost
        self.stats = stats
        self._on_finish = finish
        self._log = log
        self.tick = 0
        self.waiting: deque[Request] = deque()
        self.held: deque[Request] = deque()  # arrived while paused; enter the queue on resume
        self.order: dict[Request, None] = {}  # running, in admission order (last = preemption victim)
        self.prefill: dict[Request, None] = {}  # running requests still computing their prompt
        self.decode: dict[Request, None] = {}
        self._heap: list[tuple[int, int, Request]] = []  # (target − goff, seq, req): finishes at that tick
        self._hist = [0] * self.block_size  # decode requests by coff mod block_size
        self._sum_coff = 0
        self.used_blocks = 0
        self.first_step = False  # the next explicit iteration starts a busy period
        self._phase_cum: list[int] = []  # _slack_cum() of the phase plan_phase returned
        self._pending: tuple[int, list[tuple[Request, int]]] = (0, [])
        self._pending_dt = 0.0
        self._pending_blocks = 0

    def submit(self, req: Request, held: bool) -> bool:
        """Queue a new request (held until resume while paused); True when it is at the head of the
        queue with a seat free, the only case that can change the plan of a running phase."""
        if held:
            self.held.append(req)
            return False
        head = not self.waiting and len(self.order) < self.max_num_seqs
        self.waiting.append(req)
        return head

    def release_held(self) -> None:
        """The server resumed: requests held while paused join the queue in arrival order."""
        while self.held:
            self.waiting.append(self.held.popleft())

    # --- queries ------------------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.order or self.waiting)

    def requests(self) -> list[Request]:
        """Every request the engine holds: running (admission order), waiting, held."""
        return list(self.order) + list(self.waiting) + list(self.held)

    def blocks(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    # --- bookkeeping --------------------------------------------------------------------------
    def finish(self, req: Request, reason: str) -> None:
        req.mode = DONE
        self._on_finish(req, reason)

    def _to_decode(self, req: Request) -> None:
        req.mode = DECODE
        req.goff = req.gen - self.tick
        req.coff = req.computed - self.tick
        self.decode[req] = None
        self._hist[req.coff % self.block_size] += 1
        self._sum_coff += req.coff
        heapq.heappush(self._heap, (req.target - req.goff, req.seq, req))

    def _from_decode(self, req: Request) -> None:
        """Take a request out of lockstep (absolute counters again); the heap entry is dropped lazily."""
        del self.decode[req]
        self._hist[req.coff % self.block_size] -= 1
        self._sum_coff -= req.coff
        req.gen = req.goff + self.tick
        req.computed = req.coff + self.tick
        req.mode = WAITING

    def remove_running(self, req: Request) -> None:
        """Out of the running set with its blocks freed; counters absolute."""
        if req.mode == DECODE:
            self._from_decode(req)
        elif req.mode == PREFILL:
            del self.prefill[req]
        del self.order[req]
        self.used_blocks -= self.blocks(req.computed)
        req.mode = WAITING

    def _preempt(self, req: Request) -> None:
        """Recompute preemption: free the blocks, back to the front of the queue (vLLM v1)."""
        self.remove_running(req)
        req.computed = 0
        req.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(req)
        self._log("preempt", req.rid, req.gen)

    def abort_all(self, include_held: bool = False) -> None:
        for req in list(self.order):
            self.remove_running(req)
            self.finish(req, "abort")
        while self.waiting:
            self.finish(self.waiting.popleft(), "abort")
        if include_held:
            while self.held:
                self.finish(self.held.popleft(), "abort")
        self._heap.clear()

    def preempt_all(self) -> None:
        """KV contents are gone (sleep, cache reset with running requests): everyone recomputes."""
        for req in reversed(list(self.order)):
            self._preempt(req)
        self._heap.clear()

    def cancel(self, req: Request) -> None:
        """The client went away: the request ends with "abort" wherever it is."""
        if req.mode in (DECODE, PREFILL):
            self.remove_running(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        elif req in self.held:
            self.held.remove(req)
        if req.mode != DONE:
            self.finish(req, "abort")

    def _complete_due(self) -> None:
        """Finish every decoding request whose last token was produced at the current tick."""
        heap, tick = self._heap, self.tick
        while heap and heap[0][0] <= tick:
            key, _, req = heapq.heappop(heap)
            if req.mode != DECODE or key != req.target - req.goff:
                continue  # stale entry: preempted or aborted since it was pushed
            self.remove_running(req)
            self.finish(req, req.reason)

    def _heap_min(self) -> int | None:
        heap = self._heap
        while heap:
            key, _, req = heap[0]
            if req.mode == DECODE and req.target - req.goff == key:
                return key
            heapq.heappop(heap)
        return None

    def _admissible(self, budget_left: int, free_blocks: int) -> bool:
        if not self.waiting or len(self.order) >= self.max_num_seqs or budget_left <= 0:
            return False
        head = self.waiting[0]
        chunk = min(head.prompt + head.gen - head.computed, budget_left)
        return self.blocks(chunk) <= free_blocks

    def _slack_cum(self) -> list[int]:
        """cum[r] = decoding requests whose next new block is needed within r iterations (0-based)."""
        # A request with coff ≡ m needs its next block in (−(m + tick)) mod bs iterations, so the
        # counts by r are the histogram read backwards from s = (−tick) mod bs.
        hist, s = self._hist, -self.tick % self.block_size
        return list(accumulate(hist[s::-1] + hist[:s:-1]))

    # --- lockstep decode phases ---------------------------------------------------------------
    def plan_phase(self) -> _Phase | None:
        """K lockstep decode iterations up to the next event, or None when an explicit iteration is due."""
        n = len(self.decode)
        if n == 0 or self.prefill:
            return None
        kmin = self._heap_min()
        if kmin is None:
            raise SimulationError(f"engine {self.name}: decoding requests without a finish tick")
        k_done = kmin - self.tick
        if k_done < 1:
            raise SimulationError(f"engine {self.name}: a request overran its target length")
        free = self.num_blocks - self.used_blocks
        cum = self._slack_cum()
        # First-iteration block need is cum[0]; a waiting request admissible now takes an explicit iteration.
        if self._admissible(self.max_num_batched_tokens - n, free - cum[0]):
            return None
        k = _feasible_iterations(n, cum, free, self.block_size, k_done)
        if k == 0:
            return None  # the next iteration must preempt
        self._phase_cum = cum  # nothing changes the decoding set before advance_decode
        return self.cost.decode_phase(k, n, self._sum_coff + n * (self.tick + 1))

    def advance_decode(self, k: int, dt: float) -> None:
        """Commit the first k iterations of the phase just planned, which took dt seconds."""
        n = len(self.decode)
        bs = self.block_size
        new_blocks = n * ((k - 1) // bs) + self._phase_cum[(k - 1) % bs]
        self.used_blocks += new_blocks
        stats = self.stats
        stats.kv_blocks_peak = max(stats.kv_blocks_peak, self.used_blocks)
        self.tick += k
        stats.iterations += k
        stats.tokens_generated += n * k
        stats.busy_s += dt
        stats.batch_iterations[n] = stats.batch_iterations.get(n, 0) + k
        self._complete_due()

    # --- explicit iterations (prefill chunks, admissions, preemption) ---------------------------
    def plan_iteration(self) -> float | None:
        """Plan one explicit iteration (preempting as needed); returns its time, or None if nothing runs."""
        preempted = False
        while True:
            budget = self.max_num_batched_tokens
            n_dec = len(self.decode)
            need = self._slack_cum()[0] if n_dec else 0
            budget -= n_dec
            chunks: list[tuple[Request, int]] = []
            for req in self.prefill:
                if budget <= 0:
                    break
                todo = req.prompt + req.gen - req.computed
                take = min(todo, budget)
                need += self.blocks(req.computed + take) - self.blocks(req.computed)
                chunks.append((req, take))
                budget -= take
            free = self.num_blocks - self.used_blocks
            if need <= free or not self.order:
                break
            self._preempt(next(reversed(self.order)))
            preempted = True
        free -= need
        if not preempted:
            while self._admissible(budget, free):
                req = self.waiting.popleft()
                take = min(req.prompt + req.gen - req.computed, budget)
                nb = self.blocks(take)
                req.mode = PREFILL
                self.order[req] = None
                self.prefill[req] = None
                chunks.append((req, take))
                budget -= take
                free -= nb
                self._log("admit", req.rid, req.gen)
        if not n_dec and not chunks:
            return None
        tokens = n_dec + sum(t for _, t in chunks)
        dec_ctx = self._sum_coff + n_dec * (self.tick + 1)
        kv_read = dec_ctx + sum(r.computed + t for r, t in chunks)
        attn = dec_ctx + sum(t * r.computed + t * (t + 1) / 2 for r, t in chunks)
        self._pending = (n_dec, chunks)
        seqs = n_dec + len(chunks)
        if self.first_step:  # nothing earlier hides its CPU part
            dt = self.cost.first_time(tokens, kv_read, attn, seqs)
            self.first_step = False
        else:
            dt = self.cost.time(tokens, kv_read, attn, seqs)
        self._pending_dt = dt
        self._pending_blocks = self.num_blocks - free - self.used_blocks
        return dt

    def commit_iteration(self) -> None:
        """The planned iteration ran: its chunks are computed, finished prompts start decoding."""
        n_dec, chunks = self._pending
        self._pending = (0, [])  # hold no request past its iteration (its response would stay alive)
        stats = self.stats
        self.used_blocks += self._pending_blocks
        stats.kv_blocks_peak = max(stats.kv_blocks_peak, self.used_blocks)
        self.tick += 1
        stats.iterations += 1
        stats.busy_s += self._pending_dt
        batch = n_dec + len(chunks)
        stats.batch_iterations[batch] = stats.batch_iterations.get(batch, 0) + 1
        generated = n_dec
        for req, take in chunks:
            req.computed += take
            stats.prefill_tokens += take
            if req.computed == req.prompt + req.gen:
                # The chunk ended the prompt: the first (next) token is sampled in this iteration.
                req.gen += 1
                generated += 1
                del self.prefill[req]
                self._to_decode(req)
        stats.tokens_generated += generated
        self._complete_due()
