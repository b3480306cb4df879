"""bench/decode_gemm_sweep.py: the decode GEMM stack it times is the model's linear layers, and its prediction is the engine model's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from vime.testing.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
sweep = load_script(ROOT / "bench" / "decode_gemm_sweep.py", "vime_bench_decode_gemm_sweep")


@pytest.mark.parametrize("preset", sweep.PRESETS)
def test_the_stack_streams_the_weights_the_engine_model_streams(preset: str) -> None:
    """Every layer's four products and the LM head hold the bytes the engine model streams per decode step (the
    model's weights less an untied embedding table and the norms), so the GPU timing and `gemm_time` describe one thing."""
    from fit_whole_step import model_of  # noqa: PLC0415 - bench/, on the path the script set

    layers, mats = sweep.shapes(preset)
    body = sum(i * o for _, i, o in mats[:-1]) * layers
    head = mats[-1][1] * mats[-1][2]
    m = model_of(preset)
    # an untied embedding is a lookup, not streamed; a tied one is the LM head's weights
    streamed = m.weight_bytes(1) - (0 if m.tie_embeddings else m.vocab_size * m.hidden_size * m.dtype_bytes)
    assert 2 * (body + head) == pytest.approx(streamed, rel=0.002)


def test_predict_is_the_engine_models_gemm_time_and_compare_reads_both(tmp_path: Path, capsys) -> None:
    """--predict writes IterationModel.gemm_time per M; --compare sets a measured file beside it, error signed as
    (model - measured) / measured."""
    pred = sweep.predict("H100-SXM-80G-measured", ("qwen3-14b",), (1, 512))
    rows = pred["presets"]["qwen3-14b"]
    assert rows["1"]["gemm_s"] == pytest.approx(rows["1"]["weights_s"], rel=1e-3)
    assert rows["512"]["gemm_s"] > max(rows["512"]["weights_s"], rows["512"]["flops_s"])
    measured = {"device": "test", "presets": {"qwen3-14b": {"rows": {"512": {"stack_s": rows["512"]["gemm_s"] / 1.1}}}}}
    (tmp_path / "p.json").write_text(json.dumps(pred))
    (tmp_path / "m.json").write_text(json.dumps(measured))
    assert sweep.compare(str(tmp_path / "p.json"), str(tmp_path / "m.json")) == 0
    assert "error  +10.0 %" in capsys.readouterr().out
