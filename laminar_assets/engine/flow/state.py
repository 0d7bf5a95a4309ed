"""A flow's state table: reading the committed state of partitions, finalizing state rows into
sink rows, and re-deriving sinks from committed state when a crashed run is recovered."""

from __future__ import annotations

import logging

from deltalake.exceptions import DeltaError
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from laminar_assets import storage

from ..aggregates.algebra import implementation, q
from ..delta.tables import info_of, is_delta_table, read_in_driver, snapshot_files, table_info
from ..output.commit import replace_ranges
from ..output.uncommitted import write_uncommitted
from ..run.context import RunContext
from ..run.reading import PART, with_partition
from ..spark import stable_sql
from ..spark.query import Query
from ..spark.query import frame as sql_frame
from ..spark.read import read_source
from ..spec.specs import FlowSpec
from ..windows import partition_interval, share_inside

WS, WE = "window_start", "window_end"
log = logging.getLogger(__name__)


def finalize(spec: FlowSpec, state: DataFrame, *, keep: tuple[str, ...] = (),
             partitioned: bool | None = None) -> DataFrame:
    """Sink rows (business columns, plus `__p` when the state has it, plus the state columns `keep`).
    `partitioned`: whether `state` has `__p` (asked of Spark when not given)."""
    impls = [implementation(a) for a in spec.aggregates]
    extra = [PART] if (PART in state.columns if partitioned is None else partitioned) else []
    finals, post, _ = sink_columns(spec, impls)
    out = state.selectExpr(*extra, WS, WE, *[q(k) for k in spec.keys], *[f"{e} AS {q(n)}" for n, e in finals],
                           *[q(c) for c in keep])
    for name, expr in post:
        out = out.withColumn(name, F.expr(expr))
    return out.drop(*spec.hidden) if spec.hidden else out


def sink_columns(spec: FlowSpec, impls) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[str]]:
    """How state rows become sink rows: (aggregate name, SQL over the state columns) per aggregate,
    the spec's `post` columns (each may use the ones before), and the sink's business columns after
    the keys (hidden aggregates left out)."""
    finals = [(impl.agg.name, impl.finalize_expr()) for impl in impls]
    names = [a.output for a in spec.aggregates if a.output not in spec.hidden]
    return finals, list(spec.post_pairs), [*names, *dict(spec.post_pairs)]


def rederive_sinks(ctx: RunContext, spec: FlowSpec, items: list[tuple[str, int, dict]], run_id: str) -> None:
    """Recovery: finalize the committed state of partitions whose sink commit did not land
    (items: partition, seq, input schema) into the sink, with their app transactions."""
    for schema_key in {tuple(sorted(s.items())) for _, _, s in items}:
        group = [(k, seq) for k, seq, s in items if tuple(sorted(s.items())) == schema_key]
        state = read_state(ctx, spec, [k for k, _ in group], dict(schema_key))
        if state is None:
            continue
        sink = write_uncommitted(finalize(spec, with_partition(state, spec, WS)).repartition(PART),
                                 ctx.layout.sink_uri(spec), run_id + "-sink", by=PART)
        replace_ranges(ctx.spark, sink, table_uri=ctx.layout.sink_uri(spec), column=WS,
                       ranges=[partition_interval(k, spec.granularity) for k, _ in group],
                       transactions=[(ctx.layout.app_id(spec, k), seq) for k, seq in group],
                       metadata={"laminar.run_id": run_id, "laminar.flow": spec.name, "laminar.recovered": "true"},
                       run_id=run_id + "-sink", reset_on_schema_change=True, owner=spec.name,
                       driver_write_below_bytes=ctx.options.driver_write_below_bytes)


def state_groups(ctx: RunContext, spec: FlowSpec, key: str, input_schema: dict) -> int | None:
    """How many groups (state rows) partition `key` holds, from the state files' statistics (no data
    is read); None when there is no state or a file has no row count."""
    return state_extent(ctx, spec, key, input_schema)[0]


def state_extent(ctx: RunContext, spec: FlowSpec, key: str, input_schema: dict) -> tuple[int | None, int | None]:
    """`state_groups` and the bytes of the state files of partition `key` (what a merge reads of it),
    from the table's log (no data is read); (None, None) when unknown."""
    uri = ctx.layout.state_uri(spec, input_schema)
    part = partition_interval(key, spec.granularity)
    try:
        if not is_delta_table(uri):
            return None, None
        files = snapshot_files(table_info(f"{spec.name} state", uri), WS, [part])
    except (DeltaError, OSError) as exc:
        # only an estimate's input: the run decides without it, and its pass reads the table itself
        log.warning("%s: the state's group count for %s is unknown (%s)", spec.name, key, exc)
        return None, None
    # the bytes a merge reads: whole files; the groups of a file of several adjacent partitions (a batched
    # pass's) by the share of its time range in this one, an estimate
    size = sum(f.size for f in files)
    counted = [(f.rows, f.time_range) for f in files if f.rows is not None]
    if len(counted) < len(files):
        return None, size
    return round(sum(rows * share_inside(time_range, part) for rows, time_range in counted)), size


def read_state(ctx: RunContext, spec: FlowSpec, keys: list[str], input_schema: dict) -> DataFrame | None:
    """The committed state rows of `keys` (only their files are read)."""
    return state_rows(ctx, spec, keys, input_schema)[0]


def state_rows(ctx: RunContext, spec: FlowSpec, keys: list[str], input_schema: dict, *,
               opened: dict | None = None) -> tuple[DataFrame | None, int]:
    """`read_state` and the bytes of the files it reads. `opened`: the run's open tables
    (`RunInputs.opened`): the state is read from the snapshot the run's intent checked."""
    query, size = state_query(ctx, spec, keys, input_schema, opened=opened)
    return (query.run(ctx.spark) if query is not None else None), size


def state_query(ctx: RunContext, spec: FlowSpec, keys: list[str], input_schema: dict, *,
                opened: dict | None = None) -> tuple[Query | None, int]:
    """`state_rows` as a query (its columns: the state table's)."""
    uri = ctx.layout.state_uri(spec, input_schema)
    table = (opened or {}).get(uri)
    if not keys or (table is None and not is_delta_table(uri)):
        return None, 0
    parts = [partition_interval(k, spec.granularity) for k in keys]
    info = info_of(f"{spec.name} state", uri, table) if table is not None else table_info(f"{spec.name} state", uri)
    files = snapshot_files(info, WS, parts)
    # a lookup by partition number, not the partitions' timestamps: the same code every run (stable_sql.py)
    inside = stable_sql.in_ranges_sql(WS, parts, spec.granularity)
    scan = sql_frame("state", _state_frame(ctx, info, files), tuple(info.schema.names))
    return scan.where(inside), sum(f.size for f in files)


def _state_frame(ctx: RunContext, info, files) -> DataFrame:
    """The rows of the state files `files`: read by the driver and handed to Spark when the table is in a bucket
    and they are small (`EngineOptions.driver_read_below_bytes`: a GET each instead of Spark's HEAD and GET), else
    read by Spark."""
    limit = ctx.options.driver_read_below_bytes
    if files and limit > 0 and storage.is_object_store(info.uri):
        rows = read_in_driver(info, list(files), max_bytes=limit - 1)
        if rows is not None:
            return ctx.spark.createDataFrame(rows)
    return read_source(ctx.spark, files, info)
