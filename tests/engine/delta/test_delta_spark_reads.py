"""Reads that must agree with delta-spark's (#63): partition values of every type, and collated strings.

Tables are written by delta-spark in the tests' own Spark session (its jars are loaded there), tiny ones.

- Partition values: Laminar reads a pinned snapshot's partition values from `deltalake`'s typed add
  actions (`snapshot_files`) and a commit's from the raw strings of its log entry (`read_commit`); a
  first run or refill takes the first path and an incremental run the second, so both must give
  delta-spark's value, for every type a partition column can have.
- Collated strings (`STRING COLLATE UTF8_LCASE`, `COLLATE UNICODE`): delta-spark groups and compares
  them by their collation; Laminar reads Parquet strings, which compare byte by byte, so it refuses
  such a source before anything is written.
"""

from __future__ import annotations

import os
from decimal import Decimal

import pandas as pd
import pyarrow as pa
import pytest
from pyspark.sql.types import TimestampType

from laminar_assets.engine import Agg, Engine, EngineOptions, FlowSpec, Mode, Reason, StageSpec, Tumbling
from laminar_assets.engine.delta import snapshot_files, table_info
from laminar_assets.engine.spark import installed_jars
from laminar_assets.engine.spark.frames import spark_path
from laminar_assets.engine.spark.read import read_source
from laminar_assets.engine.sql.views import compile_sql
from laminar_assets.errors import UnsupportedTableFeatureError
from tests.reference import assert_frames_match, full_recompute

pytestmark = [pytest.mark.spark, pytest.mark.skipif(not installed_jars("delta"), reason="needs delta-spark's jars "
                                                    "(make install puts them in the venv)")]

PARTITIONS = ("b", "d", "ts", "ntz", "dec", "s", "bo", "i", "f", "by")
COLUMNS = ("id BIGINT, et TIMESTAMP, qty BIGINT, b BINARY, d DATE, ts TIMESTAMP, ntz TIMESTAMP_NTZ, "
           "dec DECIMAL(10,3), s STRING, bo BOOLEAN, i INT, f DOUBLE, by TINYINT")
# One row per partition: special characters in strings and bytes (path escapes, quotes, non-ASCII, a
# control byte), NULLs and empty values (delta-spark writes both as a null partition value), NaN, a
# negative zero, dates and times before 1970 and with microseconds.
FIRST = [
    "(1, TIMESTAMP'2024-01-01 00:01:00', 1, X'68656C6C6F', DATE'2024-01-02', TIMESTAMP'2024-01-01 01:02:03.123456', "
    "TIMESTAMP_NTZ'2024-01-01 01:02:03.5', 12.345, 'a/b c=d%e', true, 7, 1.5, 3)",
    "(2, TIMESTAMP'2024-01-01 00:02:00', 2, X'C3BC0120', DATE'1900-01-01', TIMESTAMP'1960-01-01 00:00:00', "
    "TIMESTAMP_NTZ'2024-01-01 00:00:00', -0.001, 'ü€\"''x', false, -1, double('NaN'), -1)",
    "(3, TIMESTAMP'2024-01-01 00:03:00', 4, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL)",
    "(4, TIMESTAMP'2024-01-01 00:04:00', 8, X'', DATE'2024-01-02', TIMESTAMP'2024-01-01 01:02:03', NULL, 0, '', true, "
    "0, -0.0, 0)",
]
# the same partitions again (an incremental run reads these adds from the commit's log entry), and a new one
LATER = [row.replace("(1, TIMESTAMP'2024-01-01 00:01:00', 1,", "(11, TIMESTAMP'2024-01-01 00:11:00', 16,")
         .replace("(2, TIMESTAMP'2024-01-01 00:02:00', 2,", "(12, TIMESTAMP'2024-01-01 00:02:30', 32,")
         .replace("(3, TIMESTAMP'2024-01-01 00:03:00', 4,", "(13, TIMESTAMP'2024-01-01 00:13:00', 64,")
         .replace("(4, TIMESTAMP'2024-01-01 00:04:00', 8,", "(14, TIMESTAMP'2024-01-01 00:04:30', 128,")
         for row in FIRST] + [
    "(15, TIMESTAMP'2024-01-01 00:05:00', 256, X'7A', DATE'2024-02-29', TIMESTAMP'2024-06-01 12:00:00', "
    "TIMESTAMP_NTZ'1999-12-31 23:59:59.999999', 99999.999, 'x y', false, 2147483647, -1e300, 127)"]
