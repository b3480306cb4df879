#!/usr/bin/env bash
# Last vLLM call (issue 10): join and unpack the parts (unless an earlier call did), then
# build a random Qwen3, start vLLM 0.25.1 with sleep mode + IPC weight transfer through vime's
# launcher, and measure with vime's client (scripts/h200/vllm_bench.py). Output in $OUT.
#   run(command="bash scripts/h200/vllm_run.sh", timeout_s=600)   (after ship_part.sh calls for every part)
# BENCH_ARGS go to vllm_bench.py as they are, e.g. the issue-12 rerun (frontend cost, 5 prefill repeats,
# 4 level-1 and 6 level-2 cycles, no decode grid; ~170 s of script after unpacking):
#   BENCH_ARGS="--skip-decode" bash scripts/h200/vllm_run.sh
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/vime-out}; mkdir -p "$OUT"
source scripts/h200/unpack_vllm.sh || exit $?
export PYTHONPATH=/tmp/vllm/site:$PWD
python3 -c "import vllm, sys; print('vllm', vllm.__version__)" || exit 5
timeout ${BENCH_TIMEOUT:-520} python3 scripts/h200/vllm_bench.py --out "$OUT/vllm_h200.json" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/vllm_bench.log"
tail -c 4000000 /tmp/vllm-logs/vllm.log > "$OUT/vllm_server.log" 2>/dev/null
nvidia-smi --query-gpu=memory.used,memory.total --format=csv >> "$OUT/vllm_bench.log"
