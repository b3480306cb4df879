"""Memory tags: the names vLLM's CuMem allocator, vime's allocators and the trainer's offload share (seed steps 10–13)."""

from __future__ import annotations

from collections.abc import Sequence

from vime.errors import UnknownTagError

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
