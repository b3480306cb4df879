#!/usr/bin/env bash
# Install vime with everything its CPU test suite needs into ./.venv (Python 3.11, no GPU).
# torch is pinned to 2.13.0: on this kind of machine that is a CPU build on local disk, while an
# unpinned `torch` would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
[ -d .venv ] || "$PY" -m venv .venv
source .venv/bin/activate
python -m pip install -q --upgrade pip
python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[test,lint]" "torch==2.13.0"
python -c "import vime, torch; print('vime', vime.__version__, 'torch', torch.__version__)"
