"""The lifecycle tables of engines, trainers and allocators (h11-style: every legal transition in one place).

Sim and real share them, so an illegal call raises the same `LifecycleError` on both backends
before any I/O. `vime.protocols` re-exports them beside the protocols whose states they define.
"""

from __future__ import annotations

import enum
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import Literal

from vime.errors import LifecycleError, UnknownTagError
from vime.tags import TAG_KV_CACHE, TAG_WEIGHTS, normalize_wake_tags

#: How an engine pauses: abort running requests, wait for them, or keep them for a resume.
PauseMode = Literal["abort", "wait", "keep"]

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
