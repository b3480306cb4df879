"""The processes vime starts (vLLM servers, the router): logs to files, health waits, restart, and a stop that reaches the whole process group, also through a guard that outlives a killed owner."""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from vime.errors import EngineError


def _tail(path: Path, lines: int = 40) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=lines))
    except OSError as exc:
        return f"(log {path} unreadable: {exc})"


class ManagedProcess:
    """One child process in its own process group, logging to a file; `stop()` ends the whole group."""

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
                 health_url: str) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = log_path
        self.health_url = health_url
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_at: float | None = None
        self.ready_after_s: float | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen(self.argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        finally:
            log.close()  # the child holds its own descriptor
        self.started_at = time.monotonic()

    def exit_code(self) -> int | None:
        """None while running, else the exit code."""
        return None if self.proc is None else self.proc.poll()

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def running(self) -> bool:
        return self.started_at is not None and self.exit_code() is None

    def log_tail(self, lines: int = 40) -> str:
        return _tail(self.log_path, lines)

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.5) -> float:
        """Block until GET health_url answers 200; returns seconds since start. Raises `EngineError` otherwise."""
        assert self.started_at is not None, "start() first"
        deadline = self.started_at + timeout_s
        with httpx.Client(timeout=5.0) as client:
            while True:
                code = self.exit_code()
                if code is not None:
                    raise EngineError(self.name, "start", f"process exited with code {code} before it was "
                                      f"healthy; last log lines of {self.log_path}:\n{self.log_tail()}")
                try:
                    if client.get(self.health_url).status_code == 200:
                        self.ready_after_s = time.monotonic() - self.started_at
                        return self.ready_after_s
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise EngineError(self.name, "start", f"not healthy after {timeout_s:.0f} s at "
                                      f"{self.health_url}; last log lines of {self.log_path}:\n{self.log_tail()}")
                time.sleep(poll_s)

    def restart(self, timeout_s: float) -> float:
        """Stop what is left of the process (its whole group), start it again with the same command,
        environment and log, and wait until it is healthy; returns the seconds it took to get healthy."""
        self.stop(grace_s=5.0)
        self.start()
        return self.wait_healthy(timeout_s)

    def stop(self, grace_s: float = 15.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after `grace_s`; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.proc.wait(10.0)
        # children (engine core, workers) may outlive a leader that exited by itself
        self._signal_group(signal.SIGKILL)
        return self.proc.returncode

    def _signal_group(self, sig: int) -> None:
        assert self.proc is not None
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)


#: The guard script (`vime.real.vllm.guard`), run by path so that it needs nothing installed but Python.
GUARD_SCRIPT = str(Path(__file__).resolve().with_name("guard.py"))
GUARD_GRACE_S = 10.0


class GuardedProcess(ManagedProcess):
    """A `ManagedProcess` whose command runs under `vime.real.vllm.guard`: it dies with this process.

    What a server started inside a Ray actor needs: a killed actor runs no clean-up, and Ray kills
    an exiting worker's child processes, so the guard is detached (no child of this process) and
    holds the read end of a pipe that only this process writes to; when this process dies in any
    way the pipe closes and the guard stops the command's whole process group. The guard is
    followed through a pidfd, its exit code through a status pipe (Linux).
    """

    def __init__(self, name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path,
                 health_url: str, *, python: str = sys.executable, grace_s: float = GUARD_GRACE_S) -> None:
        super().__init__(name, argv, env, log_path, health_url)
        self.python = python
        self.grace_s = grace_s
        self.guard_pid: int | None = None
        self.server_pid: int | None = None
        self._owner_w: int | None = None  # our end of the owner pipe: closing it stops the guard
        self._status: Any = None  # the guard's status lines
        self._pidfd: int | None = None
        self._code: int | None = None

    def start(self) -> None:
        self._close()
        self._code = None
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        owner_r, owner_w = os.pipe()
        status_r, status_w = os.pipe()
        argv = [self.python, GUARD_SCRIPT, "--detach", "--grace", str(self.grace_s), "--owner-fd", str(owner_r),
                "--status-fd", str(status_w), "--", *self.argv]
        log = open(self.log_path, "ab")
        try:
            first = subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True, pass_fds=(owner_r, status_w))
        finally:
            log.close()
            os.close(owner_r)
            os.close(status_w)
        self._owner_w = owner_w
        self._status = os.fdopen(status_r, "r")
        first.wait(30)  # the detaching first process exits at once
        self.started_at = time.monotonic()
        for _ in range(2):
            line = self._status.readline().split()
            if line[:1] == ["guard"]:
                self.guard_pid = int(line[1])
                with contextlib.suppress(OSError):
                    self._pidfd = os.pidfd_open(self.guard_pid)
            elif line[:1] == ["server"]:
                self.server_pid = int(line[1])
            else:
                raise EngineError(self.name, "start", f"the guard did not start the server (exit "
                                  f"{first.returncode}); last log lines of {self.log_path}:\n{self.log_tail()}")

    @property
    def pid(self) -> int | None:
        return self.guard_pid

    def exit_code(self) -> int | None:
        if self._code is not None:
            return self._code
        if self._pidfd is None:
            return None
        if not select.select([self._pidfd], [], [], 0)[0]:
            return None  # the guard runs
        code = 1
        for line in self._status.readlines():  # the guard has exited: its status pipe is at EOF
            if line.startswith("exit "):
                code = int(line.split()[1])
        self._code = code
        return code

    def stop(self, grace_s: float = 15.0) -> int | None:
        """Close the owner pipe (the guard stops the server: SIGTERM, SIGKILL after its grace) and wait for
        the guard; past that, kill the guard and the server's group from here."""
        if self.guard_pid is None:
            return None
        if self._owner_w is not None:
            os.close(self._owner_w)
            self._owner_w = None
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGTERM)  # a pidfd never hits a reused pid
        if self._pidfd is not None and not select.select([self._pidfd], [], [], grace_s + self.grace_s)[0]:
            for pid in (self.guard_pid, self.server_pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    if pid:
                        os.killpg(pid, signal.SIGKILL)
            select.select([self._pidfd], [], [], 10.0)
        return self.exit_code()

    def _close(self) -> None:
        for fd in (self._owner_w, self._pidfd):
            if fd is not None:
                with contextlib.suppress(OSError):
                    os.close(fd)
        if self._status is not None:
            self._status.close()
        self._owner_w = self._pidfd = self._status = None

    def __del__(self) -> None:
        self._close()
