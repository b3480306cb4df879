"""SimGPU / SimHost accounting, the SimAllocator's CuMem semantics and costs, and the recorder."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import simpy
from allocator_conformance import ALL_CHECKS, AllocatorSubject
from hypothesis import given, settings
from hypothesis import strategies as st

from vime.errors import LifecycleError, OutOfMemoryError, SimulationError, UnknownTagError
from vime.protocols import ENGINE_TAGS, TAG_CUDA_GRAPH, TAG_KV_CACHE, TAG_RUNTIME, TAG_WEIGHTS, TagState
from vime.report.recorder import HOST, Recorder
from vime.sim import clock
from vime.sim.hardware import load_hardware
from vime.sim.memory import (
    GiB,
    HostOutOfMemoryError,
    SimAllocator,
    SimCluster,
    SimGPU,
    SimHost,
)
from vime.sim.memory.allocator import elapse

H100 = load_hardware("H100-SXM-80G")


def _cluster(num_gpus: int = 2, **kw: object) -> SimCluster:
    return SimCluster.create(simpy.Environment(), H100, num_gpus, **kw)  # type: ignore[arg-type]


def _engine_allocator(cl: SimCluster, pinned: str = "persistent", gpus: slice = slice(0, 2),
                      owner: str = "engine0") -> SimAllocator:
    return SimAllocator(owner, cl.gpus[gpus], cl.hardware, host=cl.host, known_tags=ENGINE_TAGS,
                        non_deferrable=(TAG_RUNTIME, TAG_CUDA_GRAPH), pinned=pinned)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Conformance (the same checks run against the real CuMem allocator)
# --------------------------------------------------------------------------------------------


def _sim_subject(pinned: str) -> AllocatorSubject:
    cl = _cluster()
    alloc = _engine_allocator(cl, pinned)
    return AllocatorSubject(alloc, alloc.allocate, lambda coro: clock.run(coro, env=cl.env), TAG_WEIGHTS, TAG_KV_CACHE)


@pytest.mark.parametrize("pinned", ["persistent", "cold"])
@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_sim_allocator_conforms(check, pinned):
    check(lambda: _sim_subject(pinned))


# --------------------------------------------------------------------------------------------
# Pools
# --------------------------------------------------------------------------------------------


def test_gpu_accounts_by_owner_and_tag_and_tracks_peaks():
    gpu = SimGPU(3, 10 * GiB)
    gpu.alloc("engine0", "weights", 4 * GiB)
    gpu.alloc("actor", "params", 2 * GiB)
    gpu.alloc("actor", "params", 1 * GiB)
    assert gpu.used() == 7 * GiB
    assert gpu.used("actor") == 3 * GiB
    assert gpu.used(tag="weights") == 4 * GiB
    assert gpu.free_bytes == 3 * GiB
    assert gpu.free("actor", "params", GiB) == GiB
    assert gpu.free("engine0", "weights") == 4 * GiB
    assert gpu.usage() == {("actor", "params"): 2 * GiB}
    assert gpu.peak() == 7 * GiB
    assert gpu.peak("actor", "params") == 3 * GiB


def test_free_more_than_held_is_a_model_bug():
    gpu = SimGPU(0, GiB)
    gpu.alloc("a", "t", 100)
    with pytest.raises(SimulationError, match="holds only 100"):
        gpu.free("a", "t", 101)
    with pytest.raises(ValueError):
        gpu.alloc("a", "t", -1)
    assert gpu.used() == 100


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["a", "b"]), st.sampled_from(["x", "y"]),
                          st.integers(0, 5 * GiB)), max_size=40))
def test_pool_usage_never_negative_and_never_above_capacity(ops):
    gpu = SimGPU(0, 8 * GiB)
    for is_alloc, owner, tag, n in ops:
        before = gpu.used()
        if is_alloc:
            try:
                gpu.alloc(owner, tag, n)
            except OutOfMemoryError as e:
                assert e.requested == n and e.free == 8 * GiB - before
                assert gpu.used() == before
        else:
            held = gpu.used(owner, tag)
            gpu.free(owner, tag, min(n, held))
        assert 0 <= gpu.used() <= 8 * GiB
        assert all(v > 0 for v in gpu.usage().values())
        assert gpu.used() == sum(gpu.usage().values())


def test_host_pool_unlimited_by_default_and_bounded_when_asked():
    SimHost().alloc("x", "y", 10**15)
    host = SimHost(GiB)
    with pytest.raises(HostOutOfMemoryError, match="host pinned memory") as info:
        host.alloc("actor", "pinned:params", 2 * GiB)
    assert info.value.gpu == HOST and isinstance(info.value, OutOfMemoryError)


# --------------------------------------------------------------------------------------------
# OOM: the exact moment, GPU, owner, tag and phase
# --------------------------------------------------------------------------------------------


def test_oom_on_colocated_wake_names_time_gpu_tag_and_phase():
    """An engine keeps its KV cache on GPU 1 only; the trainer's wake 5 s after its sleep fails there, not on GPU 0."""
    cl = _cluster()
    actor = SimAllocator("actor", cl.gpus, H100, host=cl.host, known_tags={"params", "optimizer"})
    actor.allocate("params", 30 * GiB)
    actor.allocate("optimizer", 30 * GiB)
    engine = SimAllocator("engine1", cl.gpus[1:], H100, host=cl.host, known_tags=ENGINE_TAGS)
    t_wake = actor.sleep_seconds(["params", "optimizer"]) + 5.0

    async def main() -> None:
        await actor.sleep(["params", "optimizer"])
        engine.allocate(TAG_KV_CACHE, 40 * GiB)
        await clock.wait_event(cl.env.timeout(5.0))
        cl.recorder.on_phase("train", True, clock.now(), 0)
        await actor.wake_up()

    with pytest.raises(OutOfMemoryError) as info:
        clock.run(main(), env=cl.env)
    err = info.value
    free = H100.memory_bytes - 40 * GiB
    assert (err.gpu, err.owner, err.phase, err.time) == (1, "actor", "train", t_wake)
    assert err.tag == "params"  # wake(None) maps sleeping tags in sorted order: optimizer fit, params did not
    assert (err.requested, err.free) == (30 * GiB, free - 30 * GiB)
    # Nothing of the failed wake stays mapped, on either GPU.
    assert cl.gpus[0].used("actor") == 0 and cl.gpus[1].used("actor") == 0
    assert actor.lifecycle.state("params") is TagState.OFFLOADED
    assert cl.recorder.oom is err
    assert cl.recorder.to_dict()["oom"]["tag"] == "params" and err.rollout_id == 0
    assert ("OOM" in [name for _, _, name, _ in cl.recorder.instants])


