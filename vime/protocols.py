"""The three protocols the orchestration is written against (RolloutEngine, Trainer, Allocator) and their lifecycle tables.

The step loop (vime/orchestrator.py) and the rollout (vime/rollout/) only ever see these
protocols. `vime.sim` implements them with simpy models, `vime.real` with vLLM HTTP servers,
Megatron actors on Ray and CUDA virtual memory. Both sides share the lifecycle tables below, so
an illegal call (generate while asleep, update_weights without start, wake of an unknown tag)
raises the same `LifecycleError` in sim and in real, before any I/O.
"""

from __future__ import annotations

import enum
from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

from vime.errors import LifecycleError, UnknownTagError

if TYPE_CHECKING:
    from vime.types import TrainBatch

# --------------------------------------------------------------------------------------------
# Memory tags
# --------------------------------------------------------------------------------------------

#: Tags vLLM's CuMem allocator knows and accepts on /wake_up (seed steps 10–13).
TAG_WEIGHTS = "weights"
TAG_KV_CACHE = "kv_cache"
#: vime-side names that vLLM does not know; waking them is implied by any wake (non-deferrable).
TAG_CUDA_GRAPH = "cuda_graph"
TAG_RUNTIME = "runtime"

VLLM_WAKE_TAGS: frozenset[str] = frozenset({TAG_WEIGHTS, TAG_KV_CACHE})
ENGINE_TAGS: frozenset[str] = frozenset({TAG_WEIGHTS, TAG_KV_CACHE, TAG_CUDA_GRAPH, TAG_RUNTIME})

#: Trainer-side tags (Megatron state); the simulator and the real CuMem allocator use the same names.
TRAINER_TAGS: frozenset[str] = frozenset({"params", "grads", "optimizer", "activations"})
#: Sleep level of colocated engines while the trainer initialises (seed step 3; step 34 uses the
#: same level): their weights are discarded, since the first publication (step 8) pushes them anyway.
STARTUP_SLEEP_LEVEL = 2


def normalize_wake_tags(tags: Sequence[str] | None) -> list[str] | None:
    """Keep only the tags vLLM knows, in a stable order (seed steps 10–13).

    vime asks for ``[kv_cache, cuda_graph]``; vLLM only knows ``weights`` and ``kv_cache`` and
    wakes every non-deferrable allocation (runtime, CUDA graphs) with any wake anyway, so the
    request that reaches the server is ``tags=kv_cache``. ``None`` means "wake everything".
    An unknown tag is a caller bug and raises.
    """
    if tags is None:
        return None
    unknown = [t for t in tags if t not in ENGINE_TAGS]
    if unknown:
        raise UnknownTagError("engine", "wake_up", unknown[0], ENGINE_TAGS)
    return [t for t in (TAG_WEIGHTS, TAG_KV_CACHE) if t in tags]


def sleep_offload_tags(level: int) -> tuple[str, ...]:
    """Tags that vLLM copies to pinned host memory on sleep(level); all others are discarded (seed step 36)."""
    if level == 1:
        return (TAG_WEIGHTS, TAG_RUNTIME, TAG_CUDA_GRAPH)
    if level == 2:
        return (TAG_RUNTIME, TAG_CUDA_GRAPH)
    raise ValueError(f"sleep level must be 1 or 2, got {level}")


# --------------------------------------------------------------------------------------------
# Values that cross the protocols
# --------------------------------------------------------------------------------------------

PauseMode = Literal["abort", "wait", "keep"]
FinishReason = Literal["stop", "length", "abort", "error"]


@dataclass
class GenerateRequest:
    """One token-in request (seed step 20). `sampling_params` already uses vLLM's names (seed step 19)."""

    token_ids: list[int]
    sampling_params: dict[str, Any]
    session_id: str | None = None
    request_id: str | None = None


@dataclass
class GenerateResult:
    """A parsed generate response (seed steps 24–25): tokens and their log-probs are of equal length."""

    token_ids: list[int]
    log_probs: list[float]
    finish_reason: FinishReason
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int = 0
    weight_version: str | None = None
    engine: str | None = None  # which engine served it (set by routers and simulators)

    def meta_info(self) -> dict[str, Any]:
        """The seed's meta_info dict (step 25)."""
        return {
            "finish_reason": {"type": self.finish_reason},
            "weight_version": self.weight_version,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
        }


