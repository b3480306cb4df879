"""Validation and derivation of the options (seed step 1): the only place cross-flag rules live."""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import fields
from typing import Any

from vime.config.backend_rules import check_backend, resolve_num_epoch
from vime.config.files import check_files
from vime.config.lengths import default_prompt_spec, default_response_spec, parse_length_spec
from vime.config.options import GROUPS, ClusterConfig, DerivedConfig, _flags_of
from vime.errors import ConfigError
from vime.placement import plan_placement
from vime.sim.moe import effective_expert_tp

#: Steps `vime simulate` runs when --num-rollout is not given.
SIMULATE_DEFAULT_NUM_ROLLOUT = 2
#: Upper bounds past which a number is a typo, not a setting (integers: MAX_COUNT unless named here).
PLAUSIBLE_MAX: dict[str, float] = {"lr": 1.0, "rollout_temperature": 100.0, "kl_coef": 1e3, "kl_loss_coef": 1e3,
                                   "eps_clip_high": 10.0, "eps_clip_c": 1e3, "target_step_time": 1e7,
                                   "update_weight_buffer_size": float(1 << 40), "seed": float(2**63 - 1),
                                   "moe_load_imbalance": 100.0}
MAX_COUNT = 10**9
#: Flags that parse (slime users type them) but that vime does not train yet, and what to do instead.
NOT_IMPLEMENTED = {
    "use_critic": "PPO with a value head is not implemented; use --advantage-estimator grpo, gspo or cispo",
    "use_opd": "drop --use-opd (distil beforehand and start from that model with --hf-checkpoint)",
    "use_rollout_routing_replay": "drop it: MoE routing replay is not implemented (`vime simulate` plans MoE models; "
                                  "the real trainer trains Qwen3-MoE at TP 1, EP 1, without replay)",
    "use_routing_replay": "drop it: MoE routing replay is not implemented (`vime simulate` plans MoE models; the "
                          "real trainer trains Qwen3-MoE at TP 1, EP 1, without replay)",
}


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def resolve(raw: dict[str, Any], command: str) -> dict[str, Any]:
    """Fill defaults, validate, derive: the group values by field name plus ``derived`` (a DerivedConfig).

    `raw` holds only the options given (plus earlier resolutions); every inconsistency raises ConfigError.
    """
    v: dict[str, Any] = {}
    for cls in GROUPS:
        for f in fields(cls):
            v[f.name] = raw.get(f.name, f.default)
    if command == "simulate":
        v["backend"] = "sim"
        # Steps repeat in steady state, so the simulator's default is a few of them, not the
        # seed's 100 (which `vime train` keeps); pass --num-rollout to simulate more.
        if "num_rollout" not in raw:
            v["num_rollout"] = SIMULATE_DEFAULT_NUM_ROLLOUT
    _check_ranges(v)
    if v["prompt_data"] is not None and "num_epoch" in raw:
        _need(os.path.isfile(v["prompt_data"]), f"--prompt-data {v['prompt_data']}: file not found; give an "
                                                f"existing JSONL dataset")
    resolve_num_epoch(v, set(raw))
    if v["save"] is not None and v["save_interval"] is None:
        v["save_interval"] = max(1, v["num_rollout"])  # --save alone: one checkpoint, after the last rollout
    _need(0 <= v["start_rollout_id"] <= v["num_rollout"],
          f"--start-rollout-id {v['start_rollout_id']} must lie in [0, --num-rollout {v['num_rollout']}]")
    check_backend(v, set(raw))
    actor_gpus, engines = _placement(v)
    _real_placement(v, set(raw))
    _asynchrony(v, set(raw))
    dp = _parallelism(v)
    _batches(v)
    _lengths(v)
    _sampling(v)
    _algorithm(v)
    _sim_inputs(v)
    check_files(v, set(raw), command)
    _faults(v, engines)
    _sim_size(v)
    gbs, mbs = v["global_batch_size"], v["micro_batch_size"]
    v["derived"] = DerivedConfig(
        command=command,
        actor_num_gpus=actor_gpus,
        data_parallel_size=dp,
        rollout_num_engines=engines,
        samples_per_rollout=v["rollout_batch_size"] * v["n_samples_per_prompt"],
        num_microbatches_per_step=gbs // (mbs * dp),
        rollout_concurrency=v["vllm_server_concurrency"] * engines,
    )
    return v


