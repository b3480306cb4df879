# Sourced by the scripts in scripts/h200 on the lent H200: carried wheels -> /tmp/site, PYTHONPATH, output folder.
# The machine reaches no registry; megatron-core and torch_memory_saver travel as wheels in .whl/
# (prepared here with scripts/h200/prepare_wheels.sh, named in the device call's `carry`).
export PYTHONUNBUFFERED=1
export OUT=${OUT:-/tmp/vime-out}
mkdir -p "$OUT"
# Only the wheels these scripts need, by name: .whl/ is shared and may hold other versions (two
# megatron-core versions stop the whole install).
WHEELS=$(ls .whl/megatron_core-0.19.2-*.whl .whl/torch_memory_saver-0.0.10-*.whl .whl/zstandard-*.whl 2>/dev/null)
if [ -n "$WHEELS" ] && [ ! -f /tmp/site/.vime-wheels-ok ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site $WHEELS \
    && touch /tmp/site/.vime-wheels-ok || echo "WHEEL INSTALL FAILED" >&2
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
