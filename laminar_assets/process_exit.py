"""How Laminar's own processes end: with the exit code of what they did, never with a crash of the teardown after.

A Python process that has read Delta tables through `deltalake` (its pyarrow datasets read Parquet through
Python file objects unless given a filesystem; Laminar's own reads give them pyarrow's, engine/delta/arrow_reads.py)
may abort at exit, after its work is done: SIGABRT, exit code 134, "terminate called without
an active exception" (delta-rs issue #2184, apache/arrow #34314, #39862). An Arrow C++ thread still dropping the
last reference to such a file object needs the GIL; once the interpreter has begun to tear itself down, CPython
(3.11-3.13) ends a thread that asks for the GIL with `pthread_exit`, whose unwinding through Arrow's `noexcept`
destructor calls `std::terminate`. Measured on this project: 7 in 200 runs of a script that writes and reads a
small table (docs/known-limits.md). A success then reads as a failure (a red CI, a failed command in a script),
and a command that did fail reports 134 instead of its own code.

`run_then_exit` ends the process the way Python would, minus that teardown: it joins the non-daemon threads and
runs the `atexit` handlers (logging's flush, the warm launcher's release of idle workers, any a library added), flushes
every open Python file it can still write to, then `os._exit` with the code. What it skips is the destruction
of modules and objects, which writes nothing a command or run has not already committed (Delta commits,
checkpoints and the Dagster instance are durable before the command returns), and during which the abort
happens. Only entry points call it (the `laminar` command, the warm run worker), never library code: it ends the
process.
"""

from __future__ import annotations

import atexit
import gc
import io
import os
import sys
import threading
from collections.abc import Callable
from typing import NoReturn

STDOUT_UNWRITABLE = 120
"""The exit code when standard output cannot be flushed at exit (e.g. `laminar dag | head`), as Python's own."""


def exit_code_of(exc: SystemExit) -> int:
    """The code `sys.exit(arg)` asks for, as Python reads it: None is 0, an int itself, anything else is
    printed to stderr and is 1."""
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    sys.stderr.write(f"{code}\n")
    return 1


def run_then_exit(main: Callable[[], int | None]) -> NoReturn:
    """Run an entry point's `main` and end the process with its outcome: its return value (None is 0), the code of
    a `SystemExit` it raised, 130 for an interrupt, 1 for any other exception (its traceback printed, as Python
    prints an uncaught one)."""
    try:
        code = main() or 0
    except SystemExit as exc:
        code = exit_code_of(exc)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code = 130
    except BaseException:  # noqa: BLE001 - reported as Python reports an uncaught exception, then exit 1
        sys.excepthook(*sys.exc_info())
        code = 1
    exit_process(code)


def exit_process(code: int) -> NoReturn:
    """End the process with `code` once Python's exit work is done (threads, atexit handlers, open files
    flushed), skipping the interpreter's teardown in which a native thread can abort the process."""
    try:
        _wait_for_threads()
        atexit._run_exitfuncs()  # what Py_Finalize runs next; each handler's error is printed, as at a normal exit
    except KeyboardInterrupt:  # a second Ctrl-C while waiting: exit now, as interrupted
        code = 130
    _flush_open_files()
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except (OSError, ValueError):
            if stream in (sys.stdout, sys.__stdout__) and code == 0:
                code = STDOUT_UNWRITABLE
    os._exit(code)


def _wait_for_threads() -> None:
    """Join the non-daemon threads and run `threading`'s own exit hooks (e.g. concurrent.futures finishing
    its queued work), as Python does first at exit: `threading._shutdown` is that step."""
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
        return
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon and thread.is_alive():
            thread.join()


_WRITERS = (io.TextIOWrapper, io.BufferedWriter, io.BufferedRandom, io.BufferedRWPair)
"""The concrete classes of Python's buffered file objects, the ones holding bytes not yet written (an isinstance
check on them is cheap; on io's abstract classes it is not, over every object of a large process)."""


def _flush_open_files() -> None:
    """Flush every open, writable Python file object: the interpreter's teardown would flush (and close) them
    when it destroys them; `os._exit` does not. About 0.1 s of CPU in a worker holding 400,000 objects."""
    for obj in gc.get_objects():
        if isinstance(obj, _WRITERS):
            try:
                if not obj.closed and obj.writable():
                    obj.flush()
            except (OSError, ValueError):
                pass  # a pipe whose reader is gone, a file closed meanwhile: nothing left to save
