"""The protocol calls of a run, recorded the same way on both backends: what the orchestrator asked of each engine, the router and the trainer, rollout by rollout (issue 26, the twin check).

A `CallLog` is a `vime.protocols.StepObserver` (it learns the phases and the orchestrator's own
bookkeeping calls) and a factory of recording wrappers (`CallLog.wrap`): the engines, the router
and the trainer handed to the orchestrator are wrapped, so every protocol call lands in the log
when it is *made* — before its first await, hence in the same order on a real event loop and on
the simulator's — with its arguments reduced to what the orchestration decides:

- engines: ``sleep(level, mode)``, ``wake_up(tags)`` as asked (before vLLM's normalisation),
  ``pause(mode)``, ``flush_cache()``, ``resume()``, ``start_weight_update()``,
  ``update_weights()`` (one entry per bucket), ``finish_weight_update(version)``, ``health()``,
  ``restart()``;
- the trainer: ``wake_up()``, ``train(rollout_id, samples, microbatches, recompute_log_probs)``,
  ``sleep()``, ``export_weights(bucket_bytes)``, checkpoints by rollout id;
- generation: every generate of one phase folds into ONE entry placed where the first was made,
  with the number of responses per engine (``{"engine0": 32}``) — the order of concurrent
  requests and of their answers is the scheduler's, not the orchestrator's. A real router does
  not say which engine answered; behind a single engine the answer is that engine's, else "?".

Calls are kept per *segment*: ``"startup"`` (seed steps 4–13) and one per rollout id (the
rollout's step, seed steps 14–55). `sequence` merges consecutive identical calls into one entry
with a count; `first_divergence` walks two logs in order and names the first call that differs.
Timestamps (``t0``/``t1``, the loop's clock) are kept for reading, never compared.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Engine and router calls that are recorded (others — is_sleeping, weight_version, aclose — pass through).
ENGINE_CALLS = frozenset({"generate", "sleep", "wake_up", "pause", "resume", "flush_cache", "start_weight_update",
                          "update_weights", "finish_weight_update", "health", "restart", "abort_all"})
TRAINER_CALLS = frozenset({"train", "sleep", "wake_up", "compute_log_prob", "save_checkpoint", "load_checkpoint"})
STARTUP = "startup"


@dataclass
class CallEntry:
    """One recorded call (or, for generate, every generate of a phase): what was asked, when, and what came of it."""

    component: str
    call: str
    args: dict[str, Any] = field(default_factory=dict)
    count: int = 1
    t0: float = 0.0
    t1: float = 0.0
    raised: str | None = None  # the exception type's name when the call failed

    def key(self) -> tuple[str, str, str, int, str | None]:
        """What two logs must agree on (times excluded)."""
        return self.component, self.call, _canonical(self.args), self.count, self.raised

    def describe(self) -> str:
        """``engine0.sleep(level=2, mode=keep) ×1``."""
        inner = ", ".join(f"{k}={_short(v)}" for k, v in self.args.items())
        tail = f" raised {self.raised}" if self.raised else ""
        return f"{self.component}.{self.call}({inner}) ×{self.count}{tail}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"component": self.component, "call": self.call, "args": self.args, "count": self.count,
                               "t0": self.t0, "t1": self.t1}
        if self.raised:
            out["raised"] = self.raised
        return out

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> CallEntry:
        return cls(str(d["component"]), str(d["call"]), dict(d.get("args") or {}), int(d.get("count", 1)),
                   float(d.get("t0", 0.0)), float(d.get("t1", 0.0)), d.get("raised"))


def _canonical(value: Any) -> str:
    import json

    return json.dumps(value, sort_keys=True, default=str)


def _short(value: Any) -> str:
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_short(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_short(v) for v in value) + "]"
    return str(value)


def _now() -> float:
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return 0.0


class CallLog:
    """Every protocol call the orchestrator makes, by segment (start-up, then one per rollout id); see the module docstring."""

    def __init__(self) -> None:
        self.segments: dict[str, list[CallEntry]] = {}
        self.segment = STARTUP
        self.phase = ""
        self._phases: list[str] = []
        self._generates: dict[tuple[str, str, str], CallEntry] = {}  # (segment, phase, component) → folded entry

    # --- StepObserver ---------------------------------------------------------------------------
    def on_phase(self, name: str, begin: bool, t: float, rollout_id: int | None) -> None:
        if begin:
            if name == STARTUP:
                self.segment = STARTUP
            elif rollout_id is not None:
                self.segment = str(rollout_id)
            self._phases.append(name)
        elif name in self._phases:
            del self._phases[len(self._phases) - 1 - self._phases[::-1].index(name)]
        self.phase = self._phases[-1] if self._phases else ""

    def on_call(self, component: str, call: str, t0: float, t1: float) -> None:
        """The orchestrator's own bookkeeping calls (rollout_manager) arrive here; backends' calls come
        through the wrappers, so a simulated engine reporting to the recorder is not counted twice."""
        self._add(CallEntry(component, call, {}, 1, t0, t1))

    # --- recording ------------------------------------------------------------------------------
    def _add(self, entry: CallEntry) -> CallEntry:
        self.segments.setdefault(self.segment, []).append(entry)
        return entry

    def begin(self, component: str, call: str, args: Mapping[str, Any] | None = None) -> CallEntry:
        """Record that `component.call(args)` is being made now; the caller sets ``t1`` / ``raised`` when it ends."""
        t = _now()
        return self._add(CallEntry(component, call, dict(args or {}), 1, t, t))

    def begin_generate(self, component: str) -> CallEntry:
        """The phase's one generate entry for `component` (created at the first generate, where it stays)."""
        key = (self.segment, self.phase, component)
        entry = self._generates.get(key)
        if entry is None:
            t = _now()
            entry = self._generates[key] = self._add(CallEntry(component, "generate", {}, 1, t, t))
        return entry

    def wrap(self, engines: Sequence[Any], router: Any, trainer: Any) -> dict[str, Any]:
        """Recording wrappers around the backends the orchestrator is given (the ``wrap`` of `vime.runs.sim.simulate`
        and `vime.runs.real.run_real`): ``{"engines": [...], "router": ..., "trainer": ...}``."""
        wrapped = [RecordingEngine(e, self) for e in engines]
        return {"engines": wrapped, "router": RecordingRouter(router, self, [e.name for e in engines]),
                "trainer": RecordingTrainer(trainer, self)}

    # --- reading --------------------------------------------------------------------------------
    def sequence(self, segment: str | int) -> list[CallEntry]:
        """The calls of one segment, consecutive identical ones merged (count added, first t0, last t1)."""
        return compress(self.segments.get(str(segment), []))

    def pop(self, segment: str | int) -> list[dict[str, Any]]:
        """One segment's merged calls as dicts (what `vime train --record-calls --json` prints with a step); the
        segment is dropped from the log, so a long run keeps only the rollout in progress."""
        out = [e.to_dict() for e in self.sequence(segment)]
        self.segments.pop(str(segment), None)
        self._generates = {k: v for k, v in self._generates.items() if k[0] != str(segment)}
        return out

    def to_dict(self) -> dict[str, list[dict[str, Any]]]:
        return {seg: [e.to_dict() for e in compress(entries)] for seg, entries in self.segments.items()}


