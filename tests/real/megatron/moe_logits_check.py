"""Run as a script (its own process: it joins a gloo group): a tiny Qwen3-MoE from transformers, mapped by
`vime.real.megatron.model.hf_to_megatron` into Megatron-core's MoE layers (local spec, CPU), must give the
HF logits (the model built by `transformer_config` / `build_gpt_model` from the Qwen3-MoE spec); the Megatron
state exported back by `megatron_to_hf` must load into transformers and give them too.

Prints one JSON line: the Megatron parameter names and shapes, the mapped ones, and the largest logit gaps.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

import torch
import torch.distributed as dist


def main(port: str) -> None:
    import transformers
    from megatron.core import parallel_state as ps

    from vime.real.megatron import compat
    from vime.real.megatron import model as mmodel

    compat.moe_without_te()
    compat.install()  # no CUDA here: megatron-core's CUDA placements go to the CPU (as in the trainer actors)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=0, world_size=1)
    ps.initialize_model_parallel(1, 1)
    compat.model_parallel_seed(0, 0)
    cfg = transformers.Qwen3MoeConfig(vocab_size=96, hidden_size=32, intermediate_size=48, moe_intermediate_size=16,
                                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                                      norm_topk_prob=True, rope_theta=10000.0, tie_word_embeddings=False)
    hf_model = transformers.Qwen3MoeForCausalLM(cfg).float().eval()
    with tempfile.TemporaryDirectory() as d:
        hf_model.save_pretrained(d)  # the checkpoint layout: one tensor per expert projection
        hf = mmodel.read_hf_safetensors(d)
    spec = mmodel.spec_from_hf_config(cfg.to_dict())
    full = mmodel.hf_to_megatron(spec, hf)

    meg = mmodel.build_gpt_model(spec, mmodel.transformer_config(spec, tp=1, cpu_init=True))
    names = {n: list(p.shape) for n, p in meg.named_parameters()}
    meg.load_state_dict({**meg.state_dict(), **full}, strict=True)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(12).unsqueeze(0).expand_as(ids).contiguous()
    with compat.device_mode(), torch.no_grad():
        meg.eval()
        got = meg(ids, pos, None)[..., : spec.vocab_size].float()
        want = hf_model(ids).logits.float()
    # export: Megatron state -> HF names -> a transformers model loaded from that checkpoint
    exported = [kv for n, p in meg.named_parameters() for kv in mmodel.megatron_to_hf(spec, n, p.detach())]
    with tempfile.TemporaryDirectory() as d:
        mmodel.write_hf_safetensors(d, exported, config=cfg.to_dict())
        back = transformers.Qwen3MoeForCausalLM.from_pretrained(d, dtype=torch.float32).eval()
        with torch.no_grad():
            again = back(ids).logits.float()
    print(json.dumps({"megatron": names, "mapped": {n: list(t.shape) for n, t in full.items()},
                      "exported": sorted(n for n, _ in exported), "hf": sorted(hf),
                      "max_gap": float((got - want).abs().max()), "export_gap": float((again - want).abs().max()),
                      "scale": float(want.abs().max())}))
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
