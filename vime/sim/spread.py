"""How firm each simulated phase is: a profile's measured calibration spread per quantity, and the bands it gives the phases."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from vime.errors import ConfigError

#: The quantities a profile's ``spread`` section may record, each what its calibration rows measured.
QUANTITIES: dict[str, str] = {
    "engine_generate": "vLLM serving requests end to end (lone requests, batched generation, prefill)",
    "engine_sleep": "vLLM sleep calls (level 1 and 2)",
    "engine_wake": "vLLM wake calls (weights, KV cache)",
    "weight_update": "a whole weight update of the engines (bucketed, start to finish)",
    "train_compute": "Megatron forward, backward and optimizer step",
    "trainer_sleep_wake": "the trainer's pause and resume of its GPU state",
    "collective": "NCCL all-reduce / all-gather",
    **{f"whole_step_{p}": f"the {p.replace('_', ' ')} phase of whole colocated RL steps (vime train --backend real)"
       for p in ("rollout", "offload", "train", "onload_weights", "weight_sync", "onload_kv")},
    "whole_step_rollout_memory": "the GPU's level while whole colocated RL steps roll out (nvidia-smi), the engines "
                                 "mapped: against the simulated rollout phase's peak",
    "whole_step_train_memory": "the GPU's level while whole colocated RL steps train (nvidia-smi): against the "
                               "simulated train phase's peak",
}

#: Which measured quantities each phase's time rests on (the phase's band is the widest of them): the
#: component calls it is made of, and the phase itself in whole steps measured on the machine.
PHASE_QUANTITIES: dict[str, tuple[str, ...]] = {
    "rollout": ("engine_generate", "whole_step_rollout"),
    "offload": ("engine_sleep", "whole_step_offload"),
    "train": ("train_compute", "trainer_sleep_wake", "collective", "whole_step_train"),
    "onload_weights": ("engine_wake", "whole_step_onload_weights"),
    "weight_sync": ("weight_update", "collective", "whole_step_weight_sync"),
    "onload_kv": ("engine_wake", "whole_step_onload_kv"),
    "gap": (),
}

#: The measured quantity each phase's memory rests on: the train phase's own, every other phase the rollout's
#: (the engines' mapped memory decides them).
TRAIN_MEMORY, ENGINE_MEMORY = "whole_step_train_memory", "whole_step_rollout_memory"

#: Implausible measured/predicted ratios: a spread this wide is a broken fit, not a band.
_RATIO_RANGE = (0.01, 100.0)


@dataclass(frozen=True)
class QuantitySpread:
    """measured / predicted over a quantity's calibration rows: lowest and highest (repeated runs included)."""

    low: float
    high: float
    rows: int
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "rows": self.rows, "source": self.source}


Spread = tuple[tuple[str, QuantitySpread], ...]


def parse_spread(value: Any, origin: str) -> Spread:
    """The profile's ``spread`` section ({quantity: {low, high, rows, source}}); absent → ()."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise ConfigError(f"hardware profile {origin}: spread must be an object {{quantity: {{low, high, rows, "
                          f"source}}}}, got {type(value).__name__}")
    out: list[tuple[str, QuantitySpread]] = []
    for key, item in sorted(value.items()):
        where = f"hardware profile {origin}: spread.{key}"
        if key not in QUANTITIES:
            raise ConfigError(f"{where} is not a known quantity; known: {sorted(QUANTITIES)}")
        if not isinstance(item, dict) or set(item) != {"low", "high", "rows", "source"}:
            raise ConfigError(f"{where} must be {{\"low\", \"high\", \"rows\", \"source\"}}")
        low, high, rows, source = item["low"], item["high"], item["rows"], item["source"]
        nums_ok = all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) for x in (low, high))
        if not nums_ok or not _RATIO_RANGE[0] <= low <= 1.0 <= high <= _RATIO_RANGE[1]:
            raise ConfigError(f"{where}: low ≤ 1 ≤ high must be finite measured/predicted ratios in "
                              f"{_RATIO_RANGE}, got low={low!r} high={high!r}")
        if not isinstance(rows, int) or isinstance(rows, bool) or rows < 1:
            raise ConfigError(f"{where}: rows must be a positive integer, got {rows!r}")
        if not isinstance(source, str) or not source.strip():
            raise ConfigError(f"{where}: source must say which measurements the spread comes from")
        out.append((key, QuantitySpread(float(low), float(high), rows, source)))
    return tuple(out)


def spread_to_dict(spread: Spread) -> dict[str, Any]:
    return {k: q.to_dict() for k, q in spread}


def _r(x: float) -> float:
    return round(float(x), 4)


def memory_band(hardware_name: str, spread: Spread, gpus: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Each GPU's peak as its phases' peaks times the lowest and highest measured/predicted level of the
    profile's whole runs (the train phase by the train level's, the others by the rollout level's), and whether
    a configuration the model says fits could run out at the high end (``at_risk``: its headroom is inside what
    the memory model has missed by). Without both measured quantities: no band (null, with why)."""
    known = dict(spread)
    rests_on = [ENGINE_MEMORY, TRAIN_MEMORY]
    if not all(q in known for q in rests_on):
        missing = [q for q in rests_on if q not in known]
        return {"rests_on": rests_on, "low_factor": None, "high_factor": None, "gpus": [],
                "why": f"{hardware_name} has no measured spread for {', '.join(missing)}"}
    def q(phase: str) -> QuantitySpread:
        return known[TRAIN_MEMORY if phase == "train" else ENGINE_MEMORY]

    rows = []
    for g in gpus:
        peaks = g.get("phase_peaks_gib") or {"rollout": g["peak_gib"]}
        lo = max(v * q(ph).low for ph, v in peaks.items())
        high_phase = max(sorted(peaks), key=lambda ph: peaks[ph] * q(ph).high)
        hi = peaks[high_phase] * q(high_phase).high
        rows.append({"gpu": g["gpu"], "peak_low_gib": _r(lo), "peak_high_gib": _r(hi), "high_phase": high_phase,
                     "high_factor": _r(q(high_phase).high), "at_risk": bool(g["peak_gib"] <= g["capacity_gib"] < hi)})
    return {"rests_on": rests_on, "low_factor": _r(min(known[q].low for q in rests_on)),
            "high_factor": _r(max(known[q].high for q in rests_on)), "gpus": rows}


