#!/usr/bin/env bash
# Calibration calls (issues 12 and 11) on the lent H200, in two back-to-back calls of ~5 minutes:
#   run(command="SECTIONS=tests,gemm,hbm,host,vmm,decode,prefill,megatron bash scripts/h200/calibrate.sh", carry=[".whl"])
#   run(command="SECTIONS=cumem bash scripts/h200/calibrate.sh", carry=[".whl"])
# Raw numbers accumulate in /tmp/vime-calibrate/calibration.json while the machine stays warm; each
# call copies it, the profile (H200-141G-measured.json) and the logs (work.tgz) to $OUT.
# Re-fit on a CPU: python bench/calibrate.py --from-raw a.json,b.json --out merged.json --profile p.json
set -u
source scripts/h200/env.sh
W=/tmp/vime-calibrate
mkdir -p $W
SECTIONS=${SECTIONS:-tests,gemm,hbm,host,vmm,decode,prefill,megatron,cumem}
python3 bench/calibrate.py --sections "$SECTIONS" \
  --cumem-plan "${CUMEM_PLAN:-vime:8:4,tms:8:3,plain:8:3,plain:56:2,vime:56:3,tms:56:2,vime_prepared:8:3,tms_retain:8:3}" \
  --host-limit-gib 110 --megatron-cumem --gpu-test-ini --deadline-s "${DEADLINE:-560}" --sub-timeout 240 \
  --out $W/calibration.json --profile "$OUT/H200-141G-measured.json" --work $W 2>&1 | tee "$OUT/calibrate-$(date +%H%M%S).log"
cp $W/calibration.json "$OUT/calibration.json"
tar czf "$OUT/work.tgz" -C /tmp vime-calibrate 2>/dev/null
