"""Shared fixtures: one SparkSession per test process, and factories that write real Delta tables."""

from __future__ import annotations

import os
from collections import defaultdict
from datetime import UTC, datetime

import dagster as dg
import pandas as pd
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_assets import storage
from laminar_assets.engine import Engine, SparkOptions, build_session
from laminar_assets.engine.delta import is_delta_table, open_delta
from laminar_assets.resources import LaminarResource, SparkResource

TRADE_COLUMNS = ["ts", "sym", "px", "qty"]

# The test files that take longest (seconds in CI, see "slowest files" at the end of a run), longest
# first. `make test` hands whole files to two processes in collection order, so these go first: a
# ten-minute file started last would leave one process idle while the other finishes it.
SLOWEST_FILES = (
    "tests/engine/test_stateful.py",
    "tests/deploy/test_daemon_e2e.py",
    "tests/deploy/test_cluster.py",
    "tests/engine/test_crash_safety.py",
    "tests/engine/test_differential.py",
    "tests/engine/test_stateful_s3.py",
    "tests/engine/delta/test_delta_spark_producers.py",
    "tests/engine/aggregates/test_aggregates.py",
    "tests/cli/test_cli.py",
    "tests/deploy/test_class_archive_writer.py",
    "tests/engine/test_stateful_stages.py",
    "tests/engine/test_stages.py",
    "tests/orchestration/test_component.py",
    "tests/deploy/test_connect.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


_seconds_by_file: dict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report):
    _seconds_by_file[report.nodeid.split("::")[0]] += report.duration


def pytest_terminal_summary(terminalreporter):
    if not _seconds_by_file:
        return
    terminalreporter.section("slowest files")
    for path, seconds in sorted(_seconds_by_file.items(), key=lambda kv: -kv[1])[:20]:
        terminalreporter.write_line(f"{seconds:8.1f}s {path}")


@pytest.fixture(scope="session")
def spark():
    # tests/deploy/test_cluster.py runs engine tests against a standalone cluster through this variable
    master = os.environ.get("LAMINAR_TEST_SPARK_MASTER", "local[2]")
    session = build_session(SparkOptions(master=master, shuffle_partitions=2, driver_memory="2g"))
    yield session
    session.stop()


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def trades_frame(rows) -> pd.DataFrame:
    """rows: (ts, sym, px, qty) tuples; ts as ISO text (None for a missing event time)."""
    df = pd.DataFrame(list(rows), columns=TRADE_COLUMNS)
    df["ts"] = pd.to_datetime(df["ts"], utc=True).astype("datetime64[us, UTC]")
    df["sym"] = df["sym"].astype("string")
    df["px"] = df["px"].astype("float64")
    df["qty"] = df["qty"].astype("Int64")
    return df


class Lake:
    """A storage root in tmp_path with helpers that commit to real Delta tables."""

    def __init__(self, root: str) -> None:
        self.root = root

    def path(self, name: str) -> str:
        return storage.join(self.root, name)

    def create(self, name: str, rows=(), *, cdf: bool = True, frame: pd.DataFrame | None = None, **config) -> None:
        configuration = {"delta.enableChangeDataFeed": "true" if cdf else "false", **config}
        data = frame if frame is not None else trades_frame(rows)
        write_deltalake(self.path(name), data, configuration=configuration,
                        storage_options=storage.delta_options(self.path(name)))

    def append(self, name: str, rows=(), *, frame: pd.DataFrame | None = None) -> None:
        write_deltalake(self.path(name), frame if frame is not None else trades_frame(rows), mode="append",
                        storage_options=storage.delta_options(self.path(name)))

    def table(self, name: str) -> DeltaTable:
        return open_delta(self.path(name))

    def delete(self, name: str, predicate: str) -> None:
        self.table(name).delete(predicate)

    def update(self, name: str, updates: dict, predicate: str) -> None:
        self.table(name).update(updates=updates, predicate=predicate)

    def compact(self, name: str) -> None:
        self.table(name).optimize.compact()

    def table_exists(self, name: str) -> bool:
        return is_delta_table(self.path(name))

    def read(self, name: str) -> pd.DataFrame:
        return self.table(name).to_pandas()


@pytest.fixture
def lake(tmp_path) -> Lake:
    return Lake(str(tmp_path / "lake"))


@pytest.fixture
def engine(spark, lake) -> Engine:
    return Engine(spark, lake.root)


@pytest.fixture
def instance(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as inst:
        yield inst


@pytest.fixture
def laminar(lake) -> LaminarResource:
    # stop_at_end=False: reuse the test session's SparkSession instead of one per run.
    return LaminarResource(root=lake.root, spark=SparkResource(master="local[2]", shuffle_partitions=2,
                                                               stop_at_end=False))


@pytest.fixture(scope="session")
def s3_server():
    """One local S3 server (moto) for the test process: started when a test first needs it."""
    from tests.object_store import start_moto

    server = start_moto()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def s3proxy_server():
    """A local S3 server with honest conditional writes (s3proxy), for tests that race writers."""
    from tests.object_store import start_s3proxy

    server = start_s3proxy()
    yield server
    server.stop()


@pytest.fixture
def s3_lake(s3_server, tmp_path) -> Lake:
    """A lake in a new bucket of the local S3 server (this process reaches it while the test runs)."""
    from tests.object_store import using

    with using(s3_server):
        yield Lake(s3_server.bucket())



@pytest.fixture(scope="session")
def pg_server():
    """One PostgreSQL server for the test process (tests/postgres.py: a Unix socket, no TCP port), started when a
    test first needs it and stopped at the end, also on failure."""
    from tests.postgres import start_postgres

    server = start_postgres()
    yield server
    server.stop()


@pytest.fixture
def pg_database(pg_server) -> str:
    """A database of its own on the session's server (its name), dropped after the test."""
    with pg_server.database() as name:
        yield name


@pytest.fixture
def webhook_receiver():
    """A real HTTP receiver on 127.0.0.1 (tests/engine/export/receiver.py): records what it gets, answers as told
    (a status, a hang, a dropped connection, down); stopped at the end, also on failure."""
    from tests.engine.export.receiver import Receiver

    receiver = Receiver()
    try:
        yield receiver
    finally:
        receiver.stop()


@pytest.fixture(scope="session")
def redis_server():
    """One Redis server for the test process (tests/redis_server.py: Debian's redis-server on 127.0.0.1), started
    when a test first needs it and stopped at the end, also on failure."""
    from tests.redis_server import start_redis

    server = start_redis()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server) -> str:
    """The URL of the session's Redis server, emptied for this test (its keys and the users tests add)."""
    client = redis_server.client()
    client.flushall()
    for user in client.acl_users():
        if user != "default":
            client.acl_deluser(user)
    client.close()
    return redis_server.url()
