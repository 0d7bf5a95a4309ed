"""One Spark pass over every partition a stage run touches: rows, dedup, joins, one commit.

A stage keeps no state: its output table holds its rows. Refilled partitions are
recomputed whole (dedup is within a partition), or only their changed keys (keys.py): those keys'
rows come from the pinned snapshot, the others' new rows merge as appends. The commit, with exact
change data, is commit.py's. Small inputs run in one task (no shuffle). Appended rows of incremental partitions are
checked against the rows already kept (dedup); a new row that would replace a kept
duplicate refills its partition instead (DEDUP_REPLACED_ROW). A run of appends only is one Spark
job: read, join, dedup against the kept rows and write, its metrics and dedup verdict observed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import cast

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from ..aggregates.algebra import EVENT_TS, SIGN
from ..delta.tables import TableInfo, info_of, snapshot_files
from ..output.commit import replace_ranges
from ..output.uncommitted import write_uncommitted
from ..quarantine import records as qr
from ..quarantine.records import PARTITION_KEY, ROW, RULE, VERSION
from ..run.context import RunContext
from ..run.inputs import RunInputs
from ..run.metrics import RunMetrics
from ..run.plan import Mode, PartitionPlan
from ..run.reading import PART, group_values_sql, read_set, rows_query
from ..run.row_prep import keep_sql, prepare_query
from ..spark.frames import interpreted, named, observe, selected_schema
from ..spark.read import read_source
from ..spark.stable_sql import bigint
from ..spec.specs import StageSpec
from ..windows import partition_id, partition_id_sql, partition_key_column
from .commit import commit_meta, commit_refill, schema_matches, transactions, with_metrics
from .dedup import DedupReplaced, dedup_against_kept, deduped, deduped_columns, replaced
from .keys import in_keys_sql, key_hash_sql


@dataclass
class PassResult:
    metrics: dict[str, RunMetrics] = field(default_factory=dict)
    quarantined: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)  # read (rows cached), write (diff and commit)


def run_pass(ctx: RunContext, spec: StageSpec, plans: list[PartitionPlan], seqs: dict[str, int],
             inputs: RunInputs, run_id: str) -> PassResult:
    out = PassResult()
    # the output as the run checked it out (its owner check): its rows are read and its commit made on this one
    # snapshot, where each reader opened the table again (on an object store a replay of its log each)
    uri = ctx.layout.sink_uri(spec)
    opened = inputs.own_table(uri)
    output = info_of(spec.sink_name, uri, opened) if opened is not None else None
    reads = read_set(spec, plans, inputs)
    with interpreted(ctx.spark, reads.total_bytes < ctx.options.interpreted_below_bytes):  # see flow_job
        rows = prepare_query(spec, rows_query(ctx.spark, spec, reads, inputs), inputs).where(qr.assigned_sql(spec))
        rows = rows.add_columns([(PART, partition_id_sql(EVENT_TS, spec.granularity))])
        keep = keep_sql(spec, plans, EVENT_TS, key_hash_sql(spec), group_values_sql(spec, plans))
        frame = rows.where(keep).run(ctx.spark)  # one analysis (spark/query.py)
        joined = _join_dimensions(ctx, spec, frame, inputs)
        obs = Observation()
        rejected = F.col(RULE).isNotNull() & (F.col(SIGN) > 0)
        joined = observe(joined, obs, *_row_counts(spec, plans))
        # a stage's new rows are rows it read, widened by the dimensions' columns
        in_bytes = reads.total_bytes + inputs.joined_bytes()
        small = in_bytes < ctx.options.driver_write_below_bytes
        single = in_bytes < ctx.options.single_task_below_bytes
        if single:  # small inputs: every row in one task, so the dedup and the diff plan no shuffle
            joined = joined.coalesce(1)
        if not any(p.mode is Mode.REFILL for p in plans) and _appends(ctx, spec, plans, joined, obs, seqs, run_id, out,
                                                                     small=small, output=output):
            ctx.hook("after_state_commit")
            ctx.hook("after_sink_commit")
            return out
        joined = joined.persist()
        try:
            t0 = time.perf_counter()
            joined.count()  # one job: read, join and cache the rows (and fill the observed metrics)
            counts = obs.get
            new = deduped(spec, joined.where(F.col(RULE).isNull()))
            whole = [p for p in plans if p.refill]  # recomputed whole; keyed plans recompute their keys
            incremental = [p for p in plans if not p.refill]
            in_keys = F.expr(in_keys_sql(spec, plans, EVENT_TS))
            new_inc = new.where(_in_partitions(spec, incremental) & ~in_keys)
            if incremental and spec.dedup_key:
                new_inc = dedup_against_kept(ctx, spec, incremental, new_inc, output)
            new_ref = new.where(_in_partitions(spec, whole) | in_keys)
            _count_metrics(out, counts, plans)
            for p in plans:  # what the refill of changed keys saves shows here (files skipped by key)
                out.metrics[p.partition].update(files_read=reads.files.get(p.partition, 0),
                                                bytes_read=reads.bytes.get(p.partition, 0))
            if any(m["rows_rejected"] for m in out.metrics.values()):
                out.quarantined = _quarantine(ctx, spec, joined.where(rejected), run_id, small=small, plans=plans)
            ctx.hook("after_read")
            t1 = time.perf_counter()
            commit_refill(ctx, spec, plans, new_ref, new_inc, seqs, run_id, out.metrics, small=small,
                          in_bytes=in_bytes, single=single, output=output)
            out.seconds = {"read": t1 - t0, "write": time.perf_counter() - t1}
        finally:
            joined.unpersist()
    ctx.hook("after_state_commit")
    ctx.hook("after_sink_commit")
    return out


def _row_counts(spec: StageSpec, plans: list[PartitionPlan]) -> list:
    """Observed per partition: rows read and rows rejected, as arrays by the partition's place in
    `plans`. SQL text, one expression per metric (each costs Py4J round trips in local mode), and
    partition numbers in an array literal, which generated code references: runs over other
    partitions share the code (stable_sql.py). Slots are rounded up to a power of two for the same reason."""
    ids = ", ".join(bigint(partition_id(p.partition, spec.granularity)) for p in plans)
    slot = f"array_position(array({ids}), {PART})"
    slots = range(1, (1 << (len(plans) - 1).bit_length()) + 1)
    bad = f"{RULE} IS NOT NULL AND {SIGN} > 0"
    return [F.expr(f"array({', '.join(f'count(CASE WHEN {slot} = {i} THEN 1 END)' for i in slots)}) AS rows"),
            F.expr(f"array({', '.join(f'count(CASE WHEN {slot} = {i} AND {bad} THEN 1 END)' for i in slots)}) AS rejected")]


def _count_metrics(out: PassResult, counts: dict, plans: list[PartitionPlan]) -> None:
    rows, rejected = counts.get("rows") or [], counts.get("rejected") or []
    for i, p in enumerate(plans):
        out.metrics[p.partition] = RunMetrics(rows_read=int(rows[i] or 0) if i < len(rows) else 0,
                                              rows_rejected=int(rejected[i] or 0) if i < len(rejected) else 0)


def _appends(ctx: RunContext, spec: StageSpec, plans: list[PartitionPlan], joined: DataFrame, obs: Observation,
             seqs: dict[str, int], run_id: str, out: PassResult, *, small: bool, output: TableInfo | None) -> bool:
    """Incremental partitions only: one Spark job reads, joins, dedups against the kept rows and
    writes the new rows; the run's counts and any kept row a new one would replace are observed
    by it (nothing is cached or collected). False, with nothing done, when the output's schema
    changes (the general path resets the table)."""
    # the one analysis before the job: the schemas below follow from it (over Spark Connect each is a request)
    known = joined.schema
    new = deduped(spec, joined.where(F.col(RULE).isNull()), known.names)
    new_schema = selected_schema(known, deduped_columns(spec, known.names)) or new.schema
    cols = [c for c in new_schema.names if c != EVENT_TS]
    uri = ctx.layout.sink_uri(spec)
    if not schema_matches(output, StructType([f for f in new_schema.fields if f.name not in (PART, EVENT_TS)])):
        return False
    lost = Observation() if spec.dedup_key else None
    if lost is not None:
        new = dedup_against_kept(ctx, spec, plans, new, output, lost=lost, new_schema=new_schema)
    t0 = time.perf_counter()
    files = write_uncommitted(new.select(*named(cols)), uri, run_id, by=PART, through_driver=small)  # the one Spark job
    lost_in = replaced(spec, plans, lost.get) if lost is not None else []
    if lost_in:
        files.discard()
        raise DedupReplaced(lost_in)
    _count_metrics(out, obs.get, plans)
    if any(m["rows_rejected"] for m in out.metrics.values()):  # reads the new files again (rare)
        out.quarantined = _quarantine(ctx, spec, joined.where(F.col(RULE).isNotNull() & (F.col(SIGN) > 0)), run_id,
                                      small=small, plans=plans)
    ctx.hook("after_read")
    t1 = time.perf_counter()
    read = {m: sum(out.metrics[p.partition][m] for p in plans) for m in ("rows_read", "rows_rejected")}
    replace_ranges(ctx.spark, files, table_uri=uri, column=spec.event_time, ranges=[],
                   transactions=transactions(ctx, spec, plans, seqs),
                   metadata=with_metrics(commit_meta(spec, plans, run_id), read, files), run_id=run_id,
                   append_only=True, owner=spec.name, opened=output.table if output is not None else None)
    written = files.rows_by_partition()
    for p in plans:
        n = written.get(partition_id(p.partition, spec.granularity), 0)
        out.metrics[p.partition].update(sink_rows=n, rows_inserted=n, rows_deleted=0)
    out.seconds = {"read": t1 - t0, "write": time.perf_counter() - t1}
    return True


def _join_dimensions(ctx: RunContext, spec: StageSpec, rows: DataFrame, inputs: RunInputs) -> DataFrame:
    joined = rows
    for i, join in enumerate(spec.joins):
        info = inputs.dims[join.table]
        dim = read_source(ctx.spark, snapshot_files(info, None), info)
        # quoted: a column name may hold a backtick or a dot; the match marker is per join (a
        # table may be joined twice, on other keys or for other columns)
        dim = dim.select(*named(dict.fromkeys([*join.on, *join.columns]))).withColumn(
            _matched(i), F.lit(True))
        joined = joined.join(dim, list(join.on), "left")
    unmatched = F.lit(None).cast("string")
    for i, join in reversed(list(enumerate(spec.joins))):
        if join.how == "inner":
            unmatched = F.when(F.col(_matched(i)).isNull(), F.lit(unmatched_rule(spec, join))).otherwise(unmatched)
    return joined.withColumn(RULE, F.coalesce(F.col(RULE), unmatched))


def unmatched_rule(spec: StageSpec, join) -> str:
    """The quarantine rule of a row an inner join found no match for: `unmatched_<table>`, and
    `unmatched_<table>_on_<keys>` when the stage joins that table more than once."""
    twice = sum(j.table == join.table for j in spec.joins) > 1
    return f"unmatched_{join.table}" + (f"_on_{'_'.join(join.on)}" if twice else "")


def _matched(i: int) -> str:
    return f"__matched_{i}"


def _in_partitions(spec: StageSpec, plans: list[PartitionPlan]):
    ids = [partition_id(p.partition, spec.granularity) for p in plans]
    return F.col(PART).isin(*ids) if ids else F.lit(False)


def _quarantine(ctx: RunContext, spec: StageSpec, rejected: DataFrame, run_id: str, *,
                small: bool, plans: list[PartitionPlan]) -> dict[str, dict[str, int]]:
    """Record the rejected rows (all inside the plans' partitions: a stage reads no others)."""
    rejected = rejected.withColumn(PARTITION_KEY, partition_key_column(EVENT_TS, spec.granularity))
    counts: dict[str, dict[str, int]] = {}
    for src in spec.sources:
        mine = rejected.where(F.col("__src") == F.lit(src)).select(PARTITION_KEY, RULE, ROW, VERSION, EVENT_TS)
        for part, by_rule in qr.record(ctx.spark, mine, uri=ctx.layout.quarantine_uri(src), flow=spec.name,
                                       run_id=run_id, through_driver=small, within=[p.interval for p in plans],
                                       driver_below_bytes=ctx.options.driver_write_below_bytes).items():
            key = cast(str, part)  # None only for the sweep's rows; a stage's rejects are all in its plans' partitions
            for rule, n in by_rule.items():
                counts.setdefault(key, {})[rule] = counts.setdefault(key, {}).get(rule, 0) + n
    return counts
