"""The Python cost vime itself adds per RL step (orchestrator, rollout bookkeeping, batch building), measured on the simulator.

Run: python -m pytest bench/bench_orchestrator.py -q --benchmark-columns=mean,min,max,rounds
or:  python bench/bench_orchestrator.py        (prints the table)

A whole step (seed steps 14–55) runs on the simulated backends while a sampling profiler (a
thread reading the main thread's stack every ~0.5 ms) attributes each sample to the innermost
frame that belongs to either side: ``vime.sim`` and simpy (the engine, trainer and memory models,
the virtual clock) are the simulator's share; vime's own code (orchestrator, rollout, reward,
filter, batch builder, the algo helpers, Sample) is vime's share. Library and built-in frames
(asyncio, copy, numpy ...) count for the side that called them; event-loop time outside any
task counts as vime's. A sampler, unlike cProfile, does not inflate code made of many tiny
calls (per-token loops). The share is applied to the CPU time of the same step run unsampled
(CPU, not wall: on a shared machine, waiting for a core is nobody's cost).

- seed: 8 GPUs, 4 engines, 32 prompts × 8 = 256 samples ≤ 1024 tokens.
- large: 64 GPUs, 64 engines of 1 GPU, 1024 prompts × 8 = 8192 samples ≤ 1024 tokens.
The figure that matters is vime's milliseconds per hundred samples (extra_info ``vime_ms_per_100``).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import pytest

from vime.config import parse_args
from vime.runs.sim import simulate

SCENARIOS: dict[str, list[str]] = {
    "seed_256": [],
    "large_8192": ["--actor-num-nodes", "8", "--rollout-num-gpus-per-engine", "1",
                   "--rollout-batch-size", "1024", "--n-samples-per-prompt", "8"],
}
_SIM_PARTS = (os.sep + os.path.join("vime", "sim") + os.sep, os.sep + "simpy" + os.sep)
_VIME_PART = os.sep + "vime" + os.sep


def scenario_args(name: str, *, num_rollout: int = 2, extra: list[str] | None = None) -> Any:
    return parse_args(["--backend", "sim", "--num-rollout", str(num_rollout), *SCENARIOS[name], *(extra or [])],
                      command="train")


class StackSampler:
    """Samples the main thread's stack from a helper thread and counts samples per side ("sim", "vime")."""

    def __init__(self, interval_s: float = 0.0005) -> None:
        self.interval_s = interval_s
        self.counts = {"sim": 0, "vime": 0}
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._switch = sys.getswitchinterval()

    def start(self) -> None:
        sys.setswitchinterval(self.interval_s / 2)  # let the sampler in often enough
        self._thread = threading.Thread(target=self._run, name="vime-bench-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        sys.setswitchinterval(self._switch)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            frame = sys._current_frames().get(self._main)
            self.counts[side_of_stack(frame)] += 1


def side_of_stack(frame: Any) -> str:
    """The side of the innermost frame that is simulator or vime code (library frames are skipped)."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if any(part in filename for part in _SIM_PARTS):
            return "sim"
        if _VIME_PART in filename:
            return "vime"
        frame = frame.f_back
    return "vime"  # the event loop between tasks: the orchestration's own overhead


class _StepWindow:
    """A StepObserver that starts the wall clock (and the sampler) when the measured rollout begins."""

    def __init__(self, rollout_id: int, sampler: StackSampler | None) -> None:
        self.rollout_id = rollout_id
        self.sampler = sampler
        self.t0 = self.c0 = 0.0
        self.t1 = self.c1 = 0.0

    def on_phase(self, name: str, begin: bool, t: float, rollout_id: int | None) -> None:
        if name == "rollout" and begin and rollout_id == self.rollout_id:
            self.t0, self.c0 = time.perf_counter(), time.process_time()
            if self.sampler is not None:
                self.sampler.start()

    def on_call(self, component: str, call: str, t0: float, t1: float) -> None:
        pass

    def on_step(self, report: Any) -> None:
        if report.rollout_id == self.rollout_id:
            if self.sampler is not None:
                self.sampler.stop()
            self.t1, self.c1 = time.perf_counter(), time.process_time()


def run_step(name: str, *, sample: bool) -> tuple[float, float, StackSampler | None, Any]:
    """Wall and CPU seconds of the second step (the first warms caches), its stack samples, and the run."""
    args = scenario_args(name)
    sampler = StackSampler() if sample else None
    window = _StepWindow(1, sampler)
    run = simulate(args, observers=[window], on_step=window.on_step)
    return window.t1 - window.t0, window.c1 - window.c0, sampler, run


def measure(name: str) -> dict[str, float]:
    """vime's own cost of one step: the step's CPU time × vime's share of the stack samples.

    CPU time (not wall) because this machine is shared: waiting for a core is nobody's cost.
    """
    wall, cpu, _, run = run_step(name, sample=False)
    _, _, sampler, _ = run_step(name, sample=True)
    assert sampler is not None
    total = sampler.counts["vime"] + sampler.counts["sim"]
    share = sampler.counts["vime"] / total
    samples = run.report.steps[1].num_samples
    vime_s = cpu * share
    return {"samples": samples, "wall_ms": 1e3 * wall, "cpu_ms": 1e3 * cpu, "vime_share": share,
            "vime_ms": 1e3 * vime_s, "vime_ms_per_100": 1e5 * vime_s / samples,
            "virtual_step_s": run.report.steps[1].t_step, "stack_samples": total}


@pytest.mark.parametrize("name", list(SCENARIOS))
def test_vime_cost_per_step(benchmark: Any, name: str) -> None:
    out: dict[str, float] = {}

    def once() -> None:
        out.update(measure(name))

    benchmark.pedantic(once, rounds=1, iterations=1)
    benchmark.extra_info.update({k: round(v, 4) for k, v in out.items()})
    print(f"\n{name}: {out}")


if __name__ == "__main__":
    for scenario in SCENARIOS:
        r = measure(scenario)
        print(f"{scenario:>11}: {r['samples']:5d} samples  step wall {r['wall_ms']:8.1f} ms  cpu {r['cpu_ms']:8.1f} ms  "
              f"vime {r['vime_ms']:7.1f} ms ({100 * r['vime_share']:4.1f}%)  "
              f"{r['vime_ms_per_100']:.2f} ms per 100 samples  (virtual step {r['virtual_step_s']:.1f} s)")
