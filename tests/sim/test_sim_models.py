"""Model specs: preset config values, hand-computed parameter / weight / KV numbers, FLOPs, HF config loading."""

from __future__ import annotations

import json
import math

import pytest

from vime.errors import ConfigError
from vime.sim.models import DEFAULT_MODEL, ModelSpec, list_models, load_model

PRESETS = ["Llama-3.1-70B", "Llama-3.1-8B", "Qwen2.5-7B", "Qwen3-0.6B", "Qwen3-1.7B", "Qwen3-14B", "Qwen3-32B",
           "Qwen3-4B", "Qwen3-8B"]


def test_presets_listed():
    assert set(PRESETS) <= set(list_models()) and list_models() == sorted(list_models())
    assert DEFAULT_MODEL == "Qwen3-4B"


def test_qwen3_4b_config_values():
    """The HF config of Qwen/Qwen3-4B (also slime's scripts/models/qwen3-4B.sh)."""
    m = load_model("Qwen3-4B")
    assert (m.num_layers, m.hidden_size, m.ffn_hidden_size) == (36, 2560, 9728)
    assert (m.num_attention_heads, m.num_kv_heads, m.head_dim, m.vocab_size) == (32, 8, 128, 151936)
    assert m.tie_embeddings and m.qk_norm and not m.qkv_bias and m.dtype_bytes == 2


def test_qwen3_4b_parameters_by_hand():
    embed = 151936 * 2560
    attn = 2560 * 4096 + 2 * 2560 * 1024 + 4096 * 2560 + 2 * 128  # q, k, v, o, q/k norms
    mlp = 3 * 2560 * 9728
    layer = attn + mlp + 2 * 2560
    total = embed + 36 * layer + 2560  # tied head, final norm
    m = load_model("Qwen3-4B")
    assert m.num_params() == total
    assert round(total / 1e9, 2) == 4.02


def test_qwen3_4b_weights_per_gpu_at_tp2_is_about_4_gb():
    """Seed step 36: ~8 GB of bf16 weights, ~4 GB per GPU at TP=2."""
    m = load_model("Qwen3-4B")
    per_gpu = m.weight_bytes(tp=2)
    assert per_gpu == 2 * (151936 * 2560 // 2 + 36 * (
        2560 * 2048 + 2 * 2560 * 512 + 2048 * 2560 + 256 + 3 * 2560 * 4864 + 5120) + 2560)
    assert 4.0e9 < per_gpu < 4.05e9


def test_qwen3_4b_kv_bytes_per_token_tp2():
    """2 · 36 layers · 8 KV heads · 128 · 2 bytes / TP 2 = 73,728 B."""
    assert load_model("Qwen3-4B").kv_bytes_per_token(2) == 2 * 36 * 8 * 128 * 2 // 2 == 73_728


def test_kv_heads_are_replicated_beyond_their_count():
    m = load_model("Qwen2.5-7B")  # 4 KV heads
    assert m.kv_bytes_per_token(4) == 2 * 28 * 1 * 128 * 2
    assert m.kv_bytes_per_token(8) == m.kv_bytes_per_token(4)  # one head per rank, replicated
    with pytest.raises(ConfigError, match="KV heads"):
        m.kv_bytes_per_token(3)


@pytest.mark.parametrize("name, billions", [
    ("Qwen3-0.6B", 0.60), ("Qwen3-1.7B", 1.72), ("Qwen3-8B", 8.19), ("Qwen3-14B", 14.77), ("Qwen3-32B", 32.76),
    ("Qwen2.5-7B", 7.62), ("Llama-3.1-8B", 8.03), ("Llama-3.1-70B", 70.55),
])
def test_parameter_counts_match_the_published_ones(name, billions):
    assert load_model(name).num_params() / 1e9 == pytest.approx(billions, abs=0.006)


@pytest.mark.parametrize("name", PRESETS)
def test_hf_weight_shapes_cover_every_parameter(name):
    m = load_model(name)
    shapes = m.hf_weight_shapes()
    assert sum(math.prod(s) for _, s in shapes) == m.num_params()
    assert len({n for n, _ in shapes}) == len(shapes)


@pytest.mark.parametrize("tp, pp", [(1, 1), (2, 1), (1, 2), (2, 3), (4, 4)])
def test_pipeline_stages_add_up(tp, pp):
    m = load_model("Qwen3-8B")  # untied: no duplicated head
    total_tp1 = sum(m.params_per_rank(1, pp, s) for s in range(pp))
    assert total_tp1 == m.num_params()
    assert m.params_per_rank(tp, pp) == max(m.params_per_rank(tp, pp, s) for s in range(pp))


def test_tied_head_is_a_second_copy_on_the_last_stage():
    m = load_model("Qwen3-4B")
    assert sum(m.params_per_rank(1, 2, s) for s in range(2)) == m.num_params() + 151936 * 2560


def test_flops_per_token_is_two_per_matmul_parameter_plus_attention():
    m = load_model("Qwen3-4B")
    dense = m.num_params() - 36 * (2 * 2560 + 256) - 2560  # norms do no matmul; tied head does
    assert m.flops_per_token(0) == 2 * dense
    assert m.flops_per_token(1000) - m.flops_per_token(0) == 4 * 36 * 32 * 128 * 1000
    assert m.flops_per_token(0, lm_head=False) == 2 * (dense - 151936 * 2560)


