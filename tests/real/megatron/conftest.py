"""Shared fixtures of the Megatron trainer tests: one local Ray per session and the tiny HF model directories (dense and MoE)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_hf_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Qwen3 (2 layers, hidden 64, GQA 4:2, head_dim 32, vocab 512, tied) with a local tokenizer."""
    from vime.testing.tiny_model import TinyModelSpec, build_tiny_qwen3

    spec = TinyModelSpec(hidden_size=64, intermediate_size=128, max_position_embeddings=256, corpus_lines=300)
    return build_tiny_qwen3(tmp_path_factory.mktemp("tiny_qwen3"), spec)


@pytest.fixture(scope="session")
def tiny_moe_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny Qwen3-MoE of the same shape: 4 experts of width 64 per layer, top 2."""
    from vime.testing.tiny_model import TinyModelSpec
    from vime.testing.tiny_moe import build_tiny_qwen3_moe

    spec = TinyModelSpec(hidden_size=64, intermediate_size=128, max_position_embeddings=256, corpus_lines=300)
    return build_tiny_qwen3_moe(tmp_path_factory.mktemp("tiny_moe"), spec, num_experts=4, top_k=2,
                                moe_intermediate_size=64)


@pytest.fixture(scope="session")
def ray_local():
    """Local Ray on this machine's cores, shared by every Megatron test of the session."""
    import ray

    from vime.real.cluster import init_ray

    started = not ray.is_initialized()
    init_ray(num_cpus=2)
    yield ray
    if started:
        ray.shutdown()
