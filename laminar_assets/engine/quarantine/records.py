"""Quarantine: source rows that break a rule, kept with the rule, the source version and the row.

One Delta table per source, `<root>/_laminar/quarantine/<source>`, partitioned by
the flow that rejected the rows. Each rejected row has exactly one writer:
  - a row whose event time is usable and inside the spec's bounds belongs to the
    partition run of that time (`partition` = its key);
  - a row with a missing, unparseable or out-of-bounds event time belongs to no
    partition; the flow's sweep records it (`partition` NULL), reading each source
    version once. So does a row whose event time no partition the flow offers holds:
    before its `start`, after now + the engine's `future_horizon` when swept, or
    outside the years partitions can name (`event_time_outside_partitions`).
A write appends only rows not yet recorded for (flow, partition) — an anti-join on
(rule, row) with the flow's files whose event times overlap the run's partitions
(`recorded_files`) — so retried, repeated and refilled runs never record a row twice.
The quarantine is a record of what was rejected: a rejected row later deleted from
the source stays in it.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import cast
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.exceptions import DeltaError
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from laminar_assets import storage

from ..aggregates.base import EVENT_TS, q, sql_string, user_sql
from ..delta.arrow_reads import read_arrow
from ..delta.tables import DataFile, TableInfo, is_delta_table, open_delta, snapshot_files, table_info
from ..output.commit import CHECKPOINT_EVERY, with_user_metadata
from ..output.uncommitted import committed, write_uncommitted, write_uncommitted_table
from ..spark.frames import to_arrow
from ..spark.read import read_source
from ..spec.specs import Spec
from ..windows import PARTITION_SPAN, Interval, later, partition_span, sql_timestamp

RULE, ROW, VERSION, PARTITION_KEY = "__rule", "__row", "__src_version", "__part_key"
MISSING, OUT_OF_BOUNDS, KEY_MISSING = "event_time_missing", "event_time_out_of_bounds", "key_missing"
OUTSIDE_PARTITIONS = "event_time_outside_partitions"

SCHEMA = pa.schema([
    ("flow", pa.string()), ("partition", pa.string()), ("rule", pa.string()), ("source_version", pa.int64()),
    ("event_time", pa.timestamp("us", tz="UTC")), ("row", pa.string()), ("run_id", pa.string()),
    ("quarantined_at", pa.timestamp("us", tz="UTC")),
])


def table_name(source: str) -> str:
    return os.path.basename(source.rstrip("/"))


def declared_rule(spec: Spec, source: str) -> Column:
    """Name of the first declared rule the raw row breaks (false or NULL), else NULL."""
    return F.expr(declared_rule_sql(spec, source))


def rule_kept_sql(rule) -> str:
    """Whether a row keeps `rule`, as Spark SQL: its check, NULL counting as broken."""
    return f"coalesce({user_sql(rule.check)}, false)"


def declared_rule_sql(spec: Spec, source: str) -> str:
    """`declared_rule` as Spark SQL text."""
    terms = [f"WHEN NOT {rule_kept_sql(rule)} THEN {sql_string(rule.name)}" for rule in spec.rules_for(source)]
    return f"CASE {' '.join(terms)} END" if terms else "CAST(NULL AS STRING)"


def key_rule_sql(spec: Spec) -> str:
    """SQL: KEY_MISSING when a key column is NULL, else NULL."""
    missing = " OR ".join(f"{q(k)} IS NULL" for k in spec.key_columns) or "false"
    return f"CASE WHEN {missing} THEN {sql_string(KEY_MISSING)} END"


def assigned(spec: Spec) -> Column:
    """True for rows a partition run owns: a usable event time inside the bounds."""
    return F.expr(assigned_sql(spec))


def assigned_sql(spec: Spec) -> str:
    """`assigned` as Spark SQL text."""
    ts = q(EVENT_TS)
    ok = f"{ts} IS NOT NULL"
    if spec.bounds is not None:
        ok += f" AND {ts} >= {sql_timestamp(spec.bounds.start)} AND {ts} < {sql_timestamp(spec.bounds.end)}"
    return f"({ok})"


def unassigned_rule(spec: Spec, offered: Interval | None = None) -> Column:
    """The builtin rule a row the sweep records breaks: no event time, out of bounds, or (with
    `offered`, from `offered_events`) an event time no offered partition holds."""
    ts = F.col(EVENT_TS)
    rule = F.when(ts.isNull(), F.lit(MISSING)).when(~assigned(spec), F.lit(OUT_OF_BOUNDS))
    return rule if offered is None else rule.when(~F.expr(_inside_sql(offered)), F.lit(OUTSIDE_PARTITIONS))


def swept(spec: Spec, offered: Interval | None = None) -> Column:
    """Rows the sweep records: those no partition run owns (not `assigned`), and with `offered` those
    whose event time lies outside it."""
    rows = f"NOT {assigned_sql(spec)}"
    return F.expr(rows if offered is None else f"({rows} OR NOT {_inside_sql(offered)})")


def offered_events(spec: Spec, horizon: timedelta | None, now: datetime | None = None) -> Interval:
    """The event times whose rows land in a partition a run of `spec` may be asked for: from its
    `start` (else the first partition Laminar can name) to the windows of the partition holding
    now + `horizon` (else the last one). Rows outside belong to no partition any run will compute."""
    until = later(now or datetime.now(UTC), horizon) if horizon is not None else PARTITION_SPAN.end
    span = partition_span(cast(datetime | None, spec.start), until, spec.granularity)  # __post_init__ parsed it
    try:
        end = spec.events_needed(span).end
    except OverflowError:  # windows wider than the room after the last partition
        end = datetime.max.replace(tzinfo=UTC)
    return Interval(span.start, max(end, span.start))


def _inside_sql(events: Interval) -> str:
    ts = q(EVENT_TS)
    return f"({ts} >= {sql_timestamp(events.start)} AND {ts} < {sql_timestamp(events.end)})"


# ISO 8601 UTC to the microsecond: a row's identity in the quarantine (its JSON) must not change
TIMESTAMP_FORMAT = "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX"


def original_row(columns: list[str]) -> Column:
    """The source row as JSON (timestamps in ISO 8601 UTC). Null fields are left out, so a column
    added to the source later (null in old rows) does not change an old row's identity."""
    return F.to_json(F.struct(*[F.col(c) for c in columns]), {"timestampFormat": TIMESTAMP_FORMAT})


