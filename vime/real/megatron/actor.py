"""One Megatron training rank (a Ray actor): GPTModel + DDP + Megatron optimizer running the GRPO loss (seed steps 37–41, 45–52).

The class is plain Python; `vime.real.megatron.trainer` wraps it with `ray.remote`. Every rank
of the group (TP × DP; PP = 1) runs the same calls in the same order, because the calls that
touch weights (train, export, checkpoints) are collective over torch.distributed. On a machine
without CUDA the compat layer is installed first and gloo replaces NCCL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import os
import socket
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from vime.errors import ConfigError, TrainerError
from vime.protocols import WeightBucket
from vime.real.megatron import compat
from vime.real.megatron import model as mmodel

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ActorConfig:
    """What every rank needs to build and train its model (picklable; built from Args by the trainer)."""

    hf_config: dict[str, Any]
    hf_checkpoint: str | None = None  # load these HF safetensors; random init when None
    tensor_model_parallel_size: int = 1
    use_distributed_optimizer: bool = False
    lr: float = 1e-6
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    seed: int = 1234
    dtype: str = "auto"  # auto: bfloat16 on CUDA, float32 on CPU
    # Policy loss (seed step 40) and the log-prob reuse decision's inputs (seed step 38).
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    eps_clip_c: float | None = None
    loss_type: str = "policy_loss"
    advantage_estimator: str = "grpo"
    kl_coef: float = 0.0
    use_kl_loss: bool = False
    use_rollout_logprobs: bool = False
    get_mismatch_metrics: bool = False
    use_critic: bool = False
    use_opd: bool = False
    use_routing_replay: bool = False
    use_rollout_routing_replay: bool = False
    calculate_per_token_loss: bool = False
    rollout_temperature: float = 1.0
    # Offload (seed steps 37, 41): see make_offload_backend; always the accounted no-op on CPU.
    offload_backend: str = "auto"
    torch_threads: int = 1
    collective_timeout_s: float = 600.0  # a rank that never joins a collective fails the call instead of hanging

    @classmethod
    def from_args(cls, args: Any, hf_config: Mapping[str, Any] | None = None) -> ActorConfig:
        """Take every field that `args` (vime.config.Args or any namespace) carries under the same name."""
        if hf_config is None:
            path = getattr(args, "hf_checkpoint", None)
            if not path:
                raise ConfigError("the Megatron trainer needs --hf-checkpoint (an HF model directory with config.json)")
            hf_config = mmodel.load_hf_config(path)
        values: dict[str, Any] = {"hf_config": dict(hf_config)}
        for f in dataclasses.fields(cls):
            if f.name == "hf_config":
                continue
            try:
                v = getattr(args, f.name)
            except AttributeError:
                continue
            if v is not None:
                values[f.name] = v
        backend = getattr(args, "train_offload_backend", None)
        if backend:
            values["offload_backend"] = backend
        if values.get("hf_checkpoint") and not os.path.isdir(values["hf_checkpoint"]):
            raise ConfigError(f"--hf-checkpoint {values['hf_checkpoint']!r} is not a directory; point it at an "
                              "HF model directory (config.json + *.safetensors)")
        return cls(**values)

    @property
    def torch_dtype(self) -> torch.dtype:
        if self.dtype == "auto":
            return torch.bfloat16 if torch.cuda.is_available() else torch.float32
        if self.dtype not in _DTYPES:
            raise ConfigError(f"dtype {self.dtype!r} is not auto or one of {sorted(_DTYPES)}")
        return _DTYPES[self.dtype]


# --------------------------------------------------------------------------------------------
# Offload backends (seed steps 37, 41)
# --------------------------------------------------------------------------------------------


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


class CuMemOffload:
    """vime's CuMem allocator (`vime.real.cumem`, GPU): the trainer's state lives in regions of three
    tags (params, grads, optimizer); pause copies params and optimizer state to persistent pinned host
    buffers, drops grads, and resume maps all three back at the same addresses. Not exercised on CPU
    (the GPU issue covers it)."""

    name = "cumem"

    def __init__(self) -> None:
        from vime.real.cumem.torch_hook import trainer_cumem

        self._hook = trainer_cumem(torch.cuda.current_device())
        self.paused = False
        self.offloaded_bytes = 0
        self.events: list[str] = []

    def region(self, tag: str) -> contextlib.AbstractContextManager[None]:
        return self._hook.region(tag)

    def pause(self, nbytes: int) -> None:
        self._hook.allocator.pause(list(OFFLOAD_TAGS))
        self.paused = True
        self.offloaded_bytes = nbytes
        self.events.append("pause")

    def resume(self) -> None:
        self._hook.allocator.resume(list(OFFLOAD_TAGS))
        self.paused = False
        self.offloaded_bytes = 0
        self.events.append("resume")


#: The trainer's offloaded state by tag: module parameters, DDP's gradient buffers (dropped at sleep),
#: the optimizer's fp32 main parameters and Adam moments.
OFFLOAD_TAGS = ("params", "grads", "optimizer")


def make_offload_backend(name: str) -> Any:
    """The hook that picks the trainer's sleep/wake implementation (Args: --train-offload-backend).

    Without CUDA every choice becomes the accounted no-op. With CUDA: "cumem" (vime's allocator,
    the default of `vime.config`), "torch_memory_saver", or "auto" (= torch_memory_saver).
    """
    known = ("auto", "noop", "cumem", "torch_memory_saver")
    if name not in known:
        raise ConfigError(f"offload backend {name!r} is unknown; use one of {', '.join(known)}")
    if name == "noop" or not torch.cuda.is_available():
        return AccountedNoopOffload()
    if name == "cumem":
        return CuMemOffload()
    return TorchMemorySaverOffload()


def _init_adam_state(optimizer: Any) -> bool:
    """Create torch Adam's moments now, as its first step would (step 0, zero moments), so they are
    allocated inside the caller's offload region; returns False when an inner optimizer is not torch's
    Adam/AdamW (then its first step creates the state)."""
    inners: list[Any] = [getattr(o, "optimizer", None) for o in getattr(optimizer, "chained_optimizers", None) or [optimizer]]
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


def _host_views(tensors: Sequence[tuple[str, torch.Tensor]], *, pinned: bool) -> dict[str, torch.Tensor]:
    """Host tensors shaped like `tensors`, all views of one buffer (each at a 256-byte aligned offset)."""
    offsets, end = [], 0
    for _, t in tensors:
        end = -(-end // 256) * 256
        offsets.append(end)
        end += t.numel() * t.element_size()
    flat = torch.empty(max(end, 1), dtype=torch.uint8, pin_memory=pinned)
    return {name: flat[o: o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for (name, t), o in zip(tensors, offsets, strict=True)}


# --------------------------------------------------------------------------------------------
# Micro-batches
# --------------------------------------------------------------------------------------------


@dataclass
class MicroBatch:
    """Right-padded rows of one micro-batch and where each row's response sits."""

    tokens: torch.Tensor  # [b, s] int64
    position_ids: torch.Tensor  # [b, s]
    total_lengths: list[int]
    response_lengths: list[int]
    loss_masks: list[torch.Tensor]  # per row, [response_length]
    advantages: list[torch.Tensor]  # per row, [response_length]
    old_log_probs: list[torch.Tensor] | None
    loss_scale: float = 1.0  # see Actor._loss
    rows: list[int] = field(default_factory=list)


