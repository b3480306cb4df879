"""Ports for servers come from below the kernel's ephemeral range, where no outgoing connection can take them."""

from __future__ import annotations

import socket

from vime.real import ports


def test_ports_are_distinct_bindable_and_below_the_ephemeral_range() -> None:
    low, _ = ports.ephemeral_range()
    got = ports.free_ports(20)
    assert len(set(got)) == 20
    assert all(ports.LOW <= p < low for p in got)
    for p in got:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_taken_port_is_not_handed_out(monkeypatch) -> None:
    """Every port of the range but one held: that one is what comes back."""
    low = ports.LOW + 1000
    held = []
    try:
        for p in range(ports.LOW, low):
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", p))
                held.append(s)
            except OSError:
                s.close()
        free = held.pop()
        free_port = free.getsockname()[1]
        free.close()
        monkeypatch.setattr(ports, "ephemeral_range", lambda: (low, 60999))
        monkeypatch.setattr(ports, "_TRIES", 20000)
        assert ports.free_port() == free_port
    finally:
        for s in held:
            s.close()


def test_without_a_range_below_the_ephemeral_one_the_os_picks(monkeypatch) -> None:
    monkeypatch.setattr(ports, "ephemeral_range", lambda: (1024, 65535))
    got = ports.free_ports(3)
    assert len(set(got)) == 3 and all(p >= 1024 for p in got)


def test_the_range_is_read_from_the_kernel_file(tmp_path) -> None:
    f = tmp_path / "range"
    f.write_text("40000\t50000\n")
    assert ports.ephemeral_range(str(f)) == (40000, 50000)
    assert ports.ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)
