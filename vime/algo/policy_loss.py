"""PPO clipped policy loss with dual clip, clip fraction, and loss-mask aggregation (seed step 40)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

Aggregation = Literal["token_mean", "sample_mean"]


def compute_policy_loss(
    ppo_kl: torch.Tensor,
    advantages: torch.Tensor,
    eps_clip: float,
    eps_clip_high: float,
    eps_clip_c: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss and clip indicator (seed step 40).

    ``ppo_kl = old − current`` so ``ratio = exp(current − old)``;
    ``loss = max(−ratio·A, −clip(ratio, 1 − eps_clip, 1 + eps_clip_high)·A)``. With dual clip
    (`eps_clip_c` > 1) the loss of a negative-advantage token is further capped at
    ``−eps_clip_c·A``. The second tensor is 1.0 where the clipped term won (the clip fraction
    before aggregation).
    """
    if eps_clip_c is not None and eps_clip_c <= 1.0:
        raise ValueError(f"eps_clip_c must be > 1 for dual clip, got {eps_clip_c}")
    ratio = (-ppo_kl).exp()
    pg_losses1 = -ratio * advantages
    pg_losses2 = -ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high) * advantages
    clipped = torch.maximum(pg_losses1, pg_losses2)
    clipfrac = torch.gt(pg_losses2, pg_losses1).float()
    if eps_clip_c is None:
        return clipped, clipfrac
    pg_losses3 = -eps_clip_c * advantages
    dual = torch.minimum(pg_losses3, clipped)
    return torch.where(advantages < 0, dual, clipped), clipfrac


def _masks(loss_masks: Sequence[Sequence[int]] | Sequence[torch.Tensor], dtype: torch.dtype,
           device: torch.device) -> list[torch.Tensor]:
    return [torch.as_tensor(m, dtype=dtype, device=device) for m in loss_masks]


def aggregate(values: torch.Tensor, loss_masks: Sequence[Sequence[int]] | Sequence[torch.Tensor],
              mode: Aggregation = "token_mean") -> torch.Tensor:
    """Reduce per-token `values` (the samples' response tokens, concatenated) over loss_mask = 1 only.

    ``token_mean``: sum(values·mask) / sum(mask) over the whole batch.
    ``sample_mean``: each sample's masked mean, then the mean over samples (a sample whose mask
    is all zero contributes 0). Prompt tokens are never in `values`; masked response tokens
    (partial rollout, tool output) contribute nothing, including no gradient.
    """
    masks = _masks(loss_masks, values.dtype, values.device)
    lengths = [int(m.numel()) for m in masks]
    if sum(lengths) != values.numel():
        raise ValueError(f"values have {values.numel()} tokens but the loss masks cover {sum(lengths)}; "
                         f"pass the response tokens of the same samples")
    if not masks:
        return values.sum() * 0.0
    if mode == "token_mean":
        mask = torch.cat(masks)
        return (values * mask).sum() / mask.sum().clamp_min(1.0)
    if mode == "sample_mean":
        parts = torch.split(values, lengths)
        means = [(v * m).sum() / m.sum().clamp_min(1.0) for v, m in zip(parts, masks, strict=True)]
        return torch.stack(means).mean()
    raise ValueError(f"aggregation {mode!r} is not token_mean or sample_mean")


@dataclass
class PolicyLossOutput:
    """The aggregated loss (differentiable) and its diagnostics (detached)."""

    loss: torch.Tensor
    clipfrac: torch.Tensor
    ppo_kl: torch.Tensor
    ratio_mean: torch.Tensor


def policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_masks: Sequence[Sequence[int]] | Sequence[torch.Tensor],
    *,
    eps_clip: float,
    eps_clip_high: float | None = None,
    eps_clip_c: float | None = None,
    aggregation: Aggregation = "token_mean",
) -> PolicyLossOutput:
    """The GRPO/PPO policy loss of a micro-batch: per-token loss, aggregated over loss_mask tokens.

    All three tensors hold the response tokens of the micro-batch's samples, concatenated in
    sample order; `loss_masks` gives each sample's mask (its length is the response length).
    `old_log_probs` is treated as a constant: when old = current.detach() the ratio is 1 but
    the gradient is not zero (seed step 40, value 1).
    """
    if not (log_probs.shape == old_log_probs.shape == advantages.shape):
        raise ValueError(f"log_probs {tuple(log_probs.shape)}, old_log_probs {tuple(old_log_probs.shape)} "
                         f"and advantages {tuple(advantages.shape)} must have the same shape")
    high = eps_clip if eps_clip_high is None else eps_clip_high
    ppo_kl = old_log_probs.detach() - log_probs
    per_token, clip = compute_policy_loss(ppo_kl, advantages.detach(), eps_clip, high, eps_clip_c)
    loss = aggregate(per_token, loss_masks, aggregation)
    with torch.no_grad():
        clipfrac = aggregate(clip, loss_masks, aggregation)
        kl = aggregate(ppo_kl.detach(), loss_masks, aggregation)
        ratio = aggregate((-ppo_kl.detach()).exp(), loss_masks, aggregation)
    return PolicyLossOutput(loss=loss, clipfrac=clipfrac, ppo_kl=kl, ratio_mean=ratio)
