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


# --------------------------------------------------------------------------------------------
# GSPO, CISPO, truncated importance sampling, KL against a reference, entropy (issue 19)
# --------------------------------------------------------------------------------------------


def sequence_ratio(log_probs: torch.Tensor, old_log_probs: torch.Tensor,
                   loss_masks: Sequence[Sequence[int]] | Sequence[torch.Tensor]) -> torch.Tensor:
    """GSPO's per-sequence importance ratio s_i = exp(mean over the masked tokens of log π − log π_old),
    one value per sample, differentiable through `log_probs`."""
    masks = _masks(loss_masks, log_probs.dtype, log_probs.device)
    parts = torch.split(log_probs - old_log_probs.detach(), [int(m.numel()) for m in masks])
    return torch.stack([((d * m).sum() / m.sum().clamp_min(1.0)).exp() for d, m in zip(parts, masks, strict=True)])


def gspo_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor,
              loss_masks: Sequence[Sequence[int]] | Sequence[torch.Tensor], *, eps_clip: float,
              eps_clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO (group sequence policy optimisation): the clipped objective on sequence ratios.

    loss_i = max(−s_i·A_i, −clip(s_i, 1 − eps_clip, 1 + eps_clip_high)·A_i) with A_i the sample's
    advantage (its first masked token's; GRPO advantages are constant over a response). Returns the
    per-sample losses and clip indicators; the sample mean is GSPO's objective.
    """
    masks = _masks(loss_masks, log_probs.dtype, log_probs.device)
    s = sequence_ratio(log_probs, old_log_probs, masks)
    adv = torch.stack([a[m.bool()][0] if m.any() else a.new_zeros(()) for a, m in
                       zip(torch.split(advantages.detach(), [int(m.numel()) for m in masks]), masks, strict=True)])
    loss1 = -s * adv
    loss2 = -s.clamp(1.0 - eps_clip, 1.0 + eps_clip_high) * adv
    return torch.maximum(loss1, loss2), torch.gt(loss2, loss1).float()


def cispo_loss(log_probs: torch.Tensor, old_log_probs: torch.Tensor, advantages: torch.Tensor, *,
               eps_clip: float, eps_clip_high: float) -> tuple[torch.Tensor, torch.Tensor]:
    """CISPO (clipped IS-weight policy optimisation): per token −sg(clip(r, 1 − eps_clip, 1 + eps_clip_high))·A·log π.

    The importance weight is clipped and detached, so unlike PPO's clip no token's gradient is
    dropped; only its weight is bounded. Returns per-token losses and where the weight was clipped.
    """
    ratio = (log_probs.detach() - old_log_probs.detach()).exp()
    weight = ratio.clamp(1.0 - eps_clip, 1.0 + eps_clip_high)
    return -weight * advantages.detach() * log_probs, torch.ne(weight, ratio).float()


def tis_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, *, clip_high: float,
                clip_low: float = 0.0) -> torch.Tensor:
    """Truncated importance sampling: w = clamp(π_train_old / π_rollout, clip_low, clip_high), detached —
    corrects for the rollout engine's sampling distribution differing from the trainer's."""
    return (old_log_probs.detach() - rollout_log_probs.detach()).exp().clamp(clip_low, clip_high)


KLType = Literal["k1", "k2", "k3", "low_var_kl"]
KL_TYPES: tuple[str, ...] = ("k1", "k2", "k3", "low_var_kl")


def approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str = "low_var_kl") -> torch.Tensor:
    """Per-token estimate of KL(π ‖ π_ref) from samples of π (Schulman's k1/k2/k3; low_var_kl = k3 clamped
    to [−10, 10], as slime names them). With r = log π − log π_ref: k1 = r, k2 = r²/2, k3 = e^(−r) − 1 + r."""
    r = log_probs - ref_log_probs.detach()
    if kind == "k1":
        return r
    if kind == "k2":
        return 0.5 * r * r
    if kind in ("k3", "low_var_kl"):
        k3 = (-r).exp() - 1.0 + r
        return k3.clamp(-10.0, 10.0) if kind == "low_var_kl" else k3
    raise ValueError(f"KL type {kind!r} is not one of {', '.join(KL_TYPES)}")
