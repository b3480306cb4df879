#!/usr/bin/env bash
# One shipping call for the H200 train runs (issues 9, 20): whatever parts this call carries go to /tmp on
# the device, which survives between calls while the machine stays warm (30 s): vLLM's parts (from
# scripts/h200/prepare_vllm.sh, in .gpu/parts) through scripts/h200/ship_part.sh into /tmp/parts, and
# the run's parts (.gpu/train/parts) into /tmp/trparts. Checks what has arrived so far.
#   run(command="bash scripts/h200_train/ship.sh", carry=[".gpu/parts/part-aa", ".gpu/parts/SHA256SUMS"])
#   run(command="bash scripts/h200_train/ship.sh", carry=[".gpu/train/parts/tr-aa", ".gpu/train/parts/tr.sha256"])
# scripts/h200_train/README.md gives the whole sequence; run.sh prep calls this too, for the parts it carries.
set -u
bad=0
cd "$(dirname "$0")/../.."
if ls .gpu/parts/part-* >/dev/null 2>&1; then
  bash scripts/h200/ship_part.sh >/dev/null || { echo "vLLM parts: a carried part does not match SHA256SUMS" >&2; bad=1; }
fi
mkdir -p /tmp/trparts
cp .gpu/train/parts/* /tmp/trparts/ 2>/dev/null
echo "arrived:"
ls -l /tmp/parts /tmp/trparts 2>/dev/null | grep -E "part-|tr-" | awk '{print "  " $5, $NF}'
(cd /tmp/parts 2>/dev/null && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1) && echo "vLLM parts: all present"
bash scripts/h200_train/parts.sh verify /tmp/trparts tr >/dev/null 2>&1 && echo "run parts: all present"
df -h /tmp | tail -1
# A partial set is normal between shipping calls; only a part that arrived corrupt is an error.
if [ -f /tmp/trparts/tr.sha256 ] && ! (cd /tmp/trparts && sha256sum --quiet -c --ignore-missing tr.sha256); then bad=1; fi
exit $bad
