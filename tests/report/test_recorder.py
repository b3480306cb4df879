"""The recorder fed without the simulator (as a real run would): phases, calls, memory by device/owner/tag, peaks, trace."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from vime.errors import OutOfMemoryError, SimulationError
from vime.report.recorder import HOST, Recorder
from vime.report.trace import recorder_trace

GiB = 1024**3
REPO = Path(__file__).resolve().parents[2]


class _Clock:
    now = 0.0


def _real_like_feed() -> Recorder:
    clock = _Clock()
    rec = Recorder(clock)
    rec.on_phase("train", True, 0.0, 3)
    rec.on_memory(0, "actor", "params", 8 * GiB, t=0.5)
    rec.on_memory(0, "actor", "activations", 20 * GiB, total=30 * GiB, t=1.0)  # total counts untagged bytes too
    rec.on_memory(0, "actor", "activations", 0, t=2.0)
    rec.on_memory(HOST, "actor", "weight_backup", 8 * GiB)  # t from the clock
    clock.now = 2.5
    rec.instant("actor", "checkpoint", step=1)
    rec.on_call("actor", "train", 0.0, 2.5)
    rec.on_phase("train", False, 2.5, 3)
    return rec


def test_recorder_takes_a_feed_without_the_simulator():
    rec = _real_like_feed()
    peak = rec.gpu_peaks[0]
    assert (peak.bytes, peak.t, peak.phase, peak.rollout_id) == (30 * GiB, 1.0, "train", 3)
    assert peak.breakdown == (("actor", "activations", 20 * GiB), ("actor", "params", 8 * GiB))
    assert rec.samples[2].total == 8 * GiB  # no total given: the sum of what the recorder holds for GPU 0
    assert rec.samples[3].t == 0.0 and rec.gpu_peaks[HOST].bytes == 8 * GiB
    assert rec.tag_peaks[(0, "actor", "activations")].bytes == 20 * GiB
    assert rec.phase_spans == [("train", 3, 0.0, 2.5)] and rec.instants[0][0] == 2.5
    assert [e["name"] for e in recorder_trace(rec)["traceEvents"] if e.get("ph") == "i"] == ["checkpoint"]
    with pytest.raises(SimulationError, match="never began"):
        rec.on_phase("rollout", False, 3.0, 3)


def test_phase_peaks_count_every_phase_in_progress_and_what_a_phase_found_on_the_device():
    rec = Recorder()
    rec.on_memory(0, "engine0", "kv_cache", 50 * GiB, t=0.0)  # before any phase: no phase peak
    assert rec.phase_peaks == {}
    rec.on_phase("rollout", True, 1.0, 0)
    rec.on_memory(0, "engine0", "kv_cache", 60 * GiB, t=1.5)
    rec.on_phase("rollout", False, 2.0, 0)
    rec.on_memory(0, "engine0", "kv_cache", 0, t=2.5)
    rec.on_phase("train", True, 3.0, 0)  # changes nothing on GPU 1: it still holds what was there
    rec.on_memory(1, "actor", "params", 4 * GiB, t=3.1)
    rec.on_phase("offload", True, 3.2, 0)  # nested: the outer train phase sees this too
    rec.on_memory(0, "actor", "activations", 30 * GiB, t=3.5)
    rec.on_phase("offload", False, 3.6, 0)
    rec.on_memory(0, "actor", "activations", 0, t=3.7)
    rec.on_phase("train", False, 4.0, 0)
    assert rec.phase_peaks == {(0, "rollout"): 60 * GiB, (0, "train"): 30 * GiB, (0, "offload"): 30 * GiB,
                               (1, "train"): 4 * GiB, (1, "offload"): 4 * GiB}


def test_recorder_keeps_the_first_oom_and_reads_no_clock_when_unbound():
    rec = Recorder()
    assert rec.now() == 0.0
    first = OutOfMemoryError(1, "engine0", "kv_cache", 4 * GiB, GiB, "onload_kv", 7.0)
    rec.on_oom(first)
    rec.on_oom(OutOfMemoryError(2, "actor", "params", GiB, 0, "train", 8.0))
    assert rec.oom is first and rec.to_dict()["oom"]["gpu"] == 1
    assert [(t, track) for t, track, _, _ in rec.instants] == [(7.0, "gpu1"), (8.0, "gpu2")]


def test_report_package_does_not_import_the_simulator():
    code = ("import sys, vime.report.recorder, vime.report.trace, vime.report.html, vime.report.schema; "
            "print(sorted(m for m in sys.modules if m.startswith('vime.sim')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_gpus_alike_by_totals_even_when_their_allocations_come_in_another_order():
    """memory_groups: two ranks whose PyTorch caches grow at different micro-batches (so their allocations differ in
    number and order) but whose totals stay within ALIKE_SHARE of the GPU are one 'alike' group that says the order
    differs; a third far fuller GPU is a group of its own."""
    from vime.report.view import ALIKE_SHARE, memory_groups

    G = 1 << 30
    rec = Recorder()
    for gpu in (0, 1, 2):
        rec.on_memory(gpu, "actor", "params", 4 * G, t=0.0)
    rec.on_memory(0, "actor", "activations", 3 * G, t=1.0)  # rank 0: its largest micro-batch first
    rec.on_memory(1, "actor", "activations", 1 * G, t=1.0)  # rank 1: grows twice
    rec.on_memory(1, "actor", "activations", 2 * G, t=2.0)
    rec.on_memory(1, "actor", "activations", 3 * G, t=3.0)
    rec.on_memory(2, "actor", "activations", 60 * G, t=1.0)
    for gpu in (0, 1, 2):
        rec.on_memory(gpu, "actor", "activations", 0, t=4.0)
    _, groups = memory_groups(rec, {0: 80 * G, 1: 80 * G, 2: 80 * G}, 0.0)
    assert [g["gpus"] for g in groups] == [[0, 1], [2]]
    alike = groups[0]
    assert alike["kind"] == "alike" and alike["same_order"] is False and alike["shift_s"] == 0.0
    assert alike["differ_gib"] == {"trainer/activations": 2.0} and alike["alike_share"] == ALIKE_SHARE
