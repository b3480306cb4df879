"""A process guard: runs one command in its own process group and kills that whole group when its owner goes away.

``python guard.py --owner-fd R [--status-fd W] [--grace S] [--detach] -- ARGV...`` (stdlib only,
so it runs by path on any node). The owner — the Ray actor that hosts an engine — keeps the
write end of a pipe whose read end is ``R``. The group (the vLLM server and its engine-core and
worker children) is stopped, SIGTERM then SIGKILL after the grace period, when

- ``R`` reaches EOF: the owner closed it, or died in any way (SIGKILL, node failure) and the
  kernel closed it — the case a plain ``Popen`` cannot cover, since nothing runs in a dead owner;
- the guard receives SIGTERM or SIGINT;
- the command's own leader exits (its children would otherwise linger).

``--detach`` forks once more and lets the first process exit, so the guard is no child of its
owner: Ray kills a worker's child processes when the worker exits, which would kill the guard
before it could stop the command. On ``W`` the guard writes ``guard <pid>``, ``server <pid>``
and, at the end, ``exit <code>`` (128 + N for a signal N), one per line; it exits with that code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading


def _kill_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _say(fd: int | None, line: str) -> None:
    if fd is not None:
        with contextlib.suppress(OSError):
            os.write(fd, (line + "\n").encode())


def main(argv: list[str]) -> int:
    grace, owner_fd, status_fd, detach = 10.0, 0, None, False
    while argv and argv[0] != "--":
        flag, argv = argv[0], argv[1:]
        if flag == "--detach":
            detach = True
        elif flag in ("--grace", "--owner-fd", "--status-fd") and argv:
            value, argv = argv[0], argv[1:]
            if flag == "--grace":
                grace = float(value)
            elif flag == "--owner-fd":
                owner_fd = int(value)
            else:
                status_fd = int(value)
        else:
            print(f"guard.py: unknown argument {flag!r}", file=sys.stderr)
            return 2
    argv = argv[1:]
    if not argv:
        print("usage: guard.py --owner-fd R [--status-fd W] [--grace S] [--detach] -- ARGV...", file=sys.stderr)
        return 2
    if detach and os.fork():
        return 0  # the first process: its owner reaps it at once; the guard lives on in the child
    _say(status_fd, f"guard {os.getpid()}")
    # the command gets its own group so that killing it never kills the guard before it is done
    # (close_fds, the default, keeps the owner and status pipes out of the command)
    child = subprocess.Popen(argv, stdin=subprocess.DEVNULL, start_new_session=True)
    _say(status_fd, f"server {child.pid}")
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)

    def watch_owner() -> None:
        with contextlib.suppress(OSError):
            while os.read(owner_fd, 1 << 16):
                pass  # the owner writes nothing; a read returns only at EOF
        stop.set()

    def watch_child() -> None:
        child.wait()
        stop.set()

    threading.Thread(target=watch_owner, daemon=True).start()
    threading.Thread(target=watch_child, daemon=True).start()
    stop.wait()
    if child.poll() is None:
        _kill_group(child.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            child.wait(grace)
    _kill_group(child.pid, signal.SIGKILL)  # what is left of the group: children outlive their leader
    code = child.wait()
    code = 128 - code if code < 0 else code
    _say(status_fd, f"exit {code}")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
