"""Delivering a flow's or stage's Delta table to a real Postgres (the session's pgserver, tests/postgres.py): after
appends, late rows, updates, deletes and refills the table equals the Delta table; full resyncs say why; a
backfill replaces exactly its partitions' rows; a target that does not match, a server that is down, a wrong
password and a missing permission are one line each and leave nothing partial. No Spark."""

from __future__ import annotations

import logging
import shutil
import socket

import psycopg
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from laminar_assets.engine import (
    ConcurrentDeliveryError,
    Connection,
    Exporter,
    ExportSchemaError,
    ExportTargetError,
    PostgresExport,
)
from laminar_assets.engine.export import load_record
from laminar_assets.errors import InjectedCrash
from tests.engine.export.helpers import (
    CDF,
    EXPORT,
    FLOW,
    STAGE,
    Sink,
    crash_at,
    delivered_version,
    execute,
    exporter,
    flow_rows,
    minute,
    target_rows,
)
from tests.postgres import PASSWORD, PASSWORD_ROLE

H0, H1 = "2024-01-02-00:00", "2024-01-02-01:00"


def deliver(ex: Exporter, **kw):
    return ex.deliver(EXPORT, FLOW, **kw)


def test_the_target_equals_the_sink_after_appends_late_rows_updates_deletes_and_refills(tmp_path, pg_server, pg_database):
    root = str(tmp_path / "lake")
    sink, ex = Sink(root, "m1"), exporter(root, pg_server, pg_database)

    def step(expected_mode: str, expected_reason: str):
        result = deliver(ex)
        assert (result.mode.value, result.reason.value) == (expected_mode, expected_reason), result.detail
        assert target_rows(pg_server, pg_database) == sink.rows(), result.to_json()
        assert delivered_version(pg_server, pg_database) == sink.version() == result.delivered_version
        return result

    assert deliver(ex).reason.value == "SOURCE_NOT_WRITTEN"  # the flow has not run yet: nothing to do
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 10.0), (0, 0, "b", 2, 5.0), (0, 1, "a", 1, 3.5)]))
    first = step("FULL", "NO_DELIVERED_VERSION")
    assert first.rows_upserted == 3 and first.lag_versions == 0
    # a new partition (an append), streamed in batches of 3 rows
    sink.replace_hour(1, flow_rows([(1, m, s, m + 1, float(m)) for m in range(4) for s in "ab"]))
    assert step("INCREMENTAL", "NEW_VERSIONS").rows_upserted == 8
    # late rows: partition 0 recomputed with one window more and one value changed; unchanged rows stay as they are
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 10.0), (0, 0, "b", 3, 7.5), (0, 1, "a", 1, 3.5), (0, 7, "c", 1, 1.0)]))
    late = step("INCREMENTAL", "NEW_VERSIONS")
    assert (late.rows_upserted, late.rows_deleted) == (2, 0)
    # an update and a delete with change data, delivered together
    sink.table().update(updates={"n": "n + 100"}, predicate="sym = 'a'")
    sink.table().delete("sym = 'c'")
    both = step("INCREMENTAL", "NEW_VERSIONS")
    assert both.rows_deleted == 1 and both.from_version == late.delivered_version
    # a refill that drops windows and changes others; then every file rewritten without change data
    sink.replace_hour(1, flow_rows([(1, 0, "a", 9, 9.0), (1, 2, "b", 3, 2.0)]))
    assert step("INCREMENTAL", "NEW_VERSIONS").rows_deleted == 6
    sink.rewrite(flow_rows([(0, 0, "a", 1, 10.0), (1, 5, "z", 1, 1.0)]))
    step("INCREMENTAL", "NEW_VERSIONS")
    step("NOOP", "UP_TO_DATE")
    record = load_record(root, "m1_pg")
    assert record.delivered_version == sink.version() and record.failed is None and record.mode == "INCREMENTAL"


