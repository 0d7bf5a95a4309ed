"""A stage run's commit: the new rows of its partitions, and exact change data for refilled ones.

A refilled partition is recomputed whole and compared with the rows its output holds now (one
aggregation: EXCEPT ALL both ways), so the commit carries exact change data and downstream
retractable flows stay incremental. Nothing deleted: a plain append of the inserted rows (readers
see adds as inserts). Rows deleted: the refilled partitions' files are replaced, with the change
data beside them.

A partition refilled by key (keys.py) compares the keys' old and new rows the same way; its commit
removes the output files holding the keys' old rows and writes their other rows again, unchanged
(they are in no change data).

A small refill (what it reads, its dimensions and the kept rows under the driver-write bound)
is one Spark job: the net changes and the new rows come to the driver together, which counts them
and writes both outputs. Otherwise Spark writes the change data (counted in the same job), then
the new rows.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow.compute as pc
from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ..aggregates.algebra import EVENT_TS
from ..delta.tables import TableInfo
from ..output.commit import replace_ranges
from ..output.uncommitted import UncommittedFiles, collect_rows, write_uncommitted, write_uncommitted_rows
from ..run.context import RunContext
from ..run.metrics import RunMetrics
from ..run.plan import PartitionPlan, Reason
from ..run.reading import PART
from ..spark.frames import arrow_schema_of, named, observe, schema_change
from ..spark.read import CHANGE_TYPE
from ..spec.specs import StageSpec
from ..windows import partition_id
from .dedup import OutputReset, kept_rows, with_columns_of
from .keys import touched_rows

CHANGE_DATA = "_change_data/laminar"  # where a commit's change-data files are written before it names them


def transactions(ctx: RunContext, spec: StageSpec, plans: list[PartitionPlan], seqs: dict[str, int]) -> list:
    """The app transactions a commit of `plans` carries (one per partition)."""
    return [(ctx.layout.app_id(spec, p.partition), seqs[p.partition]) for p in plans]


def commit_meta(spec: StageSpec, plans: list[PartitionPlan], run_id: str) -> dict:
    """The commit metadata naming the run, its partitions, modes and reasons."""
    return {"laminar.run_id": run_id, "laminar.flow": spec.name,
            "laminar.partition": ",".join(p.partition for p in plans),
            "laminar.mode": ",".join(sorted({p.mode.value for p in plans})),
            "laminar.reason": ",".join(sorted({p.reason.value for p in plans}))}


def with_metrics(meta: dict, read: dict, files: UncommittedFiles) -> dict:
    """The commit's metadata with the run's metrics (what `laminar_system.runs` shows)."""
    return {**meta, "laminar.metrics": json.dumps({**read, "sink_rows": files.rows})}


def schema_matches(output: TableInfo | None, out: DataFrame | StructType) -> bool:
    """Whether the output table (None: there is none yet) can hold `out`'s rows (a frame, or their schema when
    known) as it is or by adding columns."""
    if output is None:
        return True
    return schema_change(output.schema, arrow_schema_of(out)) != "differs"


def commit_refill(ctx: RunContext, spec: StageSpec, plans: list[PartitionPlan], new_ref: DataFrame,
                  new_inc: DataFrame, seqs: dict[str, int], run_id: str, metrics: dict[str, RunMetrics], *,
                  small: bool, in_bytes: int, single: bool, output: TableInfo | None) -> None:
    """Commit a run with refilled partitions: `new_ref` holds their recomputed rows, `new_inc` the
    new rows of its incremental ones (both with `__p` and the event time). `metrics`: per
    partition, updated with sink_rows, rows_inserted and rows_deleted. `small`: the rows may go
    through the driver; `in_bytes`: what the pass read (the kept rows are added to it for the
    one-job path); `single`: one task, no shuffle. `output`: the output table as the run checked it out (None:
    there is none yet): its rows are read, and its commit made, on that snapshot (a commit since conflicts)."""
    uri = ctx.layout.sink_uri(spec)
    refill = [p for p in plans if p.refill]  # recomputed whole (keyed plans: their keys only)
    txns, meta = transactions(ctx, spec, plans, seqs), commit_meta(spec, plans, run_id)
    read = {m: sum(metrics[p.partition][m] for p in plans) for m in ("rows_read", "rows_rejected")}
    ids = {partition_id(p.partition, spec.granularity): p.partition for p in plans}
    data_cols = [c for c in new_ref.columns if c != EVENT_TS]
    new_ref, new_inc = new_ref.select(*named(data_cols)), new_inc.select(*named(data_cols))
    reset = any(p.reason is Reason.SPEC_CHANGED for p in plans) or not schema_matches(output, new_ref.drop(PART))
    if reset and len(refill) < len(plans):  # the reset drops every row: incremental partitions recompute too
        raise OutputReset([p.partition for p in plans if not p.refill])
    old, old_bytes = (None, 0) if reset else kept_rows(ctx, spec, refill, output)
    ranges = [p.interval for p in refill]
    touched = None if reset else touched_rows(ctx, spec, plans, output)
    rows = new_ref.unionByName(new_inc)
    if touched is not None:  # the keys' old rows are compared; the files' other rows are written again
        old = touched.old if old is None else old.unionByName(touched.old, allowMissingColumns=True)
        old_bytes += touched.bytes
        rows = rows.unionByName(with_columns_of(touched.rest, new_ref).select(*named(data_cols)))
    # replace_ranges' keywords every commit below passes (of several types: Any, not the join mypy infers)
    common: dict[str, Any] = dict(table_uri=uri, column=spec.event_time, transactions=txns, run_id=run_id, owner=spec.name,
                                  opened=output.table if output is not None else None)
    if old is None:  # nothing kept in the refilled partitions (or a new schema): every row is new
        files = write_uncommitted(new_ref if reset else new_ref.unionByName(new_inc), uri, run_id, by=PART, through_driver=small)
        if reset:
            files = files.plus(write_uncommitted(new_inc, uri, run_id + "-inc", by=PART, through_driver=small))
        replace_ranges(ctx.spark, files, ranges=ranges if reset else [], metadata=with_metrics(meta, read, files),
                       append_only=not reset, reset_on_schema_change=reset, **common)
        inserted, deleted = files.rows_by_partition(), {}
    else:
        old = with_columns_of(old, new_ref)  # columns the output gains read NULL in its kept rows
        changes = _net_changes(old.select(*named(data_cols)), new_ref, data_cols, single=single).unionByName(
            new_inc.withColumn(CHANGE_TYPE, F.lit("insert")))
        if small and in_bytes + old_bytes < ctx.options.driver_write_below_bytes:
            files, cdc, inserted, deleted = _write_collected(changes, rows, uri, run_id, data_cols)
        else:
            files, cdc, inserted, deleted = _write_in_spark(changes, rows, uri, run_id, ids, small=small)
        if any(deleted.values()):
            replace_ranges(ctx.spark, files, ranges=ranges, metadata=with_metrics(meta, read, files),
                           change_data=cdc, remove_files=touched.files if touched is not None else (), **common)
        else:  # nothing deleted: a plain commit of the inserted rows
            replace_ranges(ctx.spark, files, ranges=[], metadata=with_metrics(meta, read, files),
                           append_only=True, **common)
            inserted = files.rows_by_partition()
    written = files.rows_by_partition()
    for pid, key in ids.items():
        metrics[key].update(sink_rows=written.get(pid, 0), rows_inserted=inserted.get(pid, 0),
                            rows_deleted=deleted.get(pid, 0))


def _write_collected(changes: DataFrame, rows: DataFrame, uri: str, run_id: str, cols: list[str]) -> tuple:
    """One Spark job: the change data and every new row, tagged, collected; the driver counts the
    changes per partition and writes the rows to commit (the inserted ones when nothing was
    deleted) and, when something was, the change data. Returns (rows, change data or None,
    inserted, deleted)."""
    table = collect_rows(changes.unionByName(rows.withColumn(CHANGE_TYPE, F.lit(None).cast("string"))))
    is_row = pc.is_null(table[CHANGE_TYPE])
    change = table.filter(pc.invert(is_row))
    counts = {(r[PART], r[CHANGE_TYPE]): r["count_all"] for r in
              change.group_by([PART, CHANGE_TYPE]).aggregate([([], "count_all")]).to_pylist()}
    inserted = {pid: n for (pid, kind), n in counts.items() if kind == "insert"}
    deleted = {pid: n for (pid, kind), n in counts.items() if kind == "delete"}
    if not any(deleted.values()):
        inserts = change.filter(pc.equal(change[CHANGE_TYPE], "insert"))
        return write_uncommitted_rows(inserts, [(uri, run_id, cols)], by=PART)[0], None, inserted, deleted
    cdc = write_uncommitted_rows(change, [(uri, run_id, [*cols, CHANGE_TYPE])], by=PART, folder=CHANGE_DATA)[0]
    return write_uncommitted_rows(table.filter(is_row), [(uri, run_id, cols)], by=PART)[0], cdc, inserted, deleted


def _write_in_spark(changes: DataFrame, rows: DataFrame, uri: str, run_id: str, ids: dict[int, str], *,
                    small: bool) -> tuple:
    """Spark writes the change data (counted per partition in that job), then the rows to commit:
    every new row when something was deleted, else only the inserted ones (the change data is dropped)."""
    obs = Observation()
    cdc = write_uncommitted(observe(changes, obs, *_change_counts(ids)), uri, run_id, by=PART, folder=CHANGE_DATA)
    counts = obs.get
    deleted = {pid: int(counts.get(f"delete@{pid}") or 0) for pid in ids}
    inserted = {pid: int(counts.get(f"insert@{pid}") or 0) for pid in ids}
    if any(deleted.values()):
        return write_uncommitted(rows, uri, run_id, by=PART, through_driver=small), cdc, inserted, deleted
    cdc.discard()
    # inserts only, all of them rows this pass read (the change data also holds old rows)
    inserts = changes.where(F.col(CHANGE_TYPE) == "insert").drop(CHANGE_TYPE)
    return write_uncommitted(inserts, uri, run_id, by=PART, through_driver=small), None, inserted, deleted


def _net_changes(old: DataFrame, new: DataFrame, cols: list[str], *, single: bool) -> DataFrame:
    """Rows to delete and to insert to turn the multiset `old` into `new` (EXCEPT ALL both ways, as
    one aggregation: Spark rewrites each EXCEPT ALL into the same union, sum and replicate).
    `single`: in one task (every row in one partition satisfies the grouping: no shuffle)."""
    both = old.select(*named(cols), F.lit(-1).alias("__d")).unionByName(new.select(*named(cols), F.lit(1).alias("__d")))
    if single:
        both = both.coalesce(1)
    net = both.groupBy(*named(cols)).agg(F.sum("__d").alias("__n")).where(F.col("__n") != 0)
    kind = F.expr("explode(array_repeat(CASE WHEN __n < 0 THEN 'delete' ELSE 'insert' END, CAST(abs(__n) AS INT)))")
    return net.select(*named(cols), kind.alias(CHANGE_TYPE))


def _change_counts(ids: dict[int, str]) -> list:
    """Observed deletes and inserts per partition number (SQL text: one Py4J call per metric)."""
    return [F.expr(f"sum(CASE WHEN {PART} = {pid} AND {CHANGE_TYPE} = '{kind}' THEN 1 ELSE 0 END) AS `{kind}@{pid}`")
            for pid in ids for kind in ("delete", "insert")]
