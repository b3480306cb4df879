"""`--fault SPEC`: the faults a run can be given (parsed and checked at parse time), what happened, what was lost, how to resume.

A spec is ``KIND[:key=value,...]``:

- ``engine-crash:engine=I,step=S,phase=P,at=SECONDS`` — engine I's server dies SECONDS into phase P
  (default rollout) of rollout S; or ``engine-crash:engine=I,time=SECONDS`` — SECONDS after the run began.
- ``slow-engine:engine=I,factor=F[,step=S]`` — engine I runs F times slower (from rollout S on; default from the start).
- ``wake-fail:engine=I,step=S[,phase=onload_weights|onload_kv]`` — engine I dies on that wake-up call.
- ``update-fail:engine=I,step=S[,bucket=K]`` — engine I dies receiving weight bucket K of the publication after rollout S.
- ``trainer-crash:step=S`` — the trainer dies in rollout S's train call (the run cannot go on: resume from the last save).
- ``router-down:step=S,at=SECONDS,for=SECONDS`` — the router is unreachable for a while during rollout S.

Recovery is the run's own (`vime.recovery`): a dead engine is restarted and brought back to the
weights it should hold, in-flight requests are retried on other engines, requests wait for the
router; `FaultLog` keeps what happened and `fault_report` says it, with the sample accounting.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vime.errors import ConfigError, VimeError

KINDS: dict[str, tuple[str, ...]] = {  # kind -> the keys it takes
    "engine-crash": ("engine", "step", "phase", "at", "time"),
    "slow-engine": ("engine", "factor", "step"),
    "wake-fail": ("engine", "step", "phase"),
    "update-fail": ("engine", "step", "bucket"),
    "trainer-crash": ("step",),
    "router-down": ("step", "at", "for"),
}
#: phases an engine crash may be placed in (the orchestrator's, `vime.orchestrator.PHASES`)
CRASH_PHASES = ("rollout", "offload", "train", "onload_weights", "weight_sync", "onload_kv")
WAKE_PHASES = ("onload_weights", "onload_kv")
#: what `vime train --backend real` can inject: it kills an engine's server, the router or a trainer rank (vime.real.faults)
REAL_KINDS = ("engine-crash", "router-down", "trainer-crash")
_GRAMMAR = ("KIND[:key=value,...] with KIND one of " + ", ".join(KINDS)
            + " (e.g. engine-crash:engine=1,step=0,at=2)")


@dataclass(frozen=True)
class FaultSpec:
    """One parsed ``--fault`` spec; `text` is its canonical form (what the resolved config shows)."""

    kind: str
    engine: int = 0
    step: int | None = None
    phase: str | None = None
    at: float = 0.0
    time: float | None = None
    factor: float = 1.0
    bucket: int = 0
    duration: float = 5.0

    @property
    def text(self) -> str:
        keys = KINDS[self.kind]
        parts = []
        for key in keys:
            value = self.duration if key == "for" else getattr(self, key)
            if value is None or (key == "at" and self.time is not None):
                continue
            parts.append(f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}")
        return self.kind + (":" + ",".join(parts) if parts else "")


def _number(spec: str, key: str, value: str, *, integer: bool) -> float:
    try:
        x = int(value) if integer else float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{spec!r}: {key}={value!r} is not {'an integer' if integer else 'a number'}") \
            from None
    if not math.isfinite(x) or x < 0:
        raise argparse.ArgumentTypeError(f"{spec!r}: {key}={value} must be a finite number ≥ 0")
    return x


def parse_fault(text: str) -> FaultSpec:
    """Parse one spec; argparse.ArgumentTypeError (one line, naming the spec and the fix) when it is malformed."""
    spec = str(text).strip()
    kind, _, rest = spec.partition(":")
    if kind not in KINDS:
        raise argparse.ArgumentTypeError(f"{spec!r} is not a fault; use {_GRAMMAR}")
    values: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq or key not in KINDS[kind]:
            raise argparse.ArgumentTypeError(f"{spec!r}: {kind} takes {', '.join(k + '=' for k in KINDS[kind])} "
                                             f"(got {item!r})")
        if key in values:
            raise argparse.ArgumentTypeError(f"{spec!r}: {key} is given twice")
        value = value.strip()
        if key == "phase":
            allowed = WAKE_PHASES if kind == "wake-fail" else CRASH_PHASES
            if value not in allowed:
                raise argparse.ArgumentTypeError(f"{spec!r}: phase={value} is not one of {', '.join(allowed)}")
            values[key] = value
        else:
            values[key] = _number(spec, key, value, integer=key in ("engine", "step", "bucket"))
    if "time" in values and ("step" in values or "phase" in values or "at" in values):
        raise argparse.ArgumentTypeError(f"{spec!r}: time= (seconds since the run began) excludes step=, phase= and at=")
    if kind in ("wake-fail", "update-fail", "trainer-crash", "router-down") and "step" not in values:
        raise argparse.ArgumentTypeError(f"{spec!r}: {kind} needs step=S (the rollout it happens in)")
    if kind == "engine-crash" and "step" not in values and "time" not in values:
        raise argparse.ArgumentTypeError(f"{spec!r}: engine-crash needs step=S (with phase= and at=) or time=SECONDS")
    if kind == "slow-engine":
        if "factor" not in values:
            raise argparse.ArgumentTypeError(f"{spec!r}: slow-engine needs factor=F (how many times slower, > 1)")
        if not 1.0 < values["factor"] <= 1000.0:
            raise argparse.ArgumentTypeError(f"{spec!r}: factor={values['factor']:g} must lie in (1, 1000]")
    if kind == "router-down" and values.get("for", 1.0) <= 0:
        raise argparse.ArgumentTypeError(f"{spec!r}: for= (how long the router is down) must be > 0 seconds")
    if kind == "engine-crash" and "step" in values:
        values.setdefault("phase", "rollout")
    if kind == "wake-fail":
        values.setdefault("phase", "onload_weights")
    if "for" in values:
        values["duration"] = values.pop("for")
    for key in ("at", "time", "factor", "duration"):
        if key in values:
            values[key] = float(values[key])
    return FaultSpec(kind, **values)


def fault_flag_type(text: str) -> str:
    """The argparse type of ``--fault``: the spec checked, kept in its canonical text form."""
    return parse_fault(text).text


def check_faults(texts: Sequence[str], *, engines: int, num_rollout: int, start_rollout_id: int, backend: str,
                 offload_rollout: bool) -> list[FaultSpec]:
    """The rules that need the rest of the configuration (engine count, rollouts, backend); ConfigError otherwise."""
    specs = [parse_fault(t) for t in texts]
    for s in specs:
        where = f"--fault {s.text}"
        if s.kind in ("engine-crash", "slow-engine", "wake-fail", "update-fail") and s.engine >= engines:
            raise ConfigError(f"{where}: engine={s.engine} does not exist (this run has {engines} engine(s), "
                              f"numbered 0 to {engines - 1})")
        if s.step is not None and not start_rollout_id <= s.step < num_rollout:
            raise ConfigError(f"{where}: step={s.step} is not a rollout of this run (rollouts {start_rollout_id} to "
                              f"{num_rollout - 1}); pick one of those or raise --num-rollout")
        if s.kind == "wake-fail" and not offload_rollout:
            raise ConfigError(f"{where}: the engines never sleep or wake with --no-offload-rollout, so no wake can "
                              f"fail; use update-fail or engine-crash")
        if s.phase in ("offload", "onload_weights", "onload_kv") and not offload_rollout:
            raise ConfigError(f"{where}: phase {s.phase} does not happen with --no-offload-rollout")
        if backend == "real":
            if s.kind not in REAL_KINDS:
                raise ConfigError(f"{where}: vime train --backend real cannot inject {s.kind} (it kills processes: "
                                  f"{', '.join(REAL_KINDS)}); use --backend sim (or vime simulate) for {s.kind}")
            if s.phase not in (None, "rollout") or s.time is not None:
                raise ConfigError(f"{where}: --backend real kills a server during a rollout only (phase=rollout with "
                                  f"step= and at=); use --backend sim for a crash in {s.phase or 'any phase'}")
    return specs


class FaultStop(VimeError):
    """A fault the run cannot survive (a crashed trainer): the message says what happened and how to resume."""


@dataclass
class FaultLog:
    """What the injected faults did and what recovered from them, in the run's clock."""

    specs: list[FaultSpec]
    events: list[dict[str, Any]] = field(default_factory=list)
    restarted: list[str] = field(default_factory=list)
    stopped: str | None = None
    recorder: Any = None  # a vime.report.recorder.Recorder: each event also an instant on its "faults" track

    def add(self, t: float, step: int | None, phase: str | None, what: str, target: str, detail: str) -> None:
        self.events.append({"t": round(float(t), 6), "step": step, "phase": phase, "event": what, "target": target,
                            "detail": detail})
        if self.recorder is not None:
            self.recorder.instant("faults", what, target=target, detail=detail)


