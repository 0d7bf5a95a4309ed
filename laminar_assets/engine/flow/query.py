"""A flow pass as one Spark SQL statement: one analysis, however many steps (spark/query.py).

    rows      every needed file once (run.reading.rows_query), joined with the flow's fact tables
    copies    prepared rows (run/row_prep.py), once per window holding each, kept where they count
    partial   signed partial states per (partition, window, keys, sign, broken rule)
    merged    the touched partitions' old state (minus refilled windows) merged with the partials

Rows that broke a rule stay in their own merged groups (`__bad`): the pass's metrics are
aggregates over the merged rows, in the job that writes them (metrics.py), so each merged row
carries what its partials read (`__in_rows`, `__rejected`, `__retracted`, `__groups`). `GOOD` picks the
state rows to keep. A small pass (`single`) runs in one task: the `COALESCE(1)` hint puts every
row in one partition, which satisfies every grouping, so Spark plans no exchange.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import SparkSession

from ..aggregates.algebra import implementations
from ..aggregates.base import EVENT_TS, ROWS, SIGN, q, user_sql
from ..quarantine import records as qr
from ..quarantine.records import RULE
from ..run.context import RunContext
from ..run.fact_joins import join_facts
from ..run.inputs import RunInputs
from ..run.plan import PartitionPlan
from ..run.reading import PART, ReadSet, group_values_sql, rows_query
from ..run.row_prep import frame_query, keep_sql, prepare_query, refilled_groups_sql
from ..spark import stable_sql
from ..spark.query import Query, union_all
from ..spark.stable_sql import bigint
from ..spec.specs import FlowSpec
from ..windows import partition_id, partition_id_of_sql, partition_id_sql, window_columns
from .metrics import BAD, GONE, GOOD, GROUP, GROUPS, IN_ROWS, LOST, REJECTED, RETRACTED, SLOT
from .state import WE, WS, sink_columns, state_query


@dataclass(frozen=True)
class PassQuery:
    """What one flow pass computes, lazily: `merged` (every merged group, with the metric columns,
    `__lost`, `__slot` and, when `sink` is set, the sink's columns); `copies` for the quarantine."""

    copies: Query
    merged: Query
    impls: tuple
    state: tuple[str, ...]  # the state table's columns (with `__p`)
    sink: tuple[str, ...] | None  # the sink's columns (with `__p`), when `merged` has them


def copies_query(spark: SparkSession, spec: FlowSpec, plans: list[PartitionPlan], reads: ReadSet,
                 inputs: RunInputs) -> Query:
    """Every row the plans read, once per window holding it, kept only where it counts."""
    rows = rows_query(spark, spec, reads, inputs)
    if spec.joins:  # a DataFrame join (its fact tables are read whole)
        rows = frame_query(join_facts(spark, spec, rows.run(spark), inputs), spec, inputs)
    rows = prepare_query(spec, rows, inputs).where(qr.assigned_sql(spec))
    # A source with window columns of its own (a flow over another flow's sink): they served the
    # event time, derived columns, filter and rules above; from here on the flow's windows replace them.
    shadowed = [c for c in rows.columns if c.lower() in (WS, WE)]
    if shadowed:
        kept = tuple(c for c in rows.columns if c not in shadowed)
        rows = rows.select([q(c) for c in kept], columns=kept)
    explode, windows = window_columns(EVENT_TS, spec.shape)
    if explode:
        rows = rows.select(["*", *explode], columns=(*rows.columns, "__copy", "__copy_v"))
    copies = rows.add_columns(windows)
    # `__primary` marks the copy in the row's own partition (its latest window); `__first` the latest
    # copy within each partition the row reaches, so every partition counts the rows it read once.
    slide_us = int(spec.shape.slide.total_seconds() * 1_000_000)
    part = partition_id_sql(WS, spec.granularity)
    later = partition_id_of_sql(f"timestamp_micros(unix_micros({WS}) + {slide_us})", spec.granularity)
    copies = copies.add_columns([(PART, part), ("__first", f"__primary OR {later} != {part}")])
    return copies.where(keep_sql(spec, plans, WS, group_hash_sql(spec), group_values_sql(spec, plans)))


def group_hash_sql(spec: FlowSpec) -> str:
    """A group's hash: its window start and keys, hashed by type (the same over row copies, merged rows
    and state rows). Two groups may share one; recomputing a group that did not need it is exact too."""
    return f"xxhash64({', '.join(q(c) for c in [WS, *spec.keys])})"


def pass_query(ctx: RunContext, spec: FlowSpec, plans: list[PartitionPlan], reads: ReadSet, inputs: RunInputs,
               *, single: bool, old: tuple[Query | None, int], slots: bool, sink: bool) -> PassQuery:
    """The pass over `plans` (`old`: `old_state`'s answer; `single`: in one task; `slots`: a
    `__slot` column for per-partition metrics; `sink`: finalize the sink's columns beside the state)."""
    copies = copies_query(ctx.spark, spec, plans, reads, inputs)
    # a small pass counts every row holding an extreme; a large one a lower bound, without a sort
    exact = reads.total_bytes < ctx.options.count_tied_extremes_below_bytes
    impls = tuple(implementations(spec, inputs.row_schema or copies.run(ctx.spark).schema, exact_holders=exact))
    group = [PART, WS, WE, *spec.keys]
    state_cols = [c for impl in impls for c in impl.state_columns]
    carried = [BAD, IN_ROWS, REJECTED, RETRACTED, GROUPS]
    first = "CASE WHEN __first THEN 1 ELSE 0 END"
    rows = copies.select(["*"], hint="COALESCE(1)") if single else copies
    before = [e for impl in impls for e in impl.pre_partial_exprs([*group, SIGN, RULE])]
    if before:  # the extremes count the rows holding them: the partial's extreme on every row first
        rows = rows.select(["*", *before])
    partial = rows.select([
        *[q(c) for c in group], f"{SIGN} * count(1) AS {ROWS}", *[e for impl in impls for e in impl.partial()],
        f"{RULE} IS NOT NULL AS {BAD}", f"sum({first}) AS {IN_ROWS}",
        f"sum(CASE WHEN {RULE} IS NOT NULL AND {SIGN} > 0 AND __primary THEN 1 ELSE 0 END) AS {REJECTED}",
        f"CASE WHEN {SIGN} < 0 THEN sum({first}) ELSE 0L END AS {RETRACTED}",
        f"CASE WHEN {RULE} IS NULL THEN 1L ELSE 0L END AS {GROUPS}",
    ], group=[q(c) for c in [*group, SIGN, RULE]])
    old_query, _ = old
    if old_query is not None:
        # `old_state` gave the kept state rows; zeros for what they read in this pass
        old_rows = old_query.select([*[q(c) for c in [*group, ROWS, *state_cols]], f"false AS {BAD}",
                                     *[f"0L AS {c}" for c in carried[1:]]])
        combined = union_all([old_rows, partial])
    else:
        combined = partial
    combined = combined.select(["*"], hint="COALESCE(1)" if single else f"REPARTITION({PART})")
    extra = [e for impl in impls for e in impl.pre_merge_exprs([*group, BAD])]
    if extra:
        combined = combined.select(["*", *extra])
    merged_cols = (*group, BAD, ROWS, *state_cols, *carried[1:])
    merged = combined.select([
        *[q(c) for c in [*group, BAD]], f"sum({ROWS}) AS {ROWS}", *[e for impl in impls for e in impl.merge()],
        *[f"sum({c}) AS {c}" for c in carried[1:]],
    ], group=[q(c) for c in [*group, BAD]], columns=merged_cols)
    lost = [f"coalesce({c}, false)" for impl in impls
            for c in [impl.lost_expr() if ctx.options.precision_guard else None] if c is not None]
    gone = [f"coalesce({c}, false)" for impl in impls for c in [impl.gone_expr()] if c is not None]
    named = [(LOST, " OR ".join(lost) or "false"), (GONE, " OR ".join(gone) or "false")]
    if gone:  # the groups that lost an extreme are recomputed alone, found by their hash
        named.append((GROUP, group_hash_sql(spec)))
    if slots:  # each row's partition's place in `plans` (1-based; 0 for none), looked up in an array
        # literal, which generated code references: runs over other partitions share the code
        ids = ", ".join(bigint(partition_id(p.partition, spec.granularity)) for p in plans)
        named.append((SLOT, f"array_position(array({ids}), {PART})"))
    merged = merged.add_columns(named)
    state = (*group, ROWS, *state_cols)
    if not sink:
        return PassQuery(copies, merged, impls, state, None)
    finals, post, names = sink_columns(spec, impls)
    # only for the rows kept: a post column's `x / y` must not see a broken rule's or an emptied group
    merged = merged.add_columns([(n, f"CASE WHEN {GOOD} THEN {e} END") for n, e in finals])
    merged = merged.with_columns([(n, f"CASE WHEN {GOOD} THEN {user_sql(e)} END") for n, e in post])
    return PassQuery(copies, merged, impls, state, (PART, WS, WE, *spec.keys, *names))


def old_state(ctx: RunContext, spec: FlowSpec, plans: list[PartitionPlan], inputs: RunInputs) -> tuple[Query | None, int]:
    """The committed state of the plans' partitions that keep theirs, minus the windows they refill
    (with `__p`), and the bytes of the files it reads."""
    kept = [p.partition for p in plans if not p.refill_all]
    old, old_bytes = state_query(ctx, spec, kept, inputs.input_schema, opened=inputs.opened)
    if old is None:
        return None, 0
    refilled = stable_sql.in_ranges_sql(WS, [r for p in plans for r in p.refill], spec.granularity)
    groups = refilled_groups_sql(spec, plans, WS, group_hash_sql(spec), group_values_sql(spec, plans))
    return old.where(f"NOT ({refilled} OR {groups})").add_columns([(PART, partition_id_sql(WS, spec.granularity))]), old_bytes
