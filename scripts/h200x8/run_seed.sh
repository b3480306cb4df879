#!/usr/bin/env bash
# The seed scenario for real on the nvidia-h200-x8 machine (issue 9), and the simulator's error at that scale.
#   bash scripts/h200x8/run_seed.sh prep    after the shipping calls (this call carries the last parts):
#                                          check and unpack the parts, install to /tmp/site and /tmp/vllm/site,
#                                          build the model and the prompts, check imports and `--dry-run`
#   bash scripts/h200x8/run_seed.sh run     (prep first if not done) `vime train --backend real` for 3 rollouts
#                                          with nvidia-smi memory sampled every 0.5 s, then `vime simulate`
#                                          with the same arguments, then compare.py: per-phase error in $OUT
#   bash scripts/h200x8/run_seed.sh all     prep + run in one call (only if the call's 10 minutes suffice)
#   bash scripts/h200x8/run_seed.sh --print-args [MODEL_DIR PROMPTS]   the arguments train and simulate share,
#   bash scripts/h200x8/run_seed.sh --print-train-only                  and those only `vime train` gets (one a line)
# Output ($OUT, at most 8 files): train.jsonl (the JSON step reports, with wall_time), train_stderr.log,
# gpu_mem.csv (epoch,gpu,used MiB), sim.json, compare.json, compare.txt, logs.tgz (server/router log tails).
# Knobs: TRAIN_TIMEOUT (s, default 500), VIME_SRC=checkout|wheel (which vime runs; default the checkout
# that travels with the call), EXTRA_ARGS (appended to both commands, e.g. "--gpu-memory-utilization 0.8").
set -u
cd "$(dirname "$0")/../.."
REPO=$PWD
W=/tmp/x8
MODEL=$W/model
PROMPTS=$W/toy.jsonl
PROMPT_LEN=128
VOCAB=8192  # scripts/h200x8/seed_model.py SPEC

# The seed scenario (seed section 0): colocated, Megatron TP 2 x DP 4 on 8 GPUs, 4 vLLM engines of 2 GPUs
# behind vllm-router, GRPO, 32 prompts x 8 samples, responses <= 1024 tokens, 3 rollouts, CUDA-IPC weight
# sync. The simulator-only flags (--model, --hardware, --*-length) describe the same run to `vime simulate`;
# a random model rarely samples EOS, so responses are modelled at the cap.
seed_args() {
  ARGS=(
    --colocate --actor-num-nodes 1 --actor-num-gpus-per-node 8
    --tensor-model-parallel-size 2 --pipeline-model-parallel-size 1 --context-parallel-size 1
    --rollout-num-gpus 8 --rollout-num-gpus-per-engine 2
    --rollout-batch-size 32 --n-samples-per-prompt 8
    --rollout-max-prompt-len 512 --rollout-max-response-len 1024 --rollout-max-context-len 4096
    --advantage-estimator grpo --num-rollout 3 --micro-batch-size 8 --seed 1
    --update-weight-mode tensor
    --hf-checkpoint "$1" --prompt-data "$2"
    --model "$1/config.json" --hardware "$REPO/bench/data/H200-141G-measured.json"
    --prompt-length "fixed:$PROMPT_LEN" --response-length fixed:1024
    --json
  )
  # shellcheck disable=SC2206  # EXTRA_ARGS is a flag list by design
  [ -n "${EXTRA_ARGS:-}" ] && ARGS+=(${EXTRA_ARGS})
  # The toy task's reward reads each prompt's label; the simulator's synthetic prompts have none (and it
  # models the reward's time, not its value), so only `vime train` gets it.
  TRAIN_ONLY=(--custom-rm-path vime.rollout.toy_task.target_fraction_reward)
  return 0
}

if [ "${1:-}" = "--print-args" ] || [ "${1:-}" = "--print-train-only" ]; then
  seed_args "${2:-$MODEL}" "${3:-$PROMPTS}"
  if [ "$1" = "--print-args" ]; then printf '%s\n' "${ARGS[@]}"; else printf '%s\n' "${TRAIN_ONLY[@]}"; fi
  exit 0
fi

export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/vime-out}
mkdir -p "$OUT" $W
# Never NVLink multicast on these hosts (KINDS.md); vLLM 0.25.1 without flashinfer (shared/device/vllm-0.25.1-h200.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0 TVM_FFI_DISABLE_TORCH_C_DLPACK=1 VLLM_FLASH_ATTN_VERSION=3 VLLM_SERVER_DEV_MODE=1
export VIME_LOG_DIR=$W/logs VIME_VLLM_START_TIMEOUT=${VIME_VLLM_START_TIMEOUT:-360}
export PATH=/tmp/site/bin:$PATH
# /tmp/site before /tmp/vllm/site: the real ray there, not prepare_vllm.sh's stand-in
if [ "${VIME_SRC:-checkout}" = wheel ]; then
  export PYTHONPATH=/tmp/site:/tmp/vllm/site
  RUNDIR=$W
