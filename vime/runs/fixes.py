"""Fixes for an out-of-memory: candidate changes aimed at the owner and tag that ran out, each checked by simulating it."""

from __future__ import annotations

from typing import Any

from vime.errors import ConfigError, OutOfMemoryError
from vime.runs.sim import Simulation, simulate

GiB = 1024**3


def _candidate_fixes(args: Any, oom: OutOfMemoryError) -> list[tuple[str, dict[str, Any]]]:
    """Changes that address the owner/tag that ran out, most targeted first."""
    out: list[tuple[str, dict[str, Any]]] = []
    tp = int(args.tensor_model_parallel_size)
    gpus = int(args.actor_num_gpus)
    owner, tag = oom.owner, oom.tag
    trainer = owner.startswith(("trainer", "actor"))  # the simulator's trainer allocates as "actor"
    util = float(args.gpu_memory_utilization)
    # a KL reference beside the policy is a whole bf16 model copy on each trainer GPU
    ref_on_gpu = (args.use_kl_loss or args.kl_coef != 0) and args.ref_placement == "gpu"
    ref_to_host = ("keep the KL reference on the host (--ref-placement host: copied in for its forward each step)",
                   {"ref_placement": "host"})
    if owner.startswith("engine") or tag in ("kv_cache", "weights", "cuda_graph"):
        for u in (round(util - 0.1, 2), round(util - 0.2, 2), round(util - 0.3, 2)):
            if u >= 0.3:
                out.append((f"lower --gpu-memory-utilization to {u}", {"gpu_memory_utilization": u}))
        if ref_on_gpu and not args.offload_train:  # the resident trainer's copy is what the engines lack
            out.append(ref_to_host)
        if not args.offload_train:
            out.append(("enable --offload-train (the trainer leaves the GPU while engines run)",
                        {"offload_train": True}))
    if tag == "activations" or trainer:
        mbs = int(args.micro_batch_size)
        m = mbs // 2
        while m >= 1:
            out.append((f"lower --micro-batch-size to {m}", {"micro_batch_size": m}))
            m //= 2
    if trainer or tag in ("params", "grads", "optimizer"):
        if ref_on_gpu:
            out.append(ref_to_host)
        out += _expert_parallel_fixes(args)
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


def _expert_parallel_fixes(args: Any) -> list[tuple[str, dict[str, Any]]]:
    """MoE models: more expert-parallel ranks, each holding fewer whole experts (their state shrinks with EP)."""
    from vime.sim.models import load_model

    try:
        experts = load_model(args.model).num_experts
    except ConfigError:
        return []
    gpus, ep = int(args.actor_num_gpus), int(args.expert_model_parallel_size)
    out = []
    e = ep * 2
    while experts and e <= gpus:
        if gpus % e == 0 and experts % e == 0:
            out.append((f"raise --expert-model-parallel-size to {e}", {"expert_model_parallel_size": e}))
        e *= 2
    return out


def simulate_fixes(sim: Simulation, limit: int = 6) -> list[dict[str, Any]]:
    """Simulate each candidate fix for one step. One dict per fix, those that fit first (in the order tried):
    ``fix`` (what to change, in words), ``changes`` ({option: value}), ``fits``, ``t_step_s`` (when it fits),
    ``result`` (the outcome in words)."""
    assert sim.oom is not None
    results: list[dict[str, Any]] = []
    for desc, change in _candidate_fixes(sim.args, sim.oom)[:limit]:
        row: dict[str, Any] = {"fix": desc, "changes": dict(change), "fits": False, "t_step_s": None}
        try:
            trial_args = sim.args.replace(num_rollout=sim.args.start_rollout_id + 1, **change)
        except ConfigError as exc:
            results.append({**row, "result": f"not a valid configuration ({exc})"})
            continue
        trial = simulate(trial_args)
        if trial.fits:
            t = trial.steps[0].t_step if trial.steps else 0.0
            results.append({**row, "fits": True, "t_step_s": round(t, 4), "result": f"fits (simulated T_step {t:.2f} s)"})
        else:
            o = trial.oom
            assert o is not None
            results.append({**row, "result": f"still OOM ({o.owner}/{o.tag} on GPU {o.gpu}, short by "
                                             f"{(o.requested - o.free) / GiB:.2f} GiB)"})
    return sorted(results, key=lambda r: 0 if r["fits"] else 1)


def fix_lines(results: list[dict[str, Any]]) -> list[str]:
    """The verdict's ``fixes`` strings: "what to change: outcome"."""
    return [f"{r['fix']}: {r['result']}" for r in results]


def check_fixes(sim: Simulation, limit: int = 6) -> list[str]:
    """Simulate each candidate fix for one step; say which ones make the configuration fit (fits first)."""
    return fix_lines(simulate_fixes(sim, limit))
