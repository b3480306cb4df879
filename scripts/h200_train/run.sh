#!/usr/bin/env bash
# `vime train --backend real` on a lent H200 machine of 1, 2 or 8 GPUs, then `vime simulate` with the same
# arguments on the measured H200 profile, and the error per phase (issues 9, 20). One recipe for any GPU
# count: the same parts (scripts/h200_train/prepare.sh), the layout from GPUS.
#   bash scripts/h200_train/run.sh prep     after the shipping calls (this call carries the last parts): check
#                                           and unpack the parts, install to /tmp/site and /tmp/vllm/site, build
#                                           the models and the prompts, the GPU unit tests, `--dry-run`
#   bash scripts/h200_train/run.sh run      (prep first if not done) one training run with nvidia-smi memory
#                                           sampled every 0.5 s, then `vime simulate` with the same arguments,
#                                           then compare.py; results in $OUT/$TAG.tgz + $OUT/$TAG.txt
#   bash scripts/h200_train/run.sh exec CMD...   CMD under the run's environment (PYTHONPATH, vLLM's env), after prep
#   bash scripts/h200_train/run.sh --print-args [MODEL_DIR PROMPTS]   the arguments `vime simulate` gets,
#   bash scripts/h200_train/run.sh --print-train-args [MODEL_DIR PROMPTS]   those of `vime train` (no simulator inputs),
#   bash scripts/h200_train/run.sh --print-train-only                  and those only `vime train` gets (one a line)
# Knobs (environment):
#   GPUS        1 | 2 | 8 (default 1): colocated on all of them; trainer TP = GPUS for 1-2 GPUs, TP 2 x DP 4 on
#               8 (the seed's layout); one engine per TP group of GPUs
#   MODEL       qwen3-4b (default) | qwen3-1.7b | qwen3-0.6b: the real shapes, 151 936-token vocabulary, no tokenizer;
#               seed: the 0.45 B model with an 8192-token tokenizer (scripts/h200_train/seed_model.py);
#               qwen3-30b-a3b-4l: Qwen3-30B-A3B's MoE body with 4 layers (3.1 B params, 128 experts, top-8)
#   OFFLOAD     cumem (default) | torch_memory_saver: --train-offload-backend
#   MBS         --micro-batch-size (default 2 for qwen3-4b, else 8: 4 x 1152 tokens of the 4B model ran out of
#               memory on the H200 in the first lease, and with fp32 grads and the process memory the simulator says so)
#   RESPONSE_LEN (default 1024): the response cap, which every response reaches (no EOS)
#   QUIET       1: no nvidia-smi or /metrics sampling during the run (no memory comparison then)
#   PREP_TESTS  0: prep without the GPU unit tests (a machine re-prepared mid-lease)
#   HARDWARE (the profile `vime simulate` gets; default H200-141G-measured), NUM_ROLLOUT (default 3), TRAIN_TIMEOUT (s, default 520), EXTRA_ARGS (appended to both commands),
#   TAG         name of this run's outputs (default $MODEL-$OFFLOAD-${GPUS}g)
# Output ($OUT): $TAG.txt (compare's table and the run's last log lines) and $TAG.tgz with train.jsonl (the
# JSON step reports, with wall_time), train_stderr.log, gpu_mem.csv (epoch,gpu,used MiB), gpu_procs.csv (epoch,pid,used MiB), sim.json,
# compare.json, the server/router log tails; prep writes prep.txt.
set -u
cd "$(dirname "$0")/../.."
REPO=$PWD
W=/tmp/vime-train
PROMPT_LEN=128
GPUS=${GPUS:-1}
MODEL=${MODEL:-qwen3-4b}
OFFLOAD=${OFFLOAD:-cumem}
NUM_ROLLOUT=${NUM_ROLLOUT:-3}
case "$MODEL" in
  qwen3-4b) MBS=${MBS:-2}; VOCAB=151936 ;;
  qwen3-0.6b) MBS=${MBS:-8}; VOCAB=151936 ;;
  qwen3-1.7b) MBS=${MBS:-4}; VOCAB=151936 ;;
  qwen3-30b-a3b-4l) MBS=${MBS:-4}; VOCAB=151936 ;;
  seed) MBS=${MBS:-8}; VOCAB=8192 ;;
  *) echo "MODEL=$MODEL: use qwen3-4b, qwen3-1.7b, qwen3-0.6b, qwen3-30b-a3b-4l or seed" >&2; exit 2 ;;
