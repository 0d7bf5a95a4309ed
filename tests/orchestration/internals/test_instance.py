"""The project's Dagster instance (dagster.yaml -> laminar_assets/orchestration/internals/instance.py) on real SQLite files:
events land where Dagster's default storage puts them, round-trip, reuse their engines, and survive
a deleted database, a fork, a wipe, and a home written by Dagster's own storage."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage

import laminar_assets.orchestration.internals.instance as li

pytestmark = pytest.mark.process

REPO = Path(__file__).resolve().parents[3]
PARTS = dg.StaticPartitionsDefinition(["a", "b", "c"])


@dg.asset(partitions_def=PARTS)
def thing() -> int:
    return 1


@dg.asset_check(asset=thing)
def thing_ok() -> dg.AssetCheckResult:
    return dg.AssetCheckResult(passed=True)


def _home(tmp_path: Path, *, stock: bool = False) -> str:
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    text = (REPO / "dagster.yaml").read_text()
    if stock:  # Dagster's own instance: the same file without the instance class
        assert "instance_class:" in text
        text = text.replace("instance_class:\n  module: laminar_assets.orchestration.internals.instance\n"
                            "  class: LaminarInstance\n", "")
    (home / "dagster.yaml").write_text(text)
    return str(home)


def _run(inst, partition: str = "a") -> str:
    result = dg.materialize([thing, thing_ok], instance=inst, partition_key=partition, raise_on_error=True)
    return result.run_id


def test_events_go_to_the_instance_folder_whatever_dagster_home_says(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setenv("DAGSTER_HOME", str(elsewhere))
    home = _home(tmp_path)
    with dg.DagsterInstance.from_config(home) as inst:
        assert isinstance(inst, li.LaminarInstance)
        assert isinstance(inst.event_log_storage, li.KeptEngineSqliteEventLogStorage)
        legacy = inst.get_ref().event_storage  # the ref's per-storage field names the same class and folder
        assert isinstance(legacy, li.KeptEngineSqliteEventLogStorage)
        assert legacy._base_dir == inst.event_log_storage._base_dir
        legacy.dispose()
        run_id = _run(inst)
        assert os.path.exists(os.path.join(home, "history", "runs", f"{run_id}.db"))
        assert os.path.exists(os.path.join(home, "history", "runs.db"))  # runs: Dagster's place too
    assert list(elsewhere.iterdir()) == []


def test_runs_events_and_checks_round_trip_and_engines_are_reused(tmp_path, monkeypatch):
    made: list[str] = []
    create = li.sa.create_engine

    def counting(url, **kw):
        made.append(str(url))
        return create(url, **kw)

    monkeypatch.setattr(li.sa, "create_engine", counting)
    with dg.DagsterInstance.from_config(_home(tmp_path)) as inst:
        runs = [_run(inst, p) for p in ("a", "b", "a")]
        assert all(inst.get_run_by_id(r).status == dg.DagsterRunStatus.SUCCESS for r in runs)
        mats = inst.fetch_materializations(dg.AssetKey("thing"), limit=10).records
        assert sorted(m.partition_key for m in mats) == ["a", "a", "b"]
        assert {m.run_id for m in mats} == set(runs)
        logs = inst.all_logs(runs[2])
        assert [e.dagster_event_type for e in logs if e.is_dagster_event][-1] == dg.DagsterEventType.RUN_SUCCESS
        check = inst.event_log_storage.get_latest_asset_check_execution_by_key(
            [dg.AssetCheckKey(dg.AssetKey("thing"), "thing_ok")])
        assert list(check.values())[0].run_id == runs[2]
    # one engine per database: the index and each run's own, however many events each stored
    assert sum(u.endswith("index.db") for u in made) == 1, made
    assert len(made) == 1 + len(runs), made


def test_kept_connections_sync_at_checkpoints_only_in_wal_mode(tmp_path):
    """Dagster makes each event database in WAL mode; the kept connections commit with synchronous=NORMAL (1) there,
    and a database in rollback-journal mode keeps SQLite's default (FULL, 2), where NORMAL risks the file."""
    with dg.DagsterInstance.from_config(_home(tmp_path)) as inst:
        run = _run(inst, "a")
        storage = inst.event_log_storage
        for shard in ("index", run):
            with storage.engine_for(shard).connect() as conn:
                assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
                assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 1, shard
    legacy = tmp_path / "legacy.db"
    engine = li._engine(f"sqlite:///{legacy}")
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "delete"
        assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == 2
    engine.dispose()


def test_at_most_keep_engines_stay_open(tmp_path):
    with dg.DagsterInstance.from_config(_home(tmp_path)) as inst:
        runs = [_run(inst, "abc"[i % 3]) for i in range(li.KEEP_ENGINES + 3)]
        kept = inst.event_log_storage.kept_shards()
        assert len(kept) == li.KEEP_ENGINES
        assert runs[0] not in kept and runs[-1] in kept  # least recently used out first
        assert len(inst.all_logs(runs[0])) > 5  # a dropped engine opens again