def _check_ranges(v: dict[str, Any]) -> None:
    """Plain ranges; every number finite (argparse takes ``inf`` and ``nan`` as floats)."""
    for name, value in v.items():
        if isinstance(value, float):
            _need(math.isfinite(value), f"{_flags_of(name)} {value} is not a finite number; give a finite value")
        elif isinstance(value, int) and not isinstance(value, bool):
            high = PLAUSIBLE_MAX.get(name, MAX_COUNT)
            _need(value <= high, f"{_flags_of(name)} {value} is implausibly large (above {high:g}); check the value")
    for name, high in PLAUSIBLE_MAX.items():
        if isinstance(v.get(name), float):
            _need(v[name] <= high, f"{_flags_of(name)} {v[name]:g} is implausibly large (above {high:g}); "
                                   f"check the value")
    for name in ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus_per_engine",
                 "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                 "expert_model_parallel_size", "micro_batch_size", "rollout_batch_size", "n_samples_per_prompt",
                 "rollout_max_prompt_len", "rollout_max_response_len", "rollout_max_context_len",
                 "vllm_server_concurrency", "max_num_seqs", "max_num_batched_tokens",
                 "update_weight_buffer_size"):
        _need(isinstance(v[name], int) and v[name] >= 1,
              f"{_flags_of(name)} must be a positive integer, got {v[name]!r}")
    for name in ("num_steps_per_rollout", "global_batch_size", "over_sampling_batch_size",
                 "expert_tensor_parallel_size",
                 "rollout_num_gpus", "eval_interval", "save_interval", "num_epoch"):
        if v[name] is not None:
            _need(v[name] >= 1, f"{_flags_of(name)} must be ≥ 1, got {v[name]}; leave it out for the default")
    _need(v["num_rollout"] >= 0, f"--num-rollout must be ≥ 0, got {v['num_rollout']}")
    _need(v["lr"] >= 0, f"--lr must be ≥ 0, got {v['lr']}")
    _need(v["save_interval"] is None or v["save"] is not None,
          f"--save-interval {v['save_interval']} needs --save PATH to know where to write checkpoints")


def _placement(v: dict[str, Any]) -> tuple[int, int]:
    """Placement: colocate, offloads, engines (seed steps 2–3)."""
    actor_gpus = v["actor_num_nodes"] * v["actor_num_gpus_per_node"]
    if v["colocate"]:
        # The trainer may stay resident (--no-offload-train: no offload/onload per step, the memory
        # check decides whether the engines still fit); the engines must sleep while it trains.
        _need(v["offload_rollout"] is not False,
              "--no-offload-rollout contradicts --colocate: the engines' KV cache and the trainer take turns "
              "on the same GPUs, so the engines must sleep while it trains; drop --no-offload-rollout or "
              "pass --no-colocate")
        v["offload_rollout"] = True
        v["offload_train"] = v["offload_train"] is not False
        if v["rollout_num_gpus"] is not None:
            _need(v["rollout_num_gpus"] == actor_gpus,
                  f"--rollout-num-gpus {v['rollout_num_gpus']} differs from the actor GPUs "
                  f"(--actor-num-nodes {v['actor_num_nodes']} × --actor-num-gpus-per-node "
                  f"{v['actor_num_gpus_per_node']} = {actor_gpus}) under --colocate; leave it out or "
                  f"set it to {actor_gpus}")
        v["rollout_num_gpus"] = actor_gpus
    else:
        _need(v["rollout_num_gpus"] is not None,
              "--no-colocate needs --rollout-num-gpus N (GPUs for the engines, apart from the trainer's)")
        v["offload_train"] = bool(v["offload_train"])
        v["offload_rollout"] = bool(v["offload_rollout"])
    _offload_plan(v)
    rg, per_engine = v["rollout_num_gpus"], v["rollout_num_gpus_per_engine"]
    _need(rg % per_engine == 0,
          f"--rollout-num-gpus-per-engine {per_engine} does not divide --rollout-num-gpus {rg}; pick a "
          f"divisor of {rg} (e.g. {_divisor_near(rg, per_engine)})")
    engines = rg // per_engine
    return actor_gpus, engines


