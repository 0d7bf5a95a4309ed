"""One Spark pass over every partition a flow run touches: partial states, merge, state and sink.

    read      every needed file once (reading.py), rows tagged with their role
    partial   one aggregation: signed partial states per (partition, window, keys)
    merge     with the old state of the touched partitions only, minus refilled windows
    state     one Spark job writes the merged state, one file per partition; one Delta commit
    sink      a small pass: finalized beside the state in the same job (both staged by the driver);
              otherwise one Spark job finalizes the state files just written (a scan, no shuffle);
              one Delta commit

Run metrics come from the same jobs (`DataFrame.observe`), not from extra ones. The
state is re-read only when a crashed run is recovered (`flow_state.rederive_sinks`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from pyspark.sql import DataFrame, Observation
from pyspark.sql import functions as F

from . import quarantine as qr
from . import stable_sql
from .stable_sql import bigint
from .aggregates import EVENT_TS, ROWS, SIGN, implementations, q
from .delta_write import replace_ranges
from .inputs import RunInputs
from .layout import RunContext
from .plan import PartitionPlan
from .quarantine import PARTITION_KEY, ROW, RULE, VERSION
from .fact_joins import join_facts
from .flow_state import WE, WS, finalize, state_rows
from .reading import PART, keep, prepare, read_rows, read_set, with_partition
from .spark_io import interpreted, observe
from .staging import StagedFiles, read_staged, stage, stage_split
from .spec import FlowSpec
from .windows import Interval, assign_windows, partition_id, partition_id_of_sql, partition_id_sql, \
    partition_key, partition_key_column


class PrecisionLost(Exception):
    """Windows whose float state a retraction left untrustworthy: {partition: window-start ranges}."""

    def __init__(self, windows: dict[str, tuple[Interval, ...]]) -> None:
        super().__init__(f"precision lost in {sum(len(w) for w in windows.values())} window(s)")
        self.windows = windows


@dataclass
class PassResult:
    """What one pass measured, per partition; `state_rows`/`sink_rows` are the pass's totals."""

    metrics: dict[str, dict] = field(default_factory=dict)
    quarantined: dict[str, dict[str, int]] = field(default_factory=dict)
    state_rows: int = 0
    sink_rows: int = 0
    seconds: dict[str, float] = field(default_factory=dict)  # read (the first Spark job), state, write


def state_query(ctx: RunContext, spec: FlowSpec, plans: list[PartitionPlan], inputs: RunInputs) -> DataFrame:
    """The merged state the plans produce, lazily (what a run writes; what `explain` prints)."""
    copies, reads = _copies(ctx, spec, plans, inputs)
    old, old_bytes = _old_state(ctx, spec, plans, inputs)
    single = _one_task(ctx, spec, reads.total_bytes, old_bytes)
    partial, impls = _partial(spec, copies, inputs, single=single)
    return _merge(spec, plans, partial.where(F.col(RULE).isNull()), impls, old, single=single)


def recompute(ctx: RunContext, spec: FlowSpec, plan: PartitionPlan, inputs: RunInputs) -> DataFrame:
    """Sink rows of a refill plan's windows, from the snapshot alone (the equivalence check)."""
    return finalize(spec, state_query(ctx, spec, [plan], inputs)).drop(PART)


