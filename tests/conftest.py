"""Shared fixtures: one SparkSession per test process, and factories that write real Delta tables."""

from __future__ import annotations

import os
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
# first. `make test` hands whole files to its processes in collection order, so these go first: a
# ten-minute file started last would leave the other processes idle while one finishes it.
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


# `make test-quick`: besides every test that needs neither Spark nor a server (`make test-fast`), one
# representative of each area that does, so a developer runs it between two changes (docs/testing.md).
# tests/test_tiers.py fails when one of these no longer names a test.
QUICK = (
    "tests/engine/test_reasons.py::test_delete_on_non_retractable_flow_refills_only_touched_windows",
    "tests/engine/test_differential.py::test_fixed_history_exercises_every_path[tiny-pass-path]",
    "tests/engine/test_crash_safety.py::test_crash_during_incremental_run[after_state_commit-local-retracting]",
    "tests/engine/test_stateful.py::test_random_histories_keep_every_invariant[shard-0]",
    "tests/engine/test_stages.py::test_stage_incremental_appends_dedup_and_downstream_flow[driver-writes]",
    "tests/engine/test_one_pass.py::test_a_flow_run_costs_the_same_few_jobs_however_many_partitions_change",
    "tests/engine/aggregates/test_aggregates.py::test_empty_state_is_the_identity",
    "tests/engine/quarantine/test_quarantine.py::test_each_broken_row_is_quarantined_once_with_rule_version_and_row[spark-writes]",
    "tests/engine/sql/test_sql_flows.py::test_refill_only_query_recomputes_exactly_the_touched_windows",
    "tests/engine/report/test_system_tables.py::test_runs_from_commit_history",
    "tests/engine/test_object_store.py::test_a_lake_in_a_bucket_runs_incrementally_and_equals_a_recompute",
    "tests/orchestration/test_assets.py::test_partition_range_runs_in_one_run",
    "tests/orchestration/test_checks.py::test_checks_pass_then_fail_on_a_corrupted_sink_row",
    "tests/contracts/test_expectations.py::test_engines_agree_on_failures",
    "tests/cli/test_sql_command.py::test_query_a_sink",
    "tests/deploy/test_connect.py::test_an_unreachable_endpoint_fails_fast_and_clearly",
)