def _offload_plan(v: dict[str, Any]) -> None:
    """--train-offload-plan: a plan other than all needs a trainer that sleeps, tag by tag (vime's CuMem allocator)."""
    from vime.tags import parse_offload_plan

    plan = v["train_offload_plan"] = parse_offload_plan(v["train_offload_plan"])
    if plan == "all":
        return
    _need(not (plan == "auto" and v["backend"] == "real"),
          "--train-offload-plan auto is chosen by the simulator, not by --backend real: run `vime simulate` with "
          "the same flags and --train-offload-plan auto, then pass the plan it prints")
    _need(bool(v["offload_train"]),
          f"--train-offload-plan {plan} chooses what the trainer offloads, but the trainer does not sleep "
          f"(--no-offload-train or --no-colocate); drop --train-offload-plan or pass --offload-train")
    _need(v["train_offload_backend"] == "cumem",
          f"--train-offload-plan {plan}: --train-offload-backend torch_memory_saver pauses its whole region, "
          f"never some tags; use --train-offload-backend cumem")


def _real_placement(v: dict[str, Any], given: set[str]) -> None:
    """What the real backend adds to placement (seed step 3): every engine on one node, and a weight path
    that reaches the engines where they are. The simulator models any GPU numbering and NCCL, so
    `vime simulate` and ``--backend sim`` are not held to it."""
    if v["backend"] != "real":
        return
    try:
        plan_placement(ClusterConfig(**{f.name: v[f.name] for f in fields(ClusterConfig)}), use_gpus=True)
    except ConfigError as exc:
        raise ConfigError(f"{exc} (--backend real; `vime simulate` models this layout)") from None
    if v["colocate"] or v["update_weight_mode"] != "tensor":
        return
    # CUDA IPC hands each engine GPU memory of the trainer rank on the same GPU; disaggregated engines
    # have none, and the real backend has no NCCL broadcast: the weights go through disk
    _need("update_weight_mode" not in given,
          "--update-weight-mode tensor sends CUDA-IPC buckets, which need every engine on the GPUs of its trainer "
          "ranks (--colocate); the real backend has no NCCL path for --no-colocate engines: pass "
          "--update-weight-mode disk (a directory every node can read), or --colocate, or --backend sim "
          "(the simulator models the NCCL broadcast)")
    v["update_weight_mode"] = "disk"


