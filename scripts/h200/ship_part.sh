#!/usr/bin/env bash
# One shipping call (issue 10): the part(s) carried in .gpu/parts/ go to /tmp/parts on the device,
# which survives between calls while the machine stays warm (30 s), and are checked against SHA256SUMS.
#   run(command="bash scripts/h200/ship_part.sh", carry=[".gpu/parts/part-aa", ".gpu/parts/SHA256SUMS"])
# Make the calls back to back, then run scripts/h200/vllm_run.sh carrying the last part.
set -u
mkdir -p /tmp/parts
cp .gpu/parts/part-* .gpu/parts/SHA256SUMS /tmp/parts/ 2>/dev/null
cd /tmp/parts && sha256sum -c --ignore-missing SHA256SUMS && ls -la /tmp/parts && df -h /tmp | tail -1
