"""The simulator's prediction of bench/megatron_step.py rows (forward, backward, optimizer per shape), written before a run.

Each shape is also split into what the model's two bounds give apart: the GPU's kernels alone and the CPU's launch
floor (`train_host_*_s_per_layer`); the model takes the larger, so rows where the two are close show how far that
holds (the whole steps' 0.6B micro-batches sit there).

    python bench/predict_megatron_step.py --preset qwen3-0.6b --cast-bf16 --shapes 8x1152,4x1152 \\
        --out bench/data/h200_megatron_qwen3-0.6b_overlap_predicted.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from calibrate import MEGATRON_MODELS  # noqa: E402

from vime.sim.hardware import load_hardware  # noqa: E402
from vime.sim.models import load_model  # noqa: E402
from vime.sim.trainer.costs import compute_seconds, optimizer_step_bytes, streaming_bytes_per_s  # noqa: E402

PROFILE = ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G-measured.json"


def shapes(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        mbs, _, seq = part.partition("x")
        if not (mbs.isdigit() and seq.isdigit()) or int(mbs) < 1 or int(seq) < 1:
            raise SystemExit(f"--shapes: {part!r} is not MBSxSEQ (e.g. 8x1152)")
        out.append((int(mbs), int(seq)))
    return out


def predict(preset: str, shape_list: list[tuple[int, int]], *, cast_bf16: bool, profile: Path = PROFILE) -> dict:
    hw = load_hardware(profile)
    # megatron_step.py's local spec: torch norms with bf16 weights when cast, else their fp32 weights
    hw = dataclasses.replace(hw, software=dataclasses.replace(
        hw.software, train_norm="torch" if cast_bf16 else "torch_fp32_weight", train_loss="megatron"))
    gpu_only = dataclasses.replace(hw, efficiency=dataclasses.replace(
        hw.efficiency, train_host_fwd_s_per_layer=0.0, train_host_bwd_s_per_layer=0.0))
    spec = load_model(MEGATRON_MODELS[preset])
    grads = 2  # megatron_step.py: grad_reduce_in_fp32 off
    opt = spec.num_params() * optimizer_step_bytes(hw, grads) / streaming_bytes_per_s(hw)
    rows = []
    for mbs, seq in shape_list:
        lengths = [seq] * mbs
        fwd, bwd = compute_seconds(spec, hw, lengths)
        gfwd, gbwd = compute_seconds(spec, gpu_only, lengths)
        rows.append({"mbs": mbs, "seq": seq, "fwd_s": fwd, "bwd_s": bwd, "opt_s": opt,
                     "gpu_fwd_s": gfwd, "gpu_bwd_s": gbwd,
                     "host_fwd_s": hw.efficiency.train_host_fwd_s_per_layer * spec.num_layers,
                     "host_bwd_s": hw.efficiency.train_host_bwd_s_per_layer * spec.num_layers})
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    return {"what": "the simulator's bench/megatron_step.py rows, written before the run", "preset": preset,
            "cast_bf16": cast_bf16, "profile": profile.name, "commit": commit, "software": dataclasses.asdict(hw.software),
            "rows": rows}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(MEGATRON_MODELS), required=True)
    ap.add_argument("--shapes", required=True, help="micro-batch x sequence, comma separated")
    ap.add_argument("--cast-bf16", action="store_true", help="as megatron_step.py --cast-bf16 (vime's actor)")
    ap.add_argument("--profile", type=Path, default=PROFILE)
    ap.add_argument("--out", type=Path, help="JSON file (default: print only)")
    args = ap.parse_args(argv)
    res = predict(args.preset, shapes(args.shapes), cast_bf16=args.cast_bf16, profile=args.profile)
    for r in res["rows"]:
        print(f"{args.preset} {r['mbs']}x{r['seq']}: fwd {r['fwd_s'] * 1e3:7.2f} ms (GPU {r['gpu_fwd_s'] * 1e3:7.2f}, "
              f"host {r['host_fwd_s'] * 1e3:6.2f}), bwd {r['bwd_s'] * 1e3:7.2f} ms (GPU {r['gpu_bwd_s'] * 1e3:7.2f}, "
              f"host {r['host_bwd_s'] * 1e3:6.2f}), optimizer {r['opt_s'] * 1e3:6.2f} ms")
    if args.out:
        args.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