def test_sequence_flops_sums_the_causal_positions():
    m = load_model("Qwen3-0.6B")
    assert m.sequence_flops(37) == pytest.approx(sum(m.flops_per_token(i) for i in range(1, 38)), rel=1e-12)
    # a prefill of the whole sequence computes logits for its last token only
    assert m.prefill_flops(37) == pytest.approx(
        m.sequence_flops(37, lm_head=False) + 2 * 151936 * 1024, rel=1e-12)
    assert m.prefill_flops(10, 27) == pytest.approx(
        sum(m.flops_per_token(i, lm_head=False) for i in range(28, 38)) + 2 * 151936 * 1024, rel=1e-12)


def test_activation_bytes_follow_the_documented_formula():
    m = load_model("Qwen3-4B")
    b, h, hd, f = 2, 2560, 128, 9728
    tp = 2
    heads, kv = 32 // tp, 8 // tp
    norms = 2 * (b * h + 4 + b * h) / tp  # two fused block norms (input + rstd) and their outputs, SP-split
    qk = (b * heads * hd + 4 * heads) + (b * kv * hd + 4 * kv)  # q/k norms (fused), per head row
    per_layer = norms + qk + b * (heads + 2 * kv) * hd + b * heads * hd + 4 * heads + 3 * b * f / tp
    assert m.activation_bytes_per_layer_token(tp) == pytest.approx(per_layer)
    logits = (2 + 4) * 151936 / tp
    final = (b * h + 4 + b * h) / tp
    assert m.activation_bytes_per_token(tp) == pytest.approx(36 * per_layer + final + logits)
    full = m.activation_bytes_per_token(tp, recompute="full")
    assert full == pytest.approx(36 * b * h / tp + per_layer + final + logits)
    assert full < m.activation_bytes_per_token(tp) == m.activation_bytes_per_token(tp, recompute="selective")
    with pytest.raises(ConfigError):
        m.activation_bytes_per_token(tp, recompute="some")  # type: ignore[arg-type]
    # Megatron's local spec: composite norms keep 8 B per element, unfused attention keeps only its
    # output here (scores and expansions are the trainer's score_bytes), unfused SwiGLU 5·b·F
    local = m.activation_bytes_per_layer_token(tp, attention="unfused", norm="torch_fp32_weight", elementwise="unfused")
    assert local == pytest.approx(2 * (8 * h + 4 + b * h) / tp + (8 * heads * hd + 4 * heads) + (8 * kv * hd + 4 * kv)
                                  + b * heads * hd + 5 * b * f / tp)
    # with bf16 weights torch's norm is fused, except the key norm's strided input
    cast = m.activation_bytes_per_layer_token(tp, attention="unfused", norm="torch", elementwise="unfused")
    assert local - cast == pytest.approx(2 * (8 - b) * h / tp + (8 - b) * heads * hd)


def test_hf_config_path_and_directory(tmp_path):
    cfg = load_model("Llama-3.1-8B")
    cfg = {"model_type": "llama", "num_hidden_layers": cfg.num_layers, "hidden_size": cfg.hidden_size,
           "intermediate_size": cfg.ffn_hidden_size, "num_attention_heads": cfg.num_attention_heads,
           "num_key_value_heads": cfg.num_kv_heads, "vocab_size": cfg.vocab_size, "tie_word_embeddings": False}
    ckpt = tmp_path / "my-llama"
    ckpt.mkdir()
    (ckpt / "config.json").write_text(json.dumps(cfg))
    from_dir = load_model(str(ckpt))
    from_file = load_model(str(ckpt / "config.json"))
    assert from_dir.name == from_file.name == "my-llama"
    assert from_dir.num_params() == load_model("Llama-3.1-8B").num_params()
    assert load_model("meta-llama/Llama-3.1-8B").name == "Llama-3.1-8B"


def test_head_dim_defaults_and_qwen2_bias():
    cfg = {"model_type": "qwen2", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
           "num_attention_heads": 4, "vocab_size": 100}
    m = ModelSpec.from_hf_config(cfg, name="tiny")
    assert (m.head_dim, m.num_kv_heads, m.qkv_bias, m.qk_norm) == (16, 4, True, False)


def test_moe_unknown_and_broken_configs_fail_clearly(tmp_path):
    dense = {"model_type": "qwen3", "num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
             "num_attention_heads": 4, "vocab_size": 100}
    with pytest.raises(ConfigError, match="num_experts_per_tok"):  # an expert count without its top-k
        ModelSpec.from_hf_config({**dense, "num_experts": 128}, name="moe")
    with pytest.raises(ConfigError, match="latent attention"):  # DeepSeek's MLA is refused, not mis-modelled
        ModelSpec.from_hf_config({**dense, "kv_lora_rank": 512}, name="mla")
    with pytest.raises(ConfigError) as info:
        load_model("Qwen4-1T")
    assert all(p in str(info.value) for p in PRESETS)
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(ConfigError, match="'num_hidden_layers' is missing"):
        load_model(str(path))
    with pytest.raises(ConfigError, match="not a multiple"):
        ModelSpec("x", 1, 8, 8, 3, 2, 8, 10)
