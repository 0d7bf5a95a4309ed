"""`laminar sql` in the engine: lake tables and the laminar_system tables over real Delta tables and runs."""

from __future__ import annotations

from datetime import UTC, datetime

import pandas as pd
import pytest
from deltalake import DeltaTable

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import Agg, DimensionJoin, Engine, FlowSpec, StageSpec, Tumbling
from laminar_assets.engine.report import system_tables as st
from laminar_assets.engine.report.overview import topology
from laminar_assets.errors import LaminarError
from tests.conftest import Lake

pytestmark = pytest.mark.spark

PART = "2024-01-01-00:00"
STAGE = StageSpec(name="norm", source="raw", event_time="ts", dedup_key=("trade_id",),
                  derived={"notional": "px * qty"},
                  joins=(DimensionJoin("symbols", on=("sym",), columns=("sector",)),))
FLOW = FlowSpec(name="sectors", source="norm", event_time="ts", window=Tumbling("10m"), keys=("sector",),
                aggregates=(Agg.count(name="trades"), Agg.sum("notional", name="notional")))
SPECS = [STAGE, FLOW]


def raw(rows) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["trade_id", "ts", "sym", "px", "qty"])
    df["ts"] = pd.to_datetime(df["ts"], utc=True).astype("datetime64[us, UTC]")
    return df.astype({"trade_id": "int64", "px": "float64", "qty": "int64"})


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory):
    """A lake with three runs of each spec: the first (REFILL), an append (INCREMENTAL) and a delete
    (the stage refills and publishes change data; the flow retracts)."""
    lake = Lake(str(tmp_path_factory.mktemp("sql") / "lake"))
    lake.create("raw", frame=raw([(1, "2024-01-01 00:01:00", "AAA", 10.0, 2), (2, "2024-01-01 00:02:00", "BBB", 20.0, 1),
                                  (3, "2024-01-01 00:15:00", "AAA", 11.0, 3)]))
    lake.create("symbols", frame=pd.DataFrame({"sym": ["AAA", "BBB"], "sector": ["tech", "energy"]}))
    engine = Engine(spark, lake.root)
    results = {s.name: [engine.run(s, PART)] for s in SPECS}
    lake.append("raw", frame=raw([(4, "2024-01-01 00:21:00", "BBB", 21.0, 4)]))
    for s in SPECS:
        results[s.name].append(engine.run(s, PART))
    lake.delete("raw", "trade_id = 2")
    for s in SPECS:
        results[s.name].append(engine.run(s, PART))
    return lake, engine, results


def query(built, sql, **kw):
    lake, engine, _ = built
    return st.run_query(engine.spark, lake.root, SPECS, sql, **kw)


def test_sink_and_source_tables_by_name(built):
    lake = built[0]
    got = query(built, "SELECT window_start, sector, trades, notional FROM sectors ORDER BY window_start, sector")
    assert got.columns == ["window_start", "sector", "trades", "notional"]
    want = lake.read("sectors").sort_values(["window_start", "sector"])
    assert [(r[1], r[2], r[3]) for r in got.rows] == list(zip(want["sector"], want["trades"], want["notional"]))
    assert got.rows[0][0] == datetime(2024, 1, 1, 0, 0, tzinfo=UTC)  # UTC instants, not local times
    assert query(built, "SELECT count(*) FROM raw").rows == [(3,)]  # the latest snapshot: the delete applied
    assert query(built, "select SECTOR from SYMBOLS where sym = 'AAA'").rows == [("tech",)]
    assert sorted(r[0] for r in query(built, "SELECT trade_id FROM norm").rows) == [1, 3, 4]


def test_dag_topology(built):
    got = query(built, "SELECT * FROM laminar_system.dag_topology")
    assert got.columns == ["node_id", "operator_type", "inputs", "outputs", "is_shared", "partitioning"]
    assert {r[0]: list(r[1:]) for r in got.rows} == {
        t["node"]: [t["kind"], t["inputs"], t["outputs"], t["is_shared"], t["partitioning"]] for t in topology(SPECS)}
    schema = st.dag_topology(built[1].spark, SPECS).schema
    assert schema["inputs"].dataType.simpleString() == "array<string>"
    assert schema["is_shared"].dataType.simpleString() == "boolean"


