"""Asynchronous RL on the simulator (issue 22): call sequences of one-step-off and fully-async, the staleness bound, sample accounting, determinism, the flags' rules."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_orchestrator import CallLog, Recording, compress, publish

from vime.async_loop import AsyncStepReport
from vime.config import defaults, parse_args
from vime.errors import ConfigError
from vime.rollout.producer import CROSSED_UPDATE
from vime.runs.document import build_document
from vime.runs.sim import build_sim_orchestrator, sim_data_source, simulate
from vime.sim import clock
from vime.sim.backends import build_sim_backends

SPLIT = {"colocate": False, "rollout_num_gpus": 8}


def async_args(mode: str, **changes: Any) -> Any:
    changes.setdefault("num_rollout", 3)
    return defaults("train").replace(backend="sim", async_mode=mode, **SPLIT, **changes)


class GenerateLog(Recording):
    """Recording that keeps each generate's request id (when it went out, and which response it continues)."""

    def __getattr__(self, name: str) -> Any:
        if name != "generate":
            return super().__getattr__(name)
        target = self._target.generate

        async def generate(request: Any) -> Any:
            self._log.append(("router", "generate", (request.request_id,)))
            return await target(request)
        return generate


def run_logged(args: Any, counts: dict[str, int] | None = None) -> tuple[Any, list[tuple[Any, ...]], list[Any], dict[str, int]]:
    """Run `args` with every protocol call, the orchestrator's notes and the data source's traffic in one log."""
    log: list[tuple[Any, ...]] = []
    batches: list[Any] = []
    counts = counts if counts is not None else {}
    counts.update(taken=0, returned=0)
    backends = build_sim_backends(args, start=False)
    source = sim_data_source(args, backends)
    get, add = source.get_samples, source.add_samples

    def get_samples(n: int) -> Any:
        log.append(("data_source", "get_samples", (n,)))
        counts["taken"] += n
        return get(n)

    def add_samples(groups: Any) -> None:
        counts["returned"] += len(groups)
        add(groups)

    source.get_samples, source.add_samples = get_samples, add_samples  # type: ignore[method-assign]
    orch = build_sim_orchestrator(args, backends, engines=[Recording(e, "engines", log) for e in backends.engines],
                                  router=GenerateLog(backends.router, "router", log),
                                  trainer=Recording(backends.trainer, "trainer", log, batches),
                                  observers=[CallLog(log)], data_source=source)

    async def main() -> Any:
        await backends.start()
        return await orch.run()

    try:
        report = clock.run(main(), env=backends.env)
    finally:
        counts["trained"] = len(batches)  # batches trained, also when the run stopped with an error
    return report, log, batches, counts