KEYED = FlowSpec(name="by_parts", source="typed", event_time="et", window=Tumbling("10m"), keys=PARTITIONS,
                 aggregates=(Agg.count(), Agg.sum("qty")))
PART = "2024-01-01-00:00"


def _delta_spark(spark, path: str, version: int) -> pd.DataFrame:
    return spark.read.format("delta").option("versionAsOf", version).load(spark_path(path))


def _arrow(df) -> pa.Table:
    """A DataFrame's rows in Arrow with TIMESTAMP columns as UTC instants (`toArrow` gives them without
    a zone, which `createDataFrame` would take for TIMESTAMP_NTZ); the session runs in UTC."""
    table = df.toArrow()
    for i, field in enumerate(df.schema.fields):
        if isinstance(field.dataType, TimestampType):
            table = table.set_column(i, field.name, table.column(i).cast(pa.timestamp("us", "UTC")))
    return table


def _laminar(spark, name: str, path: str, version: int):
    info = table_info(name, path, version)
    return read_source(spark, snapshot_files(info, None, keep_null_files=True), info)


def _rows(df) -> list[tuple]:
    """Rows as comparable tuples (NaN as a string: NaN != NaN), in id order."""
    def plain(v):
        return "NaN" if isinstance(v, float) and v != v else v
    return sorted((tuple(plain(v) for v in row) for row in df.collect()), key=lambda r: r[0])


def _version(path: str) -> int:
    return max(int(f.split(".")[0]) for f in os.listdir(os.path.join(path, "_delta_log")) if f.endswith(".json"))


def test_partition_values_of_every_type_read_as_delta_spark_reads_them(spark, lake):
    """Laminar's snapshot reading equals delta-spark's `versionAsOf` at each version, and a flow keyed by
    every partition column equals a recompute after its first run (snapshot files) and after an
    incremental run (the commit's files, with the log's partition strings)."""
    path = lake.path("typed")
    table = f"delta.`{spark_path(path)}`"
    spark.sql(f"CREATE TABLE {table} ({COLUMNS}) USING delta PARTITIONED BY ({', '.join(PARTITIONS)})")
    spark.sql(f"INSERT INTO {table} VALUES {', '.join(FIRST)}")
    engine = Engine(spark, lake.root, options=EngineOptions(refill_ratio=None))
    for step, rows in (("first run", None), ("incremental run", LATER)):
        if rows:
            spark.sql(f"INSERT INTO {table} VALUES {', '.join(rows)}")
        version = _version(path)
        theirs = _delta_spark(spark, path, version)
        assert _rows(_laminar(spark, "typed", path, version).select(*theirs.columns)) == _rows(theirs), step
        result = engine.run(KEYED, PART)
        assert result.mode is (Mode.REFILL if step == "first run" else Mode.INCREMENTAL), (step, result.mode)
        expected = full_recompute(spark, KEYED, _arrow(theirs))
        expected["ts"] = expected["ts"].dt.tz_localize("UTC")  # toPandas drops the zone of a TIMESTAMP key
        assert_frames_match(lake.read(KEYED.sink), expected, KEYED.keys)


COLLATED = FlowSpec(name="by_sym", source="collated", event_time="et", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.count(),))
PLAIN = FlowSpec(name="by_note", source="collated", event_time="et", window=Tumbling("10m"), keys=("note",),
                 aggregates=(Agg.count(),))


