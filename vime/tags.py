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


#: What `--train-offload-plan` may name, in the order a plan is written: the trainer's tags that leave the GPU
#: while the engines generate. Params and optimizer state are copied to pinned host memory; grads and the
#: activations' cache hold nothing a step needs afterwards, so they are dropped and remapped empty.
TRAINER_OFFLOAD_TAGS = ("params", "grads", "optimizer", "activations")
OFFLOAD_PLAN_KEYWORDS = ("auto", "all")


def parse_offload_plan(text: str) -> str:
    """A --train-offload-plan value in canonical form: "auto", "all", or tags in TRAINER_OFFLOAD_TAGS order."""
    from vime.errors import ConfigError

    word = str(text).strip().lower()
    if word in OFFLOAD_PLAN_KEYWORDS:
        return word
    tags = [t.strip() for t in word.split(",") if t.strip()]
    bad = [t for t in tags if t not in TRAINER_OFFLOAD_TAGS]
    if not tags or bad:
        raise ConfigError(f"--train-offload-plan {text!r}: use auto, all, or a comma list of "
                          f"{', '.join(TRAINER_OFFLOAD_TAGS)} (the tags offloaded each step)")
    if len(set(tags)) != len(tags):
        raise ConfigError(f"--train-offload-plan {text!r} names a tag twice; name each once")
    canonical = [t for t in TRAINER_OFFLOAD_TAGS if t in tags]
    return "all" if len(canonical) == len(TRAINER_OFFLOAD_TAGS) else ",".join(canonical)


def offload_plan_sets(plan: str) -> tuple[list[str], list[str]]:
    """(tags copied to host, tags dropped) when the trainer sleeps under a resolved plan ("all" or tags)."""
    if plan == "auto":
        raise ValueError("--train-offload-plan auto must be resolved to tags before the trainer sleeps")
    tags = TRAINER_OFFLOAD_TAGS if plan == "all" else tuple(plan.split(","))
    return [t for t in ("params", "optimizer") if t in tags], [t for t in ("grads", "activations") if t in tags]
