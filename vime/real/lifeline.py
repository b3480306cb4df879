"""Ties a Ray actor's process to its node: when the node's raylet dies, the actor exits at once (its guarded servers with it).

A Ray worker whose raylet is killed can live on as an orphan: it still answers direct actor
calls and holds its memory and children, so a failed node would leave processes behind and the
driver would not learn of the failure until Ray's health checks time out. `exit_with_raylet()`,
called inside the actor, opens a pidfd on the worker's parent (the raylet that spawned it) and
waits on it in a daemon thread — no polling — then ends the process (``os._exit``), which also
closes the stdin of every `vime.real.vllm.guard` it started, so those stop their servers.
"""

from __future__ import annotations

import os
import select
import sys
import threading

_started = False
_lock = threading.Lock()


def exit_with_raylet(exit_code: int = 70) -> bool:
    """Exit this process when its parent (the raylet) exits; returns False when that cannot be watched
    here (no pidfd on this platform, or the parent is gone or is init already). Idempotent."""
    global _started
    with _lock:
        if _started:
            return True
        parent = os.getppid()
        if parent <= 1 or not hasattr(os, "pidfd_open"):
            return False
        try:
            fd = os.pidfd_open(parent)
        except OSError:
            return False
        if os.getppid() != parent:  # it died between the two calls
            os.close(fd)
            os._exit(exit_code)

        def wait() -> None:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            poller.poll()  # readable once the parent has exited
            print(f"[vime] raylet (pid {parent}) is gone: this actor (pid {os.getpid()}) exits with its node",
                  file=sys.stderr, flush=True)
            os._exit(exit_code)

        threading.Thread(target=wait, name="vime-lifeline", daemon=True).start()
        _started = True
        return True


__all__ = ["exit_with_raylet"]
