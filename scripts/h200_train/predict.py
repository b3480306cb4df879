"""The simulator's predictions for the H200 train runs, made on a CPU before the runs (issue 20): one `vime simulate --json` per run.

For each run (GPUS, MODEL, OFFLOAD as `scripts/h200_train/run.sh` takes them) this writes the model's
config.json the run will load (`seed_model.py config`), asks run.sh for the arguments it will give
`vime train` and `vime simulate`, and records the simulation: the six phases per step, T_step, the
memory peaks, the verdict. The run's own `vime simulate` (same arguments, same code) must reproduce
it exactly; compare.py then sets the measurement beside it.

    python scripts/h200_train/predict.py --out bench/data/h200_train_e2e_predicted.json \
        qwen3-4b:cumem:1 qwen3-0.6b:cumem:1 qwen3-0.6b:torch_memory_saver:1
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def run_args(gpus: str, model: str, offload: str, model_dir: Path, prompts: Path) -> list[str]:
    env = {**os.environ, "GPUS": gpus, "MODEL": model, "OFFLOAD": offload}
    out = subprocess.run(["bash", str(HERE / "run.sh"), "--print-args", str(model_dir), str(prompts)],
                         capture_output=True, text=True, check=True, env=env, timeout=60)
    return out.stdout.splitlines()


def hypothesis_profile(name: str, work: Path) -> Path:
    """The measured H200 profile under one of bench/predict_vllm_bench.py's hypotheses, as a file `--hardware` takes."""
    sys.path.insert(0, str(ROOT / "bench"))
    import predict_vllm_bench  # noqa: PLC0415 - the hypotheses the vLLM-alone predictions use

    hyps = predict_vllm_bench.hypotheses(json.loads(predict_vllm_bench.PROFILE.read_text()),
                                         with_fit=name.endswith("bench_fit"))
    if name not in hyps:
        raise SystemExit(f"--hypothesis {name!r}: not one of {sorted(hyps)}")
    path = work / f"hypothesis-{name}.json"
    path.write_text(json.dumps(hyps[name]))
    return path


def predict(spec: str, work: Path, hardware: Path | None = None) -> dict:
    model, offload, gpus = spec.split(":")
    sys.path.insert(0, str(HERE))
    import seed_model  # noqa: PLC0415 - the script beside this one

    model_dir = work / model
    if model == "seed":
        seed_model.write_config(model_dir)
    else:
        seed_model.write_body_config(model_dir, model)
    # run.sh's paths on the machine, so the recorded arguments are the ones the run uses
    machine_dir = Path("/tmp/vime-train/models") / model
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    machine_prompts = Path(f"/tmp/vime-train/toy-{vocab}.jsonl")
    args = run_args(gpus, model, offload, machine_dir, machine_prompts)
    # the same prompts run.sh writes there (the toy task is deterministic)
    prompts = work / machine_prompts.name
    if not prompts.exists():
        from vime.rollout.toy_task import ToyTask, write_prompts

        write_prompts(prompts, ToyTask(vocab_size=vocab, num_prompts=256, prompt_len=128))
    swap = {str(machine_dir / "config.json"): str(model_dir / "config.json"), str(machine_prompts): str(prompts)}
    local = [swap.get(a, a) for a in args]
    if hardware is not None:  # the same run under a hypothesis profile
        local[local.index("--hardware") + 1] = str(hardware)
    from vime.cli import main as vime_main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = vime_main(["simulate", *local])
    doc = json.loads(buf.getvalue())
    doc.pop("wall_s", None)
    out = {"run": {"model": model, "offload": offload, "gpus": int(gpus)}, "simulate_args": args,
           "exit_code": rc, "prediction": doc}
    if hardware is not None:
        out["hypothesis_profile"] = hardware.stem.removeprefix("hypothesis-")
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", help="MODEL:OFFLOAD:GPUS, e.g. qwen3-4b:cumem:1")
    ap.add_argument("--out", required=True)
    ap.add_argument("--hypothesis", help="simulate on the H200 profile under this bench/predict_vllm_bench.py "
                                         "hypothesis (e.g. gpu_terms+k_split) instead of the committed profile")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as d:
        hw = hypothesis_profile(a.hypothesis, Path(d)) if a.hypothesis else None
        doc = {f"{m}-{o}-{g}g": predict(f"{m}:{o}:{g}", Path(d), hw) for m, o, g in (r.split(":") for r in a.runs)}
    Path(a.out).write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    for tag, p in doc.items():
        s = p["prediction"]["summary"]
        phases = "  ".join(f"{k} {v['seconds']:.3f}" for k, v in s["phases"].items())
        print(f"{tag}: T_step {s['t_step']:.3f} s  {phases}  verdict {p['prediction']['verdict'].get('fits')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
