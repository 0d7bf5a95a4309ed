"""Makes a Python process abort at exit, every time, the way `deltalake` reads make it abort now and then.

The abort seen with deltalake 1.6.6 (delta-rs #2184): an Arrow C++ thread drops the last reference to a Python
file object that a pyarrow dataset read through; its destructor (`arrow::py::OwnedRefNoGIL`, `noexcept`) asks for
the GIL. If the interpreter has begun to tear itself down meanwhile, CPython 3.11-3.13 ends that thread with
`pthread_exit`, whose unwinding through the `noexcept` destructor calls `std::terminate`: "terminate called
without an active exception", SIGABRT, exit code 134. It hits when a read's last clean-up is still running as the
process exits: a few runs in a hundred (docs/known-limits.md).

`arm()` puts a thread at that point on purpose: it drops the last reference to a `pyarrow.PythonFile` inside the
same destructor, and the file object's `__del__` waits (GIL released) until the teardown has begun, so that its
return hits the same `pthread_exit` through the same frame. Nothing is timed: the wake-up comes from an object
that only the teardown destroys (a global of `__main__`), so a process that ends without that teardown never
wakes the thread, and one that tears down always aborts.

Use: `python -c "from tests.cli.abort_at_exit import arm; arm(); <the entry point>()" ARGS...`.
"""

from __future__ import annotations

import os
import select
import threading

import pyarrow as pa

HOLD_SECONDS = 60
"""How long the teardown waits, after waking the thread, for the abort (only if it never comes, e.g. on a
CPython >= 3.14, whose threads hang instead of exiting when they ask for the GIL during the teardown)."""


class _BlockingFile:
    """A read-only Python file whose destruction waits until `wake_fd` is written to (or closed)."""

    closed = False

    def __init__(self, wake_fd: int, entered: threading.Event) -> None:
        self._wake_fd, self._entered, self._read = wake_fd, entered, os.read

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return False

    def read(self, size: int = -1) -> bytes:
        return b""

    def close(self) -> None:
        pass

    def __del__(self) -> None:  # runs inside Arrow's `OwnedRefNoGIL` destructor (see the module docstring)
        self._entered.set()
        self._read(self._wake_fd, 1)  # releases the GIL; takes it back when woken, during the teardown


class _Waker:
    """Destroyed only by the interpreter's teardown: wakes the blocked thread, then gives its abort time to come."""

    def __init__(self, wake_fd: int, hold_fd: int) -> None:
        self._wake_fd, self._hold_fd, self._write, self._select = wake_fd, hold_fd, os.write, select.select

    def __del__(self) -> None:
        self._write(self._wake_fd, b"x")
        self._select([self._hold_fd], [], [], HOLD_SECONDS)  # never readable: only the abort ends this wait


def arm() -> None:
    """From now on this process aborts in its teardown at exit (SIGABRT) unless it ends before the teardown."""
    wake_r, wake_w = os.pipe()
    hold_r, hold_w = os.pipe()
    entered = threading.Event()

    def drop_the_last_reference() -> None:
        file = pa.PythonFile(_BlockingFile(wake_r, entered), mode="r")
        del file  # the Python side lets go first; Arrow's C++ side then destroys the file object

    threading.Thread(target=drop_the_last_reference, name="arrow-like-cleanup", daemon=True).start()
    entered.wait()
    import __main__

    __main__._abort_at_exit = (_Waker(wake_w, hold_r), hold_w)  # module globals go in the teardown, after it began