def test_a_stage_is_delivered_by_its_dedup_key_and_event_time(tmp_path, pg_server, pg_database):
    """A stage keeps one row per dedup key and partition: the same key in two partitions is two rows."""
    root = str(tmp_path / "lake")
    export = PostgresExport(name="st_pg", source="st", connection="pg")
    rows = pa.table({"id": [1, 2, 1], "ts": pa.array([minute(0, 1), minute(0, 2), minute(1, 1)], pa.timestamp("us", "UTC")),
                     "px": [1.0, 2.0, 3.0]})
    write_deltalake(f"{root}/st", rows, configuration=CDF)
    ex = exporter(root, pg_server, pg_database)
    ex.deliver(export, STAGE)
    Sink(root, "st").table().update(updates={"px": "px * 10"}, predicate="id = 1")
    Sink(root, "st").table().delete("id = 2")
    result = ex.deliver(export, STAGE)
    assert (result.rows_upserted, result.rows_deleted) == (2, 1)
    assert target_rows(pg_server, pg_database, "st") == Sink(root, "st").rows()
    with psycopg.connect(pg_server.url(pg_database)) as conn:
        key = conn.execute("SELECT array_agg(a.attname::text ORDER BY a.attnum) FROM pg_index i JOIN pg_attribute a "
                           "ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indrelid = 'st'::regclass "
                           "AND i.indisprimary").fetchone()[0]
    assert key == ["id", "ts"]


def test_the_table_is_created_with_types_mapped_from_the_delta_schema(tmp_path, pg_server, pg_database):
    import datetime as dt
    from decimal import Decimal

    root = str(tmp_path / "lake")
    table = pa.table({
        "id": pa.array([1, 2], pa.int64()), "ts": pa.array([minute(0, 1)] * 2, pa.timestamp("us", "UTC")),
        "i": pa.array([1, None], pa.int32()), "sh": pa.array([1, 2], pa.int16()), "by": pa.array([1, 2], pa.int8()),
        "f": pa.array([1.5, float("nan")], pa.float32()), "d": [float("inf"), -0.25], "s": ['a,"b"\nc', ""],
        "dec": pa.array([Decimal("1.23"), None], pa.decimal128(10, 2)), "ok": [True, None],
        "ntz": pa.array([dt.datetime(2024, 1, 2, 3, 4, 5), None], pa.timestamp("us")),
        "day": pa.array([dt.date(2024, 1, 2), None]), "raw": pa.array([b"\x00\xff", None]),
        "tags": pa.array([["x", "y"], None]), "obj": pa.array([{"k": 1, "at": "q"}, None]),
        "m": pa.array([[("u", 1)], None], pa.map_(pa.string(), pa.int64())),
    })
    write_deltalake(f"{root}/st", table, configuration=CDF)
    exporter(root, pg_server, pg_database).deliver(PostgresExport(name="st_pg", source="st", connection="pg"), STAGE)
    with psycopg.connect(pg_server.url(pg_database)) as conn:
        types = dict(conn.execute("SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute WHERE attrelid = "
                                  "'st'::regclass AND attnum > 0").fetchall())
        values = conn.execute("SELECT s, f::text, d, dec, ok, ntz, day, raw, tags, obj, m, i FROM st ORDER BY id").fetchall()
    assert types == {"id": "bigint", "ts": "timestamp with time zone", "i": "integer", "sh": "smallint", "by": "smallint",
                     "f": "real", "d": "double precision", "s": "text", "dec": "numeric(10,2)", "ok": "boolean",
                     "ntz": "timestamp without time zone", "day": "date", "raw": "bytea", "tags": "jsonb", "obj": "jsonb",
                     "m": "jsonb"}
    assert values[0] == ('a,"b"\nc', "1.5", float("inf"), Decimal("1.23"), True, dt.datetime(2024, 1, 2, 3, 4, 5),
                         dt.date(2024, 1, 2), b"\x00\xff", ["x", "y"], {"k": 1, "at": "q"}, {"u": 1}, 1)
    assert values[1] == ("", "NaN", -0.25, None, None, None, None, None, None, None, None, None)


