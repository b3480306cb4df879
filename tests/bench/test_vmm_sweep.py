"""bench/vmm_sweep.py off the GPU: its refusal, its argument checks, its plan, its rounding, its summary and its clean-up."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "vmm_sweep.py"
MIB = 1 << 20
GIB = 1 << 30


@pytest.fixture(scope="module")
def vs():
    spec = importlib.util.spec_from_file_location("vmm_sweep_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_it_refuses_without_a_gpu_after_proving_out_writable(tmp_path: Path) -> None:
    out = tmp_path / "deep" / "vmm.json"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # no GPU seen even where there is one
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 2, done.stderr[-3000:]
    assert done.stderr == ("vmm_sweep.py: needs a CUDA GPU (none here); "
                           "run it on the lent H200 through the device tool\n")
    assert done.stdout == ""
    assert out.read_text() == "{}\n"


@pytest.mark.parametrize(("argv", "flag"), [
    (["--sizes=-1,8"], "--sizes"), (["--sizes=8,nan"], "--sizes"), (["--sizes=inf"], "--sizes"),
    (["--sizes="], "--sizes"), (["--sizes=0"], "--sizes"), (["--sizes=8,x"], "--sizes"),
    (["--chunks", "0"], "--chunks"), (["--chunks=28,-1"], "--chunks"), (["--chunks", "2.5"], "--chunks"),
    (["--repeats", "0"], "--repeats"), (["--settle-s=-1"], "--settle-s"), (["--settle-s", "nan"], "--settle-s"),
])
def test_bad_arguments_are_one_line_naming_the_flag(vs, capsys, tmp_path: Path, argv: list[str], flag: str) -> None:
    out = tmp_path / "vmm.json"
    with pytest.raises(SystemExit) as exc:
        vs.main([*argv, "--out", str(out)])
    assert exc.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("vmm_sweep.py: error: argument ") and flag in last, last
    assert not out.exists()  # refused before anything is written


def test_bad_sizes_from_the_command_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--sizes=8,-2", "--out", str(tmp_path / "v.json")],
                          capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "vmm_sweep.py: error: argument --sizes: each size must be a positive finite GiB, not -2")


def test_good_arguments_parse_to_lists(vs) -> None:
    args = vs.parse_args(["--sizes", "8, 47.5,124", "--chunks", "1,28", "--settle-s", "0", "--out", "x"])
    assert args.sizes == [8.0, 47.5, 124.0] and args.chunks == [1, 28] and args.settle_s == 0.0
    default = vs.parse_args(["--out", "x"])
    assert default.sizes == [8.0, 47.0, 76.0, 124.0] and default.chunks == [28] and default.repeats == 2


def test_the_schedule_interleaves_repeat_then_size_then_chunks_then_condition(vs) -> None:
    plan = vs.schedule([8.0, 124.0], [1, 28], 2)
    conds = list(vs.DEFAULT_CONDITIONS)
    assert conds == ["self_now", "self_settled", "neighbour_now", "neighbour_settled", "unwritten_now"]
    assert len(plan) == 2 * 2 * 2 * 5
    assert plan[:5] == [(0, 8.0, 1, c) for c in conds]
    assert plan[5:10] == [(0, 8.0, 28, c) for c in conds]
    assert plan[10] == (0, 124.0, 1, "self_now")
    assert plan[20] == (1, 8.0, 1, "self_now") and plan[-1] == (1, 124.0, 28, "unwritten_now")
    assert len(set(plan)) == len(plan)


@pytest.mark.parametrize(("size", "chunks", "gran", "expected"), [
    (8, 4, 2 * MIB, 2 * GIB),                # exact: no rounding
    (1, 3, 2 * MIB, 342 * MIB),              # 341.33 MiB -> the next 2 MiB
    (124, 28, 2 * MIB, 4536 * MIB),          # 4534.86 MiB -> 4536 MiB
    (0.001, 1, 2 * MIB, 2 * MIB),            # never less than one granule
    (1, 1, 3 * MIB, 342 * 3 * MIB),          # a granularity that does not divide a GiB
])
def test_chunks_are_rounded_up_to_the_granularity(vs, size, chunks, gran, expected) -> None:
    n = vs.chunk_bytes(size, chunks, gran)
    assert n == expected and n % gran == 0 and n * chunks >= size * GIB


def test_the_largest_mapping_must_fit_in_free_memory_less_the_margin(vs) -> None:
    gran = 2 * MIB
    assert vs.fit_error([8, 124], [28], gran, 140 * GIB) is None
    why = vs.fit_error([8, 124], [1, 28], gran, 125 * GIB)
    assert why == "--sizes 124 GiB (124.03 GiB mapped as --chunks 28) does not fit in 125.00 GiB free less a 1 GiB margin"
    assert vs.fit_error([124], [1], gran, 125 * GIB) is None  # 124 GiB in one piece needs no rounding: it fits


def test_the_summary_takes_medians_per_condition_size_and_chunks_and_skips_errors(vs) -> None:
    def row(cond, size, total, write=0.01, chunks=28):
        return {"condition": cond, "size_gib": size, "chunks": chunks, "total_s": total, "first_write_s": write}

    rows = [row("neighbour_now", 124, 0.3), row("self_now", 8, 0.001), row("neighbour_now", 124, 0.5),
            row("neighbour_now", 124, 0.35), row("self_now", 8, 0.003, write=0.02),
            {"condition": "self_now", "size_gib": 124, "chunks": 28, "error": "cuMemCreate failed"}]
    summary = vs.summarize(rows)
    assert [(s["condition"], s["size_gib"], s["n"]) for s in summary] == [("self_now", 8, 2), ("neighbour_now", 124, 3)]
    assert summary[0]["median_total_s"] == pytest.approx(0.002) and summary[0]["s_per_gib"] == pytest.approx(0.00025)
    assert summary[0]["median_first_write_s"] == pytest.approx(0.015)
    assert summary[1]["median_total_s"] == pytest.approx(0.35) and summary[1]["s_per_gib"] == pytest.approx(0.35 / 124)


class _FakeDriver:
    """Counts what is held; `fail_create_at` makes the n-th cuMemCreate fail as an out-of-memory would."""

    def __init__(self, fail_create_at: int | None = None, fail_map_at: int | None = None) -> None:
        from vime.real.cumem.driver import DriverError

        self.error = DriverError
        self.fail_create_at, self.fail_map_at = fail_create_at, fail_map_at
        self.reserved: set[int] = set()
        self.handles: set[int] = set()
        self.mapped: set[int] = set()
        self.creates = self.maps = 0

    def reserve(self, size):
        va = 0x1000_0000 * (len(self.reserved) + 1 + self.creates)
        self.reserved.add(va)
        return va

    def free_address(self, va, size):
        self.reserved.remove(va)

    def create(self, size):
        self.creates += 1
        if self.creates == self.fail_create_at:
            raise self.error("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY", f"{size} bytes")
        self.handles.add(self.creates)
        return self.creates

    def map(self, va, size, handle):
        self.maps += 1
        if self.maps == self.fail_map_at:
            raise self.error("cuMemMap", "CUDA_ERROR_INVALID_VALUE")
        self.mapped.add(va)

    def unmap(self, va, size):
        self.mapped.remove(va)

    def release(self, handle):
        self.handles.remove(handle)

    def synchronize(self):
        pass


def test_take_times_each_chunk_and_give_back_returns_everything(vs) -> None:
    drv = _FakeDriver()
    held, t = vs.take(drv, 2 * MIB, 5)
    assert len(held) == 5 and len(drv.mapped) == len(drv.handles) == len(drv.reserved) == 5
    assert len(t["chunk_s"]) == 5 and t["total_s"] >= t["reserve_s"] + t["create_s"] + t["map_s"] - 1e-6
    assert vs.give_back(drv, held, 2 * MIB) >= 0
    assert held == [] and not (drv.mapped or drv.handles or drv.reserved)


@pytest.mark.parametrize("fail", [{"fail_create_at": 4}, {"fail_map_at": 4}, {"fail_create_at": 1}])
def test_a_failed_take_gives_back_what_it_took(vs, fail: dict) -> None:
    drv = _FakeDriver(**fail)
    with pytest.raises(drv.error):
        vs.take(drv, 2 * MIB, 6)
    assert not (drv.mapped or drv.handles or drv.reserved)


def test_a_chosen_subset_of_conditions_is_all_the_plan_runs(vs) -> None:
    plan = vs.schedule([47.0], [28], 2, ("self_settled", "torch_holes_settled"))
    assert [p[3] for p in plan] == ["self_settled", "torch_holes_settled"] * 2


def test_an_unknown_condition_is_refused_naming_the_flag(vs, capsys) -> None:
    with pytest.raises(SystemExit):
        vs.parse_args(["--conditions", "self_settled,neighbor_now", "--out", "x.json"])
    assert "--conditions" in capsys.readouterr().err


def test_the_torch_tensors_hold_the_size_in_mixed_sizes_and_are_the_same_each_run(vs) -> None:
    sizes = vs.torch_sizes(82 * GIB)
    assert sum(sizes) == 82 * GIB
    assert {s >> 20 for s in sizes[:-1]} == set(vs.TORCH_MIB)  # every size drawn, the last one cut to fit
    assert sizes == vs.torch_sizes(82 * GIB)


def test_reused_ranges_are_mapped_into_and_kept_at_the_give_back(vs) -> None:
    drv = _FakeDriver()
    vas = [drv.reserve(2 * MIB) for _ in range(3)]
    held, _ = vs.take(drv, 2 * MIB, 3, vas)
    assert [va for va, _ in held] == vas
    vs.give_back(drv, held, 2 * MIB, keep_va=True)
    assert set(vas) <= drv.reserved and not drv.mapped  # unmapped, released, the ranges still reserved
    held, _ = vs.take(drv, 2 * MIB, 3, vas)
    assert [va for va, _ in held] == vas