def _asynchrony(v: dict[str, Any], given: set[str]) -> None:
    """--async-mode and its companions (issue 22): the modes overlap rollout and training, so they need GPUs apart."""
    mode = v["async_mode"]
    for name in ("max_staleness", "partial_rollout"):
        _need(name not in given or mode == "fully-async",
              f"{_flags_of(name)} only acts with --async-mode fully-async (got --async-mode {mode}); drop it or "
              f"pass --async-mode fully-async")
    _need(v["max_staleness"] >= 0, f"--max-staleness must be ≥ 0, got {v['max_staleness']}")
    if mode == "sync":
        return
    _need(not v["colocate"],
          f"--async-mode {mode} overlaps rollout and training, so the engines need GPUs of their own: pass "
          f"--no-colocate --rollout-num-gpus N, or --async-mode sync")
    for name in ("offload_train", "offload_rollout"):
        _need(not v[name], f"{_flags_of(name)} contradicts --async-mode {mode}: trainer and engines stay awake to "
                           f"overlap; drop {_flags_of(name)} or use --async-mode sync")
    for name in ("eval_interval", "save_interval"):
        _need(v[name] is None, f"{_flags_of(name)} is not supported with --async-mode {mode} yet; drop it or use "
                               f"--async-mode sync")
    if mode != "fully-async":
        return
    # the producer admits one group at a time and generates each sample itself, with partial rollout
    for name, why in (("over_sampling_batch_size", "admits one group at a time under --max-staleness"),
                      ("custom_generate_function_path", "generates each sample itself, resuming it across updates")):
        _need(name not in given or v[name] is None,
              f"{_flags_of(name)} does not act with --async-mode fully-async (its producer {why}); drop it or use "
              f"--async-mode one-step-off or sync")
    # abort-resume aborts at every update, which is what a flushing publication does (seed step 46)
    if v["partial_rollout"] == "abort-resume":
        _need(v["flush_cache_interval"] == 1,
              f"--partial-rollout abort-resume aborts in-flight requests at every weight update, which flushes the "
              f"caches every version: leave --flush-cache-interval at 1 (got {v['flush_cache_interval']}) or pass "
              f"--partial-rollout keep")
    else:
        _need("flush_cache_interval" not in given or v["flush_cache_interval"] <= 0,
              f"--partial-rollout keep freezes requests across a weight update, and a cache flush would abort them: "
              f"drop --flush-cache-interval {v['flush_cache_interval']} (keep publishes without flushing) or pass "
              f"--partial-rollout abort-resume")
        v["flush_cache_interval"] = 0


def _parallelism(v: dict[str, Any]) -> int:
    """Megatron parallelism."""
    actor_gpus = v["actor_num_nodes"] * v["actor_num_gpus_per_node"]
    tp, pp, cp = (v["tensor_model_parallel_size"], v["pipeline_model_parallel_size"],
                  v["context_parallel_size"])
    mp = tp * pp * cp
    _need(actor_gpus % mp == 0,
          f"--tensor-model-parallel-size {tp} × --pipeline-model-parallel-size {pp} × "
          f"--context-parallel-size {cp} = {mp} does not divide the {actor_gpus} actor GPUs "
          f"(--actor-num-nodes {v['actor_num_nodes']} × --actor-num-gpus-per-node "
          f"{v['actor_num_gpus_per_node']}); choose sizes whose product divides {actor_gpus}")
    dp = actor_gpus // mp
    _expert_parallelism(v, actor_gpus)
    return dp


def _expert_parallelism(v: dict[str, Any], actor_gpus: int) -> None:
    """Megatron's expert layout, as far as it is known without the model (the expert count is checked
    where the model is read: `vime.sim.moe.check_expert_parallel`)."""
    ep = v["expert_model_parallel_size"]
    etp = effective_expert_tp(v["tensor_model_parallel_size"], ep, v["expert_tensor_parallel_size"])
    pp = v["pipeline_model_parallel_size"]
    _need(actor_gpus % (ep * etp * pp) == 0,
          f"--expert-model-parallel-size {ep} × --expert-tensor-parallel-size {etp} × --pipeline-model-parallel-size "
          f"{pp} = {ep * etp * pp} does not divide the {actor_gpus} actor GPUs; choose sizes whose product divides "
          f"{actor_gpus}")
    _need(v["moe_load_imbalance"] >= 1.0,
          f"--moe-load-imbalance {v['moe_load_imbalance']} is below 1 (the busiest rank gets at least the mean); "
          f"give a value ≥ 1")
    if v["backend"] == "real" and (ep > 1 or v["expert_tensor_parallel_size"] is not None):
        _real_expert_layout(v, actor_gpus, ep, etp)


