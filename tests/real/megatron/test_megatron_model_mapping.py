"""HF ↔ Megatron weight mapping: QKV fusion per query group, gate/up stacking, TP shards, vocab padding, config reading."""

from __future__ import annotations

import pytest
import torch

from vime.errors import ConfigError
from vime.real.megatron import model as mmodel


def _hf_model(kind: str, *, tie: bool = False, vocab: int = 96):
    import transformers

    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                  tie_word_embeddings=tie)
    if kind == "qwen3":
        cfg, cls = transformers.Qwen3Config(head_dim=16, **common), transformers.Qwen3ForCausalLM
    elif kind == "qwen2":
        cfg, cls = transformers.Qwen2Config(**common), transformers.Qwen2ForCausalLM
    else:
        cfg, cls = transformers.LlamaConfig(head_dim=8, **common), transformers.LlamaForCausalLM
    torch.manual_seed(0)
    model = cls(cfg)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    if tie:
        state.pop("lm_head.weight", None)
    return cfg.to_dict(), state


@pytest.mark.parametrize("kind", ["qwen3", "qwen2", "llama"])
@pytest.mark.parametrize("tie", [False, True])
def test_hf_megatron_round_trip_is_exact(kind, tie):
    cfg, hf = _hf_model(kind, tie=tie)
    spec = mmodel.spec_from_hf_config(cfg)
    full = mmodel.hf_to_megatron(spec, hf)
    assert ("output_layer.weight" in full) is not tie
    back = dict(kv for name, t in full.items() for kv in mmodel.megatron_to_hf(spec, name, t))
    assert back.keys() == hf.keys()
    for name in hf:
        assert torch.equal(back[name], hf[name]), name


def test_qkv_is_fused_per_query_group():
    cfg, hf = _hf_model("qwen3")
    spec = mmodel.spec_from_hf_config(cfg)
    fused = mmodel.hf_to_megatron(spec, hf)["decoder.layers.0.self_attention.linear_qkv.weight"]
    q, k, v = (hf[f"model.layers.0.self_attn.{p}_proj.weight"] for p in "qkv")
    d, hpg = spec.head_dim, spec.heads_per_group
    for g in range(spec.num_kv_heads):
        block = fused[g * (hpg + 2) * d:(g + 1) * (hpg + 2) * d]
        assert torch.equal(block[: hpg * d], q[g * hpg * d:(g + 1) * hpg * d])
        assert torch.equal(block[hpg * d:(hpg + 1) * d], k[g * d:(g + 1) * d])
        assert torch.equal(block[(hpg + 1) * d:], v[g * d:(g + 1) * d])


def test_qwen2_biases_map_into_the_fused_qkv_bias():
    cfg, hf = _hf_model("qwen2")
    spec = mmodel.spec_from_hf_config(cfg)
    assert spec.qkv_bias and not spec.qk_norm
    full = mmodel.hf_to_megatron(spec, hf)
    bias = full["decoder.layers.1.self_attention.linear_qkv.bias"]
    assert bias.shape == (spec.num_kv_heads * (spec.heads_per_group + 2) * spec.head_dim,)


@pytest.mark.parametrize("tp", [1, 2])
def test_shards_split_whole_groups_and_unshard_back(tp):
    cfg, hf = _hf_model("qwen3")
    spec = mmodel.spec_from_hf_config(cfg)
    full = mmodel.hf_to_megatron(spec, hf, tp=tp)
    for name, t in full.items():
        shards = [mmodel.shard(name, t, r, tp) for r in range(tp)]
        assert torch.equal(mmodel.unshard(name, shards), t), name
    if tp == 2:
        fc1 = full["decoder.layers.0.mlp.linear_fc1.weight"]
        gate, up = hf["model.layers.0.mlp.gate_proj.weight"], hf["model.layers.0.mlp.up_proj.weight"]
        s1 = mmodel.shard("decoder.layers.0.mlp.linear_fc1.weight", fc1, 1, 2)
        half = spec.intermediate_size // 2
        assert torch.equal(s1, torch.cat([gate[half:], up[half:]]))  # each rank holds [gate_r; up_r]
        proj = mmodel.shard("decoder.layers.0.self_attention.linear_proj.weight",
                            full["decoder.layers.0.self_attention.linear_proj.weight"], 0, 2)
        assert proj.shape[1] == spec.num_heads * spec.head_dim // 2  # row-parallel: split the input dim


def test_vocab_is_padded_for_tp_and_trimmed_on_export():
    cfg, hf = _hf_model("qwen3", vocab=95)
    spec = mmodel.spec_from_hf_config(cfg)
    assert spec.padded_vocab(2) == 96
    full = mmodel.hf_to_megatron(spec, hf, tp=2)
    emb = full["embedding.word_embeddings.weight"]
    assert emb.shape[0] == 96 and torch.equal(emb[95], torch.zeros_like(emb[95]))
    (_, back), = mmodel.megatron_to_hf(spec, "embedding.word_embeddings.weight", emb)
    assert torch.equal(back, hf["model.embed_tokens.weight"])


def test_spec_reads_the_hf_config():
    cfg, _ = _hf_model("qwen3", tie=True)
    spec = mmodel.spec_from_hf_config(cfg)
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.qk_norm, spec.tie_word_embeddings) == (4, 2, 16, True, True)
    assert spec.rope_theta == pytest.approx(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"])
    llama, _ = _hf_model("llama")
    assert mmodel.spec_from_hf_config(llama).head_dim == 8


@pytest.mark.parametrize("change, match", [
    ({"model_type": "mixtral"}, "not supported"),
    ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, "yarn"),
])
def test_unsupported_configs_are_refused_with_the_reason(change, match):
    cfg, _ = _hf_model("qwen3")
    cfg.update(change)
    with pytest.raises(ConfigError, match=match):
        mmodel.spec_from_hf_config(cfg)


def test_tp_must_divide_the_query_groups():
    cfg, _ = _hf_model("qwen3")
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        mmodel.spec_from_hf_config(cfg).check_tp(4)


def test_unknown_or_incomplete_hf_tensors_raise():
    cfg, hf = _hf_model("qwen3")
    spec = mmodel.spec_from_hf_config(cfg)
    with pytest.raises(KeyError, match="no Megatron counterpart"):
        mmodel.hf_to_megatron(spec, {**hf, "model.layers.0.mystery.weight": torch.zeros(1)})
    partial = {k: v for k, v in hf.items() if k != "model.layers.1.self_attn.k_proj.weight"}
    with pytest.raises(KeyError, match="k_proj"):
        mmodel.hf_to_megatron(spec, partial)


def test_safetensors_write_and_read(tmp_path):
    cfg, hf = _hf_model("qwen3")
    mmodel.write_hf_safetensors(str(tmp_path), hf.items(), config=cfg)
    back = mmodel.read_hf_safetensors(str(tmp_path))
    assert back.keys() == hf.keys() and all(torch.equal(back[k], hf[k]) for k in hf)
    assert mmodel.load_hf_config(str(tmp_path))["model_type"] == "qwen3"
    with pytest.raises(ConfigError, match="config.json"):
        mmodel.load_hf_config(str(tmp_path / "missing"))
