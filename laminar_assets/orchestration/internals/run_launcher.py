"""A run launcher that hands each run to a warm Python process instead of starting a cold one.

Dagster's `DefaultRunLauncher` asks the code server to start every run in a new Python process, which
then imports Dagster, pandas, pyarrow, Spark's client and, for a run with a contract check, Great
Expectations (seconds of imports, docs/PERFORMANCE.md), before the run's first step. On a daemon
that keeps sinks fresh, those seconds are most of the time from a commit to its run.

`WarmRunLauncher` keeps `warm_workers` processes started ahead of time, each with those libraries
already imported, waiting on a pipe for run ids. A worker handed a run forks: the child opens the Dagster
instance and executes the run exactly as `dagster api execute_run` does (the same Dagster function, the
run's own code origin loaded from disk then, so user code is never older than the run), then exits; the
worker itself stays warm for the next run. A fork of a process that has imported everything costs
milliseconds and no imports, so a run never waits for a worker to warm up again, and a burst of runs all
start warm. When no worker is ready (the first launch starts them), the run goes the default way, through
the code server. Every run is an ordinary Dagster run in the UI either way.

Laminar's own library (engine, contracts, the Dagster layer) is imported ahead of time too, but never
the flows or `laminar_assets.definitions`: those load with the run (in the child), so an edited flow is
what the next run executes. Before each fork the worker checks that none of the Laminar files it
imported changed since (size and modification time): a worker holding an edited engine module says
so, refuses the run (which then goes the default way, loading everything afresh) and retires once
the runs it forked have ended, while a new worker warms up in its place. The worker
stays single-threaded (it forks; no Dagster instance, Spark session or gRPC channel is opened in it), so
each child starts from a clean copy.

A worker is a child of the process that launches runs (the daemon); it exits when its pipe closes, so it
never outlives the daemon (a run it forked finishes first). It reports each child's exit, and the launcher
fails a run whose process ended before the run did and frees its pool slots. Terminating a run from the
same host sends its process SIGTERM, which Dagster turns into an interrupt: the run ends CANCELED; from
another host, the run's cancellation thread sees CANCELING and does the same.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from dagster._core.launcher import LaunchRunContext
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._serdes import ConfigurableClassData, deserialize_value, serialize_value

from laminar_assets.orchestration.internals.run_processes import WORKER_TAG, free_slots

ACCEPT_SECONDS = 30.0
"""How long `launch_run` waits for a warm worker to confirm it took the run id before failing the launch."""

WARM_IMPORTS = ("dagster._cli.api", "pandas", "pyarrow.dataset", "pyspark.sql", "pyspark.sql.connect.session",
                "deltalake", "sqlglot", "great_expectations")
"""What a worker imports before it says it is ready: the third-party libraries every Laminar run
imports."""

INSTANCE_IMPORTS = ("upath",)
"""What opening an instance imports besides its classes (its definitions-state storage's paths)."""

LAMINAR_WARM_IMPORTS = ("laminar_assets.orchestration.builder", "laminar_assets.pipeline.settings")
"""Laminar's library modules a worker imports ahead too (a quarter of a second of each run's launch on two cores,
docs/PERFORMANCE.md): what `laminar_assets.definitions` imports, but not the flows (the user's code), which
each run loads itself. Guarded against edits (`_stale`)."""

WARM_PACKAGE = "laminar_assets"
"""The package whose files a worker checks before each fork (`_loaded_files`)."""

_READY = "ready"
_ACCEPTED = "accepted"  # + run id and the pid of the process executing it
_EXITED = "exited"  # + that pid and its exit code (negative: the signal that ended it)
_STALE = "stale"  # [+ a run id it refuses]: a Laminar file it imported changed; it takes no more runs


class _Worker:
    """One warm process, which forks a process per run it is handed, and a thread reading its control
    lines (`ready`; per run `accepted <run id> <pid>`, then `exited <pid> <code>`)."""

    def __init__(self, instance_ref_json: str, env: Mapping[str, str],
                 on_exit: Callable[[int, int], None], on_gone: Callable[[], None]) -> None:
        self._accepts: queue.Queue[tuple[str, int | None] | None] = queue.Queue()
        self._hand_lock = threading.Lock()  # one hand-off at a time: accepts come back in order
        self._on_exit, self._on_gone = on_exit, on_gone
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(env), bufsize=1)
        assert self.process.stdin is not None
        self.process.stdin.write(instance_ref_json + "\n")
        self.process.stdin.flush()
        self._ready = threading.Event()
        self.gone = False
        self.stale = False  # it said a Laminar file it imported changed: it takes no more runs
        self._reader = threading.Thread(target=self._read, name=f"laminar-warm-worker-{self.process.pid}",
                                        daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            word, *rest = line.split()
            if word == _READY:
                self._ready.set()
            elif word == _ACCEPTED and len(rest) == 2:
                self._accepts.put((rest[0], int(rest[1])))
            elif word == _EXITED and len(rest) == 2:
                self._on_exit(int(rest[0]), int(rest[1]))
            elif word == _STALE:
                self.stale = True
                self._ready.clear()
                if rest:
                    self._accepts.put((rest[0], None))  # the hand-off it refused
                self._on_gone()  # warm another in its place now
        self.gone = True  # the worker closed its control pipe: it exited (poll() may not say so yet)
        self._ready.clear()
        self._accepts.put(None)
        self._on_gone()

    @property
    def idle(self) -> bool:
        """Ready for a run (a worker takes any number, one after the other)."""
        return self._ready.is_set() and not self.gone and not self.stale and self.process.poll() is None

    def hand(self, run_id: str, timeout: float) -> int | None:
        """Send the run id; the pid of the process executing the run once the worker confirms, else None
        (`stale` then says whether it refused the run because a Laminar file it imported changed)."""
        assert self.process.stdin is not None
        with self._hand_lock:
            try:
                self.process.stdin.write(run_id + "\n")
                self.process.stdin.flush()
            except (BrokenPipeError, OSError):
                # it exited: if it retired as stale, its reader has that line before the end of its output
                self._reader.join(timeout=5)
                return None
            try:
                accepted = self._accepts.get(timeout=timeout)
            except queue.Empty:
                return None
        return accepted[1] if accepted is not None and accepted[0] == run_id else None

    def release(self) -> None:
        """Let the worker go: it reads end of input and exits (the runs it forked go on)."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
        except OSError:
            pass


class WarmRunLauncher(DefaultRunLauncher):
    """`DefaultRunLauncher`, but a run starts in a pre-started worker process that has already
    imported Dagster, Spark's client, pandas, pyarrow and Great Expectations, when one is idle."""

    def __init__(self, inst_data: ConfigurableClassData | None = None, warm_workers: int = 2) -> None:
        super().__init__(inst_data=inst_data)
        self.warm_workers = warm_workers
        self._workers: list[_Worker] = []
        self._retired: list[_Worker] = []  # stale workers whose forked runs have not all ended yet
        self._runs: dict[int, str] = {}  # pid of a process a worker forked -> the run it executes
        self._early_exits: dict[int, int] = {}  # pid -> exit code, of a process that ended before its pid was recorded
        self._runs_lock = threading.Lock()
        self._lock = threading.Lock()
        self._closed = False
        self._started = False

    @classmethod
    def config_type(cls) -> dict:
        from dagster import Field, IntSource

        return {"warm_workers": Field(IntSource, is_required=False, default_value=2,
                                      description="Warm processes that fork each run (0: launch every run the default way).")}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]):
        return cls(inst_data=inst_data, warm_workers=config_value.get("warm_workers", 2))

    # -- the pool -------------------------------------------------------------------------------

    def _top_up(self) -> None:
        """Start workers until `warm_workers` are alive and not yet handed a run (lock held)."""
        if self._closed:
            return
        retiring = [w for w in self._workers if w.stale]
        self._retired = [w for w in (*self._retired, *retiring) if not w.gone and w.process.poll() is None]
        self._workers = [w for w in self._workers if not w.gone and not w.stale and w.process.poll() is None]
        ref = serialize_value(self._instance.get_ref())
        while len(self._workers) < self.warm_workers:
            self._workers.append(_Worker(ref, os.environ, self._exited, self._worker_gone))

    def prepare(self) -> None:
        """Start the warm workers now rather than at the first launch (which then goes the default way)."""
        with self._lock:
            if not self._started:
                self._started = True
                atexit.register(self.dispose)
            self._top_up()

    def idle_workers(self) -> int:
        """How many workers are warm and waiting for a run."""
        with self._lock:
            return sum(1 for w in self._workers if w.idle)

    def _take(self) -> _Worker | None:
        with self._lock:
            first = not self._started
            if first:
                # Workers start with the first launch, in the process that launches runs (the daemon):
                # the webserver builds this launcher too, but only to terminate runs.
                self._started = True
                atexit.register(self.dispose)
            self._top_up()  # also replaces a worker that died
            if first:
                return None
            return next((w for w in self._workers if w.idle), None)

    def _exited(self, pid: int, code: int) -> None:
        """A process a worker forked for a run ended: free the pool slots its run still holds (a killed
        process frees nothing, and every step of the run was in that process), and fail the run if it did
        not end (as the code server does for a run process that dies). Off the worker's reading thread."""
        with self._runs_lock:
            run_id = self._runs.pop(pid, None)
            if run_id is None:  # its launch has not recorded the pid yet (the worker's lines came first)
                self._early_exits[pid] = code
                return
        self._report_exit(pid, run_id, code)

    def _report_exit(self, pid: int, run_id: str, code: int) -> None:
        if self._closed:
            return  # the instance is going away (the daemon stops): nothing to report on

        def report() -> None:
            free_slots(self._instance, run_id)
            run = self._instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                self._instance.report_run_failed(
                    run, f"Laminar's warm run worker's process for the run (pid {pid}) exited with code {code} "
                         "before the run finished.")
        threading.Thread(target=report, name=f"laminar-run-exit-{pid}", daemon=True).start()

    def _worker_gone(self) -> None:
        """A worker exited (released, or killed): warm another in its place, off its reading thread. The
        runs it had forked go on; their processes' ends are then met by run monitoring or a pool's waiter
        (run_processes.py), not by this launcher."""
        def top_up() -> None:
            with self._lock:
                self._top_up()
        threading.Thread(target=top_up, name="laminar-warm-worker-replace", daemon=True).start()

    def dispose(self) -> None:
        with self._lock:
            self._closed = True
            for worker in (*self._workers, *self._retired):
                worker.release()
            self._workers, self._retired = [], []

    # -- RunLauncher ----------------------------------------------------------------------------

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        worker = self._take() if self.warm_workers > 0 else None
        if worker is None:
            super().launch_run(context)
            return
        pid = worker.hand(run.run_id, ACCEPT_SECONDS)
        if pid is None and worker.stale:  # an edited Laminar module: this run loads everything afresh
            super().launch_run(context)
            return
        if pid is not None:
            with self._runs_lock:
                code = self._early_exits.pop(pid, None)
                if code is None:
                    self._runs[pid] = run.run_id
            if code is not None:
                self._report_exit(pid, run.run_id, code)
        if pid is None:
            worker.process.kill()
            from dagster._core.errors import DagsterLaunchFailedError

            raise DagsterLaunchFailedError(
                f"warm run worker (pid {worker.process.pid}) did not take run {run.run_id} within "
                f"{ACCEPT_SECONDS:.0f} s (exit code {worker.process.poll()}); its output is in the daemon's log")
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: json.dumps(
            {"pid": pid, "host": socket.gethostname(), "run_id": run.run_id})})

    def _worker_of(self, run_id: str) -> int | None:
        run = self._instance.get_run_by_id(run_id)
        if not run or WORKER_TAG not in run.tags:
            return None
        info = json.loads(run.tags[WORKER_TAG])
        if info.get("run_id") != run_id:
            return None  # a re-execution's copy of its parent's tag: this run went another way
        return int(info["pid"]) if info.get("host") == socket.gethostname() else -1

    def terminate(self, run_id: str) -> bool:
        pid = self._worker_of(run_id)
        if pid is None:
            return super().terminate(run_id)
        run = self._instance.get_run_by_id(run_id)
        if not run or run.is_finished:
            return False
        self._instance.report_run_canceling(run)
        if pid < 0:
            self._instance.report_engine_event(
                f"Run {run_id} executes in a warm worker on another host; its cancellation thread "
                "interrupts it when it sees CANCELING.", run, cls=self.__class__)
            return True
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            self._instance.report_engine_event(f"Warm run worker (pid {pid}) had already exited.", run,
                                               cls=self.__class__)
            return False
        return True


