"""Starting and always stopping the deployment's processes in tests."""

from __future__ import annotations

import os
import signal
import socket
import time


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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


def kill_tagged(name: str, value: str) -> list[int]:
    """SIGKILL every process whose environment has name=value (the test's own DAGSTER_HOME): the
    backstop that stops orphans (Spark JVM, daemon, run workers) even if the launcher was killed."""
    marker = f"{name}={value}".encode()
    killed = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        if int(pid) == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = fh.read().split(b"\0")
        except OSError:
            continue
        if marker in env:
            try:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
            except ProcessLookupError:
                pass
    return killed
