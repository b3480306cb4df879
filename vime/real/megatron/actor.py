"""One Megatron training rank (a Ray actor): GPTModel + DDP + Megatron optimizer running the GRPO loss (seed steps 37–41, 45–52).

The class is plain Python; `vime.real.megatron.trainer` wraps it with `ray.remote`. Every rank
of the group (TP × DP; PP = 1) runs the same calls in the same order, because the calls that
touch weights (train, export, checkpoints) are collective over torch.distributed. On a machine
without CUDA the compat layer is installed first and gloo replaces NCCL. The pieces live beside
it: `batches` (micro-batches, schedule), `loss`, `offload` (sleep/wake), `weights` (backup,
export, checkpoints).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch

from vime.errors import ConfigError, TrainerError
from vime.real.megatron import compat
from vime.real.megatron import memory as gpu_memory
from vime.real.megatron import model as mmodel
from vime.real.megatron.batches import (
    MicroBatch,
    log_prob_micro_batches,
    moe_widths,
    padded_rows,
    run_schedule,
    train_micro_batches,
)
from vime.real.megatron.build import build_model, init_communicators, join_process_group
from vime.real.megatron.loss import TokenScorer, policy_loss, response_slice
from vime.real.megatron.offload import (
    changed_tensors,
    empty_resident_cache,
    fingerprint,
    kept_tensors,
    make_offload_backend,
    plan_tags,
    state_bytes,
)
from vime.real.megatron.reference import ReferenceModel
from vime.real.megatron.weight_calls import WeightCalls
from vime.real.megatron.weights import ActorWeights
from vime.real.ports import free_port
from vime.sim.moe import effective_expert_tp

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ActorConfig:
    """What every rank needs to build and train its model (picklable; built from Args by the trainer)."""

    hf_config: dict[str, Any]
    hf_checkpoint: str | None = None  # load these HF safetensors; random init when None
    tensor_model_parallel_size: int = 1
    expert_model_parallel_size: int = 1  # MoE: EP splits the routed experts (whole ones) over ranks
    expert_tensor_parallel_size: int | None = None  # None: vime.sim.moe.effective_expert_tp (1 with EP, else TP)
    use_distributed_optimizer: bool = False
    grad_reduce_in_bf16: bool = False  # DDP's grads in the training dtype, not fp32 (--grad-reduce-in-bf16)
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
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "low_var_kl"
    ref_load: str | None = None  # the KL reference; None: the initial --hf-checkpoint
    ref_placement: str = "gpu"  # gpu: beside the policy (params tag); host: pinned host, copied in per train call
    entropy_coef: float = 0.0
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    use_rollout_logprobs: bool = False
    get_mismatch_metrics: bool = False
    use_critic: bool = False
    use_opd: bool = False
    use_routing_replay: bool = False
    use_rollout_routing_replay: bool = False
    calculate_per_token_loss: bool = False
    recompute_granularity: str | None = None  # None, "full" or "selective" (--recompute-granularity)
    rollout_temperature: float = 1.0
    # Offload (seed steps 37, 41): see make_offload_backend; always the accounted no-op on CPU.
    offload_backend: str = "auto"
    train_offload_plan: str = "all"  # the tags a sleep sends away (--train-offload-plan); the rest stay mapped
    offload_train: bool = True  # False (--no-offload-train): resident, so each train call empties the cache itself
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
        for flag, dtype in (("bf16", "bfloat16"), ("fp16", "float16")):  # Megatron's precision flags
            if getattr(args, flag, False):
                values["dtype"] = dtype
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


class MegatronActor(WeightCalls):
    """One rank of the trainer group. Construct, then `setup(master_addr, master_port)` on every rank.

    Every public method is called by name through `ray.remote` (`vime.real.megatron.trainer`).
    """

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
        self.ep = cfg.expert_model_parallel_size
        self.etp = effective_expert_tp(tp, self.ep, cfg.expert_tensor_parallel_size)
        self.spec.check_experts(self.ep, self.etp, world_size)
        self.cpu = not torch.cuda.is_available()
        self.offload: Any = None
        self.asleep = False
        self._last_offloaded = 0
        self._asleep_memory: dict[str, float] = {}
        self._sleep_fingerprint: torch.Tensor | None = None
        self.weights: ActorWeights | None = None  # made by setup()
        self.reference: ReferenceModel | None = None  # the KL loss's reference, made by setup()

    # --- process group and model ----------------------------------------------------------------
    def master_address(self) -> tuple[str, int]:
        """Rank 0 picks the rendezvous address: this node's IP and a port free on it (every rank,
        on any node, connects there)."""
        import ray

        ip = ray.util.get_node_ip_address()
        return ip, free_port(ip)

    def exit_with_node(self) -> bool:
        """Inside a Ray actor: end this process when its node's raylet dies (`vime.real.lifeline`), so a
        failed node leaves no rank behind; False where that cannot be watched."""
        from vime.real.lifeline import exit_with_raylet

        return exit_with_raylet()

    def where(self) -> dict[str, Any]:
        """This rank's Ray node id, the node's IP and the process id (for the placement report)."""
        import ray

        return {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}

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
        join_process_group(self.cfg, self.rank, self.world_size, master_addr, master_port, cpu=self.cpu)
        from megatron.core import parallel_state as ps

        with compat.device_mode():
            ps.initialize_model_parallel(tensor_model_parallel_size=self.tp, expert_model_parallel_size=self.ep,
                                         expert_tensor_parallel_size=self.etp)
            self.tp_rank = ps.get_tensor_model_parallel_rank()
            self.dp_rank = ps.get_data_parallel_rank()
            self.ep_rank = ps.get_expert_model_parallel_rank()
            self.etp_rank = ps.get_expert_tensor_parallel_rank()
            compat.model_parallel_seed(self.cfg.seed, self.tp_rank, self.ep_rank, self.etp_rank)
            self.scorer = TokenScorer(self.spec.vocab_size, self.tp_rank, self.cfg.rollout_temperature)
            if not self.cpu:
                init_communicators(ps, self._device())
            self.offload = make_offload_backend(self.cfg.offload_backend, self.cfg.train_offload_plan)
            built = build_model(self.spec, self.cfg, tp=self.tp, ep=self.ep, etp=self.etp, cpu=self.cpu,
                                offload=self.offload)
            self.tf_config, self.model, self.optimizer = built.tf_config, built.model, built.optimizer
            self._adam_state_up_front = built.adam_state_up_front
            self._align = moe_widths(self.tf_config, self._device())
            experts = dict(ep=self.ep, ep_rank=self.ep_rank, etp=self.etp, etp_rank=self.etp_rank)
            self.weights = ActorWeights(
                model=self.model, optimizer=self.optimizer, spec=self.spec, hf_config=self.cfg.hf_config,
                rank=self.rank, tp=self.tp, tp_rank=self.tp_rank, dp=self.dp,
                distributed_optimizer=self.cfg.use_distributed_optimizer, device=self._device(), **experts)
            if self.cfg.hf_checkpoint:
                self.load_hf(self.cfg.hf_checkpoint)
            self.reference = None
            if self.cfg.use_kl_loss or self.cfg.kl_coef > 0:
                self.reference = ReferenceModel(self.spec, self.cfg, tp=self.tp, tp_rank=self.tp_rank, cpu=self.cpu,
                                                offload=self.offload, path=self.cfg.ref_load, policy=self.module,
                                                align=self._align, **experts)
            self.backup_weights()
        return {"rank": self.rank, "tp_rank": self.tp_rank, "dp_rank": self.dp_rank, "ep_rank": self.ep_rank,
                "setup_s": time.perf_counter() - t0, "params": self.num_params(),
                "offload_backend": self.offload.name}

    @property
    def module(self) -> Any:
        return self.model.module

    def num_params(self) -> int:
        return sum(p.numel() for p in self.module.parameters())

    def set_finalize_grads(self, enabled: bool) -> None:
        """Tests only: unhook DP gradient reduction to show that the DP test can fail."""
        from megatron.core.distributed import finalize_model_grads

        self.tf_config.finalize_model_grads_func = finalize_model_grads if enabled else None

    def _device(self) -> torch.device:
        return torch.device("cpu") if self.cpu else torch.device("cuda", torch.cuda.current_device())

    def _weights(self) -> ActorWeights:
        if self.weights is None:
            raise TrainerError(f"rank {self.rank}: setup() has not run")
        return self.weights

    # --- protocol calls (seed steps 38–41) ------------------------------------------------------
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
            logp, _ = self.scorer.token_stats(logits, mb.tokens, with_entropy=False)
            for i, (t, r) in enumerate(zip(mb.total_lengths, mb.response_lengths, strict=True)):
                out[mb.rows[i]] = response_slice(logp, i, t, r).detach().float().cpu()
            return logp.sum() * 0.0, {}

        with compat.device_mode(), torch.no_grad():
            self.model.eval()
            run_schedule(self.model, self._align(log_prob_micro_batches(batch, groups, self._device())), True, collect)
            self.model.train()
        return [out[i] for i in range(len(batch.tokens))]

    def train(self, rollout_id: int, batch: Any) -> dict[str, Any]:
        """One rollout on this rank's partition (`vime.types.RankBatch`): seed steps 38–41."""
        self._check_awake("train")
        t0 = time.perf_counter()
        with compat.device_mode():
            num_mb = list(batch.num_microbatches)
            recompute = bool(batch.recompute_log_probs)  # seed step 38, decided by the batch builder
            old = self._log_probs(batch, batch.micro_batch_indices) if recompute else None
            t_log_probs = time.perf_counter()
            rollout = None
            if batch.rollout_log_probs is not None:
                rollout = [torch.as_tensor(x, dtype=torch.float32, device=self._device())
                           for x in batch.rollout_log_probs]
            if self.cfg.use_rollout_logprobs:
                if rollout is None:
                    raise ConfigError("--use-rollout-logprobs needs the engines' log-probs in the batch, "
                                      "but rollout_log_probs is None")
                old = rollout
            ref, ref_time = None, 0.0
            if self.reference is not None:
                t_ref = time.perf_counter()
                ref = self.reference.log_probs(batch, batch.micro_batch_indices, self.scorer, self._device())
                ref_time = time.perf_counter() - t_ref
            advantages = rank_advantages(self.cfg, batch, old, ref)
            t_train = time.perf_counter()
            sums = {"loss": 0.0, "pg_clipfrac": 0.0, "entropy": 0.0, "rows": 0.0}
            extra = {"kl_loss": 0.0, "tis_weight": 0.0, "train_rollout_logprob_abs_diff": 0.0}
            grad_norms, tokens = [], 0
            loss_fn = partial(policy_loss, self.cfg, self.scorer)
            parts, calls = _Parts(sync=not self.cpu), {}  # the simulator's train-phase terms are checked on these
            for step in range(len(num_mb)):
                mbs = self._align(train_micro_batches(batch, batch.micro_batches(step), old, self._device(),
                                                      advantages=advantages, rollout_log_probs=rollout,
                                                      ref_log_probs=ref))
                tokens += sum(int(mb.tokens.numel()) for mb in mbs)
                parts.mark("batches")
                self.model.zero_grad_buffer()
                self.optimizer.zero_grad()
                reduced = run_schedule(self.model, mbs, False, loss_fn, calls)
                parts.mark("schedule")
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
                parts.mark("optimizer")
                for d in reduced:
                    for k in sums:
                        sums[k] += float(d[k])
                    for k in extra:
                        extra[k] += float(d.get(k, 0.0))
            parts.seconds.update({f"{k} (in schedule, host)": v for k, v in calls.items()})
            parts.log(self.rank, f"train ({sum(num_mb)} micro-batches, {len(num_mb)} steps)")
            t_backup = time.perf_counter()
            self.backup_weights()  # seed step 41: export reads this backup
            empty_resident_cache(self.cfg.offload_train, self.cpu)
        t_end = time.perf_counter()
        elapsed = t_end - t0
        rows = max(sums["rows"], 1.0)
        out = {"rollout_id": rollout_id, "loss": sums["loss"] / rows, "pg_clipfrac": sums["pg_clipfrac"] / rows,
               "entropy": sums["entropy"] / rows, "grad_norm": sum(grad_norms) / max(len(grad_norms), 1),
               "tokens": tokens, "num_steps": len(num_mb), "recomputed_log_probs": recompute,
               "train_time": elapsed, "actor_train_time": t_backup - t_train, "weight_backup_time": t_end - t_backup,
               "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
               "dp_rank": self.dp_rank, "tp_rank": self.tp_rank}
        if recompute:
            out["log_probs_time"] = t_log_probs - t0
        if ref is not None:
            out["ref_log_probs_time"] = ref_time
        out.update(_optional_metrics(self.cfg, extra, rows, rollout is not None))
        if not self.cpu:  # what training holds, and what the last sleep left for the engines to wake beside
            out["memory"] = {**self._asleep_memory, **gpu_memory.measure("trained", self.offload)}
        return out

    # --- offload (seed steps 37, 41; vime.real.megatron.offload) --------------------------------
    def sleep(self) -> dict[str, Any]:
        """Offload params and optimizer state, drop grads (seed step 41)."""
        self._check_awake("sleep")
        parts = _Parts(sync=not self.cpu)
        nbytes = state_bytes(self.model, self.optimizer, plan_tags(self.cfg.train_offload_plan))
        self.model.zero_grad_buffer()
        parts.mark("zero_grad")
        # the CPU stand-in moves nothing, so there is nothing to check at wake
        self._sleep_fingerprint = None if self.cpu else fingerprint(kept_tensors(self.module, self.optimizer))
        parts.mark("fingerprint")
        self.offload.pause(nbytes)
        parts.mark("pause")
        if not self.cpu:
            # The activations and the optimizer step's temporaries sit in PyTorch's cache outside the
            # offloaded tags: hand them back too, or the engines' KV cache cannot be mapped again.
            torch.cuda.empty_cache()
            parts.mark("empty_cache")
            self._asleep_memory = gpu_memory.after_sleep(self.rank, self.offload)
            parts.mark("memory")
        self._last_offloaded, self.asleep = nbytes, True
        return {"offloaded_bytes": nbytes, "backend": self.offload.name, "parts_s": parts.log(self.rank, "sleep")}

    def offload_info(self) -> dict[str, Any]:
        """Which backend sleeps this rank, its pause/resume history and the bytes of the last sleep."""
        return {"backend": self.offload.name, "events": list(self.offload.events),
                "last_offloaded_bytes": self._last_offloaded}

    def wake_up(self) -> dict[str, Any]:
        """Bring trainer state back (seed step 37)."""
        if not self.asleep:
            raise TrainerError(f"rank {self.rank}: wake_up() while awake")
        parts = _Parts(sync=not self.cpu)
        self.offload.resume()
        parts.mark("resume")
        self.asleep = False
        self._check_restored()
        parts.mark("fingerprint")
        return {"backend": self.offload.name, "events": list(self.offload.events), "parts_s": parts.log(self.rank, "wake")}

    def _check_restored(self) -> None:
        """Raise if a tensor the sleep kept came back different: training on it would train something else."""
        before, self._sleep_fingerprint = self._sleep_fingerprint, None
        if before is None:
            return
        kept = kept_tensors(self.module, self.optimizer)
        changed = changed_tensors(kept, before)
        if changed:
            raise TrainerError(f"rank {self.rank}: {len(changed)} of {len(kept)} tensors changed across sleep/wake "
                               f"with the {self.offload.name} offload backend (first: {changed[:3]}); the trainer "
                               "state was not restored, so training would go on from other weights")

    # --- inspection (tests, debugging) ----------------------------------------------------------
    def local_params(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().cpu().clone() for n, p in self.module.named_parameters()}

    def full_logits(self, tokens: Sequence[Sequence[int]]) -> torch.Tensor:
        """Full-vocabulary logits [b, s, vocab] (TP-gathered) for equal-length rows."""
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        width = len(tokens[0])  # MoE layers under TP take a multiple of TP (sequence parallelism)
        ids, pos = padded_rows(tokens, self.tp if self.spec.num_experts else 1, self._device())
        with compat.device_mode(), torch.no_grad():
            self.model.eval()
            logits = self.model(ids, pos, None)
            self.model.train()
            full = gather_from_tensor_model_parallel_region(logits)
        return full[:, :width, : self.spec.vocab_size].float().cpu()

    def memory(self) -> dict[str, float]:
        """Resident memory of this process (MiB) and peak CUDA memory when on a GPU."""
        return gpu_memory.process(self.cpu)


