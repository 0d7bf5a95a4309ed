"""Starting and always stopping the deployment's processes in tests."""

from __future__ import annotations

import os
import random
import signal
import socket
import time

# Ports for the servers tests start. A port bind(0) found free is free only until the server binds
# it, seconds later for a JVM; meanwhile the other pytest-xdist worker (or any process's bind(0) or
# outgoing connection) can take it. So: below the kernel's ephemeral range (32768-60999 here), a
# separate span per xdist worker, never the same port twice in one process.
_BASE, _SPAN = 20000, 2000
_given: set[int] = set()


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on, from this test worker's own span."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    low = _BASE + (int(worker[2:]) if worker[2:].isdigit() else 0) % 6 * _SPAN
    for port in random.sample(range(low, low + _SPAN), _SPAN):
        if port in _given:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _given.add(port)
        return port
    raise AssertionError(f"no free port in {low}-{low + _SPAN - 1} on 127.0.0.1")


def listening(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(1)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def wait_for(predicate, timeout: float, what: str, every: float = 1.0, alive=None):
    """Poll `predicate` until true; fail naming `what` after `timeout` s or when `alive()` turns false."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        if alive is not None and not alive():
            raise AssertionError(f"a process died while waiting for {what}")
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def tagged(name: str, value: str) -> dict[int, str]:
    """Processes whose environment has name=value (the test's own DAGSTER_HOME), with their command lines."""
    marker = f"{name}={value}".encode()
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")[:200]
        except OSError:
            continue
        if marker in env:
            found[int(pid)] = cmd
    return found


def kill_tagged(name: str, value: str, *, grace: float = 0.0) -> dict[int, str]:
    """SIGKILL every process tagged name=value still running after `grace` seconds: the backstop that
    stops orphans (Spark JVM, daemon, run workers) even if the launcher was killed. Returns them.
    The grace lets processes that were told to stop (a run worker's orphan watcher polls its parent
    once a second) finish on their own on a loaded machine."""
    deadline = time.monotonic() + grace
    left = tagged(name, value)
    while left and time.monotonic() < deadline:
        time.sleep(0.5)
        left = tagged(name, value)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return left
