"""Drive a real vLLM 0.25.1 server on the lent H200 with vime's own client and launcher (issue 10).

Builds a random-weight Qwen3 model on the GPU (no download), starts the server with sleep mode and
the IPC weight-transfer backend through `vime.real.launcher`, and measures with `vime.real.vllm_client`:

- decode throughput at several batch sizes and response lengths, prefill time for long prompts;
- sleep level 1 and 2 and wake by tags (weights, then kv_cache) over repeated cycles: time of each
  call and device memory released / restored (cuMemGetInfo seen from this process);
- a colocated CUDA-IPC weight update at every level-2 cycle: start -> buckets -> finish(version),
  time per bucket, and greedy outputs that prove which weights are served (new weights change the
  output; the original weights sent back restore it exactly).

    python scripts/h200/vllm_bench.py --out /tmp/vllm.json [--preset qwen3-4b] [--quick]

Writes JSON after every phase, so a crash keeps what was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

GIB = 1 << 30

PRESETS = {
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                       num_key_value_heads=8, head_dim=128),
    "qwen3-4b": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128),
}


def build_models(preset: str, path: Path, seeds: tuple[int, int]):
    """Two random-weight Qwen3 models on the GPU (seed A saved for the server, seed B to push over IPC)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    cfg = Qwen3Config(vocab_size=151936, max_position_embeddings=40960, rope_theta=1_000_000.0,
                      tie_word_embeddings=True, rms_norm_eps=1e-6, **PRESETS[preset])
    models = []
    torch.set_default_dtype(torch.bfloat16)
    for seed in seeds:
        torch.manual_seed(seed)
        with torch.device("cuda"):
            m = Qwen3ForCausalLM(cfg)
        m.eval()
        models.append(m)
    torch.set_default_dtype(torch.float32)
    path.mkdir(parents=True, exist_ok=True)
    models[0].save_pretrained(str(path), safe_serialization=True)
    return cfg, models


def free_bytes() -> int:
    import torch

    return int(torch.cuda.mem_get_info()[0])


def buckets_of(model, bucket_bytes: int, *, uuid: str | None = None, reduce=None):
    """HF-named parameters (tied lm_head once) in buckets of at most `bucket_bytes`, as IPC WeightBuckets
    (one handle per tensor, keyed by the GPU's UUID as vLLM's IPC engine expects)."""
    import torch

    from vime.protocols import WeightBucket

    if reduce is None:
        from torch.multiprocessing.reductions import reduce_tensor as reduce
    if uuid is None:
        uuid = str(torch.cuda.get_device_properties(0).uuid)
    cur: list = []
    size = 0
    out = []

    def flush():
        nonlocal cur, size
        if not cur:
            return
        names = [n for n, _ in cur]
        tensors = [t.detach().contiguous() for _, t in cur]
        handles = [{uuid: reduce(t)[1]} for t in tensors]
        b = WeightBucket(names=names, dtype_names=[str(t.dtype).split(".")[-1] for t in tensors],
                         shapes=[list(t.shape) for t in tensors], nbytes=sum(t.nbytes for t in tensors),
                         ipc_handles=handles, index=len(out))
        b._keep = tensors  # type: ignore[attr-defined]  # the storage must outlive the server's load
        out.append(b)
        cur, size = [], 0

    for name, p in model.named_parameters():
        if size and size + p.nbytes > bucket_bytes:
            flush()
        cur.append((name, p))
        size += p.nbytes
    flush()
    return out


