"""The report flags act: --report with --sweep/--search writes their page, --trace-out there is refused, --search cheapest,
the winning command parses as `vime train` words, --compare-sim, and `vime compare` on files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from vime.cli import main
from vime.config import parse_args
from vime.runs.sweep import SIMULATOR_ONLY, search
from vime.runs.twin import hardware_for, simulation_args

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "bench" / "data" / "h200_train_e2e" / "qwen3-4b-cumem-1g_mbs2"
SMALL = ["--num-rollout", "1", "--model", "Qwen3-0.6B", "--rollout-batch-size", "8"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("argv,needle", [
    (["simulate", "--sweep", "micro-batch-size=4,8", "--trace-out", "t.json"], "--trace-out traces one run, and --sweep"),
    (["simulate", "--search", "fastest", "--trace-out", "t.json"], "--trace-out traces one run, and --search"),
    (["train", "--backend", "sim", "--compare-sim"], "--compare-sim draws the run beside its simulation"),
    (["simulate", "--search", "fastest", "--target-step-time", "10"], "--target-step-time"),
])
def test_flags_that_cannot_act_are_refused_in_one_line(argv: list[str], needle: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(argv, capsys)
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1, err


def test_search_cheapest_minimises_gpu_seconds_per_sample_within_a_step_time_limit() -> None:
    base = parse_args(SMALL, command="simulate")
    best, ranked = search(base, goal="cheapest", max_gpus=2, workers=1)
    fits = [r for r in ranked if r.valid and r.fits]
    assert best is not None and len(fits) >= 3
    assert best.gpu_s_per_1k_samples == min(r.gpu_s_per_1k_samples for r in fits)
    assert best.gpu_s_per_step == pytest.approx(best.gpus * best.t_step, rel=1e-5)
    assert best.gpu_s_per_1k_samples == pytest.approx(best.gpu_s_per_step / (8 * 8) * 1000, rel=1e-5)
    # under a limit the cheapest may not be allowed: then the cheapest of those meeting it wins
    limit = (min(r.t_step for r in fits) + best.t_step) / 2
    if limit < best.t_step:
        limited, _ = search(parse_args(SMALL, command="simulate"), goal="cheapest", max_gpus=2, target_step_time=limit,
                            workers=1)
        assert limited is not None and limited.t_step <= limit
        # no configuration the unlimited search simulated within the limit is cheaper (the pruned rest cannot be)
        assert limited.gpu_s_per_1k_samples <= min(r.gpu_s_per_1k_samples for r in fits if r.t_step <= limit)
    fastest, _ = search(base, goal="fastest", max_gpus=2, workers=1)
    assert fastest is not None and fastest.t_step <= min(r.t_step for r in fits)


def test_the_winning_command_parses_as_printed_on_vime_train_and_the_search_page_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "search.html"
    rc, out, err = _run(["simulate", *SMALL, "--search", "fastest", "--max-gpus", "2", "--workers", "1",
                         "--report", str(page)], capsys)
    assert rc == 0, err
    assert "report written to" in err
    line = next(x for x in out.splitlines() if x.startswith("vime train "))
    words = line.split()
    flags = {w for w in words if w.startswith("--")}
    assert not flags & {"--" + f.replace("_", "-") for f in SIMULATOR_ONLY}, line  # what a real run cannot use
    assert not flags & {"--search", "--max-gpus", "--workers", "--report", "--num-rollout", "--json"}
    placeholder = words[words.index("--hf-checkpoint") + 1]
    assert placeholder == "/path/to/Qwen3-0.6B-hf-checkpoint"
    prompts = words[words.index("--prompt-data") + 1]
    assert prompts == "/path/to/prompts.jsonl"
    assert f"{placeholder} is a placeholder" in out and f"{prompts} is a placeholder: your prompts" in out
    assert "GPU·s per step" in out and "gpu_s_per_1k" in out.splitlines()[0]
    # as printed, the run stops before any work, in one line naming the placeholder to fill in
    rc, _, err = _run([*words[1:], "--dry-run"], capsys)
    assert rc == 2 and f"--prompt-data {prompts}: file not found" in err and len(err.strip().splitlines()) == 1, err
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1 + 1 = ?"}\n')
    filled = [str(data) if w == prompts else w for w in words[1:]]  # the words as printed, the prompts filled in
    rc, cfg_text, err = _run([*filled, "--dry-run", "--json"], capsys)
    assert rc == 0, err
    cfg = json.loads(cfg_text)
    assert cfg["command"] == "train" and cfg["backend"] == "real" and cfg["hf_checkpoint"] == placeholder
    assert cfg["rollout_batch_size"] == 8 and cfg["prompt_data"] == str(data)
    assert page.is_file() and 'data-kind="search"' in page.read_text()


def test_a_model_config_inside_a_checkpoint_is_the_commands_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ckpt = tmp_path / "qwen3-0.6b"
    ckpt.mkdir()
    shutil.copy(ROOT / "vime" / "sim" / "data" / "models" / "Qwen3-0.6B.json", ckpt / "config.json")
    from vime.runs.sweep import command_line

    args = parse_args(["--model", str(ckpt / "config.json"), "--tensor-model-parallel-size", "1"], command="simulate")
    words = command_line(args)
    assert words[2:4] == ["--hf-checkpoint", str(ckpt)] and "--model" not in words


def test_sweep_report_is_written_and_a_bool_sweep_prints_valid_train_words(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "sweep.html"
    rc, out, err = _run(["simulate", *SMALL, "--sweep", "use-distributed-optimizer=true,false", "--workers", "1",
                         "--report", str(page), "--json"], capsys)
    assert rc == 0, err
    doc = json.loads(out)
    assert page.is_file() and 'data-kind="sweep"' in page.read_text()
    data = tmp_path / "prompts.jsonl"
    data.write_text('{"prompt": "1 + 1 = ?"}\n')
    for r in doc["results"]:
        assert r["gpu_s_per_step"] == pytest.approx(r["gpus"] * r["t_step"], rel=1e-5)
        assert r["capacity_gib"] > 0 and r["samples"] == 64
        words = [str(data) if w == "/path/to/prompts.jsonl" else w for w in r["argv"][1:]]
        rc, _, err = _run([*words, "--dry-run"], capsys)
        assert rc == 0, (r["argv"], err)


def test_compare_sim_arguments_take_the_model_from_the_checkpoint_and_the_gpu_name(tmp_path: Path) -> None:
    assert hardware_for(["NVIDIA H200"]) == "H200-141G-measured"
    assert hardware_for(["NVIDIA H100 80GB HBM3"]) == "H100-SXM-80G-measured"
    assert hardware_for(["Some Other GPU"]) is None
    ckpt = tmp_path / "model"
    ckpt.mkdir()
    shutil.copy(ROOT / "vime" / "sim" / "data" / "models" / "Qwen3-0.6B.json", ckpt / "config.json")
    args = parse_args(["--backend", "real", "--hf-checkpoint", str(ckpt)], command="train")
    sim_args, notes = simulation_args(args, ["NVIDIA H200"])
    assert sim_args.model == str(ckpt / "config.json") and sim_args.hardware == "H200-141G-measured"
    assert any("config.json" in n for n in notes) and any("NVIDIA H200" in n for n in notes)
    given = parse_args(["--backend", "real", "--hf-checkpoint", str(ckpt), "--hardware", "A100-80G", "--compare-sim",
                        "--report", str(tmp_path / "r.html")], command="train")
    assert simulation_args(given, ["NVIDIA H200"])[0].hardware == "A100-80G"  # what the user says wins
    _, notes = simulation_args(parse_args(["--backend", "real"], command="train"), [])
    assert any("pass --hardware" in n for n in notes)


def test_vime_compare_refuses_bad_input_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, _, err = _run(["compare", "--train", str(tmp_path / "none.jsonl"), "--sim", str(H200 / "sim.json")], capsys)
    assert rc == 2 and "--train" in err and len(err.strip().splitlines()) == 1, err
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "something"}')
    rc, _, err = _run(["compare", "--train", str(H200 / "train.jsonl"), "--sim", str(bad)], capsys)
    assert rc == 2 and "not a `vime simulate --json` document" in err, err
    rc, _, err = _run(["compare", "--train", str(H200 / "train.jsonl")], capsys)
    assert rc == 2 and "--sim" in err, err
    rc, out, _ = _run(["compare", "--help"], capsys)
    assert rc == 0 and "--report" in out
    rc, out, _ = _run(["--help"], capsys)
    assert rc == 0 and "vime compare --train" in out


def test_vime_compare_json_of_a_run_that_stopped_before_its_first_step(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    run = ROOT / "bench" / "data" / "h200_train_e2e" / "qwen3-4b-cumem-1g_mbs4-oom"
    page = tmp_path / "stopped.html"
    rc, out, _ = _run(["compare", "--train", str(run / "train.jsonl"), "--sim", str(run / "sim.json"), "--json",
                       "--report", str(page)], capsys)
    doc = json.loads(out)
    assert rc == 1 and not doc["ok"] and doc["steps"] == [] and "steps predicted but not measured" in doc["problems"][0]
    assert "the run has no step" in page.read_text()