# -- the worker process ------------------------------------------------------------------------

def _serve_runs() -> int:
    """Warm up, say ready, then for each run id read from stdin fork a process that executes the run, and
    report each such process's pid and, once it ends, its exit code; exit at the end of stdin."""
    import functools
    import importlib
    import logging

    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # as laminar_assets.contracts does before its import
    control = os.dup(1)  # control lines, each one os.write (atomic on a pipe): no buffer a fork could copy half-written
    os.dup2(2, 1)  # the runs' own prints go where the daemon's go; stdout carries control lines only

    from dagster._core.instance import InstanceRef
    from dagster._utils.interrupts import setup_interrupt_handlers

    setup_interrupt_handlers()  # SIGTERM (terminate) becomes an interrupt, as in `dagster api execute_run`
    for module in WARM_IMPORTS:
        importlib.import_module(module)
    partial = False
    for module in LAMINAR_WARM_IMPORTS:
        try:
            importlib.import_module(module)
        except Exception as exc:  # noqa: BLE001 - see below
            # an edited Laminar file that does not import (a syntax error mid-edit): the worker stays warm with the
            # rest, and each run imports the file itself and fails with its error, as through the code server; a
            # worker that died of it would be replaced by one that dies the same way, over and over
            partial = True
            print(f"laminar warm worker {os.getpid()}: {module} not imported ahead ({type(exc).__name__}: {exc}); "
                  "runs import it themselves", file=sys.stderr, flush=True)
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    lines = _Lines(0)
    instance_ref = deserialize_value(lines.next(timeout=None) or "", InstanceRef)
    _import_instance_classes(instance_ref)
    imported = _loaded_files(WARM_PACKAGE)
    if partial:  # every file of the package, so the fix of the one that failed retires this worker too
        imported.update(_package_files(WARM_PACKAGE))
    stale = False
    _say(control, _READY)
    running: set[int] = set()
    while True:
        run_id = lines.next(timeout=1.0)  # also wakes up to reap the runs that ended
        for pid in list(running):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                running.discard(pid)
                _say(control, f"{_EXITED} {pid} {os.waitstatus_to_exitcode(status)}")
        if not stale and _stale(imported):
            stale = True
            _say(control, _STALE)
        if stale and not running:
            return 0  # retired: a new worker imports the edited files
        if run_id is None:
            if lines.ended:
                return 0  # released: the launcher is gone or closed (the runs go on)
            continue
        if stale:
            _say(control, f"{_STALE} {run_id}")
            continue
        pid = os.fork()
        if pid == 0:  # the run's process: nothing of the worker's pipes, then the run
            os.close(control)
            null = os.open(os.devnull, os.O_RDONLY)
            os.dup2(null, 0)
            os.close(null)
            from laminar_assets.process_exit import run_then_exit

            run_then_exit(functools.partial(_execute_opened, run_id, instance_ref))
        running.add(pid)
        _say(control, f"{_ACCEPTED} {run_id} {pid}")


