#!/usr/bin/env bash
# Prepare, here (a machine that reaches PyPI), everything `vime train --backend real` on a lent H200
# machine (1, 2 or 8 GPUs: scripts/h200_train/run.sh; issue 20) must carry there. That machine reaches no
# registry and takes at most 64 MiB per device call, so:
#   1. vLLM 0.25.1 and its missing dependencies: scripts/h200/prepare_vllm.sh -> .gpu/parts/part-a? +
#      SHA256SUMS (skipped when those parts exist and check; FORCE_VLLM=1 rebuilds them);
#   2. what the run needs beyond vLLM (the image has torch 2.11, transformers, numpy, httpx, aiohttp,
#      msgpack, protobuf, cuda-bindings ... — /work/.library/device/KINDS.md): Ray, vllm-router,
#      megatron-core 0.16.1 (the version CI's CPU tests drive), torch_memory_saver (the comparison
#      offload backend), their missing dependencies for CPython 3.12, simpy for `vime simulate`, the
#      zstandard module (the fallback decompressor of vLLM's parts) -> .gpu/train/parts/tr-a? + tr.sha256;
#   3. .gpu/train/MANIFEST.txt: every wheel with its size, the parts, the total, and the ship order as
#      device calls (parts packed into calls under the 64 MiB limit, after the working tree's size).
# vime itself is not packed: the checkout travels with every device call and runs from there
# (PYTHONPATH), so no wheel is built (building one needs the `wheel` package, absent on a fresh machine).
# The models are not shipped: scripts/h200_train/seed_model.py builds them on the machine in seconds.
#   bash scripts/h200_train/prepare.sh                  # then follow .gpu/train/MANIFEST.txt (also printed)
#   bash scripts/h200_train/prepare.sh --list           # only print the pinned requirements
#   KIND=nvidia-h200-x8 bash scripts/h200_train/prepare.sh   # the kind written into the printed calls
set -euo pipefail
cd "$(dirname "$0")/../.."
X=.gpu/train
# One version each; `pip download --no-deps` below fetches exactly these (their own needs are listed
# here or already on the machine's image).
EXTRA_REQS=(
  ray==2.60.0 jsonschema==4.26.0 jsonschema-specifications==2025.9.1 referencing==0.37.0 rpds-py==2026.9.1
  vllm-router==0.1.17 setproctitle==1.3.8 orjson==3.13.0
  megatron-core==0.16.1 torch_memory_saver==0.0.10
  simpy==4.1.2
  zstandard==0.25.0
)
if [ "${1:-}" = "--list" ]; then printf '%s\n' "${EXTRA_REQS[@]}"; exit 0; fi

# 1. vLLM -------------------------------------------------------------------------------------------
if [ "${FORCE_VLLM:-0}" = 1 ] || ! (cd .gpu/parts 2>/dev/null && sha256sum --quiet -c SHA256SUMS); then
  bash scripts/h200/prepare_vllm.sh
fi
# a working tree grown since the parts were cut: cut them again (no recompression)
if [ -n "$(find .gpu/parts -name 'part-*' -size +$(( $(bash scripts/h200_train/parts.sh budget) / 1024 ))k)" ]; then
  bash scripts/h200_train/parts.sh resplit .gpu/parts part SHA256SUMS >/dev/null
fi

# 2. the rest ---------------------------------------------------------------------------------------
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp"
for plat in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 \
            manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 manylinux1_x86_64 any; do
  P="$P --platform $plat"
done
mkdir -p $X/wheels
python3 -m pip download $P -q -d $X/wheels "${EXTRA_REQS[@]}" 2>&1 | grep -v "is ignored" || true
rm -rf $X/stage && mkdir -p $X/stage/wheels
python3 - "$X/wheels" "$X/stage/wheels" "${EXTRA_REQS[@]}" <<'PY'
"""Copy exactly the pinned wheels (one per requirement) from the download cache to the stage."""
import re, shutil, sys
from pathlib import Path
src, dst, reqs = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3:]
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
for req in reqs:
    name, version = req.split("==")
    hits = [w for w in src.glob("*.whl") if norm(w.name.split("-")[0]) == norm(name) and w.name.split("-")[1] == version]
    if len(hits) != 1:
        sys.exit(f"prepare: expected one wheel for {req} in {src}, found {[h.name for h in hits]}")
    shutil.copy2(hits[0], dst / hits[0].name)