def test_partitions(built):
    lake = built[0]
    got = query(built, "SELECT * FROM laminar_system.partitions ORDER BY flow")
    assert got.columns == ["flow", "partition", "source_versions", "seq", "spec_hash", "last_mode", "last_reason",
                           "failed_attempt", "updated_at", "failed_runs", "failing_since", "last_error"]
    rows = [dict(zip(got.columns, r)) for r in got.rows]
    assert [(r["flow"], r["partition"]) for r in rows] == [("norm", PART), ("sectors", PART)]
    for r in rows:
        mark = CheckpointStore(lake.root).load(r["flow"], PART)
        assert r["source_versions"] == mark.source_versions and r["seq"] == mark.seq == 3
        assert (r["spec_hash"], r["last_mode"], r["last_reason"]) == (mark.spec_hash, mark.last_mode, mark.last_reason)
        assert r["failed_attempt"] is None and r["updated_at"] == datetime.fromisoformat(mark.updated_at)
        assert (r["failed_runs"], r["failing_since"], r["last_error"]) == (0, None, None)
    types = dict(st.partitions(built[1].spark, lake.root, SPECS).dtypes)
    assert types["source_versions"] == "map<string,bigint>" and types["updated_at"] == "timestamp"
    assert types["failed_runs"] == "bigint" and types["failing_since"] == "timestamp"


def test_runs_from_commit_history(built):
    lake, _, results = built
    got = query(built, "SELECT * FROM laminar_system.runs ORDER BY flow, table_version")
    assert got.columns == ["run_id", "flow", "partitions", "mode", "reason", "committed_at", "table_version",
                           "rows_read", "rows_rejected", "state_rows", "sink_rows", "recovered"]
    rows = [dict(zip(got.columns, r)) for r in got.rows]
    for name in ("norm", "sectors"):
        mine = [r for r in rows if r["flow"] == name]
        assert [r["run_id"] for r in mine] == [x.run_id for x in results[name]]
        assert [(r["mode"], r["reason"]) for r in mine] == [(x.mode.value, x.reason.value) for x in results[name]]
        assert [r["rows_read"] for r in mine] == [x.metrics["rows_read"] for x in results[name]]
        assert [r["sink_rows"] for r in mine] == [x.metrics["sink_rows"] for x in results[name]]
        history = {c["version"]: c for c in DeltaTable(lake.path(name)).history()}
        for r in mine:
            assert r["partitions"] == [PART] and r["rows_rejected"] == 0 and r["recovered"] is False
            assert history[r["table_version"]]["laminar.run_id"] == r["run_id"]
            assert r["committed_at"].tzinfo is not None
    assert [r["mode"] for r in rows if r["flow"] == "sectors"] == ["REFILL", "INCREMENTAL", "INCREMENTAL"]
    assert [r["reason"] for r in rows if r["flow"] == "norm"][2] != "APPEND_ONLY"  # the delete: change-data commit
    assert [r["state_rows"] for r in rows if r["flow"] == "sectors"] == \
        [x.metrics["state_rows"] for x in results["sectors"]]
    assert all(r["state_rows"] is None for r in rows if r["flow"] == "norm")  # a stage keeps no state


def test_join_of_system_table_and_sink(built):
    got = query(built, """
        SELECT s.sector, sum(s.trades) AS trades, max(p.seq) AS seq, max(r.version) AS version
        FROM sectors s
        JOIN laminar_system.partitions p ON p.flow = 'sectors'
        JOIN (SELECT flow, partitions, max(table_version) AS version FROM LAMINAR_SYSTEM.`runs`
              GROUP BY flow, partitions) r ON r.flow = p.flow AND array_contains(r.partitions, p.partition)
        GROUP BY s.sector ORDER BY s.sector""")
    assert got.rows == [("energy", 1, 3, 3), ("tech", 2, 3, 3)]


def test_limit_collects_at_most_limit_rows(built):
    got = query(built, "SELECT * FROM raw", limit=2)
    assert len(got.rows) == 2 and got.truncated
    assert not query(built, "SELECT * FROM raw", limit=3).truncated


def test_only_named_tables_are_read_and_views_are_dropped(built, monkeypatch):
    read = []
    real_frame, real_runs = st.table_frame, st.runs
    monkeypatch.setattr(st, "table_frame", lambda spark, name, uri: read.append(name) or real_frame(spark, name, uri))
    monkeypatch.setattr(st, "runs", lambda *a, **kw: read.append("runs") or real_runs(*a, **kw))
    query(built, "WITH raw AS (SELECT 1 AS x) SELECT * FROM raw JOIN sectors ON true")
    assert read == ["sectors"]  # the CTE shadows the source table `raw`
    query(built, "SELECT flow FROM laminar_system.partitions")
    assert read == ["sectors"]
    assert not [t.name for t in built[1].spark.catalog.listTables() if t.isTemporary]


