"""Colocated CUDA-IPC weight export: HF-named tensors staged bucket by bucket in one reused device buffer, with the handles vLLM's IPC engine opens (seed steps 45–52).

The format is the one vLLM 0.25.1 accepted on an H200 (bench/data/h200_notes.md, issue 10): per
bucket, `update_info` carries `names`, `dtype_names`, `shapes` and `ipc_handles`, a list with one
entry per tensor, each a dict ``{GPU UUID: reduce_tensor(t)[1]}``. Every vLLM worker looks up its
own GPU's UUID, rebuilds the tensor with its own device index (argument 6) and loads it; so one
bucket, holding the handles of every trainer rank, serves every engine of a colocated placement
(engine k's workers sit on GPUs [k·g, (k+1)·g), each shared with the trainer rank of that bundle).

Lifetime: the tensors of a bucket are views of the exporter's staging buffer. A handle stays valid
while the buffer lives, and the next bucket overwrites the same bytes, so a bucket may be staged
only after every engine has acknowledged the previous one (`IpcExporter.stage(i, ack=i-1)`); the
buffer itself is allocated once and reused across buckets and steps.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from vime.errors import ConfigError, TrainerError
from vime.protocols import WeightBucket

#: Byte alignment of every tensor inside a staging buffer: a multiple of every dtype's size, so a
#: slice of the uint8 buffer can be viewed as the tensor's dtype (and as the allocator's granule).
ALIGN = 256


def _align(n: int, a: int = ALIGN) -> int:
    return (n + a - 1) // a * a


def dtype_of(name: str) -> torch.dtype:
    """torch dtype from vLLM's dtype name ("bfloat16", "float32", ...)."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise ConfigError(f"{name!r} is not a torch dtype name (use e.g. 'bfloat16' or 'float32')")
    return dt


def dtype_name(dt: torch.dtype) -> str:
    return str(dt).removeprefix("torch.")


@dataclass(frozen=True)
class Slot:
    """Where one tensor sits in its bucket's staging buffer (byte offset, aligned)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class BucketLayout:
    """One bucket: its slots in export order. `span` counts the alignment padding, `nbytes` does not."""

    index: int
    slots: tuple[Slot, ...]

    @property
    def span(self) -> int:
        last = self.slots[-1]
        return last.offset + last.nbytes

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.slots)

    def empty_bucket(self) -> WeightBucket:
        """A WeightBucket with this layout's metadata and neither handles nor tensors yet."""
        return WeightBucket(names=[s.name for s in self.slots], dtype_names=[s.dtype for s in self.slots],
                            shapes=[list(s.shape) for s in self.slots], nbytes=self.nbytes, index=self.index)


@dataclass(frozen=True)
class DeviceCut:
    """One piece of a fused host tensor, cut where it is staged: the fused tensor crosses to the device
    whole and contiguous (a pinned source copies at DMA speed) and the strided cut runs there. Cutting on the
    host made fresh pageable tensors, 0.75 s of a Qwen3-4B export on the H200 (bench/data/h200_notes.md)."""

    base: torch.Tensor
    cut: Callable[[torch.Tensor], torch.Tensor]  # fused tensor (on any device) -> this piece, `shape`'s numel
    shape: tuple[int, ...]

    @property
    def dtype(self) -> torch.dtype:
        return self.base.dtype

    def materialize(self) -> torch.Tensor:
        """The piece as a contiguous host tensor (what a cut on the host gives)."""
        return self.cut(self.base).reshape(self.shape).contiguous()


