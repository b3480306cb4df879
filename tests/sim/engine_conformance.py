"""Kept so the tests/sim modules keep their import: the engine conformance suite lives in tests/conformance/engine.py."""

import sys
from pathlib import Path

# Under pytest tests/ is on sys.path (tests/conftest.py); a subprocess that only added tests/sim
# (the determinism tests re-import test modules in a fresh interpreter) needs tests/ added here.
if str(Path(__file__).resolve().parents[1]) not in sys.path:
    sys.path.append(str(Path(__file__).resolve().parents[1]))

from conformance.engine import *  # noqa: E402, F403
