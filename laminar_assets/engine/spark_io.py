"""Spark writes of Parquet files for `deltalake` to commit, and the Spark/Arrow schema helpers.

Spark never opens the Delta log: it reads exactly the Parquet files a pinned
snapshot or a commit names (`spark_read`), and writes new Parquet files into the
table's folder (`stage`). The commit that publishes them is `delta_write`'s job.

Files are laid out per partition: `stage(..., by=column)` writes one file per value
of a partition-id column, so replacing one partition's rows later removes that
partition's files and rewrites nobody else's.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from .delta_log import local_path



def spark_path(uri: str) -> str:
    local = local_path(uri)
    return f"file://{os.path.abspath(local)}" if local is not None else uri


def spark_schema(schema: pa.Schema) -> StructType:
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def arrow_schema_of(df: DataFrame) -> pa.Schema:
    return to_arrow_schema(df.schema, timezone="UTC")


def empty_frame(spark: SparkSession, schema: pa.Schema) -> DataFrame:
    return spark.createDataFrame([], spark_schema(schema))


# --- writing ---------------------------------------------------------------


def _stat_value(value):
    if isinstance(value, datetime):
        return value.isoformat(timespec="microseconds").replace("+00:00", "Z")
    if isinstance(value, (bytes, bytearray)):
        return None
    return value


def file_stats(path: str) -> tuple[int, str]:
    """numRecords, min/max/nullCount of top-level primitive columns, from the Parquet footer."""
    meta = pq.read_metadata(path)
    mins, maxs, nulls = {}, {}, {}
    schema = meta.schema.to_arrow_schema()
    for field in schema:
        if pa.types.is_nested(field.type) or pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type):
            continue
        lo = hi = None
        nc = 0
        complete = True
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(meta.schema.names.index(field.name)).statistics
            if st is None:
                complete = False
                break
            nc += st.null_count or 0
            if st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
        if not complete:
            continue
        nulls[field.name] = nc
        if lo is not None:
            if isinstance(lo, datetime):
                # Delta statistics may be read at millisecond precision: floor min, ceil max.
                lo = lo - timedelta(microseconds=lo.microsecond % 1000)
                if hi.microsecond % 1000:
                    hi = hi + timedelta(microseconds=1000 - hi.microsecond % 1000)
            mins[field.name], maxs[field.name] = _stat_value(lo), _stat_value(hi)
    stats = {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return meta.num_rows, json.dumps(stats, default=str)


@dataclass(frozen=True)
class StagedFiles:
    """Parquet files Spark wrote into a table folder, not yet committed."""

    adds: tuple[AddAction, ...]
    rows: int
    schema: pa.Schema | None
    folder: str | None = None  # the local staging folder (removed by `discard`)

    def rows_by_partition(self) -> dict[int, int]:
        """Rows staged per partition number, for files staged with `by="__p"` (from their names)."""
        out: dict[int, int] = {}
        for a in self.adds:
            match = re.match(r"p-(-?\d+)-", os.path.basename(a.path))
            if match:
                pid = int(match.group(1))
                out[pid] = out.get(pid, 0) + json.loads(a.stats)["numRecords"]
        return out

    def discard(self) -> None:
        """Delete files that will never be committed (a run that escalates re-stages)."""
        if self.folder and os.path.isdir(self.folder):
            shutil.rmtree(self.folder, ignore_errors=True)



def observe(df: DataFrame, observation, *metrics) -> DataFrame:
    """`df.observe(observation, *metrics)` for a batch frame. The Spark Connect client first asks the
    server whether `df` is streaming, one more analysis of the whole plan per call; run frames never
    are, so that answer is given up front."""
    if isinstance(getattr(type(df), "isStreaming", None), functools.cached_property):  # Connect's DataFrame
        df.__dict__["isStreaming"] = False
    return df.observe(observation, *metrics)



# Spark settings that make a query evaluate expressions without generating and compiling Java code.
# `factoryMode` is marked internal in Spark; if a later version ignores it, queries compile as usual.
_INTERPRETED = {"spark.sql.codegen.wholeStage": "false", "spark.sql.codegen.factoryMode": "NO_CODEGEN"}


_interpreted_lock = threading.Lock()
_interpreted_users: dict[int, tuple[int, dict]] = {}  # id(session) -> (passes inside, settings before)


@contextlib.contextmanager
def interpreted(spark: SparkSession, enabled: bool):
    """Run the block's Spark jobs with interpreted expressions when `enabled` (small inputs: each
    query's generated code is new, so compiling it costs more than it saves), then restore the
    session's settings.

    The settings belong to the session, which concurrent runs (threads) may share: the first pass
    in sets them, the last one out restores what was there before."""
    if not enabled:
        yield
        return
    key = id(spark)
    with _interpreted_lock:
        users, before = _interpreted_users.get(key, (0, None))
        if users == 0:
            before = {k: spark.conf.get(k, None) for k in _INTERPRETED}
            for k, v in _INTERPRETED.items():
                spark.conf.set(k, v)
        _interpreted_users[key] = (users + 1, before)
    try:
        yield
    finally:
        with _interpreted_lock:
            users, before = _interpreted_users.pop(key)
            if users > 1:
                _interpreted_users[key] = (users - 1, before)
            else:
                for k, v in before.items():
                    if v is None:
                        spark.conf.unset(k)
                    else:
                        spark.conf.set(k, v)


def stage(df: DataFrame, table_uri: str, run_id: str, *, by: str | None = None, max_files: int = 1,
          folder: str = "laminar", partition_values: dict[str, str] | None = None) -> StagedFiles:
    """Write `df` as Parquet under `<table>/<folder>/<run_id>/` (one Spark job); empty files are dropped.

    `by`: a column of partition ids; the files are split by it (one per id when `df` is already
    partitioned by it) and the column itself is not written. Otherwise at most `max_files` files.
    `partition_values`: the Delta partition the files belong to (their columns are not in `df`)."""
    local = local_path(table_uri)
    if local is None:
        raise NotImplementedError("writing to object stores needs a local staging path in this version")
    rel_dir = f"{folder}/{run_id}"
    target = os.path.join(local, rel_dir)
    writer = (df.write.partitionBy(by) if by else (df.coalesce(max_files) if max_files else df).write)
    # "overwrite": the folder is new for every run (Spark Connect does not accept "errorifexists").
    writer.mode("overwrite").parquet(spark_path(target))
    adds, rows, schema = [], 0, None
    for path in _flatten(target):
        name = os.path.basename(path)
        n, stats = file_stats(path)
        if schema is None:
            schema = pq.read_schema(path).remove_metadata()
        if n == 0:
            os.remove(path)
            continue
        rows += n
        adds.append(AddAction(
            path=f"{rel_dir}/{name}", size=os.path.getsize(path), partition_values=dict(partition_values or {}),
            modification_time=int(time.time() * 1000), data_change=True, stats=stats,
        ))
    if schema is None:
        schema = arrow_schema_of(df.drop(by) if by else df)
    return StagedFiles(tuple(adds), rows, schema, target)



def read_staged(spark: SparkSession, staged: StagedFiles, table_uri: str) -> DataFrame:
    """The rows of files this run staged under `table_uri`, read back in one scan with their known
    schema (no inference job). Small files are read a few per task, not one task each."""
    if not staged.adds:
        return empty_frame(spark, staged.schema)
    local = local_path(table_uri)
    paths = [spark_path(os.path.join(local, a.path)) for a in staged.adds]
    df = spark.read.schema(spark_schema(staged.schema)).parquet(*paths)
    tasks = int(spark.conf.get("spark.sql.shuffle.partitions") or 4)
    return df.coalesce(tasks) if len(paths) > tasks else df


def _flatten(folder: str) -> list[str]:
    """The Parquet files Spark wrote under `folder`, moved up out of `col=value` subfolders (so no
    reader infers a partition column from the path); Spark's side files are removed."""
    out = []
    for dirpath, _dirs, names in os.walk(folder, topdown=False):
        rel = os.path.relpath(dirpath, folder)
        # no leading "_" or ".": Spark and Hadoop skip such files as hidden
        prefix = "" if rel == "." else rel.replace(os.sep, "-").replace("=", "-").lstrip("_.") + "-"
        for name in names:
            path = os.path.join(dirpath, name)
            if not name.endswith(".parquet"):
                if name.startswith((".", "_")):
                    os.remove(path)
                continue
            if prefix:
                moved = os.path.join(folder, prefix + name)
                os.replace(path, moved)
                path = moved
            out.append(path)
        if dirpath != folder:
            os.rmdir(dirpath)
    return sorted(out)


def nullable(schema: pa.Schema) -> pa.Schema:
    """The schema with every field nullable, nested ones too: Spark marks array elements and struct
    fields non-null or not depending on the expression that built them, which is not a change of shape."""
    return pa.schema([pa.field(f.name, _nullable_type(f.type), True) for f in schema])


def _nullable_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = pa.field(t.value_field.name, _nullable_type(t.value_type), True)
        return pa.list_(item) if pa.types.is_list(t) else pa.large_list(item)
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _nullable_type(f.type), True) for f in t])
    if pa.types.is_map(t):
        return pa.map_(t.key_type, pa.field(t.item_field.name, _nullable_type(t.item_type), True))
    return t


def new_run_id() -> str:
    return f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:10]}"
