"""Laminar's tables as a delta-spark user reads them: stages, sinks, state and the quarantine.

delta-spark (loaded into the tests' session when its jars are installed) must read every table
Laminar writes, get the rows Laminar's own reader gets, read a stage's change data feed with
`readChangeFeed` so that each version's changes take the previous snapshot to the next one (what a
downstream flow consumes), and show Laminar's commits in DESCRIBE HISTORY with their `laminar.*`
facts. A VACUUM or OPTIMIZE that delta-spark runs on a Laminar sink must not break the next run.
"""

from __future__ import annotations

import json
from collections import Counter

import pandas as pd
import pytest

from laminar_assets.engine import Agg, Engine, FlowSpec, RowRule, StageSpec, Tumbling
from laminar_assets.engine.delta import open_delta
from laminar_assets.engine.report import run_query
from laminar_assets.engine.spark import installed_jars
from laminar_assets.engine.spark.frames import spark_path
from laminar_assets.engine.spark.session import delta_available
from tests.conftest import Lake
from tests.lake_invariants import assert_lake_intact, laminar_tables
from tests.reference import assert_frames_match, full_recompute

pytestmark = [pytest.mark.spark, pytest.mark.skipif(not installed_jars("delta"), reason="needs delta-spark's jars "
                                                    "(make install puts them in the venv)")]

STAGE = StageSpec(name="clean", source="raw", event_time="ts", dedup_key=("trade_id",), filter="qty > 0",
                  derived={"notional": "px * qty"})
FLOW = FlowSpec(name="by_sym", source="clean", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("notional"), Agg.max("px")),
                rules=(RowRule("known_sym", "sym IN ('a', 'b')"),))
PART = "2024-01-01-00:00"


def raw(rows) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["trade_id", "ts", "sym", "px", "qty"])
    df["ts"] = pd.to_datetime(df["ts"], utc=True).astype("datetime64[us, UTC]")
    return df.astype({"trade_id": "int64", "sym": "string", "px": "float64", "qty": "int64"})


def _rows(df: pd.DataFrame) -> Counter:
    """A table's rows as a multiset, comparable across readers (timestamps as UTC text)."""
    out = df.copy()
    for col in out.columns:
        if pd.api.types.is_datetime64_any_dtype(out[col]):
            ts = out[col].dt.tz_localize("UTC") if out[col].dt.tz is None else out[col].dt.tz_convert("UTC")
            out[col] = ts.dt.strftime("%Y-%m-%d %H:%M:%S.%f")
    return Counter(tuple(None if pd.isna(v) else (round(v, 9) if isinstance(v, float) else v) for v in row)
                   for row in out.astype(object).itertuples(index=False))


def _spark_rows(spark, uri: str, version: int | None = None) -> pd.DataFrame:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(spark_path(uri)).toPandas()


@pytest.fixture(scope="module")
def lake_with_history(spark, tmp_path_factory):
    """A stage and a flow over it after an append, an update, a delete and a late row (one lake for
    the module: the tests read it, and the last one, which changes it, runs last)."""
    lake = Lake(str(tmp_path_factory.mktemp("consumers") / "lake"))
    assert delta_available(spark), "the tests' session should load delta-spark when its jars are installed"
    lake.create("raw", frame=raw([(1, "2024-01-01 00:01:00", "a", 10.0, 2), (2, "2024-01-01 00:12:00", "b", 7.0, 1),
                                  (3, "2024-01-01 00:13:00", "z", 3.0, 1), (4, "2024-01-01 00:20:00", "a", 1.0, 0)]))
    engine = Engine(spark, lake.root)
    engine.run(STAGE, PART)
    engine.run(FLOW, PART)
    lake.append("raw", frame=raw([(5, "2024-01-01 00:02:00", "a", 12.0, 3), (1, "2024-01-01 00:01:00", "a", 11.0, 2)]))
    lake.update("raw", {"px": "px + 1"}, "trade_id = 2")
    lake.delete("raw", "trade_id = 3")
    for _ in range(2):
        engine.run(STAGE, PART)
        engine.run(FLOW, PART)
        lake.append("raw", frame=raw([(6, "2024-01-01 00:41:00", "b", 2.0, 4)]))
    return lake, engine