@dataclass
class WeightBucket:
    """One bucket of packed weights pushed to engines by one update_weights call (seed steps 48–50).

    `nbytes` is always set (the simulator needs nothing else). Real transports fill one of:
    `ipc_handles` (CUDA IPC, colocated GPUs) or `tensors` (in-process, CPU tests that verify
    what an engine received). `dtype_names` and `shapes` follow vLLM's update_info.
    """

    names: list[str]
    dtype_names: list[str]
    shapes: list[list[int]]
    nbytes: int
    ipc_handles: Any = None
    tensors: dict[str, Any] | None = None
    index: int = 0

    def update_info(self) -> dict[str, Any]:
        """The JSON-able part of vLLM's update_info (without the handles)."""
        return {"names": self.names, "dtype_names": self.dtype_names, "shapes": self.shapes}


@dataclass
class TrainMetrics:
    """What one trainer.train() call reports (seed steps 37–41)."""

    rollout_id: int
    loss: float = 0.0
    pg_clipfrac: float = 0.0
    grad_norm: float = 0.0
    entropy: float = 0.0
    tokens: int = 0
    num_steps: int = 0
    recomputed_log_probs: bool = False
    extra: dict[str, float] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------
# Engine lifecycle table (shared by sim and real; h11-style: every legal transition in one place)
# --------------------------------------------------------------------------------------------


class EngineMemory(enum.Enum):
    """Which of an engine's deferrable allocations are mapped."""

    AWAKE = "awake"  # weights and KV mapped: may generate
    ASLEEP = "asleep"  # both released (level 2) or weights offloaded + KV released (level 1)
    WEIGHTS_ONLY = "weights_only"  # woken with tags=[weights]: may receive weights, may not generate
    KV_ONLY = "kv_only"  # woken with tags=[kv_cache] first (legal in vLLM, unusual)


# (state, set of woken tags) -> next state. Waking a tag that is already awake is tolerated by
# vLLM (it only logs a warning), so the table maps it to the same state.
_WAKE: dict[tuple[EngineMemory, frozenset[str]], EngineMemory] = {}
for _state in EngineMemory:
    for _tags in (frozenset(), frozenset({TAG_WEIGHTS}), frozenset({TAG_KV_CACHE}),
                  frozenset({TAG_WEIGHTS, TAG_KV_CACHE})):
        awake = {
            EngineMemory.AWAKE: {TAG_WEIGHTS, TAG_KV_CACHE},
            EngineMemory.ASLEEP: set(),
            EngineMemory.WEIGHTS_ONLY: {TAG_WEIGHTS},
            EngineMemory.KV_ONLY: {TAG_KV_CACHE},
        }[_state] | set(_tags or {TAG_WEIGHTS, TAG_KV_CACHE})
        _WAKE[(_state, _tags)] = {
            frozenset({TAG_WEIGHTS, TAG_KV_CACHE}): EngineMemory.AWAKE,
            frozenset({TAG_WEIGHTS}): EngineMemory.WEIGHTS_ONLY,
            frozenset({TAG_KV_CACHE}): EngineMemory.KV_ONLY,
        }[frozenset(awake)]