async def run(args) -> dict:
    import httpx

    from vime.protocols import GenerateRequest
    from vime.real.launcher import Launcher, ServerSpec, server_command
    from vime.real.vllm_client import VLLMEngine

    res: dict = {"preset": args.preset, "argv": sys.argv, "phases": {}, "errors": []}
    out = Path(args.out)

    def dump():
        out.write_text(json.dumps(res, indent=1, default=str))

    t0 = time.perf_counter()
    model_dir = Path(args.model_dir)
    cfg, (model_a, model_b) = build_models(args.preset, model_dir, (1, 2))
    res["model_build_s"] = time.perf_counter() - t0
    res["weight_bytes"] = sum(p.nbytes for p in model_a.parameters())
    dump()

    spec = ServerSpec(
        model=str(model_dir), port=args.port, max_model_len=args.max_model_len,
        gpu_memory_utilization=args.gpu_memory_utilization, enable_sleep_mode=True,
        weight_transfer_backend="ipc", max_num_seqs=256, enforce_eager=args.eager,
        extra_args=("--skip-tokenizer-init", "--served-model-name", "m"),
        extra_env={"VLLM_USE_FLASHINFER_SAMPLER": "0", "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1",
                   "VLLM_FLASH_ATTN_VERSION": "3"},
    )
    res["server_argv"] = server_command(spec)
    launcher = Launcher(args.log_dir)
    free_before_server = free_bytes()
    t_start = time.perf_counter()
    with launcher:
        try:
            launcher.start_servers([spec], timeout_s=args.start_timeout, names=["vllm"])
        except Exception as e:  # noqa: BLE001
            res["errors"].append(f"start: {e}")
            dump()
            return res
        res["server_start_s"] = time.perf_counter() - t_start
        res["server_bytes"] = free_before_server - free_bytes()
        dump()
        eng = VLLMEngine("h200", spec.url, model="m", timeout=httpx.Timeout(600.0, connect=10.0))
        rng = random.Random(0)
        vocab = cfg.vocab_size

        def prompt(n: int) -> list[int]:
            return [rng.randrange(100, vocab - 100) for _ in range(n)]

        probe = [prompt(32) for _ in range(4)]

        async def greedy() -> list[list[int]]:
            sp = {"temperature": 0.0, "max_tokens": 16, "logprobs": 1, "detokenize": False}
            outs = await asyncio.gather(*(eng.generate(GenerateRequest(token_ids=p, sampling_params=sp)) for p in probe))
            return [o.token_ids for o in outs]

        async def batch(b: int, prompt_len: int, max_tokens: int) -> dict:
            sp = {"temperature": 1.0, "max_tokens": max_tokens, "ignore_eos": True, "logprobs": 1,
                  "detokenize": False}
            reqs = [GenerateRequest(token_ids=prompt(prompt_len), sampling_params=sp) for _ in range(b)]
            t = time.perf_counter()
            outs = await asyncio.gather(*(eng.generate(r) for r in reqs))
            wall = time.perf_counter() - t
            toks = sum(len(o.token_ids) for o in outs)
            return {"batch": b, "prompt_len": prompt_len, "max_tokens": max_tokens, "wall_s": wall,
                    "output_tokens": toks, "tokens_per_s": toks / wall, "s_per_step": wall / max_tokens}

        async def greedy_lp() -> tuple[list[list[int]], list[float]]:
            """Greedy outputs of the probes, one request at a time (the batch shape stays the same)."""
            sp = {"temperature": 0.0, "max_tokens": 16, "logprobs": 1, "detokenize": False}
            outs = [await eng.generate(GenerateRequest(token_ids=p, sampling_params=sp)) for p in probe]
            return [o.token_ids for o in outs], [o.log_probs[0] for o in outs]

        async def push(buckets, version: int) -> float:
            t = time.perf_counter()
            await eng.start_weight_update()
            for b in buckets:
                await eng.update_weights(b)
            await eng.finish_weight_update(version)
            return time.perf_counter() - t

        async def diagnose() -> dict:
            """Does a CUDA-IPC push serve exactly the weights pushed? Probes run one at a time; A is the
            model loaded from disk, B another random init (issue 10 follow-up)."""
            diag: list = []
            res["phases"]["diagnose"] = diag
            base, base_lp = await greedy_lp()
            res["baseline_outputs"], res["baseline_first_logprobs"] = base, base_lp
            await eng.init_weight_transfer({})
            bk = {"A": buckets_of(model_a, args.bucket_bytes), "B": buckets_of(model_b, args.bucket_bytes)}
            seen: dict[str, tuple] = {"A": (base, base_lp)}
            version = 0

            async def step(name: str, sleep_level: int | None) -> None:
                nonlocal version
                version += 1
                if sleep_level:
                    await eng.sleep(sleep_level)
                    await eng.wake_up(["weights"])
                secs = await push(bk[name], version)
                if sleep_level:
                    await eng.wake_up(["kv_cache"])
                outs, lp = await greedy_lp()
                ref = seen.get(name)
                row = {"step": f"push {name}" + (f" after sleep {sleep_level}" if sleep_level else " awake"),
                       "update_s": secs, "first_lp": lp, "outputs": outs,
                       "same_as_previous_" + name: None if ref is None else (outs == ref[0] and lp == ref[1]),
                       "same_as_A": outs == base and lp == base_lp}
                seen.setdefault(name, (outs, lp))
                diag.append(row)
                print(f"diagnose: {row['step']}: same as earlier {name}: {row['same_as_previous_' + name]}, "
                      f"same as A: {row['same_as_A']}; first logprobs {lp}", flush=True)
                dump()

            again, again_lp = await greedy_lp()
            diag.append({"step": "A twice, no update", "same": again == base and again_lp == base_lp})
            for name, level in (("B", None), ("A", None), ("B", 2), ("A", 2), ("B", 1), ("A", 1)):
                await step(name, level)
            await eng.aclose()
            dump()
            return res

        if args.diagnose:
            try:
                return await diagnose()
            except Exception:  # noqa: BLE001
                import traceback

                res["errors"].append(traceback.format_exc())
                print(traceback.format_exc(), flush=True)
                dump()
                return res

        try:
            res["baseline_outputs"] = await greedy()
            # --- decode throughput and prefill ---------------------------------------------------
            await batch(8, 64, 16)  # warm-up
            dec = []
            for b, n in args.decode_grid:
                dec.append(await batch(b, 128, n))
                print(f"decode B={b} n={n}: {dec[-1]['wall_s']:.2f}s {dec[-1]['tokens_per_s']:.0f} tok/s "
                      f"{dec[-1]['s_per_step'] * 1e3:.2f} ms/step", flush=True)
                res["phases"]["decode"] = dec
                dump()
            pre = []
            for n in args.prefill_lens:
                for rep in range(2):
                    r = await batch(1, n, 1)
                    r["repeat"] = rep
                    pre.append(r)
                print(f"prefill {n}: {pre[-1]['wall_s'] * 1e3:.1f} ms", flush=True)
                res["phases"]["prefill"] = pre
                dump()
            # --- sleep level 1: weights to host, KV discarded -----------------------------------
            cycles = []
            for c in range(args.cycles):
                row: dict = {"level": 1, "cycle": c, "free_awake": free_bytes()}
                t = time.perf_counter()
                await eng.sleep(1)
                row["sleep_s"] = time.perf_counter() - t
                row["free_asleep"] = free_bytes()
                t = time.perf_counter()
                await eng.wake_up(["weights"])
                row["wake_weights_s"] = time.perf_counter() - t
                row["free_weights"] = free_bytes()
                t = time.perf_counter()
                await eng.wake_up(["kv_cache"])
                row["wake_kv_s"] = time.perf_counter() - t
                row["free_woken"] = free_bytes()
                row["outputs_unchanged"] = await greedy() == res["baseline_outputs"]
                cycles.append(row)
                print(f"L1 cycle {c}: sleep {row['sleep_s']:.3f}s released {(row['free_asleep'] - row['free_awake']) / GIB:.1f} GiB, "
                      f"wake weights {row['wake_weights_s']:.3f}s kv {row['wake_kv_s']:.3f}s same={row['outputs_unchanged']}", flush=True)
                res["phases"]["sleep_l1"] = cycles
                dump()
            # --- sleep level 2 + IPC weight update ----------------------------------------------
            await eng.init_weight_transfer({})
            bk_a = buckets_of(model_a, args.bucket_bytes)
            bk_b = buckets_of(model_b, args.bucket_bytes)
            res["buckets"] = {"count": len(bk_a), "bucket_bytes": args.bucket_bytes,
                              "sizes": [b.nbytes for b in bk_a]}
            cycles2 = []
            outputs_b = None
            for c in range(args.cycles):
                row = {"level": 2, "cycle": c, "free_awake": free_bytes()}
                t = time.perf_counter()
                await eng.sleep(2)
                row["sleep_s"] = time.perf_counter() - t
                row["free_asleep"] = free_bytes()
                t = time.perf_counter()
                await eng.wake_up(["weights"])
                row["wake_weights_s"] = time.perf_counter() - t
                row["free_weights"] = free_bytes()
                send = bk_b if c % 2 == 0 else bk_a
                row["sent"] = "B" if c % 2 == 0 else "A"
                t = time.perf_counter()
                await eng.start_weight_update()
                row["start_update_s"] = time.perf_counter() - t
                per = []
                for b in send:
                    tb = time.perf_counter()
                    await eng.update_weights(b)
                    per.append(time.perf_counter() - tb)
                row["bucket_s"] = per
                t = time.perf_counter()
                await eng.finish_weight_update(c + 1)
                row["finish_update_s"] = time.perf_counter() - t
                row["update_total_s"] = row["start_update_s"] + sum(per) + row["finish_update_s"]
                t = time.perf_counter()
                await eng.wake_up(["kv_cache"])
                row["wake_kv_s"] = time.perf_counter() - t
                row["free_woken"] = free_bytes()
                outs = await greedy()
                if row["sent"] == "A":
                    row["outputs_match_original"] = outs == res["baseline_outputs"]
                else:
                    row["outputs_differ_from_original"] = outs != res["baseline_outputs"]
                    row["outputs_match_previous_B"] = None if outputs_b is None else outs == outputs_b
                    outputs_b = outs
                row["weight_version_seen"] = eng.last_response_version
                cycles2.append(row)
                print(f"L2 cycle {c}: sleep {row['sleep_s']:.3f}s released {(row['free_asleep'] - row['free_awake']) / GIB:.1f} GiB, "
                      f"wake weights {row['wake_weights_s']:.3f}s, update {row['sent']} {len(per)} buckets "
                      f"{row['update_total_s']:.2f}s, kv {row['wake_kv_s']:.3f}s "
                      f"{ {k: v for k, v in row.items() if k.startswith('outputs')} }", flush=True)
                res["phases"]["sleep_l2_ipc"] = cycles2
                dump()
            res["client_behaviour"] = eng.behaviour
        except Exception:  # noqa: BLE001
            import traceback

            res["errors"].append(traceback.format_exc())
            print(traceback.format_exc(), flush=True)
        finally:
            await eng.aclose()
            dump()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--preset", default="qwen3-4b", choices=sorted(PRESETS))
    ap.add_argument("--model-dir", default="/tmp/qwen3-random")
    ap.add_argument("--log-dir", default="/tmp/vllm-logs")
    ap.add_argument("--port", type=int, default=8311)
    ap.add_argument("--max-model-len", type=int, default=20480)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--start-timeout", type=float, default=330)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--bucket-bytes", type=int, default=512 << 20)
    ap.add_argument("--eager", action="store_true", help="--enforce-eager (no torch.compile, no CUDA graphs)")
    ap.add_argument("--quick", action="store_true", help="small grid")
    ap.add_argument("--diagnose", action="store_true",
                    help="only the weight-update checks: push the original weights back after each kind of "
                         "sleep and compare greedy outputs and first-token log-probs with the baseline")
    args = ap.parse_args()
    args.decode_grid = [(1, 256), (16, 256), (64, 256), (128, 256), (256, 256), (64, 1024), (256, 1024)]
    args.prefill_lens = [2048, 8192, 16384]
    if args.quick:
        args.decode_grid = [(1, 32), (16, 32)]
        args.prefill_lens = [512]
        args.cycles = 2
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    res = asyncio.run(run(args))
    return 0 if not res["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
