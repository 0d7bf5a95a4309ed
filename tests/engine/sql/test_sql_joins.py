"""A flow that joins two fact tables: refill-only, the touched windows recomputed after a change to
the FROM table, every partition after a change to the joined one, and always equal to the query run
whole by Spark (a hand-written Spark SQL reference, sharing nothing with the compiler)."""

from __future__ import annotations

import pandas as pd
import pytest

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import Engine, Mode, Reason
from laminar_assets.engine.sql.views import compile_sql
from laminar_assets.errors import SchemaMismatchError, SpecError
from laminar_assets.pipeline.graph import components
from laminar_assets.pipeline.tick import Cursor, plan_tick
from tests.reference import assert_frames_match

pytestmark = pytest.mark.spark
PARTS = ["2024-01-01-00:00", "2024-01-01-01:00"]

EDGE = """
CREATE MATERIALIZED VIEW edge AS
SELECT t.sym, TUMBLE(t.ts, INTERVAL '15' MINUTE), COUNT(*) AS n, AVG(t.px - q.bid) AS edge,
       MAX(q.bid) AS best_bid, COUNT(DISTINCT q.venue) AS venues
FROM trades t JOIN quotes q ON t.sym = q.sym AND q.ts <= t.ts AND q.ts > t.ts - INTERVAL 10 MINUTES
WHERE q.bid > 0
GROUP BY t.sym, TUMBLE(t.ts, INTERVAL '15' MINUTE)
"""

REFERENCE = """
SELECT t.sym, window.start AS window_start, window.end AS window_end, COUNT(*) AS n, AVG(t.px - q.bid) AS edge,
       MAX(q.bid) AS best_bid, COUNT(DISTINCT q.venue) AS venues
FROM ref_trades t JOIN ref_quotes q ON t.sym = q.sym AND q.ts <= t.ts AND q.ts > t.ts - INTERVAL 10 MINUTES
WHERE q.bid > 0
GROUP BY t.sym, window(t.ts, '15 minutes')
"""


def _quotes(rows) -> pd.DataFrame:
    df = pd.DataFrame(list(rows), columns=["ts", "sym", "bid", "venue"])
    df["ts"] = pd.to_datetime(df["ts"], utc=True).astype("datetime64[us, UTC]")
    return df.astype({"sym": "string", "bid": "float64", "venue": "string"})


def _reference(spark, lake) -> pd.DataFrame:
    for name in ("trades", "quotes"):
        spark.createDataFrame(lake.read(name)).createOrReplaceTempView(f"ref_{name}")
    try:
        return spark.sql(REFERENCE).toPandas()
    finally:
        for name in ("trades", "quotes"):
            spark.catalog.dropTempView(f"ref_{name}")


def _windows(plan) -> list[tuple[str, str]]:
    return [(f"{r.start:%H:%M}", f"{r.end:%H:%M}") for r in plan.refill]


def test_a_join_of_two_fact_tables_recomputes_the_windows_it_must(spark, lake):
    (spec,) = compile_sql(EDGE, origin="edge.sql")
    assert spec.not_incrementalizable[0] == "JOIN quotes"
    lake.create("trades", [("2024-01-01 00:01:00", "a", 10.0, 1), ("2024-01-01 00:20:00", "a", 11.0, 2),
                           ("2024-01-01 00:21:00", "b", 20.0, 1), ("2024-01-01 01:05:00", "b", 21.0, 3)])
    lake.create("quotes", frame=_quotes([("2024-01-01 00:00:00", "a", 9.5, "x"), ("2024-01-01 00:15:00", "a", 10.5, "y"),
                                         ("2024-01-01 00:18:00", "a", 10.8, "x"), ("2024-01-01 00:19:00", "b", 19.0, "x"),
                                         ("2024-01-01 01:00:00", "b", 20.5, "y"), ("2024-01-01 01:01:00", "b", -1.0, "z")]))
    engine = Engine(spark, lake.root)
    results = engine.run_many(spec, PARTS)
    assert {(r.mode, r.reason) for r in results} == {(Mode.REFILL, Reason.NO_WATERMARK)}
    assert_frames_match(lake.read("edge"), _reference(spark, lake), ["sym"])

    (part,) = components([spec])
    assert set(part.tables) == {"trades", "quotes"}  # the tables the sensor watches

    def dirty(cursor: Cursor):  # what the pipeline sensor would request
        return plan_tick(part, lake.root, CheckpointStore(lake.root), cursor, lambda *_: set(), set())

    cursor = dirty(Cursor()).cursor
    assert dirty(cursor).empty

    # A late trade lands in one window of the first partition: only that window is recomputed.
    lake.append("trades", [("2024-01-01 00:19:30", "a", 12.0, 1)])
    assert dirty(cursor).dirty == {"edge": (PARTS[0],)}
    plans = engine.plans(spec, PARTS)
    assert plans[1].mode is Mode.NOOP
    assert (plans[0].mode, plans[0].reason) == (Mode.REFILL, Reason.QUERY_NOT_INCREMENTALIZABLE)
    assert plans[0].detail.startswith("QUERY_NOT_INCREMENTALIZABLE: JOIN quotes")
    assert _windows(plans[0]) == [("00:15", "00:30")] and not plans[0].refill_all
    engine.run_many(spec, PARTS)
    assert_frames_match(lake.read("edge"), _reference(spark, lake), ["sym"])

    # A trade deleted: its window is recomputed, the rows of the others stay.
    lake.delete("trades", "px = 21.0")
    (first, second) = engine.run_many(spec, PARTS)
    assert first.plan.mode is Mode.NOOP and _windows(second.plan) == [("01:00", "01:15")]
    assert_frames_match(lake.read("edge"), _reference(spark, lake), ["sym"])

    # The joined table changes (an append and a delete): its rows can reach any window, so every
    # partition is recomputed, and says why.
    lake.append("quotes", frame=_quotes([("2024-01-01 00:16:00", "b", 19.9, "z")]))
    lake.delete("quotes", "venue = 'y' AND sym = 'a'")
    cursor = dirty(Cursor(versions={"trades": 2, "quotes": 0})).cursor
    assert dirty(Cursor(versions={**cursor.versions, "quotes": 0})).dirty == {"edge": tuple(PARTS)}
    results = engine.run_many(spec, PARTS)
    assert {(r.mode, r.reason) for r in results} == {(Mode.REFILL, Reason.DIMENSION_CHANGED)}
    assert "dimension 'quotes' moved" in results[0].plan.detail
    assert_frames_match(lake.read("edge"), _reference(spark, lake), ["sym"])
    assert {r.mode for r in engine.run_many(spec, PARTS)} == {Mode.NOOP}


