"""Free TCP ports for vLLM servers, routers and the trainer's rendezvous, outside the kernel's ephemeral range.

A port from ``bind(port 0)`` comes out of the ephemeral range, where every outgoing connection on the
machine also gets its local port: between choosing a port and the server binding it — or when a
crashed engine restarts on its old port — a client's connection can take it ("Address already in
use"). Ports are therefore drawn at random below that range, above Ray's worker ports (10002–19999
by default), and checked free by binding them; only where no such range exists does the OS pick.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: The lowest port drawn: above Ray's default worker ports (``--min/max-worker-port`` 10002–19999).
LOW = 20000
_TRIES = 200
_rng = random.SystemRandom()  # not the seeded `random`: a run's seed must not make two starters collide


def ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's range for outgoing connections' local ports (Linux's default where it cannot be read)."""
    try:
        low, high = (int(x) for x in Path(path).read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def _bindable(host: str, port: int) -> socket.socket | None:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind((host, port))
        return s
    except OSError:
        s.close()
        return None


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports free now, below the ephemeral range (a small race with other starters remains)."""
    low, _ = ephemeral_range()
    held: list[socket.socket] = []
    try:
        if low - LOW >= 1000:
            for _ in range(_TRIES):
                if len(held) == n:
                    break
                s = _bindable(host, _rng.randrange(LOW, low))
                if s is not None:
                    held.append(s)
        while len(held) < n:  # no range below the ephemeral one, or it is full: the OS picks
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            held.append(s)
        return [int(s.getsockname()[1]) for s in held]
    finally:
        for s in held:
            s.close()


def free_port(host: str = "127.0.0.1") -> int:
    """One port free now (see `free_ports`)."""
    return free_ports(1, host)[0]