def test_delta_spark_reads_every_table_laminar_writes(spark, lake_with_history):
    lake, _ = lake_with_history
    tables = laminar_tables(lake.root, ["clean", "by_sym"])
    assert any("/_laminar/state/" in t for t in tables) and any("/_laminar/quarantine/" in t for t in tables), tables
    for uri in tables:
        theirs = _spark_rows(spark, uri)
        ours = open_delta(uri).to_pandas()
        assert _rows(theirs[list(ours.columns)]) == _rows(ours), uri
        # delta-spark's protocol check passes, and it sees the same version
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{uri}`").collect()[0]
        assert detail["format"] == "delta" and detail["minReaderVersion"] >= 1, uri


@pytest.mark.parametrize("table", ["clean", "by_sym"], ids=["stage", "sink"])
def test_the_change_data_feed_takes_each_snapshot_to_the_next(spark, lake_with_history, table):
    """What `readChangeFeed` returns for each version of a stage or a sink is the difference of its
    snapshots: the changes a downstream flow merges. A stage's rewrites carry `cdc` files; a sink's
    commits replace whole files, which the feed reads as deletes and inserts."""
    lake, _ = lake_with_history
    uri = lake.path(table)
    assert open_delta(uri).metadata().configuration.get("delta.enableChangeDataFeed") == "true"
    latest = open_delta(uri).version()
    feed = spark.read.format("delta").option("readChangeFeed", "true").option("startingVersion", 1).load(uri).toPandas()
    assert set(feed["_change_type"]) >= {"insert", "delete"}, set(feed["_change_type"])
    columns = [c for c in feed.columns if not c.startswith("_")]
    for version in range(1, latest + 1):
        changes = feed[feed["_commit_version"] == version]
        before, after = _rows(_spark_rows(spark, uri, version - 1)[columns]), _rows(_spark_rows(spark, uri, version)[columns])
        added = _rows(changes[changes["_change_type"].isin(["insert", "update_postimage"])][columns])
        removed = _rows(changes[changes["_change_type"].isin(["delete", "update_preimage"])][columns])
        assert before - removed + added == after and not (removed - before), version


def test_describe_history_shows_laminar_commits(spark, lake_with_history):
    lake, _ = lake_with_history
    history = spark.sql(f"DESCRIBE HISTORY delta.`{lake.path('by_sym')}`").collect()
    assert all(json.loads(h["userMetadata"] or "{}").get("laminar.flow") == "by_sym" for h in history), \
        [h.asDict() for h in history]  # every commit names its flow, the table's creation too
    runs = [json.loads(h["userMetadata"]) for h in history if h["operation"] == "WRITE"]
    assert runs, [h.asDict() for h in history]
    assert all(r["laminar.run_id"] and r["laminar.mode"] and r["laminar.reason"] for r in runs), runs
    assert {h["operation"] for h in history} <= {"CREATE TABLE", "WRITE"}, {h["operation"] for h in history}
    quarantine = [t for t in laminar_tables(lake.root, []) if "/_laminar/quarantine/" in t]
    facts = [json.loads(h["userMetadata"]) for q in quarantine
             for h in spark.sql(f"DESCRIBE HISTORY delta.`{q}`").collect() if h["userMetadata"]]
    assert facts and all(f["laminar.flow"] == "by_sym" and f["laminar.run_id"] for f in facts), facts


def test_laminar_sql_reads_delta_tables_by_path_and_their_history(spark, lake_with_history):
    lake, _ = lake_with_history
    by_path = run_query(spark, lake.root, [STAGE, FLOW], f"SELECT count(*) AS n FROM delta.`{lake.path('clean')}`")
    by_name = run_query(spark, lake.root, [STAGE, FLOW], "SELECT count(*) AS n FROM clean")
    assert by_path.rows == by_name.rows and by_path.rows[0][0] > 0
    history = run_query(spark, lake.root, [STAGE, FLOW], "DESCRIBE HISTORY by_sym")
    assert "operation" in history.columns and "userMetadata" in history.columns
    assert len(history.rows) == open_delta(lake.path("by_sym")).version() + 1


def test_delta_spark_optimize_and_vacuum_on_a_sink_do_not_break_the_next_run(spark, lake_with_history):
    lake, engine = lake_with_history
    spark.conf.set("spark.databricks.delta.retentionDurationCheck.enabled", "false")
    try:
        for name in ("clean", "by_sym"):
            spark.sql(f"OPTIMIZE delta.`{lake.path(name)}`")
            spark.sql(f"VACUUM delta.`{lake.path(name)}` RETAIN 0 HOURS")
    finally:
        spark.conf.unset("spark.databricks.delta.retentionDurationCheck.enabled")
    lake.append("raw", frame=raw([(7, "2024-01-01 00:03:00", "a", 5.0, 1)]))
    lake.delete("raw", "trade_id = 5")
    engine.run(STAGE, PART)
    engine.run(FLOW, PART)
    assert_lake_intact(lake.root)
    stage_rows = lake.table("clean").to_pyarrow_table()
    expected = full_recompute(spark, FLOW, stage_rows)
    expected = expected[expected["sym"].isin(["a", "b"])]
    assert_frames_match(lake.read("by_sym"), expected.reset_index(drop=True), FLOW.keys)