esac
case "$GPUS" in
  1) TP=1 ;;
  2) TP=2 ;;
  8) TP=2 ;;
  *) echo "GPUS=$GPUS: use 1, 2 or 8" >&2; exit 2 ;;
esac
TAG=${TAG:-$MODEL-$OFFLOAD-${GPUS}g}
MODEL_DIR=$W/models/$MODEL
PROMPTS=$W/toy-$VOCAB.jsonl

# The run: colocated on every GPU, trainer TP x DP, one vLLM engine per TP group behind vllm-router, GRPO,
# 32 prompts x 8 samples, responses <= 1024 tokens, CUDA-IPC weight sync. The simulator-only flags (--model,
# --hardware, --response-length) describe the same run to `vime simulate`, which takes the prompt lengths from
# --prompt-data; a random model rarely samples EOS (and a tokenizer-less one has none), so responses are
# modelled at the cap.
run_args() {
  COMMON=(
    --colocate --actor-num-nodes 1 --actor-num-gpus-per-node "$GPUS"
    --tensor-model-parallel-size "$TP" --pipeline-model-parallel-size 1 --context-parallel-size 1
    --rollout-num-gpus "$GPUS" --rollout-num-gpus-per-engine "$TP"
    --rollout-batch-size 32 --n-samples-per-prompt 8
    --rollout-max-prompt-len 512 --rollout-max-response-len "${RESPONSE_LEN:-1024}" --rollout-max-context-len 4096
    --advantage-estimator grpo --num-rollout "$NUM_ROLLOUT" --micro-batch-size "$MBS" --seed 1
    --update-weight-mode tensor --train-offload-backend "$OFFLOAD"
    --hf-checkpoint "$1" --prompt-data "$2"
  )
  # simulator inputs: `vime train --backend real` refuses them (they would act only with --compare-sim)
  SIM_ONLY=(
    --model "$1/config.json" --hardware "${HARDWARE:-H200-141G-measured}"
    --response-length "fixed:${RESPONSE_LEN:-1024}"
  )
  ARGS=("${COMMON[@]}" "${SIM_ONLY[@]}" --json)  # what `vime simulate` gets
  TRAIN_ARGS=("${COMMON[@]}" --json)
  # shellcheck disable=SC2206  # EXTRA_ARGS is a flag list by design
  [ -n "${EXTRA_ARGS:-}" ] && ARGS+=(${EXTRA_ARGS}) && TRAIN_ARGS+=(${EXTRA_ARGS})
  # The toy task's reward reads each prompt's label; the simulator's synthetic prompts have none (and it
  # models the reward's time, not its value), so only `vime train` gets it.
  TRAIN_ONLY=(--custom-rm-path vime.rollout.toy_task.target_fraction_reward)
  return 0
}

if [ "${1:-}" = "--print-args" ] || [ "${1:-}" = "--print-train-args" ] || [ "${1:-}" = "--print-train-only" ]; then
  run_args "${2:-$MODEL_DIR}" "${3:-$PROMPTS}"
  case "$1" in
    --print-args) printf '%s\n' "${ARGS[@]}" ;;
    --print-train-args) printf '%s\n' "${TRAIN_ARGS[@]}" ;;
    *) printf '%s\n' "${TRAIN_ONLY[@]}" ;;
  esac
  exit 0
fi

export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/vime-out}
mkdir -p "$OUT" $W
# Never NVLink multicast on these hosts (KINDS.md); vLLM 0.25.1 without flashinfer (shared/device/vllm-0.25.1-h200.md).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export VLLM_USE_FLASHINFER_SAMPLER=0 TVM_FFI_DISABLE_TORCH_C_DLPACK=1 VLLM_FLASH_ATTN_VERSION=3 VLLM_SERVER_DEV_MODE=1
export VIME_VLLM_START_TIMEOUT=${VIME_VLLM_START_TIMEOUT:-360}
export PATH=/tmp/site/bin:$PATH
# vime runs from the checkout that travels with the call; /tmp/site before /tmp/vllm/site: the real ray
# there, not prepare_vllm.sh's stand-in
export PYTHONPATH=$REPO:/tmp/site:/tmp/vllm/site

