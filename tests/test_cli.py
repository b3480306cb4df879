"""`vime train|simulate`: --dry-run prints the resolved seed configuration; configuration errors exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vime import cli

ROOT = Path(__file__).resolve().parents[1]


def test_module_dry_run_json_prints_seed_config() -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "vime.cli", "simulate", "--dry-run", "--json"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)
    assert config["command"] == "simulate"
    assert config["global_batch_size"] == 256
    assert config["eps_clip_high"] == 0.2
    assert config["over_sampling_batch_size"] == 32
    assert config["rollout_num_engines"] == 4
    assert config["data_parallel_size"] == 4
    assert config["rollout_num_gpus"] == 8


def test_dry_run_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["train", "--dry-run", "--num-steps-per-rollout", "4"]) == 0
    out = capsys.readouterr().out
    assert "[derived]" in out and "[rollout]" in out
    line = next(ln for ln in out.splitlines() if ln.split()[:1] == ["global_batch_size"])
    assert line.split()[1] == "64"


def test_config_error_exits_2_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["simulate", "--tensor-model-parallel-size", "3", "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert "--tensor-model-parallel-size 3" in err and "Traceback" not in err


def test_subprocess_config_error_exit_code() -> None:
    proc = subprocess.run([sys.executable, "-m", "vime.cli", "train", "--micro-batch-size", "7"],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    assert proc.returncode == 2
    assert "--micro-batch-size 7" in proc.stderr and "Traceback" not in proc.stderr


def test_runner_dispatch_is_lazy(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen = []

    class FakeModule:
        @staticmethod
        def run_simulate(args: object) -> int:
            seen.append(args)
            return 0

    monkeypatch.setitem(sys.modules, "vime._fake_runner", FakeModule)  # type: ignore[arg-type]
    monkeypatch.setitem(cli.RUNNERS, "simulate", ("vime._fake_runner", "run_simulate"))
    assert cli.main(["simulate", "--rollout-batch-size", "16"]) == 0
    assert len(seen) == 1 and seen[0].rollout_batch_size == 16  # type: ignore[attr-defined]


def test_missing_runner_says_not_implemented(monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(cli.RUNNERS, "train", ("vime.no_such_runner_module", "run_train"))
    assert cli.main(["train"]) == 2
    assert "not implemented" in capsys.readouterr().err


def test_no_arguments_prints_help(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([]) == 2
    assert "simulate" in capsys.readouterr().out


def test_train_json_keeps_stdout_for_the_events(monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """With --json the real run's other output (Ray forwards its workers' prints to the driver's stdout) goes to
    stderr: a faults event once landed behind a worker's line and was lost to `jq` and the tests."""
    from vime.cli import train as train_mod

    def fake_real(args, printer, on_step, recording):
        print("(MegatronActor pid=1) a worker's line")
        printer.faults({"outcome": "completed", "events": []})
        return 0

    monkeypatch.setattr(train_mod, "_run_real", fake_real)
    from vime.config import parse_args

    args = parse_args(["--json"], command="train")
    args = args.replace(backend="real")
    assert train_mod.run_train(args) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["event"] for line in out.splitlines()] == ["faults"]
    assert "a worker's line" in err