def resume_hint(save: str | None) -> str:
    """How to resume after a fault the run cannot survive: --load of the last save, or why there is none."""
    if not save:
        return ("nothing was saved (no --save): rerun the same command from the start; add --save DIR "
                "--save-interval N to make a run resumable")
    from pathlib import Path

    latest = Path(save) / "latest_checkpointed_iteration.txt"
    if not latest.is_file():
        return (f"no checkpoint was written to {save} before the fault: rerun the same command from the start "
                f"(a smaller --save-interval saves sooner)")
    it = int(latest.read_text().strip())
    return (f"resume from the last save (rollout {it}, the next rollout is {it + 1}): rerun the same command with "
            f"--load {save} (and without this --fault)")


def fault_report(log: FaultLog, steps: Sequence[Any], *, group_size: int, save: str | None,
                 moved: int = 0, down_at_end: Sequence[str] = ()) -> dict[str, Any]:
    """The run's fault section: specs, events, sample accounting over its rollouts (in = out + lost), outcome, resume.

    `moved` counts requests the router itself moved to another engine (the rollout's own retries are its request_errors).
    """
    submitted = kept = dropped = returned = failed = errors = 0
    for s in steps:
        r = s.rollout
        submitted += int(r.get("submitted_groups", 0)) * group_size
        kept += int(r.get("kept_samples", 0))
        dropped += int(r.get("dropped_samples", 0))
        returned += int(r.get("returned_groups", 0)) * group_size
        failed += int(r.get("failed_samples", 0))
        errors += int(r.get("request_errors", 0))
    lost = submitted - kept - dropped - returned
    said = " ".join(e["detail"] for e in log.events)
    return {
        "injected": [s.text for s in log.specs],
        "not_reached": [s.text for s in log.specs if f"--fault {s.text})" not in said],
        "down_at_end": list(down_at_end),
        "events": list(log.events),
        "restarted_engines": list(log.restarted),
        "samples": {"taken_from_data": submitted, "trained": kept, "dropped_by_filter": dropped,
                    "returned_to_data": returned, "failed": failed, "lost": lost, "requests_retried": errors + moved},
        "outcome": "stopped" if log.stopped else "survived",
        "stopped_by": log.stopped,
        "resume": resume_hint(save) if log.stopped else None,
    }


