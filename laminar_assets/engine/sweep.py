"""The quarantine sweep: rows no partition owns (no usable or an out-of-bounds event time).

A row with a usable event time is quarantined by the run of its partition. A row
without one belongs to no partition, so each flow's *sweep* records it: once per
new source version, under its own lease, at the start of any run of the flow.
Files whose statistics prove every event time present and in bounds are not read,
so on clean data the sweep costs no Spark job.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from laminar_assets.errors import ConcurrentRunError

from . import quarantine as qr
from .aggregates import EVENT_TS, SIGN
from .delta_log import DataFile
from .delta_source import TableInfo, source_history, snapshot_files, table_info, temporal
from .layout import RunContext
from .plan import PartitionPlan
from .quarantine import PARTITION_KEY, ROW, RULE, VERSION
from .fact_joins import without_joins
from .reading import DVER, SNAP, SRC
from .row_prep import prepare
from .spark_read import CHANGE_TYPE, read_source


def sweep(ctx: RunContext, spec, plan: PartitionPlan, run_id: str, *,
          opened: dict[str, TableInfo] | None = None) -> dict[str, int]:
    """Quarantine the partition-less rows of the source versions up to `plan.to_versions` the flow
    has not swept yet; returns new rows by rule. Idempotent; one sweeper per flow at a time.
    `opened`: sources the run opened already (`RunInputs.infos`), used when at the version swept."""
    done = ctx.store.load_sweep(spec.name, spec.spec_hash)
    todo = {s: v for s, v in plan.to_versions.items() if s in spec.sources and done.get(s, -1) < v}
    if not todo:
        return {}
    try:
        lease = ctx.store.lease(spec.name, "_sweep", run_id)
        lease.__enter__()
    except ConcurrentRunError:  # another run of this flow is sweeping these versions
        return {}
    counts: dict[str, int] = {}
    try:
        done = ctx.store.load_sweep(spec.name, spec.spec_hash)
        for src, target in todo.items():
            if done.get(src, -1) >= target:
                continue
            info = (opened or {}).get(src)
            if info is None or info.version != target:
                info = table_info(src, ctx.layout.table_uri(src), target)
            frame, size = _unswept(ctx, spec, info, done.get(src), target)
            if frame is not None:
                rows = prepare(spec, without_joins(spec, frame)).where(~qr.assigned(spec))
                rows = rows.withColumn(RULE, F.coalesce(F.col(RULE), qr.unassigned_rule(spec)))
                rows = rows.withColumn(PARTITION_KEY, F.lit(None).cast("string"))
                new = qr.record(ctx.spark, rows.select(PARTITION_KEY, RULE, ROW, VERSION, EVENT_TS),
                                uri=ctx.layout.quarantine_uri(src), flow=spec.name, run_id=run_id,
                                through_driver=size < ctx.options.driver_write_below_bytes)
                for rule, n in new.get(None, {}).items():
                    counts[rule] = counts.get(rule, 0) + n
            done[src] = target
            ctx.store.save_sweep(spec.name, spec.spec_hash, done)
    finally:
        lease.__exit__(None, None, None)
    return counts


def _unswept(ctx: RunContext, spec, info: TableInfo, done: int | None, target: int) -> tuple[DataFrame | None, int]:
    """Rows of source `info` (at version `target`) added after version `done` that may lack a usable
    event time, and the bytes of the files they come from."""
    src, uri = info.name, info.uri
    provable = temporal(info.schema, spec.event_time)
    bounds = spec.bounds

    def may_hold(f: DataFile) -> bool:
        if not provable or f.time_nulls is None or f.time_nulls > 0 or f.time_range is None:
            return True
        return bounds is not None and not (bounds.start <= f.time_range.start and f.time_range.end <= bounds.end)

    def tagged(df: DataFrame, version) -> DataFrame:
        return (df.withColumn(SRC, F.lit(src)).withColumn(DVER, F.lit(None).cast("long"))
                .withColumn(SNAP, F.lit(False)).withColumn(VERSION, F.lit(version).cast("long")))

    history = source_history(src, uri, done, target, spec.event_time, info=info) if done is not None else None
    if history is None or history.expired:
        files = [f for f in snapshot_files(info, spec.event_time, keep_null_files=True) if may_hold(f)]
        if not files:
            return None, 0
        return tagged(read_source(ctx.spark, files, info).withColumn(SIGN, F.lit(1)), target), sum(f.size for f in files)
    frames, size = [], 0
    for commit in history.commits:
        # rewrites without change data may add rows too (an update that nulls the event time)
        # (a file whose deletion vector changed adds no row: its rows were swept when it was added)
        files = [f for f in (commit.cdc or [a for a in commit.adds if a.dv_change is None]) if may_hold(f)]
        if not files:
            continue
        size += sum(f.size for f in files)
        df = read_source(ctx.spark, files, info, change_data=bool(commit.cdc))
        if commit.cdc:  # inserted rows only: a deleted row was recorded when it was added
            df = df.where(F.col(CHANGE_TYPE).isin("insert", "update_postimage")).drop(CHANGE_TYPE)
        frames.append(tagged(df.withColumn(SIGN, F.lit(1)), commit.version))
    if not frames:
        return None, 0
    out = frames[0]
    for df in frames[1:]:
        out = out.unionByName(df)
    return out, size