def _import_instance_classes(instance_ref) -> None:
    """Import the classes the instance a run opens is made of (its storages, coordinator, launcher, compute
    logs, the instance class itself: Laminar's, or dagster-postgres'), without making any: a run's process
    opens the instance with `DagsterInstance.from_ref`, which imported them there on every run (0.13 s of each
    launch for Laminar's instance module alone on two cores). Opening connections is left to the run's process
    (nothing that holds a socket or a file is made before a fork); a class that does not import is left to
    the run, which reports it as the code server would."""
    from dagster._serdes.config_class import class_from_code_pointer

    for data in instance_ref._asdict().values():
        if isinstance(data, ConfigurableClassData):
            try:
                class_from_code_pointer(data.module_name, data.class_name)
            except Exception:  # noqa: BLE001,S112 - the run's own from_ref raises it, with Dagster's message
                continue
    for module in INSTANCE_IMPORTS:
        importlib.import_module(module)


def _loaded_files(package: str) -> dict[str, tuple[int, int]]:
    """(size, modification time in ns) of the file of every module of `package` this process imported."""
    files = {}
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if path and (name == package or name.startswith(package + ".")):
            try:
                st = os.stat(path)
            except OSError:
                files[path] = (-1, -1)
                continue
            files[path] = (st.st_size, st.st_mtime_ns)
    return files


