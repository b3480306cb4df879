#!/usr/bin/env bash
# Check the shipped parts in /tmp/parts against SHA256SUMS, join them and unpack vLLM's site tree into
# /tmp/vllm/site (once; later calls reuse it while the machine stays warm). Sourced by the run scripts.
mkdir -p /tmp/parts /tmp/vllm
cp .gpu/parts/part-* .gpu/parts/SHA256SUMS /tmp/parts/ 2>/dev/null
if ! (cd /tmp/parts && sha256sum -c SHA256SUMS); then
  echo "parts missing or corrupt (the machine went cold between calls?): ship them again"; ls -la /tmp/parts
  return 3 2>/dev/null || exit 3
fi
if [ ! -d /tmp/vllm/site/vllm ]; then
  t0=$(date +%s)
  if command -v zstd >/dev/null; then
    cat /tmp/parts/part-* | zstd -d --long=27 -q | tar xf - -C /tmp/vllm
  else
    cat /tmp/parts/part-* | PYTHONPATH=/tmp/site python3 -c "
import shutil, sys, zstandard
shutil.copyfileobj(zstandard.ZstdDecompressor(max_window_size=1 << 27).stream_reader(sys.stdin.buffer), sys.stdout.buffer, 1 << 24)" \
      | tar xf - -C /tmp/vllm
  fi
  echo "unpacked vLLM in $(( $(date +%s) - t0 )) s"
fi
[ -d /tmp/vllm/site/vllm ] || { echo "unpack failed"; return 4 2>/dev/null || exit 4; }
