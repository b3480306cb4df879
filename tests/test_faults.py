"""`--fault SPEC` on the simulator (issue 18): each fault kind happens where its spec says, the run recovers with every sample accounted for (or, for a trainer crash, stops with one line and the resume), and a faulted simulation is deterministic."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Any

import pytest

from vime import cli
from vime.config import parse_args
from vime.faults import faults_of
from vime.runs.sim import simulate

N_SAMPLES = 256  # the default scenario: 32 prompts × 8 samples per rollout


def _run(*specs: str, **flags: Any) -> tuple[Any, dict[str, Any]]:
    argv = ["--num-rollout", str(flags.pop("num_rollout", 2))]
    for spec in specs:
        argv += ["--fault", spec]
    for k, v in flags.items():
        argv += [f"--{k.replace('_', '-')}", str(v)]
    sim = simulate(parse_args(argv, command="simulate"))
    rep = faults_of(sim)
    assert rep is not None
    return sim, rep


def _assert_nothing_lost(sim: Any, rep: dict[str, Any], rollouts: int = 2) -> None:
    s = rep["samples"]
    assert rep["outcome"] == "survived" and s["lost"] == 0 and s["failed"] == 0, rep
    assert s["taken_from_data"] == s["trained"] + s["dropped_by_filter"] + s["returned_to_data"]
    assert [st.num_samples for st in sim.steps] == [N_SAMPLES] * rollouts
    assert s["trained"] == N_SAMPLES * rollouts and rep["not_reached"] == []


def _events(rep: dict[str, Any]) -> list[tuple[Any, ...]]:
    return [(e["step"], e["phase"], e["event"], e["target"]) for e in rep["events"]]


def _versions(sim: Any) -> list[int | None]:
    return [e.lifecycle.weight_version for e in sim.backends.engines]


def test_an_engine_crash_mid_rollout_is_retried_elsewhere_and_the_engine_restarted() -> None:
    sim, rep = _run("engine-crash:engine=1,step=0,at=2")
    _assert_nothing_lost(sim, rep)
    assert _events(rep) == [(0, "rollout", "crash", "engine1"), (0, "rollout", "restart", "engine1")]
    assert rep["events"][0]["t"] == pytest.approx(sim.steps[0].t_begin + 2.0)
    assert rep["samples"]["requests_retried"] > 0  # its in-flight requests moved to the other engines
    assert sim.steps[0].restarted_engines == ["engine1"] and _versions(sim) == [3, 3, 3, 3]


@pytest.mark.parametrize("phase", ["offload", "train", "onload_weights", "weight_sync"])
def test_an_engine_crash_in_any_later_phase_is_recovered_by_its_next_call(phase: str) -> None:
    sim, rep = _run(f"engine-crash:engine=2,step=0,phase={phase}")
    _assert_nothing_lost(sim, rep)
    (crash, restart) = _events(rep)
    assert crash == (0, phase, "crash", "engine2") and restart[2:] == ("restart", "engine2")
    assert rep["restarted_engines"] == ["engine2"] and _versions(sim) == [3, 3, 3, 3]


def test_a_crash_after_the_last_call_is_reported_as_down_at_the_end() -> None:
    sim, rep = _run("engine-crash:engine=0,step=1,phase=onload_kv,at=0")
    assert rep["down_at_end"] == ["engine0"] and rep["samples"]["lost"] == 0
    _, rep = _run("engine-crash:engine=3,time=100000")
    assert rep["not_reached"] == ["engine-crash:engine=3,time=100000"] and rep["events"] == []


def test_a_failed_wake_of_the_kv_cache_restarts_the_engine_and_republishes_its_weights() -> None:
    sim, rep = _run("wake-fail:engine=1,step=0,phase=onload_kv")
    _assert_nothing_lost(sim, rep)
    assert _events(rep) == [(0, "onload_kv", "crash", "engine1"), (0, "onload_kv", "restart", "engine1")]
    assert "weights v2 published to it again" in rep["events"][1]["detail"]
    # rollout 1 ran on v2 everywhere: the restarted engine served the published weights, not none
    assert sim.steps[1].rollout_weight_version == "2" and _versions(sim) == [3, 3, 3, 3]


def test_a_failed_wake_of_the_weights_restarts_the_engine_before_the_publication() -> None:
    sim, rep = _run("wake-fail:engine=0,step=1")
    _assert_nothing_lost(sim, rep)
    assert _events(rep) == [(1, "onload_weights", "crash", "engine0"), (1, "onload_weights", "restart", "engine0")]
    assert _versions(sim) == [3, 3, 3, 3]


def test_a_failed_weight_update_reopens_the_update_and_replays_its_buckets() -> None:
    sim, rep = _run("update-fail:engine=2,step=0,bucket=3")
    _assert_nothing_lost(sim, rep)
    assert _events(rep) == [(0, "weight_sync", "crash", "engine2"), (0, "weight_sync", "restart", "engine2")]
    assert "its 3 earlier bucket(s) sent again" in rep["events"][1]["detail"]
    assert sim.steps[1].rollout_weight_version == "2" and _versions(sim) == [3, 3, 3, 3]


def test_a_slow_engine_slows_the_rollout_and_loses_nothing() -> None:
    base = simulate(parse_args(["--num-rollout", "2"], command="simulate"))
    sim, rep = _run("slow-engine:engine=0,factor=4,step=1")
    _assert_nothing_lost(sim, rep)
    assert _events(rep) == [(1, "rollout", "slow", "engine0")]
    assert sim.steps[0].t_rollout == pytest.approx(base.steps[0].t_rollout)  # before the fault: unchanged
    assert sim.steps[1].t_rollout > 1.2 * base.steps[1].t_rollout


def test_a_router_down_holds_requests_until_it_is_back() -> None:
    base = simulate(parse_args(["--num-rollout", "2"], command="simulate"))
    sim, rep = _run("router-down:step=1,at=2,for=15")
    _assert_nothing_lost(sim, rep)
    down, up = rep["events"]
    assert (down["event"], up["event"]) == ("down", "up") and up["t"] - down["t"] == pytest.approx(15.0)
    assert rep["samples"]["requests_retried"] > 0  # those cut in flight
    assert sim.steps[1].t_rollout > base.steps[1].t_rollout + 10.0


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_a_trainer_crash_ends_with_one_line_and_the_resume_from_the_last_save(tmp_path: Path) -> None:
    rc, out, err = _cli(["simulate", "--num-rollout", "3", "--save", str(tmp_path), "--save-interval", "1",
                         "--fault", "trainer-crash:step=2", "--json"])
    assert rc == 1 and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    assert "rollout 2's train call" in err and f"--load {tmp_path}" in err and "rollout 1" in err
    rep = json.loads(out)["faults"]
    assert rep["outcome"] == "stopped" and rep["samples"]["lost"] == 0 and rep["samples"]["trained"] == 2 * N_SAMPLES
    # without --save there is nothing to resume from, and it says so
    rc, out, err = _cli(["train", "--backend", "sim", "--num-rollout", "2", "--fault", "trainer-crash:step=0"])
    assert rc == 1 and "no --save" in err and "outcome: stopped" in out and len(err.strip().splitlines()) == 1


def test_every_kind_at_once_is_deterministic_and_reported_in_json() -> None:
    specs = ["engine-crash:engine=1,step=0,at=1.5", "slow-engine:engine=3,factor=2", "update-fail:engine=0,step=0",
             "router-down:step=1,at=1,for=5", "wake-fail:engine=2,step=1,phase=onload_kv"]
    argv = ["simulate", "--num-rollout", "3", "--json"] + [a for s in specs for a in ("--fault", s)]
    rc1, out1, _ = _cli(argv)
    rc2, out2, _ = _cli(argv)
    doc, again = json.loads(out1), json.loads(out2)
    doc.pop("wall_s"), again.pop("wall_s")  # the simulator's own run time
    assert rc1 == rc2 == 0 and doc == again
    rep = doc["faults"]
    assert rep["outcome"] == "survived" and rep["samples"]["lost"] == 0 and rep["not_reached"] == []
    assert rep["samples"]["trained"] == 3 * N_SAMPLES and doc["config"]["fault"][0].startswith("engine-crash")
    assert {e["event"] for e in rep["events"]} == {"crash", "restart", "slow", "down", "up"}


@pytest.mark.parametrize("spec,needle", [
    ("meltdown", "is not a fault"), ("engine-crash", "needs step=S"), ("engine-crash:engine=9,step=0", "engine=9"),
    ("engine-crash:step=5", "step=5"), ("engine-crash:step=0,phase=lunch", "phase=lunch"),
    ("engine-crash:step=0,time=3", "excludes"), ("slow-engine:factor=nan", "finite"),
    ("slow-engine:engine=0", "factor="), ("router-down:step=0,for=0", "for="), ("trainer-crash:step=-1", "≥ 0"),
    ("update-fail:step=0,colour=red", "takes"), ("wake-fail:step=0,phase=rollout", "phase=rollout"),
])
def test_bad_fault_specs_are_one_line_errors_naming_the_spec(spec: str, needle: str) -> None:
    for command in ("simulate", "train"):
        rc, _, err = _cli([command, "--num-rollout", "2", "--fault", spec, "--dry-run"])
        assert rc == 2 and needle in err and "--fault" in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("spec", ["wake-fail:step=0", "slow-engine:factor=2",
                                  "update-fail:step=0", "engine-crash:step=0,phase=train", "engine-crash:time=5"])
def test_the_real_backend_refuses_what_it_cannot_inject_naming_the_alternative(spec: str) -> None:
    rc, _, err = _cli(["train", "--backend", "real", "--fault", spec, "--dry-run"])
    assert rc == 2 and "--backend real" in err and "--backend sim" in err and "--fault" in err, err
    for ok in ("engine-crash:engine=0,step=0,at=1", "router-down:step=0,at=1,for=2", "trainer-crash:step=0"):
        rc, _, err = _cli(["train", "--backend", "real", "--fault", ok, "--dry-run"])
        assert rc == 0, err


def test_the_trace_marks_each_fault_event_on_its_own_track(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    rc, _, err = _cli(["simulate", "--fault", "engine-crash:engine=1,step=0,at=2", "--trace-out", str(trace)])
    assert rc == 0, err
    events = json.loads(trace.read_text())["traceEvents"]
    marks = [(e["name"], e["args"]["target"]) for e in events if e.get("ph") in ("i", "I") and e["name"] in
             ("crash", "restart")]
    assert marks == [("crash", "engine1"), ("restart", "engine1")]