def controls(log: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """The log without the rollout's traffic (generates, data source), compressed."""
    return compress([e for e in log if e[1] not in ("generate", "get_samples")])


def test_one_step_off_call_sequence_overlaps_rollout_k_plus_1_with_train_k():
    args = async_args("one-step-off")
    report, log, batches, _ = run_logged(args)
    buckets, bb = report.startup.buckets, args.update_weight_buffer_size
    adm = ("rollout_manager", "pause_rollout_admission", (), 1)
    res = ("rollout_manager", "resume_rollout_admission", (), 1)
    health = ("engines", "health", (), 4)
    done = ("rollout_manager", "training_completed", (), 1)
    expected = [*publish(1, buckets, bb), ("rollout_manager", "training_ready", (), 1),  # no sleep, no wake: GPUs apart
                health, ("trainer", "train", (0, batches[0]), 1), done,
                health, adm, *publish(2, buckets, bb), res, ("trainer", "train", (1, batches[1]), 1), done,
                health, adm, *publish(3, buckets, bb), res, ("trainer", "train", (2, batches[2]), 1), done,
                adm, *publish(4, buckets, bb)]  # the last step publishes its own weights; no rollout follows
    assert controls(log) == expected
    # rollout k+1's requests go out while the trainer trains on rollout k, and none of them after that train
    for k in (0, 1):
        train = log.index(("trainer", "train", (k, batches[k])))
        trained = [i for i, e in enumerate(log) if e[1] == "training_completed"][k]
        ids = [i for i, e in enumerate(log) if e[1] == "generate" and e[2][0].startswith(f"r{k + 1}-")]
        assert ids and min(ids) > train - 1 and any(i < trained for i in ids)
        finish = max(i for i, e in enumerate(log) if e[:2] == ("engines", "finish_weight_update") and e[2] == (k + 2,))
        assert max(ids) < finish  # rollout k+1 was over before version k+2 was published
    # every batch after the first is exactly one version old, the first is fresh
    assert [sorted({v for vs in b.weight_versions for v in vs}) for b in batches] == [["1"], ["1"], ["2"]]
    steps = report.steps
    assert all(isinstance(s, AsyncStepReport) for s in steps)
    assert [(s.trainer_version, s.staleness_max, s.staleness_mean) for s in steps] == [(1, 0, 0.0), (2, 1, 1.0), (3, 1, 1.0)]
    assert all(s.partial_share == 0.0 for s in steps)


def _between(log: list[tuple[Any, ...]], start: str, end: str) -> list[list[tuple[Any, ...]]]:
    """The stretches of the log from each `start` note to the next `end` note."""
    out, cur = [], None
    for e in log:
        if e[1] == start:
            cur = []
        elif e[1] == end and cur is not None:
            out.append(cur)
            cur = None
        elif cur is not None:
            cur.append(e)
    return out


def test_fully_async_call_sequence_pauses_admission_around_each_update_and_resumes_partial_requests():
    args = async_args("fully-async", num_rollout=4, max_staleness=2)
    report, log, batches, _ = run_logged(args)
    buckets, bb = report.startup.buckets, args.update_weight_buffer_size
    adm = ("rollout_manager", "pause_rollout_admission", (), 1)
    res = ("rollout_manager", "resume_rollout_admission", (), 1)
    health = ("engines", "health", (), 4)
    done = ("rollout_manager", "training_completed", (), 1)
    expected = [*publish(1, buckets, bb), ("rollout_manager", "training_ready", (), 1)]
    for k in range(4):
        expected += [health, ("trainer", "train", (k, batches[k]), 1), done, adm]
        if k < 3:
            expected += [*publish(k + 2, buckets, bb), res]
        else:  # the last update: the producer first stops, aborting what still runs, and hands the rest back
            expected += publish(k + 2, buckets, bb)
    assert [e for e in controls(log) if e[1] != "abort_all"] == expected
    aborts = [i for i, e in enumerate(log) if e[1] == "abort_all"]
    last_pause = max(i for i, e in enumerate(log) if e[1] == "pause_rollout_admission")
    assert all(i > last_pause for i in aborts) and len(aborts) <= 1
    # admission closed from step 44 to step 53: no group taken from the data source while the weights change
    paused = _between(log, "pause_rollout_admission", "resume_rollout_admission")
    assert len(paused) == 3 and not any(e[1] == "get_samples" for stretch in paused for e in stretch)
    # …and admits again as soon as step 53 reopens it (the new version lets one more batch in), while the engines
    # keep generating through the train steps
    reopened = _between(log, "resume_rollout_admission", "train")
    assert len(reopened) == 3 and all(any(e[1] == "get_samples" for e in stretch) for stretch in reopened)
    assert all(s.engine_idle_share < 0.5 for s in report.steps)
    # abort-resume: requests aborted by an update are re-sent, continuing their response (ID@N)
    resumed = [e[2][0] for stretch in paused for e in stretch if e[1] == "generate" and "@" in e[2][0]]
    assert resumed
    spans = [vs for b in batches for vs in b.weight_versions if len(vs) > 1]
    assert spans and all(vs == sorted(vs, key=int) for vs in spans)  # one version per span, in order
    partial = sum(s.partial_share * s.num_samples for s in report.steps)
    assert partial >= len(spans)  # every multi-version response crossed an update


@pytest.mark.parametrize("staleness", [1, 2])
def test_fully_async_never_trains_a_sample_older_than_the_bound(staleness: int):
    args = async_args("fully-async", num_rollout=6, max_staleness=staleness)
    report, _, batches, _ = run_logged(args)
    lags = []
    for step, batch in zip(report.steps, batches, strict=True):
        oldest = [min(int(v) for v in vs) for vs in batch.weight_versions]
        lags += [step.trainer_version - v for v in oldest]
        assert step.staleness_max <= staleness and max(step.trainer_version - v for v in oldest) <= step.staleness_max
    assert max(lags) == staleness  # the bound is reached, so it is what holds the lag down
    assert [s.trainer_version for s in report.steps] == list(range(1, 7))


def test_fully_async_keep_freezes_requests_across_updates_without_flushing():
    args = async_args("fully-async", num_rollout=4, partial_rollout="keep")
    assert args.flush_cache_interval == 0
    report, log, batches, _ = run_logged(args)
    pauses = [e[2] for e in log if e[:2] == ("engines", "pause")]
    assert pauses[:4] == [("abort",)] * 4 and set(pauses[4:]) == {("keep",)}  # only the first publication flushes
    assert sum(1 for e in log if e[1] == "flush_cache") == 4
    assert not any(e[1] == "generate" and "@" in e[2][0] for e in log)  # nothing aborted, nothing resumed
    assert all(len(vs) == 1 for b in batches for vs in b.weight_versions)
    assert sum(s.partial_share for s in report.steps) > 0  # frozen across an update, finished under the new weights


@pytest.mark.parametrize("mode", ["one-step-off", "fully-async"])
def test_every_sample_taken_is_trained_dropped_or_handed_back(mode: str):
    args = async_args(mode, num_rollout=4, dynamic_sampling_filter_path="check_reward_nonzero_std",
                      **({"max_staleness": 1} if mode == "fully-async" else {}))
    report, _, batches, counts = run_logged(args)
    trained = sum(len(set(b.group_indices)) for b in batches)
    dropped = sum(s.rollout["dropped_groups"] for s in report.steps)
    assert dropped > 0 and trained == 4 * 32
    returned = sum(s.rollout["returned_groups"] for s in report.steps)
    assert counts["taken"] == trained + dropped + counts["returned"] and returned == counts["returned"]
    indices = [i for b in batches for i in b.sample_indices]
    assert len(indices) == len(set(indices))  # no sample trained twice


def test_fully_async_regenerates_stale_groups_and_loses_none():
    """A long-tailed response length: the longest groups finish after more updates than --max-staleness allows."""
    args = async_args("fully-async", num_rollout=6, response_length="lognormal:4.5,2.0")
    report, _, batches, counts = run_logged(args)
    stale = sum(s.stale_groups for s in report.steps)
    assert stale > 0  # groups that finished late were handed back rather than trained too stale
    assert counts["taken"] == sum(len(set(b.group_indices)) for b in batches) + counts["returned"]


def reward_failing_on_group_40(args: Any, sample: Any) -> float:
    """A --custom-rm-path reward whose server fails on one group (read by the test below)."""
    if sample.group_index == 40:
        raise RuntimeError("reward server down for group 40")
    return float((sample.index or 0) % 2)


def test_an_error_in_the_producer_stops_the_run_and_hands_every_group_back():
    args = async_args("fully-async", num_rollout=4, custom_rm_path="test_async.reward_failing_on_group_40")
    counts: dict[str, int] = {}
    with pytest.raises(RuntimeError, match="group 40"):
        run_logged(args, counts)
    trained = 32 * counts.pop("trained", 0)
    assert counts["taken"] > 40 and counts["taken"] == counts["returned"] + trained


@pytest.mark.parametrize("mode", ["one-step-off", "fully-async"])
def test_same_seed_same_reports_another_seed_differs(mode: str):
    def doc(seed: int) -> str:
        return json.dumps(build_document(simulate(async_args(mode, seed=seed)), deterministic=True), sort_keys=True)
    a, b, c = doc(1), doc(1), doc(2)
    assert a == b and a != c


def test_document_reports_the_asynchrony_and_the_sums_hold():
    sim = simulate(async_args("fully-async", num_rollout=4))
    doc = build_document(sim, deterministic=True)
    a = doc["async"]
    assert a["mode"] == "fully-async" and a["all"]["steps"] == 4 and a["warmup_steps"] == 2 and a["steady"]["steps"] == 2
    assert 0 < a["all"]["engine_idle_share"] < 1 and 0 < a["all"]["trainer_idle_share"] < 1
    assert a["all"]["samples_per_s"] == pytest.approx(4 * 256 / sum(s.t_step for s in sim.steps), rel=1e-5)
    for s in sim.steps:
        assert s.t_step == pytest.approx(sum(s.phases().values()) + s.t_gap, rel=1e-12)
        m = s.metrics()
        assert m["async/staleness_max"] == s.staleness_max and "perf/engine_idle_share" in m
    assert "async" not in build_document(simulate(defaults("simulate")), deterministic=True)


def test_partial_metadata_does_not_outlive_a_hand_back():
    from vime.rollout.producer import ADMIT_VERSION

    sim = simulate(async_args("fully-async", num_rollout=3))
    for group in sim.orchestrator.data_source.buffer:
        for s in group:
            assert not ({ADMIT_VERSION, CROSSED_UPDATE, "started"} & set(s.metadata)) and s.response_length == 0


@pytest.mark.parametrize("argv, words", [
    (["--async-mode", "one-step-off"], ["--no-colocate", "--async-mode sync"]),
    (["--async-mode", "fully-async", "--no-colocate", "--rollout-num-gpus", "8", "--offload-rollout"],
     ["--offload-rollout", "--async-mode sync"]),
    (["--max-staleness", "2"], ["--max-staleness", "fully-async"]),
    (["--partial-rollout", "keep", "--async-mode", "one-step-off", "--no-colocate", "--rollout-num-gpus", "8"],
     ["--partial-rollout", "fully-async"]),
    (["--async-mode", "fully-async", "--no-colocate", "--rollout-num-gpus", "8", "--partial-rollout", "keep",
      "--flush-cache-interval", "2"], ["--flush-cache-interval", "keep"]),
    (["--async-mode", "fully-async", "--no-colocate", "--rollout-num-gpus", "8", "--flush-cache-interval", "0"],
     ["abort-resume", "--flush-cache-interval"]),
    (["--async-mode", "one-step-off", "--no-colocate", "--rollout-num-gpus", "8", "--eval-interval", "2"],
     ["--eval-interval", "--async-mode sync"]),
    (["--async-mode", "fully-async", "--no-colocate", "--rollout-num-gpus", "8", "--max-staleness", "-1"],
     ["--max-staleness"]),
    (["--async-mode", "fully-async", "--no-colocate", "--rollout-num-gpus", "8", "--over-sampling-batch-size", "64"],
     ["--over-sampling-batch-size", "one-step-off"]),
    (["--async-mode", "fully-async", "--no-colocate", "--rollout-num-gpus", "8", "--custom-generate-function-path",
      "test_async.reward_failing_on_group_40"], ["--custom-generate-function-path", "one-step-off"]),
])
def test_async_flags_are_checked_at_parse_time(argv: list[str], words: list[str]):
    with pytest.raises(ConfigError) as e:
        parse_args(argv, command="simulate")
    assert "\n" not in str(e.value) and all(w in str(e.value) for w in words)


@pytest.mark.parametrize("mode", ["one-step-off", "fully-async"])
def test_the_real_backend_takes_the_async_modes_with_engines_apart(mode: str):
    args = parse_args(["--async-mode", mode, "--no-colocate", "--rollout-num-gpus", "8", "--dry-run"], command="train")
    assert args.backend == "real" and args.async_mode == mode and args.update_weight_mode == "disk"
    with pytest.raises(ConfigError, match="--no-colocate"):
        parse_args(["--async-mode", mode, "--dry-run"], command="train")


def test_the_simulated_engine_continues_a_resumed_response_where_the_whole_would_end():
    from vime.protocols import GenerateRequest
    from vime.sim.engine.server import resumed_tokens

    assert (resumed_tokens("a3-s17@120"), resumed_tokens("a3-s17"), resumed_tokens(None), resumed_tokens("x@y")) == \
        (120, 0, 0, 0)
    args = async_args("fully-async")
    backends = build_sim_backends(args, start=False)
    engine = backends.engines[0]

    async def main() -> list[int]:
        await backends.start()
        prompt = list(range(1, 65))
        whole = await engine.generate(GenerateRequest(prompt, {"max_tokens": 1024}, request_id="a0-s1"))
        n = len(whole.token_ids)
        done = n // 2
        rest = await engine.generate(GenerateRequest(prompt + list(whole.token_ids[:done]), {"max_tokens": 1024 - done},
                                                     request_id=f"a0-s1@{done}"))
        other = await engine.generate(GenerateRequest(prompt, {"max_tokens": 1024}, request_id="a1-s1"))
        return [n, done, len(rest.token_ids), len(other.token_ids)]

    n, done, rest, other = clock.run(main(), env=backends.env)
    assert n > 2 and rest == n - done  # the two spans make the response the uninterrupted request gets
    assert other != n  # another admission of the sample draws its own length


def test_a_sweep_over_the_modes_ranks_them_by_their_steady_state():
    from vime.runs.sweep import parse_sweep, simulate_point

    base = parse_args(["--no-colocate", "--rollout-num-gpus", "8", "--num-rollout", "4"], command="simulate")
    points = parse_sweep(["async-mode=sync,one-step-off,fully-async"])
    assert [p["async_mode"] for p in points] == ["sync", "one-step-off", "fully-async"]
    results = {p["async_mode"]: simulate_point(base, p) for p in points}
    assert all(r.valid and r.fits for r in results.values())
    for mode, warmup in (("sync", 0), ("one-step-off", 1), ("fully-async", 2)):
        steps = simulate(base.replace(async_mode=mode)).steps[warmup:]
        assert results[mode].t_step == pytest.approx(sum(s.t_step for s in steps) / len(steps), abs=1e-6)
        assert "--async-mode" in results[mode].argv or mode == "sync"
