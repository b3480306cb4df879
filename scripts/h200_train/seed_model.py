"""The random-weight models of the H200 train runs (issues 9, 20), built where they run: shipping 1-8 GB would cost more device calls than the run.

Presets (``--preset``):

- ``seed`` (default): a Qwen3 with Qwen3-0.6B's body and an 8192-token vocabulary, from
  `vime.testing.tiny_model` with a tokenizer trained on 60 000 corpus lines so that it really has 8192
  tokens (every id a random model samples or the toy task puts in a prompt decodes); 0.45 B params.
- ``qwen3-4b`` / ``qwen3-0.6b``: the real models' shapes, full 151 936-token vocabulary, tied
  embeddings, no tokenizer (vime then serves token ids only: ``--skip-tokenizer-init``). The
  config.json is written here from a fixed dict, so the file `vime simulate` reads for the
  prediction (made on a CPU) is byte-identical to the one the run loads; the weights are drawn by
  transformers' Qwen3 initialisation on the GPU, in bf16.

    python scripts/h200_train/seed_model.py build DIR [--preset P]    # the whole model directory
    python scripts/h200_train/seed_model.py config DIR [--preset P]   # config.json only, for `vime simulate --model`
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

from vime.testing.tiny_model import TinyModelSpec, build_tiny_qwen3  # noqa: E402

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


#: The real Qwen3 bodies (Hugging Face's config.json values; qwen3-8b tied, unlike the Hub's, to pair with the 4B).
BODIES: dict[str, dict[str, int | bool]] = {
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128),
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
    # the real models at full size, untied as on the Hub: only vllm_bench.py --dummy-weights serves them (vLLM draws
    # the weights itself; 29.5 / 65.5 GB would not fit the lent disk twice)
    "qwen3-14b": dict(hidden_size=5120, intermediate_size=17408, num_hidden_layers=40, num_attention_heads=40,
                      num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "qwen3-32b": dict(hidden_size=5120, intermediate_size=25600, num_hidden_layers=64, num_attention_heads=64,
                      num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
}
#: MoE bodies: Qwen3-30B-A3B's config.json values with fewer layers (issue 21: a MoE-shaped model that one GPU
#: trains with its optimizer state, 128 experts × 3 tensors per layer for the weight sync to move).
MOE_BODIES: dict[str, dict[str, int | bool]] = {
    "qwen3-30b-a3b-4l": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=4, num_attention_heads=32,
                             num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                             moe_intermediate_size=768),
    # half of Qwen3-30B-A3B's 48 layers: the vLLM-alone MoE decode bench (30 GB of weights fit the lent disk; 61 do not)
    "qwen3-30b-a3b-24l": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=24, num_attention_heads=32,
                              num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                              moe_intermediate_size=768),
    # all 48 layers (61 GB): vllm_bench.py --dummy-weights only
    "qwen3-30b-a3b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=48, num_attention_heads=32,
                          num_key_value_heads=4, head_dim=128, num_experts=128, num_experts_per_tok=8,
                          moe_intermediate_size=768),
}
PRESETS = ("seed", *BODIES, *MOE_BODIES)
#: Presets too large to write to the lent disk: served with vLLM's own random weights (vllm_bench.py --dummy-weights).
DUMMY_ONLY = ("qwen3-14b", "qwen3-32b", "qwen3-30b-a3b")


def body_config(preset: str) -> dict:
    """config.json of a ``qwen3-*`` preset (no tokenizer, so no special-token ids)."""
    if preset in MOE_BODIES:
        return {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 151936,
                **MOE_BODIES[preset], "decoder_sparse_step": 1, "mlp_only_layers": [], "norm_topk_prob": True,
                "router_aux_loss_coef": 0.001, "output_router_logits": False,
                "hidden_act": "silu", "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
                "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
                "initializer_range": 0.02, "torch_dtype": "bfloat16", "use_cache": True}
    if preset not in BODIES:
        raise SystemExit(f"unknown preset {preset!r}; use one of {', '.join(PRESETS)}")
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
            "hidden_act": "silu", "max_position_embeddings": 40960, "rope_theta": 1000000.0, "rms_norm_eps": 1e-06,
            "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": True,
            "initializer_range": 0.02, "torch_dtype": "bfloat16", "use_cache": True, **BODIES[preset]}


def moe_tensor_shapes(cfg: dict) -> dict[str, tuple[int, ...]]:
    """The HF checkpoint names and shapes of a Qwen3-MoE config, one tensor per expert projection (the Hub layout)."""
    h, d, v = cfg["hidden_size"], cfg["head_dim"], cfg["vocab_size"]
    q, kv, e, f = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d, cfg["num_experts"], cfg["moe_intermediate_size"]
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    p + "self_attn.q_proj.weight": (q, h), p + "self_attn.k_proj.weight": (kv, h),
                    p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, q),
                    p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,),
                    p + "mlp.gate.weight": (e, h)})
        for j in range(e):
            out.update({f"{p}mlp.experts.{j}.gate_proj.weight": (f, h), f"{p}mlp.experts.{j}.up_proj.weight": (f, h),
                        f"{p}mlp.experts.{j}.down_proj.weight": (h, f)})
    out["model.norm.weight"] = (h,)
    if not cfg["tie_word_embeddings"]:
        out["lm_head.weight"] = (v, h)
    return out


def build_moe_body(path: str | Path, preset: str, seed: int = 0) -> Path:
    """Random bf16 weights of a MoE preset drawn on the GPU and written by name (transformers 5 keeps experts fused
    in memory; the checkpoint must have the Hub's per-expert tensors that vLLM and vime's mapping read)."""
    import torch
    from safetensors.torch import save_file

    cfg = body_config(preset)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(seed)
    shard: dict[str, torch.Tensor] = {}
    index: dict[str, str] = {}
    n = size = 0
    files = 0

    def flush() -> None:
        nonlocal shard, size, files
        if shard:
            files += 1
            name = f"model-{files:05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            index.update({k: name for k in shard})
        shard, size = {}, 0

    for name, shape in moe_tensor_shapes(cfg).items():
        t = torch.empty(shape, dtype=torch.bfloat16, device=dev)
        t.fill_(1.0) if name.endswith("norm.weight") else t.normal_(0.0, cfg["initializer_range"], generator=gen)
        shard[name] = t.cpu()
        n += t.numel()
        size += t.numel() * 2
        if size >= 2 << 30:
            flush()
    flush()
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 2 * n},
                                                                  "weight_map": index}, indent=1) + "\n")
    write_body_config(out, preset)
    (out / "vime_model.json").write_text(json.dumps({"preset": preset, "params": n, "seed": seed}) + "\n")
    return out


def write_body_config(path: str | Path, preset: str) -> Path:
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(body_config(preset), indent=2, sort_keys=True) + "\n")
    return out / "config.json"


def build_body(path: str | Path, preset: str, seed: int = 0) -> Path:
    """Random bf16 weights of a ``qwen3-*`` preset drawn on the GPU, saved as safetensors beside our config.json."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg_dict = body_config(preset)
    out = Path(path)
    cfg = Qwen3Config(**{k: v for k, v in cfg_dict.items() if k not in ("architectures", "model_type", "torch_dtype")})
    torch.manual_seed(seed)
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
            model = Qwen3ForCausalLM(cfg)
    finally:
        torch.set_default_dtype(torch.float32)
    # Draw every weight ourselves (normal, std initializer_range; norms at 1): transformers' own init is
    # version-dependent, and a zero embedding makes a uniform, gradient-free policy.
    gen = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    with torch.no_grad():
        for name, prm in model.named_parameters():
            if name.endswith("norm.weight"):
                prm.fill_(1.0)
            else:
                prm.normal_(0.0, cfg_dict["initializer_range"], generator=gen)
    model.save_pretrained(str(out), safe_serialization=True)
    for extra in ("generation_config.json",):  # the server would take its stop ids from it: there are none
        (out / extra).unlink(missing_ok=True)
    write_body_config(out, preset)  # ours, not transformers' serialisation of it
    n = sum(p.numel() for p in model.parameters())
    (out / "vime_model.json").write_text(json.dumps({"preset": preset, "params": n, "seed": seed}) + "\n")
    return out