def test_a_run_database_deleted_under_the_storage_is_created_again(tmp_path):
    with dg.DagsterInstance.from_config(_home(tmp_path)) as inst:
        storage = inst.event_log_storage
        run_id = _run(inst)
        path = storage.path_for_shard(run_id)
        for suffix in ("", "-wal", "-shm"):
            if os.path.exists(path + suffix):
                os.unlink(path + suffix)
        assert inst.all_logs(run_id) == []  # a fresh, empty database (what Dagster's own storage does)
        inst.report_engine_event("after the delete", inst.get_run_by_id(run_id))
        assert [e.message for e in inst.all_logs(run_id)] == ["after the delete"]


def _child_reports(home: str, run_id: str) -> None:
    with dg.DagsterInstance.from_config(home) as inst:
        inst.report_engine_event("from the child", inst.get_run_by_id(run_id))


def _forked_child_reports(holder, run_id: str) -> None:
    inst = holder[0]
    storage = inst.event_log_storage
    inherited = [engine for engine, _ in storage._engines.by_shard.values()]  # held: no id is reused
    assert inherited  # the parent's engines came along with the fork
    inst.report_engine_event("from the forked child", inst.get_run_by_id(run_id))
    used = [engine for engine, _ in storage._engines.by_shard.values()]
    if any(u is i for u in used for i in inherited) or storage._engines.pid != os.getpid():
        os._exit(3)  # SQLite connections must not cross a fork


def test_another_process_and_a_forked_child_write_beside_the_kept_engines(tmp_path):
    home = _home(tmp_path)
    with dg.DagsterInstance.from_config(home) as inst:
        run_id = _run(inst)
        spawned = multiprocessing.get_context("spawn").Process(target=_child_reports, args=(home, run_id))
        spawned.start()
        spawned.join(120)
        assert spawned.exitcode == 0
        # the child inherits this instance, kept engines included, and must not use them
        forked = multiprocessing.get_context("fork").Process(target=_forked_child_reports, args=([inst], run_id))
        forked.start()
        forked.join(120)
        assert forked.exitcode == 0
        inst.report_engine_event("from the parent", inst.get_run_by_id(run_id))
        messages = [e.message for e in inst.all_logs(run_id)]
        assert messages[-3:] == ["from the child", "from the forked child", "from the parent"]


@contextmanager
def _watching(storage, run_id: str, message: str) -> Iterator[threading.Event]:
    """Watch run `run_id` from its current end, as the UI's run page does; the event is set when
    an event with `message` arrives."""
    seen = threading.Event()

    def on_event(entry, _cursor):
        if entry.message == message:
            seen.set()

    storage.watch(run_id, str(storage.get_records_for_run(run_id).cursor), on_event)
    try:
        yield seen
    finally:
        storage.end_watch(run_id, on_event)


def _writer_stays(home: str, run_id: str, wrote, done) -> None:
    with dg.DagsterInstance.from_config(home) as inst:
        inst.report_engine_event("live", inst.get_run_by_id(run_id))
        wrote.set()
        done.wait(60)  # keeps its engine (and connection) open meanwhile, as a running run does


