"""A run's source rows made ready for windows: the original row and the first rule each breaks,
derived columns, the event time and the spec's filter (`prepare_query`), and which rows count for
which partition (`keep_sql`). Spark SQL text over the rows `reading.rows_query` reads: one
analysis for the whole pass (spark/query.py)."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from ..aggregates.base import EVENT_TS, SIGN, sql_string, user_sql
from ..quarantine import records as qr
from ..quarantine.records import ROW, RULE, VERSION
from ..spark import stable_sql
from ..spark.query import Query
from ..spark.query import frame as sql_frame
from ..windows import partition_id, partition_id_sql
from .fact_joins import joined_columns
from .inputs import RunInputs
from .plan import PartitionPlan
from .reading import DVER, SNAP, SRC
from .validate import event_time_sql


def prepare(spec, frame: DataFrame, inputs: RunInputs | None = None) -> DataFrame:
    """`prepare_query` of a DataFrame (`inputs`: see there; without them Spark is asked for the
    frame's columns and types)."""
    spark = frame.sparkSession
    if inputs is not None and inputs.row_schema is not None:
        return prepare_query(spec, frame_query(frame, spec, inputs), inputs).run(spark)
    rows = sql_frame("rows", frame, tuple(frame.columns))
    ts_type = None
    if spec.event_time not in rows.columns:  # a derived event time: its type needs an analysis
        ts_type = prepare_query(spec, rows, None, derived_only=True).run(spark).schema[spec.event_time].dataType
    return prepare_query(spec, rows, None, ts_type=ts_type or frame.schema[spec.event_time].dataType).run(spark)


def frame_query(frame: DataFrame, spec, inputs: RunInputs) -> Query:
    """A frame `rows_query` (+ `join_facts`) built, as a query whose columns are known."""
    names = (*inputs.infos[spec.sources[0]].schema.names, SIGN, SRC, DVER, SNAP, VERSION, *joined_columns(spec))
    return sql_frame("rows", frame, names)


def prepare_query(spec, rows: Query, inputs: RunInputs | None, *, ts_type=None, derived_only: bool = False) -> Query:
    """Source rows (`rows`, with known columns) with the event time (EVENT_TS), the first rule each
    breaks (RULE) and the original row (ROW). Rows breaking a rule pass the spec's filter so they
    reach the quarantine. `inputs`: the run's inputs, whose checked source schema gives the raw
    columns and the event time's type (else: `rows`' columns not starting with `__`, and `ts_type`)."""
    if inputs is not None and inputs.row_schema is not None:
        raw = [*inputs.infos[spec.sources[0]].schema.names, *joined_columns(spec)]
        ts_type = inputs.row_schema[spec.event_time].dataType
    else:
        raw = [c for c in rows.columns if not c.startswith("__")]
    rules = " ".join(f"WHEN {SRC} = {sql_string(src)} THEN {qr.declared_rule_sql(spec, src)}"
                     for src in dict.fromkeys(spec.sources))  # the rules of each row's own source
    out = rows.with_columns([(ROW, qr.original_row_sql(raw)), (RULE, f"CASE {rules} END")])
    # not evaluated on broken rows (ANSI errors, e.g. x / 0)
    out = out.with_columns([(name, f"CASE WHEN {RULE} IS NULL THEN {user_sql(expr)} END") for name, expr in spec.derived])
    if derived_only:
        return out
    out = out.with_columns([(EVENT_TS, event_time_sql(spec.event_time, ts_type)),
                            (RULE, f"coalesce({RULE}, {qr.key_rule_sql(spec)})")])
    if spec.filter:  # the filter picks among good rows; broken ones go on to the quarantine
        out = out.where(f"{user_sql(spec.filter)} OR {RULE} IS NOT NULL OR NOT {qr.assigned_sql(spec)}")
    return out


def keep(spec, plans: list[PartitionPlan], at: str) -> Column:
    """`keep_sql` as a Column."""
    return F.expr(keep_sql(spec, plans, at))


def keep_sql(spec, plans: list[PartitionPlan], at: str, group_hash: str | None = None,
             members: str | None = None) -> str:
    """Whether a row counts for the partition holding timestamp column `at` (the window start of a
    flow's row copy, a stage row's event time); rows of partitions outside `plans` never count.
    `group_hash`: SQL of a flow row's group hash (a stage row's key hash), for the groups plans
    recompute alone (`refill_groups`); `members`: SQL a row of those groups also meets (see there).
    Map lookups rather than the run's timestamps and versions: the same code every run (stable_sql.py)."""
    refilled = stable_sql.in_ranges_sql(at, [r for p in plans for r in spec.refilled_ranges(p.interval, p.refill)],
                                        spec.granularity)
    merges: dict[str, dict[int, tuple[int, ...]]] = {}
    for p in plans:
        for src, versions in p.incremental_versions.items():
            if versions:
                merges.setdefault(src, {})[partition_id(p.partition, spec.granularity)] = tuple(sorted(versions))
    part = partition_id_sql(at, spec.granularity)
    merged = [f"({SRC} = {sql_string(src)} AND {stable_sql.contains_sql(by_part, part, DVER)})"
              for src, by_part in sorted(merges.items())]
    groups = refilled_groups_sql(spec, plans, at, group_hash, members)
    alone = f" WHEN {groups} THEN {SNAP}" if groups != "false" else ""
    return f"CASE WHEN {refilled} THEN {SNAP}{alone} ELSE {' OR '.join(merged) or 'false'} END"


def refilled_groups_sql(spec, plans: list[PartitionPlan], at: str, group_hash: str | None,
                        members: str | None = None) -> str:
    """Whether a row's group (hash SQL `group_hash`; window start `at`) is one `plans` recompute
    alone; false when none is. Only inside the windows holding those groups, whose snapshot files the
    run reads: a group elsewhere that shares a hash keeps its own state. `members`: SQL the group's
    rows also meet (a stage's key values, when files are skipped by them: a key whose hash collides
    with a changed key's is then an ordinary key, not one whose rows the skipped files hide)."""
    hashes = sorted({h for p in plans for h in p.refill_groups})
    if not hashes or group_hash is None:
        return "false"
    inside = stable_sql.in_ranges_sql(at, [w for p in plans for w in p.group_windows], spec.granularity)
    also = f" AND coalesce({members}, false)" if members else ""
    return f"({inside} AND coalesce({group_hash} IN ({', '.join(f'{h}L' for h in hashes)}), false){also})"


def key_values(rows) -> tuple[tuple, ...]:
    """Collected key tuples as `PartitionPlan.group_keys`: empty when one holds a NULL or a type
    other than int or string (statistics of other types do not compare like Python values)."""
    values = tuple(tuple(r) for r in rows)
    if not all(isinstance(v, int | str) and not isinstance(v, bool) for t in values for v in t):
        return ()
    return values
