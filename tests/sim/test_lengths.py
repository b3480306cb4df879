"""Tests of the seeded length distributions: determinism per key, caps, shapes, traces and their errors."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from vime.config import parse_length_spec
from vime.errors import ConfigError
from vime.sim.lengths import LengthDistribution, LengthSampler, make_distribution, unit_hash


def test_same_key_same_length_whatever_the_order() -> None:
    a = LengthSampler("lognormal:6.0,0.8", seed=3)
    b = LengthSampler("lognormal:6.0,0.8", seed=3)
    keys = [f"sample-{i}" for i in range(200)]
    forward = [a.response(k, 4096) for k in keys]
    backward = [b.response(k, 4096) for k in reversed(keys)][::-1]
    assert forward == backward
    assert len({d.length for d in forward}) > 100  # not constant


def test_seed_changes_the_draws() -> None:
    keys = [f"s{i}" for i in range(50)]
    a = [LengthSampler("uniform:1,1000", seed=1).response(k, 2000).length for k in keys]
    b = [LengthSampler("uniform:1,1000", seed=2).response(k, 2000).length for k in keys]
    assert a != b


def test_cap_gives_length_otherwise_stop() -> None:
    s = LengthSampler("fixed:500")
    assert (s.response("k", 1000).length, s.response("k", 1000).finish_reason) == (500, "stop")
    assert (s.response("k", 300).length, s.response("k", 300).finish_reason) == (300, "length")
    assert s.response("k", 500).finish_reason == "length"  # reaching max_tokens is "length"
    with pytest.raises(ConfigError):
        s.response("k", 0)


def test_uniform_bounds_and_spread() -> None:
    d = make_distribution("uniform:10,20")
    values = [d.draw(unit_hash("u", i)) for i in range(2000)]
    assert min(values) == 10 and max(values) == 20
    assert set(values) == set(range(10, 21))


def test_lognormal_median_and_default_spec() -> None:
    mu, sigma = math.log(400), 0.6
    d = make_distribution(f"lognormal:{mu},{sigma}")
    values = [d.draw(unit_hash("ln", i)) for i in range(4000)]
    assert statistics.median(values) == pytest.approx(400, rel=0.05)
    # The capped mean is below the cap and below the uncapped mean.
    assert d.mean(cap=1024) < d.mean() and d.mean(cap=1024) < 1024


def test_lognormal_clip_share_runs_to_the_cap_and_the_rest_keeps_its_shape() -> None:
    """lognormal:MU,SIGMA,CLIP: a CLIP share of responses is cut at the cap (finish "length"), the others are the
    lognormal's body (its median unchanged), so a run's truncation ratio and mean can both be matched."""
    mu, sigma = math.log(400), 0.5
    sampler = LengthSampler(f"lognormal:{mu},{sigma},0.05", seed=7)
    draws = [sampler.response(f"k{i}", 8192) for i in range(4000)]
    cut = [d for d in draws if d.finish_reason == "length"]
    assert len(cut) / len(draws) == pytest.approx(0.05, abs=0.012)
    assert all(d.length == 8192 for d in cut)
    body = [d.length for d in draws if d.finish_reason == "stop"]
    assert statistics.median(body) == pytest.approx(400, rel=0.05)
    clipped, plain = make_distribution(f"lognormal:{mu},{sigma},0.05"), make_distribution(f"lognormal:{mu},{sigma}")
    assert clipped.mean(cap=8192) == pytest.approx(0.05 * 8192 + 0.95 * plain.mean(cap=8192), rel=0.02)
    assert str(parse_length_spec("lognormal:6,0.5,0.05")) == "lognormal:6,0.5,0.05"
    for bad in ("lognormal:6,0.5,1", "lognormal:6,0.5,-0.1", "lognormal:6,0.5,nan", "lognormal:6,0.5,0.1,2"):
        with pytest.raises(ConfigError, match="--response-length"):
            parse_length_spec(bad)


def test_accepts_config_length_spec_objects() -> None:
    spec = parse_length_spec("uniform:5,7", cap=7)
    s = LengthSampler(spec, spec, seed=0)
    assert 5 <= s.response("x", 100).length <= 7
    assert 5 <= s.prompt("x", cap=6) <= 6


def test_trace_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "lengths.jsonl"
    path.write_text("\n".join([json.dumps({"response_length": 10}), json.dumps({"completion_tokens": 20}),
                               "30", ""]), encoding="utf-8")
    d = make_distribution(f"trace:{path}")
    assert d.values == (10, 20, 30)
    draws = {d.draw(unit_hash("t", i)) for i in range(300)}
    assert draws == {10, 20, 30}
    s = LengthSampler(f"trace:{path}", seed=1)
    assert s.response("a", 15).length in (10, 15)


def test_trace_with_named_field(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps({"n": 7, "length": 99}) + "\n", encoding="utf-8")
    assert make_distribution({"kind": "trace", "path": f"{path}#n"}).values == (7,)


@pytest.mark.parametrize(("content", "match"), [
    ("not json\n", "not JSON"),
    (json.dumps({"other": 3}) + "\n", "no positive length"),
    ("-4\n", "no positive length"),
    ("\n", "empty"),
])
def test_bad_traces_say_what_is_wrong(tmp_path: Path, content: str, match: str) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ConfigError, match=match):
        make_distribution(f"trace:{path}")


def test_missing_trace_file() -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        make_distribution("trace:/nonexistent/lengths.jsonl")


def test_invalid_distributions() -> None:
    with pytest.raises(ConfigError):
        LengthDistribution("uniform", (5, 2))
    with pytest.raises(ConfigError):
        LengthDistribution("lognormal", (1.0, 0.0))
    with pytest.raises(ConfigError):
        make_distribution("gamma:1,2")


def test_auto_key_distinguishes_repeats_of_one_prompt() -> None:
    s = LengthSampler("uniform:1,100000", seed=0)
    keys = [s.auto_key([1, 2, 3]) for _ in range(8)]
    assert len(set(keys)) == 8
    assert s.auto_key([4, 5]) != keys[0]
    assert LengthSampler("fixed:1").auto_key([1, 2, 3]) == keys[0]  # same prompt, first time
