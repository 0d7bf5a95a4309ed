"""The Dagster instance of dagster.yaml: Dagster's own SQLite storage, with its event log's database
connections kept between writes.

Dagster's SQLite event log opens a new SQLAlchemy engine and connection for every event it stores
(and for every read), under a lock its threads share, and a Laminar run stores a few hundred
events (steps, materializations, checks, logs): keeping the engines open makes each write several
times cheaper (docs/PERFORMANCE.md). A run page follows new events by polling (`watch`), since
Dagster's SQLite file watch relies on connections closing. Each kept connection to a database in
write-ahead-log mode (Dagster creates them so) commits with `synchronous=NORMAL`: SQLite then syncs
the log to disk at its checkpoints rather than at every commit, a fraction of a millisecond per event
instead of most of one (on a cloud disk, several). The database stays consistent after any crash; an
operating system crash or power loss can lose the last events written before it (a run's step events,
not Laminar's results, which live in the lake's Delta commits and watermarks). Everything else is Dagster's: the same
files in the same places (`<DAGSTER_HOME>/history/runs/*.db`), so a home made
before keeps its history, and an explicit `storage:` section (dagster.postgres.yaml) replaces it.

dagster.yaml names `LaminarInstance` as its `instance_class`: a custom instance class is what
Dagster lets choose the default storage from the instance's own folder (`config_defaults`), so the
files land where that instance's runs are, whatever DAGSTER_HOME says.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import sqlalchemy as sa
import yaml
from dagster import DagsterInstance, QueuedRunCoordinator
from dagster._core.event_api import EventHandlerFn
from dagster._core.instance.ref import InstanceRef
from dagster._core.run_coordinator import RunCoordinator
from dagster._core.storage.event_log.polling_event_watcher import SqlPollingEventWatcher
from dagster._core.storage.event_log.sqlite.sqlite_event_log import SqliteEventLogStorage
from dagster._core.storage.runs import SqliteRunStorage
from dagster._core.storage.schedules import SqliteScheduleStorage
from dagster._core.storage.sqlite_storage import DagsterSqliteStorage
from dagster._serdes import ConfigurableClassData
from sqlalchemy.engine import Connection, Engine

KEEP_ENGINES = 8  # the index and the few runs a process writes or shows at a time
BUSY_TIMEOUT_S = 15  # Dagster's own SQLite busy timeout


class _Engines:
    """The kept engines of one storage, by database, least recently used first, and the process
    that opened them. Closing in another process (a fork) only forgets them: a child never touches
    its parent's SQLite connections."""

    def __init__(self) -> None:
        self.by_shard: OrderedDict[str, tuple[Engine, tuple[int, int] | None]] = OrderedDict()
        self.pid = os.getpid()

    def close(self) -> None:
        mine = os.getpid() == self.pid
        for engine, _ in self.by_shard.values():
            engine.dispose(close=mine)
        self.by_shard.clear()
        self.pid = os.getpid()


