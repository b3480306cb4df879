"""Token log-probs and entropy from vocab-parallel logits, and the GRPO policy loss of one micro-batch (seed steps 38–40)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from vime.real.megatron.batches import MicroBatch

if TYPE_CHECKING:
    from vime.real.megatron.actor import ActorConfig


def response_slice(logp: torch.Tensor, row: int, total: int, resp: int) -> torch.Tensor:
    """The log-probs of row `row`'s `resp` response tokens, of a `total`-token row."""
    # Token at position p is predicted by the logits at p-1: the response tokens at
    # [total-resp, total) read log-probs [total-resp-1, total-1).
    return logp[row, total - resp - 1: total - 1]


def vocab_parallel_entropy(logits: torch.Tensor, group: Any) -> torch.Tensor:
    """Entropy per position of logits split over the vocabulary across `group` (collective)."""
    import torch.distributed as dist

    m = logits.max(dim=-1, keepdim=True).values
    dist.all_reduce(m, op=dist.ReduceOp.MAX, group=group)
    e = torch.exp(logits - m)
    z = e.sum(dim=-1, keepdim=True)
    ez = (e * (logits - m)).sum(dim=-1, keepdim=True)
    dist.all_reduce(z, group=group)
    dist.all_reduce(ez, group=group)
    return (torch.log(z) - ez / z).squeeze(-1)


@dataclass(frozen=True)
class TokenScorer:
    """Scores tokens with this TP rank's slice of the vocabulary (`tp_rank`; `vocab_size` unpadded)."""

    vocab_size: int
    tp_rank: int
    temperature: float = 1.0

    def token_stats(self, logits: torch.Tensor, tokens: torch.Tensor,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-position log-prob of the next token ([b, s-1]) from vocab-parallel logits, and entropy."""
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
        if with_entropy:
            with torch.no_grad():
                entropy = vocab_parallel_entropy(logits.detach(), ps.get_tensor_model_parallel_group())
        logp = -vocab_parallel_cross_entropy(logits.contiguous(), tokens[:, 1:].contiguous())
        return logp, entropy


def policy_loss(cfg: ActorConfig, scorer: TokenScorer, mb: MicroBatch,
                logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The micro-batch's policy loss (seed step 40) and its metrics, each weighted by the rows it covers."""
    from vime.algo.policy_loss import Aggregation, aggregate, compute_policy_loss

    logp, entropy = scorer.token_stats(logits, mb.tokens, with_entropy=True)
    rows = list(enumerate(zip(mb.total_lengths, mb.response_lengths, strict=True)))
    cur = torch.cat([response_slice(logp, i, t, r) for i, (t, r) in rows])
    # Reused old log-probs (seed step 38): the policy has not moved yet, so old = current, detached.
    old = torch.cat(mb.old_log_probs) if mb.old_log_probs is not None else cur.detach()
    ppo_kl = old - cur
    eps_high = cfg.eps_clip if cfg.eps_clip_high is None else cfg.eps_clip_high
    pg_losses, clipped = compute_policy_loss(ppo_kl, torch.cat(mb.advantages), cfg.eps_clip,
                                             eps_high, eps_clip_c=cfg.eps_clip_c)
    assert entropy is not None
    ent = torch.cat([response_slice(entropy, i, t, r) for i, (t, r) in rows])
    mode: Aggregation = "token_mean" if cfg.calculate_per_token_loss else "sample_mean"
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
