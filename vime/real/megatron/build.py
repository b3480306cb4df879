"""Build one trainer rank: join torch.distributed, warm up its communicators, and make GPTModel, DDP and the optimizer inside the offload regions."""

from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from vime.real.megatron import model as mmodel
from vime.real.megatron.offload import init_adam_state

if TYPE_CHECKING:
    from vime.real.megatron.actor import ActorConfig


def join_process_group(cfg: ActorConfig, rank: int, world_size: int, master_addr: str, master_port: int, *,
                       cpu: bool) -> None:
    """torch.distributed over gloo (CPU) or NCCL (GPU: one device per local rank), unless already joined."""
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if not cpu:
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local if torch.cuda.device_count() > 1 else 0)
    dist.init_process_group(
        "gloo" if cpu else "nccl", init_method=f"tcp://{master_addr}:{master_port}",
        rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=cfg.collective_timeout_s))


def init_communicators(ps: Any, device: torch.device) -> None:
    """One tiny all-reduce on every group the step uses, so NCCL allocates its communicators now and
    not in the middle of the first step, when PyTorch's cache holds the activations (bench/megatron_step.py)."""
    import torch.distributed as dist

    groups = [None, ps.get_data_parallel_group(), ps.get_data_parallel_group(with_context_parallel=True),
              ps.get_tensor_model_parallel_group(), ps.get_model_parallel_group()]
    x = torch.zeros(1, device=device)
    for group in {id(g): g for g in groups}.values():
        dist.all_reduce(x, group=group)
    torch.cuda.synchronize()


class _ParamBufferInParams(torch.overrides.TorchFunctionMode):
    """While DDP is built in the "grads" region: its parameter buffer goes to "params".

    With the distributed optimizer, DDP moves every parameter into a contiguous buffer it allocates
    beside the gradient buffer; in "grads" a sleep would discard the weights (what the first H200
    runs trained on, bench/data/h200_notes.md). The two are told apart by dtype (parameters in the
    model's dtype, gradients reduced in fp32); an fp32 model keeps both across a sleep.
    """

    def __init__(self, offload: Any, param_dtype: torch.dtype) -> None:
        super().__init__()
        self.offload = offload
        self.param_dtype = param_dtype

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func is torch.zeros and kwargs.get("dtype") == self.param_dtype:
            with self.offload.region("params"):
                return func(*args, **kwargs)
        return func(*args, **kwargs)


@dataclass
class Built:
    """What `build_model` made: Megatron's transformer config, the DDP-wrapped model and its optimizer."""

    tf_config: Any
    model: Any
    optimizer: Any
    #: whether Adam's moments exist already (else the first optimizer step creates them)
    adam_state_up_front: bool


def optimizer_settings(cfg: ActorConfig) -> dict[str, Any]:
    """Megatron's OptimizerConfig fields from the actor's options (--lr, --weight-decay, Adam betas/eps,
    --clip-grad, precision, --use-distributed-optimizer); plain values, so a test reads them without Megatron."""
    return dict(optimizer="adam", lr=cfg.lr, min_lr=cfg.lr, weight_decay=cfg.weight_decay,
                adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2, adam_eps=cfg.adam_eps,
                clip_grad=cfg.clip_grad, bf16=cfg.torch_dtype == torch.bfloat16,
                fp16=cfg.torch_dtype == torch.float16, params_dtype=cfg.torch_dtype,
                use_distributed_optimizer=cfg.use_distributed_optimizer)


def ddp_settings(cfg: ActorConfig) -> dict[str, Any]:
    """Megatron's DistributedDataParallelConfig fields (--grad-reduce-in-bf16, --use-distributed-optimizer)."""
    return dict(grad_reduce_in_fp32=not cfg.grad_reduce_in_bf16, overlap_grad_reduce=False,
                use_distributed_optimizer=cfg.use_distributed_optimizer)


def model_settings(cfg: ActorConfig) -> dict[str, Any]:
    """The TransformerConfig fields the options set beyond the model's shape (precision, --recompute-granularity)."""
    return {"dtype": cfg.torch_dtype, **mmodel.recompute_overrides(cfg.recompute_granularity)}


def build_model(spec: mmodel.ModelSpec, cfg: ActorConfig, *, tp: int, cpu: bool, offload: Any, ep: int = 1,
                etp: int | None = None) -> Built:
    """GPTModel, DDP and Megatron's optimizer, each allocated under its offload tag (params, grads, optimizer)."""
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    tf_config = mmodel.transformer_config(spec, tp=tp, ep=ep, etp=etp, cpu_init=cpu, calculate_per_token_loss=False,
                                          **model_settings(cfg))
    # With the distributed optimizer DDP copies every parameter into its own buffer (in "params", below) and the
    # module's first storage becomes garbage: built in "params", PyTorch would keep it cached in that pool for good
    # (empty_cache skips a live private pool), one more copy of the weights resident or offloaded every step.
    moved_by_ddp = cfg.use_distributed_optimizer and not cpu
    with contextlib.nullcontext() if moved_by_ddp else offload.region("params"):
        module = mmodel.build_gpt_model(spec, tf_config)
        if cfg.torch_dtype != torch.float32:
            # What Megatron-LM's Float16Module does: the local spec's torch RMSNorm keeps fp32
            # weights otherwise, and bf16 activations through fp32 norm weights miss the fused kernel.
            module = module.to(cfg.torch_dtype)
        if not cpu:
            module = module.cuda()
    ddp_config = DistributedDataParallelConfig(**ddp_settings(cfg))
    with offload.region("grads"), _ParamBufferInParams(offload, cfg.torch_dtype):
        model = DistributedDataParallel(config=tf_config, ddp_config=ddp_config, module=module)
    if moved_by_ddp:
        torch.cuda.empty_cache()  # the first storage, now in the default pool
    # Without this hook the schedule never reduces gradients across DP ranks, and each rank
    # silently trains on its own partition only (tested in tests/real/megatron).
    tf_config.finalize_model_grads_func = finalize_model_grads
    tf_config.no_sync_func = model.no_sync
    with offload.region("optimizer"):
        optimizer = get_megatron_optimizer(OptimizerConfig(**optimizer_settings(cfg)), [model])
        adam_up_front = init_adam_state(optimizer)
    if cfg.torch_dtype == torch.float16:
        tf_config.grad_scale_func = optimizer.scale_loss  # fp16 needs the dynamic loss scale
    for group in optimizer.param_groups:
        group["lr"] = cfg.lr
    return Built(tf_config, model, optimizer, adam_up_front)
