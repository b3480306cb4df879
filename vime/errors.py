"""The exceptions vime raises: one family for misuse, one for a misbehaving peer, one for resources."""

from __future__ import annotations

from typing import Any


class VimeError(Exception):
    """Base of every error vime raises on purpose.

    Subclasses with structured constructors keep their constructor arguments in ``args`` and the
    message in ``_msg``, so ``type(e)(*e.args)`` rebuilds them (simpy re-raises failed events that
    way) and pickling works (Ray sends exceptions between processes).
    """

    _msg: str | None = None

    def _set(self, msg: str, *ctor_args: object) -> None:
        Exception.__init__(self, *ctor_args)
        self._msg = msg

    def __str__(self) -> str:
        return self._msg if self._msg is not None else super().__str__()


class ConfigError(VimeError, ValueError):
    """An invalid or inconsistent configuration; the message names the flags, their values and a fix."""


class Interrupted(VimeError):
    """Ctrl-C stopped a run of many configurations; `results` holds those that finished (of `total`)."""

    def __init__(self, total: int, results: list[Any]) -> None:
        self.total = total
        self.results = results
        self._set(f"interrupted after {len(results)} of {total} configurations", total, results)


class OutputError(VimeError):
    """A result file could not be written (disk full, permissions changed during the run); nothing half-written is left."""


class LifecycleError(VimeError):
    """A call that is illegal in the component's current state (you misused it), raised before any I/O.

    The simulated and the real implementation of a protocol raise this same type for the same misuse.
    """

    def __init__(self, component: str, call: str, state: str, hint: str = "") -> None:
        self.component = component
        self.call = call
        self.state = state
        msg = f"{component}: {call}() is not allowed while {state}"
        if hint:
            msg += f"; {hint}"
        self._set(msg, component, call, state, hint)


class UnknownTagError(LifecycleError):
    """A memory tag that the allocator or engine does not know."""

    def __init__(self, component: str, call: str, tag: str, known: object) -> None:
        super().__init__(component, call, f"tag {tag!r} is unknown", f"known tags: {sorted(known)}")  # type: ignore[call-overload]
        self._set(str(self), component, call, tag, known)
        self.tag = tag


class EngineError(VimeError):
    """A rollout engine (real server or simulated) failed or answered something unusable (the peer misbehaved).

    Says which engine, which call and what came back.
    """

    def __init__(self, engine: str, call: str, detail: str, status: int | None = None,
                 retryable: bool = False) -> None:
        self.engine = engine
        self.call = call
        self.detail = detail
        self.status = status
        self.retryable = retryable
        where = f"engine {engine}: {call}"
        if status is not None:
            where += f" -> HTTP {status}"
        self._set(f"{where}: {detail}", engine, call, detail, status, retryable)


class ResponseFormatError(EngineError):
    """A response that parses but breaks an invariant (e.g. token ids and log-probs of unequal length)."""


class TrainerError(VimeError):
    """The trainer (Megatron actors or the simulated trainer) failed."""


class NodeLostError(VimeError):
    """A node of a multi-node run left the cluster: what ran there is gone and the run cannot go on."""


class OutOfMemoryError(VimeError):
    """An allocation that does not fit on a (real or simulated) GPU: where, when and by how much."""

    def __init__(self, gpu: int, owner: str, tag: str, requested: int, free: int, phase: str = "",
                 time: float | None = None) -> None:
        self.gpu = gpu
        self.owner = owner
        self.tag = tag
        self.requested = requested
        self.free = free
        self.phase = phase
        self.time = time
        short = requested - free
        gib = 1024**3
        when = f" during {phase}" if phase else ""
        at = f" at t={time:.3f}s" if time is not None else ""
        self._set(f"OOM on GPU {gpu}{when}{at}: {owner}/{tag} asked for {requested / gib:.2f} GiB, "
                  f"{free / gib:.2f} GiB free (short by {short / gib:.2f} GiB)",
                  gpu, owner, tag, requested, free, phase, time)


class SimulationError(VimeError):
    """The simulation cannot proceed (deadlock, threads inside a simulation, real I/O)."""