def format_fault_report(rep: dict[str, Any]) -> str:
    """The fault section of the text report."""
    lines = ["Faults (" + "; ".join(rep["injected"]) + ")"]
    for e in rep["events"]:
        step = "start-up" if e["step"] is None else f"rollout {e['step']}"
        lines.append(f"  t = {e['t']:9.3f} s  {step:<11} {e['phase'] or '-':<15} {e['event']:<12} {e['target']}: "
                     f"{e['detail']}")
    for text in rep["not_reached"]:
        lines.append(f"  not reached: {text} (the run ended before it)")
    for name in rep["down_at_end"]:
        lines.append(f"  {name} was down when the run ended (no later call needed it; a next run starts it afresh)")
    s = rep["samples"]
    lines.append(f"  samples: {s['taken_from_data']} taken from the data = {s['trained']} trained + "
                 f"{s['dropped_by_filter']} dropped by the filter + {s['returned_to_data']} returned to the data; "
                 f"lost {s['lost']}, failed {s['failed']}, requests retried {s['requests_retried']}")
    if rep["outcome"] == "survived":
        restarted = ", ".join(rep["restarted_engines"]) or "none"
        lines.append(f"  outcome: the run survived (engines restarted: {restarted}); nothing to resume")
    else:
        lines.append(f"  outcome: stopped — {rep['stopped_by']}")
        lines.append(f"  resume: {rep['resume']}")
    return "\n".join(lines)


def faults_of(sim: Any) -> dict[str, Any] | None:
    """The fault section of a simulation run with ``--fault`` (None without)."""
    if sim.faults is None:
        return None
    args = sim.args
    return fault_report(sim.faults.log, sim.steps, group_size=int(args.n_samples_per_prompt), save=args.save,
                        moved=len(getattr(sim.backends.router, "retries", ())),
                        down_at_end=[e.name for e in sim.faults.raw if e._failed is not None])


def stop_message(rep: dict[str, Any]) -> str:
    """The one line a run stopped by a fault ends with: what happened and how to resume."""
    return f"{rep['stopped_by']}; nothing else was lost. {rep['resume']}"
