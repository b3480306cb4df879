"""Trainer side of the colocated CUDA-IPC weight export (vime.real.weights.ipc): staging one 1 GiB bucket from the host backup, and building its handles.

Run on a GPU: python -m pytest bench/bench_ipc_weights.py -q --benchmark-columns=mean,stddev,rounds
Skipped without CUDA. The host → device copy bounds staging (pageable ~19 GB/s, pinned ~55 GB/s on
the H200, bench/data/h200_notes.md); handle building is per tensor Python work plus one
cudaIpcGetMemHandle for the buffer, and must stay far below a bucket's copy.
"""

from __future__ import annotations

import pytest
import torch

from vime.real.weights import ipc as iw

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

GIB = 1 << 30


def _backup(pinned: bool) -> dict[str, torch.Tensor]:
    """1 GiB of bf16 host tensors in 64 MiB pieces, as MegatronActor.backup_weights keeps them."""
    n = (64 << 20) // 2
    out = {f"w{i}": torch.ones(n, dtype=torch.bfloat16) for i in range(16)}
    return {k: v.pin_memory() for k, v in out.items()} if pinned else out


@pytest.mark.parametrize("pinned", [False, True], ids=["pageable", "pinned"])
def test_stage_one_gib_bucket(benchmark, pinned):
    state = _backup(pinned)
    ex = iw.IpcExporter(torch.device("cuda", 0))
    plan = ex.begin(state, GIB)
    assert len(plan) == 1

    def stage():
        ex.stage(0, ack=ex.outstanding)

    benchmark.pedantic(stage, rounds=5, warmup_rounds=1)
    benchmark.extra_info["GB_per_s"] = round(plan[0].nbytes / benchmark.stats.stats.mean / 1e9, 2)
    ex.end(ack=0)
    assert ex.staging.allocations == 1


def test_handles_for_256_tensors(benchmark):
    buf = torch.empty(256 * (1 << 20), dtype=torch.uint8, device="cuda")
    views = [buf[i << 20: (i + 1) << 20].view(torch.bfloat16) for i in range(256)]
    handles = benchmark(lambda: [iw.tensor_handle(v) for v in views])
    benchmark.extra_info["us_per_tensor"] = round(benchmark.stats.stats.mean / 256 * 1e6, 2)
    assert len(handles) == 256