def _real_expert_layout(v: dict[str, Any], actor_gpus: int, ep: int, etp: int) -> None:
    """The real trainer's expert layout against --hf-checkpoint's config.json when it is there (the
    trainer checks it again where it builds the model): EP divides the experts, ETP their width."""
    from vime.inputs import read_json
    from vime.sim.models import ModelSpec
    from vime.sim.moe import check_expert_parallel

    path = v["hf_checkpoint"]
    file = os.path.join(path, "config.json") if path else ""
    if not os.path.isfile(file):
        return
    model = ModelSpec.from_hf_config(read_json(file, what="--hf-checkpoint", missing_hint=""), name=f"--hf-checkpoint {path}",
                                     source=file)
    check_expert_parallel(model, world=actor_gpus, tp=v["tensor_model_parallel_size"],
                          pp=v["pipeline_model_parallel_size"], ep=ep, etp=etp)


def _batches(v: dict[str, Any]) -> None:
    """Batches and steps (seed steps 1 and 31)."""
    actor_gpus = v["actor_num_nodes"] * v["actor_num_gpus_per_node"]
    tp, pp, cp = (v["tensor_model_parallel_size"], v["pipeline_model_parallel_size"],
                  v["context_parallel_size"])
    dp = actor_gpus // (tp * pp * cp)
    rbs, n = v["rollout_batch_size"], v["n_samples_per_prompt"]
    total = rbs * n
    steps, gbs = v["num_steps_per_rollout"], v["global_batch_size"]
    if steps is None and gbs is None:
        steps = 1
    if steps is not None:
        _need(total % steps == 0,
              f"--num-steps-per-rollout {steps} does not divide the {total} samples per rollout "
              f"(--rollout-batch-size {rbs} × --n-samples-per-prompt {n}); use a divisor of {total}")
        derived_gbs = total // steps
        _need(gbs is None or gbs == derived_gbs,
              f"--global-batch-size {gbs} contradicts --num-steps-per-rollout {steps}: {rbs} × {n} // "
              f"{steps} = {derived_gbs}; pass only one of the two")
        gbs = derived_gbs
    else:
        _need(gbs <= total and total % gbs == 0,
              f"--global-batch-size {gbs} does not divide the {total} samples per rollout "
              f"(--rollout-batch-size {rbs} × --n-samples-per-prompt {n}); use a divisor of {total}")
        steps = total // gbs
    v["num_steps_per_rollout"], v["global_batch_size"] = steps, gbs
    mbs = v["micro_batch_size"]
    _need(gbs % (mbs * dp) == 0,
          f"--global-batch-size {gbs} is not divisible by --micro-batch-size {mbs} × DP {dp} = "
          f"{mbs * dp} (DP = {actor_gpus} GPUs / (TP {tp} × PP {pp} × CP {cp})); every DP rank needs "
          f"the same number of micro-batches — change --micro-batch-size, the batch, or the parallelism")
    if v["over_sampling_batch_size"] is None:
        v["over_sampling_batch_size"] = rbs


def _lengths(v: dict[str, Any]) -> None:
    """Lengths (seed step 19)."""
    p, r, c = v["rollout_max_prompt_len"], v["rollout_max_response_len"], v["rollout_max_context_len"]
    _need(p + r <= c,
          f"--rollout-max-prompt-len {p} + --rollout-max-response-len {r} = {p + r} exceeds "
          f"--rollout-max-context-len {c}; raise the context to ≥ {p + r} or shorten prompt/response")
    e = v["eval_max_response_len"]
    _need(e is None or 1 <= e <= c - p, f"--eval-max-response-len {e} must lie in [1, --rollout-max-context-len "
                                        f"{c} - --rollout-max-prompt-len {p}]")
    _need(v["n_samples_per_eval_prompt"] >= 1, "--n-samples-per-eval-prompt must be ≥ 1")
    _need(v["eval_temperature"] is None or v["eval_temperature"] >= 0, "--eval-temperature must be ≥ 0")
    _need(v["eval_top_p"] is None or 0 < v["eval_top_p"] <= 1, "--eval-top-p must lie in (0, 1]")
    _need(v["max_num_batched_tokens"] >= v["max_num_seqs"],
          f"--max-num-batched-tokens {v['max_num_batched_tokens']} is below --max-num-seqs "
          f"{v['max_num_seqs']}; vLLM needs at least one token per running sequence per iteration")
    _need(0 < v["gpu_memory_utilization"] <= 1,
          f"--gpu-memory-utilization must lie in (0, 1], got {v['gpu_memory_utilization']}")