@pytest.mark.parametrize("collation,name", [("UTF8_LCASE", "spark.UTF8_LCASE"), ("UNICODE", "icu.UNICODE")])
def test_collated_string_columns_are_refused_before_anything_is_written(spark, lake, collation, name):
    """delta-spark groups and filters a collated column by its collation (UTF8_LCASE: 'A' and 'a' are one
    key; UNICODE: ICU order); Laminar's reads, state and sinks compare bytes, so a flow that uses such a
    column is refused, naming table, column, version and collation, and writes nothing. A flow that does
    not use it reads the table as delta-spark does and equals a recompute, first run and incremental run."""
    path = lake.path("collated")
    table = f"delta.`{spark_path(path)}`"
    spark.conf.set("spark.databricks.delta.schema.typeCheck.enabled", "false")  # OSS delta-spark refuses otherwise
    try:
        spark.sql(f"CREATE TABLE {table} (et TIMESTAMP, sym STRING COLLATE {collation}, note STRING) USING delta")
    finally:
        spark.conf.unset("spark.databricks.delta.schema.typeCheck.enabled")
    spark.sql(f"INSERT INTO {table} VALUES (TIMESTAMP'2024-01-01 00:01:00', 'A', 'x'), "
              "(TIMESTAMP'2024-01-01 00:02:00', 'a', 'y'), (TIMESTAMP'2024-01-01 00:03:00', 'B', 'x')")
    theirs = _delta_spark(spark, path, 1)
    if collation == "UTF8_LCASE":  # what a plain-string read gets wrong: delta-spark sees 'A' and 'a' as one key
        assert theirs.groupBy("sym").count().count() == 2 and theirs.where("sym = 'a'").count() == 2
    else:  # and here an order: 'a' < 'B' in ICU's, not in bytes'
        assert theirs.where("sym < 'B'").count() == 2
    with pytest.raises(UnsupportedTableFeatureError) as caught:
        Engine(spark, lake.root).run(COLLATED, PART)
    message = str(caught.value)
    assert "'collated'" in message and "'sym'" in message and "version 1" in message and name in message, message
    written = [d for d, _, _ in os.walk(lake.root) if d.endswith("_delta_log") and not d.startswith(path)]
    assert written == [], f"a refused flow must write no table: {written} ({sorted(os.listdir(lake.root))})"

    if collation != "UTF8_LCASE":
        return  # one collation is enough for what follows
    engine = Engine(spark, lake.root)
    for step in ("first run", "incremental run"):
        if step == "incremental run":
            spark.sql(f"INSERT INTO {table} VALUES (TIMESTAMP'2024-01-01 00:04:00', 'b', 'y')")
        version = _version(path)
        theirs = _delta_spark(spark, path, version)
        ours = _laminar(spark, "collated", path, version)
        assert _rows(ours.select("et", "note")) == _rows(theirs.select("et", "note")), step
        result = engine.run(PLAIN, PART)
        assert result.mode is (Mode.REFILL if step == "first run" else Mode.INCREMENTAL), (step, result.mode)
        assert_frames_match(lake.read(PLAIN.sink), full_recompute(spark, PLAIN, _arrow(theirs)), PLAIN.keys)


# Type widening (`delta.enableTypeWidening`): files written before `ALTER COLUMN ... TYPE` hold the old Parquet
# type (INT32, FLOAT, a narrower decimal), the log holds their old-typed statistics, and delta-spark reads them
# under the new type. Deletion vectors on: an UPDATE or DELETE of a row written before the widening marks it in
# its old file, which an incremental run then reads by row position to retract it.
WIDE = FlowSpec(name="widened", source="widening", event_time="et", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("quantity"), Agg.sum("px"), Agg.avg("px"), Agg.sum("amt"),
                            Agg.max("quantity"), Agg.min("amt")))  # in the sink: int -> bigint, decimal(7,2) -> (14,4)
NEXT = "2024-01-01-01:00"


def _hour(df: pd.DataFrame, part: str) -> pd.DataFrame:
    """The rows of `df` whose window starts in partition `part` (an hour, "2024-01-01-00:00")."""
    start = pd.Timestamp(f"{part[:10]} {part[11:]}", tz="UTC")
    at = pd.to_datetime(df.window_start, utc=True)
    return df[(at >= start) & (at < start + pd.Timedelta("1h"))]


def _widen_rows(*rows) -> str:
    return ", ".join(f"({i}, TIMESTAMP'{ts}', '{sym}', {qty}, {px}, {amt}, {small})"
                     for i, ts, sym, qty, px, amt, small in rows)


