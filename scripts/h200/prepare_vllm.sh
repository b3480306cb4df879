#!/usr/bin/env bash
# Prepare vLLM 0.25.1 for the lent H200 (issue 10), here, on a machine that reaches PyPI.
# The H200 (Python 3.12, torch 2.11.0+cu130) reaches no registry and one device call carries at
# most 64 MiB, so: download the wheel set of shared/device/vllm-0.25.1-h200.md, unpack it into one
# site-packages tree, drop FlashAttention-2's kernels (190 MB; on Hopper vLLM uses FA3, and FA2 is
# imported optionally), add a stub `ray` (vLLM's IPC weight-transfer module imports ray at the top
# but only uses it for trainer-side Ray sends), compress with zstd (level 12, 128 MiB window: 140 MB
# from 463 MB; xz was too slow on 2 shared cores), split into parts that fit a call beside the working tree (scripts/h200_train/parts.sh budget) + SHA256SUMS. The device
# decompresses with its zstd binary or the python zstandard wheel carried in .whl/.
#   bash scripts/h200/prepare_vllm.sh            -> .gpu/parts/part-aa ... and .gpu/parts/SHA256SUMS
# Then ship the parts with scripts/h200/ship_part.sh and run scripts/h200/vllm_run.sh (see there).
set -euo pipefail
cd "$(dirname "$0")/../.."
G=.gpu
mkdir -p $G/vllm-wheels $G/parts
P="--no-deps --only-binary=:all: --python-version 3.12 --implementation cp"
for plat in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_26_x86_64 manylinux_2_24_x86_64 \
            manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_31_x86_64 manylinux1_x86_64 manylinux_2_5_x86_64 any; do
  P="$P --platform $plat"
done
python3 -m pip download $P -q -d $G/vllm-wheels \
  annotated_types==0.8.0 apache_tvm_ffi==0.1.15.post2 cachetools==8.0.2 cbor2==6.3.0 distro==1.9.0 \
  fastapi==0.136.3 jmespath==1.1.0 llguidance==1.7.6 model_hosting_container_standards==0.1.16 \
  msgspec==0.23.0 openai==2.54.0 openai_harmony==0.0.8 partial_json_parser==0.2.1.1.post7 \
  prometheus_fastapi_instrumentator==8.1.0 pybase64==1.5.1 pydantic==2.12.5 pydantic_core==2.41.5 \
  pyzmq==27.3.0 sniffio==1.3.1 starlette==1.10.0 typing_inspection==0.4.2 uvicorn==0.54.0 \
  vllm==0.25.1 watchfiles==1.3.0 xgrammar==0.2.9
rm -rf $G/vllm-site && mkdir -p $G/vllm-site/site
for w in $G/vllm-wheels/*.whl; do unzip -q -o "$w" -d $G/vllm-site/site; done
rm -f $G/vllm-site/site/vllm/vllm_flash_attn/_vllm_fa2_C.abi3.so
mkdir -p $G/vllm-site/site/ray
cat > $G/vllm-site/site/ray/__init__.py <<'PY'
"""Stand-in for ray on the lent H200 (vime scripts/h200): vLLM imports it in its IPC weight-transfer
module but needs it only for Ray-based sends, which vime does not use; nothing here is a real ray."""


def is_initialized() -> bool:
    return False


def get(*args, **kwargs):
    raise RuntimeError("ray is not installed on this machine (vime stub)")
PY
rm -f $G/parts/part-* $G/parts/SHA256SUMS
tar cf - -C $G/vllm-site site | zstd -12 -T2 --long=27 -q | split -b $(bash scripts/h200_train/parts.sh budget) - $G/parts/part-
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -q -d .whl zstandard==0.25.0
(cd $G/parts && sha256sum part-* > SHA256SUMS && cat SHA256SUMS)
ls -la $G/parts