prep() {
  local t0; t0=$(date +%s)
  bash scripts/h200_train/ship.sh || return 3
  nvidia-smi --query-gpu=index,name,memory.total,memory.used,driver_version --format=csv
  bash scripts/h200_train/parts.sh verify /tmp/trparts tr || return 3
  if [ ! -f /tmp/site/.tr-wheels-ok ]; then
    bash scripts/h200_train/parts.sh unpack /tmp/trparts tr $W/stage || return 3
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      $W/stage/wheels/*.whl || { echo "WHEEL INSTALL FAILED"; return 4; }
    touch /tmp/site/.tr-wheels-ok
  fi
  echo "vime checkout $(git rev-parse HEAD 2>/dev/null) $(git status --short 2>/dev/null | wc -l) changed files"
  # shellcheck source=../h200/unpack_vllm.sh
  source scripts/h200/unpack_vllm.sh || return $?
  for m in ${PREP_MODELS:-qwen3-0.6b qwen3-4b}; do
    if [ ! -f $W/models/$m/config.json ] || ! ls $W/models/$m/*.safetensors >/dev/null 2>&1; then
      local t1; t1=$(date +%s)
      if [ "$m" = seed ]; then python3 scripts/h200_train/seed_model.py build $W/models/$m || return 5
      else python3 scripts/h200_train/seed_model.py build $W/models/$m --preset $m || return 5; fi
      echo "built $m in $(( $(date +%s) - t1 )) s: $(du -sh $W/models/$m | cut -f1)"
    fi
  done
  for v in 151936 8192; do
    [ -f $W/toy-$v.jsonl ] || python3 -m vime.rollout.toy_task $W/toy-$v.jsonl --vocab-size $v --num-prompts 256 \
      --prompt-len $PROMPT_LEN || return 5
  done
  python3 -c "
import torch, vllm, ray, megatron.core, vime, simpy, torch_memory_saver
n = torch.cuda.device_count()
assert n >= $GPUS, f'{n} GPUs, need $GPUS'
print('torch', torch.__version__, 'vllm', vllm.__version__, 'ray', ray.__version__, 'megatron-core',
      megatron.core.__version__, 'vime', vime.__file__, 'gpus', n)" || return 6
  vllm-router --help >/dev/null || { echo "vllm-router does not run"; return 6; }
  # The GPU unit tests (one in-process Megatron rank with the CuMem allocator, the allocator, IPC export):
  # minutes cheaper to fail here than inside the run. No -x: one failing case must not hide the others (2026-12-02).
  # PREP_TESTS=0 leaves them out (a machine lost mid-lease: they passed on it minutes before)
  [ "${PREP_TESTS:-1}" = 0 ] || timeout 240 python3 -m pytest -c scripts/h200/pytest-gpu.ini --rootdir . -m gpu -q \
    tests/real/megatron/test_megatron_actor_gpu.py tests/real/test_cumem_gpu.py tests/real/test_ipc_weights_gpu.py \
    2>&1 | tail -15
  run_args $MODEL_DIR $PROMPTS
  python3 -m vime.cli train --backend real "${TRAIN_ARGS[@]}" "${TRAIN_ONLY[@]}" --dry-run > "$OUT/dry_run.json" || return 7
  touch $W/.prep-ok
  echo "prep done in $(( $(date +%s) - t0 )) s"
}

run() {
  [ -f $W/.prep-ok ] || prep || return $?
  run_args $MODEL_DIR $PROMPTS
  local R=$W/runs/$TAG
  rm -rf "$R" && mkdir -p "$R/logs"
  export VIME_LOG_DIR=$R/logs
  # The host's single-thread speed, on a quiet machine before the samplers start: host-bound phases moved
  # 20-40 % between leases of one device kind (issue 17).
  python3 bench/host_probe.py --out "$R/host.json" > /dev/null 2>&1 || echo "host probe failed" >&2
  # One probe proved noisy (1.8x on one host at load 1.2, the sixth lease): what else ran then, and a second probe after.
  ps -eo pid,pcpu,rss,etime,comm --sort=-pcpu | head -12 > "$R/ps_before.txt"
  # QUIET=1: none of the three samplers below (nvidia-smi twice a second, twice; /metrics four times a second): the
  # A/B test of whether they slow vLLM's host-bound step inside a whole step (h200_notes.md, thirteenth session)
  local sampler= procs= scraper=
  if [ "${QUIET:-0}" != 1 ]; then
  (while :; do
     t=$(date +%s.%N)
     nvidia-smi --query-gpu=index,memory.used --format=csv,noheader,nounits | sed "s/^/$t,/; s/, /,/g"
     sleep 0.5
   done) > "$R/gpu_mem.csv" 2>/dev/null &
  sampler=$!
  # Per process (epoch,pid,used MiB): the trainer's resident bytes apart from the engine's (issue 25).
  (while :; do
     t=$(date +%s.%N)
     nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | sed "s/^/$t,/; s/, /,/g"
     sleep 0.5
   done) > "$R/gpu_procs.csv" 2>/dev/null &
  procs=$!
  # vLLM's own counters (decode iteration time, requests running) beside the client's view of the rollout (issue 17).
  python3 scripts/h200_train/scrape_metrics.py "$R/train.jsonl" "$R/vllm_metrics.jsonl" 2>"$R/scrape.err" &
  scraper=$!
  fi
  echo "+ vime train --backend real ${TRAIN_ARGS[*]} ${TRAIN_ONLY[*]}" | tee "$R/command.txt"
  set -o pipefail
  timeout -k 30 "${TRAIN_TIMEOUT:-520}" python3 -m vime.cli train --backend real "${TRAIN_ARGS[@]}" "${TRAIN_ONLY[@]}" \
     2> "$R/train_stderr.log" | python3 scripts/h200_train/compare.py stamp | tee "$R/train.jsonl"
  local rc=$?
  set +o pipefail
  [ -z "$sampler$procs$scraper" ] || kill $sampler $procs $scraper 2>/dev/null
  echo "vime train exit $rc"
  ps -eo pid,pcpu,rss,etime,comm --sort=-pcpu | head -12 > "$R/ps_after.txt"
  python3 bench/host_probe.py --out "$R/host_after.json" > /dev/null 2>&1 || echo "host probe failed" >&2
  python3 -m vime.cli simulate "${ARGS[@]}" > "$R/sim.json" || echo "vime simulate failed"
  {
    echo "$TAG: vime train exit $rc"
    local mem=()
    [ -f "$R/gpu_mem.csv" ] && mem=(--mem "$R/gpu_mem.csv")  # QUIET=1 runs sample no memory
    python3 scripts/h200_train/compare.py compare --train "$R/train.jsonl" --sim "$R/sim.json" \
      "${mem[@]}" --out "$R/compare.json"
    echo "--- last lines of train_stderr.log"
    grep -v "^\s*$" "$R/train_stderr.log" | tail -n 40
  } > "$OUT/$TAG.txt" 2>&1
  cat "$OUT/$TAG.txt"
  for f in "$R"/logs/*; do [ -f "$f" ] && tail -c 3000000 "$f" > "$f.tail" && mv "$f.tail" "$f"; done
  tail -c 8000000 "$R/train_stderr.log" > "$R/t" && mv "$R/t" "$R/train_stderr.log"
  # Gzipped as bench/data keeps it (fit_whole_step.engine_metrics reads either).
  [ -f "$R/vllm_metrics.jsonl" ] && gzip -9 -n "$R/vllm_metrics.jsonl"
  tar czf "$OUT/$TAG.tgz" -C $W/runs "$TAG"
  nvidia-smi --query-gpu=index,memory.used --format=csv
  return $rc
}

case "${1:-run}" in
  prep) prep 2>&1 | tee "$OUT/prep.txt"; exit "${PIPESTATUS[0]}" ;;
  run) run ;;
  all) prep && run ;;
  exec) shift; "$@" ;;  # any command under the run's environment (after prep): vllm_bench.py, megatron_step.py
  *) echo "usage: run.sh prep|run|all|exec CMD...|--print-args|--print-train-only [MODEL_DIR PROMPTS]" >&2; exit 2 ;;
esac
