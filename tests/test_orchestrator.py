"""The step loop (seed steps 1–55) end to end on the simulated backends, watched through recording wrappers."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from vime.cli.train import format_step
from vime.config import defaults
from vime.errors import ConfigError, EngineError
from vime.orchestrator import PHASES, StepReport
from vime.protocols import normalize_wake_tags
from vime.rollout.data_source import DataSource, SyntheticDataset
from vime.rollout.generate import RolloutError
from vime.runs.loop import build_orchestrator
from vime.runs.sim import simulate
from vime.sim import clock

ASYNC_CALLS = {"generate", "abort_all", "sleep", "wake_up", "pause", "resume", "flush_cache",
               "start_weight_update", "update_weights", "finish_weight_update", "health", "train",
               "save_checkpoint", "load_checkpoint", "compute_log_prob", "restart"}
_NO_ARGS = {"generate", "update_weights"}  # too many or too large to keep


class Recording:
    """Forwards to a protocol object and logs every call as (component, call, args) when it is made."""

    def __init__(self, target: Any, component: str, log: list[tuple[Any, ...]], batches: list[Any] | None = None):
        self._target = target
        self._component = component
        self._log = log
        self._batches = batches

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._target, name)
        if name == "export_weights":
            def export(bucket_bytes: int) -> Any:
                self._log.append((self._component, name, (bucket_bytes,)))
                return attr(bucket_bytes)
            return export
        if name not in ASYNC_CALLS:
            return attr

        async def call(*args: Any, **kwargs: Any) -> Any:
            self._log.append((self._component, name, () if name in _NO_ARGS else args))
            if name == "train" and self._batches is not None:
                self._batches.append(args[1])
            return await attr(*args, **kwargs)
        return call


class CallLog:
    """A StepObserver that puts the orchestrator's own calls into the same log."""

    def __init__(self, log: list[tuple[Any, ...]]) -> None:
        self.log = log
        self.phases: list[tuple[str, bool, float, int | None]] = []

    def on_phase(self, name: str, begin: bool, t: float, rollout_id: int | None) -> None:
        self.phases.append((name, begin, t, rollout_id))

    def on_call(self, component: str, call: str, t0: float, t1: float) -> None:
        self.log.append((component, call, ()))


def seed_args(**changes: Any) -> Any:
    changes.setdefault("num_rollout", 3)
    return defaults("train").replace(backend="sim", **changes)


def recorded_run(args: Any, *, on_backends: Any = None) -> tuple[Any, list[tuple[Any, ...]], list[Any], CallLog]:
    log: list[tuple[Any, ...]] = []
    batches: list[Any] = []
    observer = CallLog(log)

    def wrap(backends: Any) -> dict[str, Any]:
        if on_backends is not None:
            on_backends(backends, observer)
        return {"engines": [Recording(e, "engines", log) for e in backends.engines],
                "router": Recording(backends.router, "router", log),
                "trainer": Recording(backends.trainer, "trainer", log, batches)}

    run = simulate(args, wrap=wrap, observers=[observer])
    return run, log, batches, observer