def make_micro_batch(tokens: Sequence[Sequence[int]], response_lengths: Sequence[int], *,
                     loss_masks: Sequence[Sequence[int]] | None = None,
                     advantages: Sequence[torch.Tensor] | None = None,
                     old_log_probs: Sequence[torch.Tensor] | None = None,
                     device: str | torch.device = "cpu", rows: Sequence[int] = ()) -> MicroBatch:
    """Pad rows on the right (causal attention never lets a pad token reach a real one)."""
    lengths = [len(t) for t in tokens]
    for t, r in zip(tokens, response_lengths, strict=True):
        if not 0 < r < len(t):
            raise TrainerError(f"a row has {len(t)} tokens and response_length {r}; it needs a prompt token "
                               "and at least one response token")
    width = max(lengths)
    ids = torch.zeros(len(tokens), width, dtype=torch.long)
    for i, t in enumerate(tokens):
        ids[i, : len(t)] = torch.as_tensor(list(t), dtype=torch.long)
    pos = torch.arange(width, dtype=torch.long).unsqueeze(0).expand(len(tokens), -1).contiguous()
    masks = [torch.as_tensor(list(m), dtype=torch.float32, device=device) for m in loss_masks] if loss_masks \
        else [torch.ones(r, device=device) for r in response_lengths]
    advs = [a.to(device) for a in advantages] if advantages is not None \
        else [torch.zeros(r, device=device) for r in response_lengths]
    old = [o.to(device) for o in old_log_probs] if old_log_probs is not None else None
    return MicroBatch(ids.to(device), pos.to(device), lengths, list(response_lengths), masks, advs, old,
                      rows=list(rows))


