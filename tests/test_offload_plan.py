"""--train-offload-plan (issue 25): validated at parse time, acted on by the simulated trainer tag by tag, and `auto`
choosing the plan and KV size that minimise T_step while fitting."""

from __future__ import annotations

import pytest

from vime.cli import main
from vime.config import parse_args
from vime.errors import ConfigError
from vime.runs.offload import bytes_moved
from vime.runs.sim import simulate
from vime.tags import offload_plan_sets, parse_offload_plan

SMALL = ["--model", "Qwen3-0.6B", "--rollout-batch-size", "8", "--num-rollout", "1"]


def test_plans_parse_to_a_canonical_form() -> None:
    assert parse_offload_plan("AUTO") == "auto"
    assert parse_offload_plan("optimizer, params") == "params,optimizer"
    assert parse_offload_plan("activations,optimizer,grads,params") == "all"
    assert offload_plan_sets("all") == (["params", "optimizer"], ["grads", "activations"])
    assert offload_plan_sets("grads,optimizer") == (["optimizer"], ["grads"])


@pytest.mark.parametrize(("argv", "needle"), [
    (["simulate", "--train-offload-plan", "weights"], "--train-offload-plan 'weights': use auto, all"),
    (["simulate", "--train-offload-plan", "params,params"], "names a tag twice"),
    (["simulate", "--train-offload-plan", "optimizer", "--no-offload-train"], "--no-offload-train"),
    (["simulate", "--train-offload-plan", "auto", "--train-offload-backend", "torch_memory_saver"],
     "--train-offload-backend cumem"),
    (["train", "--hf-checkpoint", "x", "--train-offload-plan", "auto"], "chosen by the simulator"),
])
def test_a_plan_that_cannot_act_is_refused_in_one_line(argv: list[str], needle: str,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match="--train-offload-plan"):
        parse_args(argv[1:], command=argv[0])
    assert main([*argv, "--dry-run"]) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("plan", ["all", "grads,optimizer"])
def test_a_plan_of_tags_parses_on_the_real_backend(plan: str) -> None:
    args = parse_args(["--hf-checkpoint", "x", "--train-offload-plan", plan], command="train")
    assert args.train_offload_plan == plan


MIB = 1 << 20


def test_the_real_cumem_offload_moves_only_the_plans_tags_and_keeps_the_rest_mapped() -> None:
    """vime's CuMem allocator over its fake driver (CPU): bytes moved, addresses kept, nothing lost."""
    from vime.real.cumem import CuMemAllocator, FakeDriver
    from vime.real.megatron.offload import CuMemOffload, make_offload_backend, plan_tags

    drv = FakeDriver(granularity=2 * MIB, device_capacity=256 * MIB, host_capacity=256 * MIB)
    alloc = CuMemAllocator(drv, chunk_bytes=4 * MIB)
    sizes = {"params": 6 * MIB, "grads": 4 * MIB, "optimizer": 10 * MIB}
    va = {tag: alloc.malloc(n, tag) for tag, n in sizes.items()}
    data = {}
    for k, (tag, n) in enumerate(sizes.items()):
        data[tag] = bytes((k + i * 7) % 251 for i in range(n))
        drv.write(va[tag], data[tag])
    used = drv.device_used()
    off = CuMemOffload(plan_tags("grads,optimizer"), allocator=alloc)
    off.pause(sizes["grads"] + sizes["optimizer"])
    stats = alloc.history[-1]
    assert stats.copied_bytes == sizes["optimizer"]  # the optimizer state to host; grads dropped; params stay
    assert drv.device_used() == used - sizes["grads"] - sizes["optimizer"]
    assert drv.is_mapped(va["params"]) and drv.read(va["params"], sizes["params"]) == data["params"]
    assert not drv.is_mapped(va["optimizer"]) and not drv.is_mapped(va["grads"])
    off.resume()
    assert all(drv.is_mapped(v) for v in va.values()) and drv.device_used() == used
    assert drv.read(va["optimizer"], sizes["optimizer"]) == data["optimizer"]  # same address, same bytes
    assert drv.read(va["params"], sizes["params"]) == data["params"]
    every = CuMemOffload(plan_tags("all"), allocator=alloc)
    every.pause(0)
    assert alloc.history[-1].copied_bytes == sizes["params"] + sizes["optimizer"] and drv.device_used() == 0
    every.resume()
    assert drv.read(va["params"], sizes["params"]) == data["params"]
    with pytest.raises(ConfigError, match="--train-offload-backend cumem"):
        make_offload_backend("torch_memory_saver", "optimizer")


