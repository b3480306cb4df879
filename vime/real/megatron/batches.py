"""Micro-batches of a rank's rollout rows (right-padded token tensors, masks, advantages) and the Megatron schedule that runs them (seed steps 38–40)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import torch

from vime.errors import TrainerError


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
    loss_scale: float = 1.0  # see vime.real.megatron.loss.policy_loss
    rows: list[int] = field(default_factory=list)
    rollout_log_probs: list[torch.Tensor] | None = None  # the engine's, per row (TIS, mismatch metrics)
    ref_log_probs: list[torch.Tensor] | None = None  # the reference model's, per row (KL loss)


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


def pad_width(mb: MicroBatch, width: int) -> MicroBatch:
    """`mb` right-padded to `width` columns (pad tokens come after every real one, so causal attention
    and the per-token experts leave the real tokens' logits unchanged)."""
    extra = width - mb.tokens.shape[1]
    if extra < 0:
        raise TrainerError(f"cannot pad a micro-batch of width {mb.tokens.shape[1]} to {width}")
    if extra:
        b, dev = mb.tokens.shape[0], mb.tokens.device
        mb.tokens = torch.cat([mb.tokens, torch.zeros(b, extra, dtype=mb.tokens.dtype, device=dev)], dim=1)
        mb.position_ids = torch.arange(width, dtype=torch.long, device=dev).unsqueeze(0).expand(b, -1).contiguous()
    return mb


def padded_rows(rows: Sequence[Sequence[int]], multiple: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids [b, s] of equal-length `rows`, right-padded to a multiple of `multiple`, and their positions."""
    width = -(-len(rows[0]) // multiple) * multiple
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    ids[:, : len(rows[0])] = torch.as_tensor([list(r) for r in rows], dtype=torch.long)
    pos = torch.arange(width, dtype=torch.long).unsqueeze(0).expand(len(rows), -1).contiguous()
    return ids.to(device), pos.to(device)


def moe_widths(tf_config: Any, device: torch.device) -> Callable[[list[MicroBatch]], list[MicroBatch]]:
    """For a model of `tf_config`: a function padding micro-batches to the widths its MoE layers take, a
    multiple of TP (sequence parallelism splits the sequence) and, under the all-gather token dispatcher,
    the same on every rank of the expert group, which stacks their tokens (collective over that group)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    tp = tf_config.tensor_model_parallel_size
    agree = (tf_config.num_moe_experts and tf_config.moe_token_dispatcher_type == "allgather"
             and tf_config.expert_model_parallel_size * tf_config.expert_tensor_parallel_size > 1)

    def align(mbs: list[MicroBatch]) -> list[MicroBatch]:
        if not tf_config.num_moe_experts:
            return mbs
        widths = torch.tensor([mb.tokens.shape[1] for mb in mbs], dtype=torch.long, device=device)
        if agree:
            dist.all_reduce(widths, op=dist.ReduceOp.MAX, group=ps.get_expert_tensor_and_model_parallel_group())
        return [pad_width(mb, -(-int(w) // tp) * tp) for mb, w in zip(mbs, widths.tolist(), strict=True)]

    return align


def train_micro_batches(batch: Any, groups: Sequence[Sequence[int]], old_log_probs: Sequence[torch.Tensor] | None,
                        device: torch.device, *, advantages: Sequence[torch.Tensor],
                        rollout_log_probs: Sequence[torch.Tensor] | None = None,
                        ref_log_probs: Sequence[torch.Tensor] | None = None) -> list[MicroBatch]:
    """One optimizer step's micro-batches of `batch` (a `vime.types.RankBatch`) with each row's
    advantages (seed step 39) and, when given, its rollout and reference log-probs."""

    def rows(values: Sequence[torch.Tensor] | None, g: Sequence[int]) -> list[torch.Tensor] | None:
        return None if values is None else [values[i].to(device) for i in g]

    step_rows = sum(len(g) for g in groups)
    out = []
    for g in groups:
        mb = make_micro_batch(
            [batch.tokens[i] for i in g], [batch.response_lengths[i] for i in g],
            loss_masks=[batch.loss_masks[i] for i in g], advantages=[advantages[i] for i in g],
            old_log_probs=rows(old_log_probs, g), device=device, rows=list(g))
        mb.loss_scale = len(groups) * len(g) / max(step_rows, 1)
        mb.rollout_log_probs = rows(rollout_log_probs, g)
        mb.ref_log_probs = rows(ref_log_probs, g)
        out.append(mb)
    return out


def log_prob_micro_batches(batch: Any, groups: Sequence[Sequence[int]], device: torch.device) -> list[MicroBatch]:
    """Micro-batches for a forward-only log-prob pass: tokens and response lengths only."""
    return [make_micro_batch([batch.tokens[i] for i in g], [batch.response_lengths[i] for i in g],
                             device=device, rows=list(g)) for g in groups]


def run_schedule(model: Any, mbs: list[MicroBatch], forward_only: bool,
                 loss_fn: Callable[[MicroBatch, torch.Tensor], Any], tally: dict[str, float] | None = None) -> list[Any]:
    """Megatron's forward-backward schedule over `mbs` (PP = 1); returns what `loss_fn` reduced per micro-batch.

    `tally`, when given, adds the host's wall seconds inside the model's forward calls (`forward_calls`) and the
    loss calls (`loss_calls`), unsynchronised: what the CPU spends launching them, or waiting where they sync."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    def timed_loss(mb: MicroBatch, output: torch.Tensor) -> Any:
        t = time.perf_counter()
        out = loss_fn(mb, output)
        tally["loss_calls"] = tally.get("loss_calls", 0.0) + time.perf_counter() - t
        return out

    def forward_step(data_iterator: Iterator[MicroBatch], model: Any) -> tuple[torch.Tensor, Any]:
        mb = next(data_iterator)
        t = time.perf_counter()
        logits = model(mb.tokens, mb.position_ids, None)
        if tally is None:
            return logits, partial(loss_fn, mb)
        tally["forward_calls"] = tally.get("forward_calls", 0.0) + time.perf_counter() - t
        return logits, partial(timed_loss, mb)

    seq = max(mb.tokens.shape[1] for mb in mbs)
    return get_forward_backward_func()(
        forward_step_func=forward_step, data_iterator=iter(mbs), model=[model],
        num_microbatches=len(mbs), seq_length=seq, micro_batch_size=mbs[0].tokens.shape[0],
        forward_only=forward_only)
