"""The protocols the orchestration is written against (RolloutEngine, Router, Trainer, Allocator, StepObserver) and the values they exchange.

The step loop (vime/orchestrator.py) and the rollout (vime/rollout/) only ever see these
protocols. `vime.sim` implements them with simpy models, `vime.real` with vLLM HTTP servers,
Megatron actors on Ray and CUDA virtual memory. Both sides share the lifecycle tables (vime/lifecycle.py), so
an illegal call (generate while asleep, update_weights without start, wake of an unknown tag)
raises the same `LifecycleError` in sim and in real, before any I/O.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

# Re-exported: the protocols' states and the tags their calls name live in their own modules.
from vime.lifecycle import (
    AllocatorLifecycle as AllocatorLifecycle,
)
from vime.lifecycle import (
    EngineLifecycle as EngineLifecycle,
)
from vime.lifecycle import (
    EngineMemory as EngineMemory,
)
from vime.lifecycle import (
    PauseMode as PauseMode,
)
from vime.lifecycle import (
    TagState as TagState,
)
from vime.lifecycle import (
    TrainerLifecycle as TrainerLifecycle,
)
from vime.lifecycle import (
    TrainerState as TrainerState,
)
from vime.tags import (
    ENGINE_TAGS as ENGINE_TAGS,
)
from vime.tags import (
    STARTUP_SLEEP_LEVEL as STARTUP_SLEEP_LEVEL,
)
from vime.tags import (
    TAG_CUDA_GRAPH as TAG_CUDA_GRAPH,
)
from vime.tags import (
    TAG_KV_CACHE as TAG_KV_CACHE,
)
from vime.tags import (
    TAG_RUNTIME as TAG_RUNTIME,
)
from vime.tags import (
    TAG_WEIGHTS as TAG_WEIGHTS,
)
from vime.tags import (
    TRAINER_TAGS as TRAINER_TAGS,
)
from vime.tags import (
    VLLM_WAKE_TAGS as VLLM_WAKE_TAGS,
)
from vime.tags import (
    normalize_wake_tags as normalize_wake_tags,
)
from vime.tags import (
    sleep_offload_tags as sleep_offload_tags,
)

if TYPE_CHECKING:
    from vime.types import TrainBatch

# --------------------------------------------------------------------------------------------
# Values that cross the protocols
# --------------------------------------------------------------------------------------------

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