def uncertainty(hardware_name: str, spread: Spread, phases: Mapping[str, float], t_step: float,
                gpus: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any]:
    """The document's ``uncertainty`` section: each phase's band from the quantities it rests on.

    A phase's band is its predicted seconds times the lowest and highest measured/predicted ratio of
    those of its quantities the profile measured (``unmeasured`` names the others); a phase none of whose
    quantities were measured has no band (null, with why).
    T_step's band adds the phases' bands (their errors taken to share a sign: the widest reading),
    phases without a band counted at their prediction and named in ``t_step.unbanded``."""
    known = dict(spread)
    out_phases: dict[str, Any] = {}
    low_sum = high_sum = 0.0
    unbanded: list[str] = []
    for name, seconds in phases.items():
        rests_on = list(PHASE_QUANTITIES.get(name, ()))
        have = [known[q] for q in rests_on if q in known]
        missing = [q for q in rests_on if q not in known]
        if have:
            lo, hi = min(q.low for q in have), max(q.high for q in have)
            out_phases[name] = {"low_s": _r(seconds * lo), "high_s": _r(seconds * hi), "low_factor": _r(lo),
                                "high_factor": _r(hi), "rests_on": rests_on, "unmeasured": missing}
            low_sum += seconds * lo
            high_sum += seconds * hi
            continue
        why = (f"no calibration rows measure it on {hardware_name}" if not rests_on else
               f"{hardware_name} has no measured spread for {', '.join(missing)}")
        out_phases[name] = {"low_s": None, "high_s": None, "low_factor": None, "high_factor": None,
                            "rests_on": rests_on, "unmeasured": missing, "why": why}
        low_sum += seconds
        high_sum += seconds
        if seconds > 0:
            unbanded.append(name)
    banded = any(p["low_s"] is not None for p in out_phases.values())
    t_band = ({"low_s": _r(low_sum), "high_s": _r(high_sum), "unbanded": unbanded} if banded and t_step > 0 else None)
    note = (f"bands are the lowest and highest measured/predicted ratio over {hardware_name}'s calibration rows "
            "(repeated runs included) and its whole measured steps, for the quantities each phase rests on; they "
            "say how far the model missed the machine it was fitted on, not a bound elsewhere" if spread else
            f"{hardware_name} records no measured spread (a datasheet preset or an uncalibrated profile): every "
            "phase is an estimate of unknown error; held-out published whole steps were off by tens of percent "
            "on these presets (bench/data/published/RESULTS.md); bench/spread.py records one for a calibrated profile")
    return {"basis": hardware_name if spread else None, "note": note, "phases": out_phases, "t_step": t_band,
            "memory": memory_band(hardware_name, spread, gpus), "quantities": spread_to_dict(spread)}


__all__ = ["QUANTITIES", "PHASE_QUANTITIES", "ENGINE_MEMORY", "TRAIN_MEMORY", "memory_band", "QuantitySpread", "Spread",
           "parse_spread", "spread_to_dict", "uncertainty"]