def test_full_resyncs_say_why(tmp_path, pg_server, pg_database):
    root = str(tmp_path / "lake")
    sink, ex = Sink(root, "m1"), exporter(root, pg_server, pg_database)
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "b", 2, 2.0)]))
    deliver(ex)
    # the table dropped by someone, or dropped and created again: every row delivered, with no new version too
    for ddl, why in (("DROP TABLE m1", "dropped"), ("DROP TABLE m1; CREATE TABLE m1 (LIKE laminar_exports)", "recreated")):
        execute(pg_server, pg_database, *ddl.split("; "))
        if why == "recreated":  # a table of other columns is refused before writing; one that matches is refilled
            with pytest.raises(ExportSchemaError):
                deliver(ex)
            execute(pg_server, pg_database, "DROP TABLE m1", "CREATE TABLE m1 (window_start timestamptz, window_end "
                    "timestamptz, sym text, n bigint, total double precision, PRIMARY KEY (window_start, sym))")
        result = deliver(ex)
        assert (result.mode.value, result.reason.value) == ("FULL", "TARGET_CHANGED") and why in result.detail
        assert target_rows(pg_server, pg_database) == sink.rows()
    sink.replace_hour(0, flow_rows([(0, 0, "a", 5, 1.0)]))
    assert deliver(ex).reason.value == "NEW_VERSIONS"
    # the files the versions since the delivered one removed, vacuumed away: their deleted rows are unknown
    sink.rewrite(flow_rows([(0, 0, "a", 6, 1.0), (0, 3, "c", 1, 1.0)]))
    sink.rewrite(flow_rows([(0, 3, "c", 2, 1.0)]))
    sink.table().vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    result = deliver(ex)
    assert (result.mode.value, result.reason.value) == ("FULL", "CHANGE_FEED_EXPIRED") and "vacuumed" in result.detail
    assert target_rows(pg_server, pg_database) == sink.rows()
    # the source table recreated at its path (a new Delta id), even at a higher version
    shutil.rmtree(sink.uri)
    for hour in range(5):
        sink.replace_hour(hour, flow_rows([(hour, 9, "q", hour, 0.5)]))
    result = deliver(ex)
    assert (result.mode.value, result.reason.value) == ("FULL", "SOURCE_RECREATED")
    assert target_rows(pg_server, pg_database) == sink.rows()
    assert deliver(ex, full=True).reason.value == "FORCED_BY_USER"


def test_a_backfill_of_a_partition_replaces_exactly_its_rows(tmp_path, pg_server, pg_database):
    root = str(tmp_path / "lake")
    sink, ex = Sink(root, "m1"), exporter(root, pg_server, pg_database)
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "b", 2, 2.0)]))
    sink.replace_hour(1, flow_rows([(1, 0, "a", 3, 3.0)]))
    deliver(ex)
    execute(pg_server, pg_database, "UPDATE m1 SET n = -1",  # someone edits the table
            "INSERT INTO m1 VALUES ('2024-01-02 00:30Z', '2024-01-02 00:31Z', 'stray', 0, 0)")
    result = deliver(ex, partitions=[H0])
    assert (result.mode.value, result.reason.value, result.partitions_replaced) == ("INCREMENTAL", "PARTITIONS_REPLACED",
                                                                                    (H0,))
    got = target_rows(pg_server, pg_database)
    assert [r for r in got if r[0] < minute(1, 0)] == [r for r in sink.rows() if r[0] < minute(1, 0)]
    assert [r[3] for r in got if r[0] >= minute(1, 0)] == [-1]  # partition 1 was not asked for: left as it was
    # new versions and a backfill in one delivery
    sink.replace_hour(1, flow_rows([(1, 0, "a", 4, 3.0), (1, 2, "b", 1, 1.0)]))
    result = deliver(ex, partitions=[H1])
    assert result.reason.value == "NEW_VERSIONS" and target_rows(pg_server, pg_database) == sink.rows()