else
  export PYTHONPATH=$REPO:/tmp/site:/tmp/vllm/site
  RUNDIR=$REPO
fi

prep() {
  local t0; t0=$(date +%s)
  bash scripts/h200x8/ship.sh || return 3
  nvidia-smi --query-gpu=index,name,memory.total,memory.used --format=csv
  bash scripts/h200x8/parts.sh verify /tmp/x8parts x8 || return 3
  if [ ! -f /tmp/site/.x8-wheels-ok ]; then
    bash scripts/h200x8/parts.sh unpack /tmp/x8parts x8 $W/stage || return 3
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      $W/stage/wheels/*.whl || { echo "WHEEL INSTALL FAILED"; return 4; }
    touch /tmp/site/.x8-wheels-ok
  fi
  echo "vime wheel from commit $(cat $W/stage/VIME_COMMIT 2>/dev/null); checkout $(git rev-parse HEAD 2>/dev/null)"
  # shellcheck source=../h200/unpack_vllm.sh
  source scripts/h200/unpack_vllm.sh || return $?
  if [ ! -f $MODEL/vime_tiny_model.json ]; then
    python3 scripts/h200x8/seed_model.py build $MODEL || return 5
  fi
  [ -f $PROMPTS ] || python3 -m vime.rollout.toy_task $PROMPTS --vocab-size $VOCAB --num-prompts 256 \
    --prompt-len $PROMPT_LEN || return 5
  python3 -c "
import torch, vllm, ray, megatron.core, vime, simpy
assert torch.cuda.device_count() == 8, f'{torch.cuda.device_count()} GPUs, need 8'
print('torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'megatron-core',
      megatron.core.__version__, 'vime', vime.__file__)" || return 6
  vllm-router --help >/dev/null || { echo "vllm-router does not run"; return 6; }
  seed_args $MODEL $PROMPTS
  (cd $RUNDIR && python3 -m vime.cli train --backend real "${ARGS[@]}" "${TRAIN_ONLY[@]}" --dry-run) > "$OUT/dry_run.txt" || return 7
  touch $W/.prep-ok
  echo "prep done in $(( $(date +%s) - t0 )) s"
}

run() {
  [ -f $W/.prep-ok ] || prep || return $?
  seed_args $MODEL $PROMPTS
  (while :; do
     t=$(date +%s.%N)
     nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits | sed "s/^/$t,/; s/, /,/g"
     sleep 0.5
   done) > "$OUT/gpu_mem.csv" 2>/dev/null &
  local sampler=$!
  echo "+ vime train --backend real ${ARGS[*]} ${TRAIN_ONLY[*]}"
  set -o pipefail
  (cd $RUNDIR && timeout -k 30 "${TRAIN_TIMEOUT:-500}" python3 -m vime.cli train --backend real "${ARGS[@]}" \
     "${TRAIN_ONLY[@]}" 2> $W/train.stderr) | python3 scripts/h200x8/compare.py stamp | tee "$OUT/train.jsonl"
  local rc=$?
  set +o pipefail
  kill $sampler 2>/dev/null
  echo "vime train exit $rc"
  tail -c 8000000 $W/train.stderr > "$OUT/train_stderr.log"
  tail -n 30 $W/train.stderr
  (cd $RUNDIR && python3 -m vime.cli simulate "${ARGS[@]}") > "$OUT/sim.json" || echo "vime simulate failed"
  python3 scripts/h200x8/compare.py compare --train "$OUT/train.jsonl" --sim "$OUT/sim.json" \
    --mem "$OUT/gpu_mem.csv" --out "$OUT/compare.json" | tee "$OUT/compare.txt"
  local crc=${PIPESTATUS[0]}
  mkdir -p $W/logtail
  for f in $W/logs/*; do [ -f "$f" ] && tail -c 2000000 "$f" > "$W/logtail/$(basename "$f")"; done
  tar czf "$OUT/logs.tgz" -C $W logtail 2>/dev/null
  nvidia-smi --query-gpu=index,memory.used --format=csv
  [ $rc = 0 ] && return $crc || return $rc
}

case "${1:-run}" in
  prep) prep ;;
  run) run ;;
  all) prep && run ;;
  *) echo "usage: run_seed.sh prep|run|all|--print-args|--print-train-only [MODEL_DIR PROMPTS]" >&2; exit 2 ;;
esac
