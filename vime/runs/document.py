"""The ``vime.simulate/1.3`` JSON document of one simulated configuration (`vime simulate --json`).

Keys of the top-level object:

- ``schema``: ``"vime.simulate/1.3"`` (1.1 adds ``uncertainty`` to 1, 1.2 ``phase_peaks_gib`` to each GPU of
  ``memory``, 1.3 ``uncertainty.memory`` and ``verdict.at_risk``; readers of an earlier version read a later one
  unchanged);
  ``vime_version``.
- ``config``: the resolved configuration (`vime simulate --dry-run --json`).
- ``hardware`` / ``model``: what was simulated (name, memory, peak FLOP/s; parameters, layers).
- ``startup``: start-up phases (seed steps 1–13) in seconds.
- ``steps``: per simulated step: ``rollout_id``, ``phases`` {rollout, offload, train,
  onload_weights, weight_sync, onload_kv} in seconds, ``t_gap``, ``t_step``, ``metrics``
  (perf/…, rollout/…, train/… as `vime train` logs them), and with ``--record-calls`` the step's
  ``calls`` (`vime.report.calls`; start-up gets its own).
- ``summary``: ``t_step`` (mean over the steps) and ``phases`` {name: {seconds, percent}}
  (percent of T_step; a ``gap`` entry when the steps had time outside the six phases).
- ``rollout``: ``tokens_generated`` (per step), ``tokens_per_s_per_gpu``, ``longest_sample_tokens``,
  ``engine_busy_share``, ``kv_blocks_total``, ``kv_blocks_peak``, ``kv_blocks_used_share``,
  ``preemptions``, ``aborted_requests``.
- ``memory``: ``gpus``: [{gpu, capacity_gib, peak_gib, headroom_gib, peak_phase, peak_rollout_id,
  by_owner_tag_gib (at the peak), tag_peaks_gib (each owner/tag's own maximum), phase_peaks_gib (the
  device's most while each phase was in progress, over all steps and start-up: what a measured
  per-phase level is checked against)}],
  ``host_pinned_peak_gib``.
- ``verdict``: ``fits`` (bool), ``oom`` (null or {phase, rollout_id, gpu, owner, tag,
  requested_gib, free_gib, short_by_gib, time_s, message}), ``fixes`` ([str]; when an OOM
  happened, each fix was simulated and says whether it then fits), ``fix_results`` (the same fixes
  as data: [{fix, changes, fits, t_step_s, result}]), ``at_risk`` (1.3: it fits, but some GPU's headroom
  is smaller than what the memory model missed by on the profile's measured runs: ``uncertainty.memory``).
- ``uncertainty`` (added in 1.1): how firm each phase is (`vime.sim.spread.uncertainty`):
  ``basis`` (the profile whose measured spread gives the bands, null when it has none), ``note``,
  ``phases`` {name: {low_s, high_s, low_factor, high_factor, rests_on [quantity], unmeasured [quantity],
  why (when no band)}},
  ``t_step`` (null or {low_s, high_s, unbanded [phase]}), ``memory`` (1.3: {rests_on, low_factor,
  high_factor, gpus: [{gpu, peak_low_gib, peak_high_gib, high_phase, high_factor, at_risk}], why (when no
  band)}), ``quantities`` (the
  profile's spread: {quantity: {low, high, rows, source}}).
- ``offload``: ``plan`` (the --train-offload-plan run), ``moved_gib_per_step`` (GiB copied between GPU
  and host per step over all GPUs: trainer_to_host, trainer_to_gpu, engines_to_host, engines_to_gpu,
  total), with ``auto`` what it chose ({chosen, baseline_all, resident, candidates}), and with an
  explicit plan other than all, ``all`` (the same run offloading everything, from `vime simulate`).
- ``wall_s``: wall-clock seconds the simulation took (the only field that is not deterministic;
  omitted with ``--seed``-stable output requested by tests through ``deterministic=True``).
"""

from __future__ import annotations

from typing import Any

from vime import __version__
from vime.async_loop import async_summary
from vime.orchestrator import PHASES, StepReport
from vime.runs.sim import Simulation
from vime.sim.spread import memory_band, uncertainty

SCHEMA = "vime.simulate/1.3"
GiB = 1024**3


def _model(model: Any) -> dict[str, Any]:
    """The model section: total and active parameters (equal for a dense model), and a MoE model's experts."""
    out = {"name": model.name, "params_b": _r(model.num_params() / 1e9, 3),
           "active_params_b": _r(model.num_active_params() / 1e9, 3), "layers": model.num_layers,
           "hidden_size": model.hidden_size}
    if model.is_moe:
        out.update(experts=model.num_experts, experts_per_token=model.moe_top_k,
                   expert_ffn_hidden_size=model.moe_ffn_hidden_size, shared_expert_ffn_size=model.shared_expert_ffn_size,
                   moe_layers=len(model.moe_layers), dense_layers=model.num_layers - len(model.moe_layers))
    return out


