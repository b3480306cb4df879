"""GPU tests of vime's CuMem allocator: real CUDA virtual memory under PyTorch tensors (issue 11; run on the lent H200)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

GIB = 1 << 30


@pytest.fixture
def hook():
    from vime.real.cumem.torch_hook import trainer_cumem

    h = trainer_cumem(0, chunk_bytes=64 << 20)
    yield h
    torch.cuda.synchronize()


def test_cuda_driver_reports_a_granularity_and_device_memory():
    from vime.real.cumem.cuda_driver import CudaDriver

    d = CudaDriver(0)
    free, total = d.device_free()
    assert d.granularity >= 2 << 20 and d.granularity % (2 << 20) == 0
    assert 0 < free <= total


def test_tensors_keep_addresses_and_contents_across_pause_and_resume(hook):
    alloc = hook.allocator
    with hook.region("params"):
        p = torch.randn(64 << 20, dtype=torch.bfloat16, device="cuda")  # 128 MiB
    with hook.region("optimizer"):
        m = torch.randn(32 << 20, dtype=torch.float32, device="cuda")
    with hook.region("grads"):
        g = torch.ones(32 << 20, dtype=torch.bfloat16, device="cuda")
    ref_p, ref_m = p.float().sum().item(), m.double().sum().item()
    ptrs = (p.data_ptr(), m.data_ptr(), g.data_ptr())
    used = alloc.device_bytes()
    assert used >= p.nbytes + m.nbytes + g.nbytes
    free_before = torch.cuda.mem_get_info()[0]

    stats = alloc.pause()
    assert stats.copied_bytes >= p.nbytes + m.nbytes
    assert alloc.device_bytes() == 0
    # the physical memory really went back to the driver
    assert torch.cuda.mem_get_info()[0] - free_before >= used - (64 << 20)

    alloc.resume()
    assert (p.data_ptr(), m.data_ptr(), g.data_ptr()) == ptrs
    assert p.float().sum().item() == ref_p and m.double().sum().item() == ref_m
    g.zero_()  # grads came back as fresh memory: usable, contents undefined
    assert g.sum().item() == 0


def test_training_after_a_pause_matches_training_without_one(hook):
    def run(pause_between: bool, hook_or_none):
        torch.manual_seed(0)
        x = torch.randn(256, 1024, device="cuda")
        y = torch.randn(256, 1024, device="cuda")

        def build():
            model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 1024)).cuda()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            return model, opt

        if hook_or_none is None:
            model, opt = build()
        else:
            with hook_or_none.region("params"):
                model, opt = build()
            with hook_or_none.region("optimizer"):
                for prm in model.parameters():  # Adam state allocated up front, inside its tag
                    opt.state[prm] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(prm),
                                      "exp_avg_sq": torch.zeros_like(prm)}
        losses = []
        for _ in range(3):
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(loss.item())
            if pause_between:
                hook_or_none.allocator.pause(["params", "optimizer"])
                hook_or_none.allocator.resume()
        return losses, [p.detach().clone() for p in model.parameters()]

    ref_losses, ref_params = run(False, None)
    losses, params = run(True, hook)
    assert losses == pytest.approx(ref_losses, rel=1e-5)
    for a, b in zip(params, ref_params, strict=True):
        torch.testing.assert_close(a, b)
    assert len(hook.allocator.history) == 6


def test_not_enough_host_memory_is_refused_before_the_copy(hook):
    from vime.real.cumem import HostMemoryError

    alloc = hook.allocator
    with hook.region("optimizer"):
        t = torch.full((64 << 20,), 3.0, device="cuda")
    alloc.host_limit_bytes = 32 << 20
    with pytest.raises(HostMemoryError, match="short by"):
        alloc.pause(["optimizer"])
    assert alloc.device_bytes("optimizer") > 0 and t.sum().item() == 3.0 * (64 << 20)


def test_remap_failure_when_the_gpu_is_full_then_resume_after_freeing(hook):
    from vime.real.cumem import RemapError

    alloc = hook.allocator
    with hook.region("params"):
        t = torch.arange(256 << 20, dtype=torch.int32, device="cuda")  # 1 GiB
    ref = int(t.sum(dtype=torch.int64))
    alloc.pause(["params"])
    free, _ = torch.cuda.mem_get_info()
    hog = torch.empty(free - (256 << 20), dtype=torch.uint8, device="cuda")  # leave too little
    with pytest.raises(RemapError, match="Free GPU memory"):
        alloc.resume(["params"])
    del hog
    torch.cuda.empty_cache()
    alloc.resume(["params"])
    assert int(t.sum(dtype=torch.int64)) == ref