class KeptEngineSqliteEventLogStorage(SqliteEventLogStorage):
    """Dagster's `SqliteEventLogStorage`, keeping a SQLAlchemy engine (and its pooled
    connections) per database for the process's life instead of opening one per call.

    At most `KEEP_ENGINES` databases stay open (least recently used first out). A kept engine is
    dropped when its file is no longer the one it opened (deleted, or replaced by another
    process), when the process forked since (a child never uses its parent's SQLite connections),
    and on `wipe` and `dispose`. Calls still take the storage's one lock, as Dagster's do."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        self._engines = _Engines()
        self._engines_lock = threading.Lock()  # dispose/wipe may come from another thread
        self._event_watcher: SqlPollingEventWatcher | None = None
        # close the connections when the process ends too (the last one to close a database
        # folds its write-ahead log back in and removes the -wal and -shm files)
        weakref.finalize(self, self._engines.close)
        super().__init__(base_dir, inst_data=inst_data)

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # noqa: D102 (Dagster's ConfigurableClass)
        return cls(inst_data=inst_data, **config_value)

    @contextmanager
    def _connect(self, shard: str) -> Iterator[Connection]:
        # the same contract as Dagster's: one lock, the database created on first use, one transaction
        with self._db_lock:
            engine = self.engine_for(shard)
            with engine.connect() as conn, conn.begin():
                yield conn

    def watch(self, run_id: str, cursor: str | None, callback: EventHandlerFn) -> None:
        """Follow a run's new events (the UI's live run page) by polling its database, as Dagster's
        Postgres storage does. Dagster's SQLite storage instead watches the run's .db file, which
        changes when SQLite moves its write-ahead log into it: when the last connection closes, or
        at a checkpoint. Kept connections rarely close, and a checkpoint cannot pass a reader's
        open snapshot, so a file watch could miss a run's last events for good."""
        if self._event_watcher is None:
            self._event_watcher = SqlPollingEventWatcher(self)
        self._event_watcher.watch_run(run_id, cursor, callback)

    def end_watch(self, run_id: str, handler: EventHandlerFn) -> None:
        if self._event_watcher is not None:
            self._event_watcher.unwatch_run(run_id, handler)

    def engine_for(self, shard: str) -> Engine:
        """The kept engine of database `shard` (a run id, or the index), opened if needed."""
        with self._engines_lock:
            if os.getpid() != self._engines.pid:  # forked: leave the parent's connections alone
                self._engines.close()
            kept_engines = self._engines.by_shard
            path = self.path_for_shard(shard)
            kept = kept_engines.pop(shard, None)
            found = _identity(path)
            if kept is not None and (found is None or kept[1] != found):
                kept[0].dispose()
                kept = None
            if found is None:  # a new database, or one deleted under us: create its tables again
                self._initialized_dbs.discard(shard)
            engine = kept[0] if kept else _engine(self.conn_string_for_shard(shard))
            if shard not in self._initialized_dbs:
                self._initdb(engine)
                self._initialized_dbs.add(shard)
                engine.dispose()  # a connection made before `_initdb` turned the log on syncs every commit
            kept_engines[shard] = (engine, _identity(path))
            while len(kept_engines) > KEEP_ENGINES:
                _, (old, _) = kept_engines.popitem(last=False)
                old.dispose()
            return engine

    def close_engines(self) -> None:
        """Close every kept connection (they reopen on the next call)."""
        with self._engines_lock:
            self._engines.close()

    def kept_shards(self) -> list[str]:
        """The databases with a kept engine, least recently used first."""
        return list(self._engines.by_shard)

    def wipe(self) -> None:
        with self._db_lock:  # no call is using a connection while the files go
            self.close_engines()
        super().wipe()

    def dispose(self) -> None:
        if self._event_watcher is not None:
            self._event_watcher.close()
            self._event_watcher = None
        super().dispose()
        self.close_engines()


class LaminarSqliteStorage(DagsterSqliteStorage):
    """Dagster's default SQLite storage (runs, events, schedules under one folder), with
    `KeptEngineSqliteEventLogStorage` for its events."""

    def __init__(self, base_dir: str, inst_data: ConfigurableClassData | None = None):
        # DagsterSqliteStorage.__init__ would open a second event log; this is its body with ours
        self.base_dir = base_dir
        self._run_storage = SqliteRunStorage.from_local(os.path.join(base_dir, "history", ""))
        self._event_log_storage = KeptEngineSqliteEventLogStorage(os.path.join(base_dir, "history", "runs", ""))
        self._schedule_storage = SqliteScheduleStorage.from_local(os.path.join(base_dir, "schedules"))
        self._inst_data = inst_data
        super(DagsterSqliteStorage, self).__init__()

    @classmethod
    def from_config_value(cls, inst_data, config_value):  # noqa: D102 (Dagster's ConfigurableClass)
        return cls.from_local(inst_data=inst_data, **config_value)


