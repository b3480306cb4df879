"""generate_rollout (seed steps 16–28) against a recording fake router, in virtual time."""

from __future__ import annotations

import functools

import pytest
from rollout_fakes import FakeRouter

from vime.config import defaults
from vime.errors import ConfigError
from vime.rollout.data_source import DataSource, SyntheticDataset
from vime.rollout.generate import Rollout, RolloutError
from vime.rollout.plugins import load_plugins
from vime.rollout.rm_hub import RewardHub, sim_reward
from vime.runs.loop import build_rollout
from vime.sim import clock
from vime.types import SampleStatus


def make_args(**changes):
    changes.setdefault("micro_batch_size", 1)  # small batches must still split over 4 DP ranks
    return defaults("train").replace(**changes)


def make_source(args, size=10_000):
    ds = SyntheticDataset(size, lambda i: 100 + (i * 37) % 300, seed=args.seed)
    return DataSource(ds, n_samples_per_prompt=args.n_samples_per_prompt, seed=args.seed)


def make_rollout(args, router, **kw):
    plugins = load_plugins(args)
    kw.setdefault("reward", RewardHub(args.data, seed=args.seed, rm_type="sim"))
    kw.setdefault("dynamic_filter", plugins.dynamic_filter)
    kw.setdefault("custom_generate", plugins.generate)
    return Rollout(args.rollout, router, num_engines=args.rollout_num_engines, seed=args.seed, progress=False, **kw)