def test_widened_columns_read_with_their_new_type_first_incremental_and_retracting_runs(spark, lake):
    """int -> bigint, float -> double, decimal(7,2) -> decimal(14,4) and smallint -> int, widened by delta-spark
    after rows were written: Laminar's snapshot read equals delta-spark's at every version, and a flow (first
    run, the run after the widening, an update and appends, an incremental run retracting a deleted row of a
    file written before it) equals a recompute from delta-spark's read after each step. The run after the widening refills
    with SCHEMA_CHANGED, and the sink rows of a partition it did not run are widened in place, not dropped."""
    path = lake.path("widening")
    table = f"delta.`{spark_path(path)}`"
    spark.sql(f"CREATE TABLE {table} (id BIGINT, et TIMESTAMP, sym STRING, quantity INT, px FLOAT, amt DECIMAL(7,2), "
              "small SMALLINT) USING delta TBLPROPERTIES ('delta.enableTypeWidening' = 'true', "
              "'delta.enableDeletionVectors' = 'true')")
    spark.sql(f"INSERT INTO {table} VALUES " + _widen_rows(
        (1, "2024-01-01 00:01:00", "a", 2147483647, 1.1, "99999.99", 32767),
        (2, "2024-01-01 00:02:00", "a", -5, 2.5, "-0.01", -3),
        (10, "2024-01-01 00:06:00", "b", 4, 0.75, "3.00", 7),  # three rows a file (two tasks): an UPDATE or
        (3, "2024-01-01 00:12:00", "b", 7, -1.25, "12.34", 1),  # DELETE of one of them marks it with a
        (11, "2024-01-01 00:16:00", "c", 12, 2.0, "7.77", 8),  # deletion vector, not a rewrite of the file
        (5, "2024-01-01 00:03:00", "a", 11, 0.1, "0.10", 5),
        (4, "2024-01-01 01:05:00", "a", 9, 3.3, "1.00", 2)))
    # the run that retracts a deleted row merges (and recomputes a group that lost its extreme) instead of
    # recomputing its windows up front
    engine = Engine(spark, lake.root, options=EngineOptions(refill_ratio=None, extreme_refill="merge"))

    def check(step: str, part: str, mode: Mode, reason: Reason | None = None) -> None:
        version = _version(path)
        theirs = _delta_spark(spark, path, version)
        assert _rows(_laminar(spark, "widening", path, version).select(*theirs.columns)) == _rows(theirs), step
        result = engine.run(WIDE, part)
        assert result.mode is mode and (reason is None or result.reason is reason), (step, result.mode, result.detail)
        assert_frames_match(_hour(lake.read(WIDE.sink), part), _hour(full_recompute(spark, WIDE, _arrow(theirs)), part),
                            WIDE.keys)

    check("first run", PART, Mode.REFILL)
    engine.run(WIDE, NEXT)

    for column, wider in (("quantity", "BIGINT"), ("px", "DOUBLE"), ("amt", "DECIMAL(14,4)"), ("small", "INT")):
        spark.sql(f"ALTER TABLE {table} ALTER COLUMN {column} TYPE {wider}")
    sink = lake.table(WIDE.sink)
    spark.sql(f"INSERT INTO {table} VALUES " + _widen_rows(  # values beyond the old types' ranges
        (7, "2024-01-01 00:04:00", "a", 5_000_000_000, 1e300, "1234567890.1234", 2_000_000_000),
        (8, "2024-01-01 00:15:00", "b", -9_000_000_000, 0.1, "-0.0001", -70000)))
    spark.sql(f"UPDATE {table} SET quantity = quantity + 3000000000, amt = amt + 0.0005 WHERE id = 3")  # a pre-widening row
    check("run after the widening", PART, Mode.REFILL, Reason.SCHEMA_CHANGED)
    widened = lake.table(WIDE.sink)
    assert widened.schema().to_arrow() != sink.schema().to_arrow()
    left = _hour(widened.to_pandas(), NEXT)
    assert len(left) == 1 and left.max_quantity.tolist() == [9] and left.min_amt.tolist() == [Decimal("1.0000")], \
        "the partition not run keeps its rows, widened"

    # a row written before the widening, beside others in its file: the deletion vector marks it there, and the
    # incremental run retracts it reading the old (INT32, FLOAT, DECIMAL(7,2)) file by row position
    spark.sql(f"DELETE FROM {table} WHERE id = 1")
    spark.sql(f"INSERT INTO {table} VALUES " + _widen_rows((9, "2024-01-01 00:05:00", "b", 3, 0.5, "5.5", 1)))
    check("incremental run retracting pre-widening rows", PART, Mode.INCREMENTAL)
    check("the other partition", NEXT, Mode.REFILL, Reason.SCHEMA_CHANGED)


