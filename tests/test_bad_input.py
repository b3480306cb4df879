"""Bad and extreme input (issue 18): every flag and input file ends in a one-line error naming the input (exit 2) or a correct result — never a traceback, a hang, or a number built on garbage."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vime import cli
from vime.config import build_parser, parse_args
from vime.errors import ConfigError
from vime.hf_config import parse_hf_config
from vime.inputs import read_json
from vime.runs.sweep import parse_sweep, run_points
from vime.sim.hardware import HardwareSpec, load_hardware
from vime.sim.lengths import LengthSampler
from vime.sim.models import load_model

ROOT = Path(__file__).resolve().parents[1]
PRESET_MODEL = ROOT / "vime" / "sim" / "data" / "models" / "Qwen3-4B.json"


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def _value_flags(command: str) -> list[tuple[str, Any]]:
    """(flag, argparse type) of every option of `command` that takes a value."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    parser = sub.choices[command]  # type: ignore[index]
    out = []
    for action in parser._actions:
        if not action.option_strings or action.nargs == 0 or action.dest in ("help",):
            continue
        out.append((action.option_strings[0], action.type))
    return out


BAD_TEXT = st.sampled_from(["inf", "-inf", "nan", "NaN", "1e400", "-1", "0", "-0.5", "1e300", "", "abc", "1.5x",
                            "9" * 40, "0x10", "true", "None", "\x00", "ü", "--help"])


@pytest.mark.parametrize("command", ["simulate", "train"])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_flag_with_a_bad_value_is_a_one_line_error_or_a_valid_config(command: str, data: st.DataObject) -> None:
    flag, _ = data.draw(st.sampled_from(_value_flags(command)))
    value = data.draw(BAD_TEXT)
    if value == "--help":
        return  # a flag name, not a value: argparse's business
    rc, out, err = _cli([command, flag, value, "--dry-run", "--json"])
    assert rc in (0, 2), (flag, value, rc, err)
    if rc == 2:
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1 and "Traceback" not in err, (flag, value, err)
        assert flag in err or flag.lstrip("-").replace("-", "_") in err or "argument" in err, (flag, value, err)
    else:
        config = json.loads(out)  # valid JSON: no NaN or Infinity got in
        for v in config.values():
            assert not (isinstance(v, float) and not math.isfinite(v)), (flag, value, config)


@pytest.mark.parametrize("argv,needle", [
    (["--lr", "inf"], "--lr"), (["--rollout-temperature", "nan"], "--rollout-temperature"),
    (["--kl-coef", "inf"], "--kl-coef"), (["--lr", "5"], "--lr"), (["--gpu-memory-utilization", "nan"], "--gpu"),
    (["--micro", "4"], "unrecognized"), (["--offload-tr"], "unrecognized"),
    (["--search", "fastest", "--sweep", "micro-batch-size=4,8"], "--search and --sweep"),
    (["--search", "fewest-gpus", "--target-step-time", "-3"], "--target-step-time"),
    (["--target-step-time", "30"], "--target-step-time"),
    (["--load", "/no/such/checkpoint"], "--load"), (["--prompt-data", "/no/such.jsonl"], "--prompt-data"),
    (["--trace-out", "/no/such/dir/t.json"], "--trace-out"), (["--report", "/tmp"], "--report"),
    (["--rollout-batch-size", "1000000"], "simulator's limit"),
])
def test_named_classes_of_bad_flags_fail_before_any_work(argv: list[str], needle: str) -> None:
    rc, _, err = _cli(["simulate", *argv])
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


# --------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------

JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-10, 10**9), st.floats(allow_nan=False),
                        st.text(max_size=5), st.lists(st.integers(), max_size=2))


@settings(max_examples=300, deadline=None)
@given(key=st.sampled_from(sorted(json.loads(PRESET_MODEL.read_text()))), value=JSON_VALUES)
def test_a_model_config_with_any_value_loads_checked_or_fails_naming_the_key(key: str, value: Any) -> None:
    data = json.loads(PRESET_MODEL.read_text())
    data[key] = value
    try:
        hf = parse_hf_config(data, name="fuzz", source="config.json")
    except ConfigError as exc:
        assert "\n" not in str(exc) and ("config.json" in str(exc))
        return
    for f in ("num_layers", "hidden_size", "intermediate_size", "num_heads", "num_kv_heads", "head_dim", "vocab_size"):
        v = getattr(hf, f)
        assert isinstance(v, int) and not isinstance(v, bool) and v > 0
    assert hf.num_heads % hf.num_kv_heads == 0 and math.isfinite(hf.rope_theta)


