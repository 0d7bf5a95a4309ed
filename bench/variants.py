"""The batch variants: Laminar incremental, Laminar refill of the touched partitions, and a naive full
recompute of the whole sink from the whole source.

Laminar runs go through the public engine API, along two paths (`PATHS`): `Engine.run` once per
touched partition, and `Engine.run_many` over all touched partitions of a flow. Which partitions a
set of commits touched comes from `laminar_assets.engine.report` (Delta file statistics, no data
read), exactly as the Delta-version sensors find them. The full recompute shares no code with the
engine: Spark's own `window()` and aggregate functions over every data file of the snapshot,
written as one Delta overwrite commit per sink.
"""

from __future__ import annotations

import os
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import IntegralType

from laminar_assets import storage
from laminar_assets.engine import Engine, FlowSpec, RunResult
from laminar_assets.engine.delta import is_delta_table, open_delta
from laminar_assets.engine.report import dirty_partitions, new_commits

from .workload import Lake

STAGES = ("plan", "read", "state", "merge", "write", "watermark")
SINK_KEYS = ("window_start", "window_end")


@dataclass
class LaminarPass:
    """One pass of `Engine.run` over a set of (flow, partition) pairs, and what it measured."""

    wall_s: float = 0.0
    discover_s: float = 0.0  # finding the touched partitions from the new commits' statistics
    partitions: dict[str, list[str]] = field(default_factory=dict)
    results: list[tuple[str, RunResult]] = field(default_factory=list)

    @property
    def runs(self) -> int:
        return len(self.results)

    def stage_seconds(self) -> dict[str, float]:
        out = {s: 0.0 for s in STAGES}
        for _, r in self.results:
            for k, v in r.seconds.items():
                out[k] = out.get(k, 0.0) + v
        return {k: round(v, 4) for k, v in out.items()}

    def metric_totals(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for _, r in self.results:
            for k, v in r.metrics.items():
                if isinstance(v, (int, float)):
                    out[k] = out.get(k, 0) + v
        return out

    def modes(self) -> dict[str, dict[str, int]]:
        """flow -> 'MODE/REASON' -> count."""
        out: dict[str, dict[str, int]] = {}
        for flow, r in self.results:
            key = f"{r.mode.value}/{r.reason.value}"
            out.setdefault(flow, {})[key] = out.setdefault(flow, {}).get(key, 0) + 1
        return out

    def per_run(self) -> list[dict]:
        return [{"flow": flow, "partition": r.plan.partition, "mode": r.mode.value, "reason": r.reason.value,
                 "detail": r.plan.detail,
                 "rows_read": int(r.metrics.get("rows_read", 0)), "files_read": int(r.metrics.get("files_read", 0)),
                 "seconds": round(sum(r.seconds.values()), 4),
                 **{f"s_{k}": round(v, 4) for k, v in r.seconds.items()}}
                for flow, r in self.results]

    def summary(self) -> dict:
        return {"wall_s": round(self.wall_s, 4), "discover_s": round(self.discover_s, 4), "runs": self.runs,
                "partitions": {k: len(v) for k, v in self.partitions.items()},
                "modes": self.modes(), "stage_seconds": self.stage_seconds(), "metrics": self.metric_totals()}


def touched_partitions(engine: Engine, specs: list[FlowSpec], after: int | None) -> dict[str, list[str]]:
    """flow -> partitions the commits after version `after` touched (all partitions if None),
    from Delta file statistics only, as the version sensors compute them (a source's new commits
    read once for the flows that share it and its event time, as a sensor tick does)."""
    out, seen = {}, {}
    for spec in specs:
        source = spec.sources[0]
        key = (source, spec.event_time)
        if key not in seen:
            seen[key] = new_commits(engine.root, source, spec.event_time, after)
        changes = seen[key]
        keys = dirty_partitions(spec, changes) if changes else []
        if changes is not None and changes.unknown_range:
            keys = sorted(set(keys) | set(engine.store.partitions(spec.name)))
        out[spec.name] = keys
    return out


PATHS = {
    "per_partition": "Engine.run once per touched partition, one after another (a run per partition, as "
                     "materializing one partition at a time does)",
    "batched": "the sensor's run: Engine.run_many over all touched partitions of a flow (one shared read/merge "
               "job, one state and one sink commit), the flows side by side in threads, as the one run a "
               "version sensor requests per tick executes them (orchestration/internals/thread_executor.py)",
}


def has_run_many(engine: Engine) -> bool:
    return callable(getattr(engine, "run_many", None))


def side_by_side(work: dict, fn) -> dict:
    """`fn(item)` for every item of `work` in threads, one per item (at most one per core, as the
    thread executor runs a Dagster run's steps); returns {key: result}, raising the first error."""
    with ThreadPoolExecutor(max_workers=max(1, min(len(work), os.cpu_count() or 1))) as pool:
        futures = {k: pool.submit(fn, v) for k, v in work.items()}
        return {k: f.result() for k, f in futures.items()}


def laminar_pass(engine: Engine, specs: list[FlowSpec], *, after: int | None, force: bool = False,
                 partitions: dict[str, list[str]] | None = None, batched: bool = False) -> LaminarPass:
    """Bring every flow up to date for the commits after `after` (or run `partitions` as given).
    `force=True` refills them (`FORCED_BY_USER`): what a partition-overwrite tool does.
    `batched`: one `Engine.run_many` per flow, the flows side by side, instead of one `Engine.run`
    per partition, one after another."""
    out = LaminarPass()
    t0 = time.perf_counter()
    if partitions is None:
        partitions = touched_partitions(engine, specs, after)
    out.discover_s = time.perf_counter() - t0
    out.partitions = partitions
    if batched:
        work = {s.name: s for s in specs if partitions.get(s.name)}
        done = side_by_side(work, lambda s: engine.run_many(s, partitions[s.name], force=force))
        out.results.extend((name, r) for name in work for r in done[name])
    else:
        for spec in specs:
            out.results.extend((spec.name, engine.run(spec, k, force=force)) for k in partitions.get(spec.name, []))
    out.wall_s = time.perf_counter() - t0
    return out


# --- the naive full recompute ----------------------------------------------------------------


def _reference_agg(agg, df: DataFrame):
    """Spark's own aggregate for one Agg (same semantics as tests/reference.py)."""
    c = F.col(agg.column) if agg.column else None
    if agg.kind == "count":
        return F.count(F.lit(1)) if c is None else F.count(c)
    if agg.kind == "sum":
        integral = isinstance(df.schema[agg.column].dataType, IntegralType)
        return F.sum(c.cast("long" if integral else "double"))
    if agg.kind == "avg":
        return F.avg(c)
    if agg.kind in ("min", "max"):
        return F.min(c) if agg.kind == "min" else F.max(c)
    if agg.kind in ("first", "last"):
        fn = F.min_by if agg.kind == "first" else F.max_by
        return fn(c, F.when(c.isNotNull(), F.struct(F.col("__t"), c)))  # earliest/latest; ties by value
    raise NotImplementedError(f"the bench's reference has no {agg.kind}")


def reference_query(source: DataFrame, spec: FlowSpec) -> DataFrame:
    """The whole sink of `spec` from the rows in `source`: window() + groupBy, then `post`."""
    df = source
    for name, expr in spec.derived:
        df = df.withColumn(name, F.expr(expr))
    if spec.filter:
        df = df.where(F.expr(spec.filter))
    df = df.withColumn("__t", F.col(spec.event_time)).where(F.col("__t").isNotNull())
    for k in spec.keys:
        df = df.where(F.col(k).isNotNull())
    size = f"{int(spec.shape.size.total_seconds())} seconds"
    slide = f"{int(spec.shape.slide.total_seconds())} seconds"
    df = df.withColumn("__w", F.window("__t", size, slide))
    out = df.groupBy(F.col("__w.start").alias("window_start"), F.col("__w.end").alias("window_end"),
                     *spec.keys).agg(*[_reference_agg(a, df).alias(a.name) for a in spec.aggregates])
    for name, expr in spec.post:
        out = out.withColumn(name, F.expr(expr))
    return out


def overwrite_delta(df: DataFrame, uri: str) -> int:
    """Spark writes Parquet into the table folder; deltalake commits it as an overwrite. Returns rows."""
    run = uuid.uuid4().hex[:10]
    folder = storage.join(uri, f"full-{run}")
    df.write.mode("errorifexists").parquet(storage.spark_uri(folder))
    adds, rows, schema = [], 0, None
    for path, size in storage.list_files(folder):
        name = path.rsplit("/", 1)[-1]
        if not name.endswith(".parquet"):
            storage.delete(path)
            continue
        fs, located = storage.filesystem(path)
        with fs.open_input_file(located) as fh:
            meta = pq.read_metadata(fh)
        schema = schema or meta.schema.to_arrow_schema().remove_metadata()
        rows += meta.num_rows
        adds.append(AddAction(path=f"full-{run}/{name}", size=size, partition_values={},
                              modification_time=int(time.time() * 1000), data_change=True,
                              stats=f'{{"numRecords": {meta.num_rows}}}'))
    schema = pa.schema([pa.field(f.name, f.type, True) for f in schema])
    if not is_delta_table(uri):
        DeltaTable.create(uri, schema=schema, storage_options=storage.delta_options(uri))
    open_delta(uri).create_write_transaction(adds, mode="overwrite", schema=schema,
                                             commit_properties=CommitProperties(custom_metadata={"bench": "full"}))
    return rows


def full_recompute(spark: SparkSession, lake: Lake, specs: list[FlowSpec], out_root: str,
                   version: int | None = None) -> dict:
    """Recompute every sink from every data file of the source snapshot; one Delta commit per sink.
    The flows run side by side, like Laminar's batched path."""
    out = {"sinks": {}, "seconds": {}, "rows": {}}
    t0 = time.perf_counter()
    files = [storage.spark_uri(p) for p in lake.files(version)]
    out["source_files"] = len(files)

    def one(spec: FlowSpec) -> tuple[int, float]:
        t = time.perf_counter()
        source = spark.read.parquet(*files)
        rows = overwrite_delta(reference_query(source, spec), storage.join(out_root, spec.name))
        return rows, round(time.perf_counter() - t, 4)

    for name, (rows, seconds) in side_by_side({s.name: s for s in specs}, one).items():
        out["rows"][name], out["seconds"][name] = rows, seconds
        out["sinks"][name] = storage.join(out_root, name)
    out["wall_s"] = round(time.perf_counter() - t0, 4)
    return out


def sink_keys(spec: FlowSpec) -> list[str]:
    return [*SINK_KEYS, *spec.keys]