def specs_of(state: Mapping[str, torch.Tensor | DeviceCut]) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, dtype name, shape) of every tensor of `state`, in its order."""
    return [(n, dtype_name(t.dtype), tuple(t.shape)) for n, t in state.items()]


def plan_buckets(specs: Iterable[tuple[str, str, Sequence[int]]], bucket_bytes: int, *,
                 align: int = ALIGN) -> list[BucketLayout]:
    """Split tensors (in order) into buckets whose span, padding included, is at most `bucket_bytes`.

    A tensor larger than `bucket_bytes` gets a bucket of its own (its span is then its size): a
    tensor is never split, because vLLM loads whole named tensors. Seed step 48.
    """
    if bucket_bytes <= 0:
        raise ConfigError(f"--update-weight-buffer-size must be positive, got {bucket_bytes}")
    if align <= 0 or align % 16:
        raise ConfigError(f"alignment {align} must be a positive multiple of 16 bytes")
    layouts: list[BucketLayout] = []
    cur: list[Slot] = []
    end = 0
    seen: set[str] = set()
    for name, dt, shape in specs:
        if name in seen:
            raise TrainerError(f"tensor {name!r} is exported twice; HF names must be unique")
        seen.add(name)
        shape = tuple(int(d) for d in shape)
        n = dtype_of(dt).itemsize
        for d in shape:
            n *= d
        offset = _align(end, align) if cur else 0
        if cur and offset + n > bucket_bytes:
            layouts.append(BucketLayout(len(layouts), tuple(cur)))
            cur, offset = [], 0
        cur.append(Slot(name, dt, shape, offset, n))
        end = offset + n
    if cur:
        layouts.append(BucketLayout(len(layouts), tuple(cur)))
    return layouts


class StagingBuffer:
    """One contiguous uint8 buffer on `device`, grown only when a bucket needs more (reused across buckets and steps)."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.buffer: torch.Tensor | None = None
        self.allocations = 0  # how many times memory was allocated (tests check reuse)
        self._fused: tuple[torch.Tensor, torch.Tensor] | None = None  # (host base, its device copy) of DeviceCuts

    @property
    def capacity(self) -> int:
        return 0 if self.buffer is None else int(self.buffer.numel())

    def reserve(self, nbytes: int) -> None:
        """Make sure `nbytes` fit; keeps the current buffer (and its address) when they do."""
        if nbytes <= self.capacity:
            return
        self.buffer = None  # free the small one before allocating the larger one
        self.buffer = torch.empty(_align(nbytes), dtype=torch.uint8, device=self.device)
        self.allocations += 1

    def release(self) -> None:
        self.buffer = None
        self.forget_fused()

    def _on_device(self, base: torch.Tensor) -> torch.Tensor:
        """`base` on this device, copied once for all the pieces cut from it (q, k, v follow each other)."""
        if self._fused is None or self._fused[0] is not base:
            self._fused = None  # free the previous fused tensor before the next one arrives
            self._fused = (base, base.to(self.device, non_blocking=True))
        return self._fused[1]

    def forget_fused(self) -> None:
        self._fused = None

    def views(self, layout: BucketLayout) -> dict[str, torch.Tensor]:
        """Typed views of the buffer at `layout`'s slots (no copy)."""
        if layout.span > self.capacity:
            raise TrainerError(f"bucket {layout.index} spans {layout.span} bytes but the staging buffer holds "
                               f"{self.capacity}; reserve() it first")
        assert self.buffer is not None
        return {s.name: self.buffer[s.offset: s.offset + s.nbytes].view(dtype_of(s.dtype)).view(s.shape)
                for s in layout.slots}

    def pack(self, layout: BucketLayout, tensors: Mapping[str, torch.Tensor | DeviceCut]) -> dict[str, torch.Tensor]:
        """Copy `layout`'s tensors from `tensors` into the buffer; returns the views (ready when this returns)."""
        views = self.views(layout)
        for s in layout.slots:
            src = tensors.get(s.name)
            if src is None:
                raise TrainerError(f"bucket {layout.index} needs {s.name!r}, which the export state lacks")
            if tuple(src.shape) != s.shape or dtype_name(src.dtype) != s.dtype:
                raise TrainerError(f"{s.name!r} is {dtype_name(src.dtype)}{list(src.shape)} but the bucket plan "
                                   f"expects {s.dtype}{list(s.shape)}; re-plan after the model changes")
            if isinstance(src, DeviceCut):
                piece = src.cut(self._on_device(src.base))
                views[s.name].view(piece.shape).copy_(piece)
            else:
                views[s.name].copy_(src, non_blocking=True)
        if self.device.type == "cuda":
            # The engines read through their own contexts: the bytes must be there before the handles leave.
            torch.cuda.synchronize(self.device)
        return views


# --------------------------------------------------------------------------------------------
# Handles
# --------------------------------------------------------------------------------------------


def device_uuid(device: torch.device | int | None = None) -> str:
    """The physical GPU's UUID as vLLM keys IPC handles (str of torch's device properties uuid)."""
    if device is None:
        device = torch.cuda.current_device()
    return str(torch.cuda.get_device_properties(device).uuid)


def tensor_handle(t: torch.Tensor) -> tuple[Any, ...]:
    """reduce_tensor's argument tuple for a CUDA tensor (storage handle + offset/shape/stride): what vLLM rebuilds."""
    from torch.multiprocessing.reductions import reduce_tensor

    if t.device.type != "cuda":
        raise TrainerError(f"CUDA IPC needs a CUDA tensor, got one on {t.device}")
    return tuple(reduce_tensor(t)[1])


def open_handle(args: Sequence[Any], device_index: int | None = None) -> torch.Tensor:
    """Rebuild a tensor from `tensor_handle` args in another process, as vLLM's worker does (device index replaced)."""
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    a = list(args)
    a[6] = torch.cuda.current_device() if device_index is None else device_index
    return rebuild_cuda_tensor(*a)


def merge_rank_handles(per_rank: Sequence[tuple[str, Sequence[Any]]], n_tensors: int) -> list[dict[str, Any]]:
    """Rank 0's fold: one dict {GPU UUID: handle} per tensor from every rank's (uuid, handles).

    Two ranks on one GPU (not a colocated layout) give the same UUID; the lower rank's handle is kept.
    """
    out: list[dict[str, Any]] = [{} for _ in range(n_tensors)]
    for rank, (uuid, handles) in enumerate(per_rank):
        if len(handles) != n_tensors:
            raise TrainerError(f"trainer rank {rank} staged {len(handles)} tensors for a bucket of {n_tensors}; "
                               "every rank must export the same bucket plan")
        for slot, h in zip(out, handles, strict=True):
            slot.setdefault(uuid, h)
    return out