def run_pass(ctx: RunContext, spec: FlowSpec, plans: list[PartitionPlan], seqs: dict[str, int],
             inputs: RunInputs, run_id: str) -> PassResult:
    """Carry out `plans` (sharing target versions and input schema) in one pass; raises
    `PrecisionLost` before committing anything when a window must be recomputed instead."""
    out = PassResult()
    keys = [p.partition for p in plans]
    copies, reads = _copies(ctx, spec, plans, inputs)
    old, old_bytes = _old_state(ctx, spec, plans, inputs)
    # small inputs: one task, no shuffle, and interpreted expressions (compiling each query's new
    # code costs more than it saves)
    single = _one_task(ctx, spec, reads.total_bytes, old_bytes)
    with interpreted(ctx.spark, reads.total_bytes < ctx.options.interpreted_below_bytes):
        partial, impls = _partial(spec, copies, inputs, single=single)
        reads_obs, per_part = Observation(), len(plans) <= ctx.options.metrics_partitions
        if per_part:  # each partial row's slot, once (the merge selects its own columns)
            partial = partial.withColumn(SLOT, F.expr(_slot(spec, plans)))
        partial = observe(partial, reads_obs, *_read_metrics(plans if per_part else []))
        merged = _merge(spec, plans, partial.where(F.col(RULE).isNull()), impls, old, single=single)
        lost = F.lit(False)
        for impl in impls:
            cond = impl.lost_expr() if ctx.options.precision_guard else None
            if cond is not None:
                lost = lost | F.coalesce(F.expr(cond), F.lit(False))
        merge_obs = Observation()
        checked = observe(merged.withColumn("__lost", lost), merge_obs,
                          F.sum(F.col("__lost").cast("int")).alias("lost"))
        t0 = time.perf_counter()
        state_uri = ctx.layout.state_uri(spec, inputs.input_schema)
        small = _small_state(ctx, spec, reads.total_bytes, old_bytes)
        staged, sink = _stage_outputs(ctx, spec, checked.drop("__lost"), impls, state_uri, run_id, small)
        if merge_obs.get.get("lost"):
            for files in (staged, sink):
                if files is not None:
                    files.discard()
            raise PrecisionLost(_lost_windows(spec, merged.where(lost)))
        _collect_metrics(out, reads_obs.get, plans, per_part)
        for k in keys:
            out.metrics[k].update(files_read=reads.files.get(k, 0), bytes_read=reads.bytes.get(k, 0))
        if any(m.get("rows_rejected") for m in out.metrics.values()):
            counts = _quarantine(ctx, spec, copies, run_id, small=small)
            for k in keys:
                out.quarantined[k] = counts.get(k, {})
        ctx.hook("after_read")
        t1 = time.perf_counter()
        txns = [(ctx.layout.app_id(spec, k), seqs[k]) for k in keys]
        meta = {"laminar.run_id": run_id, "laminar.flow": spec.name, "laminar.partition": ",".join(keys),
                "laminar.mode": ",".join(sorted({p.mode.value for p in plans})),
                "laminar.reason": ",".join(sorted({p.reason.value for p in plans}))}
        read = {m: sum(out.metrics[k].get(m, 0) for k in keys) for m in ("rows_read", "rows_rejected")}
        ranges = [p.interval for p in plans]
        out.state_rows = replace_ranges(ctx.spark, staged, table_uri=state_uri, column=WS, ranges=ranges,
                                        transactions=txns, metadata=meta, run_id=run_id,
                                        opened=inputs.opened.pop(state_uri, None))
        ctx.hook("after_state_commit")
        t2 = time.perf_counter()
        if sink is None:
            # Finalized from the state files just staged (one scan of the touched partitions' state, no
            # shuffle): cheaper than caching the merge, whose plan Spark must build twice.
            state = with_partition(read_staged(ctx.spark, staged, state_uri), spec, WS)
            small = sum(a.size for a in staged.adds) < ctx.options.driver_write_below_bytes
            sink = stage(finalize(spec, state, partitioned=True), ctx.layout.sink_uri(spec), run_id + "-sink",
                         by=PART, through_driver=small)  # Spark job
        metrics = {**read, "state_rows": out.state_rows, "sink_rows": sink.rows}  # what `laminar_system.runs` shows
        out.sink_rows = replace_ranges(ctx.spark, sink, table_uri=ctx.layout.sink_uri(spec), column=WS, ranges=ranges,
                                       transactions=txns, metadata={**meta, "laminar.metrics": json.dumps(metrics)},
                                       run_id=run_id + "-sink", reset_on_schema_change=True)
        out.seconds = {"read": t1 - t0, "state": t2 - t1, "write": time.perf_counter() - t2}
        ctx.hook("after_sink_commit")
    return out


def _stage_outputs(ctx: RunContext, spec: FlowSpec, state: DataFrame, impls, state_uri: str, run_id: str,
                   small: bool) -> tuple[StagedFiles, StagedFiles | None]:
    """Stage the merged state (one Spark job). A small one comes to the driver, and then its sink rows
    come with it: each state row finalized beside it, so state and sink are staged from one job
    (None: the sink is still to be staged from the state files)."""
    if not small:
        return stage(state, state_uri, run_id, by=PART), None
    state_names = [PART, WS, WE, *spec.keys, ROWS, *[c for impl in impls for c in impl.state_columns]]
    if any(c.startswith("__") for c in [*spec.keys, *dict(spec.post)]):  # would clash with state columns
        return stage(state, state_uri, run_id, by=PART, through_driver=True), None
    both = finalize(spec, state, keep=tuple(state_names[len(spec.keys) + 3:]), partitioned=True)
    # `finalize`'s columns, minus the state's (named here: asking Spark costs an analysis)
    sink_names = [PART, WS, WE, *spec.keys, *[a.name for a in spec.aggregates if a.name not in spec.hidden],
                  *dict(spec.post)]
    staged, sink = stage_split(both, [(state_uri, run_id, state_names),
                                      (ctx.layout.sink_uri(spec), run_id + "-sink", sink_names)], by=PART)
    return staged, sink


