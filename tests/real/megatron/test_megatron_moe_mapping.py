"""HF ↔ Megatron mapping of MoE layers (issue 21): router and experts both ways, EP/ETP shards, and Megatron-core's
MoE layers on CPU giving the HF logits from the mapped weights (and the export loading back into transformers)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vime.errors import ConfigError
from vime.real.megatron import model as mmodel
from vime.real.megatron import moe_mapping

ROOT = Path(__file__).resolve().parents[3]


def _tiny_moe(tmp_path: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    """A tiny Qwen3-MoE built locally (no download), saved and read back in the checkpoint layout."""
    import transformers

    cfg = transformers.Qwen3MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                                      norm_topk_prob=True, tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.Qwen3MoeForCausalLM(cfg).save_pretrained(tmp_path)
    return cfg.to_dict(), mmodel.read_hf_safetensors(str(tmp_path))


def test_moe_round_trip_is_exact(tmp_path: Path):
    cfg, hf = _tiny_moe(tmp_path)
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in hf and "model.layers.0.mlp.gate.weight" in hf
    spec = mmodel.spec_from_hf_config(cfg)
    full = mmodel.hf_to_megatron(spec, hf)
    fc1 = full["decoder.layers.0.mlp.experts.local_experts.2.linear_fc1.weight"]
    assert torch.equal(fc1, torch.cat([hf["model.layers.0.mlp.experts.2.gate_proj.weight"],
                                       hf["model.layers.0.mlp.experts.2.up_proj.weight"]]))
    assert torch.equal(full["decoder.layers.1.mlp.router.weight"], hf["model.layers.1.mlp.gate.weight"])
    back = dict(kv for name, t in full.items() for kv in mmodel.megatron_to_hf(spec, name, t))
    assert back.keys() == hf.keys()
    for name in hf:
        assert torch.equal(back[name], hf[name]), name


def test_trainer_takes_qwen3_moe_and_refuses_other_moe_families(tmp_path: Path):
    cfg, _ = _tiny_moe(tmp_path)
    spec = mmodel.spec_from_hf_config(cfg)
    assert (spec.num_experts, spec.moe_top_k, spec.moe_intermediate_size) == (4, 2, 16)
    spec.check_tp(2)
    spec.check_experts(4, 2)
    with pytest.raises(ConfigError, match="--expert-model-parallel-size 3 does not divide the 4 experts"):
        spec.check_experts(3, 1)
    with pytest.raises(ConfigError, match="--expert-tensor-parallel-size 3 does not divide the expert width 16"):
        spec.check_experts(1, 3)
    mixtral = {k: v for k, v in cfg.items() if k not in ("num_experts", "moe_intermediate_size")}
    with pytest.raises(ConfigError, match="maps qwen3_moe"):
        mmodel.spec_from_hf_config({**mixtral, "model_type": "mixtral", "num_local_experts": 4})


def test_missing_up_projection_is_named(tmp_path: Path):
    cfg, hf = _tiny_moe(tmp_path)
    del hf["model.layers.0.mlp.experts.1.up_proj.weight"]
    with pytest.raises(KeyError, match="local_experts.1"):
        mmodel.hf_to_megatron(mmodel.spec_from_hf_config(cfg), hf)


def test_ep_and_etp_shards_round_trip(tmp_path: Path):
    cfg, hf = _tiny_moe(tmp_path)
    full = mmodel.hf_to_megatron(mmodel.spec_from_hf_config(cfg), hf)
    shards = moe_mapping.ep_shards(full, ep=2, num_experts=4)
    name = "decoder.layers.0.mlp.experts.local_experts.{}.linear_fc2.weight"
    assert set(k for k in shards[1] if "local_experts" in k and "layers.0." in k and "fc2" in k) == {
        name.format(0), name.format(1)}
    assert torch.equal(shards[1][name.format(0)], full[name.format(2)])  # rank 1's first expert is global 2
    assert torch.equal(shards[0]["decoder.layers.0.mlp.router.weight"], shards[1]["decoder.layers.0.mlp.router.weight"])
    gathered = moe_mapping.ep_gather(shards, num_experts=4)
    assert gathered.keys() == full.keys() and all(torch.equal(gathered[k], full[k]) for k in full)
    # ETP 2: each expert's fc1 splits as a dense [gate; up] does, fc2 along its input
    fc1 = "decoder.layers.0.mlp.experts.local_experts.3.linear_fc1.weight"
    parts = [mmodel.shard(fc1, full[fc1], r, 2) for r in range(2)]
    gate = hf["model.layers.0.mlp.experts.3.gate_proj.weight"]
    up = hf["model.layers.0.mlp.experts.3.up_proj.weight"]
    assert torch.equal(parts[1], torch.cat([gate[8:], up[8:]]))
    assert torch.equal(mmodel.unshard(fc1, parts), full[fc1])
    with pytest.raises(ValueError, match="does not divide"):
        moe_mapping.ep_shards(full, ep=3, num_experts=4)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_megatron_moe_layers_reproduce_the_hf_logits():
    """Megatron-core's MoE layers (local spec, CPU, gloo) loaded with the mapped weights give the HF
    logits; the Megatron state exported to HF loads into transformers and gives them again."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("moe_logits_check.py")), str(_free_port())],
                          capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["mapped"] == out["megatron"]  # every Megatron parameter mapped, with its shape
    assert out["exported"] == out["hf"]  # the export has the checkpoint's names
    assert out["max_gap"] <= 1e-5 * max(1.0, out["scale"])
    assert out["export_gap"] <= 1e-6 * max(1.0, out["scale"])


def test_tiny_qwen3_moe_directory_reads_in_the_simulator_and_the_mapping(tmp_path: Path):
    """`vime.testing.tiny_moe` writes a Qwen3-MoE checkpoint the simulator's reader and the mapping both take."""
    from vime.sim.models import load_model
    from vime.testing.tiny_moe import build_tiny_qwen3_moe

    path = build_tiny_qwen3_moe(tmp_path / "moe", num_experts=4, top_k=2, moe_intermediate_size=64)
    spec = load_model(str(path))
    assert (spec.num_experts, spec.moe_top_k, spec.moe_ffn_hidden_size, spec.moe_layers) == (4, 2, 64, (0, 1))
    hf = mmodel.read_hf_safetensors(str(path))
    assert sum(t.numel() for t in hf.values()) == spec.num_params()  # tied embeddings: one copy in both
    mspec = mmodel.spec_from_hf_config(json.loads((path / "config.json").read_text()))
    full = mmodel.hf_to_megatron(mspec, hf)
    back = dict(kv for name, t in full.items() for kv in mmodel.megatron_to_hf(mspec, name, t))
    assert back.keys() == hf.keys() and all(torch.equal(back[k], hf[k]) for k in hf)