def _r(x: float, nd: int = 4) -> float:
    return round(float(x), nd)


def _summary(steps: list[StepReport]) -> dict[str, Any]:
    if not steps:
        return {"t_step": 0.0, "phases": {p: {"seconds": 0.0, "percent": 0.0} for p in PHASES}}
    n = len(steps)
    t_step = sum(s.t_step for s in steps) / n
    phases: dict[str, float] = {p: sum(getattr(s, f"t_{p}") for s in steps) / n for p in PHASES}
    extra = sum(s.t_gap + s.t_save + s.t_eval for s in steps) / n
    if extra > 1e-9:
        phases["gap"] = extra
    return {"t_step": _r(t_step), "phases": {p: {"seconds": _r(t), "percent": _r(100 * t / t_step if t_step else 0, 2)}
                                             for p, t in phases.items()}}


def _rollout_figures(sim: Simulation) -> dict[str, Any]:
    stats = sim.backends.rollout_stats()
    steps = sim.steps
    n = max(1, len(steps))
    t_rollout = sum(s.t_rollout for s in steps)
    if async_summary(steps) is not None:  # rollout overlaps training: the engines generate through the whole step
        t_rollout = sum(s.t_step for s in steps)
    tokens = sum(s.rollout.get("response_tokens", 0) for s in steps)
    rollout_gpus = int(sim.args.rollout_num_gpus)
    total = stats.get("kv_blocks_total", 0) or 0
    return {
        "tokens_generated": int(round(tokens / n)),
        "tokens_per_s_per_gpu": _r(tokens / t_rollout / rollout_gpus if t_rollout else 0.0, 2),
        "longest_sample_tokens": max((int(s.rollout.get("max_response_length", 0)) for s in steps), default=0),
        "engine_busy_share": _r(stats["busy_s_mean"] / t_rollout if t_rollout else 0.0, 3),
        "kv_blocks_total": int(total),
        "kv_blocks_peak": int(stats.get("kv_blocks_peak", 0)),
        "kv_blocks_used_share": _r(stats.get("kv_blocks_peak", 0) / total if total else 0.0, 3),
        "preemptions": int(stats.get("preemptions", 0)),
        "aborted_requests": int(stats.get("aborted", 0)),
    }


def _memory(sim: Simulation) -> dict[str, Any]:
    from vime.report.recorder import HOST

    rec = sim.backends.recorder
    gpus = []
    for gpu in sim.backends.gpus:
        peak = rec.gpu_peaks.get(gpu.index)
        cap = int(gpu.capacity)
        peak_bytes = peak.bytes if peak else 0
        tag_peaks = {f"{o}/{t}": _r(p.bytes / GiB, 3) for (g, o, t), p in sorted(rec.tag_peaks.items())
                     if g == gpu.index and p.bytes > 0}
        gpus.append({
            "gpu": gpu.index,
            "capacity_gib": _r(cap / GiB, 3),
            "peak_gib": _r(peak_bytes / GiB, 3),
            "headroom_gib": _r((cap - peak_bytes) / GiB, 3),
            "peak_phase": peak.phase if peak else "",
            "peak_rollout_id": peak.rollout_id if peak else None,
            "by_owner_tag_gib": {f"{o}/{t}": _r(b / GiB, 3) for o, t, b in (peak.breakdown if peak else ()) if b > 0},
            "tag_peaks_gib": tag_peaks,
            "phase_peaks_gib": {ph: _r(b / GiB, 3) for (g, ph), b in sorted(rec.phase_peaks.items())
                                if g == gpu.index},
        })
    host = rec.gpu_peaks.get(HOST)
    return {"gpus": gpus, "host_pinned_peak_gib": _r(host.bytes / GiB, 3) if host else 0.0}


def memory_at_risk(sim: Simulation) -> bool:
    """`sim` fits, but some GPU's high end of the profile's measured memory band passes its capacity."""
    if not sim.fits:
        return False
    hw = sim.backends.hardware
    return any(g["at_risk"] for g in memory_band(hw.name, hw.spread, _memory(sim)["gpus"])["gpus"])


def _verdict(sim: Simulation) -> dict[str, Any]:
    if sim.oom is None:
        return {"fits": True, "oom": None, "fixes": [], "fix_results": []}
    o = sim.oom
    return {"fits": False,
            "oom": {"phase": o.phase or "startup", "rollout_id": sim.backends.recorder.rollout_id, "gpu": o.gpu, "owner": o.owner,
                    "tag": o.tag, "requested_gib": _r(o.requested / GiB, 3), "free_gib": _r(o.free / GiB, 3),
                    "short_by_gib": _r((o.requested - o.free) / GiB, 3),
                    "time_s": _r(o.time if o.time is not None else 0.0), "message": str(o)},
            "fixes": list(sim.fixes), "fix_results": [dict(r) for r in sim.fix_results]}


