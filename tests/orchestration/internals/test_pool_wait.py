"""A run whose process is killed while it holds its asset's concurrency pool slot (`kill -9`: nothing of
it can clean up) must not wedge the asset: the next run to meet it fails it and frees the slot. A run
waiting on a live holder says which run holds the slot and gives up after its bound. On a real
instance built from the project's dagster.yaml (every pool has one slot), with the holder a real
child process executing a run in the pool (no Spark)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest

from laminar_assets.orchestration.internals.in_process import execute_job_here, failure_message
from laminar_assets.orchestration.internals.pool_wait import PoolWaitPolicy
from laminar_assets.orchestration.internals.run_processes import RunProcess
from laminar_assets.orchestration.internals.thread_executor import thread_executor

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[3]
POOL = "laminar_probe"

HOLDER = '''
import sys, time
import dagster as dg
from laminar_assets.orchestration.internals.in_process import execute_job_here
from laminar_assets.orchestration.internals.thread_executor import thread_executor

home, pool, holding = sys.argv[1:4]

@dg.asset(pool=pool)
def holder():
    open(holding, "w").write("holding")  # the step runs: the pool's slot is this run's
    time.sleep(600)

job = dg.Definitions(assets=[holder], jobs=[dg.define_asset_job("hold", executor_def=thread_executor)]
                     ).resolve_job_def("hold")
with dg.DagsterInstance.from_config(home) as instance:
    execute_job_here(job, instance=instance, partition_key=None, tags={}, run_config={})
'''


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())  # pools: default_limit 1
    with dg.DagsterInstance.from_config(str(home)) as inst:
        yield inst


def _until(predicate, what: str, timeout: float = 60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture
def holder(instance, tmp_path) -> Iterator[tuple[subprocess.Popen, str]]:
    """A child process whose run holds POOL's one slot (its step is running), and that run's id."""
    holding = tmp_path / "holding"
    child = subprocess.Popen([sys.executable, "-c", HOLDER, instance.root_directory, POOL, str(holding)], cwd=REPO)
    try:
        _until(lambda: holding.exists() or child.poll() is not None, "the holder's step to start")
        assert child.poll() is None, f"the holder exited with {child.returncode}"
        [slot] = instance.event_log_storage.get_concurrency_info(POOL).claimed_slots
        yield child, slot.run_id
    finally:
        child.kill()
        child.wait()


def _next_run(instance, *, policy: PoolWaitPolicy) -> dg.ExecuteInProcessResult:
    @dg.asset(pool=POOL)
    def after():
        return dg.MaterializeResult()

    job = dg.Definitions(assets=[after], jobs=[dg.define_asset_job("after", executor_def=thread_executor)]
                         ).resolve_job_def("after")
    return execute_job_here(job, instance=instance, partition_key=None, tags={}, run_config={}, pool_wait=policy)


def _failure(instance, run_id: str) -> str:
    [event] = [e for e in instance.all_logs(run_id) if e.dagster_event
               and e.dagster_event.event_type == dg.DagsterEventType.RUN_FAILURE]
    return event.message


@pytest.mark.timeout(180)  # before the fix the waiting run spun (at high CPU) forever
def test_a_run_waits_for_a_live_holder_within_its_bound_and_frees_a_killed_one(instance, holder):
    """One holder for both cases (a child process costs seconds): alive, a waiting run names it and
    gives up after its bound; then killed while the next run waits with no bound, it is failed and
    the waiting run gets the slot."""
    child, held_by = holder
    said = []
    outcome = _next_run(instance, policy=PoolWaitPolicy(seconds=1, notify=said.append))
    assert not outcome.success
    message = failure_message(outcome)
    assert message.startswith("gave up after waiting") and f"pool {POOL} is held by run {held_by}" in message, message
    assert f"pid {child.pid} on " in message and ", alive)" in message and "(started " in message, message
    assert "--wait-seconds" in message
    assert said[0].startswith(f"waiting: pool {POOL} is held by run {held_by}"), said
    # the holder keeps its run and its slot; the run that gave up leaves nothing queued behind
    assert instance.get_run_by_id(held_by).status == dg.DagsterRunStatus.STARTED
    info = instance.event_log_storage.get_concurrency_info(POOL)
    assert [s.run_id for s in info.claimed_slots] == [held_by] and {p.run_id for p in info.pending_steps} == {held_by}

    def kill_once_the_next_run_waits():
        _until(lambda: any(p.run_id != held_by for p in instance.event_log_storage.get_concurrency_info(POOL).pending_steps),
               "the next run to queue for the slot")
        child.kill()
        child.wait()

    killer = threading.Thread(target=kill_once_the_next_run_waits)
    killer.start()
    heard = []
    outcome = _next_run(instance, policy=PoolWaitPolicy(seconds=None, notify=heard.append))  # only the kill frees it
    killer.join()
    assert outcome.success
    assert any(n.startswith(f"run {held_by} was left STARTED by a process that is gone (pid {child.pid} on ")
               and n.endswith("marked it failed and freed its concurrency slots") for n in heard), heard
    assert instance.get_run_by_id(held_by).status == dg.DagsterRunStatus.FAILURE
    assert f"pid {child.pid}" in _failure(instance, held_by) and "ended without finishing it" in _failure(instance, held_by)
    info = instance.event_log_storage.get_concurrency_info(POOL)
    assert info.claimed_slots == [] and info.pending_steps == []


def test_a_run_process_is_its_pid_and_start_time_on_its_host():
    me = RunProcess.current()
    assert me.alive() is True and RunProcess.of_run(_run_tagged(me.tag())) == me
    assert RunProcess(me.pid, me.host, "0").alive() is False  # the pid reused by a process started at another time
    assert RunProcess(me.pid, "another-host", me.start).alive() is None  # never judged from here
    assert "another host" in RunProcess(me.pid, "another-host", me.start).describe()


def _run_tagged(tags: dict) -> dg.DagsterRun:
    return dg.DagsterRun(job_name="j", run_id="r", tags=tags)