@pytest.mark.parametrize("text,needle", [
    ('{"num_hidden_layers": NaN}', "NaN is not a JSON number"), ('{"hidden_size": Infinity}', "Infinity"),
    (b'\xff\xfe{}', "not UTF-8"), ('{"num_hidden_layers": 2', "is not JSON"), ("[1, 2]", "expected a JSON object"),
])
def test_malformed_model_files_name_the_file(tmp_path: Path, text: str | bytes, needle: str) -> None:
    path = tmp_path / "config.json"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(ConfigError, match=needle) as info:
        load_model(str(path))
    assert str(path) in str(info.value)


@pytest.mark.parametrize("change,needle", [
    ({"num_attention_heads": 0}, "num_attention_heads"), ({"hidden_size": 2560.7}, "hidden_size"),
    ({"num_hidden_layers": True}, "num_hidden_layers"), ({"torch_dtype": "int3"}, "torch_dtype"),
    ({"num_attention_heads": 7, "num_key_value_heads": 7, "head_dim": None}, "head_dim"), ({"num_key_value_heads": 3}, "num_key_value_heads"),
    ({"vocab_size": -5}, "vocab_size"), ({"num_experts": 8}, "num_experts_per_tok"),
    ({"num_experts": 8, "num_experts_per_tok": 9, "moe_intermediate_size": 64}, "num_experts_per_tok"),
    ({"num_experts": 8, "num_experts_per_tok": 2}, "moe_intermediate_size"),
    ({"num_local_experts": 8, "num_experts": 8}, "both"), ({"kv_lora_rank": 512}, "latent attention"),
    ({"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64, "mlp_only_layers": [99]},
     "mlp_only_layers"),
])
def test_inconsistent_model_configs_say_what_to_fix(change: dict[str, Any], needle: str) -> None:
    data = {**json.loads(PRESET_MODEL.read_text()), **change}
    data = {k: v for k, v in data.items() if v is not None}
    with pytest.raises(ConfigError, match=needle):
        parse_hf_config(data, name="x", source="x.json")


def _preset_hardware() -> dict[str, Any]:
    path = ROOT / "vime" / "sim" / "data" / "hardware" / "H100-SXM-80G.json"
    return dict(read_json(path, what="hardware", missing_hint=""))


@settings(max_examples=200, deadline=None)
@given(key=st.sampled_from(["memory_bytes", "bf16_flops", "hbm_bytes_per_s", "nvlink_bytes_per_s",
                            "host_link_h2d_bytes_per_s", "host_link_d2h_bytes_per_s", "cuda_context_bytes",
                            "internode_bytes_per_s"]),
       value=st.one_of(JSON_VALUES, st.sampled_from([math.inf, -math.inf, math.nan, 1e-300, 1e300])))
def test_a_hardware_profile_with_any_value_is_plausible_or_refused(key: str, value: Any) -> None:
    data = _preset_hardware()
    data[key] = value
    try:
        hw = HardwareSpec.from_dict(data, origin="fuzz.json")
    except ConfigError as exc:
        assert "fuzz.json" in str(exc) and key in str(exc) and "\n" not in str(exc)
        return
    assert math.isfinite(getattr(hw, key)) and getattr(hw, key) >= 0


def test_hardware_file_with_infinity_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(_preset_hardware()).replace('"memory_bytes": ', '"memory_bytes": Infinity, "x": '))
    with pytest.raises(ConfigError, match="Infinity"):
        load_hardware(str(path))


@pytest.mark.parametrize("line,needle", [('{"response_length": 12.5}', "12.5"), ('{"response_length": NaN}', "NaN"),
                                         ("not json", "is not JSON")])
def test_length_traces_refuse_fractional_and_non_finite_lengths(tmp_path: Path, line: str, needle: str) -> None:
    path = tmp_path / "trace.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(ConfigError, match=needle):
        LengthSampler(parse_args(["--response-length", f"trace:{path}"], command="simulate").response_length)


# --------------------------------------------------------------------------------------------
# Inputs honoured, sweeps robust
# --------------------------------------------------------------------------------------------


def test_simulate_takes_prompt_lengths_from_prompt_data(tmp_path: Path) -> None:
    from vime.rollout.toy_task import ToyTask, write_prompts
    from vime.runs.sim import simulate

    prompts = write_prompts(tmp_path / "p.jsonl", ToyTask(vocab_size=151936, num_prompts=64, prompt_len=100))
    sim = simulate(parse_args(["--prompt-data", str(prompts), "--num-rollout", "1"], command="simulate"))
    assert sim.fits and sim.steps
    groups = sim.orchestrator.data_source.get_samples(2)
    assert {len(s.tokens) for g in groups for s in g} == {100}
    rc, _, err = _cli(["simulate", "--prompt-data", str(prompts), "--prompt-length", "fixed:64"])
    assert rc == 2 and "--prompt-data and --prompt-length" in err