# --------------------------------------------------------------------------------------------
# The actor
# --------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MegatronActor:
    """One rank of the trainer group. Construct, then `setup(master_addr, master_port)` on every rank."""

    def __init__(self, cfg: ActorConfig, rank: int, world_size: int) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        self.spec = mmodel.spec_from_hf_config(cfg.hf_config)
        tp = cfg.tensor_model_parallel_size
        if world_size % tp:
            raise ConfigError(f"{world_size} trainer ranks cannot be split into TP groups of {tp}")
        self.spec.check_tp(tp)
        self.tp = tp
        self.dp = world_size // tp
        self.cpu = not torch.cuda.is_available()
        self.offload: Any = None
        self.asleep = False
        self._backup: dict[str, torch.Tensor] = {}
        self._last_offloaded = 0
        self.last_load = ""
        self._ipc: Any = None  # vime.real.ipc_weights.IpcExporter, made by the first IPC export

    # --- process group and model ----------------------------------------------------------------
    def master_address(self) -> tuple[str, int]:
        """Rank 0 picks the rendezvous address: this node's IP and a free port."""
        import ray

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        """Join torch.distributed (gloo on CPU, NCCL on GPU), build model, DDP and optimizer."""
        t0 = time.perf_counter()
        torch.set_num_threads(max(1, self.cfg.torch_threads))
        # Known, harmless noise of megatron-core 0.16.1 on torch 2.13 (deprecated collective names,
        # a .grad read of the distributed optimizer's shard views); keep actor logs readable.
        for pattern in (r"`torch\.distributed\.\w+` is deprecated", r"The \.grad attribute of a Tensor that is not a leaf",
                        r"Apex is not installed"):
            warnings.filterwarnings("ignore", message=pattern)
        compat.import_megatron()
        if self.cpu:
            compat.install()
        import torch.distributed as dist

        if not dist.is_initialized():
            if not self.cpu:
                local = int(os.environ.get("LOCAL_RANK", "0"))
                torch.cuda.set_device(local if torch.cuda.device_count() > 1 else 0)
            dist.init_process_group(
                "gloo" if self.cpu else "nccl", init_method=f"tcp://{master_addr}:{master_port}",
                rank=self.rank, world_size=self.world_size,
                timeout=datetime.timedelta(seconds=self.cfg.collective_timeout_s))
        from megatron.core import parallel_state as ps

        with compat.device_mode():
            ps.initialize_model_parallel(tensor_model_parallel_size=self.tp)
            compat.model_parallel_seed(self.cfg.seed, ps.get_tensor_model_parallel_rank())
            self.tp_rank = ps.get_tensor_model_parallel_rank()
            self.dp_rank = ps.get_data_parallel_rank()
            if not self.cpu:
                self._init_communicators(ps)
            self.offload = make_offload_backend(self.cfg.offload_backend)
            self._build()
            if self.cfg.hf_checkpoint:
                self.load_hf(self.cfg.hf_checkpoint)
            self.backup_weights()
        return {"rank": self.rank, "tp_rank": self.tp_rank, "dp_rank": self.dp_rank,
                "setup_s": time.perf_counter() - t0, "params": self.num_params(),
                "offload_backend": self.offload.name}

    def _init_communicators(self, ps: Any) -> None:
        """One tiny all-reduce on every group the step uses, now: NCCL creates its communicators (and
        their device buffers) at the first collective, and a first collective in the middle of the
        first step, with PyTorch's cache holding the activations, failed on the H200 ("Failed to CUDA
        calloc async", bench/megatron_step.py)."""
        import torch.distributed as dist

        groups = [None, ps.get_data_parallel_group(), ps.get_data_parallel_group(with_context_parallel=True),
                  ps.get_tensor_model_parallel_group(), ps.get_model_parallel_group()]
        x = torch.zeros(1, device=self._device())
        for group in {id(g): g for g in groups}.values():
            dist.all_reduce(x, group=group)
        torch.cuda.synchronize()

    def _build(self) -> None:
        from megatron.core.distributed import (
            DistributedDataParallel,
            DistributedDataParallelConfig,
            finalize_model_grads,
        )
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        cfg = self.cfg
        self.tf_config = mmodel.transformer_config(
            self.spec, tp=self.tp, dtype=cfg.torch_dtype, cpu_init=self.cpu,
            calculate_per_token_loss=False)
        with self.offload.region("params"):
            module = mmodel.build_gpt_model(self.spec, self.tf_config)
            if cfg.torch_dtype != torch.float32:
                # What Megatron-LM's Float16Module does: the local spec's torch RMSNorm keeps fp32
                # weights otherwise, and bf16 activations through fp32 norm weights miss the fused kernel.
                module = module.to(cfg.torch_dtype)
            if not self.cpu:
                module = module.cuda()
        ddp_config = DistributedDataParallelConfig(
            grad_reduce_in_fp32=True, overlap_grad_reduce=False,
            use_distributed_optimizer=cfg.use_distributed_optimizer)
        with self.offload.region("grads"):
            self.model = DistributedDataParallel(config=self.tf_config, ddp_config=ddp_config, module=module)
        # Without this hook the schedule never reduces gradients across DP ranks, and each rank
        # silently trains on its own partition only (tested in tests/real/megatron).
        self.tf_config.finalize_model_grads_func = finalize_model_grads
        self.tf_config.no_sync_func = self.model.no_sync
        opt_config = OptimizerConfig(
            optimizer="adam", lr=cfg.lr, min_lr=cfg.lr, weight_decay=cfg.weight_decay,
            adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2, adam_eps=cfg.adam_eps,
            clip_grad=cfg.clip_grad, bf16=cfg.torch_dtype == torch.bfloat16,
            fp16=cfg.torch_dtype == torch.float16, params_dtype=cfg.torch_dtype,
            use_distributed_optimizer=cfg.use_distributed_optimizer)
        with self.offload.region("optimizer"):
            self.optimizer = get_megatron_optimizer(opt_config, [self.model])
            self._adam_state_up_front = _init_adam_state(self.optimizer)
        if cfg.torch_dtype == torch.float16:
            self.tf_config.grad_scale_func = self.optimizer.scale_loss  # fp16 needs the dynamic loss scale
        for group in self.optimizer.param_groups:
            group["lr"] = cfg.lr

    @property
    def module(self) -> Any:
        return self.model.module

    def num_params(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def set_finalize_grads(self, enabled: bool) -> None:
        """Tests only: unhook DP gradient reduction to show that the DP test can fail."""
        from megatron.core.distributed import finalize_model_grads

        self.tf_config.finalize_model_grads_func = finalize_model_grads if enabled else None

    # --- forward pieces -------------------------------------------------------------------------
    def _device(self) -> torch.device:
        return torch.device("cpu") if self.cpu else torch.device("cuda", torch.cuda.current_device())

    def _token_stats(self, logits: torch.Tensor, tokens: torch.Tensor,
                     with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-position log-prob of the next token ([b, s-1]) from vocab-parallel logits, and entropy."""
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        logits = logits[:, :-1].float()
        if self.cfg.rollout_temperature != 1.0:
            logits = logits / self.cfg.rollout_temperature
        per_rank = logits.shape[-1]
        vocab = self.spec.vocab_size
        start = self.tp_rank * per_rank
        if start + per_rank > vocab:  # padded vocab entries must not take probability mass
            pad = torch.arange(start, start + per_rank, device=logits.device) >= vocab
            logits = logits.masked_fill(pad, -1e30)
        entropy = None
        if with_entropy:
            with torch.no_grad():
                entropy = self._vocab_parallel_entropy(logits.detach(), ps.get_tensor_model_parallel_group())
        logp = -vocab_parallel_cross_entropy(logits.contiguous(), tokens[:, 1:].contiguous())
        return logp, entropy

    @staticmethod
    def _vocab_parallel_entropy(logits: torch.Tensor, group: Any) -> torch.Tensor:
        import torch.distributed as dist

        m = logits.max(dim=-1, keepdim=True).values
        dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
        e = torch.exp(logits - m)
        z = e.sum(dim=-1, keepdim=True)
        ez = (e * (logits - m)).sum(dim=-1, keepdim=True)
        dist.all_reduce(z, group=group)
        dist.all_reduce(ez, group=group)
        return (torch.log(z) - ez / z).squeeze(-1)

    @staticmethod
    def _response_slice(logp: torch.Tensor, row: int, total: int, resp: int) -> torch.Tensor:
        # Token at position p is predicted by the logits at p-1: the response tokens at
        # [total-resp, total) read log-probs [total-resp-1, total-1).
        return logp[row, total - resp - 1: total - 1]

    # --- the loss (seed steps 39–40) ------------------------------------------------------------
    def _loss(self, mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        from vime.algo.policy_loss import Aggregation, aggregate, compute_policy_loss

        logp, entropy = self._token_stats(logits, mb.tokens, with_entropy=True)
        rows = list(enumerate(zip(mb.total_lengths, mb.response_lengths, strict=True)))
        cur = torch.cat([self._response_slice(logp, i, t, r) for i, (t, r) in rows])
        # Reused old log-probs (seed step 38): the policy has not moved yet, so old = current, detached.
        old = torch.cat(mb.old_log_probs) if mb.old_log_probs is not None else cur.detach()
        ppo_kl = old - cur
        eps_high = self.cfg.eps_clip if self.cfg.eps_clip_high is None else self.cfg.eps_clip_high
        pg_losses, clipped = compute_policy_loss(ppo_kl, torch.cat(mb.advantages), self.cfg.eps_clip,
                                                 eps_high, eps_clip_c=self.cfg.eps_clip_c)
        assert entropy is not None
        ent = torch.cat([self._response_slice(entropy, i, t, r) for i, (t, r) in rows])
        mode: Aggregation = "token_mean" if self.cfg.calculate_per_token_loss else "sample_mean"
        pg_loss = aggregate(pg_losses, mb.loss_masks, mode)
        with torch.no_grad():
            clipfrac = aggregate(clipped, mb.loss_masks, mode)
            ent_mean = aggregate(ent, mb.loss_masks, mode)
        # The schedule divides what we return by the number of micro-batches; loss_scale undoes
        # that and weighs this micro-batch by its share of the step's rows on this rank, so uneven
        # micro-batches still weigh every row equally.
        loss = pg_loss * mb.loss_scale
        n = float(len(rows))
        metrics = {"loss": pg_loss.detach() * n, "pg_clipfrac": clipfrac * n,
                   "entropy": ent_mean * n, "rows": torch.tensor(n)}
        return loss, metrics

    def _micro_batches(self, batch: Any, groups: Sequence[Sequence[int]],
                       old_log_probs: Sequence[torch.Tensor] | None) -> list[MicroBatch]:
        from vime.algo.advantages import get_grpo_returns

        step_rows = sum(len(g) for g in groups)
        advantages = get_grpo_returns(batch.rewards, batch.response_lengths)  # seed step 39
        out = []
        for g in groups:
            mb = make_micro_batch(
                [batch.tokens[i] for i in g], [batch.response_lengths[i] for i in g],
                loss_masks=[batch.loss_masks[i] for i in g], advantages=[advantages[i] for i in g],
                old_log_probs=None if old_log_probs is None else [old_log_probs[i] for i in g],
                device=self._device(), rows=list(g))
            mb.loss_scale = len(groups) * len(g) / max(step_rows, 1)
            out.append(mb)
        return out

    def _run_schedule(self, mbs: list[MicroBatch], forward_only: bool, loss_fn: Any) -> list[Any]:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        def forward_step(data_iterator: Iterator[MicroBatch], model: Any) -> tuple[torch.Tensor, Any]:
            mb = next(data_iterator)
            logits = model(mb.tokens, mb.position_ids, None)
            return logits, partial(loss_fn, mb)

        seq = max(mb.tokens.shape[1] for mb in mbs)
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(mbs), model=[self.model],
            num_microbatches=len(mbs), seq_length=seq, micro_batch_size=mbs[0].tokens.shape[0],
            forward_only=forward_only)

    # --- protocol calls -------------------------------------------------------------------------
    def _check_awake(self, call: str) -> None:
        if self.asleep:
            raise TrainerError(f"rank {self.rank}: {call}() while asleep; call wake_up() first")

    def compute_log_prob(self, batch: Any, micro_batches: Sequence[Sequence[int]] | None = None) -> list[list[float]]:
        """Per-response-token log-probs of every row of `batch` under the current weights (seed step 38)."""
        self._check_awake("compute_log_prob")
        return [t.tolist() for t in self._log_probs(batch, micro_batches)]

    def _log_probs(self, batch: Any, micro_batches: Sequence[Sequence[int]] | None = None) -> list[torch.Tensor]:
        groups = micro_batches or getattr(batch, "micro_batch_indices", None) or [list(range(len(batch.tokens)))]
        out: dict[int, torch.Tensor] = {}

        def collect(mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            logp, _ = self._token_stats(logits, mb.tokens, with_entropy=False)
            for i, (t, r) in enumerate(zip(mb.total_lengths, mb.response_lengths, strict=True)):
                out[mb.rows[i]] = self._response_slice(logp, i, t, r).detach().float().cpu()
            return logp.sum() * 0.0, {}

        with compat.device_mode(), torch.no_grad():
            self.model.eval()
            mbs = [make_micro_batch([batch.tokens[i] for i in g], [batch.response_lengths[i] for i in g],
                                    device=self._device(), rows=list(g)) for g in groups]
            self._run_schedule(mbs, True, collect)
            self.model.train()
        return [out[i] for i in range(len(batch.tokens))]

    def train(self, rollout_id: int, batch: Any) -> dict[str, Any]:
        """One rollout on this rank's partition (`vime.types.RankBatch`): seed steps 38–41."""
        self._check_awake("train")
        t0 = time.perf_counter()
        with compat.device_mode():
            num_mb = list(batch.num_microbatches)
            from vime.algo.logprob_reuse import needs_log_prob_recompute

            recompute = needs_log_prob_recompute(self.cfg, num_mb)  # seed step 38
            old = self._log_probs(batch, batch.micro_batch_indices) if recompute else None
            if self.cfg.use_rollout_logprobs:
                if batch.rollout_log_probs is None:
                    raise ConfigError("--use-rollout-logprobs needs the engines' log-probs in the batch, "
                                      "but rollout_log_probs is None")
                old = [torch.as_tensor(x, dtype=torch.float32, device=self._device())
                       for x in batch.rollout_log_probs]
            sums = {"loss": 0.0, "pg_clipfrac": 0.0, "entropy": 0.0, "rows": 0.0}
            grad_norms, tokens = [], 0
            for step in range(len(num_mb)):
                groups = batch.micro_batches(step)
                mbs = self._micro_batches(batch, groups, old)
                tokens += sum(int(mb.tokens.numel()) for mb in mbs)
                self.model.zero_grad_buffer()
                self.optimizer.zero_grad()
                reduced = self._run_schedule(mbs, False, self._loss)
                # The step's temporaries (fp32 grad copies, foreach buffers: 8 B/param) stay outside the
                # offloaded tags, so a pause never copies them; Adam's moments exist already, unless the
                # optimizer is not torch's Adam, whose state the first step then creates in its tag.
                region = contextlib.nullcontext() if self._adam_state_up_front else self.offload.region("optimizer")
                with region:
                    ok, grad_norm, _ = self.optimizer.step()
                self._adam_state_up_front = True
                if not ok:
                    raise TrainerError(f"rank {self.rank}: optimizer step {step} of rollout {rollout_id} "
                                       "was skipped (non-finite gradients)")
                grad_norms.append(float(grad_norm) if grad_norm is not None else 0.0)
                for d in reduced:
                    for k in sums:
                        sums[k] += float(d[k])
            self.backup_weights()  # seed step 41: export reads this backup
        elapsed = time.perf_counter() - t0
        rows = max(sums["rows"], 1.0)
        return {"rollout_id": rollout_id, "loss": sums["loss"] / rows, "pg_clipfrac": sums["pg_clipfrac"] / rows,
                "entropy": sums["entropy"] / rows, "grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
                "tokens": tokens, "num_steps": len(num_mb), "recomputed_log_probs": recompute,
                "train_time": elapsed, "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
                "dp_rank": self.dp_rank, "tp_rank": self.tp_rank}

    # --- offload (seed steps 37, 41) -------------------------------------------------------------
    def _state_bytes(self) -> int:
        params = sum(p.numel() * p.element_size() for p in self.module.parameters())
        grads = sum(b.grad_data.numel() * b.grad_data.element_size() for b in self.model.buffers)
        # Walk the inner torch optimizers' state rather than Megatron's state_dict(): the
        # distributed optimizer's state_dict() asserts before its first step, and a colocated
        # run sleeps the trainer before it ever trained (seed steps 3 and 43).
        opt = 0
        seen = {id(p) for p in self.module.parameters()}
        for outer in getattr(self.optimizer, "chained_optimizers", None) or [self.optimizer]:
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
        return params + grads + opt

    def sleep(self) -> dict[str, Any]:
        """Offload params and optimizer state, drop grads (seed step 41)."""
        self._check_awake("sleep")
        nbytes = self._state_bytes()
        self.model.zero_grad_buffer()
        self._sleep_fingerprint = self._fingerprint()
        self.offload.pause(nbytes)
        if not self.cpu:
            # The activations and the optimizer step's temporaries sit in PyTorch's cache outside the
            # offloaded tags: hand them back too, or the engines' KV cache cannot be mapped again.
            torch.cuda.empty_cache()
        self._last_offloaded = nbytes
        self.asleep = True
        return {"offloaded_bytes": nbytes, "backend": self.offload.name}

    def offload_info(self) -> dict[str, Any]:
        """Which backend sleeps this rank, its pause/resume history and the bytes of the last sleep."""
        return {"backend": self.offload.name, "events": list(self.offload.events),
                "last_offloaded_bytes": self._last_offloaded}

    def wake_up(self) -> dict[str, Any]:
        """Bring trainer state back (seed step 37)."""
        if not self.asleep:
            raise TrainerError(f"rank {self.rank}: wake_up() while awake")
        self.offload.resume()
        self.asleep = False
        self._check_fingerprint()
        return {"backend": self.offload.name, "events": list(self.offload.events)}

    def _kept_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """What a sleep must keep: the module's parameters and the optimizer's main copies and moments."""
        out = [(n, p) for n, p in self.module.named_parameters()]
        for k, inner in enumerate(self._inner_optimizers()):
            for g, group in enumerate(inner.param_groups):
                for i, prm in enumerate(group["params"]):
                    out.append((f"optimizer{k}.group{g}.param{i}", prm))
                    for key, v in inner.state.get(prm, {}).items():
                        if torch.is_tensor(v) and v.device.type != "cpu":
                            out.append((f"optimizer{k}.group{g}.param{i}.{key}", v))
        return out

    def _fingerprint(self) -> torch.Tensor | None:
        """Per-tensor sums of everything a sleep keeps (one fp64 vector), to prove the wake restored it."""
        if self.cpu:
            return None  # the CPU stand-in moves nothing
        with torch.no_grad():
            return torch.stack([t.detach().sum(dtype=torch.float64) for _, t in self._kept_tensors()]).cpu()

    def _check_fingerprint(self) -> None:
        """Raise if a tensor the sleep kept came back different: training on it would train something else."""
        before, self._sleep_fingerprint = getattr(self, "_sleep_fingerprint", None), None
        after = self._fingerprint()
        if before is None or after is None:
            return
        changed = [n for (n, _), a, b in zip(self._kept_tensors(), after.tolist(), before.tolist(), strict=True)
                   if not (a == b or (a != a and b != b))]
        if changed:
            raise TrainerError(f"rank {self.rank}: {len(changed)} of {len(after)} tensors changed across sleep/wake "
                               f"with the {self.offload.name} offload backend (first: {changed[:3]}); the trainer "
                               "state was not restored, so training would go on from other weights")

    # --- weights --------------------------------------------------------------------------------
    def backup_weights(self) -> None:
        """Copy this rank's parameter shards to host memory (seed step 41).

        The host copy is one buffer allocated at the first backup (pinned on a GPU) and overwritten in
        place afterwards: a fresh pageable copy each step paid the VM's page population (~0.5 s/GiB on
        the H200 machine, bench/data/h200_pin_cost.json) on top of a copy at a third of the pinned rate."""
        params = list(self.module.named_parameters())
        if [n for n, _ in params] != list(self._backup) or any(
                self._backup[n].shape != q.shape or self._backup[n].dtype != q.dtype for n, q in params):
            self._backup = _host_views([(n, q) for n, q in params], pinned=not self.cpu)
        with torch.no_grad():
            for name, q in params:
                self._backup[name].copy_(q.detach(), non_blocking=not self.cpu)
        if not self.cpu:
            torch.cuda.synchronize()

    def _gather_full(self, name: str, local: torch.Tensor) -> torch.Tensor:
        """Megatron-full tensor of `name` from every TP rank's shard (collective over TP)."""
        import torch.distributed as dist
        from megatron.core import parallel_state as ps

        if self.tp == 1 or mmodel.partition_dim(name) is None:
            return local
        t = local if self.cpu else local.to(self._device())
        parts = [torch.empty_like(t) for _ in range(self.tp)]
        dist.all_gather(parts, t.contiguous(), group=ps.get_tensor_model_parallel_group())
        return mmodel.unshard(name, [p.cpu() for p in parts])

    def hf_state(self, from_backup: bool = True) -> dict[str, torch.Tensor]:
        """HF-named full tensors (collective over TP: every TP rank must call it)."""
        source = self._backup if from_backup else {n: p.detach() for n, p in self.module.named_parameters()}
        out: dict[str, torch.Tensor] = {}
        with compat.device_mode():
            for name in mmodel.hf_export_order(self.spec, source):
                full = self._gather_full(name, source[name])
                for hf_name, t in mmodel.megatron_to_hf(self.spec, name, full):
                    out[hf_name] = t.contiguous()
        return out

    def export_weights(self, bucket_bytes: int) -> list[WeightBucket]:
        """HF weights packed into buckets of at most `bucket_bytes` (seed step 48). Collective; only
        global rank 0 returns buckets (with `tensors` filled), the others an empty list."""
        if bucket_bytes <= 0:
            raise ConfigError(f"--update-weight-buffer-size must be positive, got {bucket_bytes}")
        state = self.hf_state(from_backup=True)
        if self.rank != 0:
            return []
        buckets: list[WeightBucket] = []
        cur: dict[str, torch.Tensor] = {}
        size = 0

        def flush() -> None:
            nonlocal cur, size
            if cur:
                buckets.append(WeightBucket(
                    names=list(cur), dtype_names=[str(t.dtype).removeprefix("torch.") for t in cur.values()],
                    shapes=[list(t.shape) for t in cur.values()], nbytes=size, tensors=cur,
                    index=len(buckets)))
            cur, size = {}, 0

        for name, t in state.items():
            n = t.numel() * t.element_size()
            if cur and size + n > bucket_bytes:
                flush()
            cur[name] = t
            size += n
        flush()
        return buckets

    # --- CUDA-IPC export (colocated; vime.real.ipc_weights) ---------------------------------------
    def ipc_export_begin(self, bucket_bytes: int) -> tuple[list[Any], str | None]:
        """Collective: gather the HF state from the backup (seed step 41) and plan its buckets; the
        staging buffer (allocated once, outside the offload region) is sized for the largest bucket.
        Returns the plan (the same on every rank) and this rank's GPU UUID (None on CPU)."""
        from vime.real import ipc_weights

        if self._ipc is None:
            self._ipc = ipc_weights.IpcExporter(self._device())
        layouts = self._ipc.begin(self.hf_state(from_backup=True), bucket_bytes)
        return layouts, (None if self.cpu else ipc_weights.device_uuid(self._device()))

    def ipc_export_stage(self, index: int, ack: int | None) -> Any:
        """Stage bucket `index` into this rank's buffer once bucket `ack` is loaded by every engine
        (seed steps 48–50): (uuid, handles) on GPU, the staged tensors on CPU."""
        if self._ipc is None:
            raise TrainerError(f"rank {self.rank}: ipc_export_stage before ipc_export_begin")
        return self._ipc.stage(index, ack)

    def ipc_export_end(self, ack: int | None, abort: bool = False) -> None:
        if self._ipc is not None:
            self._ipc.end(ack, abort=abort)

    def ipc_export_info(self) -> dict[str, Any]:
        """The staging buffer's size, address and allocation count (tests check it is reused)."""
        st = self._ipc.staging if self._ipc is not None else None
        return {"allocations": st.allocations if st else 0, "capacity": st.capacity if st else 0,
                "address": st.buffer.data_ptr() if st and st.buffer is not None else 0}

    def load_hf(self, path: str) -> None:
        """Load HF safetensors from `path` into this rank's shards (HF → Megatron full → shard)."""
        hf = mmodel.read_hf_safetensors(path)
        full = mmodel.hf_to_megatron(self.spec, hf, tp=self.tp)
        params = dict(self.module.named_parameters())
        missing = sorted(set(params) - set(full))
        if missing:
            raise TrainerError(f"HF checkpoint {path!r} lacks tensors for {missing[:4]}")
        with torch.no_grad():
            for name, p in params.items():
                src = mmodel.shard(name, full[name], self.tp_rank, self.tp)
                if tuple(src.shape) != tuple(p.shape):
                    raise TrainerError(f"{name}: checkpoint shard {tuple(src.shape)} does not fit parameter "
                                       f"{tuple(p.shape)}; does the checkpoint match the HF config?")
                p.copy_(src.to(p.dtype))
        # The optimizer may hold fp32 main copies of the params: refresh them from the model.
        reload = getattr(self.optimizer, "reload_model_params", None)
        if reload is not None:
            reload()

    def _inner_optimizers(self) -> list[Any]:
        """The torch optimizers under Megatron's wrapper(s): they hold the Adam moments."""
        return [opt.optimizer for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer])]

    def _layout(self) -> dict[str, Any]:
        return {"tp": self.tp, "dp": self.dp, "rank": self.rank,
                "distributed_optimizer": self.cfg.use_distributed_optimizer}

    def save_checkpoint(self, rollout_id: int, path: str) -> None:
        """Weights as HF safetensors (rank 0, TP shards gathered), each rank's optimizer state, and
        `vime_state.json` (the rollout id) written last, so a checkpoint without it is incomplete."""
        import torch.distributed as dist

        state = self.hf_state(from_backup=False)
        if self.rank == 0:
            mmodel.write_hf_safetensors(path, state.items(), config=self.cfg.hf_config)
            os.makedirs(os.path.join(path, "optimizer"), exist_ok=True)
        dist.barrier()
        torch.save({"layout": self._layout(), "states": [o.state_dict() for o in self._inner_optimizers()]},
                   os.path.join(path, "optimizer", f"rank{self.rank:05d}.pt"))
        dist.barrier()
        if self.rank == 0:
            with open(os.path.join(path, "vime_state.json"), "w") as fh:
                json.dump({"rollout_id": rollout_id, "next_rollout_id": rollout_id + 1, "layout": self._layout()}, fh)
        dist.barrier()

    def load_checkpoint(self, path: str) -> int:
        """Load a `save_checkpoint` directory; returns the rollout id to resume from.

        Weights load into any TP/DP layout (they are HF tensors). The optimizer state loads only
        into the layout that saved it; otherwise Adam restarts (`last_load` says which happened).
        """
        state_file = os.path.join(path, "vime_state.json")
        if not os.path.exists(state_file):
            raise TrainerError(f"{path!r} is not a complete vime checkpoint (no vime_state.json)")
        self.load_hf(path)
        opt_file = os.path.join(path, "optimizer", f"rank{self.rank:05d}.pt")
        self.last_load = "optimizer reset"
        if os.path.exists(opt_file):
            saved = torch.load(opt_file, map_location="cpu", weights_only=False)
            if saved["layout"] == self._layout():
                for opt, st in zip(self._inner_optimizers(), saved["states"], strict=True):
                    opt.load_state_dict(st)
                self.last_load = "optimizer restored"
        self.backup_weights()
        with open(state_file) as fh:
            return int(json.load(fh)["next_rollout_id"])

    def last_load_info(self) -> str:
        return self.last_load

    # --- inspection (tests, debugging) ----------------------------------------------------------
    def local_params(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().cpu().clone() for n, p in self.module.named_parameters()}

    def full_logits(self, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        """Full-vocabulary logits [b, s, vocab] (TP-gathered) for equal-length rows."""
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        ids = torch.as_tensor([list(t) for t in tokens], dtype=torch.long, device=self._device())
        pos = torch.arange(ids.shape[1], device=self._device()).unsqueeze(0).expand_as(ids).contiguous()
        with compat.device_mode(), torch.no_grad():
            self.model.eval()
            logits = self.model(ids, pos, None)
            self.model.train()
            full = gather_from_tensor_model_parallel_region(logits)
        return full[..., : self.spec.vocab_size].float().cpu()

    def memory(self) -> dict[str, float]:
        """Resident memory of this process (MiB) and peak CUDA memory when on a GPU."""
        import resource

        out = {"max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
        if not self.cpu:
            out["cuda_max_allocated_mib"] = torch.cuda.max_memory_allocated() / 2**20
        return out