def _one_task(ctx: RunContext, spec: FlowSpec, read_bytes: int, old_bytes: int) -> bool:
    """Whether the pass runs in one task (`EngineOptions.single_task_below_bytes`), bounded like
    `_small_state`: the rows read times the window copies of each, plus the old state. A fact join
    reads its joined table whole and can multiply rows: never in one task."""
    if spec.joins:
        return False
    return read_bytes * spec.shape.copies + old_bytes < ctx.options.single_task_below_bytes


def _small_state(ctx: RunContext, spec: FlowSpec, read_bytes: int, old_bytes: int) -> bool:
    """Whether the pass's state may come through the driver: it holds at most a row per window copy
    of each row read (hopping windows copy a row into several) plus the old state it merges. A fact
    join can multiply rows beyond any such bound, so a flow with joins always has Spark write."""
    if spec.joins:
        return False
    return read_bytes * spec.shape.copies + old_bytes < ctx.options.driver_write_below_bytes


def _copies(ctx: RunContext, spec: FlowSpec, plans: list[PartitionPlan], inputs: RunInputs):
    """Every row the plans read, once per window holding it, kept only where it counts (lazy)."""
    reads = read_set(spec, plans, inputs)
    rows = join_facts(ctx.spark, spec, read_rows(ctx.spark, spec, reads, inputs), inputs)
    rows = prepare(spec, rows, inputs).where(qr.assigned(spec))
    copies = assign_windows(rows, EVENT_TS, spec.shape)
    # `__primary` marks the copy in the row's own partition (its latest window); `__first` the latest
    # copy within each partition the row reaches, so every partition counts the rows it read once.
    # (SQL text in one call: each DataFrame call is an analysis of the whole plan.)
    slide_us = int(spec.shape.slide.total_seconds() * 1_000_000)
    part = partition_id_sql(WS, spec.granularity)
    later = partition_id_of_sql(f"timestamp_micros(unix_micros({WS}) + {slide_us})", spec.granularity)
    copies = copies.withColumns({PART: F.expr(part), "__first": F.expr(f"__primary OR {later} != {part}")})
    return copies.where(keep(spec, plans, WS)), reads


def _partial(spec: FlowSpec, copies: DataFrame, inputs: RunInputs, *, single: bool = False):
    """Signed partial states per (partition, window, keys, sign, broken rule): one aggregation.
    `single`: all rows in one task (no shuffle; see `_merge`)."""
    impls = implementations(spec, inputs.row_schema or copies.schema)
    rejected = f"{RULE} IS NOT NULL AND {SIGN} > 0 AND __primary"
    partial = (copies.coalesce(1) if single else copies).groupBy(PART, WS, WE, *spec.keys, SIGN, RULE).agg(
        F.expr("sum(CASE WHEN __first THEN 1 ELSE 0 END) AS __in_rows"),
        F.expr(f"sum(CASE WHEN {rejected} THEN 1 ELSE 0 END) AS __rejected"),
        F.expr(f"{SIGN} * count(1) AS {ROWS}"),
        *[F.expr(e) for impl in impls for e in impl.partial()],
    )
    return partial, impls


def _old_state(ctx: RunContext, spec: FlowSpec, plans: list[PartitionPlan],
               inputs: RunInputs) -> tuple[DataFrame | None, int]:
    """The committed state of the plans' partitions that keep theirs (lazy), minus the windows they
    refill, and the bytes of the files it reads."""
    kept = [p.partition for p in plans if not p.refill_all]
    old, old_bytes = state_rows(ctx, spec, kept, inputs.input_schema, opened=inputs.opened)
    if old is None:
        return None, 0
    refilled = stable_sql.in_ranges_sql(WS, [r for p in plans for r in p.refill], spec.granularity)
    return with_partition(old, spec, WS).where(F.expr(f"NOT {refilled}")), old_bytes


def _merge(spec: FlowSpec, plans: list[PartitionPlan], good: DataFrame, impls, old: DataFrame | None, *,
           single: bool = False) -> DataFrame:
    """`old` state merged with the `good` partials.

    Hash-partitioned by partition number: the merge needs no further shuffle, and each partition's
    rows end up in one task, so the writes lay out one file per partition. `single`: everything in one
    task instead, with no shuffle at all (partials and merge in one stage): on small inputs a stage
    and its tasks cost more than the work (the benchmark's 100k-row Δ: 3 stages, 12 tasks and ~0.3 s
    against 1 task and ~0.15 s)."""
    group = [PART, WS, WE, *spec.keys]
    state_cols = [c for impl in impls for c in impl.state_columns]
    # selectExpr of quoted names: a select of names costs more Py4J round trips per column
    columns = [q(c) for c in (*group, ROWS, *state_cols)]
    combined = good.selectExpr(*columns)
    if old is not None:
        combined = old.selectExpr(*columns).unionByName(combined)
    # one partition satisfies any grouping: the aggregations below need no exchange
    combined = combined.coalesce(1) if single else combined.repartition(PART)
    extra = [e for impl in impls for e in impl.pre_merge_exprs(group)]
    if extra:
        combined = combined.selectExpr("*", *extra)
    merged = combined.groupBy(*group).agg(F.expr(f"sum({ROWS}) AS {ROWS}"), *[F.expr(e) for i in impls for e in i.merge()])
    return merged.where(F.col(ROWS) != 0)


