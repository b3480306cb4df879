"""A dense model's decode GEMMs alone on one GPU: every layer's linear products and the LM head at M rows, in a CUDA graph.

The engine model's linear layers are a roofline of the weights' stream and the GEMM FLOPs
(`efficiency.gemm_roofline_p`); vLLM's step holds more than the GEMMs (the sampler, the attention, the CPU step), so
this times the GEMMs by themselves: the model's full set of linear weights in bf16 (random, distinct per layer so
every product streams its weights from HBM), each product `F.linear` as vLLM's unquantized layers call it, the whole
stack captured in one CUDA graph and replayed. Its time per M is what the
engine model calls `gemm_time(M, M)`; `--predict` writes the model's.

    python bench/decode_gemm_sweep.py --predict --profile H100-SXM-80G-measured --out P.json   # the model's (CPU)
    python bench/decode_gemm_sweep.py --out $OUT/decode_gemm_h100.json                          # on the GPU
    python bench/decode_gemm_sweep.py --compare P.json M.json
    python bench/decode_gemm_sweep.py --attention --out $OUT/attn.json   # vLLM's paged decode attention (run.sh exec)

The thirty-second session's H100 (`bench/data/vllm_bench_s32/`): the GEMMs sit on or under the roofline, and the
attention reads long contexts at 2.7-2.9 TB/s; the gap its 14B grid showed was vLLM's latency metric, not the GEMMs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "scripts" / "h200_train"))

PRESETS = ("qwen3-8b", "qwen3-14b", "qwen3-32b")
ROWS = (1, 16, 64, 128, 160, 192, 224, 256, 320, 384, 448, 512, 768, 1024)
VOCAB = 151936


def shapes(preset: str) -> tuple[int, list[tuple[str, int, int]]]:
    """(layers, [(name, in, out)] of one layer's linear products, the LM head last as its own entry)."""
    from seed_model import BODIES  # noqa: PLC0415 - scripts/h200_train

    b = BODIES[preset]
    h, heads, kv, hd, ffn = (b["hidden_size"], b["num_attention_heads"], b["num_key_value_heads"], b["head_dim"],
                             b["intermediate_size"])
    return b["num_hidden_layers"], [("qkv", h, (heads + 2 * kv) * hd), ("o", heads * hd, h), ("gate_up", h, 2 * ffn),
                                    ("down", ffn, h), ("lm_head", h, VOCAB)]


def predict(profile: str, presets: tuple[str, ...], rows: tuple[int, ...]) -> dict:
    from compare_calibration import _iter_model  # noqa: PLC0415
    from fit_whole_step import model_of  # noqa: PLC0415

    from vime.sim.hardware import HardwareSpec  # noqa: PLC0415

    hw = HardwareSpec.from_dict(json.loads((ROOT / "vime" / "sim" / "data" / "hardware" / f"{profile}.json").read_text()),
                                origin=profile)
    out: dict = {"profile": profile, "rows": list(rows), "presets": {}}
    for preset in presets:
        im = _iter_model(hw, model_of(preset))
        out["presets"][preset] = {str(m): {"gemm_s": im.gemm_time(m, m), "weights_s": im._weights_s(m),
                                           "flops_s": (im.flops_base * m + im.flops_head * m) / im.tp / im.flops_per_s}
                                  for m in rows}
    return out


def gpu_seconds(fn, repeat: int) -> list[float]:
    """`fn()` timed `repeat` times on the GPU's own clock (CUDA events around it), in seconds."""
    import torch  # noqa: PLC0415

    out = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return out


def measure(presets: tuple[str, ...], rows: tuple[int, ...], repeat: int, path: Path | None = None) -> dict:
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415,N812

    dev = torch.device("cuda")
    out: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": list(rows),
                 "repeat": repeat, "presets": {}}
    for preset in presets:
        layers, mats = shapes(preset)
        body, head = mats[:-1], mats[-1]
        weights = [[torch.empty(o, i, dtype=torch.bfloat16, device=dev).normal_(0, 0.02) for _, i, o in body]
                   for _ in range(layers)]
        lm_head = torch.empty(head[2], head[1], dtype=torch.bfloat16, device=dev).normal_(0, 0.02)
        res = {"layers": layers, "weight_bytes": sum(w.numel() * 2 for ws in weights for w in ws) + lm_head.numel() * 2,
               "rows": {}}
        for m in rows:
            xs = [torch.randn(m, i, dtype=torch.bfloat16, device=dev) for _, i, _ in body]
            xh = torch.randn(m, head[1], dtype=torch.bfloat16, device=dev)

            def stack(xs=xs, xh=xh, weights=weights, lm_head=lm_head) -> None:
                for ws in weights:
                    for x, w in zip(xs, ws, strict=True):
                        F.linear(x, w)
                F.linear(xh, lm_head)

            stack()  # cuBLAS picks its kernels and workspace outside the capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                stack()
            g.replay()
            torch.cuda.synchronize()
            times = gpu_seconds(g.replay, repeat)
            # one layer's products apart (eager, median of `repeat`): which product leaves the roofline
            parts = {}
            for j, ((name, _, _), x) in enumerate(zip(body, xs, strict=True)):

                def product(x=x, j=j, copies=weights[:8]) -> None:
                    for ws in copies:  # eight layers' copies: HBM, not L2
                        F.linear(x, ws[j])

                parts[name] = statistics.median(gpu_seconds(product, repeat)) / 8
            res["rows"][str(m)] = {"stack_s": statistics.median(times), "min_s": min(times), "per_layer_parts_s": parts}
            print(f"{preset} M={m}: {1e3 * statistics.median(times):.2f} ms "
                  + " ".join(f"{k} {1e6 * v:.0f}us" for k, v in parts.items()), flush=True)
            del g, xs, xh, stack, product  # the closures hold the weights: free them before the next model
        out["presets"][preset] = res
        del weights, lm_head
        torch.cuda.empty_cache()
        if path:
            path.write_text(json.dumps(out, indent=1) + "\n")  # each model as it is done: a later one may not fit
    out["sampler"] = sampler(rows, repeat)
    return out