def _sampling(v: dict[str, Any]) -> None:
    """Sampling."""
    _need(v["rollout_temperature"] >= 0, f"--rollout-temperature must be ≥ 0, got {v['rollout_temperature']}")
    _need(0 < v["rollout_top_p"] <= 1, f"--rollout-top-p must lie in (0, 1], got {v['rollout_top_p']}")
    _need(v["rollout_top_k"] >= -1, f"--rollout-top-k must be -1 (off), 0 (off) or positive, got "
                                    f"{v['rollout_top_k']}")
    _need(v["score_centering_top_k"] >= 0,
          f"--score-centering-top-k must be ≥ 0, got {v['score_centering_top_k']}")
    _need(not (v["use_score_centering"] and v["rollout_top_p"] == 1 and v["score_centering_top_k"] < 1),
          "--use-score-centering with --rollout-top-p 1 needs --score-centering-top-k ≥ 1")


def _algorithm(v: dict[str, Any]) -> None:
    """Algorithm (seed steps 1, 40)."""
    eps = v["eps_clip"]
    _need(0 <= eps < 1, f"--eps-clip must lie in [0, 1), got {eps}")
    if v["eps_clip_high"] is None:
        v["eps_clip_high"] = eps
    _need(v["eps_clip_high"] >= 0, f"--eps-clip-high must be ≥ 0, got {v['eps_clip_high']}")
    _need(v["eps_clip_c"] is None or v["eps_clip_c"] > 1,
          f"--eps-clip-c {v['eps_clip_c']} must be > 1 (dual clip bounds the loss of negative advantages "
          f"at eps_clip_c × |A|); leave it out to disable dual clip")
    _need(v["kl_coef"] >= 0 and v["kl_loss_coef"] >= 0,
          f"--kl-coef {v['kl_coef']} and --kl-loss-coef {v['kl_loss_coef']} must be ≥ 0")
    _need(v["clip_grad"] >= 0 and v["weight_decay"] >= 0 and v["entropy_coef"] >= 0,
          "--clip-grad, --weight-decay and --entropy-coef must be ≥ 0")
    for beta in ("adam_beta1", "adam_beta2"):
        _need(0 <= v[beta] < 1, f"{_flags_of(beta)} must lie in [0, 1), got {v[beta]}")
    _need(v["adam_eps"] > 0, f"--adam-eps must be > 0, got {v['adam_eps']}")
    _need(0 <= v["tis_clip_low"] < v["tis_clip"],
          f"--tis-clip-low {v['tis_clip_low']} must be ≥ 0 and below --tis-clip {v['tis_clip']}")
    _need(not (v["use_tis"] and v["advantage_estimator"] == "gspo"),
          "--use-tis weights token-level losses; GSPO's loss is per sequence: drop --use-tis or use grpo/cispo")
    _need(not (v["kl_coef"] > 0 and v["advantage_estimator"] != "reinforce_plus_plus_baseline"),
          f"--kl-coef {v['kl_coef']} shapes the reward of --advantage-estimator reinforce_plus_plus_baseline; with "
          f"{v['advantage_estimator']} use --use-kl-loss --kl-loss-coef")
    _need(not (v["kl_loss_coef"] > 0 and not v["use_kl_loss"]),
          f"--kl-loss-coef {v['kl_loss_coef']} does nothing without --use-kl-loss; add it")
    _need(v["ref_load"] is None or v["use_kl_loss"] or v["kl_coef"] > 0,
          "--ref-load gives the reference of a KL term; add --use-kl-loss (or --kl-coef with "
          "reinforce_plus_plus_baseline)")
    _need(v["ref_placement"] == "gpu" or v["use_kl_loss"] or v["kl_coef"] > 0,
          f"--ref-placement {v['ref_placement']} places the reference of a KL term; add --use-kl-loss (or --kl-coef "
          "with reinforce_plus_plus_baseline)")
    # what no backend trains yet: refused rather than silently trained as something else
    for name, alternative in NOT_IMPLEMENTED.items():
        _need(not v[name], f"{_flags_of(name)} is not implemented (neither the real trainer nor the simulator "
                           f"has it); {alternative}")
    _need(v["loss_type"] == "policy_loss", f"--loss-type {v['loss_type']} is not implemented (neither the real trainer "
                                           f"nor the simulator has it); use policy_loss")


