"""Where prompts come from (seed step 16): a JSONL dataset or a synthetic one, grouped into n copies, with epochs and returned samples.

`DataSource.get_samples(k)` hands out k groups of ``n_samples_per_prompt`` independent copies of
a prompt, numbered as in the seed (``group_index`` 0..31, ``index`` 0..255 for the first rollout
of the seed's scenario). Groups the rollout did not use (aborted when the target was met) come
back through `add_samples` and are handed out first next time, so no prompt is lost. The
position in the dataset, the epoch, the counters and the returned groups form `state_dict`,
saved with every checkpoint.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

from vime.errors import ConfigError
from vime.inputs import read_jsonl
from vime.types import Sample, SampleStatus

if TYPE_CHECKING:
    from vime.config import DataConfig, RolloutConfig, TrainConfig


@runtime_checkable
class Tokenizer(Protocol):
    """What the rollout needs from a tokenizer (a Hugging Face tokenizer fits)."""

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = ...) -> str: ...


class ByteTokenizer:
    """UTF-8 bytes as token ids (0..255), EOS 256: no files, no downloads; for tests and toy runs."""

    vocab_size = 257
    eos_token_id = 256

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return bytes(t for t in token_ids if 0 <= t < 256).decode("utf-8", errors="replace")


#: Files one of which a Hugging Face model directory with a tokenizer holds.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")


def has_tokenizer(path: str | os.PathLike[str] | None) -> bool:
    """Whether the model directory `path` carries a tokenizer (a random-weight model built for a
    benchmark may have none: its prompts are token ids and its responses are not decoded)."""
    return bool(path) and any(os.path.exists(os.path.join(path, f)) for f in TOKENIZER_FILES)  # type: ignore[arg-type]


def load_tokenizer(path: str | None) -> Any:
    """The tokenizer of ``--hf-checkpoint`` `path` (transformers, imported lazily), or None without one
    (no checkpoint, or a checkpoint directory without tokenizer files)."""
    if not path or (os.path.isdir(path) and not has_tokenizer(path)):
        return None
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:
        raise ConfigError("--hf-checkpoint needs the `transformers` package to load the tokenizer; "
                          "pip install 'vime[train]'") from exc
    return AutoTokenizer.from_pretrained(path, trust_remote_code=True)


_SCALARS = (str, int, float, bool, type(None))
_SCALAR_TYPES = frozenset(_SCALARS)


def _copy_value(v: Any) -> Any:
    """A copy of `v` as independent as deepcopy's, at C speed for containers of scalars (a label of 19k target
    ids — the toy task's at Qwen3's vocabulary — took deepcopy 10 ms per sample, seconds per rollout)."""
    t = type(v)
    if t in _SCALAR_TYPES:
        return v
    if t is list:
        return list(v) if set(map(type, v)) <= _SCALAR_TYPES else [_copy_value(x) for x in v]
    if t is tuple:
        return v if set(map(type, v)) <= _SCALAR_TYPES else tuple(_copy_value(x) for x in v)
    if t is dict:
        return {k: _copy_value(x) for k, x in v.items()}
    return copy.deepcopy(v)


def copy_sample(sample: Sample) -> Sample:
    """An independent copy of a prompt sample (the seed's deepcopy, without deepcopy's cost on token lists
    and labels)."""
    return dataclasses.replace(
        sample,
        tokens=list(sample.tokens),
        loss_mask=None if sample.loss_mask is None else list(sample.loss_mask),
        rollout_log_probs=None if sample.rollout_log_probs is None else list(sample.rollout_log_probs),
        weight_versions=list(sample.weight_versions),
        metadata=_copy_value(sample.metadata),
        prompt=_copy_value(sample.prompt),
        label=_copy_value(sample.label),
        reward=_copy_value(sample.reward),
    )


# --------------------------------------------------------------------------------------------
# Datasets: indexable collections of prompt samples (tokens = prompt ids, no response)
# --------------------------------------------------------------------------------------------


class PromptDataset(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> Sample: ...


class ListDataset:
    """Prompt samples held in memory (what a JSONL file loads into)."""

    def __init__(self, samples: Sequence[Sample], *, filtered: int = 0) -> None:
        if not samples:
            raise ConfigError("the prompt dataset is empty (after the length filter, if any); give prompts "
                              "no longer than --rollout-max-prompt-len")
        self.samples = list(samples)
        self.filtered = filtered  # prompts dropped by the length filter

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int) -> Sample:
        return self.samples[i]


def load_jsonl(path: str | Path, *, input_key: str = "prompt", label_key: str | None = "label",
               tokenizer: Any = None, max_prompt_len: int | None = None,
               apply_chat_template: bool = False, metadata_key: str | None = "metadata") -> ListDataset:
    """Read prompts from a JSONL file (seed step 16; length filter as when the seed builds its Dataset).

    Each line is an object; `input_key` holds the prompt (text, or a chat message list when
    `apply_chat_template`), `label_key` the label, an optional ``token_ids`` field pre-tokenised
    prompt ids. Prompts longer than `max_prompt_len` tokens are dropped and counted.
    """
    p = Path(path)
    samples: list[Sample] = []
    filtered = 0
    for lineno, row, _ in read_jsonl(p, what="--prompt-data",
                                     missing_hint=f"give a JSONL file with one {{{input_key!r}: ..., "
                                                  f"{label_key!r}: ...}} object per line"):
        if not isinstance(row, dict) or input_key not in row:
            keys = sorted(row) if isinstance(row, dict) else type(row).__name__
            raise ConfigError(f"--prompt-data {p}:{lineno} has no {input_key!r} field (found {keys}); "
                              f"set --input-key to the field that holds the prompt")
        prompt = row[input_key]
        ids = row.get("token_ids")
        if ids is None:
            ids = _tokenize(prompt, tokenizer, apply_chat_template, where=f"{p}:{lineno}")
        elif not (isinstance(ids, list) and ids and all(type(t) is int and t >= 0 for t in ids)):
            raise ConfigError(f"--prompt-data {p}:{lineno}: token_ids must be a non-empty list of token ids "
                              f"(integers ≥ 0), got {str(ids)[:60]}; fix the line or leave token_ids out")
        if max_prompt_len is not None and len(ids) > max_prompt_len:
            filtered += 1
            continue
        meta = row.get(metadata_key) if metadata_key else None
        samples.append(Sample(prompt=prompt, label=row.get(label_key) if label_key else None,
                              tokens=[int(t) for t in ids],
                              metadata=dict(meta) if isinstance(meta, dict) else {}))
    return ListDataset(samples, filtered=filtered)


def _tokenize(prompt: Any, tokenizer: Any, chat: bool, *, where: str) -> list[int]:
    if tokenizer is None:
        raise ConfigError(f"{where}: the prompt is text but there is no tokenizer; pass --hf-checkpoint or "
                          f"give pre-tokenised prompts in a token_ids field")
    if chat or not isinstance(prompt, str):
        if not hasattr(tokenizer, "apply_chat_template"):
            raise ConfigError(f"{where}: the prompt is a message list but the tokenizer has no chat template")
        return list(tokenizer.apply_chat_template(prompt, tokenize=True, add_generation_prompt=True))
    return list(tokenizer.encode(prompt, add_special_tokens=False))


class SyntheticDataset:
    """Prompts made up for the simulator: `size` prompts whose lengths come from `prompt_length(i)`.

    `prompt_length` is a seeded function of the prompt's position (the simulator passes its
    length sampler), so the same seed gives the same prompts. Token ids are a cheap
    deterministic pattern below `vocab_size`; their values do not matter to a simulated engine.
    """

    def __init__(self, size: int, prompt_length: Callable[[int], int], *, vocab_size: int = 32000,
                 seed: int = 0, max_prompt_len: int | None = None) -> None:
        if size < 1:
            raise ConfigError(f"a synthetic dataset needs at least one prompt, got size {size}")
        self.size = size
        self.prompt_length = prompt_length
        self.vocab_size = vocab_size
        self.seed = seed
        self.max_prompt_len = max_prompt_len
        self.filtered = 0

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int) -> Sample:
        n = int(self.prompt_length(i))
        if self.max_prompt_len is not None:
            n = min(n, self.max_prompt_len)
        ids = ((np.arange(n, dtype=np.int64) * 7919 + i * 1_000_003 + self.seed) % self.vocab_size).tolist()
        return Sample(prompt=f"synthetic prompt {i}", label=None, tokens=ids, metadata={"prompt_id": i})


# --------------------------------------------------------------------------------------------
# The data source
# --------------------------------------------------------------------------------------------


class DataSource:
    """Hands out groups of prompt copies in dataset order, epoch after epoch (seed step 16).

    Returned groups (`add_samples`) are served first. With `shuffle` each epoch has its own
    permutation seeded by ``seed + epoch``.
    """

    def __init__(self, dataset: PromptDataset, *, n_samples_per_prompt: int, seed: int = 0,
                 shuffle: bool = False) -> None:
        if n_samples_per_prompt < 1:
            raise ConfigError(f"--n-samples-per-prompt must be ≥ 1, got {n_samples_per_prompt}")
        self.dataset = dataset
        self.n_samples_per_prompt = n_samples_per_prompt
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.offset = 0  # next position in this epoch's order
        self.sample_group_index = 0
        self.sample_index = 0
        self.buffer: deque[list[Sample]] = deque()
        self.returned_total = 0  # groups handed back over the run
        self._order: np.ndarray | None = None

    @classmethod
    def from_config(cls, data: DataConfig, rollout: RolloutConfig, *, seed: int, tokenizer: Any = None) -> DataSource:
        """A JSONL data source from ``--prompt-data``, ``--input-key``, ``--label-key``."""
        if not data.prompt_data:
            raise ConfigError("no prompts: pass --prompt-data FILE.jsonl")
        dataset = load_jsonl(data.prompt_data, input_key=data.input_key, label_key=data.label_key,
                             tokenizer=tokenizer, max_prompt_len=rollout.rollout_max_prompt_len,
                             apply_chat_template=data.apply_chat_template)
        return cls(dataset, n_samples_per_prompt=rollout.n_samples_per_prompt, seed=seed,
                   shuffle=data.rollout_shuffle)

    # --- seed step 16 -----------------------------------------------------------------------------
    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """`num_groups` groups of n copies; returned groups first, then new prompts with fresh numbering."""
        groups: list[list[Sample]] = []
        while self.buffer and len(groups) < num_groups:
            groups.append(self.buffer.popleft())
        n = self.n_samples_per_prompt
        for _ in range(num_groups - len(groups)):
            prompt = self.dataset[self._next_position()]
            group = []
            for _ in range(n):
                sample = copy_sample(prompt)
                sample.group_index = self.sample_group_index
                sample.index = self.sample_index
                self.sample_index += 1
                group.append(sample)
            self.sample_group_index += 1
            groups.append(group)
        return groups

    def _next_position(self) -> int:
        if self.offset >= len(self.dataset):
            self.epoch += 1
            self.offset = 0
            self._order = None
        if self.shuffle and self._order is None:
            self._order = np.random.default_rng(self.seed + self.epoch).permutation(len(self.dataset))
        pos = self.offset if self._order is None else int(self._order[self.offset])
        self.offset += 1
        return pos

    # --- seed steps 15 / 28 -------------------------------------------------------------------
    def add_samples(self, groups: Sequence[Sequence[Sample]]) -> None:
        """Take back groups the rollout did not use; they are reset and served again first."""
        for group in groups:
            if len(group) != self.n_samples_per_prompt:
                raise ValueError(f"add_samples got a group of {len(group)} samples; groups have "
                                 f"{self.n_samples_per_prompt} (--n-samples-per-prompt)")
            for sample in group:
                sample.reset_for_retry()
                sample.weight_versions.clear()  # the response they described is gone
                for key in _RESPONSE_METADATA:
                    sample.metadata.pop(key, None)
            self.buffer.append(list(group))
            self.returned_total += 1

    # --- checkpoints ------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly where this source is (JSON-able)."""
        return {
            "epoch": self.epoch, "offset": self.offset, "sample_group_index": self.sample_group_index,
            "sample_index": self.sample_index, "returned_total": self.returned_total,
            "buffer": [[_sample_to_dict(s) for s in g] for g in self.buffer],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch = int(state["epoch"])
        self.offset = int(state["offset"])
        self.sample_group_index = int(state["sample_group_index"])
        self.sample_index = int(state["sample_index"])
        self.returned_total = int(state.get("returned_total", 0))
        self.buffer = deque([[_sample_from_dict(d) for d in g] for g in state.get("buffer", [])])
        self._order = None


#: Metadata that describes a response (set by the rollout), dropped when a sample is reset.
_RESPONSE_METADATA = ("engine", "error", "cached_tokens")


def _sample_to_dict(s: Sample) -> dict[str, Any]:
    d = dataclasses.asdict(s)
    d["status"] = s.status.value
    return d


def _sample_from_dict(d: dict[str, Any]) -> Sample:
    d = dict(d)
    d["status"] = SampleStatus(d["status"])
    return Sample(**d)


@dataclass(frozen=True)
class EvalSet:
    """One evaluation set: its prompts (a DataSource) and the groups one evaluation draws from it
    (None: --rollout-batch-size; a dataset is evaluated whole by giving its size)."""

    source: DataSource
    groups: int | None = None


def eval_sets_from_files(data: DataConfig, train: TrainConfig, *, max_prompt_len: int,
                         tokenizer: Any) -> dict[str, EvalSet]:
    """One EvalSet per ``--eval-prompt-data NAME PATH`` pair, each evaluated whole once per evaluation."""
    out = {}
    pairs = train.eval_prompt_data
    for name, path in zip(pairs[0::2], pairs[1::2], strict=True):
        dataset = load_jsonl(path, input_key=data.input_key, label_key=data.label_key, tokenizer=tokenizer,
                             max_prompt_len=max_prompt_len, apply_chat_template=data.apply_chat_template)
        source = DataSource(dataset, n_samples_per_prompt=train.n_samples_per_eval_prompt, seed=train.seed)
        out[name] = EvalSet(source, groups=len(dataset))
    return out