def _trainer_sleeps(sim):
    return [s.args for s in sim.backends.recorder.spans if s.track == "actor" and s.name == "allocator.sleep"]


def test_resident_tags_stay_on_the_gpu_and_fewer_bytes_move() -> None:
    every = simulate(parse_args([*SMALL, "--gpu-memory-utilization", "0.5"], command="simulate"))
    some = simulate(parse_args([*SMALL, "--gpu-memory-utilization", "0.5", "--train-offload-plan", "optimizer"],
                               command="simulate"))
    assert every.fits and some.fits
    assert all(s["offload"] == ["params", "optimizer"] for s in _trainer_sleeps(every))
    assert all(s["offload"] == ["optimizer"] and s["discard"] == [] for s in _trainer_sleeps(some))
    moved_all, moved_some = bytes_moved(every), bytes_moved(some)
    state = every.backends.trainer.state_bytes_per_gpu()
    gib = 1024**3
    # the trainer copies its params out and back every step under `all`, not under `optimizer`
    assert moved_all["trainer_to_host"] - moved_some["trainer_to_host"] == pytest.approx(sum(state["params"]) / gib,
                                                                                         abs=2e-3)
    assert moved_some["total"] < moved_all["total"]
    # asleep after the last step: the params (and grads) are still mapped under `optimizer`, nothing under `all`
    assert some.backends.trainer.allocator.device_bytes("params") == sum(state["params"])
    assert some.backends.trainer.allocator.device_bytes("grads") == sum(state["grads"])
    assert every.backends.trainer.allocator.device_bytes("params") == 0
    assert some.backends.trainer.allocator.device_bytes("optimizer") == 0
    assert some.steps[0].t_train < every.steps[0].t_train  # nothing of the params to copy back


def test_auto_chooses_a_fitting_plan_no_slower_than_all_and_runs_it() -> None:
    args = parse_args([*SMALL, "--train-offload-plan", "auto"], command="simulate")
    sim = simulate(args)
    choice = sim.offload_choice
    assert choice is not None and sim.fits
    assert choice.chosen.fits and choice.chosen.t_step <= choice.baseline.t_step
    assert min(c.t_step for c in choice.candidates if c.fits) == choice.chosen.t_step
    assert len({(c.plan, c.gpu_memory_utilization) for c in choice.candidates}) == len(choice.candidates) > 2
    # the simulation that follows runs the chosen plan, with the same T_step
    assert sim.args.train_offload_plan == choice.chosen.plan
    assert sim.args.gpu_memory_utilization == choice.chosen.gpu_memory_utilization
    assert sim.steps[0].t_step == pytest.approx(choice.chosen.t_step, abs=1e-6)
    assert bytes_moved(sim)["total"] == choice.chosen.moved_gib


def test_simulate_prints_the_plan_bytes_moved_and_the_saving(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--gpu-memory-utilization", "0.5", "--train-offload-plan", "optimizer"]) == 0
    out = capsys.readouterr().out
    assert "Offload (--train-offload-plan optimizer):" in out and "GiB moved per step" in out
    assert "against all at --gpu-memory-utilization 0.5: T_step" in out and "saves" in out


def test_auto_refuses_a_plan_that_fits_with_less_than_its_margin():
    """A plan 1.6 GiB from the edge fit in the simulator and ran out of memory on the H200 (2026-12-02)."""
    from types import SimpleNamespace

    from vime.runs.offload import AUTO_HEADROOM, _short_of_margin

    cap = 100 << 30

    def sim(peak: int) -> SimpleNamespace:
        gpu = SimpleNamespace(index=0, capacity=cap)
        rec = SimpleNamespace(gpu_peaks={0: SimpleNamespace(bytes=peak)})
        return SimpleNamespace(backends=SimpleNamespace(gpus=[gpu], recorder=rec))

    edge = int(cap * (1 - AUTO_HEADROOM))
    assert _short_of_margin(sim(edge)) == ""
    assert "under the 2% margin" in _short_of_margin(sim(edge + (1 << 20)))
