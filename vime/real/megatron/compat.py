"""CPU compatibility layer for megatron-core 0.16.1: lets a tiny GPTModel train on a machine without CUDA.

megatron-core assumes CUDA in a handful of places that a CPU run reaches: device strings
(`torch.cuda.current_device()` as an allocation device), literal `device="cuda"` allocations
(optimizer scalars, grad-norm buffers, the schedule's token counter), `Tensor.cuda()`, `Tensor.type()` checks,
`torch.cuda.synchronize()`, the CUDA RNG state tracker, and grad clipping's assertion that grads are CUDA tensors. This module redirects exactly those,
and only when no CUDA device exists, so the same trainer code runs on GPUs untouched.

It was written against megatron-core 0.16.1 (the last release for Python 3.11) and refuses any
other version on CPU: the redirects name Megatron internals that move between releases.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Iterator
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from vime.errors import TrainerError

#: The megatron-core release this layer was written and tested against.
PINNED_MEGATRON_VERSION = "0.16.1"

#: The RNG stream Megatron forks for tensor-parallel regions (its name in megatron-core).
MODEL_PARALLEL_RNG = "model-parallel-rng"
#: The RNG stream Megatron forks to initialise an expert-parallel rank's experts.
EXPERT_PARALLEL_RNG = "expert-parallel-rng"

_lock = threading.Lock()
_depth = 0
_saved: dict[str, Any] = {}


def needs_cpu_compat() -> bool:
    """True when this process has no CUDA device: the only case where the layer applies."""
    return not torch.cuda.is_available()


def import_megatron() -> Any:
    """Import `megatron.core` with its import-time warnings silenced (pytest makes warnings errors); returns it."""
    with warnings.catch_warnings():
        # Import-time warnings of megatron-core are about its environment (TE/Apex absent, torch.jit
        # deprecations), not about vime's use of it.
        warnings.simplefilter("ignore")
        try:
            import megatron.core as mcore
            import megatron.core.distributed  # noqa: F401
            import megatron.core.models.gpt  # noqa: F401
            import megatron.core.optimizer  # noqa: F401
            import megatron.core.pipeline_parallel  # noqa: F401
            import megatron.core.tensor_parallel  # noqa: F401
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise TrainerError(
                f"megatron-core is not importable ({exc}); install it with "
                f"`pip install megatron-core=={PINNED_MEGATRON_VERSION}` (pip install 'vime[train]')"
            ) from exc
    return mcore


def check_version(version: str | None = None) -> None:
    """Raise unless the installed megatron-core is the release this layer was written for."""
    if version is None:
        version = import_megatron().__version__
    if version != PINNED_MEGATRON_VERSION:
        raise TrainerError(
            f"the CPU compatibility layer (vime/real/megatron/compat.py) was written for megatron-core "
            f"{PINNED_MEGATRON_VERSION}, found {version}; install megatron-core=={PINNED_MEGATRON_VERSION} "
            "for CPU runs, or run on a CUDA machine where the layer is not used"
        )


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device == "cuda" or device.startswith("cuda:")
    # A bare int is what torch.cuda.current_device() returns on GPUs: an index of a CUDA device.
    return isinstance(device, int) and not isinstance(device, bool)


class _CudaToCpuMode(TorchFunctionMode):
    """Rewrites CUDA placements to the CPU: `device="cuda"` kwargs, `.cuda()`, `.to("cuda")`."""

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: D105
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            # Megatron's optimizers check `param.type() == "torch.cuda.FloatTensor"`; answer with
            # the CUDA name of the same dtype so the CPU tensors take the CUDA code path.
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            kwargs["device"] = "cpu"
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class CpuRngStatesTracker:
    """Megatron's RNG-tracker interface backed by the CPU generator (named states, `fork`).

    Megatron forks "model-parallel-rng" around dropout and TP-sharded init; on CPU the fork swaps
    the CPU generator's state in and out the same way the CUDA tracker swaps the CUDA one.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.states_: dict[str, torch.Tensor] = {}
        self.seeds_: set[int] = set()
        self._is_initialized = False

    def is_initialized(self) -> bool:
        return self._is_initialized

    def get_states(self) -> dict[str, torch.Tensor]:
        return {k: v.clone() for k, v in self.states_.items()}

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self._is_initialized = True
        self.states_ = states

    def add(self, name: str, seed: int) -> None:
        self._is_initialized = True
        if seed in self.seeds_ or name in self.states_:
            raise TrainerError(f"RNG stream {name!r} (seed {seed}) is already registered")
        self.seeds_.add(seed)
        saved = torch.get_rng_state()
        torch.manual_seed(seed)
        self.states_[name] = torch.get_rng_state()
        torch.set_rng_state(saved)

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG) -> Iterator[None]:
        if name not in self.states_:
            raise TrainerError(f"RNG stream {name!r} was never added; seed the model first")
        saved = torch.get_rng_state()
        torch.set_rng_state(self.states_[name])
        try:
            yield
        finally:
            self.states_[name] = torch.get_rng_state()
            torch.set_rng_state(saved)


