"""One trainer rank's weights beside the training step: host backup, HF export (buckets or CUDA IPC), HF loads and checkpoints (seed steps 41, 48–50)."""

from __future__ import annotations

import json
import os
import pickle
from collections.abc import Sequence
from typing import Any

import torch

from vime.errors import ConfigError, TrainerError
from vime.protocols import WeightBucket
from vime.real.megatron import compat, moe_mapping
from vime.real.megatron import model as mmodel
from vime.real.megatron.offload import inner_optimizers
from vime.real.weights import ipc


def host_views(tensors: Sequence[tuple[str, torch.Tensor]], *, pinned: bool) -> dict[str, torch.Tensor]:
    """Host tensors shaped like `tensors`, all views of one buffer (each at a 256-byte aligned offset)."""
    offsets, end = [], 0
    for _, t in tensors:
        end = -(-end // 256) * 256
        offsets.append(end)
        end += t.numel() * t.element_size()
    flat = torch.empty(max(end, 1), dtype=torch.uint8, pin_memory=pinned)
    return {name: flat[o: o + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
            for (name, t), o in zip(tensors, offsets, strict=True)}


def device_views(views: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """`views` (all of one host buffer, as `host_views` cuts them) on `device` through one copy, cut the same way.

    One allocation and one transfer. On the H200 this and per-tensor copies both run at the pinned link rate (4B's
    7.5 GiB in 0.15 s, bench/data/ref_copy_s23); one buffer keeps the allocator from cutting 290 blocks."""
    storage = next(iter(views.values())).untyped_storage()
    whole = torch.empty(0, dtype=torch.uint8).set_(storage).to(device, non_blocking=True)
    out = {}
    for name, t in views.items():
        if t.untyped_storage().data_ptr() != storage.data_ptr():
            raise ValueError(f"device_views: {name} is not a view of the same buffer as the others")
        start = t.storage_offset() * t.element_size()
        out[name] = whole[start: start + t.numel() * t.element_size()].view(t.dtype).view(t.shape)
    return out


class ActorWeights:
    """The weights of one rank of a built model: `model` is Megatron's DDP wrapper, `optimizer` its optimizer.

    Export reads the host backup that `backup` refreshes after every train step, so the engines get
    the weights of a finished step even while the trainer sleeps. Calls marked collective must run
    on every rank of the group, in the same order.
    """

    def __init__(self, *, model: Any, optimizer: Any, spec: mmodel.ModelSpec, hf_config: dict[str, Any],
                 rank: int, tp: int, tp_rank: int, dp: int, distributed_optimizer: bool,
                 device: torch.device, ep: int = 1, ep_rank: int = 0, etp: int | None = None,
                 etp_rank: int = 0) -> None:
        self.model = model
        self.optimizer = optimizer
        self.spec = spec
        self.hf_config = hf_config
        self.rank = rank
        self.tp = tp
        self.tp_rank = tp_rank
        self.dp = dp
        self.ep = ep
        self.ep_rank = ep_rank
        self.etp = tp if etp is None else etp
        self.etp_rank = etp_rank
        self.distributed_optimizer = distributed_optimizer
        self.device = device
        self.cpu = device.type == "cpu"
        self.backup_state: dict[str, torch.Tensor] = {}
        self.last_load = ""
        self._ipc: Any = None  # vime.real.weights.ipc.IpcExporter, made by the first IPC export

    @property
    def module(self) -> Any:
        return self.model.module

    # --- host backup (seed step 41) ---------------------------------------------------------------
    def backup(self) -> None:
        """Copy this rank's parameter shards to host memory (seed step 41).

        One host buffer, allocated at the first backup (pinned on a GPU) and overwritten in place:
        a fresh pageable copy per step paid page population (bench/data/h200_pin_cost.json)."""
        params = list(self.module.named_parameters())
        if [n for n, _ in params] != list(self.backup_state) or any(
                self.backup_state[n].shape != q.shape or self.backup_state[n].dtype != q.dtype for n, q in params):
            self.backup_state = host_views([(n, q) for n, q in params], pinned=not self.cpu)
        with torch.no_grad():
            for name, q in params:
                self.backup_state[name].copy_(q.detach(), non_blocking=not self.cpu)
        if not self.cpu:
            torch.cuda.synchronize()

    # --- HF export (seed step 48) -----------------------------------------------------------------
    def _all_gather(self, local: torch.Tensor, size: int, group: Any) -> list[torch.Tensor]:
        import torch.distributed as dist

        t = local if self.cpu else local.to(self.device)
        parts = [torch.empty_like(t) for _ in range(size)]
        dist.all_gather(parts, t.contiguous(), group=group)
        return [p.cpu() for p in parts]

    def _gather_full(self, name: str, local: torch.Tensor) -> torch.Tensor:
        """Megatron-full tensor of `name` from every TP rank's shard (collective over TP); a routed
        expert's from every ETP rank's (collective over ETP), still under this EP rank's local index."""
        from megatron.core import parallel_state as ps

        if moe_mapping.expert_index(name) is not None:
            size, group = self.etp, (ps.get_expert_tensor_parallel_group() if self.etp > 1 else None)
        else:
            size, group = self.tp, (ps.get_tensor_model_parallel_group() if self.tp > 1 else None)
        if size == 1 or mmodel.partition_dim(name) is None:
            return local
        return mmodel.unshard(name, self._all_gather(local, size, group))

    def _gather_global(self, name: str, local: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        """(Megatron-full name, full tensor) of `name`: one pair, or for a routed expert one per EP
        rank, under its global index (collective over TP or ETP, then EP)."""
        from megatron.core import parallel_state as ps

        full = self._gather_full(name, local)
        if self.ep == 1 or moe_mapping.expert_index(name) is None:
            return [(name, full)]
        parts = self._all_gather(full, self.ep, ps.get_expert_model_parallel_group())
        return [(moe_mapping.to_global(name, ep_rank=r, ep=self.ep, num_experts=self.spec.num_experts), t)
                for r, t in enumerate(parts)]

    def hf_state(self, from_backup: bool = True, *, cut_on_device: bool = False) -> dict[str, Any]:
        """HF-named full tensors (collective over TP and EP: every rank must call it). `cut_on_device`: the fused
        QKV pieces stay `DeviceCut`s for the staging buffer to cut (the IPC export)."""
        source = self.backup_state if from_backup else {n: p.detach() for n, p in self.module.named_parameters()}
        out: dict[str, Any] = {}
        with compat.device_mode():
            for local_name in mmodel.hf_export_order(self.spec, source):
                for name, full in self._gather_global(local_name, source[local_name]):
                    for hf_name, t in mmodel.megatron_to_hf(self.spec, name, full, cut_on_device=cut_on_device):
                        out[hf_name] = t if isinstance(t, ipc.DeviceCut) else t.contiguous()
        return out

    def export_buckets(self, bucket_bytes: int) -> list[WeightBucket]:
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

    # --- CUDA-IPC export (colocated; vime.real.weights.ipc) --------------------------------------
    def ipc_begin(self, bucket_bytes: int) -> tuple[list[Any], str | None]:
        """Collective: gather the HF state from the backup and plan its buckets; the staging buffer
        (allocated once, outside the offload region) is sized for the largest bucket. Returns the
        plan (the same on every rank) and this rank's GPU UUID (None on CPU)."""

        if self._ipc is None:
            self._ipc = ipc.IpcExporter(self.device)
        layouts = self._ipc.begin(self.hf_state(from_backup=True, cut_on_device=True), bucket_bytes)
        return layouts, (None if self.cpu else ipc.device_uuid(self.device))

    def ipc_stage(self, index: int, ack: int | None) -> Any:
        """Stage bucket `index` once bucket `ack` is loaded by every engine: (uuid, handles) on GPU, the staged tensors on CPU."""
        if self._ipc is None:
            raise TrainerError(f"rank {self.rank}: ipc_export_stage before ipc_export_begin")
        return self._ipc.stage(index, ack)

    def ipc_end(self, ack: int | None, abort: bool = False) -> None:
        if self._ipc is not None:
            self._ipc.end(ack, abort=abort)

    def ipc_info(self) -> dict[str, Any]:
        """The staging buffer's size, address and allocation count (tests check it is reused)."""
        st = self._ipc.staging if self._ipc is not None else None
        return {"allocations": st.allocations if st else 0, "capacity": st.capacity if st else 0,
                "address": st.buffer.data_ptr() if st and st.buffer is not None else 0}

    # --- HF load and checkpoints ------------------------------------------------------------------
    def load_hf(self, path: str) -> None:
        """Load HF safetensors from `path` into this rank's shards (HF → Megatron full → shard)."""
        load_hf_into(self.module, self.spec, path, tp=self.tp, tp_rank=self.tp_rank, ep=self.ep, ep_rank=self.ep_rank,
                     etp=self.etp, etp_rank=self.etp_rank)
        # The optimizer may hold fp32 main copies of the params: refresh them from the model.
        reload = getattr(self.optimizer, "reload_model_params", None)
        if reload is not None:
            reload()

    def _layout(self) -> dict[str, Any]:
        layout = {"tp": self.tp, "dp": self.dp, "rank": self.rank, "distributed_optimizer": self.distributed_optimizer}
        if self.ep > 1 or self.etp != self.tp:  # only then: checkpoints saved before EP existed still match
            layout.update(ep=self.ep, etp=self.etp)
        return layout

    def save_checkpoint(self, rollout_id: int, path: str) -> None:
        """Weights as HF safetensors (rank 0, TP shards gathered), each rank's optimizer state, and
        `vime_state.json` (the rollout id) written last, so a checkpoint without it is incomplete."""
        import torch.distributed as dist

        state = self.hf_state(from_backup=False)
        if self.rank == 0:
            mmodel.write_hf_safetensors(path, state.items(), config=self.hf_config)
            os.makedirs(os.path.join(path, "optimizer"), exist_ok=True)
        dist.barrier()
        torch.save({"layout": self._layout(), "states": [o.state_dict() for o in inner_optimizers(self.optimizer)]},
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
            saved = read_optimizer_state(opt_file)
            if saved["layout"] == self._layout():
                for opt, st in zip(inner_optimizers(self.optimizer), saved["states"], strict=True):
                    opt.load_state_dict(st)
                self.last_load = "optimizer restored"
        self.backup()
        with open(state_file) as fh:
            return int(json.load(fh)["next_rollout_id"])


def read_optimizer_state(path: str) -> dict[str, Any]:
    """A saved optimizer state: tensors and plain containers only (``weights_only``), so a crafted
    checkpoint cannot run code; anything else raises TrainerError naming the file."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise TrainerError(f"{path}: not a vime optimizer state (it holds objects beyond tensors and plain "
                           f"containers, refused for safety: {str(exc).splitlines()[0]})") from None
    if not isinstance(saved, dict) or "layout" not in saved or "states" not in saved:
        raise TrainerError(f"{path}: not a vime optimizer state (expected a dict with layout and states)")
    return saved


def load_hf_into(module: Any, spec: mmodel.ModelSpec, path: str, *, tp: int, tp_rank: int, ep: int = 1,
                 ep_rank: int = 0, etp: int | None = None, etp_rank: int = 0) -> None:
    """Copy an HF checkpoint's tensors into `module`'s parameters: this TP rank's shards, and of the
    routed experts only this EP rank's (read from the checkpoint alone), split over ETP (None: TP)."""
    etp = tp if etp is None else etp
    experts = spec.num_experts
    keep = None if ep == 1 else (lambda n: moe_mapping.hf_held(n, ep_rank=ep_rank, ep=ep, num_experts=experts))
    full = mmodel.hf_to_megatron(spec, mmodel.read_hf_safetensors(path, keep), tp=tp)
    params = dict(module.named_parameters())
    # a local expert's Megatron-full name carries its global index
    sources = {n: moe_mapping.to_global(n, ep_rank=ep_rank, ep=ep, num_experts=experts) if experts else n
               for n in params}
    missing = sorted(n for n, g in sources.items() if g not in full)
    if missing:
        raise TrainerError(f"HF checkpoint {path!r} lacks tensors for {missing[:4]}")
    with torch.no_grad():
        for name, p in params.items():
            is_expert = moe_mapping.expert_index(name) is not None
            src = mmodel.shard(name, full[sources[name]], etp_rank if is_expert else tp_rank, etp if is_expert else tp)
            if tuple(src.shape) != tuple(p.shape):
                raise TrainerError(f"{name}: checkpoint shard {tuple(src.shape)} does not fit parameter "
                                   f"{tuple(p.shape)}; does the checkpoint match the HF config?")
            p.copy_(src.to(p.dtype))
