"""A stage's changed keys: which dedup keys the deletes and updates of a run touch, and the output
rows of those keys, so a refill recomputes those keys of a partition instead of all of it.

A stage keeps one row per dedup key and partition, so a delete or an update of a row concerns
only its key's rows in that partition. A key is named by `key_hash_sql` (xxhash64 of the dedup
key columns), on the source rows and on the output rows alike. The planner weighs the keys
against the partition's output rows (`planner._key_scope`); the pass then takes those keys'
rows from the pinned snapshot (`row_prep.keep_sql`), and the commit replaces the output files
holding their old rows (`touched_rows`): the files' other rows are written again unchanged, and
the change data is exact (the old and new rows of the keys).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ..aggregates.algebra import EVENT_TS
from ..aggregates.base import q
from ..delta.file_ranges import KeyProbe
from ..delta.log import DataFile
from ..delta.tables import TableInfo, is_delta_table, snapshot_files, table_info
from ..quarantine import records as qr
from ..run.context import RunContext
from ..run.inputs import RunInputs
from ..run.plan import ChangedGroups, PartitionPlan
from ..run.reading import PART, change_markers, group_values_sql, read_set, rows_query, with_partition
from ..run.row_prep import keep_sql, key_values, prepare_query, refilled_groups_sql
from ..spark.frames import interpreted
from ..spark.read import read_source
from ..spec.specs import StageSpec
from ..windows import Interval, partition_id, partition_id_sql, partition_interval
from .dedup import DedupReplaced

_FILE = "__file"


class KeysNotSeparable(DedupReplaced):
    """The old rows of the changed keys sit in output files that cannot be rewritten alone (a file
    with a deletion vector, one reaching beyond the partitions refilled by key, or one a whole
    refill of the same pass replaces): these partitions are recomputed whole."""

    reason = "NON_APPEND_ON_NON_RETRACTABLE"


def key_hash_sql(spec: StageSpec) -> str | None:
    """SQL of a row's key: xxhash64 of the dedup key columns. None when keys cannot be refilled
    alone: no dedup key, a key column that a dimension join brings (not on the source rows), or
    one the output leaves out (its rows could not be named)."""
    joined = {c for j in spec.joins for c in j.columns}
    if not spec.dedup_key or joined & set(spec.dedup_key) or (spec.columns and set(spec.dedup_key) - set(spec.columns)):
        return None
    return f"xxhash64({', '.join(q(c) for c in spec.dedup_key)})"


def keyed(plans: list[PartitionPlan]) -> list[PartitionPlan]:
    """The plans that recompute keys alone."""
    return [p for p in plans if p.refill_groups]


def in_keys_sql(spec: StageSpec, plans: list[PartitionPlan], at: str) -> str:
    """Whether a row (timestamp column `at`) holds a key the plans recompute alone, in their partitions."""
    return refilled_groups_sql(spec, keyed(plans), at, key_hash_sql(spec), group_values_sql(spec, plans))


def changed_keys(ctx: RunContext, spec: StageSpec, plans: list[PartitionPlan], inputs: RunInputs, *,
                 most: int) -> dict[str, ChangedGroups]:
    """The keys the deletes and updates each plan takes touch, per partition: how many, their hashes
    and their values (None when more than `most`: the partition is recomputed whole, and its keys need
    not reach the driver). One Spark job over their change rows only. Both sides of an update count: a
    row moved to another partition names its key in both."""
    markers = change_markers(spec, plans, inputs)
    reads = read_set(spec, markers, inputs)
    rows = prepare_query(spec, rows_query(ctx.spark, spec, reads, inputs), inputs)
    rows = rows.where(qr.assigned_sql(spec)).add_columns([(PART, partition_id_sql(EVENT_TS, spec.granularity))])
    rows = rows.where(keep_sql(spec, markers, EVENT_TS))
    if reads.total_bytes < ctx.options.single_task_below_bytes:  # one task: both aggregations without a shuffle
        rows = rows.select(["*"], hint="COALESCE(1)")
    key, cols = key_hash_sql(spec), [q(c) for c in spec.dedup_key]
    assert key is not None  # plans refill by key only a stage whose keys have a hash (the planner asks key_hash_sql)
    pairs = rows.select([PART, f"struct({key}, {', '.join(cols)}) AS __key"], group=[PART, key, *cols])
    with interpreted(ctx.spark, reads.total_bytes < ctx.options.interpreted_below_bytes):  # see stage/job.py
        found = pairs.select([PART, "count(*) AS n", f"CASE WHEN count(*) <= {int(most)} THEN collect_list(__key) END AS keys"],
                             group=[PART]).run(ctx.spark).collect()
    ids = {partition_id(p.partition, spec.granularity): p.partition for p in plans}
    out = {p.partition: ChangedGroups(0, (), ()) for p in plans}
    for row in found:
        k = ids.get(row[PART])
        if k is None:
            continue
        if row["keys"] is None:
            out[k] = ChangedGroups(int(row["n"]), None)
            continue
        out[k] = ChangedGroups(int(row["n"]), tuple(r[0] for r in row["keys"]), key_values(tuple(r)[1:] for r in row["keys"]))
    return out


def output_size(spec: StageSpec, uri: str, partition: str) -> tuple[int | None, int, str | None]:
    """The output's rows (None when a file's statistics lack them) and bytes in one partition, and
    why its files cannot be rewritten by key (None when they can): a file without event-time
    statistics or with a deletion vector."""
    if not is_delta_table(uri):
        return 0, 0, None
    files = snapshot_files(table_info(spec.sink_name, uri), spec.event_time, [partition_interval(partition, spec.granularity)])
    rows = None if any(f.rows is None for f in files) else sum(f.rows or 0 for f in files)
    why = ("a file of it has no event-time statistics" if any(f.time_range is None for f in files) else
           "a file of it has a deletion vector" if any(f.deleted is not None for f in files) else None)
    return rows, sum(f.size for f in files), why


@dataclass
class TouchedRows:
    """The output files holding rows of the changed keys, split: `old` the keys' rows (replaced by
    the recompute), `rest` the files' other rows (written again unchanged). Both with `__p` and the
    event time."""

    files: list[DataFile]
    old: DataFrame
    rest: DataFrame

    @property
    def bytes(self) -> int:
        return sum(f.size for f in self.files)


def touched_rows(ctx: RunContext, spec: StageSpec, plans: list[PartitionPlan],
                 output: TableInfo | None) -> TouchedRows | None:
    """The output rows of the keys the plans recompute alone, and the files holding them (one Spark
    job finds the files, and whether each holds rows of other partitions, unless the statistics
    leave one file per partition inside it: `_one_file_each`); None when the output
    holds none. Raises `KeysNotSeparable` when a file cannot be rewritten alone: it holds rows of
    a partition not recomputed by key (another hour, one the pass recomputes whole). `output`: the output table as
    the run checked it out (None: there is none yet)."""
    mine = keyed(plans)
    if not mine or output is None:
        return None
    from ..run.validate import event_time_column

    info = output
    parts = [p.interval for p in mine]
    files = snapshot_files(info, spec.event_time, parts, bounds_of=spec.dedup_key)
    if all(p.group_keys for p in mine):  # files whose key statistics exclude every key keep their rows
        probe = KeyProbe(v for p in mine for v in p.group_keys)
        files = [f for f in files if probe.may_hold(f.bounds)]
    if not files:
        return None

    def rows(of: list[DataFile], **kw) -> DataFrame:
        df = read_source(ctx.spark, of, info, **kw)
        df = df.withColumn(EVENT_TS, event_time_column(df, spec.event_time))
        return with_partition(df, spec, EVENT_TS)

    vectors = [f for f in files if f.deleted is not None]  # rows read by position: not by file name
    if vectors:
        raise KeysNotSeparable(sorted({p.partition for p in mine for f in vectors
                                       if f.time_range is None or f.time_range.overlaps(p.interval)})
                               or [p.partition for p in mine])
    inside = in_keys_sql(spec, mine, EVENT_TS)
    if _one_file_each(files, mine):  # no search: that file is the only one that may hold its keys' rows
        both = rows(files)
        return TouchedRows(files, both.where(inside), both.where(f"NOT coalesce({inside}, false)"))
    # exact partitions, not the files' statistics: those are widened to the millisecond, so a file
    # whose last row is in the hour's last millisecond would seem to reach into the next hour
    ids = ", ".join(str(partition_id(p.partition, spec.granularity)) for p in mine)
    found = rows(files, file_name=_FILE).groupBy(_FILE).agg(
        F.max(F.expr(f"CASE WHEN coalesce({inside}, false) THEN 1 ELSE 0 END")).alias("keys"),
        F.max(F.expr(f"CASE WHEN {PART} IN ({ids}) THEN 0 ELSE 1 END")).alias("outside")).where("keys = 1").collect()
    names = {r[_FILE]: bool(r["outside"]) for r in found}
    touched = [f for f in files if _name(f) in names]
    if len(touched) < len(names):  # a name the output's files do not have: the keys' rows cannot be told apart
        raise KeysNotSeparable([p.partition for p in mine])
    if not touched:
        return None
    bad = [f for f in touched if names[_name(f)]]
    if bad:
        raise KeysNotSeparable([p.partition for p in mine if any(f.time_range is None or f.time_range.overlaps(p.interval)
                                                                 for f in bad)] or [p.partition for p in mine])
    both = rows(touched)
    return TouchedRows(touched, both.where(inside), both.where(f"NOT coalesce({inside}, false)"))


def _one_file_each(files: list[DataFile], plans: list[PartitionPlan]) -> bool:
    """Whether each partition refilled by key has at most one file that may hold its keys' rows, and
    every such file lies inside one of those partitions by its statistics (no NULL event time, no
    reach into a neighbour, which the millisecond widening of a row in an hour's last millisecond
    also counts as). Then the files are known without a Spark job: one that turns out to hold none
    of the keys is written again unchanged, its rows in no change data."""
    time_ranges: list[Interval] = []
    for f in files:
        if f.time_range is None or f.time_nulls != 0 or not any(
                p.interval.start <= f.time_range.start and f.time_range.end <= p.interval.end for p in plans):
            return False
        time_ranges.append(f.time_range)
    return all(sum(r.overlaps(p.interval) for r in time_ranges) <= 1 for p in plans)


def _name(f: DataFile) -> str:
    return f.uri.rstrip("/").rsplit("/", 1)[-1]


__all__ = ["KeysNotSeparable", "TouchedRows", "changed_keys", "in_keys_sql", "key_hash_sql", "keyed",
           "output_size", "touched_rows"]
