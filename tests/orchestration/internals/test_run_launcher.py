"""The warm run launcher (laminar_assets/orchestration/internals/run_launcher.py) on a real instance
built from the project's dagster.yaml: a run executes in a pre-started worker that had already
imported the heavy libraries, and the run's lifecycle (success, terminate, a worker that dies, the
default path when no worker is warm, a worker outliving nobody) is Dagster's."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.definitions.reconstruct import ReconstructableJob
from dagster._core.launcher import LaunchRunContext
from dagster._serdes import serialize_value

from laminar_assets.orchestration.internals.run_launcher import WORKER_TAG, WarmRunLauncher, _Worker

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[3]

PROBE = '''
import json, os, sys, time
import dagster as dg

def _probe(context):
    cfg = context.op_config
    # what this process had imported when the run's first step began
    warm = {m: m in sys.modules for m in ("great_expectations", "pandas", "pyspark.sql", "laminar_assets.engine",
                                          "laminar_assets.orchestration.builder", "laminar_assets.flows")}
    with open(cfg["out"], "w") as f:
        json.dump({"pid": os.getpid(), "parent": os.getppid(), "warm": warm}, f)
    if cfg["exit_code"]:
        os._exit(cfg["exit_code"])
    time.sleep(cfg["sleep"])

CONFIG = {"out": str, "sleep": float, "exit_code": int}
probe = dg.op(config_schema=CONFIG, pool="laminar_probe", name="probe")(_probe)  # one slot (dagster.yaml)
unpooled_probe = dg.op(config_schema=CONFIG, name="probe")(_probe)

@dg.job(executor_def=dg.in_process_executor)  # like Laminar's thread executor: steps run in the run process
def probe_job():
    probe()

@dg.job(executor_def=dg.in_process_executor)  # runs that may overlap: no pool slot to wait for
def unpooled_probe_job():
    unpooled_probe()
'''


def _open(folder: Path) -> dg.DagsterInstance:
    """An instance under `folder`/home built from the project's own dagster.yaml (its run_launcher section is
    what this test is about), and the probe job beside it."""
    home = folder / "home"
    home.mkdir()
    (home / "dagster.yaml").write_text((REPO / "dagster.yaml").read_text())
    (folder / "probe_job.py").write_text(PROBE)
    return dg.DagsterInstance.from_config(str(home))


def _close(inst: dg.DagsterInstance) -> None:
    """Dispose of the launcher, and end the workers it still had: a worker released while it imports
    finishes its imports before it reads that it was released, seconds of CPU for nothing (that idle workers
    exit on their own is `test_without_a_warm_worker_...`'s)."""
    launcher = inst.run_launcher
    workers = list(getattr(launcher, "_workers", []))
    launcher.dispose()
    for worker in workers:
        worker.process.kill()
        worker.process.wait()


@pytest.fixture(scope="module")
def shared(tmp_path_factory) -> Iterator[tuple[dg.DagsterInstance, Path]]:
    """One instance and its warm pool for the tests that launch runs: each run takes a warm worker and the
    launcher warms the next, as on a daemon (a pool per test started two workers, each seconds of imports, to
    use one). The probe's pool has one slot: each test's run has finished before the next launches."""
    folder = tmp_path_factory.mktemp("launcher")
    with _open(folder) as inst:
        yield inst, folder
        _close(inst)


@pytest.fixture
def instance(tmp_path: Path) -> Iterator[dg.DagsterInstance]:
    """An instance of its own, for the tests of a launcher that has not started its pool yet or is disposed."""
    with _open(tmp_path) as inst:
        yield inst
        _close(inst)


def _run(instance: dg.DagsterInstance, job_dir: Path, out: Path, *, sleep: float = 0.0, exit_code: int = 0,
         job: str = "probe_job"):
    recon = ReconstructableJob.for_file(str(job_dir / "probe_job.py"), job)
    config = {"ops": {"probe": {"config": {"out": str(out), "sleep": sleep, "exit_code": exit_code}}}}
    return instance.create_run_for_job(job_def=recon.get_definition(), run_config=config,
                                       job_code_origin=recon.get_python_origin())


def _wait(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


def _warm(instance: dg.DagsterInstance) -> WarmRunLauncher:
    launcher = instance.run_launcher
    assert isinstance(launcher, WarmRunLauncher), "dagster.yaml should configure the warm run launcher"
    launcher.prepare()
    _wait(lambda: launcher.idle_workers() >= 1, 120, "a warm worker")
    return launcher


def _finished(instance: dg.DagsterInstance, run_id: str, timeout: float = 120) -> dg.DagsterRun:
    return _wait(lambda: (r := instance.get_run_by_id(run_id)) and r.is_finished and r, timeout,
                 f"run {run_id} to finish")


def test_runs_execute_in_processes_a_warm_worker_forks(shared, tmp_path):
    """Two runs launched back to back: each in a process of its own, forked by one warm worker, which stays
    warm for the next (no worker warms up again between runs). Their step takes no pool slot: the runs overlap
    (with the one-slot pool, the second run once waited 120 s for a slot the first had freed, 1 CI run in 12,
    a wait in Dagster's op concurrency, not in the launcher, which is what this test is about)."""
    instance, job_dir = shared
    launcher = _warm(instance)
    runs = [_run(instance, job_dir, tmp_path / f"probe{i}.json", job="unpooled_probe_job") for i in range(2)]
    for run in runs:
        instance.launch_run(run.run_id, workspace=None)  # the warm path needs no code server
    workers = {w.process.pid for w in launcher._workers}
    pids = []
    for i, run in enumerate(runs):
        done = _finished(instance, run.run_id)
        assert done.status == dg.DagsterRunStatus.SUCCESS
        probe = json.loads((tmp_path / f"probe{i}.json").read_text())
        worker = json.loads(done.tags[WORKER_TAG])
        assert probe["pid"] == worker["pid"] != os.getpid() and probe["parent"] in workers, (probe, workers)
        # Laminar's library too, but never the flows: each run loads the user's code itself
        assert probe["warm"] == {"great_expectations": True, "pandas": True, "pyspark.sql": True,
                                 "laminar_assets.engine": True, "laminar_assets.orchestration.builder": True,
                                 "laminar_assets.flows": False}, probe
        started = [e.message for e in instance.all_logs(run.run_id) if "Started process for run" in (e.message or "")]
        assert started == [f"Started process for run (pid: {worker['pid']})."]
        pids.append(probe["pid"])
    assert len(set(pids)) == 2
    assert {w.process.pid for w in launcher._workers} == workers and launcher.idle_workers() == 2


def test_terminate_cancels_the_run(shared, tmp_path):
    instance, job_dir = shared
    _warm(instance)
    run = _run(instance, job_dir, tmp_path / "probe.json", sleep=120)
    instance.launch_run(run.run_id, workspace=None)
    _wait(lambda: (tmp_path / "probe.json").exists(), 60, "the step to start")
    # the UI terminates from another process: a launcher built from the same dagster.yaml
    with dg.DagsterInstance.from_ref(instance.get_ref()) as other:
        assert other.run_launcher.terminate(run.run_id)
    done = _finished(instance, run.run_id, timeout=60)
    assert done.status == dg.DagsterRunStatus.CANCELED


def test_a_worker_that_dies_fails_its_run(shared, tmp_path):
    instance, job_dir = shared
    _warm(instance)
    run = _run(instance, job_dir, tmp_path / "probe.json", exit_code=3)
    instance.launch_run(run.run_id, workspace=None)
    done = _finished(instance, run.run_id, timeout=60)
    assert done.status == dg.DagsterRunStatus.FAILURE
    failure = [e.message for e in instance.all_logs(run.run_id) if e.is_dagster_event and
               e.dagster_event.event_type == dg.DagsterEventType.RUN_FAILURE]
    assert any("exited with code 3" in m for m in failure), failure
    # the step died holding its pool's slot: the launcher freed it, or the probe's asset would wedge
    assert instance.event_log_storage.get_concurrency_info("laminar_probe").claimed_slots == []


def test_a_worker_killed_is_replaced_and_the_next_run_is_warm(shared, tmp_path):
    """kill -9 of a warm worker (an operator, the OOM killer): the launcher warms another in its place."""
    instance, job_dir = shared
    launcher = _warm(instance)
    _wait(lambda: launcher.idle_workers() == 2, 120, "both warm workers")
    victim = launcher._workers[0].process
    victim.kill()
    victim.wait()
    _wait(lambda: launcher.idle_workers() == 2 and victim.pid not in {w.process.pid for w in launcher._workers}, 120,
          "a new warm worker in place of the killed one")
    run = _run(instance, job_dir, tmp_path / "probe.json")
    instance.launch_run(run.run_id, workspace=None)
    done = _finished(instance, run.run_id)
    assert done.status == dg.DagsterRunStatus.SUCCESS and WORKER_TAG in done.tags


def test_without_a_warm_worker_the_run_goes_the_default_way_and_idle_workers_exit_with_the_launcher(instance, tmp_path):
    """The first launch starts the pool and goes through the code server, as Dagster's own launcher does; the
    workers it started, once warm and idle, exit when the launcher is disposed (they never outlive it)."""
    launcher = instance.run_launcher
    run = _run(instance, tmp_path, tmp_path / "probe.json")
    # without a workspace that is DefaultRunLauncher's own error
    with pytest.raises(dg.DagsterInvariantViolationError, match="requires a workspace"):
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    assert WORKER_TAG not in instance.get_run_by_id(run.run_id).tags
    _wait(lambda: launcher.idle_workers() == launcher.warm_workers == 2, 120, "the pool the first launch started")
    workers = list(launcher._workers)
    launcher.dispose()
    _wait(lambda: all(w.process.poll() is not None for w in workers), 30,
          f"workers {[w.process.pid for w in workers]} to exit")


def test_a_run_on_another_host_is_stopped_by_its_cancellation_thread(shared, tmp_path):
    """No signal reaches a worker on another host: the run's own cancellation thread sees CANCELING
    (polled every 10 s, Dagster's default) and interrupts it."""
    instance, job_dir = shared
    _warm(instance)
    run = _run(instance, job_dir, tmp_path / "probe.json", sleep=120)
    instance.launch_run(run.run_id, workspace=None)
    _wait(lambda: (tmp_path / "probe.json").exists(), 60, "the step to start")
    info = json.loads(instance.get_run_by_id(run.run_id).tags[WORKER_TAG])
    instance.add_run_tags(run.run_id, {WORKER_TAG: json.dumps({**info, "host": "elsewhere"})})
    assert instance.run_launcher.terminate(run.run_id)
    assert _finished(instance, run.run_id, timeout=60).status == dg.DagsterRunStatus.CANCELED


def test_a_re_executions_copied_tag_never_signals_its_parents_worker(shared, tmp_path):
    """Dagster copies a run's tags to its re-executions; one that went the default way must not
    signal the pid its parent's tag names (by then, possibly another process)."""
    instance, job_dir = shared
    bystander = subprocess.Popen(["sleep", "60"])
    try:
        run = _run(instance, job_dir, tmp_path / "probe.json")
        instance.add_run_tags(run.run_id, {WORKER_TAG: json.dumps(
            {"pid": bystander.pid, "host": __import__("socket").gethostname(), "run_id": "the-parent-run"})})
        instance.run_launcher.terminate(run.run_id)  # the default way: no code server to ask here
        time.sleep(0.5)
        assert bystander.poll() is None, "terminate signalled the process the copied tag names"
    finally:
        bystander.kill()
        bystander.wait()


def _laminar_copy(tmp_path: Path) -> Path:
    """A copy of the package for workers to import (PYTHONPATH, and PYTHONSAFEPATH so `-m` does not put the
    checkout first), so a test can edit a file a worker imported without touching the checkout."""
    copy = tmp_path / "src"
    shutil.copytree(REPO / "laminar_assets", copy / "laminar_assets", ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _edit(path: Path) -> None:
    """What saving a file in an editor does to what a worker checks: a new modification time."""
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))


def test_a_worker_whose_engine_files_changed_refuses_the_run_and_retires(tmp_path):
    """A worker imported Laminar's engine ahead of the runs; after an edit of one of those files it forks no run
    (which would execute the old code), says so, and exits once its runs have ended."""
    copy = _laminar_copy(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONSAFEPATH": "1"}
    replaced = threading.Event()
    with _open(tmp_path) as inst:
        worker = _Worker(serialize_value(inst.get_ref()), env, lambda pid, code: None, replaced.set)
        try:
            _wait(lambda: worker.idle, 120, "the worker to warm up")
            _edit(copy / "laminar_assets" / "engine" / "executor.py")
            assert worker.hand("a-run-id", timeout=30) is None
            assert worker.stale and not worker.idle
            assert worker.process.wait(30) == 0
            assert replaced.wait(10), "the launcher was not told to warm a worker in its place"
        finally:
            worker.process.kill()
            worker.process.wait()


def test_after_an_edit_the_run_goes_the_default_way_and_a_fresh_worker_warms_up(instance, tmp_path, monkeypatch):
    """The launcher's side: the run a stale worker refused goes through the code server (which, without a
    workspace, is DefaultRunLauncher's own error), and new workers with the edited file take its place."""
    copy = _laminar_copy(tmp_path)
    monkeypatch.setenv("PYTHONPATH", str(copy))
    monkeypatch.setenv("PYTHONSAFEPATH", "1")
    launcher = _warm(instance)
    _wait(lambda: launcher.idle_workers() == 2, 120, "both warm workers")
    stale = {w.process.pid for w in launcher._workers}
    _edit(copy / "laminar_assets" / "contracts" / "expectations.py")
    run = _run(instance, tmp_path, tmp_path / "probe.json")
    with pytest.raises(dg.DagsterInvariantViolationError, match="requires a workspace"):
        launcher.launch_run(LaunchRunContext(dagster_run=run, workspace=None))
    assert WORKER_TAG not in instance.get_run_by_id(run.run_id).tags
    _wait(lambda: launcher.idle_workers() == 2 and not stale & {w.process.pid for w in launcher._workers}, 120,
          "two new warm workers in place of the stale ones")


def test_a_laminar_file_that_does_not_import_leaves_the_worker_warm_until_it_is_fixed(tmp_path):
    """A syntax error mid-edit in an engine file: the worker skips what it cannot import ahead and is ready (runs then
    import the file themselves and fail with its error; a worker that died of it would be replaced in a loop). Once
    the file is fixed the worker retires, or it would stay without Laminar's library for good."""
    copy = _laminar_copy(tmp_path)
    broken = copy / "laminar_assets" / "engine" / "executor.py"
    good = broken.read_text()
    broken.write_text(good + "\ndef half_typed(:\n")
    env = {**os.environ, "PYTHONPATH": str(copy), "PYTHONSAFEPATH": "1"}
    with _open(tmp_path) as inst:
        worker = _Worker(serialize_value(inst.get_ref()), env, lambda pid, code: None, lambda: None)
        try:
            _wait(lambda: worker.idle or worker.process.poll() is not None, 120, "the worker to warm up")
            assert worker.idle, f"the worker exited with code {worker.process.poll()}"
            # the file fixed: this worker, which holds none of what failed, retires so a new one imports it all
            broken.write_text(good)
            _edit(broken)
            _wait(lambda: worker.stale, 30, "the worker to see the fix and retire")
            assert worker.process.wait(30) == 0
        finally:
            worker.release()
            worker.process.wait(30)


PRELOAD = r"""
import json, os, sys
from dagster._core.instance import InstanceRef
from dagster._serdes import deserialize_value
from laminar_assets.orchestration.internals.run_launcher import _import_instance_classes

ref = deserialize_value(sys.stdin.read(), InstanceRef)
home = sys.argv[1]
before, files = set(sys.modules), sorted(os.listdir(home))
_import_instance_classes(ref)
print(json.dumps({"imported": sorted(set(sys.modules) - before), "files_before": files,
                  "files_after": sorted(os.listdir(home))}))
"""


def test_a_worker_imports_the_instance_classes_a_run_opens_without_opening_them(tmp_path):
    """Each forked run opens the instance (`DagsterInstance.from_ref`), which imported the instance's classes there,
    every run; the worker imports them ahead from the instance's ref (the storages, the coordinator, Laminar's
    instance class), and opens nothing: no database file appears in the instance's folder."""
    with _open(tmp_path) as instance:
        ref = serialize_value(instance.get_ref())
        home = instance.root_directory
    proc = subprocess.run([sys.executable, "-c", PRELOAD, home], input=ref, cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "laminar_assets.orchestration.internals.instance" in out["imported"], out["imported"]
    assert "dagster._core.storage.runs.sqlite.sqlite_run_storage" in out["imported"], out["imported"]
    assert out["files_after"] == out["files_before"], out


def test_a_worker_whose_launcher_is_gone_before_it_is_ready_exits_quietly(tmp_path):
    """The daemon stopped while a new worker warmed up (a replacement started just before Ctrl-C): its `ready`
    met a closed pipe, and every shutdown of `laminar serve` left a BrokenPipeError traceback in dagster.log."""
    with _open(tmp_path) as inst:
        worker = subprocess.Popen([sys.executable, "-m", "laminar_assets.orchestration.internals.run_launcher"],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=REPO)
        assert worker.stdin is not None and worker.stdout is not None
        worker.stdin.write(serialize_value(inst.get_ref()) + "\n")
        worker.stdin.close()
        worker.stdout.close()  # the launcher's end of the control pipe, gone
        err = worker.stderr.read() if worker.stderr is not None else ""
        worker.wait(120)
    assert worker.returncode == 0 and "Traceback" not in err, err[-2000:]