class _Parts:
    """Wall seconds of a sleep's, wake's or train's parts, each after the GPU finished it (the simulator's
    trainer terms are checked against them), printed to the log like the memory after a sleep."""

    def __init__(self, sync: bool) -> None:
        self.sync = sync
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def mark(self, name: str) -> None:
        if self.sync:
            torch.cuda.synchronize()
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._t  # a part met again adds up
        self._t = now

    def log(self, rank: int, what: str) -> dict[str, float]:
        print(f"[vime trainer rank {rank}] {what} parts (s): " + ", ".join(
            f"{k} {v:.4f}" for k, v in self.seconds.items()), file=sys.stderr, flush=True)
        return self.seconds


def _optional_metrics(cfg: ActorConfig, extra: Mapping[str, float], rows: float, has_rollout: bool) -> dict[str, float]:
    """The train call's metrics that its options switch on (KL loss, TIS, the train/rollout log-prob mismatch)."""
    out = {}
    if cfg.use_kl_loss:
        out["kl_loss"] = extra["kl_loss"] / rows
    if cfg.use_tis:
        out["tis_weight"] = extra["tis_weight"] / rows
    if cfg.get_mismatch_metrics and has_rollout:
        out["train_rollout_logprob_abs_diff"] = extra["train_rollout_logprob_abs_diff"] / rows
    return out


def rank_advantages(cfg: ActorConfig, batch: Any, old: Sequence[torch.Tensor] | None,
                    ref: Sequence[torch.Tensor] | None) -> list[torch.Tensor]:
    """Each row's per-token advantages (seed step 39) by --advantage-estimator; REINFORCE++-baseline
    subtracts --kl-coef × the k1 KL to the reference from the reward and whitens over the rank's tokens."""
    from vime.algo.advantages import compute_advantages_and_returns
    from vime.algo.policy_loss import approx_kl

    kl = None
    if cfg.kl_coef > 0:
        if ref is None or old is None:
            raise TrainerError("--kl-coef needs the reference's and the old policy's log-probs")
        kl = [approx_kl(o.to(r.device), r, "k1").detach().cpu() for o, r in zip(old, ref, strict=True)]
    adv, _ = compute_advantages_and_returns(cfg.advantage_estimator, batch.rewards, batch.response_lengths,
                                            batch.loss_masks, kl=kl, kl_coef=cfg.kl_coef)
    return adv
