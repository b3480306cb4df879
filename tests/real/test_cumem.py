"""CPU tests of vime's CuMem allocator bookkeeping over the fake driver (issue 11)."""

from __future__ import annotations

import asyncio
import ctypes

import pytest

from vime.errors import LifecycleError, UnknownTagError
from vime.protocols import Allocator, TagState
from vime.real.cumem import CuMemAllocator, FakeDriver, HostMemoryError, RemapError
from vime.real.cumem.driver import DriverError, VmmDriver, meminfo_available
from vime.real.cumem.torch_hook import HookError, TorchCuMem

MIB = 1 << 20


def _alloc(**kw) -> tuple[CuMemAllocator, FakeDriver]:
    drv = FakeDriver(granularity=2 * MIB, device_capacity=kw.pop("device_capacity", 256 * MIB),
                     host_capacity=kw.pop("host_capacity", 256 * MIB))
    return CuMemAllocator(drv, chunk_bytes=kw.pop("chunk_bytes", 4 * MIB), **kw), drv


def _fill(drv: FakeDriver, va: int, n: int, seed: int) -> bytes:
    data = bytes((seed + i * 7) % 251 for i in range(n))
    drv.write(va, data)
    return data


def test_fake_driver_satisfies_the_driver_protocol():
    assert isinstance(FakeDriver(), VmmDriver)


def test_malloc_rounds_to_granularity_and_free_returns_everything():
    a, drv = _alloc()
    va = a.malloc(3 * MIB + 5, "params")
    assert a.regions[va].size == 4 * MIB and a.regions[va].nbytes == 3 * MIB + 5
    assert drv.is_mapped(va) and drv.device_used() == 4 * MIB
    assert a.device_bytes("params") == 4 * MIB and a.device_bytes("grads") == 0
    a.free(va)
    assert drv.device_used() == 0 and drv.reserved_ranges() == 0 and not a.regions


def test_pause_offloads_kept_tags_discards_grads_and_resume_restores_at_same_addresses():
    a, drv = _alloc()
    p = a.malloc(6 * MIB, "params")
    o = a.malloc(10 * MIB + 123, "optimizer")
    g = a.malloc(2 * MIB, "grads")
    pdata, odata = _fill(drv, p, 6 * MIB, 1), _fill(drv, o, 10 * MIB + 123, 2)
    _fill(drv, g, 2 * MIB, 3)

    stats = a.pause()
    assert drv.device_used() == 0 and not drv.is_mapped(p)
    assert stats.copied_bytes == 6 * MIB + 10 * MIB + 123
    assert stats.released_bytes == 6 * MIB + 12 * MIB + 2 * MIB
    assert a.lifecycle.state("params") is TagState.OFFLOADED
    assert a.lifecycle.state("grads") is TagState.DISCARDED

    a.resume()
    assert [drv.is_mapped(v) for v in (p, o, g)] == [True, True, True]
    assert drv.read(p, 6 * MIB) == pdata
    assert drv.read(o, 10 * MIB + 123) == odata
    # grads come back mapped but not copied: fresh memory (the fake fills it with 0xa5)
    assert drv.read(g, 16) == b"\xa5" * 16
    assert a.lifecycle.asleep_tags() == []


def test_host_buffers_are_allocated_once_and_reused_every_cycle():
    a, drv = _alloc(chunk_bytes=4 * MIB)
    p = a.malloc(10 * MIB, "params")
    a.pause()
    first = drv.calls.count("host_alloc")
    assert first == 3  # 10 MiB in chunks of 4
    host = a.host_bytes()
    for seed in range(3):
        a.resume()
        data = _fill(drv, p, 10 * MIB, seed)
        stats = a.pause()
        assert stats.host_alloc_bytes == 0
        a.resume()
        assert drv.read(p, 10 * MIB) == data
        a.pause()
        a.resume()
        a.pause()
    assert drv.calls.count("host_alloc") == first and a.host_bytes() == host
    assert a.history[0].host_alloc_bytes == 12 * MIB