def engine_gpu_ranks(actor_bundles: Sequence[int], engine_bundles: Sequence[Sequence[int]]) -> list[list[int]]:
    """For each engine, the trainer rank sharing each of its GPUs (colocated: engine k on bundles
    [k·g, (k+1)·g), trainer rank r on bundle r). Those ranks' handles are the ones engine k opens."""
    on_bundle: dict[int, int] = {}
    for rank, b in enumerate(actor_bundles):
        on_bundle.setdefault(b, rank)
    out = []
    for k, bundles in enumerate(engine_bundles):
        missing = [b for b in bundles if b not in on_bundle]
        if missing:
            raise ConfigError(f"engine {k} has GPU bundles {missing} with no trainer rank on them: CUDA IPC needs "
                              "every engine GPU colocated with a trainer rank; use --colocate or "
                              "--update-weight-mode disk")
        out.append([on_bundle[b] for b in bundles])
    return out


def check_coverage(bucket: WeightBucket, uuids: Iterable[str]) -> None:
    """Raise unless every tensor of `bucket` has a handle for every GPU in `uuids` (the engines' GPUs)."""
    if bucket.ipc_handles is None or len(bucket.ipc_handles) != len(bucket.names):
        raise TrainerError(f"bucket {bucket.index} has {len(bucket.ipc_handles or [])} handle sets for "
                           f"{len(bucket.names)} tensors")
    need = set(uuids)
    for name, h in zip(bucket.names, bucket.ipc_handles, strict=True):
        lack = need - set(h)
        if lack:
            raise TrainerError(f"bucket {bucket.index}: {name!r} has no IPC handle for GPU(s) {sorted(lack)}; "
                               "a trainer rank must sit on every engine GPU")


# --------------------------------------------------------------------------------------------
# The per-rank exporter
# --------------------------------------------------------------------------------------------


class IpcExporter:
    """One trainer rank's side of an export: plan → stage bucket i (after the engines acknowledged i-1) → end.

    On CUDA `stage` returns ``(gpu uuid, handles)``; on CPU (tests) it returns the staged views, the
    same bytes an engine would read. The staging buffer survives `end` for the next step.
    """

    def __init__(self, device: torch.device | str) -> None:
        self.staging = StagingBuffer(device)
        self.layouts: list[BucketLayout] = []
        self.state: Mapping[str, torch.Tensor] | None = None
        self.outstanding: int | None = None  # staged and not yet acknowledged

    @property
    def device(self) -> torch.device:
        return self.staging.device

    def begin(self, state: Mapping[str, torch.Tensor], bucket_bytes: int) -> list[BucketLayout]:
        if self.state is not None:
            raise TrainerError("an IPC export is already open on this rank; end() it first")
        layouts = plan_buckets(specs_of(state), bucket_bytes)
        self.staging.reserve(max((lay.span for lay in layouts), default=0))
        self.layouts, self.state, self.outstanding = layouts, state, None
        return layouts

    def _ack(self, ack: int | None) -> None:
        if self.outstanding is not None and ack != self.outstanding:
            raise TrainerError(f"bucket {self.outstanding} is staged and not acknowledged (ack={ack}); the engines "
                               "may still be reading it, so the staging buffer cannot be reused yet")
        self.outstanding = None

    def stage(self, index: int, ack: int | None = None) -> Any:
        """Pack bucket `index`; `ack` names the previous bucket, which every engine has loaded."""
        if self.state is None:
            raise TrainerError("stage() before begin(): no export is open on this rank")
        if not 0 <= index < len(self.layouts):
            raise TrainerError(f"bucket {index} does not exist (the plan has {len(self.layouts)})")
        self._ack(ack)
        views = self.staging.pack(self.layouts[index], self.state)
        self.outstanding = index
        if self.device.type != "cuda":
            return views
        return device_uuid(self.device), [tensor_handle(v) for v in views.values()]

    def end(self, ack: int | None = None, *, abort: bool = False) -> None:
        """Close the export (drops the state; keeps the staging buffer). `abort`: the publication failed
        part-way, so the outstanding bucket will never be acknowledged (its update session is over)."""
        if not abort:
            self._ack(ack)
        self.outstanding = None
        self.staging.forget_fused()
        self.state = None
        self.layouts = []


def fill_bucket(layout: BucketLayout, per_rank: Sequence[Any]) -> WeightBucket:
    """Rank 0's WeightBucket for `layout` from every rank's `stage` answer: handles of every GPU (CUDA)
    or rank 0's staged tensors (CPU)."""
    bucket = layout.empty_bucket()
    first = per_rank[0]
    if isinstance(first, Mapping):
        bucket.tensors = dict(first)
    else:
        bucket.ipc_handles = merge_rank_handles(per_rank, len(layout.slots))
    return bucket
