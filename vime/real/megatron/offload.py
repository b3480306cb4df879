"""How a trainer rank sleeps and wakes (seed steps 37, 41): the offload backends, and what a sleep must keep and give back."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch

from vime.errors import ConfigError, TrainerError

#: The trainer's offloaded state by tag: module parameters, DDP's gradient buffers (dropped at sleep),
#: the optimizer's fp32 main parameters and Adam moments.
OFFLOAD_TAGS = ("params", "grads", "optimizer")


class AccountedNoopOffload:
    """CPU stand-in for torch_memory_saver: sleep/wake keep everything in place and count the bytes
    that a GPU run would have moved (so the calls, their order and their sizes are still tested)."""

    name = "noop"

    def __init__(self) -> None:
        self.paused = False
        self.offloaded_bytes = 0
        self.events: list[str] = []

    def region(self, tag: str) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()

    def pause(self, nbytes: int) -> None:
        self.paused = True
        self.offloaded_bytes = nbytes
        self.events.append("pause")

    def resume(self) -> None:
        self.paused = False
        self.offloaded_bytes = 0
        self.events.append("resume")


class TorchMemorySaverOffload:
    """torch_memory_saver (GPU): allocations made inside `region()` are released on pause and
    remapped at the same addresses on resume, with their contents restored from host memory."""

    name = "torch_memory_saver"

    def __init__(self) -> None:
        try:
            from torch_memory_saver import torch_memory_saver
        except ImportError as exc:
            raise TrainerError("offload on GPU needs torch_memory_saver (pip install torch_memory_saver) "
                               "or offload_backend='cumem'") from exc
        # The "torch" hook plugs into PyTorch's allocator in-process; the default ("preload") needs
        # LD_PRELOAD of its library in the actor's environment, which a Ray worker does not have.
        torch_memory_saver.hook_mode = "torch"
        self._tms = torch_memory_saver
        self.paused = False
        self.offloaded_bytes = 0
        self.events: list[str] = []

    def region(self, tag: str) -> contextlib.AbstractContextManager[None]:
        # grads are dropped at sleep (seed step 41): no host copy for them
        return self._tms.region(tag=tag, enable_cpu_backup=tag != "grads")

    def pause(self, nbytes: int) -> None:
        self._tms.pause()
        self.paused = True
        self.offloaded_bytes = nbytes
        self.events.append("pause")

    def resume(self) -> None:
        self._tms.resume()
        self.paused = False
        self.offloaded_bytes = 0
        self.events.append("resume")


def plan_tags(plan: str) -> list[str]:
    """The tags of OFFLOAD_TAGS a --train-offload-plan sends away ("all": every one); the rest stay mapped."""
    if plan == "auto":
        raise ConfigError("--train-offload-plan auto is chosen by the simulator: run `vime simulate ... "
                          "--train-offload-plan auto` and pass the plan it prints")
    return list(OFFLOAD_TAGS) if plan == "all" else [t for t in OFFLOAD_TAGS if t in plan.split(",")]


class CuMemOffload:
    """vime's CuMem allocator (`vime.real.cumem`): the trainer's state lives in regions of three tags
    (params, grads, optimizer); pause copies the plan's params and optimizer state to persistent pinned
    host buffers, drops its grads, and leaves the tags the plan keeps mapped; resume maps them back at the
    same addresses. `allocator` (a `CuMemAllocator`) replaces the process's CUDA one (the fake driver's, on CPU)."""

    name = "cumem"

    def __init__(self, tags: Sequence[str] = OFFLOAD_TAGS, allocator: Any = None) -> None:
        if allocator is None:
            from vime.real.cumem.torch_hook import trainer_cumem

            self._hook: Any = trainer_cumem(torch.cuda.current_device())
            allocator = self._hook.allocator
        self.allocator = allocator
        self.tags = [t for t in OFFLOAD_TAGS if t in tags]
        self.paused = False
        self.offloaded_bytes = 0
        self.events: list[str] = []

    def region(self, tag: str) -> contextlib.AbstractContextManager[None]:
        return self._hook.region(tag)

    def pause(self, nbytes: int) -> None:
        if self.tags:
            self.allocator.pause(self.tags)
        self.paused = True
        self.offloaded_bytes = nbytes
        self.events.append("pause")

    def resume(self) -> None:
        if self.tags:
            self.allocator.resume(self.tags)
        self.paused = False
        self.offloaded_bytes = 0
        self.events.append("resume")


def make_offload_backend(name: str, plan: str = "all") -> Any:
    """The hook that picks the trainer's sleep/wake implementation (Args: --train-offload-backend), offloading
    the tags of `plan` (--train-offload-plan; only vime's CuMem allocator offloads some tags and not others).

    Without CUDA every choice becomes the accounted no-op. With CUDA: "cumem" (vime's allocator,
    the default of `vime.config`), "torch_memory_saver", or "auto" (= torch_memory_saver).
    """
    known = ("auto", "noop", "cumem", "torch_memory_saver")
    if name not in known:
        raise ConfigError(f"offload backend {name!r} is unknown; use one of {', '.join(known)}")
    tags = plan_tags(plan)
    if name != "cumem" and plan != "all":
        raise ConfigError(f"--train-offload-plan {plan} needs --train-offload-backend cumem (got {name})")
    if name == "noop" or not torch.cuda.is_available():
        return AccountedNoopOffload()
    if name == "cumem":
        return CuMemOffload(tags)
    return TorchMemorySaverOffload()


# --------------------------------------------------------------------------------------------
# The optimizer's state
# --------------------------------------------------------------------------------------------


def inner_optimizers(optimizer: Any) -> list[Any]:
    """The torch optimizers under Megatron's wrapper(s): they hold the Adam moments."""
    return [opt.optimizer for opt in getattr(optimizer, "chained_optimizers", [optimizer])]


def init_adam_state(optimizer: Any) -> bool:
    """Create torch Adam's moments now, as its first step would (step 0, zero moments), so they are
    allocated inside the caller's offload region; returns False when an inner optimizer is not torch's
    Adam/AdamW (then its first step creates the state)."""
    inners: list[Any] = [getattr(o, "optimizer", None)
                         for o in getattr(optimizer, "chained_optimizers", None) or [optimizer]]
    if not inners or not all(isinstance(o, torch.optim.Adam | torch.optim.AdamW) for o in inners):
        return False
    for inner in inners:
        for group in inner.param_groups:
            for p in group["params"]:
                if inner.state.get(p):
                    continue
                state = {"step": torch.tensor(0.0, dtype=torch.float32),
                         "exp_avg": torch.zeros_like(p, memory_format=torch.preserve_format),
                         "exp_avg_sq": torch.zeros_like(p, memory_format=torch.preserve_format)}
                if group.get("amsgrad"):
                    state["max_exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                inner.state[p] = state
    return True


def state_bytes(model: Any, optimizer: Any, tags: Sequence[str] = OFFLOAD_TAGS) -> int:
    """Bytes a sleep moves or drops: of `tags`, the module's parameters, DDP's gradient buffers, the optimizer's state."""
    by_tag = state_bytes_by_tag(model, optimizer)
    return sum(by_tag[t] for t in tags)


def state_bytes_by_tag(model: Any, optimizer: Any) -> dict[str, int]:
    """The trainer's state in bytes under each of OFFLOAD_TAGS."""
    module = model.module
    params = sum(p.numel() * p.element_size() for p in module.parameters())
    grads = sum(b.grad_data.numel() * b.grad_data.element_size() for b in model.buffers)
    # Walk the inner torch optimizers' state rather than Megatron's state_dict(): the
    # distributed optimizer's state_dict() asserts before its first step, and a colocated
    # run sleeps the trainer before it ever trained (seed steps 3 and 43).
    opt = 0
    seen = {id(p) for p in module.parameters()}
    for outer in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
        inner = getattr(outer, "optimizer", None)
        if inner is None:
            continue
        for st in inner.state.values():
            opt += sum(v.numel() * v.element_size() for v in st.values() if torch.is_tensor(v))
        for group in inner.param_groups:  # fp32 main copies of bf16 params (not module params)
            for p in group["params"]:
                if id(p) not in seen:
                    seen.add(id(p))
                    opt += p.numel() * p.element_size()
    return {"params": params, "grads": grads, "optimizer": opt}


# --------------------------------------------------------------------------------------------
# Proof that a wake restored what the sleep kept
# --------------------------------------------------------------------------------------------


def kept_tensors(module: Any, optimizer: Any) -> list[tuple[str, torch.Tensor]]:
    """What a sleep must keep: the module's parameters and the optimizer's main copies and moments."""
    out = [(n, p) for n, p in module.named_parameters()]
    for k, inner in enumerate(inner_optimizers(optimizer)):
        for g, group in enumerate(inner.param_groups):
            for i, prm in enumerate(group["params"]):
                out.append((f"optimizer{k}.group{g}.param{i}", prm))
                for key, v in inner.state.get(prm, {}).items():
                    if torch.is_tensor(v) and v.device.type != "cpu":
                        out.append((f"optimizer{k}.group{g}.param{i}.{key}", v))
    return out


def fingerprint(tensors: Sequence[tuple[str, torch.Tensor]]) -> torch.Tensor:
    """Per-tensor sums of `tensors` (one fp64 vector on the host)."""
    with torch.no_grad():
        return torch.stack([t.detach().sum(dtype=torch.float64) for _, t in tensors]).cpu()


def changed_tensors(tensors: Sequence[tuple[str, torch.Tensor]], before: torch.Tensor) -> list[str]:
    """Names of `tensors` whose sums differ from the `before` fingerprint (NaN equals NaN)."""
    after = fingerprint(tensors)
    return [n for (n, _), a, b in zip(tensors, after.tolist(), before.tolist(), strict=True)
            if not (a == b or (a != a and b != b))]


def empty_resident_cache(offload_train: bool, cpu: bool) -> None:
    """After a train call of a trainer that stays resident (--no-offload-train): no sleep will empty PyTorch's cache,
    so hand the activations' blocks back now, or a colocated engine's KV cache, sized before training, cannot be mapped
    again beside them (the H200 run of 2026-12-04 held 52 GiB through the rollout; slime's clear_memory does the same)."""
    if not cpu and not offload_train:
        torch.cuda.empty_cache()
