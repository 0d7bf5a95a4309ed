"""One Spark pass over every partition a stage run touches: rows, dedup, joins, one commit.

A stage keeps no state: its output table holds its rows. Refilled partitions are
recomputed whole (dedup is within a partition) and compared with their old rows
(one aggregation: EXCEPT ALL both ways), so the commit carries exact change data and downstream
retractable flows stay incremental. Appended rows of incremental partitions are
checked against the rows already kept (dedup); a new row that would replace a kept
duplicate refills its partition instead (DEDUP_REPLACED_ROW).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import pyarrow as pa
from deltalake import DeltaTable
from pyspark.sql import DataFrame, Observation, Window
from pyspark.sql import functions as F

from . import quarantine as qr
from .aggregates import EVENT_TS, SIGN
from .delta_source import snapshot_files, table_info
from .delta_write import replace_ranges
from .inputs import RunInputs
from .layout import RunContext
from .plan import Mode, PartitionPlan, Reason
from .quarantine import PARTITION_KEY, ROW, RULE, VERSION
from .reading import PART, keep, prepare, read_rows, read_set, with_partition
from .spark_io import StagedFiles, arrow_schema_of, interpreted, nullable, observe, stage
from .spark_read import CHANGE_TYPE, read_source
from .spec import StageSpec
from .windows import in_ranges, partition_id, partition_key_column


class DedupReplaced(Exception):
    """Appended rows would replace rows already kept: these partitions must refill."""

    def __init__(self, partitions: list[str]) -> None:
        super().__init__(f"dedup replaced kept rows in {partitions}")
        self.partitions = partitions


@dataclass
class PassResult:
    metrics: dict[str, dict] = field(default_factory=dict)
    quarantined: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # read (rows cached), write (diff and commit)


def run_pass(ctx: RunContext, spec: StageSpec, plans: list[PartitionPlan], seqs: dict[str, int],
             inputs: RunInputs, run_id: str) -> PassResult:
    out = PassResult()
    reads = read_set(spec, plans, inputs)
    with interpreted(ctx.spark, reads.total_bytes < ctx.options.interpreted_below_bytes):  # see flow_job
        rows = prepare(spec, read_rows(ctx.spark, spec, reads, inputs), inputs).where(qr.assigned(spec))
        rows = with_partition(rows, spec, EVENT_TS).where(keep(spec, plans, EVENT_TS))
        joined = _join_dimensions(ctx, spec, rows, inputs)
        obs = Observation()
        rejected = F.col(RULE).isNotNull() & (F.col(SIGN) > 0)
        exprs = []  # SQL text: a Column tree costs a Py4J round trip per node in local mode
        for p in plans:
            mine = f"{PART} = {partition_id(p.partition, spec.granularity)}"
            exprs += [F.expr(f"count(CASE WHEN {mine} THEN 1 END) AS `rows@{p.partition}`"),
                      F.expr(f"count(CASE WHEN {mine} AND {RULE} IS NOT NULL AND {SIGN} > 0 THEN 1 END)"
                             f" AS `rejected@{p.partition}`")]
        joined = observe(joined, obs, *exprs).persist()
        try:
            t0 = time.perf_counter()
            joined.count()  # one job: read, join and cache the rows (and fill the observed metrics)
            counts = obs.get
            new = _deduped(spec, joined.where(F.col(RULE).isNull()))
            refill = [p for p in plans if p.mode is Mode.REFILL]
            incremental = [p for p in plans if p.mode is not Mode.REFILL]
            new_inc = new.where(_in_partitions(spec, incremental))
            if incremental and spec.dedup_key:
                new_inc = _dedup_against_sink(ctx, spec, incremental, new_inc)
            new_ref = new.where(_in_partitions(spec, refill))
            for p in plans:
                out.metrics[p.partition] = {"rows_read": int(counts.get(f"rows@{p.partition}") or 0),
                                            "rows_rejected": int(counts.get(f"rejected@{p.partition}") or 0)}
            if any(m["rows_rejected"] for m in out.metrics.values()):
                out.quarantined = _quarantine(ctx, spec, joined.where(rejected), run_id)
            ctx.hook("after_read")
            t1 = time.perf_counter()
            _commit(ctx, spec, plans, refill, new_ref, new_inc, seqs, run_id, out)
            out.seconds = {"read": t1 - t0, "write": time.perf_counter() - t1}
        finally:
            joined.unpersist()
    ctx.hook("after_state_commit")
    ctx.hook("after_sink_commit")
    return out


def _join_dimensions(ctx: RunContext, spec: StageSpec, rows: DataFrame, inputs: RunInputs) -> DataFrame:
    joined = rows
    for join in spec.joins:
        info = inputs.dims[join.table]
        dim = read_source(ctx.spark, snapshot_files(info, None), info)
        dim = dim.select(*join.on, *join.columns).withColumn(f"__m_{join.table}", F.lit(True))
        joined = joined.join(dim, list(join.on), "left")
    unmatched = F.lit(None).cast("string")
    for join in reversed(spec.joins):
        if join.how == "inner":
            unmatched = F.when(F.col(f"__m_{join.table}").isNull(), F.lit(f"unmatched_{join.table}")).otherwise(unmatched)
    return joined.withColumn(RULE, F.coalesce(F.col(RULE), unmatched))


def output_columns(spec: StageSpec, columns: list[str]) -> list[str]:
    """The stage's output columns, given the columns of its joined rows."""
    if spec.columns:
        return list(spec.columns)
    base = [c for c in columns if not c.startswith("__") and c not in {c2 for j in spec.joins for c2 in j.columns}]
    return base + [c for j in spec.joins for c in j.columns if c not in base]