def weight_stats(path: str | Path) -> dict[str, float]:
    """Standard deviation of a few weights of a built model (0 means an uninitialised model)."""
    from safetensors import safe_open

    out = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        with safe_open(str(f), "pt") as st:
            for k in st.keys():
                if k.endswith(("embed_tokens.weight", "layers.0.self_attn.q_proj.weight", "layers.0.mlp.down_proj.weight")):
                    out[k] = float(st.get_tensor(k).float().std())
    return out


def one_layer(spec: TinyModelSpec = SPEC) -> TinyModelSpec:
    """SPEC with one layer: cheap to build for checks of everything but depth."""
    return replace(spec, num_hidden_layers=1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=("build", "config", "check"))
    ap.add_argument("dir")
    ap.add_argument("--preset", choices=PRESETS, default="seed")
    a = ap.parse_args(argv)
    if a.what == "check":
        stats = weight_stats(a.dir)
        print(json.dumps(stats))
        return 0 if stats and min(stats.values()) > 1e-3 else 1
    if a.preset in MOE_BODIES and a.what == "build":
        print(build_moe_body(a.dir, a.preset))
        return 0
    if a.preset != "seed":
        print(build_body(a.dir, a.preset) if a.what == "build" else write_body_config(a.dir, a.preset))
        return 0
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