def test_allocate_is_all_or_nothing_across_gpus():
    cl = _cluster()
    cl.gpus[1].alloc("other", "x", 70 * GiB)
    alloc = _engine_allocator(cl)
    with pytest.raises(OutOfMemoryError) as info:
        alloc.allocate(TAG_KV_CACHE, 20 * GiB)
    assert info.value.gpu == 1
    assert alloc.device_bytes() == 0 and alloc.tag_bytes(TAG_KV_CACHE) == [0, 0]


# --------------------------------------------------------------------------------------------
# CuMem semantics
# --------------------------------------------------------------------------------------------


def _fill_engine(alloc: SimAllocator) -> None:
    alloc.allocate(TAG_WEIGHTS, 4 * GiB)
    alloc.allocate(TAG_KV_CACHE, 18 * GiB)
    alloc.allocate(TAG_CUDA_GRAPH, GiB // 2)
    alloc.allocate(TAG_RUNTIME, GiB // 4)


def test_level2_sleep_then_weights_wake_brings_non_deferrable_tags_too():
    """Seed steps 36, 7 and 13: level 2 offloads runtime + cuda_graph; waking weights also maps them."""
    cl = _cluster()
    alloc = _engine_allocator(cl)
    _fill_engine(alloc)

    async def main() -> None:
        await alloc.sleep([TAG_RUNTIME, TAG_CUDA_GRAPH], [TAG_WEIGHTS, TAG_KV_CACHE])
        assert alloc.device_bytes() == 0
        assert alloc.host_bytes() == 2 * (GiB // 2 + GiB // 4)
        await alloc.wake_up([TAG_WEIGHTS])
        assert alloc.device_bytes_per_gpu() == [4 * GiB + GiB // 2 + GiB // 4] * 2
        assert alloc.lifecycle.asleep_tags() == [TAG_KV_CACHE]
        await alloc.wake_up([TAG_KV_CACHE])

    clock.run(main(), env=cl.env)
    assert alloc.device_bytes() == 2 * (4 * GiB + 18 * GiB + GiB // 2 + GiB // 4)


def test_cold_pinned_buffers_are_freed_on_wake_and_persistent_ones_kept():
    for pinned, kept in (("cold", False), ("persistent", True)):
        cl = _cluster()
        alloc = _engine_allocator(cl, pinned)
        _fill_engine(alloc)

        async def main(alloc: SimAllocator = alloc) -> None:
            await alloc.sleep([TAG_WEIGHTS], [TAG_KV_CACHE])
            await alloc.wake_up()

        clock.run(main(), env=cl.env)
        assert (cl.host.used() > 0) is kept
        assert (alloc.host_bytes() == 2 * 4 * GiB) is kept


def test_sleep_and_wake_costs_follow_the_hardware_profile():
    cl = _cluster()
    alloc = _engine_allocator(cl, "cold")
    _fill_engine(alloc)
    hw = H100
    sleep_expected = (4 * hw.vmm.pinned_alloc_s_per_gib + 4 * GiB / hw.d2h_bytes_per_s
                      + (4 + 18) * hw.vmm.unmap_release_s_per_gib)
    # cold: the host buffer is freed on wake, and freeing pinned memory costs (cuMemFreeHost)
    wake_expected = (4 * hw.vmm.create_map_s_per_gib + 4 * GiB / hw.h2d_bytes_per_s
                     + 4 * hw.vmm.pinned_free_s_per_gib)
    times: list[float] = []

    async def main() -> None:
        await alloc.sleep([TAG_WEIGHTS], [TAG_KV_CACHE])
        times.append(clock.now())
        await alloc.wake_up([TAG_WEIGHTS])
        times.append(clock.now())

    clock.run(main(), env=cl.env)
    assert times[0] == pytest.approx(sleep_expected, rel=1e-12)
    assert times[1] - times[0] == pytest.approx(wake_expected, rel=1e-12)


def test_mapping_beside_another_process_pays_the_shared_map_cost():
    """vmm.shared_map_s_per_gib is paid per GiB mapped only on GPUs another owner has used (colocation)."""
    hw = replace(H100, vmm=replace(H100.vmm, shared_map_s_per_gib=0.01))
    seconds = {}
    for neighbour in (False, True):
        cl = SimCluster.create(simpy.Environment(), hw, 2)
        if neighbour:
            cl.gpus[0].alloc("actor", "context", 1)  # a trainer process on GPU 0 only
        alloc = _engine_allocator(cl)
        _fill_engine(alloc)

        async def main(alloc=alloc, neighbour=neighbour) -> None:
            await alloc.sleep([], [TAG_WEIGHTS, TAG_KV_CACHE])
            t0 = clock.now()
            await alloc.wake_up([TAG_KV_CACHE])
            seconds[neighbour] = clock.now() - t0

        clock.run(main(), env=cl.env)
    # the slowest GPU sets the time: GPU 0 maps the same 18 GiB of KV cache at 0.01 s/GiB more
    assert seconds[True] - seconds[False] == pytest.approx(18 * 0.01, rel=1e-9)


def test_spill_counts_what_the_pool_mapped_since_it_last_slept_wholly_against_the_free_memory_now():
    """spill_bytes: bytes beyond `share` of the memory other owners leave the GPU at this wake; the weights woken
    first in the cycle count; a neighbour's memory counts while it holds it (the s19 probe: room at each call, not at
    the cycle's first wake); a whole sleep starts anew."""
    cl = _cluster()
    alloc = _engine_allocator(cl)
    _fill_engine(alloc)  # per GPU: 4 GiB weights, 18 GiB KV, 3/4 GiB runtime + graphs (non-deferrable)
    cap = cl.gpus[0].capacity
    share = (4 * GiB + GiB // 2 + GiB // 4 + 6 * GiB) / cap  # cheap: the weights' wake and 6 GiB of KV after it
    seen: dict[str, list[int]] = {}

    async def main() -> None:
        everything = [TAG_WEIGHTS, TAG_KV_CACHE, TAG_RUNTIME, TAG_CUDA_GRAPH]
        await alloc.sleep([], everything)
        seen["kv first"] = alloc.spill_bytes([TAG_KV_CACHE], share)
        cl.gpus[1].alloc("actor", "context", 2 * GiB)  # a neighbour holding memory during the weights' wake
        await alloc.wake_up([TAG_WEIGHTS])
        cl.gpus[1].free("actor", "context", 2 * GiB)  # ... and gone before the KV's: it no longer counts
        seen["kv after weights"] = alloc.spill_bytes([TAG_KV_CACHE], share)
        cl.gpus[1].alloc("actor", "context", 2 * GiB)  # back, and there at the KV's wake: it counts
        seen["kv beside the neighbour"] = alloc.spill_bytes([TAG_KV_CACHE], share)
        await alloc.wake_up([TAG_KV_CACHE])
        await alloc.sleep([], everything)
        seen["next cycle, kv first"] = alloc.spill_bytes([TAG_KV_CACHE], share)

    clock.run(main(), env=cl.env)
    assert seen["kv first"] == pytest.approx([8 * GiB] * 2, abs=2)  # 18 3/4 GiB (KV + non-deferrable) − 10 3/4
    assert seen["kv after weights"] == pytest.approx([12 * GiB] * 2, abs=2)  # 4 3/4 + 18 − 10 3/4
    # the neighbour's 2 GiB shrink GPU 1's cheap part by share · 2 GiB
    assert seen["kv beside the neighbour"] == pytest.approx([12 * GiB, 12 * GiB + share * 2 * GiB], abs=2)
    assert seen["next cycle, kv first"] == pytest.approx([8 * GiB, 8 * GiB + share * 2 * GiB], abs=2)


def test_a_gpu_notes_what_an_owner_hands_back_and_when_it_is_ready_for_another():
    """hand_back: the bytes below the owner's high-water mark since it last handed back (a caching allocator keeps
    freed blocks until then); not_ready: what other owners handed back and the driver has not yet made ready."""
    env = simpy.Environment()
    gpu = SimGPU(0, 100 * GiB, env=env)
    gpu.alloc("actor", "params", 10 * GiB)
    gpu.alloc("actor", "activations", 60 * GiB)
    gpu.free("actor", "activations", 60 * GiB)  # freed into the cache: not handed back yet
    assert gpu.not_ready("engine", 0.01) == (0.0, 0)
    gpu.free("actor", "params", 6 * GiB)
    assert gpu.hand_back("actor") == 66 * GiB  # the high-water mark (70) less what it keeps (4)
    assert gpu.hand_back("actor") == 0  # the mark restarted at 4
    wait, left = gpu.not_ready("engine", 0.01)
    assert wait == pytest.approx(0.66) and left == 66 * GiB
    assert gpu.not_ready("actor", 0.01) == (0.0, 0)  # its own memory it may take back at once
    env.run(until=0.5)
    wait, left = gpu.not_ready("engine", 0.01)
    assert wait == pytest.approx(0.16) and left == pytest.approx(16 * GiB, abs=2)
    env.run(until=1.0)
    assert gpu.not_ready("engine", 0.01) == (0.0, 0)


def _wake_beside_a_hand_back(leave_gib: int, later_s: float = 0.0) -> tuple[float, float]:
    """(ready room in bytes, ready_wait_s of the engine's weights + KV at 0.01 s/GiB) after a trainer took all but
    `leave_gib` of each GPU while the engine slept and handed it back, `later_s` after the hand-back."""
    cl = _cluster()
    alloc = _engine_allocator(cl)
    _fill_engine(alloc)  # per GPU: 4 GiB weights, 18 GiB KV, 3/4 GiB runtime + graphs
    cap = cl.gpus[0].capacity
    seen: list[float] = []

    async def main() -> None:
        await alloc.sleep([], [TAG_WEIGHTS, TAG_KV_CACHE, TAG_RUNTIME, TAG_CUDA_GRAPH])
        for gpu in cl.gpus:
            gpu.alloc("actor", "state", cap - leave_gib * GiB)
        for gpu in cl.gpus:
            gpu.free("actor", "state")
            gpu.hand_back("actor")  # the trainer's sleep
        await elapse(cl.env, later_s)
        room = cap - (cl.gpus[0].used() - cl.gpus[0].used("engine0"))
        seen.extend([room - cl.gpus[0].not_ready("engine0", 0.01)[1], alloc.ready_wait_s([TAG_WEIGHTS, TAG_KV_CACHE], 0.01)])

    clock.run(main(), env=cl.env)
    return seen[0], seen[1]


def test_a_wake_waits_for_handed_back_memory_only_once_it_maps_beyond_what_is_ready():
    """ready_wait_s (EngineSettings.wake_ready_s_per_gib): a wake whose mapping fits the room less what is not ready
    maps at once, however much of it it takes (an H100 weights' wake of 3.9 GiB beside 5.5 GiB ready did not wait);
    one that goes beyond waits until all of it is ready (bench/data/vmm_sweep/h200_s19_*: a 124 GiB KV 0.21 s)."""
    mapping = 22 * GiB  # weights + KV
    ready, wait = _wake_beside_a_hand_back(leave_gib=30)
    assert 0.53 * ready < mapping < ready and wait == 0.0  # past the spill's share, within what is ready
    ready, wait = _wake_beside_a_hand_back(leave_gib=20)
    handed_back_s = (_cluster().gpus[0].capacity - 20 * GiB) / GiB * 0.01
    assert ready < mapping and wait == pytest.approx(handed_back_s)
    ready, wait = _wake_beside_a_hand_back(leave_gib=20, later_s=0.05)  # 5 GiB more made ready
    assert mapping < ready and wait == 0.0


def test_the_engines_kv_wake_pays_the_spill_rate_beyond_its_share() -> None:
    """remap_memory: wake_call_s + wake_per_gib_s per GiB + wake_spill_s_per_gib per GiB beyond the share."""
    from vime.sim.engine.kv import remap_memory
    from vime.sim.engine.settings import EngineSettings

    seconds = {}
    for spill in (0.0, 0.01):
        cl = _cluster()
        alloc = _engine_allocator(cl)
        _fill_engine(alloc)
        settings = replace(EngineSettings(), wake_spill_s_per_gib=spill, wake_spill_share=0.1)

        async def main(alloc=alloc, settings=settings, spill=spill, env=cl.env) -> None:
            await alloc.sleep([], [TAG_WEIGHTS, TAG_KV_CACHE, TAG_RUNTIME, TAG_CUDA_GRAPH])
            over = alloc.spill_bytes([TAG_KV_CACHE, TAG_RUNTIME, TAG_CUDA_GRAPH], settings.wake_spill_share)
            t0 = clock.now()
            await remap_memory(alloc, env, [TAG_KV_CACHE, TAG_RUNTIME, TAG_CUDA_GRAPH], settings, 0)
            seconds[spill] = (clock.now() - t0, max(over))

        clock.run(main(), env=cl.env)
    (base, _), (dear, over) = seconds[0.0], seconds[0.01]
    free = cl.gpus[0].capacity  # nothing else on the GPU while the pool sleeps
    assert over == int(18 * GiB + GiB // 2 + GiB // 4 - 0.1 * free) > 0
    assert dear - base == pytest.approx(over / GiB * 0.01, rel=1e-9)


def test_persistent_pinned_buffers_make_later_sleeps_cheaper_than_cold():
    def second_sleep(pinned: str) -> float:
        cl = _cluster()
        alloc = _engine_allocator(cl, pinned)
        _fill_engine(alloc)
        out: list[float] = []

        async def main() -> None:
            await alloc.sleep([TAG_WEIGHTS], [TAG_KV_CACHE])
            await alloc.wake_up()
            t0 = clock.now()
            await alloc.sleep([TAG_WEIGHTS], [TAG_KV_CACHE])
            out.append(clock.now() - t0)

        clock.run(main(), env=cl.env)
        return out[0]

    cold, persistent = second_sleep("cold"), second_sleep("persistent")
    assert cold - persistent == pytest.approx(2 * 4 * H100.vmm.pinned_alloc_s_per_gib / 2, rel=1e-9)


def test_memory_is_released_when_the_sleep_finishes_not_before():
    cl = _cluster(1)
    alloc = _engine_allocator(cl, gpus=slice(0, 1))
    alloc.allocate(TAG_WEIGHTS, 8 * GiB)
    seen: list[int] = []

    async def watcher() -> None:
        await clock.wait_event(cl.env.timeout(alloc.sleep_seconds([TAG_WEIGHTS]) / 2))
        seen.append(cl.gpus[0].used())

    async def main() -> None:
        import asyncio
        w = asyncio.ensure_future(watcher())
        await alloc.sleep([TAG_WEIGHTS])
        await w
        seen.append(cl.gpus[0].used())

    clock.run(main(), env=cl.env)
    assert seen == [8 * GiB, 0]


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["sleep", "wake", "alloc"]),
                          st.sets(st.sampled_from(sorted(ENGINE_TAGS))), st.sets(st.sampled_from(sorted(ENGINE_TAGS))),
                          st.integers(0, 3)), max_size=15),
       st.sampled_from(["cold", "persistent"]))
def test_random_allocator_histories_keep_device_and_host_accounting_exact(ops, pinned):
    """Whatever legal or illegal calls happen: an awake tag holds its size, a sleeping one nothing; cold
    host memory is exactly the offloaded tags; illegal calls change nothing."""
    cl = _cluster()
    alloc = _engine_allocator(cl, pinned)
    for op, tags_a, tags_b, k in ops:
        snapshot = (alloc.device_bytes(), alloc.host_bytes(), dict(alloc.lifecycle.states))
        try:
            if op == "alloc":
                alloc.allocate(min(tags_a, default=TAG_WEIGHTS), k * GiB)
            elif op == "sleep":
                clock.run(alloc.sleep(sorted(tags_a), sorted(tags_b - tags_a)), env=cl.env)
            else:
                clock.run(alloc.wake_up(None if k == 0 else sorted(tags_a)), env=cl.env)
        except LifecycleError:
            assert snapshot == (alloc.device_bytes(), alloc.host_bytes(), dict(alloc.lifecycle.states))
        for tag in ENGINE_TAGS:
            awake = alloc.lifecycle.state(tag) is TagState.AWAKE
            assert alloc.device_bytes_per_gpu(tag) == (alloc.tag_bytes(tag) if awake else [0, 0])
        offloaded = sum(sum(alloc.tag_bytes(t)) for t in ENGINE_TAGS
                        if alloc.lifecycle.state(t) is TagState.OFFLOADED)
        if pinned == "cold":
            assert alloc.host_bytes() == offloaded == cl.host.used()
        else:
            assert alloc.host_bytes() >= offloaded
        assert all(g.used() >= 0 for g in cl.gpus)


def test_sizes_as_int_list_or_sparse_mapping():
    cl = _cluster(3)
    alloc = SimAllocator("actor", cl.gpus, H100, known_tags={"activations"})
    alloc.allocate("activations", {2: 5 * GiB, 0: GiB})
    alloc.allocate("activations", [1, 2, 3])
    assert alloc.tag_bytes("activations") == [GiB + 1, 2, 5 * GiB + 3]
    alloc.release("activations", {2: 5 * GiB})
    assert alloc.device_bytes_per_gpu() == [GiB + 1, 2, 3]
    with pytest.raises(ValueError, match="outside"):
        alloc.allocate("activations", {3: 1})
    with pytest.raises(SimulationError, match="holds"):
        alloc.release("activations", {1: 3})
    alloc.release("activations")
    assert alloc.device_bytes() == 0 and all(g.used() == 0 for g in cl.gpus)


def test_allocating_into_a_sleeping_tag_and_unknown_tags_are_refused():
    cl = _cluster()
    alloc = _engine_allocator(cl)
    with pytest.raises(UnknownTagError):
        alloc.allocate("activations", 1)
    alloc.allocate(TAG_KV_CACHE, GiB)
    clock.run(alloc.sleep([], [TAG_KV_CACHE]), env=cl.env)
    with pytest.raises(LifecycleError, match="discarded"):
        alloc.allocate(TAG_KV_CACHE, 1)
    with pytest.raises(ValueError, match="3 sizes for 2 GPUs"):
        alloc.allocate(TAG_WEIGHTS, [1, 2, 3])


def test_host_oom_aborts_the_sleep_before_anything_changes():
    cl = _cluster(host_capacity=5 * GiB)
    alloc = _engine_allocator(cl)
    alloc.allocate(TAG_WEIGHTS, 4 * GiB)  # 8 GiB to offload over two GPUs
    with pytest.raises(HostOutOfMemoryError):
        clock.run(alloc.sleep([TAG_WEIGHTS]), env=cl.env)
    assert alloc.lifecycle.state(TAG_WEIGHTS) is TagState.AWAKE
    assert alloc.device_bytes() == 8 * GiB and cl.host.used() == 0


# --------------------------------------------------------------------------------------------
# Recorder
# --------------------------------------------------------------------------------------------


def _scenario() -> Recorder:
    cl = _cluster()
    alloc = _engine_allocator(cl)
    actor = SimAllocator("actor", cl.gpus, H100, host=cl.host, known_tags={"params"})

    async def main() -> None:
        rec = cl.recorder
        rec.on_phase("rollout", True, clock.now(), 0)
        _fill_engine(alloc)
        await clock.wait_event(cl.env.timeout(3.0))
        rec.on_phase("rollout", False, clock.now(), 0)
        rec.on_phase("offload", True, clock.now(), 0)
        await alloc.sleep([TAG_RUNTIME, TAG_CUDA_GRAPH], [TAG_WEIGHTS, TAG_KV_CACHE])
        rec.on_phase("offload", False, clock.now(), 0)
        rec.on_phase("train", True, clock.now(), 0)
        actor.allocate("params", 40 * GiB)
        rec.on_call("actor", "train", 0.0, clock.now())
        rec.on_phase("train", False, clock.now(), 0)

    clock.run(main(), env=cl.env)
    return cl.recorder


def test_recorder_keeps_phases_spans_samples_and_peaks_with_their_phase():
    rec = _scenario()
    assert [p[0] for p in rec.phase_spans] == ["rollout", "offload", "train"]
    peak = rec.gpu_peaks[0]
    assert peak.phase == "train" and peak.bytes == 40 * GiB
    assert peak.breakdown == (("actor", "params", 40 * GiB),)
    kv = rec.tag_peaks[(0, "engine0", TAG_KV_CACHE)]
    assert (kv.bytes, kv.phase, kv.rollout_id) == (18 * GiB, "rollout", 0)
    assert [s.name for s in rec.spans if s.track == "engine0"] == ["allocator.sleep"]
    assert rec.samples[-1].total == 40 * GiB
    assert all(a.t <= b.t for a, b in zip(rec.samples, rec.samples[1:], strict=False))
    with pytest.raises(SimulationError, match="never began"):
        rec.on_phase("eval", False, 1.0, 0)


def test_recorder_output_is_deterministic_and_json_able():
    first = json.dumps(_scenario().to_dict(), sort_keys=False)
    assert first == json.dumps(_scenario().to_dict(), sort_keys=False)
    data = json.loads(first)
    assert [p["name"] for p in data["phases"]] == ["rollout", "offload", "train"]
    assert data["gpu_peaks"]["0"]["phase"] == "train" and data["oom"] is None
    rows = _scenario().peak_table()
    assert rows == sorted(rows, key=lambda r: (r["gpu"], r["owner"], r["tag"]))
    assert {"gpu": -1, "owner": "engine0", "tag": "pinned:cuda_graph"}.items() <= next(
        r for r in rows if r["gpu"] == -1 and r["tag"] == "pinned:cuda_graph").items()


def test_cluster_uses_the_hardware_capacity():
    small = replace(H100, memory_bytes=GiB)
    cl = SimCluster.create(simpy.Environment(), small, 3)
    assert [g.capacity for g in cl.gpus] == [GiB] * 3 and [g.index for g in cl.gpus] == [0, 1, 2]
    assert cl.recorder.clock is cl.env
