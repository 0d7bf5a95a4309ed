"""The servers Laminar starts on this machine (Spark Connect, the UI, the store emulators): their ports, and
stopping one."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable

from laminar_assets.errors import EnvironmentProblem


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on now (the kernel's choice)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def port_in_use(host: str, port: int, *, timeout: float = 1.0) -> bool:
    """True when something already listens on (host, port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        return sock.connect_ex((host, port)) == 0


def listening(port: int) -> bool:
    """True when something listens on 127.0.0.1:`port`."""
    return port_in_use("127.0.0.1", port, timeout=0.5)


def stop_group(process: subprocess.Popen, *, timeout: float = 10.0) -> None:
    """Stop a server started in a process group of its own: SIGTERM, then SIGKILL after `timeout` seconds."""
    if process.poll() is not None:
        return
    os.killpg(process.pid, signal.SIGTERM)
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout)


def wait_listening(port: int, what: str, *, timeout: float, exited: Callable[[], int | None],
                   see: str = "", every: float = 0.1) -> None:
    """Return once something listens on 127.0.0.1:`port`; an `EnvironmentProblem` naming `what` when `exited()`
    gives an exit code first or `timeout` seconds pass (`see`: where its output is, for the message)."""
    deadline = time.monotonic() + timeout
    while not listening(port):
        code = exited()
        if code is not None or time.monotonic() > deadline:
            why = f"it exited with code {code}" if code is not None else f"not within {timeout:g} s"
            raise EnvironmentProblem(f"{what} did not listen on 127.0.0.1:{port}: {why}{see}")
        time.sleep(every)


_PR_SET_PDEATHSIG = 1  # prctl(2)


def ends_with_this_process(*, restore_sigint: bool = False) -> Callable[[], None] | None:
    """A `preexec_fn` for a server this process starts in a process group of its own (`start_new_session`): the
    kernel sends the server SIGTERM when this process dies, however it dies (kill -9 included), so no emulator or
    Spark Connect server outlives the command that started it and keeps its port (`dagster dev` is not given
    it: `laminar serve` stops it with SIGINT, which lets it stop its own servers in order). Linux only
    (prctl's parent-death signal); elsewhere, and when called outside the main thread (the signal follows the
    thread that started the child, and a worker thread may end first), only `restore_sigint`: SIGINT back to its
    default in the child (a command started from a shell's background job inherits it ignored)."""
    parent = os.getpid()
    libc = None
    if threading.current_thread() is threading.main_thread():
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl  # noqa: B018  (present on Linux only)
        except (OSError, AttributeError):
            libc = None
    if libc is None and not restore_sigint:
        return None

    def in_child() -> None:
        if restore_sigint:
            signal.signal(signal.SIGINT, signal.SIG_DFL)
        if libc is not None:
            libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the call: the kernel will not tell
                os.kill(os.getpid(), signal.SIGTERM)

    return in_child