def original_row_sql(columns: list[str]) -> str:
    """`original_row` as Spark SQL text (the same JSON)."""
    fields = ", ".join(f"{sql_string(c)}, {q(c)}" for c in columns)
    return f"to_json(named_struct({fields}), map('timestampFormat', {sql_string(TIMESTAMP_FORMAT)}))"


def recorded_files(uri: str, flow: str, within: Sequence[Interval] | None = None
                   ) -> tuple[TableInfo | None, list[DataFile]]:
    """(table info, data files) of the rows `flow` has recorded in the quarantine table at `uri`
    that a write of rejects from `within` (event-time intervals) must check against: only files
    whose event-time statistics overlap them, since a recorded row's partition key comes from its
    event time. None: the sweep's rows, which have no partition (and often no event time): only
    files whose statistics say they hold a NULL `partition`. Without this a run's check read the
    flow's whole quarantine history."""
    if not is_delta_table(uri):
        return None, []
    info = table_info(table_name(uri), uri)
    files = snapshot_files(info, "event_time" if within is not None else None, within)
    mine = [f for f in files if dict(f.partition_values).get("flow") == flow]
    if within is None:
        partitioned = _without_null_partition(info)
        mine = [f for f in mine if unquote(f.uri.rsplit("/", 1)[-1]) not in partitioned]
    return info, mine


def _without_null_partition(info) -> set[str]:
    """Names of the files whose statistics prove every row has a `partition` (files a run of
    some partition wrote); files without statistics are not in it."""
    actions = pa.table(info.delta().get_add_actions(flatten=True))
    if "null_count.partition" not in actions.column_names:
        return set()
    nulls = actions.column("null_count.partition").to_pylist()
    return {unquote(p.rsplit("/", 1)[-1]) for p, n in zip(actions.column("path").to_pylist(), nulls) if n == 0}