def compress(entries: Sequence[CallEntry]) -> list[CallEntry]:
    """Merge runs of identical calls (same component, call, arguments, outcome) into one entry with their count."""
    out: list[CallEntry] = []
    for e in entries:
        if out and out[-1].component == e.component and out[-1].call == e.call and out[-1].raised == e.raised \
                and _canonical(out[-1].args) == _canonical(e.args) and e.call != "generate":
            last = out[-1]
            out[-1] = CallEntry(last.component, last.call, last.args, last.count + e.count, last.t0, max(last.t1, e.t1))
        else:
            out.append(CallEntry(e.component, e.call, dict(e.args), e.count, e.t0, e.t1, e.raised))
    return out


# --------------------------------------------------------------------------------------------
# Recording wrappers (forward everything; record the protocol calls)
# --------------------------------------------------------------------------------------------


class _Recording:
    def __init__(self, target: Any, log: CallLog) -> None:
        self._target = target
        self._log = log

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self._target, name)

    async def _timed(self, entry: CallEntry, coro: Any) -> Any:
        try:
            return await coro
        except BaseException as exc:
            entry.raised = type(exc).__name__
            raise
        finally:
            entry.t1 = _now()


class RecordingEngine(_Recording):
    """A `vime.protocols.RolloutEngine` that records the calls made on it (and forwards everything)."""

    @property
    def name(self) -> str:
        return str(self._target.name)

    @property
    def lifecycle(self) -> Any:
        return self._target.lifecycle

    def _rec(self, call: str, coro: Any, **args: Any) -> Any:
        return self._timed(self._log.begin(self.name, call, args), coro)

    async def generate(self, request: Any) -> Any:
        entry = self._log.begin_generate(self.name)
        result = await self._target.generate(request)
        entry.args[self.name] = entry.args.get(self.name, 0) + 1
        entry.t1 = _now()
        return result

    def sleep(self, level: int, mode: str = "keep") -> Any:
        return self._rec("sleep", self._target.sleep(level, mode), level=int(level), mode=str(mode))

    def wake_up(self, tags: Sequence[str] | None = None) -> Any:
        return self._rec("wake_up", self._target.wake_up(tags), tags=None if tags is None else list(tags))

    def pause(self, mode: str = "abort") -> Any:
        return self._rec("pause", self._target.pause(mode), mode=str(mode))

    def resume(self) -> Any:
        return self._rec("resume", self._target.resume())

    def flush_cache(self) -> Any:
        return self._rec("flush_cache", self._target.flush_cache())

    def start_weight_update(self) -> Any:
        return self._rec("start_weight_update", self._target.start_weight_update())

    def update_weights(self, bucket: Any) -> Any:
        return self._rec("update_weights", self._target.update_weights(bucket))

    def finish_weight_update(self, version: int) -> Any:
        return self._rec("finish_weight_update", self._target.finish_weight_update(version), version=int(version))

    def health(self) -> Any:
        return self._rec("health", self._target.health())

    def restart(self) -> Any:
        return self._rec("restart", self._target.restart())

    def abort_all(self) -> Any:
        return self._rec("abort_all", self._target.abort_all())


