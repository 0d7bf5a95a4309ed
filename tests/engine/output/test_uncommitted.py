"""`uncommitted.write_uncommitted`: a write through the driver (Arrow + pyarrow) writes what Spark's write job writes."""

from __future__ import annotations

import json
import os

import pytest
from pyspark.sql import Observation
from pyspark.sql import functions as F

from laminar_assets.engine.output.uncommitted import read_uncommitted, write_uncommitted
from laminar_assets.engine.spark.frames import observe

pytestmark = pytest.mark.spark


def _frame(spark, rows: int):
    """Every column type a state or sink holds: timestamps with and without a zone, decimals, binary
    (sketches), strings, arrays, structs and nulls, over partition ids that include a negative one."""
    return spark.range(rows).selectExpr(
        "CAST(id % 3 - 1 AS BIGINT) AS __p",
        "timestamp_micros(1704067200000000 + id * 61000000) AS window_start",
        "CAST(timestamp_micros(1704067200000000 + id) AS TIMESTAMP_NTZ) AS local_ts",
        "CAST(id / 7 AS DECIMAL(18, 4)) AS amount",
        "CASE WHEN id % 4 = 0 THEN NULL ELSE concat('sym-', CAST(id % 5 AS STRING)) END AS symbol",
        "hll_sketch_agg(id) OVER (PARTITION BY id % 2) AS sketch",
        "array(id, id + 1) AS pair",
        "named_struct('lo', id * 0.5, 'n', CAST(id AS INT)) AS box",
    )


def _summary(files):
    names = sorted(os.path.basename(a.path).split("part-")[0] for a in files.adds)  # "p--1-", "p-0-" or ""
    stats = sorted(json.dumps(json.loads(a.stats), sort_keys=True) for a in files.adds)
    return names, stats


@pytest.mark.parametrize("by", ["__p", None], ids=["by-partition", "one-file"])
def test_the_driver_writes_the_same_files_rows_and_schema_as_spark(spark, tmp_path, by):
    df = _frame(spark, 500)
    if by:
        df = df.repartition("__p")
    via_spark = write_uncommitted(df, str(tmp_path / "t"), "run-spark", by=by)
    obs = Observation()
    via_driver = write_uncommitted(observe(df, obs, F.count(F.lit(1)).alias("n")), str(tmp_path / "t"), "run-driver",
                                   by=by, through_driver=True)

    assert obs.get["n"] == 500  # metrics observed on the write still arrive
    assert via_driver.rows == via_spark.rows == 500
    assert via_driver.schema == via_spark.schema
    assert via_driver.rows_by_partition() == via_spark.rows_by_partition()
    if by:
        assert via_driver.rows_by_partition() == {-1: 167, 0: 167, 1: 166}
    # one file per partition id in both, named so the partition shows ("p--1-...")
    assert _summary(via_driver)[0] == _summary(via_spark)[0] == (["p--1-", "p-0-", "p-1-"] if by else [""])
    assert _summary(via_driver)[1] == _summary(via_spark)[1]  # same Delta statistics
    [folder] = via_driver.folders
    for a in via_driver.adds:
        assert a.path.startswith(f"laminar/{os.path.basename(folder)}/") and os.path.isfile(tmp_path / "t" / a.path)
    assert os.path.basename(folder).startswith("run-driver-")
    assert not [f for f in os.listdir(folder) if not f.endswith(".parquet")]

    back_spark = read_uncommitted(spark, via_spark, str(tmp_path / "t"))
    back_driver = read_uncommitted(spark, via_driver, str(tmp_path / "t"))
    assert back_driver.schema == back_spark.schema
    assert back_driver.exceptAll(back_spark).count() == 0 and back_spark.exceptAll(back_driver).count() == 0


def test_an_empty_driver_write_makes_no_files_but_knows_its_schema(spark, tmp_path):
    df = _frame(spark, 10).where("false")
    files = write_uncommitted(df, str(tmp_path / "t"), "run", by="__p", through_driver=True)
    assert files.adds == () and files.rows == 0
    assert "__p" not in files.schema.names and "window_start" in files.schema.names
    assert files.schema == write_uncommitted(df, str(tmp_path / "t"), "run-spark", by="__p").schema


