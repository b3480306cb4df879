"""A run's simulated twin: the same arguments on the simulator, compared phase by phase (`vime train --compare-sim`).

The simulation takes the run's own arguments. What a real run does not need but the simulator does
is filled in from the run when the user left it out: the model from ``--hf-checkpoint``'s
config.json, the hardware preset from the GPU's name as NVML reports it. `notes` says what was
assumed, so the page can show it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vime.report.recorder import HOST, Recorder

GiB = 1024**3

#: NVML device names (substrings) → the hardware preset that models that GPU running vime's own stack: the measured
#: H200 and H100 profiles rather than their datasheets (`bench/data/h200_notes.md`).
GPU_PRESETS = (("H200", "H200-141G-measured"), ("H100", "H100-SXM-80G-measured"), ("A100", "A100-80G"), ("B200", "B200"),
               ("L20", "L20"))


def hardware_for(device_names: Sequence[str]) -> str | None:
    """The hardware preset of the first GPU name that one matches, else None."""
    for name in device_names:
        for needle, preset in GPU_PRESETS:
            if needle.lower() in name.lower():
                return preset
    return None


@dataclass
class Twin:
    """The simulation of a run's arguments, its document, and what had to be assumed."""

    sim: Any  # vime.runs.sim.Simulation
    doc: dict[str, Any]
    notes: list[str] = field(default_factory=list)


def simulation_args(args: Any, device_names: Sequence[str] = ()) -> tuple[Any, list[str]]:
    """`args` as the simulator should take them, and notes on what was filled in."""
    raw = args._raw_options()
    # the simulated backends with what the real run resolved: its sequence parallelism (off on the real trainer)
    # and weight path (disk for engines off the trainer's GPUs); vLLM's own flags are not modelled
    changes: dict[str, Any] = {"backend": "sim", "sequence_parallel": args.sequence_parallel,
                               "update_weight_mode": args.update_weight_mode, "vllm_extra_args": ()}
    notes: list[str] = []
    if args.vllm_extra_args:
        notes.append(f"vLLM flags not simulated: {' '.join(args.vllm_extra_args)}")
    cfg = os.path.join(str(args.hf_checkpoint or ""), "config.json")
    if "model" not in raw and args.hf_checkpoint and os.path.isfile(cfg):
        changes["model"] = cfg
        notes.append(f"model read from {cfg}")
    if "hardware" not in raw:
        preset = hardware_for(device_names)
        if preset is not None:
            changes["hardware"] = preset
            notes.append(f"hardware preset {preset} for the {device_names[0]} this ran on")
        else:
            notes.append(f"simulated on {args.hardware} (the default; pass --hardware for your GPU)")
    return args.replace(**changes), notes


def simulate_twin(args: Any, device_names: Sequence[str] = ()) -> Twin:
    """Simulate the run's arguments (one pass; deterministic)."""
    from vime.runs.document import build_document
    from vime.runs.sim import simulate

    sim_args, notes = simulation_args(args, device_names)
    sim = simulate(sim_args)
    if sim.oom is not None:
        o = sim.oom
        notes.append(f"the simulation runs out of memory (GPU {o.gpu}, {o.owner}/{o.tag}, during {o.phase}): its "
                     f"steps stop there")
    return Twin(sim, build_document(sim), notes)


def compare_with_twin(run_doc: dict[str, Any], recorder: Recorder, twin: Twin) -> dict[str, Any]:
    """The ``vime.compare/1`` document of a finished run (its document and recorder) against its twin; memory
    is each GPU's peak, measured and simulated."""
    from vime.report.compare import compare, peak_memory

    doc = compare(run_doc.get("startup"), run_doc.get("steps", []), twin.doc)
    measured_mib = {g: p.bytes / 2**20 for g, p in recorder.gpu_peaks.items() if g != HOST}
    if measured_mib:
        doc["memory"] = peak_memory(measured_mib, twin.doc)
    doc["notes"] = list(twin.notes)
    return doc