def test_the_ui_sees_a_running_runs_events_while_the_writer_keeps_its_connection(tmp_path):
    """The UI's run page follows a running run; its writer never closes its connection."""
    home = _home(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    wrote, done = ctx.Event(), ctx.Event()
    with dg.DagsterInstance.from_config(home) as inst:
        run_id = _run(inst)
        writer = ctx.Process(target=_writer_stays, args=(home, run_id, wrote, done))
        with _watching(inst.event_log_storage, run_id, "live") as seen:
            writer.start()
            try:
                assert wrote.wait(120)
                assert seen.wait(15), "the watcher never saw the event while its writer was running"
                assert writer.is_alive()
            finally:
                done.set()
                writer.join(60)
        assert writer.exitcode == 0


def test_wipe_then_new_runs(tmp_path):
    with dg.DagsterInstance.from_config(_home(tmp_path)) as inst:
        _run(inst)
        inst.wipe()
        assert inst.get_runs_count() == 0
        assert inst.fetch_materializations(dg.AssetKey("thing"), limit=10).records == []
        run_id = _run(inst, "c")
        [mat] = inst.fetch_materializations(dg.AssetKey("thing"), limit=10).records
        assert (mat.run_id, mat.partition_key) == (run_id, "c")


def _writer_last_event(home: str, run_id: str, go, wrote) -> None:
    with dg.DagsterInstance.from_config(home) as inst:
        go.wait(60)
        inst.report_engine_event("last", inst.get_run_by_id(run_id))
        wrote.set()


def test_the_ui_sees_a_runs_last_event_written_while_another_reader_holds_a_snapshot(tmp_path):
    """The review's race: a read in progress elsewhere (the daemon, another page) when a run
    writes its last event. A file watch depends on a checkpoint that such a reader blocks."""
    home = _home(tmp_path)
    ctx = multiprocessing.get_context("spawn")
    go, wrote = ctx.Event(), ctx.Event()
    with dg.DagsterInstance.from_config(home) as inst:
        run_id = _run(inst)
        storage = inst.event_log_storage
        writer = ctx.Process(target=_writer_last_event, args=(home, run_id, go, wrote))
        with _watching(storage, run_id, "last") as seen:
            writer.start()
            try:
                reader = sqlite3.connect(storage.path_for_shard(run_id))
                reading = reader.execute("SELECT id FROM event_logs")
                reading.fetchone()  # a read in progress: its snapshot pins the write-ahead log
                go.set()
                assert wrote.wait(120)
                writer.join(60)
                reading.close()
                reader.close()
                assert seen.wait(20), "the run's last event never reached the watcher"
            finally:
                go.set()
                writer.join(60)
        assert writer.exitcode == 0


def _write_and_exit(home: str) -> None:
    inst = dg.DagsterInstance.from_config(home)  # never disposed: the process just ends
    _run(inst, "b")


def test_no_connection_outlives_its_instance_or_process(tmp_path):
    home = _home(tmp_path)
    runs_dir = Path(home) / "history" / "runs"
    with dg.DagsterInstance.from_config(home) as inst:
        _run(inst)
        assert inst.event_log_storage.kept_shards()
        assert list(runs_dir.glob("*.db-wal"))  # open connections: SQLite's write-ahead logs exist
    assert inst.event_log_storage.kept_shards() == []
    assert not list(runs_dir.glob("*.db-wal")) and not list(runs_dir.glob("*.db-shm"))
    child = multiprocessing.get_context("spawn").Process(target=_write_and_exit, args=(home,))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    assert not list(runs_dir.glob("*.db-wal")) and not list(runs_dir.glob("*.db-shm"))
    with dg.DagsterInstance.from_config(home) as inst:
        assert inst.get_runs_count() == 2
        _run(inst, "c")
        inst.wipe()  # closes every engine before it deletes the run databases (then clears the index)
        assert inst.event_log_storage.kept_shards() == ["index"]


def test_an_explicit_storage_section_replaces_the_kept_engines(tmp_path):
    home = Path(_home(tmp_path))
    other = tmp_path / "sqlite_storage"
    text = (home / "dagster.yaml").read_text()
    (home / "dagster.yaml").write_text(text + f"\nstorage:\n  sqlite:\n    base_dir: {other}\n")
    with dg.DagsterInstance.from_config(str(home)) as inst:
        assert isinstance(inst, li.LaminarInstance)
        assert type(inst.event_log_storage) is SqliteEventLogStorage
        run_id = _run(inst)
    assert (other / "history" / "runs" / f"{run_id}.db").exists()


def test_a_home_written_by_dagsters_own_storage_keeps_its_history(tmp_path):
    home = _home(tmp_path, stock=True)
    with dg.DagsterInstance.from_config(home) as inst:
        assert type(inst) is dg.DagsterInstance
        before = _run(inst, "b")
    shutil.copy(REPO / "dagster.yaml", Path(home) / "dagster.yaml")
    with dg.DagsterInstance.from_config(home) as inst:
        assert isinstance(inst, li.LaminarInstance)
        after = _run(inst, "c")
        mats = inst.fetch_materializations(dg.AssetKey("thing"), limit=10).records
        assert sorted((m.run_id, m.partition_key) for m in mats) == sorted([(before, "b"), (after, "c")])
        assert inst.get_run_by_id(before).status == dg.DagsterRunStatus.SUCCESS


@pytest.mark.parametrize("name", ["dagster.yaml", "dagster.postgres.yaml"])
def test_both_templates_name_the_instance_class(name):
    import yaml

    config = yaml.safe_load((REPO / name).read_text())
    assert config["instance_class"] == {"module": "laminar_assets.orchestration.internals.instance", "class": "LaminarInstance"}


def test_the_daemons_look_at_sensors_every_quarter_second_and_at_the_run_queue_every_half_second(tmp_path):
    """Both loops are Dagster's private settings (`dagster._daemon`): a Dagster release that renames or moves them
    fails here, not silently back to 5 s loops."""
    import dagster._daemon.sensor as sensor_daemon
    from dagster._daemon.controller import create_daemon_of_type
    from dagster._daemon.run_coordinator.queued_run_coordinator_daemon import QueuedRunCoordinatorDaemon

    with dg.DagsterInstance.from_config(_home(tmp_path)) as inst:
        assert isinstance(inst, li.LaminarInstance)
        assert sensor_daemon.MIN_INTERVAL_LOOP_TIME == li.SENSOR_LOOP_SECONDS == 0.25
        assert inst.run_coordinator.dequeue_interval_seconds == li.QUEUE_LOOP_SECONDS == 0.5  # dagster.yaml says 1
        daemon = create_daemon_of_type(QueuedRunCoordinatorDaemon.daemon_type(), inst)
        assert daemon.interval_seconds == 0.5