def _current_device() -> str:
    return "cpu"


def _noop(*_args: Any, **_kwargs: Any) -> None:
    return None


def _clip_grad_by_total_norm_fp32(parameters: Any, max_norm: float, total_norm: float,
                                  use_decoupled_grad: bool = False) -> None:
    """Megatron's grad clipping without its assertion that grads are `torch.cuda.FloatTensor`."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    coeff = max_norm / (total_norm + 1.0e-6)
    if coeff >= 1.0:
        return
    for p in parameters:
        g = getattr(p, "decoupled_grad", None) if use_decoupled_grad else p.grad
        if g is not None:
            g.detach().mul_(coeff)


def _apply() -> None:
    from megatron.core.optimizer import optimizer as moptimizer
    from megatron.core.tensor_parallel import random as mrandom

    _saved["current_device"] = torch.cuda.current_device
    _saved["synchronize"] = torch.cuda.synchronize
    _saved["empty_cache"] = torch.cuda.empty_cache
    _saved["tracker"] = (mrandom._CUDA_RNG_STATE_TRACKER, mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED)
    torch.cuda.current_device = _current_device  # type: ignore[assignment]  # device strings: allocations land on the CPU
    torch.cuda.synchronize = _noop  # nothing asynchronous to wait for on the CPU
    torch.cuda.empty_cache = _noop
    mrandom._CUDA_RNG_STATE_TRACKER = CpuRngStatesTracker()
    mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = True
    # Activation recompute saves and restores "the GPU's" generator around each checkpoint: on the
    # CPU that generator is the default one (the CPU state is saved beside it, harmlessly twice).
    _saved["rng_get"], _saved["rng_set"] = mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state
    mrandom._get_cuda_rng_state = lambda *a, **k: torch.get_rng_state()
    mrandom._set_cuda_rng_state = lambda state, *a, **k: torch.set_rng_state(state)
    # ...and reruns the layers' forward inside autograd's backward, where this thread's torch
    # modes are not active: push the CUDA->CPU rewrite there too.
    _saved["ckpt_backward"] = mrandom.CheckpointFunction.backward
    original_backward = mrandom.CheckpointFunction.backward.__func__ if hasattr(
        mrandom.CheckpointFunction.backward, "__func__") else mrandom.CheckpointFunction.backward

    def _backward_on_cpu(ctx: Any, *grads: Any) -> Any:
        with _CudaToCpuMode():
            return original_backward(ctx, *grads)

    mrandom.CheckpointFunction.backward = staticmethod(_backward_on_cpu)
    _saved["clip"] = moptimizer.clip_grad_by_total_norm_fp32
    moptimizer.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm_fp32
    mode = _CudaToCpuMode()
    mode.__enter__()
    _saved["mode"] = mode


def _restore() -> None:
    from megatron.core.optimizer import optimizer as moptimizer
    from megatron.core.tensor_parallel import random as mrandom

    _saved.pop("mode").__exit__(None, None, None)
    torch.cuda.current_device = _saved.pop("current_device")
    torch.cuda.synchronize = _saved.pop("synchronize")
    torch.cuda.empty_cache = _saved.pop("empty_cache")
    moptimizer.clip_grad_by_total_norm_fp32 = _saved.pop("clip")
    mrandom._CUDA_RNG_STATE_TRACKER, mrandom._CUDA_RNG_STATE_TRACKER_INITIALIZED = _saved.pop("tracker")
    mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state = _saved.pop("rng_get"), _saved.pop("rng_set")
    mrandom.CheckpointFunction.backward = staticmethod(_saved.pop("ckpt_backward"))


def install() -> bool:
    """Apply the layer for the rest of this process (a trainer actor) when there is no CUDA.

    Returns whether it was applied. Idempotent. On CPU the megatron-core version is checked first.
    """
    global _depth
    if not needs_cpu_compat():
        return False
    check_version()
    with _lock:
        if _depth == 0:
            _apply()
        _depth += 1
    return True


def uninstall() -> None:
    """Undo one `install()`; the last one restores torch and Megatron exactly as they were."""
    global _depth
    with _lock:
        if _depth == 0:
            return
        _depth -= 1
        if _depth == 0:
            _restore()


@contextlib.contextmanager
def cpu_compat() -> Iterator[bool]:
    """`install()` for the duration of a block (tests, one-off tools); yields whether it applied."""
    applied = install()
    try:
        yield applied
    finally:
        if applied:
            uninstall()


def moe_without_te() -> None:
    """megatron-core's MoE router reads `moe_utils.te_general_gemm`, which it leaves undefined when
    TransformerEngine is absent (a NameError in the router's forward): define it as None, the
    value its own fallback path tests for. Idempotent."""
    import megatron.core.transformer.moe.moe_utils as moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None


def is_installed() -> bool:
    return _depth > 0


@contextlib.contextmanager
def device_mode() -> Iterator[None]:
    """Push the CUDA→CPU placement rewrite on this thread while installed (torch modes are
    per thread, and a Ray actor may run calls off the thread that installed the layer)."""
    if not is_installed():
        yield
        return
    with _CudaToCpuMode():
        yield


def model_parallel_seed(seed: int, tp_rank: int, ep_rank: int = 0, etp_rank: int = 0) -> None:
    """Seed the default generator and Megatron's model-parallel and expert-parallel streams (megatron's
    `model_parallel_cuda_manual_seed` on GPU; the CPU tracker when the layer is installed)."""
    import megatron.core.tensor_parallel.random as mrandom

    torch.manual_seed(seed)
    if is_installed():
        tracker = mrandom.get_cuda_rng_tracker()
        tracker.reset()
        # Same offsets as Megatron: each TP rank its own dropout stream, each EP × ETP rank its experts' init.
        tracker.add(MODEL_PARALLEL_RNG, seed + 2718 + tp_rank)
        tracker.add(EXPERT_PARALLEL_RNG, seed + 1024 + 100 * ep_rank + etp_rank)
    else:
        mrandom.model_parallel_cuda_manual_seed(seed)


class SequenceParallelTorchNorm:
    """megatron-core's torch norm (`WrappedTorchNorm`) under sequence parallelism, which it refuses.

    A norm is per token, so its forward is the same on a slice of the sequence; what sequence
    parallelism changes is the backward: each TP rank's weight gradient covers its slice only.
    Marking the weight ``sequence_parallel`` makes `finalize_model_grads` sum it over TP, which is
    what TransformerEngine's and Apex's norms do. Needed for MoE layers under TP (see `block_spec`).
    """

    def __new__(cls, config: Any, hidden_size: int, eps: float = 1e-5, **kwargs: Any) -> Any:
        import copy

        from megatron.core.transformer.torch_norm import WrappedTorchNorm

        plain = copy.copy(config)
        plain.sequence_parallel = False
        norm = WrappedTorchNorm(plain, hidden_size, eps, **kwargs)
        for p in norm.parameters():
            p.sequence_parallel = config.sequence_parallel
        return norm


def block_spec(layer_spec: Any, num_layers: int) -> Any:
    """A TransformerBlock spec of `num_layers` layers of `layer_spec` whose torch norms (and the final
    one) accept sequence parallelism (`SequenceParallelTorchNorm`)."""
    import dataclasses

    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    def swap(node: Any) -> Any:
        if node is WrappedTorchNorm:
            return SequenceParallelTorchNorm
        if isinstance(node, ModuleSpec):
            return dataclasses.replace(node, submodules=swap(node.submodules))
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            return dataclasses.replace(node, **{f.name: swap(getattr(node, f.name)) for f in dataclasses.fields(node)
                                                if f.init})
        return node

    return TransformerBlockSubmodules(layer_specs=[swap(layer_spec)] * num_layers, layer_norm=SequenceParallelTorchNorm)
