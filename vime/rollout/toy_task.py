"""A toy RL task in token space that a tiny random model learns in a few rollouts: no dataset, no network (issue 8).

Prompts are short runs of random token ids generated locally from a seed; every prompt's label
is the same *target set* of token ids. The reward of a response is the fraction of its tokens
that fall in the target set (`target_fraction_reward`, hooked in with ``--custom-rm-path
vime.rollout.toy_task.target_fraction_reward``). A random policy scores about
``len(targets) / vocab_size``; a policy that learned the task scores near 1. The reward is dense
(every token counts) and differs inside a GRPO group, so the advantages are informative from
the first rollout on — unlike "1 when a target token appears", which a random 512-token model
almost never earns with short responses.

`write_prompts(path, ...)` writes the JSONL that ``--prompt-data`` reads (``token_ids`` +
``label`` per line, so no tokenizer is needed); ``python -m vime.rollout.toy_task OUT.jsonl``
does the same from the shell.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.errors import ConfigError


@dataclass(frozen=True)
class ToyTask:
    """Which prompts and which targets: all derived from `seed`, so equal tasks give equal files.

    `vocab_size` is the model's vocabulary (token ids are drawn from ``[first_id, vocab_size)``,
    leaving the lowest ids — special tokens in the tiny model's tokenizer — out of prompts).
    `target_fraction` of the usable ids form the target set.
    """

    vocab_size: int = 512
    num_prompts: int = 256
    prompt_len: int = 8
    target_fraction: float = 0.125
    first_id: int = 8
    seed: int = 0

    def validate(self) -> None:
        if self.vocab_size <= self.first_id + 1:
            raise ConfigError(f"toy task vocab_size {self.vocab_size} leaves no usable ids above first_id "
                              f"{self.first_id}; give the model's vocabulary size")
        if not 0 < self.target_fraction < 1:
            raise ConfigError(f"toy task target_fraction must lie in (0, 1), got {self.target_fraction}")
        if self.num_prompts < 1 or self.prompt_len < 1:
            raise ConfigError(f"toy task needs num_prompts ≥ 1 and prompt_len ≥ 1, got "
                              f"{self.num_prompts} and {self.prompt_len}")

    def targets(self) -> list[int]:
        """The target token ids (sorted): a seeded random subset of the usable ids."""
        self.validate()
        usable = list(range(self.first_id, self.vocab_size))
        k = max(1, round(self.target_fraction * len(usable)))
        return sorted(random.Random(f"targets/{self.seed}").sample(usable, k))

    def baseline(self) -> float:
        """Expected reward of a uniform random policy over the whole vocabulary."""
        return len(self.targets()) / self.vocab_size

    def prompts(self) -> list[list[int]]:
        """`num_prompts` prompts of `prompt_len` token ids, none of them a target (the answer is not in the question)."""
        targets = set(self.targets())
        pool = [t for t in range(self.first_id, self.vocab_size) if t not in targets]
        rng = random.Random(f"prompts/{self.seed}")
        return [[rng.choice(pool) for _ in range(self.prompt_len)] for _ in range(self.num_prompts)]

    def rows(self) -> list[dict[str, Any]]:
        """JSONL rows for ``--prompt-data``: prompt text (for logs), token ids, the target set as label."""
        targets = self.targets()
        return [{"prompt": f"toy prompt {i}", "token_ids": ids, "label": targets}
                for i, ids in enumerate(self.prompts())]


def write_prompts(path: str | Path, task: ToyTask | None = None) -> Path:
    """Write the task's prompts as JSONL (one object per line) and return the path."""
    task = task or ToyTask()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as fh:
        for row in task.rows():
            fh.write(json.dumps(row) + "\n")
    return out


def target_fraction(response_tokens: Sequence[int], targets: Sequence[int]) -> float:
    """The fraction of `response_tokens` in `targets` (0.0 for an empty response)."""
    if not response_tokens:
        return 0.0
    wanted = {int(t) for t in targets}
    return sum(1 for t in response_tokens if int(t) in wanted) / len(response_tokens)


def _score(sample: Any) -> float:
    label = sample.label
    if not isinstance(label, (list, tuple)) or not label:
        raise ConfigError(f"the toy task's reward needs the target token ids as each prompt's label (a list), "
                          f"got {label!r:.80}; write the prompts with vime.rollout.toy_task.write_prompts")
    n = sample.response_length
    response = list(sample.tokens[len(sample.tokens) - n:]) if n else []
    return target_fraction(response, label)


def target_fraction_reward(args: Any, sample: Any) -> float | list[float]:
    """``--custom-rm-path`` entry: one sample's reward, or one per sample of a group with ``--group-rm``."""
    if isinstance(sample, (list, tuple)):
        return [_score(s) for s in sample]
    return _score(sample)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m vime.rollout.toy_task OUT.jsonl [--vocab-size N] ...``: write the prompts, print the baseline."""
    parser = argparse.ArgumentParser(prog="python -m vime.rollout.toy_task", description=main.__doc__)
    parser.add_argument("out")
    defaults = ToyTask()
    parser.add_argument("--vocab-size", type=int, default=defaults.vocab_size)
    parser.add_argument("--num-prompts", type=int, default=defaults.num_prompts)
    parser.add_argument("--prompt-len", type=int, default=defaults.prompt_len)
    parser.add_argument("--target-fraction", type=float, default=defaults.target_fraction)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    ns = parser.parse_args(argv)
    task = ToyTask(vocab_size=ns.vocab_size, num_prompts=ns.num_prompts, prompt_len=ns.prompt_len,
                   target_fraction=ns.target_fraction, seed=ns.seed)
    path = write_prompts(ns.out, task)
    print(f"{path}: {task.num_prompts} prompts, {len(task.targets())} target ids, "
          f"random-policy reward {task.baseline():.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