def _package_files(package: str) -> dict[str, tuple[int, int]]:
    """(size, modification time in ns) of every Python file under `package`'s folder, imported or not."""
    root = os.path.dirname(importlib.util.find_spec(package).origin or "")  # type: ignore[union-attr]
    files = {}
    for folder, _, names in os.walk(root):
        for name in names:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                try:
                    st = os.stat(path)
                except OSError:
                    continue
                files[path] = (st.st_size, st.st_mtime_ns)
    return files


def _stale(imported: dict[str, tuple[int, int]]) -> bool:
    """Whether a file of `imported` (`_loaded_files`) changed or went away since: a hundred and fifty stats,
    well under a millisecond."""
    for path, seen in imported.items():
        try:
            st = os.stat(path)
        except OSError:
            return True
        if (st.st_size, st.st_mtime_ns) != seen:
            return True
    return False


def _say(fd: int, line: str) -> None:
    os.write(fd, (line + "\n").encode())


class _Lines:
    """Lines of a file descriptor, read with `os.read` (a buffered reader's data would be copied into each fork)."""

    def __init__(self, fd: int) -> None:
        self.fd, self.ended, self._buffer = fd, False, b""

    def next(self, timeout: float | None) -> str | None:
        """The next line (without its end), or None when none came within `timeout` or the input ended."""
        import select

        while b"\n" not in self._buffer:
            if self.ended or not select.select([self.fd], [], [], timeout)[0]:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                self.ended = True
                return None
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return line.decode().strip()