# VARIANT columns (`variantType`): delta-spark stores a variant as a Parquet group of two binaries (metadata,
# value); Arrow and `deltalake` see that struct, Spark reads it as a VARIANT when asked for one. A flow reads a
# variant's fields with their types (`payload:price::double`, `variant_get(payload, '$.price', 'double')`) in its
# filter, derived columns and keys; a variant itself is never a key, an aggregate or a sink column.
BUY_BY_VENUE = """
CREATE MATERIALIZED VIEW buys_sql AS
SELECT TUMBLE(et, INTERVAL '10' MINUTE), payload:venue::string AS venue, COUNT(*) AS n,
       SUM(payload:price::double) AS notional, MAX(variant_get(payload, '$.price', 'double')) AS top
FROM variants WHERE payload:side::string = 'buy'
GROUP BY TUMBLE(et, INTERVAL '10' MINUTE), payload:venue::string
"""
BUYS = FlowSpec(name="buys_py", source="variants", event_time="et", window=Tumbling("10m"), keys=("venue",),
                derived={"venue": "payload:venue::string", "price": "variant_get(payload, '$.price', 'double')"},
                filter="payload:side::string = 'buy'",
                aggregates=(Agg.count(name="n"), Agg.sum("price", name="notional"), Agg.max("price", name="top")))
BY_SYM = FlowSpec(name="by_sym_plain", source="variants", event_time="et", window=Tumbling("10m"), keys=("sym",),
                  aggregates=(Agg.count(name="n"), Agg.sum("id", name="ids")))  # reads no variant column
# what a flow cannot do with a variant: hold one as a key or aggregate one unextracted
RAW_KEY = FlowSpec(name="raw_key", source="variants", event_time="et", window=Tumbling("10m"), keys=("payload",),
                   aggregates=(Agg.count(),))
RAW_STAGE = StageSpec(name="all_columns", source="variants", event_time="et")  # would write the variants out
RAW_AGG = FlowSpec(name="raw_agg", source="variants", event_time="et", window=Tumbling("10m"), keys=("sym",),
                   derived={"p": "payload:price"}, aggregates=(Agg.count("p"),))


def _variant_rows(*rows) -> str:
    return ", ".join(f"({i}, TIMESTAMP'{ts}', '{sym}', parse_json('{payload}'), parse_json('{{\"n\": {i}}}'))"
                     for i, ts, sym, payload in rows)


def _variant_expected(theirs) -> tuple[pd.DataFrame, pd.DataFrame]:
    """What the buy flows and the plain flow must hold, from delta-spark's read with Spark's own variant
    syntax (one Spark job; the windows and groups in pandas, no Laminar code involved)."""
    rows = theirs.selectExpr("id", "et", "sym", "payload:venue::string AS venue", "payload:price::double AS price",
                             "payload:side::string AS side").toPandas()
    rows["window_start"] = pd.to_datetime(rows.et, utc=True).dt.floor("10min")
    rows["window_end"] = rows.window_start + pd.Timedelta("10min")
    buys = rows[(rows.side == "buy") & rows.venue.notna()].groupby(["window_start", "window_end", "venue"]).agg(
        n=("id", "size"), notional=("price", lambda p: p.sum(min_count=1)), top=("price", "max")).reset_index()
    plain = rows.groupby(["window_start", "window_end", "sym"]).agg(n=("id", "size"), ids=("id", "sum")).reset_index()
    return buys, plain