@pytest.mark.parametrize("ddl, expected", [
    ("CREATE TABLE m1 (window_start timestamptz, window_end timestamptz, sym text, n text, total double precision, "
     "PRIMARY KEY (window_start, sym))", "column 'n' of Postgres table public.m1 is text, expected bigint"),
    ("CREATE TABLE m1 (window_start timestamptz, window_end timestamptz, sym text, n bigint, "
     "PRIMARY KEY (window_start, sym))", "Postgres table public.m1 has no column 'total' (expected double precision)"),
    ("CREATE TABLE m1 (window_start timestamptz, window_end timestamptz, sym text, n bigint, total double precision)",
     "has no primary key or unique index on (window_start, sym)"),
    ("CREATE TABLE m1 (window_start timestamptz, window_end timestamptz, sym text, n bigint, total double precision, "
     "note text NOT NULL, PRIMARY KEY (window_start, sym))", "column 'note' of Postgres table public.m1 (text) is NOT NULL"),
], ids=["type", "missing", "key", "extra-not-null"])
def test_a_target_that_does_not_match_is_refused_before_anything_is_written(tmp_path, pg_server, pg_database, ddl,
                                                                            expected):
    root = str(tmp_path / "lake")
    sink, ex = Sink(root, "m1"), exporter(root, pg_server, pg_database)
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    execute(pg_server, pg_database, ddl)
    with pytest.raises(ExportSchemaError) as info:
        deliver(ex)
    text = str(info.value)
    assert expected in text and "nothing was written" in text and "\n" not in text, text
    assert target_rows(pg_server, pg_database) == [] and delivered_version(pg_server, pg_database) is None
    assert load_record(root, "m1_pg").failed["count"] == 1


def test_an_extra_nullable_column_of_the_target_is_left_alone(tmp_path, pg_server, pg_database):
    root = str(tmp_path / "lake")
    sink, ex = Sink(root, "m1"), exporter(root, pg_server, pg_database)
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    execute(pg_server, pg_database, "CREATE TABLE m1 (window_start timestamptz, window_end timestamptz, sym text, "
            "n bigint, total double precision, loaded_at timestamptz DEFAULT now(), PRIMARY KEY (window_start, sym))")
    deliver(ex)
    assert target_rows(pg_server, pg_database, columns="window_start, window_end, sym, n, total") == sink.rows()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_postgres_down_a_wrong_password_and_a_missing_permission_are_one_line_each(tmp_path, pg_server, pg_database,
                                                                                   monkeypatch, caplog):
    root = str(tmp_path / "lake")
    Sink(root, "m1").replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    port = _free_port()
    cases = {
        "down": (Connection("pg", f"postgresql://etl:s3cret-down@127.0.0.1:{port}/{pg_database}"),
                 f"cannot reach Postgres at host=127.0.0.1 database={pg_database} port={port} as user 'etl' "
                 "(Connection refused)", True),
        "password": (Connection("pg", pg_server.url(pg_database, user=PASSWORD_ROLE, password="s3cret-wrong")),
                     f"refused the credentials of user '{PASSWORD_ROLE}'", False),
        "permission": (Connection("pg", pg_server.url(pg_database, user="laminar_reader")),
                       "Postgres user 'laminar_reader' lacks a permission to write public.m1 (permission denied for "
                       "schema public)", False),
    }
    execute(pg_server, pg_database, "DO $$ BEGIN CREATE ROLE laminar_reader LOGIN; EXCEPTION WHEN duplicate_object "
            "THEN NULL; END $$")
    caplog.set_level(logging.DEBUG)
    for name, (conn, expected, retryable) in cases.items():
        with pytest.raises(ExportTargetError) as info:
            Exporter(root, connections={"pg": conn}).deliver(EXPORT, FLOW)
        text = str(info.value)
        assert expected in text and "\n" not in text and "s3cret" not in text, (name, text)
        assert info.value.retryable is retryable, name
        assert load_record(root, "m1_pg").failed["error"] == info.value.message
    assert load_record(root, "m1_pg").failed["count"] == 3
    assert "s3cret" not in caplog.text and "s3cret" not in open(f"{root}/_laminar/exports/m1_pg.json").read()
    assert delivered_version(pg_server, pg_database) is None
    with psycopg.connect(pg_server.url(pg_database)) as conn:
        assert conn.execute("SELECT to_regclass('public.m1')").fetchone()[0] is None  # nothing partial
    # the right password, kept out of the URL (LAMINAR_CONNECTION_<NAME>_PASSWORD)
    monkeypatch.setenv("LAMINAR_CONNECTION_PG_URL", pg_server.url(pg_database, user=PASSWORD_ROLE))
    monkeypatch.setenv("LAMINAR_CONNECTION_PG_PASSWORD", PASSWORD)
    assert Exporter(root).deliver(EXPORT, FLOW).rows_upserted == 1
    assert load_record(root, "m1_pg").failed is None