@dataclass
class EngineLifecycle:
    """The state of one rollout engine as its client sees it; every check happens before any I/O.

    Memory (awake / asleep / partially woken) and three orthogonal flags: paused (with its mode),
    a weight update in progress, and the weight version last finished. Both `vime.sim` and
    `vime.real` engines hold one of these and call `check_*` before acting, `on_*` after success.
    """

    name: str
    memory: EngineMemory = EngineMemory.AWAKE
    sleep_level: int = 0
    paused: PauseMode | None = None
    updating: bool = False
    weight_version: int | None = None

    def _fail(self, call: str, hint: str = "") -> LifecycleError:
        state = self.memory.value
        if self.memory is EngineMemory.ASLEEP:
            state = f"asleep (level {self.sleep_level})"
        if self.paused:
            state += f", paused ({self.paused})"
        if self.updating:
            state += ", weight update in progress"
        return LifecycleError(f"engine {self.name}", call, state, hint)

    # --- generation ---------------------------------------------------------------------------
    def check_generate(self) -> None:
        """Generation needs weights and KV mapped. A paused engine accepts and holds the request."""
        if self.memory is not EngineMemory.AWAKE:
            raise self._fail("generate", "wake it with tags weights and kv_cache first")

    # --- sleep / wake -------------------------------------------------------------------------
    def check_sleep(self, level: int) -> None:
        if level not in (1, 2):
            raise self._fail("sleep", f"level must be 1 or 2, got {level}")
        if self.memory is EngineMemory.ASLEEP:
            raise self._fail("sleep", "it is already asleep")
        if self.updating:
            raise self._fail("sleep", "finish the weight update first")

    def on_sleep(self, level: int) -> None:
        self.memory = EngineMemory.ASLEEP
        self.sleep_level = level

    def check_wake(self, tags: Sequence[str] | None) -> list[str] | None:
        """Validate and normalise wake tags; returns what goes on the wire."""
        return normalize_wake_tags(tags)

    def on_wake(self, normalized: Sequence[str] | None) -> None:
        key = frozenset(normalized or ())
        self.memory = _WAKE[(self.memory, key)]
        if self.memory is EngineMemory.AWAKE:
            self.sleep_level = 0

    # --- pause / resume / flush ---------------------------------------------------------------
    def check_pause(self, mode: str) -> None:
        if mode not in ("abort", "wait", "keep"):
            raise self._fail("pause", f"mode must be abort, wait or keep, got {mode!r}")

    def on_pause(self, mode: PauseMode) -> None:
        self.paused = mode

    def on_resume(self) -> None:
        self.paused = None

    def check_flush(self) -> None:
        """Flushing the prefix cache with running requests would free blocks they hold: pause first."""
        if self.paused is None and self.memory is EngineMemory.AWAKE:
            raise self._fail("flush_cache", "pause generation before flushing the cache (seed step 46)")

    # --- weight update ------------------------------------------------------------------------
    def check_start_update(self) -> None:
        if self.updating:
            raise self._fail("start_weight_update", "a weight update is already in progress")
        if self.memory in (EngineMemory.ASLEEP, EngineMemory.KV_ONLY):
            raise self._fail("start_weight_update", "wake it with tags=[weights] first (seed step 43)")

    def on_start_update(self) -> None:
        self.updating = True

    def check_update(self) -> None:
        if not self.updating:
            raise self._fail("update_weights", "call start_weight_update first (seed step 47)")

    def check_finish_update(self, version: int) -> None:
        if not self.updating:
            raise self._fail("finish_weight_update", "call start_weight_update first")
        if self.weight_version is not None and version <= self.weight_version:
            raise self._fail("finish_weight_update",
                             f"version must increase (current {self.weight_version}, got {version})")

    def on_finish_update(self, version: int) -> None:
        self.updating = False
        self.weight_version = version


# --------------------------------------------------------------------------------------------
# Trainer lifecycle table
# --------------------------------------------------------------------------------------------


class TrainerState(enum.Enum):
    AWAKE = "awake"
    ASLEEP = "asleep"


_TRAINER_TABLE: dict[tuple[TrainerState, str], TrainerState] = {
    (TrainerState.AWAKE, "train"): TrainerState.AWAKE,
    (TrainerState.AWAKE, "compute_log_prob"): TrainerState.AWAKE,
    (TrainerState.AWAKE, "sleep"): TrainerState.ASLEEP,
    (TrainerState.ASLEEP, "wake_up"): TrainerState.AWAKE,
    # Export reads the CPU weight backup (seed step 41), so it works asleep or awake.
    (TrainerState.AWAKE, "export_weights"): TrainerState.AWAKE,
    (TrainerState.ASLEEP, "export_weights"): TrainerState.ASLEEP,
    (TrainerState.AWAKE, "save_checkpoint"): TrainerState.AWAKE,
    (TrainerState.ASLEEP, "save_checkpoint"): TrainerState.ASLEEP,
}


@dataclass
class TrainerLifecycle:
    """Awake ↔ asleep for the Megatron actor group; train needs it awake."""

    name: str = "trainer"
    state: TrainerState = TrainerState.AWAKE

    def check(self, call: str) -> TrainerState:
        nxt = _TRAINER_TABLE.get((self.state, call))
        if nxt is None:
            hint = {"train": "call wake_up() first", "compute_log_prob": "call wake_up() first",
                    "sleep": "it is already asleep", "wake_up": "it is already awake"}.get(call, "")
            raise LifecycleError(self.name, call, self.state.value, hint)
        return nxt

    def apply(self, call: str) -> None:
        self.state = self.check(call)


# --------------------------------------------------------------------------------------------
# Allocator lifecycle table (per tag)
# --------------------------------------------------------------------------------------------


class TagState(enum.Enum):
    AWAKE = "awake"
    OFFLOADED = "offloaded"  # contents copied to pinned host memory, device memory released
    DISCARDED = "discarded"  # device memory released, contents lost


@dataclass
class AllocatorLifecycle:
    """Per-tag state of a CuMem-style allocator. Sleeping an asleep tag or waking an awake one is an error."""

    name: str
    known_tags: frozenset[str]
    states: dict[str, TagState] = field(default_factory=dict)

    def state(self, tag: str) -> TagState:
        if tag not in self.known_tags:
            raise UnknownTagError(self.name, "state", tag, self.known_tags)
        return self.states.get(tag, TagState.AWAKE)

    def check_sleep(self, tags: Collection[str]) -> None:
        for tag in tags:
            if tag not in self.known_tags:
                raise UnknownTagError(self.name, "sleep", tag, self.known_tags)
            if self.state(tag) is not TagState.AWAKE:
                raise LifecycleError(self.name, "sleep", f"tag {tag!r} is {self.state(tag).value}",
                                     "wake it before sleeping it again")

    def on_sleep(self, offload: Collection[str], discard: Collection[str]) -> None:
        for tag in offload:
            self.states[tag] = TagState.OFFLOADED
        for tag in discard:
            self.states[tag] = TagState.DISCARDED

    def check_wake(self, tags: Collection[str]) -> None:
        for tag in tags:
            if tag not in self.known_tags:
                raise UnknownTagError(self.name, "wake_up", tag, self.known_tags)
            if self.state(tag) is TagState.AWAKE:
                raise LifecycleError(self.name, "wake_up", f"tag {tag!r} is awake",
                                     "only a sleeping tag can be woken (resume without pause)")

    def on_wake(self, tags: Collection[str]) -> None:
        for tag in tags:
            self.states[tag] = TagState.AWAKE

    def asleep_tags(self) -> list[str]:
        return sorted(t for t, s in self.states.items() if s is not TagState.AWAKE)


# --------------------------------------------------------------------------------------------
# The protocols
# --------------------------------------------------------------------------------------------


@runtime_checkable
class RolloutEngine(Protocol):
    """One inference server (its TP ranks). Real: HTTP client of a `vllm serve`; sim: the engine model.

    Every method checks the shared `EngineLifecycle` before doing anything and raises
    `LifecycleError` on misuse; failures of the server itself raise `EngineError`.
    """

    name: str
    lifecycle: EngineLifecycle

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Generate for one prompt. Requires memory AWAKE. While paused the call waits for resume.
        An abort (pause(abort)) ends it with finish_reason "abort" and the partial tokens."""
        ...

    async def sleep(self, level: int, mode: PauseMode = "keep") -> None:
        """Release GPU memory (seed steps 34–36). Level 1 offloads weights to host and discards KV;
        level 2 discards both. `mode` is what happens to requests still in the scheduler."""
        ...

    async def wake_up(self, tags: Sequence[str] | None = None) -> None:
        """Remap memory for `tags` (None = all); vime tags are normalised to vLLM's (seed 10–13)."""
        ...

    async def is_sleeping(self) -> bool: ...

    async def pause(self, mode: PauseMode = "abort") -> None:
        """Stop scheduling: abort ends in-flight requests, keep freezes them, wait drains them."""
        ...

    async def resume(self) -> None: ...

    async def is_paused(self) -> bool: ...

    async def flush_cache(self) -> None:
        """Reset the prefix cache and running requests (seed step 46); requires paused."""
        ...

    async def start_weight_update(self) -> None:
        """Open a weight-update session (seed step 47); requires weights mapped."""
        ...

    async def update_weights(self, bucket: WeightBucket) -> None:
        """Load one bucket (seed steps 48–50); requires an open session."""
        ...

    async def finish_weight_update(self, version: int) -> None:
        """Close the session and stamp `version` on every later response (seed step 51)."""
        ...

    async def weight_version(self) -> str | None: ...

    async def health(self) -> bool: ...

    async def restart(self) -> None:
        """Bring a dead engine back: a fresh server, awake, holding its initial weights, with no weight
        version until the next publication (the orchestrator then treats it like the others). Raises
        EngineError when this engine cannot be restarted (then the caller decides whether the run goes on)."""
        ...


@runtime_checkable
class Router(Protocol):
    """Where rollout sends generate requests (seed steps 20–21): vllm-router in real, a policy in sim.

    Control calls (pause, sleep, weights) never go through a router: they go to each engine.
    """

    async def generate(self, request: GenerateRequest) -> GenerateResult: ...

    async def abort_all(self) -> None:
        """Abort every in-flight request on every engine (seed step 28)."""
        ...


@runtime_checkable
class Trainer(Protocol):
    """The Megatron actor group (TP × PP × DP ranks) seen as one object. Real: Ray actors; sim: cost model."""

    lifecycle: TrainerLifecycle

    async def train(self, rollout_id: int, batch: TrainBatch) -> TrainMetrics:
        """One rollout's training (seed steps 37–41): per DP rank its partition, old log-probs
        recomputed only when the reuse decision says so, GRPO loss, optimizer step(s), weight
        backup for export. Requires awake."""
        ...

    async def sleep(self) -> None:
        """Offload params/optimizer to host, drop grads (seed step 41). Requires awake."""
        ...

    async def wake_up(self) -> None:
        """Bring trainer state back to the GPU (seed step 37). Requires asleep."""
        ...

    def export_weights(self, bucket_bytes: int) -> AsyncIterator[WeightBucket]:
        """HF-named weights (TP shards gathered), packed into buckets of at most `bucket_bytes`
        (seed step 48). Works asleep (reads the backup)."""
        ...

    async def save_checkpoint(self, rollout_id: int, path: str) -> None: ...

    async def load_checkpoint(self, path: str) -> int:
        """Load and return the rollout id to resume from."""
        ...


@runtime_checkable
class Allocator(Protocol):
    """Tagged device memory with sleep/wake (CuMem semantics) for one owner.

    Real: vLLM's CuMemAllocator behind the server's endpoints, vime's CuMem allocator for the
    trainer; sim: a per-GPU model shared by the engine and the trainer on that GPU.
    """

    lifecycle: AllocatorLifecycle

    async def sleep(self, offload_tags: Collection[str], discard_tags: Collection[str] = ()) -> None:
        """Copy `offload_tags` to pinned host memory, release the device memory of both sets."""
        ...

    async def wake_up(self, tags: Collection[str] | None = None) -> None:
        """Remap `tags` (None = every sleeping tag) at the same addresses and copy back what was offloaded."""
        ...

    def device_bytes(self, tag: str | None = None) -> int:
        """Bytes mapped on the device now, for one tag or all."""
        ...

    def host_bytes(self) -> int:
        """Pinned host bytes held now (offloaded contents and persistent staging buffers)."""
        ...


@runtime_checkable
class StepObserver(Protocol):
    """Receives what the orchestrator does, in the loop's clock (virtual in sim, monotonic in real).

    The simulator's recorder implements it to attribute an OOM to its phase and to draw traces;
    a real run can log it. Observers never change behaviour.
    """

    def on_phase(self, name: str, begin: bool, t: float, rollout_id: int | None) -> None:
        """A phase (rollout, offload, train, onload_weights, weight_sync, onload_kv, eval, save) begins or ends."""
        ...

    def on_call(self, component: str, call: str, t0: float, t1: float) -> None:
        """One protocol call finished (e.g. component="engine2", call="sleep")."""
        ...