def _order(spec: StageSpec, cols: list[str]) -> list[str]:
    return [EVENT_TS] + [c for c in cols if c not in spec.dedup_key]


def _deduped(spec: StageSpec, good: DataFrame) -> DataFrame:
    """Output rows (plus `__p` and the event time) with one row per dedup key and partition."""
    cols = output_columns(spec, good.columns)
    out = good.select(PART, *cols, EVENT_TS)
    if spec.dedup_key:
        w = Window.partitionBy(PART, *spec.dedup_key).orderBy(*_order(spec, cols))
        out = out.withColumn("__rk", F.row_number().over(w)).where(F.col("__rk") == 1).drop("__rk")
    return out


def _in_partitions(spec: StageSpec, plans: list[PartitionPlan]):
    ids = [partition_id(p.partition, spec.granularity) for p in plans]
    return F.col(PART).isin(*ids) if ids else F.lit(False)


def _sink_rows(ctx: RunContext, spec: StageSpec, plans: list[PartitionPlan]) -> DataFrame | None:
    """The rows the output table holds now in the plans' partitions (with `__p` and the event time)."""
    uri = ctx.layout.sink_uri(spec)
    if not plans or not DeltaTable.is_deltatable(uri):
        return None
    parts = [p.interval for p in plans]
    info = table_info(spec.sink, uri)
    files = snapshot_files(info, spec.event_time, parts)
    if not files:
        return None
    from .validate import event_time_column

    df = read_source(ctx.spark, files, info)
    df = df.withColumn(EVENT_TS, event_time_column(df, spec.event_time)).where(in_ranges(EVENT_TS, parts))
    return with_partition(df, spec, EVENT_TS)


def _dedup_against_sink(ctx: RunContext, spec: StageSpec, plans: list[PartitionPlan], new: DataFrame) -> DataFrame:
    existing = _sink_rows(ctx, spec, plans)
    if existing is None:
        return new
    cols = [c for c in new.columns if c not in (PART, EVENT_TS)]
    order = _order(spec, cols)
    key = [PART, *spec.dedup_key]
    old = existing.select(*key, F.struct(*[F.col(c) for c in order]).alias("__old"))
    joined = new.withColumn("__new", F.struct(*[F.col(c) for c in order])).join(old, key, "left")
    lost = joined.where(F.col("__old").isNotNull() & (F.col("__new") < F.col("__old"))).select(PART).distinct().collect()
    if lost:
        ids = {r[PART] for r in lost}
        raise DedupReplaced([p.partition for p in plans if partition_id(p.partition, spec.granularity) in ids])
    return joined.where(F.col("__old").isNull()).drop("__new", "__old")


