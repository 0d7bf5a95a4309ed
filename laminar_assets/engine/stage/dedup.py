"""The rows a stage keeps: one per dedup key and partition, and appended rows checked against the
rows the output table keeps already (the earliest row of a key wins; a new row that sorts before a
kept one means its partition must refill)."""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame, Observation, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ..aggregates.algebra import EVENT_TS
from ..delta.tables import TableInfo, snapshot_files
from ..run.context import RunContext
from ..run.plan import PartitionPlan
from ..run.reading import PART, with_partition
from ..spark import stable_sql
from ..spark.frames import named, observe, spark_schema
from ..spark.read import read_source
from ..spec.specs import StageSpec
from ..windows import partition_id


class DedupReplaced(Exception):
    """Appended rows would replace rows already kept: these partitions must refill."""

    reason = "DEDUP_REPLACED_ROW"

    def __init__(self, partitions: list[str]) -> None:
        super().__init__(f"dedup replaced kept rows in {partitions}")
        self.partitions = partitions


class OutputReset(DedupReplaced):
    """The output table must be reset to a new schema (a column's type changed or went): the rows it
    keeps of these incrementally planned partitions would be lost, so they must refill too."""

    reason = "SCHEMA_CHANGED"


def order_key(spec: StageSpec, cols: list[str]) -> list[str]:
    """The columns that order a key's rows: the earliest event first, then the other values."""
    return [EVENT_TS] + [c for c in cols if c not in spec.dedup_key]


def deduped(spec: StageSpec, good: DataFrame, columns: Sequence[str] | None = None) -> DataFrame:
    """Output rows (plus `__p` and the event time) with one row per dedup key and partition, in the order of
    `deduped_columns`. `columns`: `good`'s columns when known (else Spark is asked)."""
    names = deduped_columns(spec, good.columns if columns is None else columns)
    out, cols = good.select(*named(names)), names[1:-1]  # the output columns between `__p` and the event time
    if spec.dedup_key:
        w = Window.partitionBy(PART, *named(spec.dedup_key)).orderBy(*named(order_key(spec, cols)))
        out = out.withColumn("__rk", F.row_number().over(w)).where(F.col("__rk") == 1).drop("__rk")
    return out


def deduped_columns(spec: StageSpec, columns: Sequence[str]) -> list[str]:
    """The columns of `deduped`'s rows (in its order), given those of the rows it dedups."""
    return [PART, *output_columns(spec, columns), EVENT_TS]


def kept_rows(ctx: RunContext, spec: StageSpec, plans: list[PartitionPlan],
              output: TableInfo | None) -> tuple[DataFrame | None, int]:
    """The rows the output table (`output`: as the run checked it out; None: there is none yet) holds in the
    plans' partitions (with `__p` and the event time), and the bytes of the files holding them; (None, 0) when it
    holds none."""
    if not plans or output is None:
        return None, 0
    parts = [p.interval for p in plans]
    info = output
    files = snapshot_files(info, spec.event_time, parts)
    if not files:
        return None, 0
    from ..run.validate import event_time_column

    df = read_source(ctx.spark, files, info)
    inside = F.expr(stable_sql.in_ranges_sql(EVENT_TS, parts, spec.granularity))  # same code every run
    read = read_schema(info)  # the frame's schema, as read_source reads the table (no analysis)
    dtype = read[spec.event_time].dataType if spec.event_time in read.names else None
    df = df.withColumn(EVENT_TS, event_time_column(df, spec.event_time, dtype)).where(inside)
    return with_partition(df, spec, EVENT_TS), sum(f.size for f in files)


def kept_columns(output: TableInfo) -> list[str]:
    """The columns of `kept_rows`' frame, known without asking Spark: the output table's as `read_source`
    reads them, the event time and `__p`."""
    return list(dict.fromkeys([*read_schema(output).names, EVENT_TS, PART]))


def with_columns_of(kept: DataFrame, new: DataFrame | StructType, kept_names: Sequence[str] | None = None) -> DataFrame:
    """`kept` (rows of the output table) with the columns `new` rows have and it lacks, as NULL: a
    column the source gained reads NULL in rows written before it existed. `new`: the new rows, or their
    schema when known; `kept_names`: `kept`'s columns when known (else Spark is asked)."""
    have = set(kept.columns if kept_names is None else kept_names)
    for f in (new if isinstance(new, StructType) else new.schema).fields:
        if f.name not in have:
            kept = kept.withColumn(f.name, F.lit(None).cast(f.dataType))
    return kept


def dedup_against_kept(ctx: RunContext, spec: StageSpec, plans: list[PartitionPlan], new: DataFrame,
                       output: TableInfo | None, *, lost: Observation | None = None,
                       new_schema: StructType | None = None) -> DataFrame:
    """`new` without the rows whose key the output keeps already. A new row that sorts before the
    kept one would replace it: raises `DedupReplaced` (one Spark job), or, given `lost`, counts such
    rows per partition in the job that consumes the result (see `replaced`). `new_schema`: `new`'s schema
    when known (else Spark is asked)."""
    existing, _ = kept_rows(ctx, spec, plans, output)
    if existing is None:  # nothing kept in these partitions: nothing to replace (still observed, as 0)
        return new if lost is None else observe(new, lost, *_lost_counts(spec, plans, "false"))
    assert output is not None  # rows are kept in it
    new_schema = new_schema or new.schema
    existing = with_columns_of(existing, new_schema, kept_columns(output))
    cols = [c for c in new_schema.names if c not in (PART, EVENT_TS)]
    order = order_key(spec, cols)
    key = [PART, *spec.dedup_key]
    old = existing.select(*named(key), F.struct(*named(order)).alias("__old"))
    joined = new.withColumn("__new", F.struct(*named(order))).join(old, key, "left")
    if lost is not None:
        joined = observe(joined, lost, *_lost_counts(spec, plans, "__old IS NOT NULL AND __new < __old"))
    else:
        found = joined.where(F.col("__old").isNotNull() & (F.col("__new") < F.col("__old"))).select(PART).distinct().collect()
        if found:
            ids = {r[PART] for r in found}
            raise DedupReplaced([p.partition for p in plans if partition_id(p.partition, spec.granularity) in ids])
    return joined.where(F.col("__old").isNull()).drop("__new", "__old")


def _lost_counts(spec: StageSpec, plans: list[PartitionPlan], cond: str) -> list:
    return [F.expr(f"count(CASE WHEN {PART} = {partition_id(p.partition, spec.granularity)} AND {cond} THEN 1 END)"
                   f" AS `lost@{p.partition}`") for p in plans]


def replaced(spec: StageSpec, plans: list[PartitionPlan], counts: dict) -> list[str]:
    """The partitions where `dedup_against_kept` observed a new row replacing a kept one."""
    return [p.partition for p in plans if counts.get(f"lost@{p.partition}")]


def read_schema(info: TableInfo) -> StructType:
    """The Spark schema `read_source` reads `info`'s rows with (its logical columns, variants as variants)."""
    return spark_schema(info.schema, info.delta_schema)


def output_columns(spec: StageSpec, columns: Sequence[str]) -> list[str]:
    """The stage's output columns, given the columns of its joined rows."""
    if spec.columns:
        return list(spec.columns)
    base = [c for c in columns if not c.startswith("__") and c not in {c2 for j in spec.joins for c2 in j.columns}]
    return base + [c for j in spec.joins for c in j.columns if c not in base]