def sampler(rows: tuple[int, ...], repeat: int) -> dict:
    """The sampler's GPU work as a rollout asks it (temperature 1, one logprob): the logits to fp32, their log-softmax,
    a draw by the exponential race, the drawn token's logprob and rank, the top-1 logprob; per M rows of the vocabulary."""
    import torch  # noqa: PLC0415

    res = {}
    for m in rows:
        logits = torch.randn(m, VOCAB, dtype=torch.bfloat16, device="cuda")

        def step(logits=logits) -> None:
            x = logits.float()
            logp = torch.log_softmax(x, dim=-1)
            probs = torch.softmax(x, dim=-1)
            tok = (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1, keepdim=True)
            chosen = logp.gather(-1, tok)
            (logp > chosen).sum(-1)  # the drawn token's rank
            logp.topk(1, dim=-1)

        step()
        torch.cuda.synchronize()
        res[str(m)] = statistics.median(gpu_seconds(step, repeat))
        print(f"sampler M={m}: {1e3 * res[str(m)]:.3f} ms", flush=True)
        del logits, step
    return res


#: (requests, context tokens per request) of the attention rows: the grids' mean context (128-token prompts, 128 new),
#: then a long context at few requests (the KV rate where each request's read is long)
ATTN_ROWS = ((64, 192), (128, 192), (192, 192), (256, 192), (384, 192), (512, 192), (16, 1088), (64, 1088),
             (128, 1088))
BLOCK = 16  # vLLM's KV block on FlashAttention


