"""Token log-probs and entropy from vocab-parallel logits, and the GRPO policy loss of one micro-batch (seed steps 38–40)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from vime.errors import ConfigError
from vime.real.megatron.batches import MicroBatch

if TYPE_CHECKING:
    from vime.real.megatron.actor import ActorConfig


def response_slice(logp: torch.Tensor, row: int, total: int, resp: int) -> torch.Tensor:
    """The log-probs of row `row`'s `resp` response tokens, of a `total`-token row."""
    # Token at position p is predicted by the logits at p-1: the response tokens at
    # [total-resp, total) read log-probs [total-resp-1, total-1).
    return logp[row, total - resp - 1: total - 1]


def vocab_parallel_entropy(logits: torch.Tensor, group: Any, *, differentiable: bool = False) -> torch.Tensor:
    """Entropy per position of logits split over the vocabulary across `group` (collective).

    With `differentiable` the sums cross the ranks through Megatron's autograd-aware all-reduce, so
    an entropy bonus trains every rank's slice; the max is a constant shift and stays detached.
    """
    import torch.distributed as dist

    m = logits.detach().max(dim=-1, keepdim=True).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - m
    e = torch.exp(shifted)
    z = e.sum(dim=-1, keepdim=True)
    ez = (e * shifted).sum(dim=-1, keepdim=True)
    if differentiable:
        from megatron.core.tensor_parallel import reduce_from_tensor_model_parallel_region

        z, ez = reduce_from_tensor_model_parallel_region(z), reduce_from_tensor_model_parallel_region(ez)
    else:
        dist.all_reduce(z, group=group)
        dist.all_reduce(ez, group=group)
    return (torch.log(z) - ez / z).squeeze(-1)


@dataclass(frozen=True)
class TokenScorer:
    """Scores tokens with this TP rank's slice of the vocabulary (`tp_rank`; `vocab_size` unpadded)."""

    vocab_size: int
    tp_rank: int
    temperature: float = 1.0

    def token_stats(self, logits: torch.Tensor, tokens: torch.Tensor, with_entropy: bool,
                    entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-position log-prob of the next token ([b, s-1]) from vocab-parallel logits, and entropy
        (differentiable with `entropy_grad`, for an entropy bonus)."""
        from megatron.core import parallel_state as ps
        from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

        logits = logits[:, :-1].float()
        if self.temperature != 1.0:
            logits = logits / self.temperature
        per_rank = logits.shape[-1]
        start = self.tp_rank * per_rank
        if start + per_rank > self.vocab_size:  # padded vocab entries must not take probability mass
            pad = torch.arange(start, start + per_rank, device=logits.device) >= self.vocab_size
            logits = logits.masked_fill(pad, -1e30)
        entropy = None
        if with_entropy and entropy_grad:
            entropy = vocab_parallel_entropy(logits, ps.get_tensor_model_parallel_group(), differentiable=True)
        elif with_entropy:
            with torch.no_grad():
                entropy = vocab_parallel_entropy(logits.detach(), ps.get_tensor_model_parallel_group())
        # the cross-entropy below works in place on `logits`; the entropy's graph saved only tensors
        # derived from it (exp and the shifted logits), so no copy of the logits is needed
        logp = -vocab_parallel_cross_entropy(logits.contiguous(), tokens[:, 1:].contiguous())
        return logp, entropy


def policy_loss(cfg: ActorConfig, scorer: TokenScorer, mb: MicroBatch,
                logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's loss (seed step 40) and its metrics, each weighted by the rows it covers.

    The policy term by ``--advantage-estimator``: PPO's clipped token loss (grpo,
    reinforce_plus_plus_baseline), GSPO's clipped sequence loss, or CISPO's clipped IS weight; each
    token's term weighted by its truncated importance weight with ``--use-tis``; plus
    ``--kl-loss-coef`` × the KL to the reference model with ``--use-kl-loss``; minus
    ``--entropy-coef`` × the mean entropy.
    """
    from vime.algo.policy_loss import (
        Aggregation,
        aggregate,
        approx_kl,
        cispo_loss,
        compute_policy_loss,
        gspo_loss,
        tis_weights,
    )

    bonus = cfg.entropy_coef > 0
    logp, entropy = scorer.token_stats(logits, mb.tokens, with_entropy=True, entropy_grad=bonus)
    rows = list(enumerate(zip(mb.total_lengths, mb.response_lengths, strict=True)))

    def responses(per_position: torch.Tensor) -> torch.Tensor:
        return torch.cat([response_slice(per_position, i, t, r) for i, (t, r) in rows])

    cur = responses(logp)
    # Reused old log-probs (seed step 38): the policy has not moved yet, so old = current, detached.
    old = torch.cat(mb.old_log_probs) if mb.old_log_probs is not None else cur.detach()
    adv = torch.cat(mb.advantages)
    eps_high = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
    mode: Aggregation = "token_mean" if cfg.calculate_per_token_loss else "sample_mean"
    metrics: dict[str, torch.Tensor] = {}
    n = float(len(rows))
    if cfg.advantage_estimator == "gspo":
        per_sample, clipped_s = gspo_loss(cur, old, adv, mb.loss_masks, eps_clip=cfg.eps_clip, eps_clip_high=eps_high)
        pg_loss = per_sample.mean()
        clipfrac = clipped_s.mean().detach()
    else:
        if cfg.advantage_estimator == "cispo":
            pg_losses, clipped = cispo_loss(cur, old, adv, eps_clip=cfg.eps_clip, eps_clip_high=eps_high)
        else:
            pg_losses, clipped = compute_policy_loss(old - cur, adv, cfg.eps_clip, eps_high, eps_clip_c=cfg.eps_clip_c)
        if cfg.use_tis:
            if mb.rollout_log_probs is None:
                raise ConfigError("--use-tis needs the engines' log-probs in the batch, but they are missing")
            w = tis_weights(old, torch.cat(mb.rollout_log_probs), clip_high=cfg.tis_clip, clip_low=cfg.tis_clip_low)
            pg_losses = pg_losses * w
            metrics["tis_weight"] = aggregate(w, mb.loss_masks, mode) * n
        pg_loss = aggregate(pg_losses, mb.loss_masks, mode)
        with torch.no_grad():
            clipfrac = aggregate(clipped, mb.loss_masks, mode)
    loss = pg_loss
    if cfg.use_kl_loss:
        if mb.ref_log_probs is None:
            raise ConfigError("--use-kl-loss needs the reference model's log-probs, but they are missing")
        kl = aggregate(approx_kl(cur, torch.cat(mb.ref_log_probs), cfg.kl_loss_type), mb.loss_masks, mode)
        loss = loss + cfg.kl_loss_coef * kl
        metrics["kl_loss"] = kl.detach() * n
    assert entropy is not None
    ent_mean = aggregate(responses(entropy), mb.loss_masks, mode)
    if bonus:
        loss = loss - cfg.entropy_coef * ent_mean
    if mb.rollout_log_probs is not None and cfg.get_mismatch_metrics:
        gap = old.detach() - torch.cat(mb.rollout_log_probs)
        metrics["train_rollout_logprob_abs_diff"] = aggregate(gap.abs(), mb.loss_masks, mode) * n
    # The schedule divides what we return by the number of micro-batches; loss_scale undoes
    # that and weighs this micro-batch by its share of the step's rows on this rank, so uneven
    # micro-batches still weigh every row equally.
    metrics.update({"loss": pg_loss.detach() * n, "pg_clipfrac": clipfrac * n,
                    "entropy": ent_mean.detach() * n, "rows": torch.tensor(n)})
    return loss * mb.loss_scale, metrics