def test_prepare_host_moves_the_pinning_out_of_the_first_pause():
    a, drv = _alloc()
    a.malloc(8 * MIB, "optimizer")
    a.malloc(8 * MIB, "grads")
    assert a.host_bytes_needed() == 8 * MIB  # grads are discarded, nothing to keep
    assert a.prepare_host() == 8 * MIB
    stats = a.pause()
    assert stats.host_alloc_bytes == 0 and a.host_bytes() == 8 * MIB


def test_pause_copies_each_region_before_unmapping_it_after_synchronizing():
    a, drv = _alloc()
    a.malloc(4 * MIB, "params")
    a.malloc(4 * MIB, "optimizer")
    drv.calls.clear()
    a.pause(["params", "optimizer"])
    assert drv.synchronized == 1
    calls = [c for c in drv.calls if c in ("copy_d2h", "unmap")]
    # both copies are issued before the first unmap: the host releases while the DMA runs
    assert calls == ["copy_d2h", "copy_d2h", "unmap", "unmap"]


def test_pausing_a_subset_leaves_other_tags_mapped():
    a, drv = _alloc()
    p = a.malloc(2 * MIB, "params")
    g = a.malloc(2 * MIB, "grads")
    a.pause(["grads"])
    assert drv.is_mapped(p) and not drv.is_mapped(g)
    assert a.lifecycle.state("params") is TagState.AWAKE
    a.resume(["grads"])
    assert drv.is_mapped(g)


def test_double_pause_and_resume_without_pause_raise_lifecycle_errors_before_any_driver_call():
    a, drv = _alloc()
    a.malloc(2 * MIB, "params")
    with pytest.raises(LifecycleError, match="resume without pause"):
        a.resume(["params"])
    a.pause(["params"])
    n = len(drv.calls)
    with pytest.raises(LifecycleError, match="already|wake it before"):
        a.pause(["params"])
    assert len(drv.calls) == n


def test_unknown_tags_and_allocating_into_a_paused_tag_are_refused():
    a, _ = _alloc()
    with pytest.raises(UnknownTagError):
        a.malloc(MIB, "kv_cache")
    with pytest.raises(UnknownTagError):
        a.pause(["weights"])
    a.pause(["params"])
    with pytest.raises(LifecycleError, match="resume the tag"):
        a.malloc(MIB, "params")


def test_not_enough_host_memory_is_reported_with_the_figure_before_anything_moves():
    a, drv = _alloc(host_capacity=8 * MIB, chunk_bytes=2 * MIB)
    a.malloc(6 * MIB, "params")
    a.malloc(6 * MIB, "optimizer")
    a.malloc(64 * MIB, "grads")  # discarded: needs no host memory
    with pytest.raises(HostMemoryError) as err:
        a.pause()
    assert err.value.needed == 12 * MIB and err.value.available == 8 * MIB
    assert "needs 12.0 MiB" in str(err.value) and "short by 4.0 MiB" in str(err.value)
    assert drv.calls.count("copy_d2h") == 0 and drv.device_used() == 76 * MIB
    assert a.lifecycle.asleep_tags() == []
    # pausing only what fits works
    a.pause(["params", "grads"])


def test_host_limit_override_replaces_meminfo():
    a, _ = _alloc(host_limit_bytes=4 * MIB, chunk_bytes=2 * MIB)
    a.malloc(6 * MIB, "params")
    with pytest.raises(HostMemoryError):
        a.check_host_memory()
    a.host_limit_bytes = 6 * MIB
    assert a.check_host_memory() == 6 * MIB


def test_remap_failure_keeps_the_tag_asleep_and_a_later_resume_finishes():
    a, drv = _alloc()
    v1 = a.malloc(4 * MIB, "optimizer")
    v2 = a.malloc(4 * MIB, "optimizer")
    d1, d2 = _fill(drv, v1, 4 * MIB, 5), _fill(drv, v2, 4 * MIB, 6)
    a.pause(["optimizer"])
    drv.fail_creates = 0
    # second create fails: the first region is remapped and filled, the second is not
    orig = drv.create
    calls = {"n": 0}

    def flaky(size):
        calls["n"] += 1
        if calls["n"] == 2:
            raise DriverError("cuMemCreate", "CUDA_ERROR_OUT_OF_MEMORY", "test")
        return orig(size)

    drv.create = flaky  # type: ignore[method-assign]
    with pytest.raises(RemapError, match="still unmapped") as err:
        a.resume(["optimizer"])
    assert err.value.region.va == v2 and err.value.cause.out_of_memory
    assert a.lifecycle.state("optimizer") is TagState.OFFLOADED
    assert drv.is_mapped(v1) and not drv.is_mapped(v2)
    a.resume(["optimizer"])
    assert drv.read(v1, 4 * MIB) == d1 and drv.read(v2, 4 * MIB) == d2


