#!/usr/bin/env bash
# One shipping call for the 8-GPU seed run (issue 9): whatever parts this call carries go to /tmp on the
# device, which survives between calls while the machine stays warm (30 s): vLLM's parts (from
# scripts/h200/prepare_vllm.sh, in .gpu/parts) through scripts/h200/ship_part.sh into /tmp/parts, and
# this run's parts (.gpu/x8/parts) into /tmp/x8parts. Checks what has arrived so far.
#   run(command="bash scripts/h200x8/ship.sh", carry=[".gpu/parts/part-aa", ".gpu/parts/SHA256SUMS"], kind="nvidia-h200-x8")
#   run(command="bash scripts/h200x8/ship.sh", carry=[".gpu/x8/parts/x8-aa", ".gpu/x8/parts/x8.sha256"], kind="nvidia-h200-x8")
# scripts/h200x8/README.md gives the whole sequence; run_seed.sh calls this too, for the parts it carries.
set -u
bad=0
cd "$(dirname "$0")/../.."
if ls .gpu/parts/part-* >/dev/null 2>&1; then
  bash scripts/h200/ship_part.sh >/dev/null || { echo "vLLM parts: a carried part does not match SHA256SUMS" >&2; bad=1; }
fi
mkdir -p /tmp/x8parts
cp .gpu/x8/parts/* /tmp/x8parts/ 2>/dev/null
echo "arrived:"
ls -l /tmp/parts /tmp/x8parts 2>/dev/null | grep -E "part-|x8-" | awk '{print "  " $5, $NF}'
(cd /tmp/parts 2>/dev/null && sha256sum --quiet -c SHA256SUMS >/dev/null 2>&1) && echo "vLLM parts: all present"
bash scripts/h200x8/parts.sh verify /tmp/x8parts x8 >/dev/null 2>&1 && echo "x8 parts: all present"
df -h /tmp | tail -1
# A partial set is normal between shipping calls; only a part that arrived corrupt is an error.
if [ -f /tmp/x8parts/x8.sha256 ] && ! (cd /tmp/x8parts && sha256sum --quiet -c --ignore-missing x8.sha256); then bad=1; fi
exit $bad