SLOT = "__slot"


def _slot(spec: FlowSpec, plans: list[PartitionPlan]) -> str:
    """SQL: a partial row's partition's place in `plans` (1-based; 0 for none), looked up in an array
    literal, which generated code references: runs over other partitions share the code."""
    ids = ", ".join(bigint(partition_id(p.partition, spec.granularity)) for p in plans)
    return f"array_position(array({ids}), {PART})"


def _read_metrics(plans: list[PartitionPlan]) -> list:
    """Aggregates over partial states: one array per metric, the pass's total first, then one
    element per partition (by `SLOT`) when `plans` is given.

    SQL text, one expression per metric rather than one per metric and partition: each expression
    is a few Py4J round trips in local mode. Windows are counted with a DataSketches HLL sketch:
    exact for small counts, a few hundred bytes per aggregate; `approx_count_distinct` at 1% error
    carried 16k registers per aggregate and task and cost a second per run in the observation alone."""
    good = f"{RULE} IS NULL"
    # Slots rounded up to a power of two: runs over a similar number of partitions share the code
    # of these aggregates instead of compiling their own (see stable_sql.py).
    slots = (1 << (len(plans) - 1).bit_length()) if plans else 0
    conds = ["true", *[f"{SLOT} = {i}" for i in range(1, slots + 1)]]
    metrics = {
        "rows": "sum(CASE WHEN {c} THEN __in_rows END)",
        "rejected": "sum(CASE WHEN {c} THEN __rejected END)",
        "retracted": f"sum(CASE WHEN {{c}} AND {SIGN} < 0 THEN __in_rows END)",
        "groups": f"count(CASE WHEN {{c}} AND {good} THEN 1 END)",
        "windows": f"hll_sketch_estimate(hll_sketch_agg(CASE WHEN {{c}} AND {good} THEN unix_micros({WS}) END, 12))",
    }
    return [F.expr(f"array({', '.join(m.format(c=c) for c in conds)}) AS `{name}`") for name, m in metrics.items()]


def _collect_metrics(out: PassResult, row: dict, plans: list[PartitionPlan], per_part: bool) -> None:
    names = {"rows": "rows_read", "rejected": "rows_rejected", "retracted": "rows_retracted",
             "groups": "partial_groups", "windows": "windows_touched"}
    for i, p in enumerate(plans):
        # element 0: the pass's total; element i + 1: partition i's slot. Without a breakdown (too
        # many partitions) the pass's totals go on the first partition.
        at = i + 1 if per_part else (0 if i == 0 else None)
        out.metrics[p.partition] = {v: _element(row.get(k), at) for k, v in names.items()}


def _element(values: list | None, at: int | None) -> int:
    return int(values[at] or 0) if values is not None and at is not None and at < len(values) else 0


def _lost_windows(spec: FlowSpec, lost: DataFrame) -> dict[str, tuple[Interval, ...]]:
    rows = lost.select(WS).distinct().collect()  # a job only when precision was lost
    out: dict[str, list[Interval]] = {}
    for r in rows:
        iv = Interval(r[WS], r[WS] + spec.shape.slide)
        out.setdefault(partition_key(iv.start, spec.granularity), []).append(iv)
    return {k: tuple(v) for k, v in out.items()}


def _quarantine(ctx: RunContext, spec: FlowSpec, copies: DataFrame, run_id: str, *,
                small: bool) -> dict[str, dict[str, int]]:
    """Append the rows that broke a rule (each in its own partition's copy) to their sources'
    quarantine tables; returns the new rows by partition and rule."""
    rejected = copies.where(F.col("__primary") & F.col(RULE).isNotNull() & (F.col(SIGN) > 0))
    rejected = rejected.withColumn(PARTITION_KEY, partition_key_column(EVENT_TS, spec.granularity))
    counts: dict[str, dict[str, int]] = {}
    for src in spec.sources:
        mine = rejected.where(F.col("__src") == F.lit(src)).select(PARTITION_KEY, RULE, ROW, VERSION, EVENT_TS)
        for part, by_rule in qr.record(ctx.spark, mine, uri=ctx.layout.quarantine_uri(src), flow=spec.name,
                                       run_id=run_id, through_driver=small).items():
            for rule, n in by_rule.items():
                counts.setdefault(part, {})[rule] = counts.setdefault(part, {}).get(rule, 0) + n
    return counts
