"""Launcher: server arguments from Args (seed step 2), environment, and process handling with stand-in servers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from vime.config import parse_args
from vime.errors import ConfigError, EngineError
from vime.real.ports import free_ports
from vime.real.vllm.launcher import (
    ENTRY_MODULE,
    Launcher,
    ServerSpec,
    VLLMInstall,
    detect_vllm,
    engine_specs,
    server_command,
    server_env,
)

NEW = VLLMInstall(Path("/x/vllm"), "0.32.0", has_scale_out_flag=True, is_cpu_build=True)
OLD = VLLMInstall(Path("/x/vllm"), "0.25.1", has_scale_out_flag=False, is_cpu_build=False)


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_seed_scenario_gives_four_tp2_engines_with_sleep_and_ipc():
    args = parse_args([], command="train")
    specs = engine_specs(args, model="/models/Qwen3-4B", ports=[8000, 8001, 8002, 8003])
    assert len(specs) == args.rollout_num_engines == 4
    argv = server_command(specs[1], python="python", install=OLD)
    assert argv[:3] == ["python", "-m", ENTRY_MODULE]
    assert flag(argv, "--model") == "/models/Qwen3-4B" and flag(argv, "--port") == "8001"
    assert flag(argv, "--tensor-parallel-size") == str(args.rollout_num_gpus_per_engine) == "2"
    assert flag(argv, "--max-model-len") == str(args.rollout_max_context_len) == "4096"
    assert flag(argv, "--gpu-memory-utilization") == "0.9"
    assert "--enable-sleep-mode" in argv  # offload_rollout (colocate turns it on)
    assert json.loads(flag(argv, "--weight-transfer-config")) == {"backend": "ipc"}
    assert "--enable-scale-out" not in argv  # the installed vLLM (0.25.1 here) has no such flag
    assert [s.cuda_visible_devices for s in specs] == ["0,1", "2,3", "4,5", "6,7"]


def test_scale_out_flag_follows_the_installed_version_unless_forced():
    spec = ServerSpec(model="/m", port=1)
    assert "--enable-scale-out" in server_command(spec, install=NEW)
    assert "--enable-scale-out" not in server_command(spec, install=OLD)
    forced = ServerSpec(model="/m", port=1, enable_scale_out=False)
    assert "--enable-scale-out" not in server_command(forced, install=NEW)


def test_not_colocated_not_offloaded_drops_ipc_and_sleep():
    args = parse_args(["--no-colocate", "--rollout-num-gpus", "4", "--no-offload-rollout"], command="train")
    argv = server_command(engine_specs(args, model="/m")[0], install=OLD)
    assert "--enable-sleep-mode" not in argv and "--weight-transfer-config" not in argv


def test_cpu_specs_never_ask_for_sleep_mode_or_gpu_memory():
    args = parse_args(["--actor-num-gpus-per-node", "2", "--tensor-model-parallel-size", "1",
                       "--rollout-num-gpus-per-engine", "1"], command="train")
    specs = engine_specs(args, model="/m", device="cpu", dtype="float32", enforce_eager=True,
                         cpu_kvcache_space_gib=1)
    argv = server_command(specs[0], install=NEW)
    assert "--enable-sleep-mode" not in argv and "--gpu-memory-utilization" not in argv
    assert "--tensor-parallel-size" not in argv
    assert flag(argv, "--dtype") == "float32" and "--enforce-eager" in argv
    env = server_env(specs[0], base={})
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "VLLM_ALLOW_INSECURE_SERIALIZATION": "1",
                   "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert specs[0].port != specs[1].port


def test_sleep_mode_on_cpu_is_refused_with_a_fix():
    with pytest.raises(ConfigError, match="CUDA/ROCm"):
        server_command(ServerSpec(model="/m", port=1, device="cpu", enable_sleep_mode=True), install=NEW)


def test_engine_specs_errors_name_the_fix():
    args = parse_args([], command="train")
    with pytest.raises(ConfigError, match="--hf-checkpoint"):
        engine_specs(args)
    with pytest.raises(ConfigError, match="one port per engine"):
        engine_specs(args, model="/m", ports=[1, 2])
    with pytest.raises(ConfigError, match="unknown ServerSpec fields"):
        engine_specs(args, model="/m", dtyp="float32")


def test_env_for_gpu_without_ipc():
    spec = ServerSpec(model="/m", port=1, cuda_visible_devices="2,3", extra_env={"X": "y"})
    env = server_env(spec, base={"PATH": "/bin"})
    assert env == {"PATH": "/bin", "VLLM_SERVER_DEV_MODE": "1", "CUDA_VISIBLE_DEVICES": "2,3", "X": "y"}


def test_free_ports_are_distinct():
    ports = free_ports(8)
    assert len(set(ports)) == 8


def test_detect_vllm_reads_files_without_importing():
    info = detect_vllm()
    assert "vllm" not in sys.modules or info.found
    if info.found:
        assert info.version and (info.path / "__init__.py").exists()


# ---------------------------------------------------------------------------------------------
# processes: stand-in servers (a few lines of python) instead of vLLM
# ---------------------------------------------------------------------------------------------

SERVER = textwrap.dedent("""
    import http.server, os, subprocess, sys, time
    time.sleep(float(sys.argv[2]))
    if sys.argv[3] == "crash":
        print("fatal: model config invalid", flush=True)
        sys.exit(3)
    # a grandchild, as vLLM's engine core and workers are
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    open(sys.argv[4], "w").write(str(child.pid))
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if sys.argv[3] == "ok" else 503); self.end_headers()
        def log_message(self, *a): print("served", self.path, flush=True)
    print("listening", flush=True)
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie counts as dead
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def start_fake(launcher: Launcher, tmp_path: Path, mode: str, delay: float = 0.3):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    port = free_ports(1)[0]
    child_file = tmp_path / f"child-{mode}.pid"
    proc = launcher.start_process(f"fake-{mode}", [sys.executable, str(script), str(port), str(delay), mode,
                                                   str(child_file)], dict(os.environ),
                                  f"http://127.0.0.1:{port}/health")
    return proc, child_file