@pytest.mark.parametrize("through_driver", [True, False], ids=["driver", "spark"])
def test_a_write_never_touches_the_files_of_another_under_the_same_run_id(spark, tmp_path, through_driver):
    """Every write call has a folder of its own: a second pass, attempt or retry of one run never
    deletes or overwrites what the first wrote (and may have committed)."""
    first = write_uncommitted(_frame(spark, 30), str(tmp_path / "t"), "run", by="__p", through_driver=through_driver)
    again = write_uncommitted(_frame(spark, 9), str(tmp_path / "t"), "run", by="__p", through_driver=through_driver)
    assert again.rows == 9 and first.rows == 30
    assert set(first.folders).isdisjoint(again.folders)
    assert all(os.path.isfile(tmp_path / "t" / a.path) for a in first.adds + again.adds)


def test_a_driver_write_of_thousands_of_partitions_is_one_file_each(spark, tmp_path):
    # one Arrow batch holding 3,000 partition ids (pyarrow's dataset writer stops at 1,024 by default)
    df = spark.range(6000).selectExpr("CAST(id % 3000 AS BIGINT) AS __p", "id").coalesce(1)
    files = write_uncommitted(df, str(tmp_path / "t"), "run", by="__p", through_driver=True)
    assert len(files.adds) == 3000 and files.rows == 6000
    assert set(files.rows_by_partition().values()) == {2}


def test_large_arrow_types_in_the_session_write_the_same_schema(spark, tmp_path):
    df = _frame(spark, 50).repartition("__p")
    plain = write_uncommitted(df, str(tmp_path / "t"), "run-spark", by="__p").schema
    spark.conf.set("spark.sql.execution.arrow.useLargeVarTypes", "true")
    try:
        large = write_uncommitted(df, str(tmp_path / "t"), "run-driver", by="__p", through_driver=True).schema
    finally:
        spark.conf.unset("spark.sql.execution.arrow.useLargeVarTypes")
    assert large == plain


def test_file_statistics_leave_out_a_min_max_some_row_group_lacks(tmp_path):
    """A row group whose values are too long for a min/max must not narrow the file's: readers skip
    files by these bounds (a key refill), so they must hold every value."""
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    from laminar_assets.engine.output.uncommitted import file_stats

    path = str(tmp_path / "part.parquet")
    long = "z" + "x" * 5000  # over the writer's 4 KB statistics limit: that row group has no min/max
    table = pa.table({"id": ["a1", "a2", long, "b1"], "n": [1, 2, 3, 4]})
    pq.write_table(table, path, row_group_size=2)
    assert not pq.read_metadata(path).row_group(1).column(0).statistics.has_min_max
    rows, stats = file_stats(path)
    stats = json.loads(stats)
    assert rows == 4 and "id" not in stats["minValues"] and "id" not in stats["maxValues"]
    assert (stats["minValues"]["n"], stats["maxValues"]["n"], stats["nullCount"]["id"]) == (1, 4, 0)


def test_a_driver_write_puts_adjacent_partitions_of_one_block_in_one_file(tmp_path):
    """`partitions_per_file`: consecutive ids with the same id // n share a file; a gap or a block boundary
    starts another (ids 6-7 | 8-9 | 11 for n = 8), and each file's rows are its ids' rows."""
    import pyarrow as pa

    from laminar_assets.engine.output.uncommitted import write_uncommitted_rows

    ids = [6, 7, 8, 9, 11, 6, 9]
    rows = pa.table({"__p": pa.array(ids, pa.int64()), "v": pa.array(range(len(ids)), pa.int64())})
    [files] = write_uncommitted_rows(rows, [(str(tmp_path / "t"), "run", ["v"])], by="__p", partitions_per_file=8)
    names = sorted(os.path.basename(a.path).split("part-")[0] for a in files.adds)
    assert names == ["p-11-", "p-6-to-7-", "p-8-to-9-"]
    assert files.rows == len(ids)
    [one_each] = write_uncommitted_rows(rows, [(str(tmp_path / "t"), "run", ["v"])], by="__p")
    assert len(one_each.adds) == 5
