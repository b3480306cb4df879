"""The model of the 8-GPU seed run (issue 9): a random-weight Qwen3 with Qwen3-0.6B's body and an 8192-token vocabulary.

Built where it runs, from `vime.real.tiny_model` (no download): 0.45 B parameters, 0.9 GB in bf16,
which is 15 device-call parts — building it on the 8-GPU machine takes seconds, shipping it would
cost more device time than the run. Shape: hidden 1024 and 16 query / 8 KV heads, so TP 2 splits
heads evenly; 28 layers so the trainer and the decode are not pure overhead; the tokenizer is
trained on 60 000 corpus lines so it really has 8192 tokens (every id a random model samples or
the toy task puts in a prompt decodes — vLLM rejects prompt ids beyond its tokenizer).

    python scripts/h200x8/seed_model.py build DIR    # the whole model directory (weights + tokenizer)
    python scripts/h200x8/seed_model.py config DIR   # config.json only, for `vime simulate --model`
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from vime.real.tiny_model import TinyModelSpec, build_tiny_qwen3  # noqa: E402

SPEC = TinyModelSpec(vocab_size=8192, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                     num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
                     tie_word_embeddings=True, dtype="bfloat16", seed=0, corpus_lines=60000)

#: Special-token ids of the tokenizer `build_tiny_qwen3` trains: its specials come first, in order.
EOS_ID = 0
PAD_ID = 3


def _qwen3_config(spec: TinyModelSpec) -> object:
    import torch
    from transformers import Qwen3Config

    vocab = -(-spec.vocab_size // 64) * 64
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size,
                      num_hidden_layers=spec.num_hidden_layers, num_attention_heads=spec.num_attention_heads,
                      num_key_value_heads=spec.num_key_value_heads, head_dim=spec.head_dim,
                      max_position_embeddings=spec.max_position_embeddings,
                      tie_word_embeddings=spec.tie_word_embeddings, bos_token_id=EOS_ID, eos_token_id=EOS_ID,
                      pad_token_id=PAD_ID, **spec.extra_config)
    cfg.architectures = ["Qwen3ForCausalLM"]
    cfg.dtype = getattr(torch, spec.dtype)
    return cfg


def write_config(path: str | Path, spec: TinyModelSpec = SPEC) -> Path:
    """Write the config.json `build_tiny_qwen3(spec)` writes, without building weights (for the simulator).

    Assumes the tokenizer reaches ``spec.vocab_size`` (true for SPEC; tests compare against a
    real build of a one-layer variant).
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    _qwen3_config(spec).save_pretrained(out)  # type: ignore[attr-defined]
    return out / "config.json"


def hf_config(spec: TinyModelSpec = SPEC) -> dict:
    """`write_config`'s content as a dict (transformers_version dropped)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        cfg = json.loads(write_config(d, spec).read_text())
    cfg.pop("transformers_version", None)
    return cfg


def one_layer(spec: TinyModelSpec = SPEC) -> TinyModelSpec:
    """SPEC with one layer: cheap to build for checks of everything but depth."""
    return replace(spec, num_hidden_layers=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("build", "config"))
    ap.add_argument("dir")
    a = ap.parse_args(argv)
    if a.what == "build":
        path = build_tiny_qwen3(a.dir, SPEC)
        vocab = json.loads((path / "config.json").read_text())["vocab_size"]
        if vocab != hf_config()["vocab_size"]:
            print(f"built vocab {vocab} != planned {hf_config()['vocab_size']}", file=sys.stderr)
            return 1
        print(path)
    else:
        print(write_config(a.dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