def _execute_opened(run_id: str, instance_ref) -> int:
    from dagster._core.instance import DagsterInstance

    with DagsterInstance.from_ref(instance_ref) as instance:
        return _execute(run_id, instance)


def _execute(run_id: str, instance) -> int:
    from dagster._cli.api import _execute_run_command_body
    from dagster._utils.error import serializable_error_info_from_exc_info
    from dagster._utils.interrupts import capture_interrupts

    watcher = None
    if not instance.should_start_background_run_thread:  # else Dagster's own function starts one
        from dagster._core.execution.run_cancellation_thread import start_run_cancellation_thread

        # interrupts the run when its status turns CANCELING, whoever set it and from whatever host
        watcher = start_run_cancellation_thread(instance, run_id)
    with capture_interrupts():
        try:
            return _execute_run_command_body(run_id, instance, lambda event: None, set_exit_code_on_failure=False)
        except Exception:  # noqa: BLE001 - e.g. the run's code did not load: record it on the run, as the code server does
            run = instance.get_run_by_id(run_id)
            error = serializable_error_info_from_exc_info(sys.exc_info())
            if run is not None and not run.is_finished:
                instance.report_run_failed(run, f"Laminar's warm run worker could not execute the run:\n{error.to_string()}")
            raise
        finally:
            if watcher is not None:
                thread, stop = watcher
                stop.set()
                thread.join(timeout=15)


def main() -> int:
    try:
        return _serve_runs()
    except KeyboardInterrupt:  # Ctrl-C to `dagster dev` reaches its whole process group; a run interrupted
        return 0               # mid-way has already been marked CANCELED by Dagster's own handling
    except BrokenPipeError:  # the launcher is gone (the daemon stopped while this worker warmed up): nothing to
        return 0             # serve, and the runs it forked go on in their own processes


if __name__ == "__main__":
    # The run's outcome is in the Dagster instance before the worker exits; its exit code still says how the
    # worker ended, never a crash of the interpreter's teardown after the run
    # (laminar_assets/process_exit.py, standard library only: no engine or flow module is loaded ahead of the run).
    from laminar_assets.process_exit import run_then_exit

    run_then_exit(main)
