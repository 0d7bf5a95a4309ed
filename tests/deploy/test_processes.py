"""The test servers' ports: each pytest-xdist worker draws from its own span, below the kernel's
ephemeral range, never the same port twice, never one something listens on."""

from __future__ import annotations

import socket

from tests.deploy import processes
from tests.deploy.processes import free_port, listening


def _ephemeral_low() -> int:
    with open("/proc/sys/net/ipv4/ip_local_port_range") as fh:
        return int(fh.read().split()[0])


def test_workers_draw_from_separate_spans_below_the_ephemeral_range(monkeypatch):
    monkeypatch.setattr(processes, "_given", set())
    spans = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        spans[worker] = {free_port() for _ in range(50)}
        assert len(spans[worker]) == 50  # never the same port twice
    assert not spans["gw0"] & spans["gw1"]
    assert max(spans["gw0"]) < min(spans["gw1"])
    low, high = min(spans["gw0"]), max(spans["gw1"])
    assert processes._BASE <= low
    assert processes._BASE + 6 * processes._SPAN <= _ephemeral_low(), (
        f"this machine's ephemeral ports start at {_ephemeral_low()}, inside the tests' spans "
        f"({processes._BASE}-{processes._BASE + 6 * processes._SPAN - 1}): move _BASE in tests/deploy/processes.py")
    assert high < _ephemeral_low()


def test_a_port_something_listens_on_is_skipped(monkeypatch):
    # a short span of its own, away from the ports the suite's servers use (20000-31999)
    monkeypatch.setattr(processes, "_given", set())
    monkeypatch.setattr(processes, "_BASE", 12000)
    monkeypatch.setattr(processes, "_SPAN", 20)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    span = range(12000, 12020)
    held = []
    try:
        for port in span[:-1]:
            sock = socket.socket()
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # a port in TIME_WAIT is fine to hold
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        port = free_port()
        assert port == span[-1] and not listening(port)
        assert processes._given == {port}
    finally:
        for sock in held:
            sock.close()