# Dagster's sensor daemon evaluates its sensors in a loop that sleeps up to 5 s between passes
# (`dagster._daemon.sensor.MIN_INTERVAL_LOOP_TIME`, not configurable), so a commit waited 2.5 s on
# average, 5 s at worst, before a sensor with a 1 s minimum interval even looked. A Laminar instance
# loops every quarter second; each sensor still keeps its own minimum interval. (A loop of one second
# evaluated a 1 s sensor every 1 or 2 s, alternately: a pass that began a few milliseconds less than
# a second after the sensor's last tick found it under its interval and skipped it for a whole loop.)
SENSOR_LOOP_SECONDS = 0.25
# Dagster's run-queue daemon looks at the queue every `dequeue_interval_seconds` (an integer in dagster.yaml, so at
# least 1 s; its loop waits in steps of half a second), so a run a sensor requested sat in the queue 0.5 s on average
# before its launch. A Laminar instance's queue daemon looks every half second, its loop's own step; a larger
# setting in dagster.yaml is lowered to it, a smaller one cannot be written.
QUEUE_LOOP_SECONDS = 0.5


class LaminarInstance(DagsterInstance):
    """A `DagsterInstance` whose default storage is `LaminarSqliteStorage` in the instance's folder,
    and whose daemon evaluates sensors every `SENSOR_LOOP_SECONDS`. Everything else, and any storage
    dagster.yaml configures, is Dagster's."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        import dagster._daemon.sensor as sensor_daemon

        # typed int by Dagster, used as seconds to sleep (`shutdown_event.wait`), which a float is too
        sensor_daemon.MIN_INTERVAL_LOOP_TIME = min(sensor_daemon.MIN_INTERVAL_LOOP_TIME, SENSOR_LOOP_SECONDS)  # type: ignore[assignment]

    @property
    def run_coordinator(self) -> RunCoordinator:  # noqa: D102  (Dagster's, with the queue loop above)
        coordinator = super().run_coordinator
        if isinstance(coordinator, QueuedRunCoordinator) and coordinator.dequeue_interval_seconds > QUEUE_LOOP_SECONDS:
            # private: the daemon reads the interval from this attribute's property (dagster._daemon.controller)
            coordinator._dequeue_interval_seconds = QUEUE_LOOP_SECONDS  # type: ignore[assignment]
        return coordinator

    @classmethod
    def config_schema(cls) -> Mapping:
        return {}

    @staticmethod
    def config_defaults(base_dir: str) -> Mapping[str, ConfigurableClassData | None]:
        defaults = dict(InstanceRef.config_defaults(base_dir))
        defaults["storage"] = ConfigurableClassData(
            __name__, LaminarSqliteStorage.__name__, yaml.dump({"base_dir": base_dir}, default_flow_style=False))
        # the legacy per-storage field, for whatever still reads it: the same event log
        defaults["event_log_storage"] = ConfigurableClassData(
            __name__, KeptEngineSqliteEventLogStorage.__name__,
            yaml.dump({"base_dir": os.path.join(base_dir, "history", "runs", "")}, default_flow_style=False))
        return defaults


def _engine(url: str) -> Engine:
    """An engine whose connections commit with `synchronous=NORMAL` when their database is in WAL mode (the
    module docstring); in the rollback-journal mode that setting could corrupt the file on a power loss, so a
    database in that mode keeps SQLite's default."""
    engine = sa.create_engine(url, connect_args={"timeout": BUSY_TIMEOUT_S})
    sa.event.listen(engine, "connect", _sync_at_checkpoints)
    return engine


def _sync_at_checkpoints(dbapi_connection, _record) -> None:
    cursor = dbapi_connection.cursor()
    try:
        (mode,) = cursor.execute("PRAGMA journal_mode").fetchone()
        if str(mode).lower() == "wal":
            cursor.execute("PRAGMA synchronous=NORMAL")
    finally:
        cursor.close()


def _identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino
