#!/usr/bin/env bash
# The nineteenth session's probe runs (bench/data/vmm_sweep/predicted_s19_step_traffic.json): vLLM's pool woken with
# the step's traffic around it. Needs the vLLM parts shipped (scripts/h200/unpack_vllm.sh) and the zstandard wheel
# unpacked into /tmp/site. Writes $OUT/h200_s19_<name>.json, one process per run.
set -u
cd "$(dirname "$0")/../.."
source scripts/h200/unpack_vllm.sh || exit $?
export PYTHONPATH=$PWD:/tmp/site:/tmp/vllm/site
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv
probe() {
  local name=$1; shift
  echo "== $name: $*"
  timeout 200 python3 bench/vllm_cumem_probe.py "$@" --out "$OUT/h200_s19_$name.json" 2>&1 | grep -v "^INFO\|Warning" | tail -12
}
W06="--size 124.23 --chunks 28 --weights-gib 1.1 --weight-tensors 311 --level 2"
W4B="--size 117.25 --chunks 36 --weights-gib 7.5 --weight-tensors 399 --level 2"
for name in ${RUNS:-06b_leftover 06b_trainer 4b_leftover 4b_trainer moe_leftover moe_trainer 06b_release}; do
  case $name in
    06b_leftover) probe $name $W06 --neighbour-gib 6 --settles 0.5,10 --repeats 2 ;;
    06b_trainer) probe $name $W06 --neighbour-gib 6 --neighbour-cycle-gib 86 --settles 0.5,10 --repeats 2 ;;
    4b_leftover) probe $name $W4B --neighbour-gib 7.4 --settles 0.5 --repeats 3 ;;
    4b_trainer) probe $name $W4B --neighbour-gib 7.4 --neighbour-cycle-gib 108 --settles 0.5 --repeats 3 ;;
    moe_leftover) probe $name --size 118.39 --chunks 4 --weights-gib 5.8 --weight-tensors 39 --level 2 \
                   --neighbour-gib 6.8 --settles 0.5 --repeats 3 ;;
    moe_trainer) probe $name --size 118.39 --chunks 4 --weights-gib 5.8 --weight-tensors 39 --level 2 \
                   --neighbour-gib 6.8 --neighbour-cycle-gib 65 --settles 0.5 --repeats 3 ;;
    06b_release) probe $name $W06 --release-before-kv-mib 1024 --settles 0.5,10 --repeats 2 ;;
    06b_trainer_d01) probe $name $W06 --neighbour-gib 6 --neighbour-cycle-gib 86 --kv-delay-s 0.1 --settles 0.5 --repeats 2 ;;
    06b_trainer_d05) probe $name $W06 --neighbour-gib 6 --neighbour-cycle-gib 86 --kv-delay-s 0.5 --settles 0.5 --repeats 2 ;;
    06b_trainer_d2) probe $name $W06 --neighbour-gib 6 --neighbour-cycle-gib 86 --kv-delay-s 2 --settles 0.5 --repeats 2 ;;
    06b_cycle40) probe $name $W06 --neighbour-gib 6 --neighbour-cycle-gib 40 --settles 0.5 --repeats 2 ;;
    small_trainer) probe $name --size 20 --chunks 28 --weights-gib 1.1 --weight-tensors 311 --level 2 --neighbour-gib 6 \
                     --neighbour-cycle-gib 86 --settles 0.5 --repeats 2 ;;
    4b_trainer_d05) probe $name $W4B --neighbour-gib 7.4 --neighbour-cycle-gib 108 --kv-delay-s 0.5 --settles 0.5 --repeats 2 ;;
    06b_vime) probe $name $W06 --neighbour-gib 6 --neighbour-cycle-gib 86 --give-back-before weights --kv-delay-s 0.25 --settles 0.5 --repeats 3 ;;
    06b_vime_d0) probe $name $W06 --neighbour-gib 6 --neighbour-cycle-gib 86 --give-back-before weights --settles 0.5 --repeats 3 ;;
    4b_vime) probe $name $W4B --neighbour-gib 7.4 --neighbour-cycle-gib 108 --give-back-before weights --kv-delay-s 0.44 --settles 0.5 --repeats 3 ;;
    moe_vime) probe $name --size 118.39 --chunks 4 --weights-gib 5.8 --weight-tensors 39 --level 2 --neighbour-gib 6.8 \
                --neighbour-cycle-gib 65 --give-back-before weights --kv-delay-s 0.95 --settles 0.5 --repeats 3 ;;
    small_vime_d05) probe $name --size 20 --chunks 28 --weights-gib 1.1 --weight-tensors 311 --level 2 --neighbour-gib 6 \
                      --neighbour-cycle-gib 86 --give-back-before weights --kv-delay-s 0.5 --settles 0.5 --repeats 3 ;;
    60_vime_d05) probe $name --size 60 --chunks 28 --weights-gib 1.1 --weight-tensors 311 --level 2 --neighbour-gib 6 \
                   --neighbour-cycle-gib 86 --give-back-before weights --kv-delay-s 0.5 --settles 0.5 --repeats 3 ;;
    06b_vime_buffer) probe $name $W06 --neighbour-gib 6 --neighbour-cycle-gib 86 --give-back-before weights --kv-delay-s 0.5 \
                       --neighbour-buffer-mib 1024 --settles 0.5 --repeats 3 ;;
    moe_x8|moe_x16|moe_x36) probe $name --size 118.39 --chunks ${name#moe_x} --weights-gib 5.8 --weight-tensors 39 --level 2 \
                              --neighbour-gib 6.8 --settles 0.5 --repeats 3 ;;
    *) echo "unknown run $name" >&2 ;;
  esac
done
