"""The DP schedule (seed step 31): [8] for the seed, [2, 2, 2, 2] with 4 steps, balance and errors."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vime.algo.dp_schedule import build_dp_schedule
from vime.config import parse_args
from vime.errors import ConfigError


def lengths(n: int) -> list[int]:
    return [200 + (i * 131) % 1024 for i in range(n)]


def schedule_for(argv: list[str]):  # type: ignore[no-untyped-def]
    args = parse_args(argv, command="simulate")
    return build_dp_schedule(lengths(args.samples_per_rollout), dp_size=args.dp_size,
                             micro_batch_size=args.micro_batch_size, global_batch_size=args.global_batch_size)


def test_seed_one_step_eight_microbatches_per_rank() -> None:
    s = schedule_for([])
    assert s.num_microbatches == [8]
    assert s.global_batch_sizes == [256]
    assert s.dp_size == 4 and s.num_steps == 1
    assert [len(p) for p in s.partitions] == [64] * 4  # seed step 37: 64 rows per rank
    assert all(len(mb) == 8 for rank in s.micro_batch_indices for mb in rank)


def test_four_steps() -> None:
    s = schedule_for(["--num-steps-per-rollout", "4"])
    assert s.num_microbatches == [2, 2, 2, 2]
    assert s.global_batch_sizes == [64] * 4
    # each step only uses its own consecutive 64 rows
    for rank in range(4):
        for step in range(4):
            rows = s.partitions[rank][step * 16:(step + 1) * 16]
            assert all(step * 64 <= r < (step + 1) * 64 for r in rows)


def test_balance_beats_contiguous_on_skewed_lengths() -> None:
    skewed = [4000] * 8 + [100] * 248  # the long samples fill one contiguous micro-batch
    bal = build_dp_schedule(skewed, dp_size=4, micro_batch_size=8, global_batch_size=256)
    flat = build_dp_schedule(skewed, dp_size=4, micro_batch_size=8, global_batch_size=256, balance=False)

    def spread(s):  # type: ignore[no-untyped-def]
        sums = [sum(skewed[i] for i in p) for p in s.partitions]
        return max(sums) - min(sums)

    assert spread(bal) == 0
    assert spread(flat) > 0
    assert sorted(i for p in flat.partitions for i in p) == list(range(256))


@pytest.mark.parametrize(("n", "kw", "fragment"), [
    (250, dict(dp_size=4, micro_batch_size=8, global_batch_size=256), "multiple"),
    (256, dict(dp_size=4, micro_batch_size=3, global_batch_size=256), "--micro-batch-size 3"),
    (256, dict(dp_size=3, micro_batch_size=8, global_batch_size=256), "DP 3"),
    (0, dict(dp_size=4, micro_batch_size=8, global_batch_size=256), "0 samples"),
    (8, dict(dp_size=0, micro_batch_size=8, global_batch_size=8), "dp_size"),
])
def test_errors(n: int, kw: dict[str, int], fragment: str) -> None:
    with pytest.raises(ConfigError, match=fragment):
        build_dp_schedule([10] * n, **kw)


@st.composite
def schedules(draw):  # type: ignore[no-untyped-def]
    dp = draw(st.integers(1, 6))
    mbs = draw(st.integers(1, 5))
    per_step_mbs = draw(st.integers(1, 4))
    gbs = dp * mbs * per_step_mbs
    steps = draw(st.integers(1, 4))
    lens = draw(st.lists(st.integers(1, 5000), min_size=gbs * steps, max_size=gbs * steps))
    return lens, dp, mbs, gbs


@settings(max_examples=200, deadline=None)
@given(case=schedules(), balance=st.booleans())
def test_property_schedule_invariants(case, balance: bool) -> None:  # type: ignore[no-untyped-def]
    lens, dp, mbs, gbs = case
    s = build_dp_schedule(lens, dp_size=dp, micro_batch_size=mbs, global_batch_size=gbs, balance=balance)
    steps = len(lens) // gbs
    # every row exactly once
    assert sorted(i for p in s.partitions for i in p) == list(range(len(lens)))
    # same micro-batch count per rank per step, and micro-batches tile each rank's rows once
    assert s.num_microbatches == [gbs // (mbs * dp)] * steps
    for rank in range(dp):
        assert len(s.micro_batch_indices[rank]) == sum(s.num_microbatches)
        assert [i for mb in s.micro_batch_indices[rank] for i in mb] == list(range(len(s.partitions[rank])))
        assert all(len(mb) == mbs for mb in s.micro_batch_indices[rank])
    # balanced: per step, rank token sums differ by at most the longest row of that step
    if balance:
        per_rank = gbs // dp
        for step in range(steps):
            sums = [sum(lens[i] for i in s.partitions[r][step * per_rank:(step + 1) * per_rank]) for r in range(dp)]
            longest = max(lens[step * gbs:(step + 1) * gbs])
            assert max(sums) - min(sums) <= longest
    # deterministic
    assert s == build_dp_schedule(lens, dp_size=dp, micro_batch_size=mbs, global_batch_size=gbs, balance=balance)