def attention(presets: tuple[str, ...], rows: tuple[tuple[int, int], ...], repeat: int) -> dict:
    """vLLM's own FlashAttention-3 paged decode (its `flash_attn_varlen_func`, one query token a request) over every
    layer's KV cache, in a CUDA graph: the attention part of a decode step."""
    import torch  # noqa: PLC0415
    from seed_model import BODIES  # noqa: PLC0415
    from vllm.vllm_flash_attn import flash_attn_varlen_func  # noqa: PLC0415 - the run's vLLM (run.sh exec)

    out = {}
    for preset in presets:
        b = BODIES[preset]
        layers, hq, hk, hd = b["num_hidden_layers"], b["num_attention_heads"], b["num_key_value_heads"], b["head_dim"]
        res = {}
        for n, ctx in rows:
            blocks_per = -(-ctx // BLOCK)
            caches = [torch.randn(2, n * blocks_per, BLOCK, hk, hd, dtype=torch.bfloat16, device="cuda")
                      for _ in range(layers)]
            table = torch.arange(n * blocks_per, dtype=torch.int32, device="cuda").view(n, blocks_per)
            seqused = torch.full((n,), ctx, dtype=torch.int32, device="cuda")
            cu_q = torch.arange(n + 1, dtype=torch.int32, device="cuda")
            q = torch.randn(n, hq, hd, dtype=torch.bfloat16, device="cuda")
            o = torch.empty_like(q)

            def step(caches=caches, table=table, seqused=seqused, cu_q=cu_q, q=q, o=o, ctx=ctx, scale=hd ** -0.5) -> None:
                for kv in caches:
                    flash_attn_varlen_func(q, kv[0], kv[1], max_seqlen_q=1, cu_seqlens_q=cu_q, max_seqlen_k=ctx,
                                           seqused_k=seqused, softmax_scale=scale, causal=True,
                                           block_table=table, out=o, fa_version=3)

            step()
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                step()
            ts = gpu_seconds(g.replay, repeat)
            kv_bytes = layers * n * ctx * 2 * hk * hd * 2
            res[f"{n}x{ctx}"] = {"attn_s": statistics.median(ts), "kv_bytes": kv_bytes}
            print(f"{preset} attention B={n} ctx={ctx}: {1e3 * statistics.median(ts):.3f} ms, "
                  f"{kv_bytes / statistics.median(ts) / 1e12:.2f} TB/s of KV", flush=True)
            del g, step, caches, table, seqused, cu_q, q, o
            torch.cuda.empty_cache()
        out[preset] = res
    return out


def compare(pred_path: str, run_path: str) -> int:
    pred, run = json.loads(Path(pred_path).read_text()), json.loads(Path(run_path).read_text())
    print(f"GEMM stack per decode step: measured ({run.get('device')}) vs the engine model ({pred['profile']})")
    for preset, rows in run["presets"].items():
        p = pred["presets"].get(preset)
        if p is None:
            continue
        print(preset)
        for m, r in rows["rows"].items():
            if m not in p:
                continue
            got, want = r["stack_s"], p[m]["gemm_s"]
            print(f"  M={int(m):5d}  measured {1e3 * got:7.2f} ms  model {1e3 * want:7.2f}  error {100 * (want / got - 1):+6.1f} %"
                  f"   (weights roof {1e3 * p[m]['weights_s']:.2f}, FLOPs roof {1e3 * p[m]['flops_s']:.2f})")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path)
    ap.add_argument("--presets", default=",".join(PRESETS))
    ap.add_argument("--rows", default=",".join(map(str, ROWS)), help="comma-separated M (tokens per step)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--predict", action="store_true", help="write the engine model's gemm_time instead (no GPU)")
    ap.add_argument("--profile", default="H100-SXM-80G-measured")
    ap.add_argument("--attention", action="store_true", help="time vLLM's paged decode attention instead (needs vLLM)")
    ap.add_argument("--compare", nargs=2, metavar=("PREDICTED", "MEASURED"))
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    presets = tuple(p for p in args.presets.split(",") if p)
    rows = tuple(int(m) for m in args.rows.split(","))
    if bad := [p for p in presets if p not in PRESETS]:
        ap.error(f"--presets: unknown {bad}; choose from {', '.join(PRESETS)}")
    if not args.out:
        ap.error("--out is required")
    if args.attention:
        res = {"attention": attention(presets, ATTN_ROWS, args.repeat)}
    else:
        res = predict(args.profile, presets, rows) if args.predict else measure(presets, rows, args.repeat, args.out)
    args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
