# Sourced by the scripts in scripts/h200 on the lent H200: carried wheels -> /tmp/site, PYTHONPATH, output folder.
# The machine reaches no registry; megatron-core and torch_memory_saver travel as wheels in .whl/
# (prepared here with scripts/h200/prepare_wheels.sh, named in the device call's `carry`).
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/vime-out}
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.vime-wheels-ok ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.vime-wheels-ok || echo "WHEEL INSTALL FAILED" >&2
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
