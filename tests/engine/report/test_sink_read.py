"""The driver reads a small sink partition exactly as a Spark fetch would, and leaves to Spark
what it cannot read that way."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pandas as pd
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from laminar_assets.engine import Agg, Engine, FlowSpec, Tumbling
from laminar_assets.engine.report.sink_read import to_pandas
from tests.delta_features import delete_where, enable_deletion_vectors, rename_column

pytestmark = pytest.mark.spark

SPEC = FlowSpec(name="wide", source="src", event_time="ts", window=Tumbling("1h"), keys=("k",),
                aggregates=(Agg.count(),))
P0, P1 = "2024-01-01-00:00", "2024-01-01-01:00"
UTC = dt.UTC


def wide(rows: list[tuple]) -> pa.Table:
    ts = pa.timestamp("us", tz="UTC")
    schema = pa.schema([
        ("window_start", ts), ("window_end", ts), ("k", pa.string()), ("n", pa.int64()), ("x", pa.float64()),
        ("d", pa.date32()), ("dec", pa.decimal128(10, 2)), ("flag", pa.bool_()), ("arr", pa.list_(pa.int32())),
        ("st", pa.struct([("a", pa.int32()), ("b", pa.string())])),
    ])
    cols = list(zip(*rows))
    return pa.table([pa.array(c, type=f.type) for c, f in zip(cols, schema)], schema=schema)


def at(hour: int, minute: int = 0) -> dt.datetime:
    return dt.datetime(2024, 1, 1, hour, minute, tzinfo=UTC)


ROWS = [
    (at(0), at(1), "a", 1, 1.5, dt.date(2024, 1, 1), Decimal("1.25"), True, [1, 2], {"a": 1, "b": "x"}),
    (at(0, 30), at(1), None, None, float("nan"), None, None, None, None, None),  # nulls: P0 widens n
    (at(1), at(2), "b", 7, -0.0, dt.date(2024, 1, 2), Decimal("-3.50"), False, [], {"a": None, "b": None}),
    (at(1, 59), at(2), "c", 8, 2.0, dt.date(2024, 1, 3), Decimal("0.01"), True, [3], {"a": 2, "b": "y"}),
    (at(2), at(3), "z", 9, 9.0, dt.date(2024, 1, 4), Decimal("9.99"), True, [9], {"a": 9, "b": "z"}),  # later hour
]


def spark_fetch(engine: Engine, partition: str) -> pd.DataFrame:
    return engine.sink_frame(SPEC, partition).toPandas()


def same(a: pd.DataFrame, b: pd.DataFrame) -> None:
    a, b = (f.sort_values(["window_start", "k"], na_position="first").reset_index(drop=True) for f in (a, b))
    assert list(a.dtypes.astype(str)) == list(b.dtypes.astype(str))
    pd.testing.assert_frame_equal(a, b)


def test_driver_rows_are_the_rows_and_types_of_a_spark_fetch(spark, lake):
    write_deltalake(lake.path("wide"), wide(ROWS))
    engine = Engine(spark, lake.root)
    tables = engine.sink_tables(SPEC, [P0, P1])
    assert {k: t.num_rows for k, t in tables.items()} == {P0: 2, P1: 2}  # [start, end): 02:00 is not in P1
    for p in (P0, P1):
        same(to_pandas(tables[p]), spark_fetch(engine, p))
    assert str(to_pandas(tables[P0])["n"].dtype) == "float64" and str(to_pandas(tables[P1])["n"].dtype) == "int64"


def test_a_column_added_later_is_null_in_older_files(spark, lake):
    write_deltalake(lake.path("wide"), wide(ROWS[:2]).drop_columns(["st"]))
    write_deltalake(lake.path("wide"), wide(ROWS[2:]), mode="append", schema_mode="merge")
    engine = Engine(spark, lake.root)
    tables = engine.sink_tables(SPEC, [P0, P1])
    assert tables[P0].column("st").null_count == 2
    for p in (P0, P1):
        same(to_pandas(tables[p]), spark_fetch(engine, p))


def test_what_the_driver_cannot_read_like_spark_is_left_to_spark(spark, lake):
    path = lake.path("wide")
    write_deltalake(path, wide(ROWS))
    engine = Engine(spark, lake.root)
    assert engine.sink_tables(SPEC, [P0], max_bytes=0) is None  # more bytes than allowed
    enable_deletion_vectors(path)
    delete_where(path, lambda t: pa.compute.equal(t.column("k"), "b"))
    assert engine.sink_tables(SPEC, [P1]) is None  # a deletion vector: Spark applies it
    assert list(spark_fetch(engine, P1)["k"]) == ["c"]


def test_a_column_mapped_sink_is_left_to_spark(spark, lake):
    path = lake.path("wide")
    write_deltalake(path, wide(ROWS), configuration={"delta.columnMapping.mode": "name"})
    rename_column(path, "x", "x2")  # the files keep the physical name: only Spark's read maps it
    engine = Engine(spark, lake.root)
    assert engine.sink_tables(SPEC, [P0]) is None
    assert "x2" in spark_fetch(engine, P0).columns


def test_the_preview_read_by_the_driver_is_the_one_spark_gives(spark, lake):
    """`Engine.preview` (a step's metadata, `laminar` CLI): the first rows by time, read by the driver when small
    (no Spark job on the step's path), the same frame as Spark's `orderBy(time).limit(n)`."""
    write_deltalake(lake.path("wide"), wide(ROWS))
    engine = Engine(spark, lake.root)
    for p in (P0, P1):
        for limit in (1, 5):
            driver = engine.preview(SPEC, p, limit=limit)
            by_spark = engine.sink_frame(SPEC, p).orderBy("window_start").limit(limit).toPandas()
            assert len(driver) == min(limit, 2)
            same(driver, by_spark)
