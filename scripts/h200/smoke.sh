#!/usr/bin/env bash
# First device call: checks every code path of issues 11/12 at small sizes (about 2 minutes).
#   run(command="bash scripts/h200/smoke.sh", carry=[".whl"])
set -u
source scripts/h200/env.sh
{
  nvidia-smi; free -g; python3 -c "import torch, cuda.bindings, megatron.core, torch_memory_saver; print(torch.__version__, cuda.bindings.__version__, megatron.core.__version__)"
  timeout 150 python3 -m pytest -c scripts/h200/pytest-gpu.ini --rootdir . -m gpu -q tests/real/test_cumem_gpu.py
  timeout 60 python3 bench/cumem_pause.py --method vime --gib 1 --cycles 2 --out "$OUT/smoke_vime.json"
  timeout 60 python3 bench/cumem_pause.py --method tms --gib 1 --cycles 2 --out "$OUT/smoke_tms.json"
  timeout 120 python3 bench/megatron_step.py --preset qwen3-0.6b --shapes 1x1024 --steps 1 --warmup 1 --cumem --out "$OUT/smoke_megatron.json"
  timeout 90 python3 bench/calibrate.py --quick --sections gemm,hbm,host,vmm,decode,prefill --out "$OUT/smoke_cal.json" --work /tmp/smoke-work
} 2>&1 | tee "$OUT/smoke.log"
