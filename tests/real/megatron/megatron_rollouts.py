"""Synthetic GRPO rollouts for the Megatron trainer tests: a response earns reward 1 when it contains a chosen token."""

from __future__ import annotations

import random

from vime.algo.advantages import normalize_group_rewards
from vime.algo.dp_schedule import build_dp_schedule
from vime.types import TrainBatch

VOCAB = 512  # vime.testing.tiny_model's vocabulary
CHOSEN = 300


def synthetic_batch(rollout_id: int, *, prompts: int = 4, group: int = 4, dp: int = 1, micro_batch_size: int = 2,
                    global_batch_size: int | None = None, seed: int = 0, chosen: int = CHOSEN,
                    vocab: int = VOCAB) -> TrainBatch:
    """`prompts` groups of `group` samples; about half the responses contain `chosen` (reward 1)."""
    rng = random.Random(seed * 1000 + rollout_id)
    tokens, resp_lens, masks, raw, groups, idx = [], [], [], [], [], []
    for g in range(prompts):
        prompt = [rng.randrange(10, vocab) for _ in range(rng.randint(3, 6))]
        for k in range(group):
            n = rng.randint(3, 7)
            response = [rng.randrange(10, vocab) for _ in range(n)]
            hit = k % 2 == 0
            if hit:
                for pos in rng.sample(range(n), k=max(1, n // 2)):
                    response[pos] = chosen
            tokens.append(prompt + response)
            resp_lens.append(n)
            masks.append([1] * n)
            raw.append(1.0 if chosen in response else 0.0)
            groups.append(g)
            idx.append(len(idx))
    raw_r, norm = normalize_group_rewards(raw, groups)
    total = [len(t) for t in tokens]
    schedule = build_dp_schedule(total, dp_size=dp, micro_batch_size=micro_batch_size,
                                 global_batch_size=global_batch_size or len(tokens))
    return TrainBatch(rollout_id=rollout_id, tokens=tokens, response_lengths=resp_lens, loss_masks=masks,
                      raw_rewards=raw_r, rewards=norm, total_lengths=total, sample_indices=idx,
                      group_indices=groups, schedule=schedule)


def eval_rows(n: int = 8, seed: int = 99, vocab: int = VOCAB) -> list[list[int]]:
    """Equal-length prompts on which to read P(chosen | prompt) at the last position."""
    rng = random.Random(seed)
    return [[rng.randrange(10, vocab) for _ in range(6)] for _ in range(n)]


def even_token_fraction(args: object, sample: object) -> float:
    """A `--custom-rm-path` reward for mixed-mode runs: the fraction of even response token ids
    (it varies within a group, so GRPO advantages are not all zero)."""
    n = sample.response_length  # type: ignore[attr-defined]
    response = sample.tokens[len(sample.tokens) - n:] if n else []  # type: ignore[attr-defined]
    return sum(1 for t in response if t % 2 == 0) / max(len(response), 1)
