"""A flow's other fact tables: joined to its source rows, each read whole at its pinned version."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ..delta.tables import snapshot_files
from ..spark.read import read_source
from .inputs import RunInputs


def join_facts(spark: SparkSession, spec, rows: DataFrame, inputs: RunInputs) -> DataFrame:
    """A flow's source rows joined with its other fact tables (each read whole at its pinned version),
    their columns named `<alias>__<column>`. A flow without joins gets `rows` back."""
    for join in spec.fact_joins:
        info = inputs.dims[join.table]
        side = read_source(spark, snapshot_files(info, None), info)
        side = side.select(*[F.col(c).alias(join.column(c)) for c in join.columns])
        rows = rows.join(side, F.expr(join.on), join.how)
    return rows


def joined_columns(spec) -> list[str]:
    """The names a flow's joined fact-table columns get in its rows (`<alias>__<column>`)."""
    return [join.column(c) for join in spec.fact_joins for c in join.columns]


def without_joins(spec, rows: DataFrame) -> DataFrame:
    """`rows` with a flow's joined columns as typeless NULLs: for rows no window will hold (the sweep),
    whose derived columns and filter must still resolve but never join anything."""
    for join in spec.fact_joins:
        for c in join.columns:
            rows = rows.withColumn(join.column(c), F.lit(None))
    return rows