PY
# one version of each distribution across vLLM's set and this one (two would stop the install)
python3 - .gpu/vllm-wheels $X/stage/wheels <<'PY'
import re, sys
from collections import Counter
from pathlib import Path
names = [re.sub(r"[-_.]+", "_", w.name.split("-")[0]).lower() for d in sys.argv[1:] for w in Path(d).glob("*.whl")]
dup = [n for n, c in Counter(names).items() if c > 1]
if dup:
    sys.exit(f"prepare: more than one wheel of {dup} across vLLM's set and the run's set")
PY

bash scripts/h200_train/parts.sh pack $X/stage $X/parts tr >/dev/null

# 3. manifest and ship order -------------------------------------------------------------------------
tree_bytes=$(bash scripts/h200_train/parts.sh tree)
python3 - "$tree_bytes" "${KIND:-nvidia-h200}" > $X/MANIFEST.txt <<'PY'
"""Sizes of everything that travels, and the device calls that carry it (first-fit decreasing)."""
import sys
from pathlib import Path
MiB = 1 << 20
tree = int(sys.argv[1])
kind = sys.argv[2]
budget = 64 * MiB - tree - 5 * MiB  # the call's limit covers the working tree too; 5 MiB spare (parts.sh budget says why)
print("wheels (MB = 10^6 bytes)")
total_wheels = 0
for d, label in ((Path(".gpu/vllm-wheels"), "vLLM set (scripts/h200/prepare_vllm.sh; FA2 kernels dropped, zstd)"),
                 (Path(".gpu/train/stage/wheels"), "the run's set (plain tar)")):
    print(f"  {label}")
    for w in sorted(d.glob("*.whl")):
        total_wheels += w.stat().st_size
        print(f"    {w.stat().st_size / 1e6:9.2f}  {w.name}")
print(f"  all wheels: {total_wheels / 1e6:.1f} MB")
parts = sorted(Path(".gpu/parts").glob("part-*")) + sorted(Path(".gpu/train/parts").glob("tr-*"))
sums = {p: (Path(".gpu/parts/SHA256SUMS") if p.name.startswith("part-") else Path(".gpu/train/parts/tr.sha256"))
        for p in parts}
print("parts")
for p in parts:
    print(f"  {p.stat().st_size / MiB:7.2f} MiB  {p}")
moved = sum(p.stat().st_size for p in parts)
print(f"  total transfer: {moved / MiB:.1f} MiB in {len(parts)} parts (+ the {tree / MiB:.1f} MiB working tree each call)")
calls: list[list[Path]] = []
for p in sorted(parts, key=lambda p: -p.stat().st_size):
    for c in calls:
        if sum(q.stat().st_size for q in c) + p.stat().st_size <= budget:
            c.append(p)
            break
    else:
        calls.append([p])
calls.sort(key=lambda c: -sum(q.stat().st_size for q in c))  # the lightest call last: it also does the prep work
print(f"ship order (back to back: the machine keeps /tmp only while warm, 30 s after a call; "
      f"per-call budget {budget / MiB:.1f} MiB)")
for i, c in enumerate(calls, 1):
    carry = [str(q) for q in c]
    carry += sorted({str(sums[q]) for q in c})
    cmd = "bash scripts/h200_train/run.sh prep" if i == len(calls) else "bash scripts/h200_train/ship.sh"
    print(f'  {i}. run(kind="{kind}", command="{cmd}", carry={carry!r}, timeout_s=300)')
print(f'  {len(calls) + 1}. run(kind="{kind}", command="GPUS=... MODEL=... bash scripts/h200_train/run.sh run", timeout_s=600)')
PY
cat $X/MANIFEST.txt