class RecordingRouter(_Recording):
    """A `vime.protocols.Router` that records its generates (folded per phase, counted per answering engine)."""

    def __init__(self, target: Any, log: CallLog, engine_names: Sequence[str]) -> None:
        super().__init__(target, log)
        self._engines = list(engine_names)

    async def generate(self, request: Any) -> Any:
        entry = self._log.begin_generate("router")
        try:
            result = await self._target.generate(request)
        except BaseException as exc:
            failed = f"raised {type(exc).__name__}"
            entry.args[failed] = entry.args.get(failed, 0) + 1
            raise
        finally:
            entry.t1 = _now()
        engine = getattr(result, "engine", None) or (self._engines[0] if len(self._engines) == 1 else "?")
        entry.args[engine] = entry.args.get(engine, 0) + 1
        # keep the per-engine counts in a stable order (the answers' order is the scheduler's)
        entry.args = dict(sorted(entry.args.items()))
        return result

    def abort_all(self) -> Any:
        return self._timed(self._log.begin("router", "abort_all"), self._target.abort_all())


class RecordingTrainer(_Recording):
    """A `vime.protocols.Trainer` that records the calls made on it (and forwards everything)."""

    @property
    def lifecycle(self) -> Any:
        return self._target.lifecycle

    def _rec(self, call: str, coro: Any, **args: Any) -> Any:
        return self._timed(self._log.begin("trainer", call, args), coro)

    def train(self, rollout_id: int, batch: Any) -> Any:
        return self._rec("train", self._target.train(rollout_id, batch), rollout_id=int(rollout_id),
                         samples=len(batch.tokens), microbatches=list(batch.num_microbatches),
                         recompute_log_probs=getattr(batch, "recompute_log_probs", None))

    def sleep(self) -> Any:
        return self._rec("sleep", self._target.sleep())

    def wake_up(self) -> Any:
        return self._rec("wake_up", self._target.wake_up())

    def compute_log_prob(self, *args: Any) -> Any:
        return self._rec("compute_log_prob", self._target.compute_log_prob(*args))

    def save_checkpoint(self, rollout_id: int, path: str) -> Any:
        return self._rec("save_checkpoint", self._target.save_checkpoint(rollout_id, path), rollout_id=int(rollout_id))

    def load_checkpoint(self, path: str) -> Any:
        return self._rec("load_checkpoint", self._target.load_checkpoint(path))

    async def export_weights(self, bucket_bytes: int) -> AsyncIterator[Any]:
        entry = self._log.begin("trainer", "export_weights", {"bucket_bytes": int(bucket_bytes)})
        export = self._target.export_weights(bucket_bytes)
        try:
            async for bucket in export:
                yield bucket
        except BaseException as exc:
            entry.raised = type(exc).__name__
            raise
        finally:
            entry.t1 = _now()
            aclose = getattr(export, "aclose", None)
            if aclose is not None:
                await aclose()