def _commit(ctx: RunContext, spec: StageSpec, plans, refill, new_ref: DataFrame, new_inc: DataFrame,
            seqs: dict[str, int], run_id: str, out: PassResult) -> None:
    uri = ctx.layout.sink_uri(spec)
    txns = [(ctx.layout.app_id(spec, p.partition), seqs[p.partition]) for p in plans]
    meta = {"laminar.run_id": run_id, "laminar.flow": spec.name,
            "laminar.partition": ",".join(p.partition for p in plans),
            "laminar.mode": ",".join(sorted({p.mode.value for p in plans})),
            "laminar.reason": ",".join(sorted({p.reason.value for p in plans}))}
    read = {m: sum(out.metrics[p.partition][m] for p in plans) for m in ("rows_read", "rows_rejected")}
    ids = {partition_id(p.partition, spec.granularity): p.partition for p in plans}
    data_cols = [c for c in new_ref.columns if c != EVENT_TS]
    new_ref, new_inc = new_ref.select(*data_cols), new_inc.select(*data_cols)
    reset = any(p.reason is Reason.SPEC_CHANGED for p in plans) or not _schema_matches(uri, new_ref.drop(PART))
    old = None if reset else _sink_rows(ctx, spec, refill)
    ranges = [p.interval for p in refill]
    deleted_by: dict[int, int] = {}
    if old is not None:
        # The refilled partitions' exact changes (old rows vs recomputed rows) in one aggregation,
        # staged as change data in one job whose observation counts them per partition.
        changes = _net_changes(old.select(*data_cols), new_ref, data_cols).unionByName(
            new_inc.withColumn(CHANGE_TYPE, F.lit("insert")))
        obs = Observation()
        cdc = stage(observe(changes, obs, *_change_counts(ids)), uri, run_id, by=PART, folder="_change_data/laminar")
        counts = obs.get
        deleted_by = {pid: int(counts.get(f"delete@{pid}") or 0) for pid in ids}
        inserted_by = {pid: int(counts.get(f"insert@{pid}") or 0) for pid in ids}
    if reset or not any(deleted_by.values()):
        # nothing deleted: a plain commit (readers see the adds as inserts)
        if old is not None:
            cdc.discard()
            new_rows = changes.where(F.col(CHANGE_TYPE) == "insert").drop(CHANGE_TYPE)
        else:
            new_rows = new_ref.unionByName(new_inc)
        staged = stage(new_ref if reset else new_rows, uri, run_id, by=PART)
        if reset:
            staged = _with(staged, stage(new_inc, uri, run_id + "-inc", by=PART))
        replace_ranges(ctx.spark, staged, table_uri=uri, column=spec.event_time, ranges=ranges if reset else [],
                       transactions=txns, metadata=_with_metrics(meta, read, staged), run_id=run_id,
                       append_only=not reset,
                       reset_on_schema_change=reset)
        inserted_by = staged.rows_by_partition()
    else:
        staged = stage(new_ref.unionByName(new_inc), uri, run_id, by=PART)
        replace_ranges(ctx.spark, staged, table_uri=uri, column=spec.event_time, ranges=ranges, transactions=txns,
                       metadata=_with_metrics(meta, read, staged), run_id=run_id, change_data=cdc)
    written = staged.rows_by_partition()
    for pid, key in ids.items():
        out.metrics[key].update(sink_rows=written.get(pid, 0), rows_inserted=inserted_by.get(pid, 0),
                                rows_deleted=deleted_by.get(pid, 0))


def _net_changes(old: DataFrame, new: DataFrame, cols: list[str]) -> DataFrame:
    """Rows to delete and to insert to turn the multiset `old` into `new` (EXCEPT ALL both ways, as
    one aggregation: Spark rewrites each EXCEPT ALL into the same union, sum and replicate)."""
    both = old.select(*cols, F.lit(-1).alias("__d")).unionByName(new.select(*cols, F.lit(1).alias("__d")))
    net = both.groupBy(*cols).agg(F.sum("__d").alias("__n")).where(F.col("__n") != 0)
    kind = F.expr("explode(array_repeat(CASE WHEN __n < 0 THEN 'delete' ELSE 'insert' END, CAST(abs(__n) AS INT)))")
    return net.select(*cols, kind.alias(CHANGE_TYPE))


def _change_counts(ids: dict[int, str]) -> list:
    """Observed deletes and inserts per partition number (SQL text: one Py4J call per metric)."""
    return [F.expr(f"sum(CASE WHEN {PART} = {pid} AND {CHANGE_TYPE} = '{kind}' THEN 1 ELSE 0 END) AS `{kind}@{pid}`")
            for pid in ids for kind in ("delete", "insert")]


def _with_metrics(meta: dict, read: dict, staged: StagedFiles) -> dict:
    """The commit's metadata with the run's metrics (what `laminar_system.runs` shows)."""
    return {**meta, "laminar.metrics": json.dumps({**read, "sink_rows": staged.rows})}


def _with(a: StagedFiles, b: StagedFiles) -> StagedFiles:
    return StagedFiles(a.adds + b.adds, a.rows + b.rows, a.schema, a.folder)


def _schema_matches(uri: str, out: DataFrame) -> bool:
    if not DeltaTable.is_deltatable(uri):
        return True
    current = nullable(pa.schema(DeltaTable(uri).schema().to_arrow()))
    wanted = nullable(arrow_schema_of(out))
    return [(f.name, str(f.type)) for f in current] == [(f.name, str(f.type)) for f in wanted]


def _quarantine(ctx: RunContext, spec: StageSpec, rejected: DataFrame, run_id: str) -> dict[str, dict[str, int]]:
    rejected = rejected.withColumn(PARTITION_KEY, partition_key_column(EVENT_TS, spec.granularity))
    counts: dict[str, dict[str, int]] = {}
    for src in spec.sources:
        mine = rejected.where(F.col("__src") == F.lit(src)).select(PARTITION_KEY, RULE, ROW, VERSION, EVENT_TS)
        for part, by_rule in qr.record(ctx.spark, mine, uri=ctx.layout.quarantine_uri(src), flow=spec.name,
                                       run_id=run_id).items():
            for rule, n in by_rule.items():
                counts.setdefault(part, {})[rule] = counts.setdefault(part, {}).get(rule, 0) + n
    return counts
