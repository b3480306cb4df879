"""`vime simulate`: run the RL loop on simulated backends and answer capacity questions (time per phase, memory, OOM).

`simulate(args)` runs one configuration and returns a `Simulation`; `build_document` turns it
into the versioned JSON document (`--json`, schema below); `format_text` into the tables a
person reads; `--trace-out` and `--report` write a Perfetto trace and an HTML page; `--sweep`
and `--search` (vime/sweep.py) run many configurations in parallel.

JSON schema ``vime.simulate/1`` (keys of the top-level object):

- ``schema``: ``"vime.simulate/1"``; ``vime_version``.
- ``config``: the resolved configuration (`vime simulate --dry-run --json`).
- ``hardware`` / ``model``: what was simulated (name, memory, peak FLOP/s; parameters, layers).
- ``startup``: start-up phases (seed steps 1–13) in seconds.
- ``steps``: per simulated step: ``rollout_id``, ``phases`` {rollout, offload, train,
  onload_weights, weight_sync, onload_kv} in seconds, ``t_gap``, ``t_step``, ``metrics``
  (perf/…, rollout/…, train/… as `vime train` logs them).
- ``summary``: ``t_step`` (mean over the steps) and ``phases`` {name: {seconds, percent}}
  (percent of T_step; a ``gap`` entry when the steps had time outside the six phases).
- ``rollout``: ``tokens_generated`` (per step), ``tokens_per_s_per_gpu``, ``longest_sample_tokens``,
  ``engine_busy_share``, ``kv_blocks_total``, ``kv_blocks_peak``, ``kv_blocks_used_share``,
  ``preemptions``, ``aborted_requests``.
- ``memory``: ``gpus``: [{gpu, capacity_gib, peak_gib, headroom_gib, peak_phase, peak_rollout_id,
  by_owner_tag_gib (at the peak), tag_peaks_gib (each owner/tag's own maximum)}],
  ``host_pinned_peak_gib``.
- ``verdict``: ``fits`` (bool), ``oom`` (null or {phase, rollout_id, gpu, owner, tag,
  requested_gib, free_gib, short_by_gib, time_s, message}), ``fixes`` ([str]; when an OOM
  happened, each fix was simulated and says whether it then fits).
- ``wall_s``: wall-clock seconds the simulation took (the only field that is not deterministic;
  omitted with ``--seed``-stable output requested by tests through ``deterministic=True``).
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from vime import __version__
from vime.errors import OutOfMemoryError
from vime.orchestrator import PHASES, StartupReport, StepReport

SCHEMA = "vime.simulate/1"
GiB = 1024**3


@dataclass
class Simulation:
    """One simulated configuration: its reports, the backends it ran on, and the OOM if one happened."""

    args: Any
    startup: StartupReport | None
    steps: list[StepReport]
    backends: Any
    oom: OutOfMemoryError | None = None
    wall_s: float = 0.0
    fixes: list[str] = field(default_factory=list)

    @property
    def fits(self) -> bool:
        return self.oom is None


def simulate(args: Any, *, progress: bool = False) -> Simulation:
    """Run start-up and ``--num-rollout`` steps on simulated backends; an OOM ends the run and is kept."""
    from vime.cli_train import build_sim_orchestrator
    from vime.sim import clock
    from vime.sim.backends import build_sim_backends

    t0 = time.perf_counter()
    backends = build_sim_backends(args, start=False)
    orch = build_sim_orchestrator(args, backends, progress=progress)
    steps: list[StepReport] = []
    startup: list[StartupReport] = []

    async def main() -> None:
        await backends.start()
        await orch.run(on_startup=startup.append, on_step=steps.append)

    oom: OutOfMemoryError | None = None
    try:
        clock.run(main(), env=backends.env)
    except OutOfMemoryError as exc:
        oom = backends.recorder.oom or exc
    return Simulation(args, startup[0] if startup else None, steps, backends, oom, time.perf_counter() - t0)


# --------------------------------------------------------------------------------------------
# Fixes for an OOM: candidate changes, each checked by simulating it
# --------------------------------------------------------------------------------------------


def _candidate_fixes(args: Any, oom: OutOfMemoryError) -> list[tuple[str, dict[str, Any]]]:
    """Changes that address the owner/tag that ran out, most targeted first."""
    out: list[tuple[str, dict[str, Any]]] = []
    tp = int(args.tensor_model_parallel_size)
    gpus = int(args.actor_num_gpus)
    owner, tag = oom.owner, oom.tag
    util = float(args.gpu_memory_utilization)
    if owner.startswith("engine") or tag in ("kv_cache", "weights", "cuda_graph"):
        for u in (round(util - 0.1, 2), round(util - 0.2, 2), round(util - 0.3, 2)):
            if u >= 0.3:
                out.append((f"lower --gpu-memory-utilization to {u}", {"gpu_memory_utilization": u}))
        if not args.offload_train:
            out.append(("enable --offload-train (the trainer leaves the GPU while engines run)",
                        {"offload_train": True}))
    if tag == "activations" or owner.startswith("trainer"):
        mbs = int(args.micro_batch_size)
        m = mbs // 2
        while m >= 1:
            out.append((f"lower --micro-batch-size to {m}", {"micro_batch_size": m}))
            m //= 2
    if owner.startswith("trainer") or tag in ("params", "grads", "optimizer"):
        if not args.use_distributed_optimizer:
            out.append(("enable --use-distributed-optimizer (Adam state sharded over DP)",
                        {"use_distributed_optimizer": True}))
        t = tp * 2
        while t <= min(8, gpus):
            if gpus % t == 0:
                out.append((f"raise --tensor-model-parallel-size to {t}", {"tensor_model_parallel_size": t}))
            t *= 2
        if not args.offload_train:
            out.append(("enable --offload-train", {"offload_train": True}))
    if owner.startswith("engine") and int(args.rollout_num_gpus_per_engine) * 2 <= int(args.rollout_num_gpus):
        g = int(args.rollout_num_gpus_per_engine) * 2
        out.append((f"raise --rollout-num-gpus-per-engine to {g} (weights and KV split over more GPUs)",
                    {"rollout_num_gpus_per_engine": g}))
    seen: set[str] = set()
    return [(d, c) for d, c in out if not (d in seen or seen.add(d))]  # type: ignore[func-returns-value]


def check_fixes(sim: Simulation, limit: int = 6) -> list[str]:
    """Simulate each candidate fix for one step; say which ones make the configuration fit."""
    from vime.errors import ConfigError

    assert sim.oom is not None
    results = []
    for desc, change in _candidate_fixes(sim.args, sim.oom)[:limit]:
        try:
            trial_args = sim.args.replace(num_rollout=sim.args.start_rollout_id + 1, **change)
        except ConfigError as exc:
            results.append(f"{desc}: not a valid configuration ({exc})")
            continue
        trial = simulate(trial_args)
        if trial.fits:
            t = trial.steps[0].t_step if trial.steps else 0.0
            results.append(f"{desc}: fits (simulated T_step {t:.2f} s)")
        else:
            o = trial.oom
            assert o is not None
            results.append(f"{desc}: still OOM ({o.owner}/{o.tag} on GPU {o.gpu}, short by "
                           f"{(o.requested - o.free) / GiB:.2f} GiB)")
    # Fixes that fit first, in the order tried.
    return sorted(results, key=lambda r: 0 if ": fits" in r else 1)


# --------------------------------------------------------------------------------------------
# The JSON document
# --------------------------------------------------------------------------------------------


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
        })
    host = rec.gpu_peaks.get(HOST)
    return {"gpus": gpus, "host_pinned_peak_gib": _r(host.bytes / GiB, 3) if host else 0.0}


def _verdict(sim: Simulation) -> dict[str, Any]:
    if sim.oom is None:
        return {"fits": True, "oom": None, "fixes": []}
    o = sim.oom
    return {"fits": False,
            "oom": {"phase": o.phase or "startup", "rollout_id": sim.backends.recorder.rollout_id, "gpu": o.gpu, "owner": o.owner,
                    "tag": o.tag, "requested_gib": _r(o.requested / GiB, 3), "free_gib": _r(o.free / GiB, 3),
                    "short_by_gib": _r((o.requested - o.free) / GiB, 3),
                    "time_s": _r(o.time if o.time is not None else 0.0), "message": str(o)},
            "fixes": list(sim.fixes)}


def build_document(sim: Simulation, *, deterministic: bool = False) -> dict[str, Any]:
    """The ``vime.simulate/1`` document (module docstring); identical for identical inputs and seed,
    apart from ``wall_s`` (left out with `deterministic`)."""
    hw, model = sim.backends.hardware, sim.backends.model
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "vime_version": __version__,
        "config": sim.args.to_dict(),
        "hardware": {"name": hw.name, "memory_gib": _r(hw.memory_bytes / GiB, 2), "bf16_tflops": _r(hw.bf16_flops / 1e12, 1),
                     "hbm_tb_per_s": _r(hw.hbm_bytes_per_s / 1e12, 2)},
        "model": {"name": model.name, "params_b": _r(model.num_params() / 1e9, 3), "layers": model.num_layers,
                  "hidden_size": model.hidden_size},
        "startup": sim.startup.to_dict() if sim.startup else None,
        "steps": [{"rollout_id": s.rollout_id, "phases": {k: _r(v, 6) for k, v in s.phases().items()},
                   "t_gap": _r(s.t_gap, 6), "t_step": _r(s.t_step, 6),
                   "metrics": {k: _r(v, 6) for k, v in sorted(s.metrics().items())}} for s in sim.steps],
        "summary": _summary(sim.steps),
        "rollout": _rollout_figures(sim),
        "memory": _memory(sim),
        "verdict": _verdict(sim),
    }
    if not deterministic:
        doc["wall_s"] = _r(sim.wall_s, 3)
    return doc


# --------------------------------------------------------------------------------------------
# Text
# --------------------------------------------------------------------------------------------

_PHASE_LABEL = {"rollout": "rollout (14–32)", "offload": "offload (33–36)", "train": "train (37–42)",
                "onload_weights": "onload weights (43)", "weight_sync": "weight sync (44–53)",
                "onload_kv": "onload KV (54)", "gap": "outside the phases"}


def format_text(doc: dict[str, Any]) -> str:
    """The human report: phases, rollout figures, memory per GPU, verdict."""
    cfg = doc["config"]
    lines = [f"vime simulate — {doc['model']['name']} ({doc['model']['params_b']:.2f} B params) on "
             f"{cfg['actor_num_gpus']} × {doc['hardware']['name']}, "
             f"{'colocate' if cfg['colocate'] else 'disaggregated'}, TP {cfg['tensor_model_parallel_size']} × "
             f"DP {cfg['data_parallel_size']}, {cfg['rollout_num_engines']} engines × "
             f"{cfg['rollout_num_gpus_per_engine']} GPUs, {cfg['rollout_batch_size']} × {cfg['n_samples_per_prompt']} "
             f"samples, {len(doc['steps'])} step(s) simulated", ""]
    s = doc["summary"]
    lines.append("T_step by phase (mean over simulated steps)")
    for name, p in s["phases"].items():
        bar = "█" * int(round(p["percent"] / 2.5))
        lines.append(f"  {_PHASE_LABEL.get(name, name):<22} {p['seconds']:9.3f} s  {p['percent']:5.1f} %  {bar}")
    lines.append(f"  {'T_step':<22} {s['t_step']:9.3f} s")
    r = doc["rollout"]
    lines += ["", "Rollout",
              f"  tokens generated per step {r['tokens_generated']:,}   tokens/s per GPU {r['tokens_per_s_per_gpu']:,.0f}"
              f"   longest sample {r['longest_sample_tokens']} tokens",
              f"  engine busy {100 * r['engine_busy_share']:.0f} % of rollout   KV blocks peak {r['kv_blocks_peak']:,} of "
              f"{r['kv_blocks_total']:,} ({100 * r['kv_blocks_used_share']:.0f} %)   preemptions {r['preemptions']}"]
    lines += ["", "Peak memory per GPU (GiB, at the moment of the GPU's peak)"]
    for g in doc["memory"]["gpus"]:
        parts = ", ".join(f"{k} {v:.2f}" for k, v in g["by_owner_tag_gib"].items())
        lines.append(f"  GPU {g['gpu']}: {g['peak_gib']:6.2f} of {g['capacity_gib']:.2f}  headroom "
                     f"{g['headroom_gib']:6.2f}  during {g['peak_phase'] or '-'}  [{parts}]")
    lines.append(f"  host pinned memory peak: {doc['memory']['host_pinned_peak_gib']:.2f} GiB")
    v = doc["verdict"]
    lines.append("")
    if v["fits"]:
        worst = min((g["headroom_gib"] for g in doc["memory"]["gpus"]), default=0.0)
        lines.append(f"Verdict: FITS — smallest headroom {worst:.2f} GiB")
    else:
        o = v["oom"]
        lines.append(f"Verdict: OOM during {o['phase'] or '?'} (rollout {o['rollout_id']}) on GPU {o['gpu']}: "
                     f"{o['owner']}/{o['tag']} asked for {o['requested_gib']:.2f} GiB with {o['free_gib']:.2f} GiB free "
                     f"— short by {o['short_by_gib']:.2f} GiB at t = {o['time_s']:.3f} s")
        if v["fixes"]:
            lines.append("Fixes (each simulated):")
            lines += [f"  - {f}" for f in v["fixes"]]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# The command
# --------------------------------------------------------------------------------------------


def run_simulate(args: Any) -> int:
    """`vime simulate`: one configuration (tables or --json), or a sweep / search over many."""
    if args.sweep or args.search:
        from vime.sweep import run_sweep_command

        return run_sweep_command(args)
    sim = simulate(args, progress=False)
    if sim.oom is not None:
        sim.fixes = check_fixes(sim)
    doc = build_document(sim)
    if args.trace_out:
        from vime.report.trace import write_trace

        write_trace(sim.backends.recorder, args.trace_out)
    if args.report:
        from vime.report.html import render_html

        with open(args.report, "w") as f:
            f.write(render_html(doc, sim.backends.recorder))
    if args.json:
        print(json.dumps(doc, indent=1, sort_keys=False))
    else:
        print(format_text(doc))
        for path, what in ((args.trace_out, "trace"), (args.report, "report")):
            if path:
                print(f"{what} written to {path}", file=sys.stderr)
    return 0 if sim.fits else 3