def compress(log: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Merge runs of the same call (the concurrent calls to every engine, the 256 generates) with a count."""
    out: list[list[Any]] = []
    for entry in log:
        if out and out[-1][0] == entry:
            out[-1][1] += 1
        else:
            out.append([entry, 1])
    return [(*entry, count) for entry, count in out]


def publish(version: int, buckets: int, bucket_bytes: int, engines: int = 4) -> list[tuple[Any, ...]]:
    """Seed steps 46–52 as the log shows them (a flush every version with --flush-cache-interval 1)."""
    return [("engines", "pause", ("abort",), engines), ("engines", "flush_cache", (), engines),
            ("engines", "start_weight_update", (), engines), ("trainer", "export_weights", (bucket_bytes,), 1),
            ("engines", "update_weights", (), engines * buckets),
            ("engines", "finish_weight_update", (version,), engines), ("engines", "resume", (), engines)]


WEIGHTS = ("engines", "wake_up", (["weights"],), 4)
KV = ("engines", "wake_up", (["kv_cache", "cuda_graph"],), 4)


def test_three_rollouts_follow_the_seed_sequence_diagram():
    args = seed_args()
    run, log, batches, observer = recorded_run(args)
    buckets = run.report.startup.buckets
    bb = args.update_weight_buffer_size
    assert buckets >= 1
    expected = [("trainer", "sleep", (), 1),  # step 3: the trainer comes up awake and hands the GPUs over
                WEIGHTS, *publish(1, buckets, bb), ("rollout_manager", "training_ready", (), 1), KV]  # steps 4–13
    for rid in range(3):
        expected += [("router", "generate", (), 256),  # steps 14–32
                     ("engines", "health", (), 4),
                     ("engines", "sleep", (2, "keep"), 4),  # steps 33–36: level 2, mode keep
                     ("trainer", "wake_up", (), 1), ("trainer", "train", (rid, batches[rid]), 1),
                     ("trainer", "sleep", (), 1),  # steps 37–41
                     ("rollout_manager", "training_completed", (), 1),  # step 42
                     WEIGHTS,  # step 43
                     ("rollout_manager", "pause_rollout_admission", (), 1),  # step 44
                     *publish(rid + 2, buckets, bb)]  # steps 45–52
        if rid + 1 < 3:
            expected.append(("rollout_manager", "resume_rollout_admission", (), 1))  # step 53, not after the last
        expected.append(KV)  # step 54
    assert compress(log) == expected
    # phases reported to observers: begin/end pairs in seed order for every step
    ends = [(name, rid) for name, begin, _, rid in observer.phases if not begin and rid is not None]
    assert ends == [(p, rid) for rid in range(3) for p in PHASES]


def test_seed_numbers_reach_training():
    run, log, batches, _ = recorded_run(seed_args())
    assert len(batches) == 3
    for rid, batch in enumerate(batches):
        assert len(batch) == 256
        assert sorted(Counter(batch.group_indices).values()) == [8] * 32  # exactly 32 groups × 8
        assert batch.num_microbatches == [8]
        for rank in range(4):
            part = batch.for_rank(rank)
            assert part.num_microbatches == [8] and len(part.micro_batches(0)) == 8
            assert len(part.rows) == 64
        # rollout 0 was generated with v1 (seed step 24), rollout 1 with v2 (step 51), rollout 2 with v3
        assert {tuple(v) for v in batch.weight_versions} == {(str(rid + 1),)}
    reports = run.report.steps
    assert [r.rollout_weight_version for r in reports] == ["1", "2", "3"]
    assert [r.published_version for r in reports] == [2, 3, 4]
    assert run.report.startup.weight_version == 1 and run.report.startup.flushed_cache
    assert all(r.sleep_level == 2 and r.num_samples == 256 and r.num_microbatches == [8] for r in reports)
    # group indices continue across rollouts (seed step 16 numbering)
    assert min(batches[1].group_indices) == 32 and max(batches[2].sample_indices) == 767


def test_wake_tags_are_normalised_on_the_engine():
    run, log, _, _ = recorded_run(seed_args(num_rollout=1))
    asked = [args[0] for comp, call, args in log if comp == "engines" and call == "wake_up"]
    assert ["kv_cache", "cuda_graph"] in asked
    assert normalize_wake_tags(["kv_cache", "cuda_graph"]) == ["kv_cache"]
    for engine in run.backends.engines:
        assert engine.lifecycle.memory.value == "awake" and engine.lifecycle.weight_version == 2
        assert engine.allocator.lifecycle.asleep_tags() == []


def test_t_step_is_the_sum_of_phases_plus_the_gap():
    run = simulate(seed_args())
    for r in run.report.steps:
        total = sum(r.phases().values()) + r.t_save + r.t_eval + r.t_gap
        assert math.isclose(r.t_step, total, rel_tol=1e-12)
        assert r.t_gap >= 0 and all(t > 0 for t in r.phases().values())
        m = r.metrics()
        assert m["perf/step_time"] == r.t_step and m["perf/rollout_time"] == r.t_rollout
        # slime's names keep slime's meaning: the trainer's sleep and wake (inside the train phase),
        # its train() call and the update inside it; the engines' sleep and wake have their own names
        assert m["perf/engine_sleep_time"] == r.t_offload and m["perf/train_phase_time"] == r.t_train
        assert 0 < m["perf/sleep_time"] == r.t_trainer_sleep and 0 < m["perf/wake_up_time"] == r.t_trainer_wake_up
        assert m["perf/wake_up_time"] + m["perf/train_time"] + m["perf/sleep_time"] <= r.t_train * (1 + 1e-12)
        assert 0 < m["perf/actor_train_time"] < m["perf/train_time"]
        assert m["perf/train_wait_time"] == pytest.approx(r.t_step - m["perf/train_time"])
        assert m["perf/update_weights_time"] == r.t_weight_sync
        assert m["perf/engine_wake_up_time"] == r.t_onload_weights + r.t_onload_kv
        assert m["rollout/kept_samples"] == 256
        # the engines' answers on the rollout's clock: the first comes after a decode, the last ends the rollout
        # (no reward model time in this scenario), a request takes between the two on average
        first, last = m["perf/rollout_first_response_time"], m["perf/rollout_last_response_time"]
        assert 0 < first < m["perf/rollout_request_time_mean"] < last <= r.t_rollout * (1 + 1e-12)
        assert 0 <= m["perf/rollout_first_request_time"] <= m["perf/rollout_last_request_time"] < first
    # steps follow each other on one clock
    steps = run.report.steps
    assert steps[1].t_begin == pytest.approx(steps[0].t_begin + steps[0].t_step)


def test_same_seed_same_reports_and_another_seed_differs():
    a = json.dumps(simulate(seed_args(num_rollout=2)).report.to_dict(), sort_keys=True)
    b = json.dumps(simulate(seed_args(num_rollout=2)).report.to_dict(), sort_keys=True)
    c = json.dumps(simulate(seed_args(num_rollout=2, seed=7)).report.to_dict(), sort_keys=True)
    assert a == b and a != c


def test_dynamic_filter_on_the_simulator_counts_drops_refills_and_aborts():
    args = seed_args(num_rollout=2, dynamic_sampling_filter_path="check_reward_nonzero_std")
    run, log, batches, _ = recorded_run(args)
    orch = run.orchestrator
    for report, batch in zip(run.report.steps, batches, strict=True):
        r = report.rollout
        assert r["kept_groups"] == 32 and r["dropped_groups"] > 0 and r["submitted_groups"] > 32
        assert r["kept_samples"] + r["dropped_samples"] + 8 * r["returned_groups"] == 8 * r["submitted_groups"]
        m = report.metrics()
        assert m["rollout/dropped_samples"] == r["dropped_samples"] and m["rollout/aborted_samples"] == r["aborted_samples"]
        # no uniform group reaches training
        by_group: dict[int, set[float]] = {}
        for g, reward in zip(batch.group_indices, batch.raw_rewards, strict=True):
            by_group.setdefault(g, set()).add(reward)
        assert all(len(v) == 2 for v in by_group.values())
    total_aborted = sum(s.rollout["aborted_samples"] for s in run.report.steps)
    assert total_aborted > 0 and ("router", "abort_all", (), 1) in compress(log)
    # what was aborted went back to the data source (and rollout 1 served returned groups first)
    assert orch.data_source.returned_total == sum(s.rollout["returned_groups"] for s in run.report.steps)
    returned_first = run.report.steps[0].rollout["returned_groups"]
    assert returned_first > 0 and min(batches[1].group_indices) < max(batches[0].group_indices)


def fail_engine2_in_rollout_1(backends: Any, observer: Any) -> None:
    def on_phase(name: str, begin: bool, t: float, rid: int | None) -> None:
        if name == "rollout" and begin and rid == 1:
            backends.engines[2].inject_failure(t + 2.0, "GPU 5 fell off the bus")
    observer.on_phase = on_phase


def test_an_engine_failing_mid_rollout_is_restarted_and_the_run_recovers():
    run, log, batches, _ = recorded_run(seed_args(), on_backends=fail_engine2_in_rollout_1)
    steps = run.report.steps
    assert [s.lost_engines for s in steps] == [[], ["engine2"], []]
    assert [s.restarted_engines for s in steps] == [[], ["engine2"], []]
    assert "LOST engine2 (restarted engine2)" in format_step(steps[1])
    assert all(len(b) == 256 for b in batches)  # in-flight samples were retried elsewhere, none lost
    retries = run.backends.router.retries
    assert retries and all(r.failed_engine == "engine2" and r.retried_on != "engine2" for r in retries)
    assert steps[1].metrics()["rollout/kept_samples"] == 256
    # restarted before the offload, it sleeps with the others and receives v3
    entries = compress(log)
    i = entries.index(("engines", "restart", (), 1))
    assert entries[i + 1:i + 4] == [("rollout_manager", "restart_engine", (), 1),
                                    ("rollout_manager", "engine_lost", (), 1), ("engines", "sleep", (2, "keep"), 4)]
    engine2 = run.backends.engines[2]
    assert engine2.lifecycle.weight_version == 4 and run.backends.router.routed["engine2"] > 0
    assert {tuple(v) for v in batches[2].weight_versions} == {("3",)}


class NoRestart(Recording):
    """An engine whose server cannot be brought back (a real client without a launcher, say)."""

    async def restart(self) -> None:
        raise EngineError(self._target.name, "restart", "no way to relaunch this engine's server")


def test_a_dead_engine_that_cannot_restart_stops_a_colocated_run_precisely():
    log: list[tuple[Any, ...]] = []
    observer = CallLog(log)

    def wrap(backends: Any) -> dict[str, Any]:
        fail_engine2_in_rollout_1(backends, observer)
        return {"engines": [NoRestart(e, "engines", log) for e in backends.engines]}

    with pytest.raises(EngineError) as info:
        simulate(seed_args(), wrap=wrap, observers=[observer])
    msg = str(info.value)
    assert msg.startswith("engine engine2: health") and "died during rollout 1" in msg and "--load" in msg


def test_every_engine_failing_stops_with_a_precise_error():
    def arm(backends: Any, observer: Any) -> None:
        def on_phase(name: str, begin: bool, t: float, rid: int | None) -> None:
            if name == "rollout" and begin and rid == 1:
                for e in backends.engines:
                    e.inject_failure(t + 1.0, "node lost power")
        observer.on_phase = on_phase

    with pytest.raises(RolloutError) as info:
        recorded_run(seed_args(), on_backends=arm)
    msg = str(info.value)
    assert "rollout 1" in msg and "failed after 3 attempts" in msg and "no healthy engine" in msg
    assert "returned to the data source" in msg


def test_eval_and_checkpoints_every_interval(tmp_path: Path):
    args = seed_args(num_rollout=3, eval_interval=2, save_interval=2, save=str(tmp_path))
    run, log, _, _ = recorded_run(args)
    steps = run.report.steps
    assert [s.t_eval > 0 for s in steps] == [False, True, True]  # every 2, and after the last
    assert [s.t_save > 0 for s in steps] == [False, True, True]
    assert steps[1].eval["synthetic/samples"] == 32 and 0 <= steps[1].eval["synthetic/reward"] <= 1
    assert steps[1].metrics()["eval/synthetic/reward"] == steps[1].eval["synthetic/reward"]
    saves = [args_ for comp, call, args_ in log if call == "save_checkpoint"]
    assert saves == [(1, str(tmp_path / "iter_0000001")), (2, str(tmp_path / "iter_0000002"))]
    state = json.loads((tmp_path / "iter_0000002" / "rollout_state.json").read_text())
    assert state["rollout_id"] == 2 and state["weight_version"] == 3
    assert state["data_source"]["sample_group_index"] == 96
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert json.loads((tmp_path / "rollout_state.json").read_text()) == state  # the newest, above the iter dirs
    for s in steps:
        assert math.isclose(s.t_step, sum(s.phases().values()) + s.t_save + s.t_eval + s.t_gap, rel_tol=1e-12)


def test_named_eval_sets_are_evaluated_whole_with_their_sampling_params(tmp_path: Path):
    from vime.rollout.toy_task import ToyTask, write_prompts

    small = write_prompts(tmp_path / "small.jsonl", ToyTask(vocab_size=1000, num_prompts=3, prompt_len=8))
    big = write_prompts(tmp_path / "big.jsonl", ToyTask(vocab_size=1000, num_prompts=5, prompt_len=8, seed=2))
    args = seed_args(num_rollout=1, eval_interval=1, eval_prompt_data=("math", str(small), "code", str(big)),
                     n_samples_per_eval_prompt=2, eval_max_response_len=7)
    run = simulate(args)
    ev = run.report.steps[0].eval
    assert ev["math/samples"] == 3 * 2 and ev["code/samples"] == 5 * 2  # every prompt, 2 samples each
    assert 0 < ev["math/response_len"] <= 7 and 0 < ev["code/response_len"] <= 7  # the eval cap, not 1024
    assert set(run.report.steps[0].metrics()) >= {"eval/math/reward", "eval/code/reward"}


def test_resume_reads_the_rollout_state(tmp_path: Path):
    """--load: the trainer says where to resume; the data source and weight version come back too."""
    ckpt = tmp_path / "iter_0000004"
    ckpt.mkdir()
    src = DataSource(SyntheticDataset(100, lambda i: 10), n_samples_per_prompt=8)
    src.get_samples(40)
    (ckpt / "rollout_state.json").write_text(json.dumps(
        {"rollout_id": 4, "weight_version": 5, "data_source": src.state_dict()}))
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("4")

    class Trainer:
        lifecycle = None

        async def load_checkpoint(self, path: str) -> int:
            assert path == str(ckpt)
            return 5

    args = seed_args(num_rollout=8, load=str(tmp_path))
    fresh = DataSource(SyntheticDataset(100, lambda i: 10), n_samples_per_prompt=8)
    orch = build_orchestrator(args, engines=[object()], router=object(), trainer=Trainer(),  # type: ignore[list-item]
                              data_source=fresh, rollout=object())  # type: ignore[arg-type]
    from vime.orchestrator import StartupReport

    report = StartupReport()
    clock.run(orch._load_checkpoint(report))
    assert report.start_rollout_id == 5 and orch.weight_version == 5 and orch.initial_weight_version == 5
    assert fresh.get_samples(1)[0][0].group_index == 40


def test_resume_from_a_simulated_checkpoint_continues_like_an_uninterrupted_run(tmp_path: Path):
    straight = recorded_run(seed_args())
    first = simulate(seed_args(num_rollout=2, save_interval=1, save=str(tmp_path)))
    assert first.report.steps[-1].t_save > 0
    resumed, log, batches, _ = recorded_run(seed_args(load=str(tmp_path)))
    assert resumed.report.startup.start_rollout_id == 2
    assert [s.rollout_id for s in resumed.report.steps] == [2]
    assert resumed.report.startup.weight_version == 3 and resumed.report.startup.flushed_cache
    # the data source continues where it stopped: the same prompts as rollout 2 of the straight run
    assert batches[0].group_indices == straight[2][2].group_indices
    assert resumed.report.steps[0].rollout_weight_version == "3" and resumed.report.steps[0].published_version == 4


def test_eval_interval_without_eval_prompts_is_a_config_error():
    src = DataSource(SyntheticDataset(10, lambda i: 4), n_samples_per_prompt=8)
    with pytest.raises(ConfigError, match="--eval-interval 2 needs evaluation prompts"):
        build_orchestrator(seed_args(eval_interval=2), engines=[object()], router=object(),  # type: ignore[list-item]
                           trainer=object(), data_source=src, rollout=object())  # type: ignore[arg-type]


def _vime(*argv: str, hash_seed: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    if hash_seed is not None:
        env["PYTHONHASHSEED"] = hash_seed
    return subprocess.run([sys.executable, "-m", "vime.cli", "train", *argv], capture_output=True, text=True,
                          timeout=240, env=env, check=False)


def test_vime_train_backend_sim_prints_per_step_phase_times():
    proc = _vime("--backend", "sim", "--num-rollout", "2")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    steps = [ln for ln in lines if ln.startswith("step ")]
    assert len(steps) == 2
    for ln in steps:
        for word in ("T_step", "rollout", "offload", "train", "onload_w", "sync", "onload_kv", "gap"):
            assert word in ln
    assert any(ln.startswith("start-up") for ln in lines)


def test_vime_train_backend_sim_json_lines():
    proc = _vime("--backend", "sim", "--num-rollout", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    events = [json.loads(ln) for ln in proc.stdout.splitlines()]
    assert [e["event"] for e in events] == ["run", "startup", "step", "step"]
    step = events[2]
    assert set(step["phases"]) == set(PHASES)
    assert step["metrics"]["perf/step_time"] == step["t_step"]
    assert math.isclose(step["t_step"], sum(step["phases"].values()) + step["t_gap"], rel_tol=1e-12)
    assert proc.stderr == ""  # no progress bar under --json


def test_reports_do_not_depend_on_the_hash_seed():
    argv = ("--backend", "sim", "--num-rollout", "1", "--json", "--dynamic-sampling-filter-path",
            "check_reward_nonzero_std", "--router-policy", "consistent_hash")
    a, b = _vime(*argv, hash_seed="1"), _vime(*argv, hash_seed="2")
    assert a.returncode == 0 and b.returncode == 0, a.stderr + b.stderr
    assert a.stdout == b.stdout and '"rollout/dropped_samples"' in a.stdout


def test_vime_train_backend_real_without_a_checkpoint_fails_clearly():
    proc = _vime("--backend", "real", "--num-rollout", "1")
    assert proc.returncode == 2
    assert "configuration error" in proc.stderr and "--hf-checkpoint" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_without_colocation_nothing_sleeps_and_weights_still_flow():
    args = seed_args(num_rollout=2, colocate=False, rollout_num_gpus=8)
    run, log, batches, _ = recorded_run(args)
    calls = {(comp, call) for comp, call, _ in log}
    assert ("engines", "sleep") not in calls and ("engines", "wake_up") not in calls
    assert ("trainer", "sleep") not in calls and ("trainer", "wake_up") not in calls
    steps = run.report.steps
    assert all(s.sleep_level is None and s.t_onload_weights == 0 and s.t_onload_kv == 0 for s in steps)
    assert [s.rollout_weight_version for s in steps] == ["1", "2"]
    assert all(len(b) == 256 and b.num_microbatches == [8] for b in batches)
    for s in steps:
        assert math.isclose(s.t_step, sum(s.phases().values()) + s.t_gap, rel_tol=1e-12)


def test_engines_that_do_not_receive_weights_sleep_at_level_1():
    from vime.runs.sim import build_sim_orchestrator
    from vime.sim.backends import build_sim_backends

    args = seed_args(num_rollout=1)
    backends = build_sim_backends(args, start=False)
    orch = build_sim_orchestrator(args, backends)
    orch.engines_receive_weights = False

    async def main() -> Any:
        await backends.start()
        return await orch.run()

    report = clock.run(main(), env=backends.env)
    assert report.steps[0].sleep_level == 1
    assert all(e.lifecycle.memory.value == "awake" for e in backends.engines)


def test_orchestration_imports_no_backend():
    """DESIGN.md: the orchestrator and the rollout never import vime.sim or vime.real; backends are passed in."""
    code = ("import sys, vime.orchestrator, vime.weight_sync, vime.rollout.generate, vime.rollout.data_source, "
            "vime.rollout.rm_hub, vime.rollout.filters, vime.rollout.batch_builder; "
            "print(sorted(m for m in sys.modules if m.startswith(('vime.sim', 'vime.real'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])})
    assert proc.stdout.strip() == "[]"


def test_trainer_extras_land_under_perf_train_or_memory():
    report = StepReport(rollout_id=0, t_begin=0.0, t_step=3.0,
                        train={"loss": 1.0, "extra": {"train_time": 2.0, "tokens_per_s": 5.0,
                                                      "memory/asleep_params_gib": 7.5}})
    m = report.metrics()
    assert (m["perf/train_time"], m["train/tokens_per_s"], m["memory/asleep_params_gib"]) == (2.0, 5.0, 7.5)
    assert "train/memory/asleep_params_gib" not in m
