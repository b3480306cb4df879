"""Rules for the flags whose effect depends on the backend: what `--backend real` refuses, Megatron's precision and
sequence parallelism, --num-epoch, the vLLM pass-through (called from `vime.config.rules.resolve`)."""

from __future__ import annotations

import os
from typing import Any

from vime.config.options import _flags_of
from vime.config.passthrough import check_vllm_args
from vime.errors import ConfigError

#: simulator inputs: on --backend real only --compare-sim's simulation reads them
SIM_INPUTS = ("hardware", "model", "response_length", "prompt_length", "moe_load_imbalance")


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def check_backend(v: dict[str, Any], given: set[str]) -> None:
    """Flags that would parse and do nothing on the backend chosen are refused here, naming what to use."""
    check_vllm_args(v["vllm_extra_args"], v["backend"])
    _need(not (v["bf16"] and v["fp16"]), "--bf16 and --fp16 both set the trainer's precision; give one")
    tp = v["tensor_model_parallel_size"]
    _need(not (v["sequence_parallel"] and tp == 1),
          "--sequence-parallel splits activations over the tensor-parallel ranks, and --tensor-model-parallel-size "
          "is 1; drop --sequence-parallel or raise --tensor-model-parallel-size")
    if v["backend"] != "real":
        if v["sequence_parallel"] is None:
            v["sequence_parallel"] = tp > 1
        return
    # Megatron's local layer spec (torch norms; no TransformerEngine or Apex), which the real trainer builds,
    # asserts sequence_parallel off: "sequence parallel not supported by torch LayerNorm"
    _need(not v["sequence_parallel"], "--sequence-parallel: the real Megatron trainer (--backend real) builds "
                                      "Megatron's local layer spec, whose torch norms cannot run sequence-parallel; "
                                      "drop it (or model it with `vime simulate` / --backend sim)")
    v["sequence_parallel"] = False
    for name in ("pipeline_model_parallel_size", "context_parallel_size"):
        _need(v[name] == 1, f"{_flags_of(name)} {v[name]}: the real Megatron trainer (--backend real) runs TP × DP "
                            f"only; set it to 1 and use --tensor-model-parallel-size, or model it with "
                            f"`vime simulate` / --backend sim")
    for name in SIM_INPUTS:
        _need(name not in given or v["compare_sim"],
              f"{_flags_of(name)} is a simulator input; --backend real reads it only for --compare-sim's simulation: "
              f"add --compare-sim --report FILE.html, drop it, or use --backend sim")


def resolve_num_epoch(v: dict[str, Any], given: set[str]) -> None:
    """--num-epoch N: --num-rollout = N × (prompts in --prompt-data // --rollout-batch-size), as slime computes it
    (the prompts are the file's non-blank lines, before the length filter drops any)."""
    epochs = v["num_epoch"]
    if epochs is None:
        return
    _need("num_rollout" not in given, f"--num-epoch {epochs} sets --num-rollout from the dataset size; give one of "
                                      f"the two")
    path = v["prompt_data"]
    _need(path is not None and os.path.isfile(path),
          f"--num-epoch {epochs} counts the prompts of --prompt-data, which is not given; pass --prompt-data FILE.jsonl "
          f"or --num-rollout N")
    with open(path, "rb") as fh:
        prompts = sum(1 for line in fh if line.strip())
    per_epoch = prompts // v["rollout_batch_size"]
    _need(per_epoch >= 1, f"--num-epoch {epochs}: --prompt-data {path} has {prompts} prompts, fewer than one "
                          f"--rollout-batch-size {v['rollout_batch_size']}; lower the batch or use --num-rollout")
    v["num_rollout"] = epochs * per_epoch