def build_document(sim: Simulation, *, deterministic: bool = False, calls: Any = None) -> dict[str, Any]:
    """The ``vime.simulate/1.3`` document (module docstring); identical for identical inputs and seed,
    apart from ``wall_s`` (left out with `deterministic`). With `calls` (a `vime.report.calls.CallLog`
    that watched the run, ``--record-calls``) start-up and every step carry their ``calls``."""
    hw, model = sim.backends.hardware, sim.backends.model
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "vime_version": __version__,
        "config": sim.args.to_dict(),
        "hardware": {"name": hw.name, "memory_gib": _r(hw.memory_bytes / GiB, 2), "bf16_tflops": _r(hw.bf16_flops / 1e12, 1),
                     "hbm_tb_per_s": _r(hw.hbm_bytes_per_s / 1e12, 2)},
        "model": _model(model),
        "startup": sim.startup.to_dict() if sim.startup else None,
        "steps": [{"rollout_id": s.rollout_id, "phases": {k: _r(v, 6) for k, v in s.phases().items()},
                   "t_gap": _r(s.t_gap, 6), "t_step": _r(s.t_step, 6),
                   "metrics": {k: _r(v, 6) for k, v in sorted(s.metrics().items())}} for s in sim.steps],
        "summary": _summary(sim.steps),
        "rollout": _rollout_figures(sim),
        "memory": _memory(sim),
        "verdict": _verdict(sim),
        "offload": _offload(sim),
    }
    summary = doc["summary"]
    doc["uncertainty"] = uncertainty(hw.name, hw.spread, {p: v["seconds"] for p, v in summary["phases"].items()},
                                     summary["t_step"], doc["memory"]["gpus"])
    # fits, but the headroom is inside what the memory model missed by on measured runs
    doc["verdict"]["at_risk"] = any(g["at_risk"] for g in doc["uncertainty"]["memory"]["gpus"])
    asynchrony = async_summary(sim.steps, sim.args.async_rl)
    if asynchrony is not None:  # --async-mode one-step-off / fully-async only: the seed's document is unchanged
        doc["async"] = {k: {n: _r(x, 6) for n, x in v.items()} if isinstance(v, dict) else v for k, v in asynchrony.items()}
    if calls is not None:
        if doc["startup"] is not None:
            doc["startup"]["calls"] = [e.to_dict() for e in calls.sequence("startup")]
        for step in doc["steps"]:
            step["calls"] = [e.to_dict() for e in calls.sequence(step["rollout_id"])]
    if not deterministic:
        doc["wall_s"] = _r(sim.wall_s, 3)
    return doc


def _offload(sim: Simulation) -> dict[str, Any]:
    """--train-offload-plan: the plan run, GiB copied between GPU and host per step, and what `auto` chose."""
    from vime.runs.offload import bytes_moved

    out: dict[str, Any] = {"plan": str(getattr(sim.args, "train_offload_plan", "all")),
                           "moved_gib_per_step": bytes_moved(sim)}
    if sim.offload_choice is not None:
        out["auto"] = sim.offload_choice.to_dict()
    return out


def run_document(args: Any, report: Any, recorder: Any, capacity: dict[int, int], *, backend: str) -> dict[str, Any]:
    """A measured run's document in the simulator's shape (`vime train --report`): the same summary,
    steps and memory sections, from the run's reports and the memory its recorder sampled."""
    steps = list(report.steps)
    gpus = []
    for gpu, peak in sorted(recorder.gpu_peaks.items()):
        cap = int(capacity.get(gpu, peak.bytes))
        gpus.append({"gpu": gpu, "capacity_gib": _r(cap / GiB, 3), "peak_gib": _r(peak.bytes / GiB, 3),
                     "headroom_gib": _r((cap - peak.bytes) / GiB, 3), "peak_phase": peak.phase,
                     "peak_rollout_id": peak.rollout_id,
                     "by_owner_tag_gib": {f"{o}/{t}": _r(b / GiB, 3) for o, t, b in peak.breakdown if b > 0},
                     "tag_peaks_gib": {}})
    tokens = sum(s.rollout.get("response_tokens", 0) for s in steps)
    t_rollout = sum(s.t_rollout for s in steps)
    return {
        "schema": "vime.train/1", "vime_version": __version__, "backend": backend, "config": args.to_dict(),
        "startup": report.startup.to_dict() if report.startup else None,
        "steps": [{"rollout_id": s.rollout_id, "phases": {k: _r(v, 6) for k, v in s.phases().items()},
                   "t_gap": _r(s.t_gap, 6), "t_step": _r(s.t_step, 6),
                   "metrics": {k: _r(v, 6) for k, v in sorted(s.metrics().items())}} for s in steps],
        "summary": _summary(steps),
        "rollout": {"tokens_generated": int(round(tokens / max(1, len(steps)))),
                    "tokens_per_s": _r(tokens / t_rollout if t_rollout else 0.0, 2)},
        "memory": {"gpus": gpus, "host_pinned_peak_gib": 0.0},
        "verdict": {"fits": True, "oom": None, "fixes": [], "fix_results": []},
    }