# --------------------------------------------------------------------------------------------
# Comparing two logs
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Divergence:
    """Where two call logs first differ: the segment, the position in its merged sequence, and both sides' calls there."""

    segment: str
    index: int
    left: CallEntry | None
    right: CallEntry | None
    names: tuple[str, str] = ("real", "simulated")

    def __str__(self) -> str:
        where = "start-up" if self.segment == STARTUP else f"rollout {self.segment}"
        a, b = self.names
        left = self.left.describe() if self.left else "nothing (its calls end here)"
        right = self.right.describe() if self.right else "nothing (its calls end here)"
        return f"{where}, call {self.index + 1}: {a} {left}; {b} {right}"


def _segment_order(keys: Sequence[str]) -> list[str]:
    return sorted(keys, key=lambda k: (-1, "") if k == STARTUP else (int(k), "") if k.isdigit() else (10**9, k))


def as_entries(log: CallLog | Mapping[str, Sequence[Any]]) -> dict[str, list[CallEntry]]:
    """A log as merged entries per segment, from a `CallLog` or from its JSON form (`CallLog.to_dict`)."""
    if isinstance(log, CallLog):
        return {k: log.sequence(k) for k in log.segments}
    return {str(k): compress([e if isinstance(e, CallEntry) else CallEntry.from_dict(e) for e in v])
            for k, v in log.items()}


def first_divergence(left: CallLog | Mapping[str, Sequence[Any]], right: CallLog | Mapping[str, Sequence[Any]], *,
                     names: tuple[str, str] = ("real", "simulated")) -> Divergence | None:
    """The first call where two logs differ, segment by segment in run order (start-up, rollout 0, 1, …); None if equal."""
    a, b = as_entries(left), as_entries(right)
    for seg in _segment_order(list(dict.fromkeys([*a, *b]))):
        xs, ys = a.get(seg, []), b.get(seg, [])
        for i in range(max(len(xs), len(ys))):
            x = xs[i] if i < len(xs) else None
            y = ys[i] if i < len(ys) else None
            if x is None or y is None or x.key() != y.key():
                return Divergence(seg, i, x, y, names)
    return None


def format_sequences(left: CallLog | Mapping[str, Sequence[Any]], right: CallLog | Mapping[str, Sequence[Any]], *,
                     names: tuple[str, str] = ("real", "simulated"), segments: Sequence[str] | None = None) -> str:
    """Both sides' calls side by side, one line per merged call, with each side's duration (``=`` where they agree)."""
    a, b = as_entries(left), as_entries(right)
    lines: list[str] = []
    for seg in segments or _segment_order(list(dict.fromkeys([*a, *b]))):
        xs, ys = a.get(seg, []), b.get(seg, [])
        lines.append(("start-up" if seg == STARTUP else f"rollout {seg}") + f"  ({names[0]} | {names[1]}, seconds)")
        for i in range(max(len(xs), len(ys))):
            x = xs[i] if i < len(xs) else None
            y = ys[i] if i < len(ys) else None
            same = x is not None and y is not None and x.key() == y.key()
            dx = f"{x.t1 - x.t0:8.4f}" if x else " " * 8
            dy = f"{y.t1 - y.t0:8.4f}" if y else " " * 8
            if same:
                assert x is not None
                lines.append(f"  = {x.describe():<64} {dx} | {dy}")
            else:
                lines.append(f"  ≠ {names[0]}: {x.describe() if x else '-':<58} {dx}")
                lines.append(f"    {names[1]}: {y.describe() if y else '-':<58}          | {dy}")
    return "\n".join(lines)


__all__ = ["CallLog", "CallEntry", "Divergence", "RecordingEngine", "RecordingRouter", "RecordingTrainer",
           "compress", "first_divergence", "format_sequences", "as_entries", "STARTUP"]
