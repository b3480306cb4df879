"""The protocol-call log both backends feed (vime.report.calls), `--record-calls`, and `vime compare` on call logs (issue 26)."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from vime.config import parse_args
from vime.errors import ConfigError
from vime.report.calls import CallEntry, CallLog, compress, first_divergence, format_sequences
from vime.runs.sim import simulate

ROOT = Path(__file__).resolve().parents[2]
#: Two engines of one GPU each, two rollouts of 4 × 4 samples: small, and enough to see per-engine calls.
FLAGS = ["--actor-num-gpus-per-node", "2", "--rollout-num-gpus-per-engine", "1", "--tensor-model-parallel-size", "1",
         "--model", "Qwen3-0.6B", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--micro-batch-size", "4",
         "--rollout-max-response-len", "64", "--num-rollout", "2", "--update-weight-buffer-size", "256MiB"]


def _recorded(flags: list[str] = FLAGS, log: CallLog | None = None) -> CallLog:
    log = log or CallLog()
    simulate(parse_args(flags, command="simulate"), observers=[log],
             wrap=lambda b: log.wrap(b.engines, b.router, b.trainer))
    return log


@pytest.fixture(scope="module")
def log() -> CallLog:
    return _recorded()


def _keys(entries: list[CallEntry]) -> list[tuple[str, str, dict[str, Any], int]]:
    return [(e.component, e.call, e.args, e.count) for e in entries]


def test_the_log_has_start_up_and_each_rollout_with_what_the_orchestrator_decided(log: CallLog) -> None:
    assert list(log.segments) == ["startup", "0", "1"]
    start = _keys(log.sequence("startup"))
    # seed steps 3-13: the trainer hands the GPUs over, weights woken, v1 published in buckets, KV woken
    assert start[0] == ("trainer", "sleep", {}, 1)
    assert start[1:3] == [("engine0", "wake_up", {"tags": ["weights"]}, 1), ("engine1", "wake_up", {"tags": ["weights"]}, 1)]
    updates = [k for k in start if k[1] == "update_weights"]
    assert len(updates) >= 4 and all(k[3] == 1 for k in updates)  # Qwen3-0.6B in 256 MiB buckets, engine by engine
    assert ("engine1", "finish_weight_update", {"version": 1}, 1) in start
    one = _keys(log.sequence("0"))
    gen = one[0]
    assert gen[:2] == ("router", "generate") and gen[2] == {"engine0": 8, "engine1": 8}  # per engine, round robin
    assert ("engine0", "sleep", {"level": 2, "mode": "keep"}, 1) in one
    train = next(k for k in one if k[1] == "train")
    assert train == ("trainer", "train", {"rollout_id": 0, "samples": 16, "microbatches": [2],
                                          "recompute_log_probs": False}, 1)
    assert ("engine0", "finish_weight_update", {"version": 2}, 1) in one
    # the last rollout does not resume admission (seed step 53)
    assert ("rollout_manager", "resume_rollout_admission", {}, 1) in one
    assert ("rollout_manager", "resume_rollout_admission", {}, 1) not in _keys(log.sequence("1"))
    # times are the loop's clock (virtual here), kept for reading
    sleep = next(e for e in log.sequence("0") if e.call == "sleep" and e.component == "engine0")
    assert sleep.t1 > sleep.t0 > 0


def test_same_run_same_calls_and_a_skipped_call_is_named(log: CallLog) -> None:
    assert first_divergence(log, _recorded()) is None
    assert first_divergence(log.to_dict(), json.loads(json.dumps(log.to_dict()))) is None  # through JSON

    class SkipsFlush(CallLog):
        def begin(self, component: str, call: str, args: Any = None) -> CallEntry:
            entry = super().begin(component, call, args)
            if call == "flush_cache" and component == "engine1" and self.segment == "1":
                self.segments[self.segment].remove(entry)
            return entry

    diff = first_divergence(log, _recorded(log=SkipsFlush()))
    assert diff is not None and diff.segment == "1"
    assert diff.left is not None and (diff.left.component, diff.left.call) == ("engine1", "flush_cache")
    assert diff.right is not None and diff.right.call == "start_weight_update"
    assert str(diff) == (f"rollout 1, call {diff.index + 1}: real engine1.flush_cache() ×1; "
                         f"simulated engine0.start_weight_update() ×1")
    shorter = copy.deepcopy(log.to_dict())
    shorter["1"] = shorter["1"][:-1]
    diff = first_divergence(log.to_dict(), shorter, names=("measured", "predicted"))
    assert diff is not None and "predicted nothing (its calls end here)" in str(diff)
    assert "≠" in format_sequences(log.to_dict(), shorter) and "=" in format_sequences(log, log)


def test_a_different_decision_is_a_different_call() -> None:
    """Arguments count: another sleep level (engines that do not receive weights) or another flush interval."""
    base = _recorded()
    flushless = _recorded([*FLAGS, "--flush-cache-interval", "0"])
    diff = first_divergence(base, flushless)
    assert diff is not None and diff.segment == "0" and diff.left is not None and diff.right is not None
    assert (diff.left.call, diff.left.args) == ("pause", {"mode": "abort"})
    assert (diff.right.call, diff.right.args) == ("pause", {"mode": "keep"})


def test_compress_merges_runs_of_one_call_and_keeps_generates_apart() -> None:
    a = CallEntry("engine0", "update_weights", {}, 1, 0.0, 1.0)
    b = CallEntry("engine0", "update_weights", {}, 1, 1.0, 2.5)
    c = CallEntry("engine0", "update_weights", {}, 1, 3.0, 4.0, raised="EngineError")
    out = compress([a, b, c])
    assert [(e.count, e.t0, e.t1, e.raised) for e in out] == [(2, 0.0, 2.5, None), (1, 3.0, 4.0, "EngineError")]
    g = CallEntry("router", "generate", {"engine0": 3})
    assert len(compress([g, g])) == 2
    assert CallEntry.from_dict(out[0].to_dict()).key() == out[0].key()


def test_record_calls_is_one_run_only() -> None:
    with pytest.raises(ConfigError, match="--record-calls"):
        parse_args(["--record-calls", "--sweep", "micro-batch-size=4,8"], command="simulate")


def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "vime.cli", *argv], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)


def test_vime_compare_reads_both_sides_calls_and_names_a_difference(tmp_path: Path) -> None:
    """`vime train --backend sim` prints what the real backend prints; against `vime simulate` of the same flags
    the calls agree (exit 0); with one call removed from the run `vime compare` names it (exit 1)."""
    train = _cli("train", "--backend", "sim", "--json", "--record-calls", *FLAGS)
    assert train.returncode == 0, train.stderr[-2000:]
    sim = _cli("simulate", "--json", "--record-calls", *FLAGS)
    assert sim.returncode == 0, sim.stderr[-2000:]
    doc = json.loads(sim.stdout)
    assert [s["calls"][0]["call"] for s in doc["steps"]] == ["generate", "generate"]
    assert doc["startup"]["calls"][0] == {"component": "trainer", "call": "sleep", "args": {}, "count": 1,
                                          "t0": doc["startup"]["calls"][0]["t0"], "t1": doc["startup"]["calls"][0]["t1"]}
    (tmp_path / "run.jsonl").write_text(train.stdout)
    (tmp_path / "sim.json").write_text(sim.stdout)
    ok = _cli("compare", "--train", str(tmp_path / "run.jsonl"), "--sim", str(tmp_path / "sim.json"),
              "--out", str(tmp_path / "cmp.json"), "--calls")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "calls: the same, rollout by rollout" in ok.stdout and "= engine0.sleep(level=2, mode=keep)" in ok.stdout
    cmp = json.loads((tmp_path / "cmp.json").read_text())
    assert cmp["calls"]["equal"] and cmp["ok"]
    lines = []
    for line in train.stdout.splitlines():
        if '"event": "step"' in line and '"rollout_id": 1' in line:
            ev = json.loads(line)
            ev["calls"] = [c for c in ev["calls"] if c["call"] != "health"]
            line = json.dumps(ev)
        lines.append(line)
    (tmp_path / "skipped.jsonl").write_text("\n".join(lines) + "\n")
    bad = _cli("compare", "--train", str(tmp_path / "skipped.jsonl"), "--sim", str(tmp_path / "sim.json"))
    assert bad.returncode == 1
    assert "calls DIFFER: rollout 1, call 2: measured engine0.sleep(level=2, mode=keep) ×1; predicted engine0.health() ×1" \
        in bad.stdout