def test_a_joined_column_the_table_lacks_is_named(spark, lake):
    (spec,) = compile_sql(EDGE.replace("MAX(q.bid)", "MAX(q.ask)"), origin="edge.sql")
    lake.create("trades", [("2024-01-01 00:01:00", "a", 10.0, 1)])
    lake.create("quotes", frame=_quotes([("2024-01-01 00:00:00", "a", 9.5, "x")]))
    with pytest.raises(SchemaMismatchError, match="column 'ask' of joined table 'quotes'"):
        Engine(spark, lake.root).run_many(spec, PARTS[:1])


def test_a_join_condition_that_does_not_compile_is_named(spark, lake):
    (spec,) = compile_sql(EDGE.replace("t.sym = q.sym", "t.sym = q.sym + ARRAY(1)"), origin="edge.sql")
    lake.create("trades", [("2024-01-01 00:01:00", "a", 10.0, 1)])
    lake.create("quotes", frame=_quotes([("2024-01-01 00:00:00", "a", 9.5, "x")]))
    with pytest.raises(SpecError, match="flow 'edge': join condition .* with 'quotes' does not compile"):
        Engine(spark, lake.root).run_many(spec, PARTS[:1])


def test_joins_that_cannot_follow_the_windows_are_rejected_at_load():
    full = EDGE.replace("FROM trades t JOIN", "FROM trades t FULL JOIN")
    with pytest.raises(SpecError, match="RIGHT, FULL and CROSS joins cannot be computed per window"):
        compile_sql(full, origin="edge.sql")
    strict = EDGE.replace("AS\n", "WITH (refresh = 'incremental_strict') AS\n", 1)
    with pytest.raises(SpecError, match="incremental_strict' cannot maintain JOIN quotes"):
        compile_sql(strict, origin="edge.sql")


def test_explain_shows_the_join():
    from laminar_assets.engine.report.overview import logical

    (spec,) = compile_sql(EDGE, origin="edge.sql")
    (join,) = logical(spec)["joins"]
    assert join["table"] == "quotes" and join["how"] == "inner"
    assert join["on"] == "sym = q__sym AND q__ts <= ts AND q__ts > ts - INTERVAL '10' MINUTES"
    assert set(join["columns"]) == {"q__bid", "q__venue", "q__sym", "q__ts"}
    assert logical(spec)["not_incrementalizable"] == ["JOIN quotes"]  # COUNT(DISTINCT) alone would merge


def test_a_flow_with_a_fact_join_never_runs_in_one_task(spark, lake):
    """The one-task path of small passes is bounded by the bytes a pass reads, and a joined table is
    read whole and can multiply rows: a flow with joins keeps the shuffle by partition."""
    from tests.engine.test_one_pass import Jobs

    (spec,) = compile_sql(EDGE, origin="edge.sql")
    lake.create("trades", [("2024-01-01 00:01:00", "a", 10.0, 1), ("2024-01-01 01:05:00", "b", 21.0, 3)])
    lake.create("quotes", frame=_quotes([("2024-01-01 00:00:00", "a", 9.5, "x"), ("2024-01-01 01:00:00", "b", 20.5, "y")]))
    _, tasks = Jobs(spark).tasks(lambda: Engine(spark, lake.root).run_many(spec, PARTS))
    assert max(len(job) for job in tasks) >= 2, tasks  # a job with a shuffle: more than one stage
    assert_frames_match(lake.read("edge"), _reference(spark, lake), ["sym"])