def _existing(spark: SparkSession, info, files: list) -> DataFrame | None:
    if not files:
        return None
    return read_source(spark, files, info).select("partition", "rule", "row")


def record(spark: SparkSession, rejects: DataFrame, *, uri: str, flow: str, run_id: str,
           through_driver: bool = False, driver_below_bytes: int = 8 * 1024 * 1024,
           within: Sequence[Interval] | None = None) -> dict[str | None, dict[str, int]]:
    """Append the rows of `rejects` (PARTITION_KEY, RULE, ROW, VERSION, EVENT_TS; a NULL partition for
    the sweep's rows) not yet recorded for (flow, partition); returns the number of new rows by
    partition and rule. One Spark job, one commit. `through_driver`: the caller read few enough
    bytes that the rejects (a subset of those rows) are written by the driver (`output.uncommitted.write_uncommitted`);
    then, when the recorded rows to check against are in fewer than `driver_below_bytes` of plain files,
    the driver also groups the rejects and skips the recorded ones (`_new_in_driver`), so the Spark job is
    a plain read with no shuffle and no join.
    `within`: event-time intervals holding every reject's event time (a run's partitions); only
    recorded rows there are read to skip what is recorded already (`recorded_files`)."""
    info, files = recorded_files(uri, flow, within)
    now = datetime.now(UTC)
    if through_driver and sum(f.size for f in files) < driver_below_bytes and \
            not any(f.needs_row_positions for f in files) and (info is None or info.column_mapping == "none"):
        new = _new_in_driver(rejects, files, run_id, now)
        written = write_uncommitted_table(new, uri, run_id, folder=f"flow={flow}/laminar", partition_values={"flow": flow})
    else:
        written = write_uncommitted(_new_in_spark(spark, rejects, info, files, run_id, now), uri, run_id, max_files=1,
                                    folder=f"flow={flow}/laminar", partition_values={"flow": flow},
                                    through_driver=through_driver)
    return _commit(uri, flow, run_id, written)


def _new_in_spark(spark: SparkSession, rejects: DataFrame, info, files: list, run_id: str,
                  now: datetime) -> DataFrame:
    """The rows of the quarantine to append, as one Spark query: the rejects grouped, less the recorded ones."""
    rows = (rejects.groupBy(F.col(PARTITION_KEY).alias("partition"), F.col(RULE).alias("rule"), F.col(ROW).alias("row"))
            .agg(F.min(VERSION).alias("source_version"), F.min(EVENT_TS).alias("event_time")))
    old = _existing(spark, info, files)
    if old is not None:
        same = rows["partition"].eqNullSafe(old["partition"]) & (rows["rule"] == old["rule"]) & \
            (rows["row"] == old["row"])
        rows = rows.join(old, same, "left_anti")
    return rows.select(
        F.col("partition").cast("string").alias("partition"), "rule", F.col("source_version").cast("long"),
        "event_time", "row", F.lit(run_id).alias("run_id"), F.lit(now).alias("quarantined_at"),
    )


_NULL_KEY = "\x00"  # stands for a NULL partition in the driver's join: no partition key starts with it