def test_wait_healthy_then_stop_kills_the_whole_group(tmp_path):
    with Launcher(tmp_path / "logs") as launcher:
        proc, child_file = start_fake(launcher, tmp_path, "ok")
        took = proc.wait_healthy(30)
        assert 0.2 < took < 30 and proc.running()
        child = int(child_file.read_text())
        assert alive(child)
    assert not proc.running()
    for _ in range(50):
        if not alive(child):
            break
        time.sleep(0.1)
    assert not alive(child), "the server's own children must be stopped too"
    assert "listening" in (tmp_path / "logs" / "fake-ok.log").read_text()


def test_a_crashing_server_shows_its_last_log_lines(tmp_path):
    with Launcher(tmp_path / "logs") as launcher:
        proc, _ = start_fake(launcher, tmp_path, "crash")
        with pytest.raises(EngineError, match="exited with code 3") as err:
            proc.wait_healthy(30)
    assert "fatal: model config invalid" in str(err.value)
    assert err.value.engine == "fake-crash" and err.value.call == "start"


def test_an_unhealthy_server_times_out_with_its_log(tmp_path):
    with Launcher(tmp_path / "logs") as launcher:
        proc, _ = start_fake(launcher, tmp_path, "sick", delay=0.0)
        with pytest.raises(EngineError, match="not healthy after 2 s") as err:
            proc.wait_healthy(2, poll_s=0.1)
        assert "served /health" in str(err.value)
    assert not proc.running()


