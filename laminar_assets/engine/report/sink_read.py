"""A sink's rows for some partitions: a Spark DataFrame, or, when they are few, read by the driver.

Checks validate the partitions a run changed, usually a few thousand rows. Fetching them through
Spark costs a job (more over Spark Connect); reading the same Parquet files with pyarrow costs
next to nothing. The driver reads only what it can read exactly as Spark would:
local files without deletion vectors, no column mapping, no partition columns, at most a given
number of bytes. Anything else is left to Spark.
"""

from __future__ import annotations

from datetime import datetime

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from laminar_assets.errors import LaminarError

from ..delta.tables import is_delta_table, read_in_driver, snapshot_files, table_info
from ..run.context import RunContext
from ..spark.frames import spark_schema
from ..spark.read import read_source
from ..spec.specs import Spec
from ..windows import Interval, in_ranges, partition_interval

UTC_NAMES = ("UTC", "Etc/UTC", "GMT", "Z", "+00:00")  # session time zones in which `to_pandas` matches Spark


def time_column(spec: Spec) -> str:
    """The sink column a partition's rows are found by: a flow's window start, a stage's event time."""
    return spec.output_time_column


def _files(ctx: RunContext, spec: Spec, partitions: list[str]):
    uri = ctx.layout.sink_uri(spec)
    if not is_delta_table(uri):
        raise LaminarError(f"sink table of '{spec.name}' does not exist yet", flow=spec.name)
    parts = [partition_interval(p, spec.granularity) for p in partitions]
    info = table_info(spec.sink_name, uri)
    return info, snapshot_files(info, time_column(spec), parts), parts


def sink_frame(ctx: RunContext, spec: Spec, partitions: list[str]) -> tuple[DataFrame, int]:
    """The sink rows of `partitions` (one table open) as a lazy DataFrame, and the bytes of their files."""
    info, files, parts = _files(ctx, spec, partitions)
    return read_source(ctx.spark, files, info).where(in_ranges(time_column(spec), parts)), sum(f.size for f in files)


def sink_table(ctx: RunContext, spec: Spec, partitions: list[str], *, max_bytes: int) -> dict[str, pa.Table] | None:
    """The sink rows of each partition read by the driver (pyarrow, no Spark job), in the table's
    schema; None when Spark must read them (`read_in_driver`)."""
    info, files, parts = _files(ctx, spec, partitions)
    if not pa.types.is_timestamp(info.schema.field(time_column(spec)).type):
        return None  # e.g. a stage's string event times: Spark's comparison casts them
    table = read_in_driver(info, files, max_bytes=max_bytes)
    if table is None:
        return None
    column = table.column(time_column(spec))
    return {key: table.filter(_within(column, part)) for key, part in zip(partitions, parts)}


def _within(column: pa.ChunkedArray, part: Interval) -> pa.ChunkedArray:
    def at(t: datetime) -> pa.Scalar:
        return pa.scalar(t, type=column.type)

    return pc.fill_null(pc.and_(pc.greater_equal(column, at(part.start)), pc.less(column, at(part.end))), False)


def first_rows(table: pa.Table, column: str, limit: int):
    """The first `limit` rows of `table` by `column` (nulls first, as Spark's ascending order), as `to_pandas`."""
    order = pc.sort_indices(table, sort_keys=[(column, "ascending")], null_placement="at_start")
    return to_pandas(table.take(order[:limit]))


def to_pandas(table: pa.Table, *, timezone: str = "UTC"):
    """`table` as the pandas frame Spark's `toPandas()` gives for the same rows (its own Arrow to
    pandas conversion: naive timestamps in the session's time zone, dates as objects)."""
    # pyspark's toPandas helper, so that a check sees the same types whichever path fetched the rows
    from pyspark.sql.pandas.conversion import _convert_arrow_table_to_pandas

    return _convert_arrow_table_to_pandas(table, spark_schema(table.schema), timezone=timezone,
                                          struct_handling_mode="legacy", date_as_object=True)
