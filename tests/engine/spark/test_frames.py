"""Schemas a run derives instead of asking Spark (over Spark Connect each schema is an analysis, a request):
each equals the one Spark's analysis gives, or is not derived."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from pyspark.sql import functions as F

from laminar_assets.engine.delta.tables import snapshot_files, table_info
from laminar_assets.engine.spark.frames import named, selected_schema
from laminar_assets.engine.spark.read import read_source
from laminar_assets.engine.stage.dedup import read_schema

pytestmark = pytest.mark.spark
TESTDATA = Path(__file__).resolve().parents[2] / "data" / "delta"  # delta-rs's test tables (tests/data/delta)


def test_a_selected_schema_is_the_one_spark_analyses(spark):
    rows = spark.createDataFrame([(1, "a", 2.5, [1], {"k": 1})],
                                 "id long, sym string, px double, xs array<int>, m map<string,int>")
    dim = spark.createDataFrame([("a", "tech")], "sym string, sector string")
    joined = rows.join(dim, ["sym"], "left").where("px > 0").withColumn("n", F.col("px") * 2)
    for names in (["sector", "id", "n"], ["xs", "m", "sym"], []):
        assert selected_schema(joined.schema, names) == joined.select(*named(names)).schema  # nullability too


def test_a_name_that_is_not_exactly_one_field_is_left_to_spark(spark):
    df = spark.createDataFrame([(1, 2)], "Price int, qty int")
    assert selected_schema(df.schema, ["price"]) is None  # Spark matches it regardless of case: it says how
    assert selected_schema(df.schema, ["nope"]) is None
    twice = df.join(df, "qty")  # two fields named Price
    assert selected_schema(twice.schema, ["qty"]) is None


@pytest.mark.parametrize("name", ["table_with_column_mapping", "table_with_partitioning_mapping",
                                  "table-with-dv-small"])
def test_the_schema_a_table_is_read_with_is_known_without_reading_it(spark, tmp_path, name):
    """Column mapping (physical names renamed), partition values from the log, deletion vectors: the frame's
    columns and types are the table's own."""
    uri = str(tmp_path / name)
    shutil.copytree(TESTDATA / name, uri)
    info = table_info(name, uri)
    read = read_source(spark, snapshot_files(info, None, keep_null_files=True), info)
    assert read_schema(info).names == read.schema.names
    assert [f.dataType for f in read_schema(info).fields] == [f.dataType for f in read.schema.fields]