def test_unknown_table_names_it_and_the_known_ones(built):
    for sql, name in [("SELECT * FROM nope", "'nope'"), ("SELECT * FROM laminar_system.nope", "'laminar_system.nope'"),
                      ("SELECT * FROM other.sectors", "'other.sectors'")]:
        with pytest.raises(LaminarError) as info:
            query(built, sql)
        message = str(info.value)
        assert f"unknown table {name}" in message and "\n" not in message
        assert "known tables: norm, raw, sectors, symbols, laminar_system.dag_topology" in message, message


def test_spark_errors_are_one_line(built):
    with pytest.raises(LaminarError) as info:
        query(built, "SELECT * FORM sectors")
    message = str(info.value)
    assert "PARSE_SYNTAX_ERROR" in message and "'sectors'" in message and "\n" not in message, message
    typed = "SELECT * FROM `laminar_system`.runs WHERE run_id = = 1"
    with pytest.raises(LaminarError) as info:  # positions point into the query as typed
        query(built, typed)
    assert f"(line 1, pos {typed.rindex('=')})" in str(info.value), str(info.value)
    with pytest.raises(LaminarError) as info:
        query(built, "SELECT no_such_column FROM laminar_system.runs")
    message = str(info.value)
    assert "UNRESOLVED_COLUMN" in message and "no_such_column" in message and "\n" not in message, message
    assert "laminar_system_runs" not in message  # the view's name is shown as typed


def test_statements_other_than_one_query_are_refused(built):
    for sql in ("DROP TABLE sectors", "CREATE TABLE t AS SELECT 1", "SELECT 1; SELECT 2", "INSERT INTO raw SELECT *"):
        with pytest.raises(LaminarError, match="reads only: it runs one SELECT"):
            query(built, sql)
    assert not [t.name for t in built[1].spark.catalog.listTables() if t.isTemporary]  # refused before any view
    assert query(built, "DESCRIBE laminar_system.runs").rows[0][:2] == ("run_id", "string")


def test_a_sink_not_written_yet_is_named(built):
    other = FlowSpec(name="later", source="norm", event_time="ts", window=Tumbling("10m"), aggregates=(Agg.count(),))
    with pytest.raises(LaminarError, match="table 'later' has no data yet"):
        st.run_query(built[1].spark, built[0].root, [*SPECS, other], "SELECT * FROM later")


def test_references_rewrite_system_tables_in_place():
    tables, _, sql = st.references("SELECT x.flow FROM `laminar_system`.`runs` x, laminar_system.partitions\n"
                                   "WHERE laminar_system.partitions.seq > 0")
    assert tables == {"laminar_system.runs", "laminar_system.partitions"}
    assert sql == ("SELECT x.flow FROM laminar_system_runs     x, laminar_system_partitions\n"
                   "WHERE laminar_system_partitions.seq > 0")
    # what sqlglot cannot parse goes to Spark as typed; every identifier is a candidate to register
    tables, candidates, sql = st.references("SELECT * FORM sectors")
    assert tables is None and {"sectors"} <= candidates and sql == "SELECT * FORM sectors"


def test_dead_letters_and_webhook_counts_are_system_tables(spark, tmp_path, webhook_receiver):
    """The rows a webhook export could not deliver, with their status, error and key, for `laminar sql`; its
    dead letters, rows sent and retries in laminar_system.exports."""
    from tests.engine.export.webhook_helpers import HOOK, Trades, exporter
    from tests.engine.export.webhook_helpers import STAGE as TRADES

    root = str(tmp_path / "lake")
    trades = Trades(root)
    trades.append((0, "a", 1.0))
    exporter(root, webhook_receiver.url).deliver(HOOK, TRADES)
    assert st.run_query(spark, root, [TRADES], "SELECT * FROM laminar_system.dead_letters", exports=[HOOK]).rows == []
    trades.append((1, "b", 2.0), (2, "c", 3.0))
    webhook_receiver.rule = lambda body: 503 if body["row"]["sym"] == "b" else None
    exporter(root, webhook_receiver.url).deliver(HOOK, TRADES)
    [letter] = st.run_query(spark, root, [TRADES], "SELECT export, op, version, status, attempts, row, idempotency_key "
                            "FROM laminar_system.dead_letters", exports=[HOOK]).records()
    assert (letter["export"], letter["op"], letter["version"], letter["status"], letter["attempts"]) == \
        (HOOK.name, "insert", 1, 503, 3)
    assert '"sym": "b"' in letter["row"] and len(letter["idempotency_key"]) == 64
    [row] = st.run_query(spark, root, [TRADES], "SELECT dead_letters, rows_sent, retries, pending_rows, delivered_version "
                         "FROM laminar_system.exports", exports=[HOOK]).records()
    assert row == {"dead_letters": 1, "rows_sent": 1, "retries": 2, "pending_rows": 0, "delivered_version": 1}
