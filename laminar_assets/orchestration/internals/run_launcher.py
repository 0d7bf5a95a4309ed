"""A run launcher that hands each run to a warm Python process instead of starting a cold one.

Dagster's `DefaultRunLauncher` asks the code server to start every run in a new Python process, which
then imports Dagster, pandas, pyarrow, Spark's client and, for a run with a contract check, Great
Expectations (seconds of imports, docs/PERFORMANCE.md), before the run's first step. On a daemon
that keeps sinks fresh, those seconds are most of the time from a commit to its run.

`WarmRunLauncher` keeps `warm_workers` processes started ahead of time, each with those libraries
already imported and its Dagster instance open, waiting on a pipe for a run id. A run goes to an
idle one, which executes it exactly as `dagster api execute_run` does (the same Dagster function,
the run's own code origin loaded from disk then, so user code is never older than the run), and
exits; a new worker is warmed once it has. When no worker is idle, the run goes the default way,
through the code server. Every run is an ordinary Dagster run in the UI either way.

Only third-party libraries are imported ahead of time: Laminar's engine and the flows load with
the run, so an edited flow or engine module is what the next run executes.

A worker is a child of the process that launches runs (the daemon); an idle one exits when its pipe
closes, so it never outlives the daemon (one executing a run finishes the run first). Terminating a
run from the same host sends its worker SIGTERM, which Dagster turns into an interrupt: the run ends
CANCELED; from another host, the run's cancellation thread sees CANCELING and does the same.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

from dagster._core.launcher import LaunchRunContext
from dagster._core.launcher.default_run_launcher import DefaultRunLauncher
from dagster._serdes import ConfigurableClassData, deserialize_value, serialize_value

WORKER_TAG = "laminar/run_worker"
"""Run tag naming the warm worker that executes a run: {"pid": ..., "host": ..., "run_id": ...}. The run
id is checked: Dagster copies a run's tags to its re-executions, which may go another way."""

ACCEPT_SECONDS = 30.0
"""How long `launch_run` waits for a warm worker to confirm it took the run id before failing the launch."""

WARM_IMPORTS = ("dagster._cli.api", "pandas", "pyarrow.dataset", "pyspark.sql", "pyspark.sql.connect.session",
                "deltalake", "sqlglot", "great_expectations")
"""What a worker imports before it says it is ready: the third-party libraries every Laminar run
imports. Laminar's own modules are not among them (see the module docstring)."""

_READY = "ready"
_ACCEPTED = "accepted"