def _new_in_driver(rejects: DataFrame, files: list, run_id: str, now: datetime) -> pa.Table:
    """`_new_in_spark`'s rows, computed in the driver: the rejects (few: the caller read few bytes) sent as
    Arrow by a Spark job without a shuffle, grouped by pyarrow, less the recorded rows of `files` (plain
    Parquet files, read by pyarrow). The same rows: a NULL partition matches a NULL one, as `eqNullSafe`."""
    rows = to_arrow(rejects.select(F.col(PARTITION_KEY).cast("string").alias("partition"), F.col(RULE).alias("rule"),
                          F.col(ROW).alias("row"), F.col(VERSION).cast("long").alias("source_version"),
                          F.col(EVENT_TS).alias("event_time")))
    rows = rows.cast(pa.schema([("partition", pa.string()), ("rule", pa.string()), ("row", pa.string()),
                                ("source_version", pa.int64()), ("event_time", pa.timestamp("us", tz="UTC"))]))
    grouped = rows.group_by(["partition", "rule", "row"], use_threads=False).aggregate(
        [("source_version", "min"), ("event_time", "min")])
    grouped = grouped.append_column("_key", pa.compute.fill_null(grouped["partition"], _NULL_KEY))
    if files and grouped.num_rows:
        old = []
        for f in files:
            fs, path = storage.filesystem(f.uri)
            old.append(pq.read_table(path, columns=["partition", "rule", "row"], filesystem=fs))
        old_rows = pa.concat_tables(old)
        old_rows = pa.table({"_key": pa.compute.fill_null(old_rows["partition"].cast(pa.string()), _NULL_KEY),
                             "rule": old_rows["rule"].cast(pa.string()), "row": old_rows["row"].cast(pa.string())})
        grouped = grouped.join(old_rows, keys=["_key", "rule", "row"], join_type="left anti", use_threads=False)
    n = grouped.num_rows
    return pa.table({
        "partition": grouped["partition"], "rule": grouped["rule"], "source_version": grouped["source_version_min"],
        "event_time": grouped["event_time_min"], "row": grouped["row"],
        "run_id": pa.array([run_id] * n, pa.string()),
        "quarantined_at": pa.array([now] * n, pa.timestamp("us", tz="UTC")),
    })


def _commit(uri: str, flow: str, run_id: str, files) -> dict[str | None, dict[str, int]]:
    """Commit the new rows' files to the quarantine table (created when absent); the new rows by partition and rule."""
    if not files.rows:
        return {}
    if not is_delta_table(uri):
        try:
            DeltaTable.create(uri, schema=SCHEMA, mode="ignore", partition_by=["flow"],
                              configuration={"delta.checkpointInterval": str(CHECKPOINT_EVERY)},
                              storage_options=storage.delta_options(uri))
        except DeltaError:  # a concurrent run created it first
            if not is_delta_table(uri):
                raise
    facts = with_user_metadata({"laminar.run_id": run_id, "laminar.flow": flow, "laminar.quarantined": str(files.rows)})
    open_delta(uri).create_write_transaction(list(files.adds), mode="append", schema=SCHEMA, partition_by=["flow"],
                                             commit_properties=CommitProperties(custom_metadata=facts))
    committed(files)
    counts: dict[str | None, dict[str, int]] = {}
    for add in files.adds:  # only the partition and rule columns of what this run just wrote
        fs, path = storage.filesystem(storage.join(uri, *add.path.split("/")))
        written = pq.read_table(path, columns=["partition", "rule"], filesystem=fs).to_pylist()
        for r in written:
            by_rule = counts.setdefault(r["partition"], {})
            by_rule[r["rule"]] = by_rule.get(r["rule"], 0) + 1
    return counts


def summarize(uri: str, *, examples: int = 3) -> list[dict]:
    """Counts by (flow, rule) of one quarantine table, with version range and example rows.
    Spark-free: the quarantine holds rejected rows only, read with deltalake/pyarrow."""
    if not is_delta_table(uri):
        return []
    table = read_arrow(uri, columns=["flow", "rule", "source_version", "row"])
    grouped = table.group_by(["flow", "rule"]).aggregate(
        [("source_version", "min"), ("source_version", "max"), ("row", "count")])
    out = []
    for g in sorted(grouped.to_pylist(), key=lambda r: (r["flow"], r["rule"])):
        mask = pa.compute.and_(pa.compute.equal(table["flow"], g["flow"]), pa.compute.equal(table["rule"], g["rule"]))
        rows = table.filter(mask).column("row").slice(0, examples).to_pylist()
        out.append({"source": table_name(uri), "flow": g["flow"], "rule": g["rule"], "rows": g["row_count"],
                    "min_version": g["source_version_min"], "max_version": g["source_version_max"], "examples": rows})
    return out
