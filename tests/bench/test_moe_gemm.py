"""bench/moe_gemm.py on a CPU: its three implementations compute the same products, its predictions are the simulator's, its report's ratios."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import moe_gemm  # noqa: E402


def test_grouped_loop_and_dense_run_the_same_products() -> None:
    import torch  # the CI installs the real stack (torch CPU): no skip
    torch.manual_seed(0)
    experts, rows, k, n = 3, 16, 32, 48
    calls = moe_gemm.gemm_calls(rows, k, n, experts, torch.device("cpu"))
    for kind in ("fwd", "dgrad", "wgrad"):
        grouped, loop = calls["grouped"][kind](), calls["loop"][kind]()
        stacked = torch.stack(loop) if kind == "wgrad" else torch.cat(loop)
        assert grouped.shape == stacked.shape, kind
        assert torch.allclose(grouped.float(), stacked.float(), rtol=0.05, atol=0.5), kind
        # the dense product has the grouped one's FLOPs: same M x K x N (wgrad: one [K, N] over every row)
        assert calls["dense"][kind]().numel() == (grouped.numel() if kind != "wgrad" else grouped[0].numel())


def test_the_block_runs_forward_and_backward_the_same_each_pass() -> None:
    import torch  # the CI installs the real stack (torch CPU): no skip
    moe_gemm.SHAPES["tiny"] = (32, 16, 8, 2)
    try:
        step = moe_gemm.layer_call("tiny", 4, 8, torch.device("cpu"))
        first = step().clone()  # (a kept .grad would be added into in place)
        second = step()  # the timer calls it again and again: grads must not pile up
    finally:
        del moe_gemm.SHAPES["tiny"]
    assert first.shape == (4 * 8 // 2, 32) and torch.isfinite(first.float()).all() and first.abs().sum() > 0
    assert torch.equal(first, second)


def test_predictions_are_flops_at_the_preset_rates() -> None:
    from vime.sim.hardware import load_hardware

    rows = moe_gemm.predict()
    hw = load_hardware("H100-SXM-80G")
    eff = hw.efficiency
    for r in (x for x in rows if x["profile"] == "H100-SXM-80G" and x["impl"] == "grouped"):
        factor = r["rows"] / (r["rows"] + eff.train_expert_rows_half)  # few rows per expert: part-empty tiles
        assert r["median_s"] == pytest.approx(r["flops"] / (hw.train_flops * eff.train_expert_gemm_efficiency * factor)
                                              + eff.train_gemm_call_s)
    assert eff.train_expert_rows_half > 0
    assert {x["profile"] for x in rows} == {"H200-141G", "H200-141G-measured", "H100-SXM-80G"}


def test_the_row_fit_finds_a_known_half_rate_row_count(tmp_path: Path) -> None:
    """--fit-rows recovers c and r0 from ratios made by c · r / (r + r0), and its check reports them exact."""
    rows = []
    for m in (128, 256, 512, 1024, 2048, 4096):
        ratio = 0.9 * m / (m + 150)
        for impl, t in (("grouped", 1.0 / ratio), ("dense", 1.0)):
            rows.append({"preset": "p", "experts": 8, "rows": m, "product": "fc1", "impl": impl, "kind": "fwd",
                         "flops": 1e12, "median_s": t})
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"rows": rows}))
    c, r0, points = moe_gemm.fit_rows(path)
    assert r0 == 150 and c == pytest.approx(0.9) and len(points) == 6
    assert "median |error| 0.0 %" in moe_gemm.check_rows(path, c, r0)
    assert "median |error| 0.0 %" not in moe_gemm.check_rows(path, c, 300)


def test_report_sums_the_products_per_case(tmp_path: Path) -> None:
    rows = []
    for impl, t in (("grouped", 2.0), ("dense", 1.0), ("loop", 4.0)):
        for kind in moe_gemm.KINDS:
            rows.append({"preset": "p", "experts": 8, "rows": 256, "product": "fc1", "impl": impl, "kind": kind,
                         "flops": 1e12, "median_s": t})
    rows.append({"preset": "p", "experts": 8, "rows": 256, "product": "block", "impl": "layer", "kind": "fwd+bwd",
                 "flops": 3e12, "median_s": 9.0})
    rows.append({"preset": "p", "experts": 8, "rows": 512, "product": "fc1", "impl": "grouped", "kind": "fwd",
                 "flops": 1e12, "error": "RuntimeError: refused"})
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"rows": rows}))
    line = moe_gemm.report(path, dense_rate=1e12).splitlines()[1].split()
    # grouped: 3e12 FLOPs in 6 s = 0.5 TFLOP/s; dense 3 s / grouped 6 s; rate 0.5; loop 12/6; block 9/6
    assert line == ["p", "8", "256", "0.5", "0.50", "0.50", "2.00", "1.50"]