class _Worker:
    """One warm process and a thread reading its control lines (`ready`, then `accepted`)."""

    def __init__(self, instance_ref_json: str, env: Mapping[str, str]) -> None:
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.process = subprocess.Popen(
            [sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(env), bufsize=1)
        assert self.process.stdin is not None
        self.process.stdin.write(instance_ref_json + "\n")
        self.process.stdin.flush()
        self._ready = threading.Event()
        threading.Thread(target=self._read, name=f"laminar-warm-worker-{self.process.pid}", daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            line = line.strip()
            if line == _READY:
                self._ready.set()
            else:
                self.lines.put(line)
        self.lines.put(None)  # the worker closed its control pipe: it exited or started the run

    @property
    def idle(self) -> bool:
        return self._ready.is_set() and self.process.poll() is None

    def hand(self, run_id: str, timeout: float) -> bool:
        """Send the run id; True once the worker confirms it took it."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(run_id + "\n")
            self.process.stdin.close()
        except (BrokenPipeError, OSError):
            return False
        try:
            return self.lines.get(timeout=timeout) == _ACCEPTED
        except queue.Empty:
            return False

    def release(self) -> None:
        """Let an idle worker go: it reads end of input and exits."""
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
        self._lock = threading.Lock()
        self._closed = False
        self._started = False

    @classmethod
    def config_type(cls) -> dict:
        from dagster import Field, IntSource

        return {"warm_workers": Field(IntSource, is_required=False, default_value=2,
                                      description="Processes kept warm for the next runs (0: launch every run the default way).")}

    @classmethod
    def from_config_value(cls, inst_data: ConfigurableClassData, config_value: Mapping[str, Any]):
        return cls(inst_data=inst_data, warm_workers=config_value.get("warm_workers", 2))

    # -- the pool -------------------------------------------------------------------------------

    def _top_up(self) -> None:
        """Start workers until `warm_workers` are alive and not yet handed a run (lock held)."""
        if self._closed:
            return
        self._workers = [w for w in self._workers if w.process.poll() is None]
        ref = serialize_value(self._instance.get_ref())
        while len(self._workers) < self.warm_workers:
            self._workers.append(_Worker(ref, os.environ))

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
            self._top_up()  # also replaces an idle worker that died
            if first:
                return None
            worker = next((w for w in self._workers if w.idle), None)
            if worker is not None:
                self._workers.remove(worker)
            return worker

    def _replace_after(self, worker: _Worker, run_id: str) -> None:
        """Once the worker has exited: free the pool slots its run still holds (a killed worker frees
        nothing, and every step of the run was in that process), fail the run if it did not end (as the
        code server does for a run process that dies), then warm the next worker; warming never
        competes with the run."""
        def wait_then_top_up() -> None:
            from laminar_assets.orchestration.internals.run_processes import free_slots

            code = worker.process.wait()
            if self._closed:
                return  # the instance is going away (the daemon stops): nothing to report on or warm
            free_slots(self._instance, run_id)
            run = self._instance.get_run_by_id(run_id)
            if run is not None and not run.is_finished:
                self._instance.report_run_failed(
                    run, f"Laminar's warm run worker (pid {worker.process.pid}) exited with code {code} "
                         "before the run finished.")
            with self._lock:
                self._top_up()
        threading.Thread(target=wait_then_top_up, name="laminar-warm-worker-replace", daemon=True).start()

    def dispose(self) -> None:
        with self._lock:
            self._closed = True
            for worker in self._workers:
                worker.release()
            self._workers = []

    # -- RunLauncher ----------------------------------------------------------------------------

    def launch_run(self, context: LaunchRunContext) -> None:
        run = context.dagster_run
        worker = self._take() if self.warm_workers > 0 else None
        if worker is None:
            super().launch_run(context)
            return
        self._instance.add_run_tags(run.run_id, {WORKER_TAG: json.dumps(
            {"pid": worker.process.pid, "host": socket.gethostname(), "run_id": run.run_id})})
        accepted = worker.hand(run.run_id, ACCEPT_SECONDS)
        self._replace_after(worker, run.run_id)
        if not accepted:
            worker.process.kill()
            from dagster._core.errors import DagsterLaunchFailedError

            raise DagsterLaunchFailedError(
                f"warm run worker (pid {worker.process.pid}) did not take run {run.run_id} within "
                f"{ACCEPT_SECONDS:.0f} s (exit code {worker.process.poll()}); its output is in the daemon's log")

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

def _serve_one_run() -> int:
    """Warm up, say ready, take one run id from stdin, confirm, execute the run, exit."""
    import importlib
    import logging

    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")  # as laminar_assets.contracts does before its import
    control = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # the run's own prints go where the daemon's go; stdout carries control lines only

    from dagster._core.instance import DagsterInstance, InstanceRef
    from dagster._utils.interrupts import setup_interrupt_handlers

    setup_interrupt_handlers()  # SIGTERM (terminate) becomes an interrupt, as in `dagster api execute_run`
    for module in WARM_IMPORTS:
        importlib.import_module(module)
    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    instance_ref = deserialize_value(sys.stdin.readline(), InstanceRef)
    with DagsterInstance.from_ref(instance_ref) as instance:
        control.write(_READY + "\n")
        run_id = sys.stdin.readline().strip()
        if not run_id:
            return 0  # released: the launcher is gone or closed
        control.write(_ACCEPTED + "\n")
        control.close()
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
        return _serve_one_run()
    except KeyboardInterrupt:  # Ctrl-C to `dagster dev` reaches its whole process group; a run interrupted
        return 0               # mid-way has already been marked CANCELED by Dagster's own handling


if __name__ == "__main__":
    # The run's outcome is in the Dagster instance before the worker exits; its exit code still says how the
    # worker ended, never a crash of the interpreter's teardown after the run
    # (laminar_assets/process_exit.py, standard library only: no engine or flow module is loaded ahead of the run).
    from laminar_assets.process_exit import run_then_exit

    run_then_exit(main)