def test_a_bad_sweep_point_is_a_row_and_length_specs_sweep() -> None:
    assert parse_sweep(["response-length=lognormal:6,0.6,fixed:128"]) == [
        {"response_length": "lognormal:6,0.6"}, {"response_length": "fixed:128"}]
    base = parse_args(["--num-rollout", "1"], command="simulate")
    rows = run_points(base, parse_sweep(["model=Qwen3-0.6B,No-Such-Model"]), workers=1)
    assert [r.valid for r in rows] == [True, False] and "unknown model" in rows[1].error
    with pytest.raises(ConfigError, match="--max-points"):
        parse_sweep(["micro-batch-size=1,2,4,8", "gpu-memory-utilization=0.5,0.6,0.7"], max_points=10)


def _children(pid: int) -> set[int]:
    """Every live process whose parent is `pid` (from /proc)."""
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                out.add(int(entry))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_ctrl_c_during_a_two_worker_sweep_stops_every_worker_and_prints_what_finished() -> None:
    argv = [sys.executable, "-m", "vime.cli", "simulate", "--workers", "2", "--num-rollout", "3",
            "--sweep", "micro-batch-size=1,2,4,8", "--sweep", "gpu-memory-utilization=0.5,0.6,0.7,0.8,0.9",
            "--sweep", "rollout-max-response-len=512,1024,2048"]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stderr is not None
    announced = proc.stderr.readline()  # waits for the sweep to start
    assert "simulating 60 configurations on 2 worker(s)" in announced, announced
    first = proc.stderr.readline()  # waits for the first configuration to finish
    assert first.startswith("[1/60] "), first
    workers = _children(proc.pid)
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("the sweep did not stop within 10 s of Ctrl-C") from None
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted after" in err, err
    assert out.splitlines()[0].startswith("rank"), out  # the table of what finished
    assert not [w for w in workers if _alive(w)], "worker processes left running"


def test_a_full_disk_loses_only_the_file_that_did_not_fit(tmp_path: Path) -> None:
    """A file-size limit (RLIMIT_FSIZE: the kernel refuses writes past it, as on a full disk) on the
    trace: the results are printed whole, the error is one line naming the file and the cause, and
    no partial or temporary file is left."""
    import resource

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))  # the trace is larger; stdout is a pipe

    trace = tmp_path / "trace.json"
    proc = subprocess.run([sys.executable, "-m", "vime.cli", "simulate", "--json", "--trace-out", str(trace)],
                          cwd=ROOT, capture_output=True, text=True, preexec_fn=limit,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and f"cannot write {trace}" in proc.stderr
    assert "File too large" in proc.stderr
    assert json.loads(proc.stdout)["summary"]["t_step"] > 0  # the results came out whole
    assert list(tmp_path.iterdir()) == []  # neither half a trace nor a temporary file


LINE_VALUES = st.one_of(JSON_VALUES, st.dictionaries(st.sampled_from(["prompt", "label", "token_ids", "response_length",
                                                                      "metadata"]), JSON_VALUES, max_size=4))


@settings(max_examples=200, deadline=None)
@given(lines=st.lists(LINE_VALUES, min_size=1, max_size=3))
def test_prompt_and_trace_files_with_any_lines_load_checked_or_fail_naming_file_and_line(lines: list[Any]) -> None:
    """--prompt-data and trace:FILE with generated JSONL lines: a checked result or a ConfigError naming the file and line."""
    import tempfile

    from vime.rollout.data_source import load_jsonl

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "in.jsonl"
        path.write_text("".join(json.dumps(v) + "\n" for v in lines))
        try:
            data = load_jsonl(path)
        except ConfigError as exc:
            assert str(path) in str(exc) and "\n" not in str(exc), exc
        else:
            for s in data.samples:
                assert s.tokens and all(type(t) is int and t >= 0 for t in s.tokens), s.tokens
        try:
            spec = parse_args(["--response-length", f"trace:{path}"], command="simulate").response_length
            sampler = LengthSampler(spec)
        except ConfigError as exc:
            assert str(path) in str(exc) and "\n" not in str(exc), exc
        else:
            assert 1 <= sampler.response("k", 64).length <= 64


def test_ctrl_c_during_one_large_simulation_exits_130_at_once() -> None:
    """A run this size announces itself before it starts (the line this test waits on); Ctrl-C then ends it
    with exit 130 and one line, no traceback."""
    proc = subprocess.Popen([sys.executable, "-m", "vime.cli", "simulate", "--rollout-batch-size", "32768",
                             "--num-rollout", "1"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stderr is not None
    announced = proc.stderr.readline()
    assert "simulating 262,144 samples" in announced, announced
    proc.send_signal(signal.SIGINT)
    try:
        out, err = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError("one simulation did not stop within 5 s of Ctrl-C") from None
    assert proc.returncode == 130 and err.strip() == "vime simulate: interrupted" and out == "", err