def test_remap_failure_from_device_capacity():
    a, drv = _alloc(device_capacity=8 * MIB)
    a.malloc(8 * MIB, "params")
    a.pause(["params"])
    other = drv.create(4 * MIB)  # someone else (the rollout engine) took memory meanwhile
    with pytest.raises(RemapError, match="Free GPU memory"):
        a.resume()
    drv.release(other)
    a.resume()


def test_free_while_paused_returns_host_pieces_for_reuse():
    a, drv = _alloc(chunk_bytes=4 * MIB)
    v = a.malloc(4 * MIB, "params")
    a.pause()
    a.free(v)
    assert drv.reserved_ranges() == 0 and a.arena.free_bytes() == 4 * MIB
    a.resume()
    w = a.malloc(4 * MIB, "params")
    data = _fill(drv, w, 4 * MIB, 9)
    a.pause()
    assert drv.calls.count("host_alloc") == 1  # the piece was reused
    a.resume()
    assert drv.read(w, 4 * MIB) == data


def test_close_gives_back_device_and_host_memory():
    a, drv = _alloc()
    a.malloc(4 * MIB, "params")
    a.malloc(2 * MIB, "grads")
    a.pause()
    a.close()
    assert drv.device_used() == 0 and drv.host_used() == 0 and drv.reserved_ranges() == 0


def test_constructor_validates_its_arguments():
    with pytest.raises(ValueError, match="discardable"):
        CuMemAllocator(FakeDriver(), discardable=["kv_cache"])
    with pytest.raises(ValueError, match="chunk_bytes"):
        CuMemAllocator(FakeDriver(), chunk_bytes=0)
    a = CuMemAllocator(FakeDriver())
    with pytest.raises(ValueError, match="did not allocate"):
        a.free(0x1234)
    with pytest.raises(ValueError, match="both offloaded and discarded"):
        a.sleep_sync(["params"], ["params"])


def test_allocator_protocol_conformance_and_async_form():
    a, drv = _alloc()
    assert isinstance(a, Allocator)
    v = a.malloc(2 * MIB, "params")
    data = _fill(drv, v, 2 * MIB, 4)

    async def cycle() -> None:
        await a.sleep(["params"], ["grads"])
        assert a.device_bytes() == 0
        await a.wake_up()

    asyncio.run(cycle())
    assert drv.read(v, 2 * MIB) == data


def test_meminfo_available_reads_the_figure(tmp_path):
    f = tmp_path / "meminfo"
    f.write_text("MemTotal: 100 kB\nMemAvailable:    2048 kB\n")
    assert meminfo_available(str(f)) == 2048 * 1024
    assert meminfo_available(str(tmp_path / "missing")) == 0


def test_torch_hook_callbacks_route_to_the_current_tag_and_keep_errors():
    a, drv = _alloc()
    hook = TorchCuMem(a)
    alloc_ptr, free_ptr = hook.function_pointers()
    alloc = ctypes.cast(alloc_ptr, ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int, ctypes.c_void_p))
    free = ctypes.cast(free_ptr, ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p))
    # outside a region: NULL and the error is kept for check()
    assert alloc(2 * MIB, 0, None) is None
    with pytest.raises(HookError, match="outside"):
        hook.check()
    hook._tls.tag = "optimizer"
    va = alloc(3 * MIB, 0, None)
    assert va in a.regions and a.regions[va].tag == "optimizer"
    free(va, 3 * MIB, 0, None)
    assert not a.regions and drv.device_used() == 0
    free(0xDEAD, 1, 0, None)  # unknown pointer: recorded, not raised into C
    with pytest.raises(HookError, match="did not allocate"):
        hook.check()
    hook.check()  # errors were forgotten