def _sim_inputs(v: dict[str, Any]) -> None:
    """Simulation inputs."""
    p, r = v["rollout_max_prompt_len"], v["rollout_max_response_len"]
    for name, cap, default_fn in (("response_length", r, default_response_spec),
                                  ("prompt_length", p, default_prompt_spec)):
        spec = v[name]
        flag = _flags_of(name)
        if spec is None:
            spec = default_fn(cap)
        elif isinstance(spec, str):
            spec = parse_length_spec(spec, flag=flag, cap=cap)
        else:
            spec = dataclasses.replace(spec, cap=cap)
        limit_flag = "--rollout-max-response-len" if name == "response_length" else "--rollout-max-prompt-len"
        if spec.kind in ("fixed", "uniform"):
            _need(max(spec.params) <= cap,
                  f"{flag} {spec} draws lengths up to {int(max(spec.params))}, above {limit_flag} {cap}; "
                  f"lower the spec or raise {limit_flag}")
        if spec.kind == "trace":
            _need(spec.path is not None and os.path.isfile(spec.path.partition("#")[0]),
                  f"{flag} {spec}: trace file not found; give an existing JSONL file")
        v[name] = spec
    for name in ("hardware", "model"):
        val = v[name]
        _need(isinstance(val, str) and val.strip() != "", f"{_flags_of(name)} must not be empty")
        if val.endswith(".json"):
            _need(os.path.isfile(val), f"{_flags_of(name)} {val}: file not found; give a preset name or "
                                       f"an existing JSON file")


def _divisor_near(n: int, want: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - want), d))


def _faults(v: dict[str, Any], engines: int) -> None:
    """--fault specs against the run they are injected into (engines, rollouts, backend)."""
    from vime.faults import check_faults

    v["fault"] = tuple(v["fault"] or ())
    check_faults(v["fault"], engines=engines, num_rollout=v["num_rollout"], start_rollout_id=v["start_rollout_id"],
                 backend=v["backend"], offload_rollout=bool(v["offload_rollout"]))


#: samples one simulation may generate (prompts × samples per prompt × rollouts): the simulator holds a
#: rollout's samples in memory, and steady-state steps repeat, so fewer say the same
MAX_SIM_SAMPLES = 10**7


def _sim_size(v: dict[str, Any]) -> None:
    """A simulation of absurd size is refused up front instead of starting silently."""
    if v["backend"] != "sim":
        return
    n = v["rollout_batch_size"] * v["n_samples_per_prompt"] * max(1, v["num_rollout"])
    _need(n <= MAX_SIM_SAMPLES,
          f"--rollout-batch-size {v['rollout_batch_size']} × --n-samples-per-prompt {v['n_samples_per_prompt']} × "
          f"--num-rollout {v['num_rollout']} = {n:,} simulated samples, above the simulator's limit of "
          f"{MAX_SIM_SAMPLES:,} (it holds a rollout's samples in memory); steps repeat in steady state, so simulate "
          f"fewer rollouts (--num-rollout 1) or a smaller batch")