def test_seed_rollout_collects_32_groups_of_8_numbered_as_the_seed():
    args = make_args()
    router = FakeRouter(length=lambda req: 3)
    source = make_source(args)
    out = clock.run(make_rollout(args, router).generate_rollout(0, source))
    assert len(out.groups) == 32 and all(len(g) == 8 for g in out.groups)
    samples = sorted(out.samples, key=lambda s: s.index)
    assert [s.index for s in samples] == list(range(256))
    assert sorted({s.group_index for s in samples}) == list(range(32))
    assert all(s.index // 8 == s.group_index for s in samples)
    # seed step 19: the wire params of a new sample; seed step 25: 3 tokens appended
    assert router.requests[0].sampling_params == {
        "max_tokens": 1024, "temperature": 1.0, "top_p": 1.0, "logprobs": 1, "top_k": -1,
        "skip_special_tokens": False, "spaces_between_special_tokens": False}
    assert len({id(r.sampling_params) for r in router.requests}) == 256  # copied per sample
    s = samples[0]
    assert s.response_length == 3 and s.loss_mask == [1, 1, 1] and s.rollout_log_probs == [-0.5] * 3
    assert s.weight_versions == ["1"] and s.status is SampleStatus.COMPLETED
    assert s.reward == sim_reward(args.seed, s.group_index, s.index)
    # per-sample session ids, not sent as a header with round_robin
    assert len({x.session_id for x in samples}) == 256
    assert all(r.session_id is None for r in router.requests)
    st = out.stats
    assert (st.kept_samples, st.generated_samples, st.dropped_groups, st.aborted_samples) == (256, 256, 0, 0)
    assert (st.response_tokens, st.prompt_tokens) == (3 * 256, sum(s.prompt_length for s in samples))
    assert st.prompt_tokens >= 100 * 256  # the synthetic prompts are 100-399 tokens long
    assert router.abort_calls == 0  # nothing left in flight: no abort (seed step 28)


def test_consistent_hash_sends_the_session_id():
    args = make_args(router_policy="consistent_hash", rollout_batch_size=4)
    router = FakeRouter()
    out = clock.run(make_rollout(args, router).generate_rollout(0, make_source(args)))
    sent = {r.session_id for r in router.requests}
    assert sent == {s.session_id for s in out.samples} and None not in sent


def test_semaphore_is_concurrency_times_engines():
    args = make_args(vllm_server_concurrency=3)  # 4 engines → 12 requests at most
    router = FakeRouter()
    clock.run(make_rollout(args, router).generate_rollout(0, make_source(args)))
    assert router.max_in_flight == 12


def test_dynamic_filter_drops_uniform_groups_refills_and_returns_aborted():
    args = make_args(dynamic_sampling_filter_path="check_reward_nonzero_std")
    # later groups take longer, so refills are still running when the target is met
    router = FakeRouter(duration=lambda req: 1.0 + int(req.request_id.split("-s")[1].split("-")[0]) // 8 * 0.01)
    source = make_source(args)
    out = clock.run(make_rollout(args, router).generate_rollout(0, source))
    st = out.stats
    n = args.n_samples_per_prompt
    assert st.kept_groups == 32
    for g in out.groups:
        assert len({s.reward for s in g}) == 2  # every kept group has reward variance
    assert st.dropped_groups > 0 and sum(st.drop_reasons.values()) == st.dropped_groups
    assert st.submitted_groups == 32 + 32 * ((st.submitted_groups - 32) // 32)  # refills of over_sampling size
    assert st.submitted_groups > 32
    # every submitted sample is accounted for: kept, dropped, or returned to the data source
    assert st.kept_samples + st.dropped_samples + st.returned_groups * n == st.submitted_groups * n
    assert st.returned_groups > 0 and st.aborted_samples > 0 and router.abort_calls == 1
    assert len(source.buffer) == st.returned_groups
    returned = [s for g in source.buffer for s in g]
    assert all(s.status is SampleStatus.PENDING and s.response_length == 0 and s.reward is None
               for s in returned)
    # returned groups are served first on the next call, with their numbering
    first = source.get_samples(1)[0]
    assert first[0].group_index == returned[0].group_index


def test_a_filter_that_never_passes_stops_with_a_clear_error():
    args = make_args(rollout_batch_size=2, over_sampling_batch_size=2)
    router = FakeRouter()
    rollout = make_rollout(args, router, dynamic_filter=lambda g: False, max_oversubmit=4)
    with pytest.raises(RolloutError, match="dynamic filter"):
        clock.run(rollout.generate_rollout(0, make_source(args)))


def test_failed_requests_are_retried_and_counted():
    args = make_args(rollout_batch_size=4)
    failed_once: set[str] = set()

    def fail(req):
        base = req.request_id.split("-a")[0]
        if base.endswith("s5") and base not in failed_once:
            failed_once.add(base)
            return "engine died"
        return None

    router = FakeRouter(fail=fail)
    out = clock.run(make_rollout(args, router).generate_rollout(0, make_source(args)))
    assert out.stats.request_errors == 1 and out.stats.failed_samples == 0
    assert out.stats.kept_samples == 32
    retried = [r for r in router.requests if r.request_id == "r0-s5-a1"]
    assert len(retried) == 1
    sample5 = next(s for s in out.samples if s.index == 5)
    assert sample5.status is SampleStatus.COMPLETED and sample5.response_length == 4


def test_a_sample_failing_every_attempt_stops_the_rollout_and_returns_its_groups():
    args = make_args(rollout_batch_size=4)
    router = FakeRouter(fail=lambda req: "engine died" if "-s9" in req.request_id else None,
                        duration=lambda req: 1.0 + (0.5 if "-s9" in req.request_id else 0.0))
    source = make_source(args)
    with pytest.raises(RolloutError) as info:
        clock.run(make_rollout(args, router).generate_rollout(0, source))
    msg = str(info.value)
    assert "sample 9" in msg and "e-bad" in msg and "engine died" in msg and "3 attempts" in msg
    assert "returned to the data source" in msg
    # no sample is lost: the failed group (and any other unfinished one) is back in the source
    assert 1 in {g[0].group_index for g in source.buffer}
    assert all(s.status is SampleStatus.PENDING for g in source.buffer for s in g)


def test_an_engine_ignoring_abort_does_not_hang_the_rollout():
    args = make_args(rollout_batch_size=2, over_sampling_batch_size=4)
    router = FakeRouter(duration=lambda req: 1.0 if int(req.request_id.split("-s")[1]) < 16 else 1e6,
                        ignore_abort=True)
    source = make_source(args)
    out = clock.run(make_rollout(args, router, abort_timeout_s=5.0).generate_rollout(0, source))
    assert out.stats.kept_groups == 2 and out.stats.returned_groups == 2
    assert len(source.buffer) == 2


def test_group_rm_scores_each_group_once():
    args = make_args(rollout_batch_size=3, group_rm=True)
    calls = []

    async def group_reward(a, samples):
        calls.append([s.index for s in samples])
        return [float(i % 2) for i in range(len(samples))]

    reward = RewardHub(args.data, seed=args.seed, custom=functools.partial(group_reward, args))
    out = clock.run(make_rollout(args, FakeRouter(), reward=reward).generate_rollout(0, make_source(args)))
    assert len(calls) == 3 and all(len(c) == 8 for c in calls)
    assert [s.reward for s in out.groups[0]] == [0.0, 1.0] * 4


async def echo_generate(rollout, sample, sampling_params):
    """A custom generate function (multi-turn style): two requests, the second turn not trainable."""
    from vime.algo.sampling import build_inference_sampling_params

    wire = build_inference_sampling_params({**sampling_params, "max_new_tokens": 2})
    first = await rollout.generate_once(sample, wire)
    sample.append_response_tokens(first.token_ids, first.log_probs, meta_info=first.meta_info())
    second = await rollout.generate_once(sample, wire)
    sample.append_response_tokens(second.token_ids, second.log_probs, trainable=False,
                                  meta_info=second.meta_info())
    return sample


def test_custom_generate_function_by_dotted_path():
    args = make_args(rollout_batch_size=2, custom_generate_function_path="test_generate.echo_generate")
    out = clock.run(make_rollout(args, FakeRouter()).generate_rollout(0, make_source(args)))
    s = out.samples[0]
    assert s.response_length == 4 and s.loss_mask == [1, 1, 0, 0]


def test_bad_custom_paths_name_the_flag():
    with pytest.raises(ConfigError, match="--custom-generate-function-path"):
        make_rollout(make_args(custom_generate_function_path="no_such_module.fn"), FakeRouter())
    with pytest.raises(ConfigError, match="--dynamic-sampling-filter-path"):
        make_rollout(make_args(dynamic_sampling_filter_path="vime.rollout.filters.nope"), FakeRouter())


def test_progress_bar_quiet_under_json(capsys):
    args = make_args(rollout_batch_size=2, json=True)
    rollout = build_rollout(args, FakeRouter(), num_engines=4, rm_type="sim")  # what both commands build
    assert rollout.progress is False
    clock.run(rollout.generate_rollout(0, make_source(args)))
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_progress_bar_counts_samples(capsys):
    args = make_args(rollout_batch_size=2)
    rollout = make_rollout(args, FakeRouter())
    rollout.progress = True
    clock.run(rollout.generate_rollout(0, make_source(args)))
    err = capsys.readouterr().err
    assert "rollout 0" in err and "/16 [" in err and "sample/s" in err  # total counted in samples


def test_same_seed_same_rollout():
    def once():
        args = make_args(dynamic_sampling_filter_path="check_reward_nonzero_std", rollout_batch_size=8)
        router = FakeRouter(length=lambda req: 1 + len(req.token_ids) % 7,
                            duration=lambda req: 0.5 + (len(req.token_ids) % 13) / 10)
        out = clock.run(make_rollout(args, router).generate_rollout(0, make_source(args)))
        return ([(s.index, s.reward, s.response_length) for s in out.samples], out.stats.as_dict())

    assert once() == once()


def test_a_failing_abort_is_recorded_and_the_rollout_still_ends():
    from vime.errors import EngineError

    class BrokenAbort(FakeRouter):
        async def abort_all(self):
            await super().abort_all()
            raise EngineError("e3", "abort", "connection refused")

    args = make_args(rollout_batch_size=2, over_sampling_batch_size=4)
    router = BrokenAbort(duration=lambda req: 1.0 if int(req.request_id.split("-s")[1]) < 16 else 50.0)
    source = make_source(args)
    out = clock.run(make_rollout(args, router).generate_rollout(0, source))
    assert out.stats.kept_groups == 2 and out.stats.returned_groups == 2
    assert any("connection refused" in e for e in out.stats.engine_errors)
