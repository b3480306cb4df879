"""The real session's checks and lifecycle (issue 8) with fake launchers and trainers: what it builds, and that it tears everything down on success, failure and cancellation."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import vime.real.cluster as cluster_mod
import vime.real.session as session_mod
import vime.real.vllm.fleet as fleet_mod
import vime.real.vllm.launcher as launcher_mod
import vime.real.vllm.router as router_mod
import vime.rollout.data_source as data_mod
from vime.config import parse_args
from vime.errors import ConfigError, EngineError
from vime.real.vllm.router import RouterSpec
from vime.real.weights.disk import DiskSyncEngine, DiskSyncTrainer
from vime.rollout.toy_task import ToyTask, write_prompts


def _args(tmp_path: Path, *extra: str):
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text("{}")
    prompts = write_prompts(tmp_path / "toy.jsonl", ToyTask(vocab_size=300, num_prompts=4))
    return parse_args(["--hf-checkpoint", str(model), "--prompt-data", str(prompts),
                       "--actor-num-gpus-per-node", "1", "--tensor-model-parallel-size", "1",
                       "--rollout-num-gpus-per-engine", "1", "--rollout-batch-size", "2",
                       "--n-samples-per-prompt", "4", "--micro-batch-size", "4", *extra], command="train")


def test_cpu_needs_disk_mode_and_inputs(tmp_path):
    args = _args(tmp_path)
    with pytest.raises(ConfigError, match="--update-weight-mode disk"):
        session_mod.check_args(args, "cpu")
    session_mod.check_args(args, "cuda")  # tensor mode is fine with GPUs
    disk = _args(tmp_path, "--update-weight-mode", "disk")
    session_mod.check_args(disk, "cpu")
    with pytest.raises(ConfigError, match="--hf-checkpoint"):
        session_mod.check_args(disk.replace(hf_checkpoint=str(tmp_path / "nope")), "cpu")
    with pytest.raises(ConfigError, match="toy_task"):
        session_mod.check_args(disk.replace(prompt_data=None), "cpu")


def test_server_overrides_on_cpu_and_gpu(tmp_path):
    disk = _args(tmp_path, "--update-weight-mode", "disk")
    cpu = session_mod.server_overrides(disk, "cpu")
    assert cpu["dtype"] == "float32" and cpu["enforce_eager"] and cpu["cpu_kvcache_space_gib"] >= 1
    assert cpu["weight_transfer_backend"] is None and cpu["cpu_reload_fix"]
    from vime.real.vllm import cpu_fix
    from vime.real.vllm.launcher import ServerSpec, server_env

    # the fix's path is resolved where the server starts (the engine's node), not on the driver
    env = server_env(ServerSpec(model="m", port=1, device="cpu", cpu_reload_fix=True), base={"PYTHONPATH": "/x"})
    assert env["PYTHONPATH"].split(os.pathsep) == [cpu_fix.PATH, "/x"]
    assert (Path(cpu_fix.PATH) / "sitecustomize.py").is_file()
    assert session_mod.server_overrides(_args(tmp_path), "cuda") == {}


# --------------------------------------------------------------------------------------------
# Lifecycle with fakes
# --------------------------------------------------------------------------------------------


class FakeLauncher:
    """The driver-side launcher: only the router runs there now."""

    instances: list[FakeLauncher] = []

    def __init__(self, log_dir: Path, **kw: Any) -> None:
        self.log_dir = log_dir
        self.events: list[str] = []
        FakeLauncher.instances.append(self)

    def __enter__(self) -> FakeLauncher:
        self.events.append("enter")
        return self

    def __exit__(self, *exc: object) -> None:
        self.events.append("exit")

    def stop_all(self) -> None:
        self.events.append("stop_all")


class FakeReserved:
    def __init__(self, plan: Any) -> None:
        self.plan = plan
        self.nodes = [cluster_mod.NodeInfo("n0", "10.0.0.1")] * plan.num_nodes
        self.driver_node_id = "n0"
        self.released = False

    def describe(self) -> list[str]:
        return self.plan.describe()

    def release(self) -> None:
        self.released = True


class FakeFleet:
    """The engine fleet: records what the session asks of it."""

    instances: list[FakeFleet] = []
    fail = False

    def __init__(self, reserved: Any, log_dir: Path, **kw: Any) -> None:
        self.reserved = reserved
        self.events: list[str] = []
        self.engines: list[Any] = []
        self.need_paths: list[str] = []
        FakeFleet.instances.append(self)

    def start(self, specs: Any, *, timeout_s: float, need_paths: Any = ()) -> list[Any]:
        if FakeFleet.fail:
            raise EngineError("engine0", "start", "process exited with code 1 before it was healthy")
        import dataclasses

        self.events.append(f"start:{len(specs)}")
        self.need_paths = list(need_paths)
        self.specs = [dataclasses.replace(s, port=5000 + i) for i, s in enumerate(specs)]
        return self.specs

    def restart(self, name: str, *, timeout_s: float) -> float:
        self.events.append(f"restart:{name}")
        return 0.1

    def describe(self) -> list[str]:
        return []

    def stop_all(self) -> None:
        self.events.append("stop_all")


class FakeTrainer:
    def __init__(self) -> None:
        from vime.protocols import TrainerLifecycle

        self.lifecycle = TrainerLifecycle()
        self.shut = False
        self.ranks = [{"ip": "10.0.0.1", "node_id": "n0", "pid": 1}]

    def shutdown(self) -> None:
        self.shut = True


@pytest.fixture
def fakes(monkeypatch, tmp_path):
    FakeLauncher.instances = []
    FakeFleet.instances = []
    FakeFleet.fail = False
    trainers: list[FakeTrainer] = []
    reserved: list[FakeReserved] = []

    def start_trainer(args: Any, placement: Any) -> FakeTrainer:
        assert placement is reserved[-1], "the trainer shares the session's placement with the engines"
        trainers.append(FakeTrainer())
        return trainers[-1]

    def reserve(args: Any, device: str) -> FakeReserved:
        from vime.placement import plan_placement

        reserved.append(FakeReserved(plan_placement(args, use_gpus=device == "cuda")))
        return reserved[-1]

    def start_router(launcher: Any, spec: RouterSpec, **kw: Any):
        launcher.events.append("router:" + ",".join(spec.worker_urls))
        return "router-proc", RouterSpec(spec.worker_urls, spec.policy, port=4321, prometheus_port=4322)

    monkeypatch.setattr(launcher_mod, "Launcher", FakeLauncher)
    monkeypatch.setattr(fleet_mod, "EngineFleet", FakeFleet)
    monkeypatch.setattr(cluster_mod, "init_ray", lambda *a, **k: None)
    monkeypatch.setattr(session_mod, "_reserve", reserve)
    monkeypatch.setattr(router_mod, "start_router", start_router)
    monkeypatch.setattr(session_mod, "_start_trainer", start_trainer)
    monkeypatch.setattr(session_mod, "detect_device", lambda: "cpu")
    monkeypatch.setattr(data_mod, "load_tokenizer", lambda args: None)
    monkeypatch.setenv("VIME_UPDATE_WEIGHT_DIR", str(tmp_path / "weights"))
    monkeypatch.delenv("VIME_KEEP_WORKDIR", raising=False)
    return SimpleNamespace(trainers=trainers, reserved=reserved)


def _torn_down(fakes: Any) -> None:
    """Everything the session started was stopped: engines, trainer, placement, the launcher last."""
    (fleet,) = FakeFleet.instances
    assert fleet.events[-1] == "stop_all"
    assert all(t.shut for t in fakes.trainers)
    assert fakes.reserved[-1].released
    assert FakeLauncher.instances[0].events[-2:] == ["exit", "stop_all"]


def test_session_builds_disk_wrapped_backends_and_tears_down(fakes, tmp_path):
    args = _args(tmp_path, "--update-weight-mode", "disk")
    seen: dict[str, Any] = {}

    async def main():
        async with session_mod.real_session(args) as s:
            seen.update(engines=s.engines, trainer=s.trainer, router=s.router, data=s.data_source,
                        weight_dir=s.weight_dir, log_dir=s.log_dir, urls=s.engine_urls, router_url=s.router_url,
                        placement=s.placement)
            assert s.data_source.get_samples(1)[0][0].tokens == ToyTask(vocab_size=300, num_prompts=4).prompts()[0]

    asyncio.run(main())
    assert len(seen["engines"]) == 1 and isinstance(seen["engines"][0], DiskSyncEngine)
    assert isinstance(seen["trainer"], DiskSyncTrainer) and seen["trainer"].next_version == 1
    assert seen["weight_dir"] == tmp_path / "weights"
    assert seen["router_url"] == "http://127.0.0.1:4321" and seen["router"].engines == [seen["engines"][0].inner]
    # the fleet's addresses are what the router and the clients use
    assert seen["urls"] == ["http://127.0.0.1:5000"]
    (launcher,) = FakeLauncher.instances
    assert launcher.events == ["enter", "router:http://127.0.0.1:5000", "exit", "stop_all"]
    (fleet,) = FakeFleet.instances
    assert fleet.events == ["start:1", "stop_all"]
    # every node must see the model and the weight directory at these paths
    assert fleet.need_paths == [str((tmp_path / "model").resolve()), str((tmp_path / "weights").resolve())]
    assert seen["placement"]["num_nodes"] == 1 and seen["placement"]["trainer_ranks"][0]["node_ip"] == "10.0.0.1"
    _torn_down(fakes)
    assert not seen["log_dir"].parent.exists(), "the session's temporary work directory is removed"


def test_engines_restart_through_the_fleet(fakes, tmp_path):
    args = _args(tmp_path, "--update-weight-mode", "disk")

    async def main():
        async with session_mod.real_session(args) as s:
            await s.engines[0].inner.relaunch()

    asyncio.run(main())
    assert FakeFleet.instances[0].events == ["start:1", "restart:engine0", "stop_all"]


def test_failed_server_start_still_stops_the_trainer(fakes, tmp_path):
    FakeFleet.fail = True
    args = _args(tmp_path, "--update-weight-mode", "disk")

    async def main():
        async with session_mod.real_session(args):
            raise AssertionError("not reached")

    with pytest.raises(EngineError, match="before it was healthy"):
        asyncio.run(main())
    _torn_down(fakes)


@pytest.mark.parametrize("how", ["error", "cancel"])
def test_failure_or_cancellation_inside_the_session_tears_down(fakes, tmp_path, how):
    args = _args(tmp_path, "--update-weight-mode", "disk")
    inside = asyncio.Event()

    async def body():
        async with session_mod.real_session(args):
            inside.set()
            if how == "error":
                raise RuntimeError("step failed")
            await asyncio.Event().wait()  # a run in progress: Ctrl-C cancels the main task

    async def main():
        task = asyncio.create_task(body())
        await asyncio.wait([task, asyncio.create_task(inside.wait())], return_when=asyncio.FIRST_COMPLETED)
        if how == "cancel":
            task.cancel()
        await task

    with pytest.raises(RuntimeError if how == "error" else asyncio.CancelledError):
        asyncio.run(main())
    assert inside.is_set()
    _torn_down(fakes)


def test_on_gpus_colocated_engines_start_and_sleep_before_the_trainer(fakes, monkeypatch, tmp_path):
    """Seed step 3: a vLLM server sizes its KV cache from the memory free at its start, so on GPUs the
    engines start alone and sleep at level 2 before the trainer allocates; on CPU both start at once.
    A model directory without tokenizer files is served token-ids-only."""
    import vime.real.vllm.client as client_mod

    order: list[str] = []
    specs_seen: list[Any] = []
    real_start = FakeFleet.start

    def start(self: FakeFleet, specs: Any, **kw: Any) -> list[Any]:
        specs_seen.extend(specs)
        order.append("servers")
        return real_start(self, specs, **kw)

    async def sleep(self: Any, level: int, mode: str = "keep") -> None:
        order.append(f"sleep:{self.name}:{level}")

    def start_trainer(args: Any, placement: Any) -> FakeTrainer:
        order.append("trainer")
        fakes.trainers.append(FakeTrainer())
        return fakes.trainers[-1]

    monkeypatch.setattr(FakeFleet, "start", start)
    monkeypatch.setattr(client_mod.VLLMEngine, "sleep", sleep)
    monkeypatch.setattr(session_mod, "_start_trainer", start_trainer)
    monkeypatch.setattr(session_mod, "detect_device", lambda: "cuda")
    args = _args(tmp_path, "--colocate", "--update-weight-mode", "tensor")
    assert session_mod.sequential_startup(args, "cuda") and not session_mod.sequential_startup(args, "cpu")
    assert not session_mod.sequential_startup(_args(tmp_path, "--no-colocate", "--rollout-num-gpus", "1"), "cuda")

    async def main() -> list[Any]:
        async with session_mod.real_session(args) as s:
            return list(s.engines)

    engines = asyncio.run(main())
    assert order == ["servers", "sleep:engine0:2", "trainer"]
    assert [s.skip_tokenizer_init for s in specs_seen] == [True]  # _args' model has no tokenizer files
    assert [s.cuda_visible_devices for s in specs_seen] == [None]  # the fleet sets them from the bundles
    assert [e.detokenize for e in engines] == [False]
    _torn_down(fakes)


def test_ctrl_c_handed_to_another_thread_still_wakes_the_run_loop() -> None:
    """The kernel may give a run's SIGINT to one of Ray's threads: sent to a helper thread once the loop sleeps in
    epoll with nothing due, it must still end that sleep at once (`signals_wake_the_loop`). Without the wakeup fd
    the loop slept on until the bound below released it (checked when the fix was written)."""
    import signal
    import threading

    from vime.runs.real import signals_wake_the_loop

    woken, stuck = threading.Event(), []

    def main_thread_asleep() -> bool:
        stat = Path(f"/proc/self/task/{threading.main_thread().native_id}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] == "S"

    async def main() -> None:
        loop = asyncio.get_running_loop()
        never, idle = loop.create_future(), threading.Event()

        def ctrl_c_on_this_thread() -> None:
            # a thread inherits its creator's signal mask: whatever an earlier test left blocked, this one takes SIGINT
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
            idle.wait()
            while not main_thread_asleep():  # the loop has nothing due: it goes to sleep in epoll
                os.sched_yield()
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)
            if not woken.wait(30):  # a bound for a hang, not a timing check
                stuck.append(True)
                loop.call_soon_threadsafe(lambda: never.done() or never.set_result(None))

        with signals_wake_the_loop():
            threading.Thread(target=ctrl_c_on_this_thread, daemon=True).start()
            loop.call_soon(idle.set)
            try:
                await never
            except asyncio.CancelledError:  # asyncio.run's SIGINT handler cancels the main task
                woken.set()
                raise

    previous = signal.signal(signal.SIGINT, signal.default_int_handler)  # asyncio.run installs its own over this one
    try:
        with pytest.raises(KeyboardInterrupt):
            asyncio.run(main())
    finally:
        signal.signal(signal.SIGINT, previous)
    assert not stuck and woken.is_set()
