"""bench/decode_roofline.py: vLLM's dense decode at 64-512 requests against the engine model's GEMM roofline."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from vime.errors import ConfigError
from vime.sim.engine import EngineSettings
from vime.sim.engine.costs import IterationModel
from vime.sim.hardware import HardwareSpec, load_hardware
from vime.sim.models import load_model
from vime.testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
dr = load_script(ROOT / "bench" / "decode_roofline.py", "vime_bench_decode_roofline")
cc = load_script(ROOT / "bench" / "compare_calibration.py", "vime_bench_compare_calibration")


@pytest.fixture(scope="module")
def table() -> list[dict]:
    return dr.bench_rows()


def test_the_committed_roofline_holds_the_rows_it_was_not_chosen_on_and_fits_better_than_the_hard_max(
        table: list[dict]) -> None:
    """The profiles' p-norm, chosen on the H200's first 14B/32B rows, predicts the rows held out (the H100's dense
    8B/14B/32B and both chips' later grids to 512 requests, B >= 64) within 12 %, rms under 6 %, each row as vLLM
    counts its step (the mean inter-token latency of the row as vLLM schedules it). The joint hard max that came
    before, compared the same way, holds out as well (rms 3.7 %: session 31's 24 % misses were pure decode means set
    against latencies), but on the rows it was fitted to it is more than twice as far off and 10 %+ short on the 32B
    at 256 requests, where the p-norm is within 5 %."""
    held = [r for r in table if dr.held_out(r)]
    assert len(held) == 21
    p = load_hardware("H100-SXM-80G-measured").efficiency.gemm_roofline_p
    assert p == load_hardware("H200-141G-measured").efficiency.gemm_roofline_p > 1.0
    now = dr.predict(held, "p", p)
    assert max(abs(e) for e in now) < 12.0 and dr.rms(now) < 6.0
    fit = [r for r in table if dr.fitted(r)]
    fit_now, fit_joint = dr.predict(fit, "p", p), dr.predict(fit, "joint", 0.0)
    assert dr.rms(fit_now) < 4.0 and dr.rms(fit_joint) > 2 * dr.rms(fit_now)
    at = next(i for i, r in enumerate(fit) if r["preset"] == "qwen3-32b" and (r["batch"], r["tokens"]) == (256, 256))
    assert abs(fit_now[at]) < 5.0 and fit_joint[at] < -10.0


class _StepIsTokens:
    """A cost model whose every step takes as many seconds as it computes tokens."""

    def time(self, tokens: int, kv_read: float, attn: float, seqs: int | None = None) -> float:
        return float(tokens)

    first_time = time


def test_the_schedule_decodes_early_requests_beside_later_prefill_chunks_as_vllm_counts_latency() -> None:
    """Two 4-token prompts, 3 tokens each, a budget of 5 tokens a step: step 1 fills prompt 0 and 1 token of prompt 1
    (5 s); step 2 decodes request 0 beside the rest of prompt 1 (4 s); steps 3 and 4 decode (2 s, 1 s). vLLM's
    latencies: request 0 waits 4 s then 2 s, request 1 2 s then 1 s: mean 2.25 s; the engine ends at 12 s; the first
    tokens come at 5 s and 9 s."""
    end, itl, ttft = cc.decode_schedule(_StepIsTokens(), batch=2, prompt=4, new=3, budget=5)
    assert end == 12.0
    assert itl == pytest.approx(2.25)
    assert ttft == pytest.approx((5.0 + 9.0) / 2)  # first tokens at the ends of steps 1 and 2


def test_the_schedule_is_the_pure_decode_mean_when_every_prompt_fits_the_first_step() -> None:
    """64 requests of 128 tokens fill one 8192-token step: every later step is pure decode, so the mean latency is
    the mean decode step; at 512 requests of a 14B (GPU-bound) the prefill chunks interleave and the mean latency is
    well above it (the H100 14B grid measured 43.2 ms at 512 × 128; its pure decode mean is 33)."""
    im = IterationModel.build(load_hardware("H100-SXM-80G-measured"), load_model("Qwen3-14B"), EngineSettings())
    for batch, mixed in ((64, False), (512, True)):
        _, itl, _ = cc.decode_schedule(im, batch, 128, 128)
        mids = [batch * (128 + j + 1) for j in range(127)]
        pure = sum(im.time(batch, c, c) for c in mids) / len(mids)
        if mixed:
            assert itl > 1.2 * pure
        else:
            assert itl == pytest.approx(pure, rel=1e-9)


def test_the_section_0_terms_the_profile_carries_are_the_fit_under_its_roofline() -> None:
    """The attention's KV rate and the sampler in the H200 profile are section 0's fit under the profile's own
    roofline, not values left over from the structure before."""
    terms = dr.profiles("p", load_hardware("H200-141G-measured").efficiency.gemm_roofline_p)["H200"]["engine"]
    hw = load_hardware("H200-141G-measured")
    assert terms["kv_read_bytes_per_s"] == hw.engine_overrides()["kv_read_bytes_per_s"]
    assert terms["sample_s_per_logit"] == hw.engine_overrides()["sample_s_per_logit"]


def test_the_roofline_is_the_larger_roof_far_from_the_ridge_and_adds_near_it() -> None:
    """A p-norm of the two roofs: the larger one where the other is small (a lone request's weights, a long prefill's
    FLOPs), 2^(1/p) of it where the two are equal; p = 0 is the hard max; a profile's p in (0, 1) is refused."""
    hw, m = load_hardware("H200-141G-measured"), load_model("Qwen3-4B")
    im = IterationModel.build(hw, m, EngineSettings())
    hard = dataclasses.replace(im, roofline_p=0.0)
    weights = im._weights_s(1)
    assert im.gemm_time(1, 1) == pytest.approx(weights, rel=1e-3)
    assert im.gemm_time(8192, 1) == pytest.approx(hard.gemm_time(8192, 1), rel=1e-3)
    # the ridge: the batch whose GEMM FLOPs take as long as the weights
    per_token = (im.flops_base + im.flops_head) / im.tp / im.flops_per_s
    ridge = round(weights / per_token)
    at = im.gemm_time(ridge, ridge) / hard.gemm_time(ridge, ridge)
    assert at == pytest.approx(2 ** (1 / im.roofline_p), rel=0.02)
    raw = json.loads((ROOT / "vime/sim/data/hardware/H200-141G-measured.json").read_text())
    raw["efficiency"]["gemm_roofline_p"] = 0.5
    with pytest.raises(ConfigError, match="gemm_roofline_p must be 0"):
        HardwareSpec.from_dict(raw, origin="test")