def test_variant_fields_in_filters_derived_columns_and_keys_first_and_incremental_runs(spark, lake):
    """A source with VARIANT columns: a Python and a SQL flow that filter on, derive from and group by its
    fields equal Spark's own query over delta-spark's read after the first run and after an incremental run
    (an append and a delete of an older row, marked by a deletion vector in a file written before); a flow
    that reads no variant column ignores them; a variant used as a key or aggregated unextracted is refused,
    naming table, column and version, before anything is written."""
    (buys_sql,) = compile_sql(BUY_BY_VENUE, origin="variants.sql")
    path = lake.path("variants")
    table = f"delta.`{spark_path(path)}`"
    spark.sql(f"CREATE TABLE {table} (id BIGINT, et TIMESTAMP, sym STRING, payload VARIANT, extra VARIANT) "
              "USING delta TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
    spark.sql(f"INSERT INTO {table} SELECT /*+ REPARTITION(1) */ * FROM VALUES " + _variant_rows(  # one file
        (1, "2024-01-01 00:01:00", "a", '{"price": 1.5, "side": "buy", "venue": "x"}'),
        (2, "2024-01-01 00:02:00", "a", '{"price": 2, "side": "buy", "venue": "y", "more": [1, {"k": null}]}'),
        (3, "2024-01-01 00:03:00", "b", '{"price": 100, "side": "sell", "venue": "x"}'),
        (4, "2024-01-01 00:04:00", "b", '{"price": "3.25", "side": "buy", "venue": "x"}'),  # a string, cast
        (5, "2024-01-01 00:12:00", "a", '{"price": 7.5, "side": "buy", "venue": "y"}'),
        (6, "2024-01-01 00:13:00", "b", '{"side": "buy", "venue": "y"}'),  # no price: a NULL one
        (9, "2024-01-01 00:14:00", "b", '{"price": 5, "side": "buy"}')))  # no venue: quarantined (key missing)
    for spec, column in ((RAW_KEY, "'payload'"), (RAW_AGG, "'p'"), (RAW_STAGE, "'payload'")):
        with pytest.raises(UnsupportedTableFeatureError) as caught:
            Engine(spark, lake.root).run(spec, PART)
        message = str(caught.value)
        assert "'variants'" in message and "version 1" in message and "variantType" in message, message
        assert column in message and "variant_get(" in message, message
    written = [d for d, _, _ in os.walk(lake.root) if d.endswith("_delta_log") and not d.startswith(path)]
    assert written == [], f"a refused flow must write no table: {written}"

    engine = Engine(spark, lake.root, options=EngineOptions(refill_ratio=None, extreme_refill="merge"))
    for step in ("first run", "incremental run"):
        if step == "incremental run":
            spark.sql(f"INSERT INTO {table} SELECT * FROM VALUES " + _variant_rows(
                (7, "2024-01-01 00:05:00", "a", '{"price": 4, "side": "buy", "venue": "x"}'),
                (8, "2024-01-01 00:15:00", "c", '{"price": 9, "side": "buy", "venue": "z"}')))
            spark.sql(f"DELETE FROM {table} WHERE id = 2")  # an older row beside others: a deletion vector
        version = _version(path)
        theirs = _delta_spark(spark, path, version)
        if step == "incremental run":  # the snapshot read (the first run reads it too), deletion vector included
            cols = ("id", "payload:venue::string", "to_json(payload)", "to_json(extra)")
            assert _rows(_laminar(spark, "variants", path, version).selectExpr(*cols)) == \
                _rows(theirs.selectExpr(*cols)), step
        buys, plain = _variant_expected(theirs)
        for spec in (BUYS, buys_sql):
            result = engine.run(spec, PART)
            assert result.mode is (Mode.REFILL if step == "first run" else Mode.INCREMENTAL), (spec.name, step, result)
            assert_frames_match(lake.read(spec.sink), buys, ["venue"])
        result = engine.run(BY_SYM, PART)
        assert result.mode is (Mode.REFILL if step == "first run" else Mode.INCREMENTAL), (step, result.mode)
        assert_frames_match(lake.read(BY_SYM.sink), plain, ["sym"])
        assert "payload" not in lake.read(BY_SYM.sink).columns
