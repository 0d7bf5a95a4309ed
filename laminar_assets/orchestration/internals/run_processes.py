"""Which process executes a run, whether it still lives, and what becomes of runs whose process died.

Every asset is in a concurrency pool of its own (`laminar_<asset>`, one step at a time, dagster.yaml),
and a run holds its asset's slot while the step runs. A run process killed with SIGKILL (`kill -9`,
the OOM killer, a machine that lost power) frees nothing: the run stays STARTED and its slot stays
claimed, so every later run of that asset waits forever, and the pipeline sensor of its part skips
forever ("run ... is in progress"). Dagster frees such slots only through its run-monitoring
daemon, with a run launcher that can check a worker's health, and never for a run executed
in-process (`laminar refill`, `laminar demo`, `laminar check --demo`).

So every run records the process executing it (`PROCESS_TAG`: pid, host, and the process's start
time, so that a reused pid is not taken for the run's own), and whoever meets a run in its way (a run
waiting for a pool slot, a sensor finding a run of its part in progress, an in-process request about
to start) fails that run when its process is provably gone: on this host, and no live process has
that pid and start time. A run on another host is never judged from here. Failing it records why on
the run, and frees every pool slot it held or queued for.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime

import dagster as dg

PROCESS_TAG = "laminar/process"
"""Run tag naming the process that executes the run: {"pid": ..., "host": ..., "start": ...}."""

WORKER_TAG = "laminar/run_worker"
"""Run tag naming the warm worker that executes a run (run_launcher.py writes it when it hands the run to
one): {"pid": ..., "host": ..., "run_id": ...}. The run id is checked: Dagster copies a run's tags to its
re-executions, which may go another way."""

IN_PROGRESS = (dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING, dg.DagsterRunStatus.STARTED,
               dg.DagsterRunStatus.CANCELING)
"""Statuses of a run that has not ended (a QUEUED run has no process yet)."""


def _process_start(pid: int) -> str | None:
    """An opaque token of when process `pid` started ("" where the system does not say), or None
    when no live process has that pid (a zombie, killed but not yet reaped, is not live)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc (macOS): whether the pid exists at all
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:
            pass
        return ""
    # fields[0] is the state (field 3 of proc(5)), fields[19] the start time in clock ticks (field 22)
    return None if fields[0] in ("Z", "X") else fields[19]


@dataclass(frozen=True)
class RunProcess:
    """The process that executes a run."""

    pid: int
    host: str
    start: str | None = None  # _process_start's token when the tag was written (None: not recorded)

    @classmethod
    def of(cls, pid: int) -> RunProcess:
        """The process with this pid on this host, now."""
        return cls(pid, socket.gethostname(), _process_start(pid))

    @classmethod
    def current(cls) -> RunProcess:
        return cls.of(os.getpid())

    def tag(self) -> dict[str, str]:
        return {PROCESS_TAG: json.dumps({"pid": self.pid, "host": self.host, "start": self.start})}

    @classmethod
    def of_run(cls, run: dg.DagsterRun) -> RunProcess | None:
        """From the run's PROCESS_TAG, else from the warm worker it was handed to (run_launcher.py)."""
        for tag in (PROCESS_TAG, WORKER_TAG):
            try:
                info = json.loads(run.tags[tag])
                if tag == WORKER_TAG and info.get("run_id") != run.run_id:
                    continue  # a re-execution's copy of its parent's tag
                return cls(int(info["pid"]), str(info["host"]), info.get("start"))
            except (KeyError, TypeError, ValueError):
                continue
        return None

    def alive(self) -> bool | None:
        """True or False on this host; None when the process is on another host (it cannot be checked here)."""
        if self.host != socket.gethostname():
            return None
        start = _process_start(self.pid)
        return start is not None and (not self.start or not start or start == self.start)

    def where(self) -> str:
        return f"pid {self.pid} on {self.host}"

    def describe(self) -> str:
        state = {True: "alive", False: "gone", None: "on another host: cannot be checked from here"}[self.alive()]
        return f"{self.where()}, {state}"


