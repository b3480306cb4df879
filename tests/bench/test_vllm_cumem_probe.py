"""bench/vllm_cumem_probe.py on a machine without a GPU: it refuses in one line, after proving --out writable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "vllm_cumem_probe.py"


def run(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os

    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env_extra or {})}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=120)


def test_without_a_gpu_it_refuses_in_one_line_after_writing_out(tmp_path) -> None:
    out = tmp_path / "p.json"
    proc = run("--size", "4", "--out", str(out))
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("vllm_cumem_probe.py: needs")
    assert out.read_text() == "{}\n"


@pytest.mark.parametrize(("flag", "value"), [("--size", "-1"), ("--size", "nan"), ("--settles", "0,inf"),
                                              ("--chunks", "0"), ("--neighbour-gib", "-3"),
                                              ("--neighbour-gib", "inf")])
def test_bad_input_names_the_flag_and_writes_nothing(tmp_path, flag, value) -> None:
    out = tmp_path / "p.json"
    args = ["--size", "4", "--out", str(out)]
    if flag == "--size":
        args[1] = value
    else:
        args += [flag, value]
    proc = run(*args)
    assert proc.returncode == 2 and flag in proc.stderr.strip().splitlines()[-1]
    assert not out.exists()


def test_the_call_timer_times_each_mapping_call_and_puts_the_module_back() -> None:
    import types

    sys.path.insert(0, str(ROOT))
    from bench.vllm_cumem_probe import CallTimer, call_split

    seen = []
    module = types.SimpleNamespace(create_and_map=seen.append)
    original = module.create_and_map
    with CallTimer(module) as timer:
        module.create_and_map(("h", 1))
        module.create_and_map(("h", 2))
        calls = timer.take()
    assert seen == [("h", 1), ("h", 2)] and len(calls) == 2 and all(c >= 0 for c in calls)
    assert module.create_and_map is original and timer.take() == []
    split = call_split(0.5, [0.1, 0.2], "wake_kv")
    assert split["wake_kv_calls_s"] == [0.1, 0.2] and abs(split["wake_kv_outside_calls_s"] - 0.2) < 1e-12


@pytest.mark.parametrize("flag", ["--neighbour-cycle-gib", "--release-before-kv-mib", "--kv-delay-s"])
def test_the_step_traffic_flags_refuse_bad_numbers(tmp_path, flag) -> None:
    out = tmp_path / "p.json"
    proc = run("--size", "4", "--neighbour-gib", "2", flag, "-1", "--out", str(out))
    assert proc.returncode == 2 and flag in proc.stderr.strip().splitlines()[-1]
    assert not out.exists()


def test_a_neighbour_cycle_without_a_neighbour_is_refused(tmp_path) -> None:
    out = tmp_path / "p.json"
    proc = run("--size", "4", "--neighbour-cycle-gib", "20", "--out", str(out))
    assert proc.returncode == 2 and "--neighbour-cycle-gib needs --neighbour-gib" in proc.stderr
    assert not out.exists()


def test_the_neighbour_is_asked_and_waited_for() -> None:
    import multiprocessing as mp
    import threading

    sys.path.insert(0, str(ROOT))
    from bench.vllm_cumem_probe import Neighbour

    ours, theirs = mp.Pipe()
    heard = []

    def serve() -> None:
        while (msg := theirs.recv())[0] != "exit":
            heard.append(msg)
            theirs.send("ok")

    server = threading.Thread(target=serve)
    server.start()
    n = Neighbour(ours)
    assert n.take(30.5) >= 0 and n.give_back() >= 0
    ours.send(("exit",))
    server.join()
    assert heard == [("take", 30.5), ("give_back",)]