def test_a_delivery_whose_version_moved_meanwhile_rolls_back(tmp_path, pg_server, pg_database):
    """Two deliveries read the same delivered version; the one that writes second finds it moved and rolls back,
    so no change is applied twice."""
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    deliver(exporter(root, pg_server, pg_database))
    sink.replace_hour(0, flow_rows([(0, 0, "a", 2, 1.0), (0, 1, "b", 1, 1.0)]))
    other = exporter(root, pg_server, pg_database)

    def race(step: str) -> None:
        if step == "export_before_write":  # this delivery has read its changes: another one delivers them first
            assert deliver(other).reason.value == "NEW_VERSIONS"

    with pytest.raises(ConcurrentDeliveryError) as info:
        deliver(exporter(root, pg_server, pg_database, hook=race))
    assert info.value.retryable and "another delivery moved the delivered version" in str(info.value)
    assert target_rows(pg_server, pg_database) == sink.rows()
    assert delivered_version(pg_server, pg_database) == sink.version()


@pytest.mark.parametrize("checked", [True, False], ids=["found-before-reading", "found-while-reading"])
def test_a_compacted_and_vacuumed_history_is_a_full_resync_not_a_failure_every_time(tmp_path, pg_server, pg_database,
                                                                                     monkeypatch, checked):
    """Files a later compaction replaced and a vacuum deleted: the changes since the delivered version cannot be
    read. Whether the log shows it first or the reader meets the missing file (a vacuum between the two), the
    delivery resyncs every row instead of failing on every run."""
    from laminar_assets.engine.export import changes

    root = str(tmp_path / "lake")
    sink, ex = Sink(root, "m1"), exporter(root, pg_server, pg_database)
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    deliver(ex)
    write_deltalake(sink.uri, flow_rows([(0, 1, "b", 1, 1.0)]), mode="append")
    write_deltalake(sink.uri, flow_rows([(0, 2, "c", 1, 1.0)]), mode="append")
    sink.table().optimize.compact()
    sink.table().vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    if not checked:
        monkeypatch.setattr(changes, "feed_gap", lambda pinned, since: None)
    result = deliver(ex)
    assert (result.mode.value, result.reason.value) == ("FULL", "CHANGE_FEED_EXPIRED"), result.detail
    assert ("was vacuumed" if checked else "names a file that is gone") in result.detail, result.detail
    assert target_rows(pg_server, pg_database) == sink.rows()


def test_a_bad_partition_key_is_refused_before_anything_is_read(tmp_path, pg_server, pg_database):
    from laminar_assets.engine import ExportError

    root = str(tmp_path / "lake")
    Sink(root, "m1").replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    with pytest.raises(ExportError, match=r"export 'm1_pg': bad partition key for 'm1'"):
        deliver(exporter(root, pg_server, pg_database), partitions=["2024-01-02-00:30"])
    assert delivered_version(pg_server, pg_database) is None