def pytest_collection_modifyitems(config, items):
    quick = set(QUICK)
    for item in items:
        if item.nodeid in quick:
            item.add_marker(pytest.mark.quick)
    rank = {path: i for i, path in enumerate(SLOWEST_FILES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable: the rest keep their order


SHARD = "[shard-"  # the id of a test parametrized by `shards()`: each shard is a scope of its own

# Files whose tests use a session-scoped server that is dear to start, by that fixture: `make test` hands
# each group to one test process as one unit, so one process starts the server, not one per file (a Connect
# server costs about 20 CPU s to start and warm up). tests/test_tiers.py keeps the lists complete.
SHARED_SERVERS = {
    "connect_server": ("tests/engine/test_crash_safety.py", "tests/deploy/test_connect.py",
                       "tests/engine/test_object_store.py"),
}
_GROUP_OF = {path: fixture for fixture, paths in SHARED_SERVERS.items() for path in paths}


def shards(count: int):
    """Parametrize a long test into `count` shards (`shard` = 0..count-1) that `make test` hands to the
    test processes one by one, where a file's other tests stay together (`pytest_xdist_make_scheduler`)."""
    return pytest.mark.parametrize("shard", range(count), ids=[f"shard-{i}" for i in range(count)])


def shard_size(total: int, count: int, shard: int) -> int:
    """How many of `total` examples shard `shard` of `count` runs, so that the shards run `total` together."""
    return total // count + (shard < total % count)


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, except that each shard of a sharded test is a unit of its own (the random
    stateful test's histories would otherwise keep one process busy for a quarter of an hour), and
    the files sharing a dear server (`SHARED_SERVERS`) are one unit, placed where the first of them is."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class FileOrShardScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if SHARD in nodeid:
                return nodeid
            path = super()._split_scope(nodeid)
            return _GROUP_OF.get(path, path)

    return FileOrShardScheduling(config, log)


def pytest_configure(config):
    from tests import timing

    config.pluginmanager.register(timing, "laminar-timing")  # per-file wall and CPU seconds (tests/timing.py)
    # The processes tests start (the CLI, `dg`, Dagster's run workers) build their Spark from
    # LAMINAR_SPARK_* (SparkOptions.from_env): C1 only for their JVMs too, as for the session below
    os.environ.setdefault("LAMINAR_SPARK_JIT", "quick")


@pytest.fixture(autouse=True)
def _local_copies_per_test(tmp_path_factory, monkeypatch):
    """Each test keeps its own local copies of Delta logs (`storage.copies`): a test's request counts never depend
    on what another test read, and no test writes to the user's cache folder. The processes a test starts inherit
    the setting."""
    monkeypatch.setenv("LAMINAR_CACHE_DIR", str(tmp_path_factory.mktemp("copies")))


# The serial collector in the tests' JVMs (the session, the shared Connect server): on two cores and a
# heap of 1-2 GB, G1's concurrent threads cost CPU the tests' small queries never earn back; measured on
# tests/engine/test_reasons.py alone, alternating runs on a loaded machine: 33-40 CPU s with G1, 29-35
# with the serial collector (docs/testing.md).
TEST_JAVA_OPTIONS = "-XX:+UseSerialGC"


@pytest.fixture(scope="session")
def spark(tmp_path_factory):
    # tests/deploy/test_cluster.py runs engine tests against a standalone cluster through this variable
    master = os.environ.get("LAMINAR_TEST_SPARK_MASTER", "local[2]")
    # C1 only ("quick"): the tests' queries run on tiny tables, and C2 compiling Spark's lukewarm planner
    # code was a fifth of the suite's CPU (docs/testing.md); LAMINAR_SPARK_JIT=tiered measures the default
    session = build_session(SparkOptions(master=master, shuffle_partitions=2, driver_memory="2g",
                                         jit=os.environ.get("LAMINAR_SPARK_JIT", "quick"),
                                         java_options=TEST_JAVA_OPTIONS,
                                         # a Hive metastore of the process's own (embedded Derby), opened only
                                         # when a test first uses the catalog (tests/engine/catalog)
                                         metastore=str(tmp_path_factory.mktemp("metastore"))))
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
def connect_server(tmp_path_factory):
    """One Spark Connect server for the test process, started when a test first needs it and shared by
    every test that does: the deployment's engine paths (tests/deploy/test_connect.py) and the child
    processes that are killed or race mid-run (a Connect client is up in a second or two; a JVM of its
    own took them ~15 s each). Its s3a holds the local S3 servers' keys (tests/object_store.py) from
    its environment; each session sets the endpoint of the lake it uses (`use_object_store`)."""
    from laminar_assets.deploy import ConnectServerOptions, start_connect_server
    from laminar_assets.deploy.local_s3 import KEY, SECRET
    from laminar_assets.engine import SparkOptions
    from laminar_assets.storage import ObjectStoreOptions
    from tests.deploy.processes import free_port, listening

    logs = tmp_path_factory.mktemp("connect")
    options = ConnectServerOptions(port=free_port(), log_path=str(logs / "connect.log"),
                                   spark=SparkOptions(driver_memory="1g", shuffle_partitions=2,
                                                      jit=os.environ.get("LAMINAR_SPARK_JIT", "quick"),
                                                      java_options=TEST_JAVA_OPTIONS))
    with storage.mounted("s3://", ObjectStoreOptions(region="us-east-1", access_key_id=KEY, secret_access_key=SECRET,
                                                     path_style=True)):
        server = start_connect_server(options)
    with server:
        yield server
    assert not listening(options.port), "the Connect server still listens after stop()"


@pytest.fixture(scope="session")
def s3_server():
    """One local S3 server (moto) for the test process: started when a test first needs it."""
    from tests.object_store import start_moto

    server = start_moto()
    yield server
    server.stop()


@pytest.fixture
def second_s3_server():
    """A second local S3 server (moto) for a test that needs two stores: another endpoint, its own buckets."""
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


@pytest.fixture(scope="session")
def gcs_server():
    """A local GCS emulator (fake-gcs-server, tests/gcs_server.py) for the test process."""
    from tests.gcs_server import start_fake_gcs

    server = start_fake_gcs()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def azurite_server(tmp_path_factory):
    """One Azurite (Azure's blob emulator, `make test-azurite`) for the test process, on 127.0.0.1, in memory:
    started when a test first needs it, stopped at the end, also on failure."""
    from laminar_assets.deploy.azurite import Azurite

    server = Azurite(log=str(tmp_path_factory.mktemp("azurite") / "azurite.log")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def azure_lake(azurite_server) -> Lake:
    """A lake in a new container of Azurite, its store mounted at the lake's root while the test runs."""
    root = azurite_server.container()
    with storage.mounted(root, azurite_server.options):
        yield Lake(root)


@pytest.fixture
def s3_lake(s3_server, tmp_path) -> Lake:
    """A lake in a new bucket of the local S3 server (this process reaches it while the test runs)."""
    from tests.object_store import using

    with using(s3_server):
        yield Lake(s3_server.bucket())


@pytest.fixture
def gcs_lake(gcs_server) -> Lake:
    """A lake in a new bucket of the GCS emulator (this process reaches it while the test runs)."""
    from tests.gcs_server import using_gcs

    with using_gcs(gcs_server):
        yield Lake(gcs_server.bucket())



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