def test_sigterm_to_the_driver_stops_its_servers(tmp_path):
    """A driver process that gets SIGTERM inside `with Launcher()` takes its servers (and their children) down."""
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(f"""
        import os, sys, time
        from vime.real.ports import free_ports
        from vime.real.vllm.launcher import Launcher
        port = free_ports(1)[0]
        with Launcher({str(tmp_path / 'dlogs')!r}) as launcher:
            p = launcher.start_process("s", [sys.executable, {str(script)!r}, str(port), "0", "ok",
                                       {str(tmp_path / 'dchild')!r}], dict(os.environ),
                                       f"http://127.0.0.1:{{port}}/health")
            p.wait_healthy(30)
            print(p.pid, flush=True)
            time.sleep(600)
    """))
    drv = subprocess.Popen([sys.executable, str(driver)], stdout=subprocess.PIPE, text=True,
                           cwd=Path(__file__).resolve().parents[2])
    try:
        server_pid = int(drv.stdout.readline())
        child = int((tmp_path / "dchild").read_text())
        assert alive(server_pid) and alive(child)
        drv.send_signal(signal.SIGTERM)
        assert drv.wait(30) == 128 + signal.SIGTERM
        for _ in range(50):
            if not alive(server_pid) and not alive(child):
                break
            time.sleep(0.1)
        assert not alive(server_pid) and not alive(child)
    finally:
        if drv.poll() is None:
            drv.kill()
            drv.wait()
        drv.stdout.close()


def test_a_signal_during_start_is_held_until_the_child_is_recorded(tmp_path):
    """SIGTERM landing mid-start must not orphan the server being started: it is re-delivered after."""
    launcher = Launcher(tmp_path / "logs")
    launcher._starting = 1  # as if the signal arrived inside start_process
    launcher._on_signal(signal.SIGTERM, None)
    assert launcher._pending_signal == signal.SIGTERM and launcher.processes == []
    launcher._starting = 0
    with pytest.raises(SystemExit) as exc:
        proc, _ = start_fake(launcher, tmp_path, "ok")
    assert exc.value.code == 128 + signal.SIGTERM
    assert launcher.processes == [] and launcher._pending_signal is None
    assert list((tmp_path / "logs").glob("fake-ok.log")), "the child was started before the signal was handled"
    script = str(tmp_path / "server.py")

    def running_fakes() -> list[int]:
        out = []
        for d in Path("/proc").iterdir():
            try:
                if d.name.isdigit() and script in (d / "cmdline").read_bytes().decode(errors="replace") \
                        and alive(int(d.name)):
                    out.append(int(d.name))
            except OSError:
                pass
        return out
    for _ in range(50):
        if not running_fakes():
            break
        time.sleep(0.1)
    assert running_fakes() == [], "the held signal must stop the server that was being started"


def test_servers_with_dev_mode_routes_listen_on_loopback_only():
    from vime.real.vllm.launcher import ServerSpec

    assert ServerSpec(model="m", port=1).url == "http://127.0.0.1:1"
    with pytest.raises(ConfigError, match="loopback"):
        ServerSpec(model="m", port=1, host="0.0.0.0")


def test_a_dead_server_is_restarted_with_the_same_command_and_log(tmp_path):
    with Launcher(tmp_path / "logs") as launcher:
        proc, _ = start_fake(launcher, tmp_path, "ok")
        proc.wait_healthy(30)
        first = proc.pid
        os.killpg(first, signal.SIGKILL)  # the server dies (its whole group, as a crash would take it)
        proc.proc.wait(10)
        assert not proc.running()
        took = launcher.restart("fake-ok", timeout_s=30)
        assert took > 0 and proc.running() and proc.pid != first
        assert (tmp_path / "logs" / "fake-ok.log").read_text().count("listening") == 2
        with pytest.raises(EngineError, match="no process named"):
            launcher.restart("nobody")
    assert not proc.running()


def test_a_vllm_client_restarts_through_its_relauncher_and_starts_over():
    import asyncio

    from vime.real.vllm.client import VLLMEngine

    calls = []

    async def relaunch() -> None:
        calls.append("relaunch")

    eng = VLLMEngine("e0", "http://127.0.0.1:1", relaunch=relaunch)
    eng.lifecycle.on_start_update()
    eng.lifecycle.on_finish_update(3)
    asyncio.run(eng.restart())
    assert calls == ["relaunch"] and eng.lifecycle.weight_version is None
    with pytest.raises(EngineError, match="relaunch"):
        asyncio.run(VLLMEngine("e1", "http://127.0.0.1:1").restart())
