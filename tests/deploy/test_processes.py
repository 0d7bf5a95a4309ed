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
    spans = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        spans[worker] = {free_port() for _ in range(50)}
        assert len(spans[worker]) == 50  # never the same port twice
    assert not spans["gw0"] & spans["gw1"]
    low = min(min(s) for s in spans.values())
    high = max(max(s) for s in spans.values())
    assert processes._BASE <= low and high < _ephemeral_low()
    assert max(spans["gw0"]) < min(spans["gw1"])


def test_a_port_something_listens_on_is_skipped(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw2")
    monkeypatch.setattr(processes, "_SPAN", 20)  # a short span, so the test can hold all but one port
    span = range(processes._BASE + 2 * 20, processes._BASE + 3 * 20)
    held = []
    try:
        for port in span[:-1]:
            sock = socket.socket()
            sock.bind(("127.0.0.1", port))
            sock.listen()
            held.append(sock)
        port = free_port()
        assert port == span[-1] and not listening(port)
    finally:
        for sock in held:
            sock.close()