@dataclass(frozen=True)
class PoolHolder:
    """A run that holds a slot of a pool, or is queued for one."""

    pool: str
    run_id: str
    step_key: str
    claimed: bool  # holds the slot (else queued for it)
    run: dg.DagsterRun | None  # None: the run was deleted
    started: float | None  # when the run started (epoch seconds)

    @property
    def process(self) -> RunProcess | None:
        return RunProcess.of_run(self.run) if self.run is not None else None

    def describe(self) -> str:
        if self.run is None:
            return f"run {self.run_id} (deleted)"
        parts = [] if self.run.status == dg.DagsterRunStatus.STARTED else [self.run.status.value]
        if self.started is not None:
            parts.append(f"started {datetime.fromtimestamp(self.started, UTC):%Y-%m-%d %H:%M:%S} UTC")
        process = self.process
        parts.append(process.describe() if process else "its process is not recorded")
        return f"run {self.run_id} ({', '.join(parts)})"


def free_slots(instance: dg.DagsterInstance, run_id: str) -> None:
    """Free every pool slot `run_id` holds or is queued for (nothing where the storage has no pools)."""
    if instance.event_log_storage.supports_global_concurrency_limits:
        instance.event_log_storage.free_concurrency_slots_for_run(run_id)


def pool_holders(instance: dg.DagsterInstance, pool: str, *, other_than: str | None = None) -> list[PoolHolder]:
    """The runs holding a slot of `pool` (first) or queued for one, but `other_than`."""
    info = instance.event_log_storage.get_concurrency_info(pool)
    seen: dict[str, PoolHolder] = {}
    entries = [(s.run_id, s.step_key, True) for s in info.claimed_slots] + \
        [(p.run_id, p.step_key, False) for p in info.pending_steps]
    for run_id, step_key, claimed in entries:
        if run_id == other_than or run_id in seen:
            continue
        record = instance.get_run_record_by_id(run_id)
        seen[run_id] = PoolHolder(pool, run_id, step_key, claimed, record.dagster_run if record else None,
                                  record.start_time if record else None)
    return list(seen.values())


def _is_dead(run: dg.DagsterRun) -> RunProcess | None:
    """The run's process when it is provably gone (None: alive, elsewhere, or not recorded)."""
    process = RunProcess.of_run(run)
    return process if process is not None and process.alive() is False else None


def fail_dead_run(instance: dg.DagsterInstance, run: dg.DagsterRun) -> str | None:
    """Fail `run` if it has not ended and its process is gone, and free its pool slots; what was done."""
    process = _is_dead(run)
    if process is None:
        return None
    current = instance.get_run_by_id(run.run_id)  # another process may have failed it meanwhile
    if current is None or current.status not in IN_PROGRESS:
        return None
    instance.report_run_failed(
        current, f"The process executing this run ({process.describe()}) ended without finishing it (killed?); "
                 f"Laminar marked the run failed from pid {os.getpid()} on {socket.gethostname()} and freed the "
                 "concurrency pool slots it held, so that later runs of its assets can start.")
    free_slots(instance, run.run_id)
    return (f"run {run.run_id} was left {current.status.value} by a process that is gone ({process.where()}): "
            "marked it failed and freed its concurrency slots")


def release_dead_holder(instance: dg.DagsterInstance, holder: PoolHolder) -> str | None:
    """Free the slots of a holder that cannot be using them: its run was deleted, or ended with no live
    process, or has not ended but its process is gone (that run is failed first); what was done."""
    run = holder.run
    if run is not None and run.status in IN_PROGRESS:
        return fail_dead_run(instance, run)
    if run is not None and not run.is_finished:
        return None  # queued, or a status Laminar does not judge
    if run is not None:
        process = RunProcess.of_run(run)
        if process is not None and process.alive():
            return None  # ended, but its process still executes a step: it frees the slot itself
    free_slots(instance, holder.run_id)
    return f"freed the slot of pool {holder.pool} that {holder.describe()} still held"


def fail_dead_runs(instance: dg.DagsterInstance) -> list[str]:
    """Fail every run of the instance that has not ended and whose process is gone; what was done."""
    runs = instance.get_runs(dg.RunsFilter(statuses=list(IN_PROGRESS)))
    return [note for run in runs if (note := fail_dead_run(instance, run))]