def _heap(pg_server, database: str) -> tuple[int, int]:
    """(pages of the table's heap, its file node): the rows a full resync left behind, dead or alive, take pages."""
    with psycopg.connect(pg_server.url(database), autocommit=True) as conn:
        size, node = conn.execute("SELECT pg_relation_size('m1'), pg_relation_filenode('m1')").fetchone()
    return size // 8192, node


def test_a_forced_resync_leaves_no_dead_rows_and_a_crash_in_it_leaves_the_old_rows(tmp_path, pg_server, pg_database):
    """A full resync empties the table with TRUNCATE in its transaction: the table's heap holds the delivered rows
    only (a DELETE left every old row behind as a dead one until a vacuum: twice the pages), and a resync that
    stops after its rows rolls the TRUNCATE back with them."""
    root = str(tmp_path / "lake")
    sink, ex = Sink(root, "m1"), exporter(root, pg_server, pg_database)
    sink.replace_hour(0, flow_rows([(0, m, f"s{k}", k, 0.5) for m in range(60) for k in range(5)]))
    deliver(ex)
    pages, node = _heap(pg_server, pg_database)
    assert pages >= 2
    with pytest.raises(InjectedCrash):
        exporter(root, pg_server, pg_database, hook=crash_at("export_after_rows")).deliver(EXPORT, FLOW, full=True)
    assert target_rows(pg_server, pg_database) == sink.rows() and _heap(pg_server, pg_database)[1] == node
    result = deliver(ex, full=True)
    assert (result.mode.value, result.reason.value, result.rows_deleted, result.rows_upserted) == (
        "FULL", "FORCED_BY_USER", 300, 300)
    assert target_rows(pg_server, pg_database) == sink.rows()
    assert delivered_version(pg_server, pg_database) == sink.version()
    after, new_node = _heap(pg_server, pg_database)
    assert (after, new_node != node) == (pages, True), "the old rows are still in the table's file"


def test_a_forced_resync_deletes_where_truncate_would_wait_for_a_reader_or_fail_on_a_foreign_key(tmp_path, pg_server,
                                                                                                  pg_database, monkeypatch):
    """TRUNCATE waits for every reader of the table and fails when another table references it: a resync that
    meets a reader holding the table (longer than it waits) or a foreign key DELETEs the rows instead."""
    from laminar_assets.engine.export import postgres

    monkeypatch.setattr(postgres, "TRUNCATE_LOCK_SECONDS", 0.2)
    root = str(tmp_path / "lake")
    sink, ex = Sink(root, "m1"), exporter(root, pg_server, pg_database)
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "b", 2, 2.0)]))
    deliver(ex)
    node = _heap(pg_server, pg_database)[1]
    with psycopg.connect(pg_server.url(pg_database)) as reader:  # a report reading the table, its transaction open
        assert reader.execute("SELECT count(*) FROM m1").fetchone()[0] == 2
        sink.table().delete("sym = 'a'")
        result = deliver(ex, full=True)
        assert (result.reason.value, result.rows_deleted, result.rows_upserted) == ("FORCED_BY_USER", 2, 1)
    assert target_rows(pg_server, pg_database) == sink.rows() and _heap(pg_server, pg_database)[1] == node
    execute(pg_server, pg_database, "CREATE TABLE alerts (window_start timestamptz, sym text, FOREIGN KEY "
            "(window_start, sym) REFERENCES m1)")
    sink.replace_hour(0, flow_rows([(0, 3, "c", 1, 1.0)]))
    assert deliver(ex, full=True).rows_upserted == 1
    assert target_rows(pg_server, pg_database) == sink.rows() and _heap(pg_server, pg_database)[1] == node
