"""Spark reads of Delta file sets, and Spark writes of Parquet files for `deltalake` to commit.

Spark never opens the Delta log: it reads exactly the Parquet files a pinned
snapshot or a commit names, and writes new Parquet files into the table's folder
(`stage`). The commit that publishes them is `delta_write`'s job.

Files are laid out per partition: `stage(..., by=column)` writes one file per value
of a partition-id column, so replacing one partition's rows later removes that
partition's files and rewrites nobody else's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from .delta_log import DataFile, local_path

CHANGE_TYPE = "_change_type"


def spark_path(uri: str) -> str:
    local = local_path(uri)
    return f"file://{os.path.abspath(local)}" if local is not None else uri


def spark_schema(schema: pa.Schema) -> StructType:
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def arrow_schema_of(df: DataFrame) -> pa.Schema:
    return to_arrow_schema(df.schema, timezone="UTC")


def empty_frame(spark: SparkSession, schema: pa.Schema) -> DataFrame:
    return spark.createDataFrame([], spark_schema(schema))


def read_files(
    spark: SparkSession, files: Sequence[DataFile], schema: pa.Schema, partition_columns: Sequence[str] = (),
    *, change_data: bool = False, delta_schema: str | None = None,
) -> DataFrame:
    """Rows of `files` with the table's schema; partition values come from the Delta log.

    `delta_schema`: the Delta schema JSON of a table with column mapping: Parquet columns are read
    by their physical names and renamed to the logical ones. A file with a deletion vector loses
    its deleted rows; a file whose vector a commit changed (`DataFile.dv_change`) yields only the
    rows that commit deleted (`_change_type` 'delete') or restored ('insert')."""
    full = spark_schema(schema)
    physical = _physical_fields(delta_schema) if delta_schema else {}
    file_fields = [physical.get(f.name, f) for f in full.fields if f.name not in partition_columns]
    if change_data:
        file_fields.append(StructField(CHANGE_TYPE, StringType(), True))
    file_schema = StructType(file_fields)
    if not files:
        return spark.createDataFrame([], StructType([*full.fields, *([file_schema[CHANGE_TYPE]] if change_data else [])]))
    # logical columns from physical ones (a cast renames nested struct fields too)
    out_cols = []
    for f in full.fields:
        if f.name in partition_columns:
            out_cols.append(f.name)
        elif f.name in physical:
            out_cols.append(F.col(f"`{physical[f.name].name}`").cast(f.dataType).alias(f.name))
        else:
            out_cols.append(F.col(f"`{f.name}`"))
    groups: dict[tuple, list[DataFile]] = {}
    for f in files:
        groups.setdefault((f.partition_values, f.needs_row_positions, f.change_data), []).append(f)
    out = None
    for (values, by_position, cdf_file), group in groups.items():
        if by_position:
            df = _select_positions(spark, file_schema, group, change_data)
        else:
            df = spark.read.schema(file_schema).parquet(*[spark_path(f.uri) for f in group])
            if change_data and not cdf_file:  # data files read as change data (e.g. adds of a DV commit)
                df = df.withColumn(CHANGE_TYPE, F.lit("insert"))
        lookup = dict(values)
        for field in full.fields:
            if field.name in partition_columns:
                df = df.withColumn(field.name, F.lit(lookup.get(field.name)).cast(field.dataType))
        df = df.select(*out_cols, *([CHANGE_TYPE] if change_data else []))
        out = df if out is None else out.unionByName(df)
    return out


def read_source(spark: SparkSession, files: Sequence[DataFile], info, *, change_data: bool = False) -> DataFrame:
    """`read_files` with a source's schema, partition columns and column mapping (`info`: a TableInfo)."""
    return read_files(spark, files, info.schema, info.partition_columns, change_data=change_data,
                      delta_schema=info.delta_schema if info.column_mapping != "none" else None)


_FILE, _ROW = "__file", "__row"


def _select_positions(spark: SparkSession, file_schema: StructType, files: Sequence[DataFile],
                      change_data: bool) -> DataFrame:
    """Rows of files with deletion vectors, by row position (`_metadata.row_index`): deleted rows
    dropped, or for a changed vector only the changed rows, signed through `_change_type`."""
    names = [os.path.basename(f.uri) for f in files]
    if len(set(names)) != len(names):  # positions are matched by file name: read clashing files apart
        parts = [_select_positions(spark, file_schema, [f], change_data) for f in files]
        out = parts[0]
        for p in parts[1:]:
            out = out.unionByName(p)
        return out
    df = spark.read.schema(file_schema).parquet(*[spark_path(f.uri) for f in files])
    df = df.select("*", F.col("_metadata.file_name").alias(_FILE), F.col("_metadata.row_index").alias(_ROW))
    dropped, changed = [], []
    for f, name in zip(files, names):
        if f.dv_change is not None:
            deleted, restored = f.dv_change.signed_positions()
            changed.append(pa.table({_FILE: pa.array([name] * len(deleted), pa.string()), _ROW: deleted,
                                     "__ct": pa.array(["delete"] * len(deleted), pa.string())}))
            changed.append(pa.table({_FILE: pa.array([name] * len(restored), pa.string()), _ROW: restored,
                                     "__ct": pa.array(["insert"] * len(restored), pa.string())}))
        else:
            rows = f.deleted.positions()
            dropped.append(pa.table({_FILE: pa.array([name] * len(rows), pa.string()), _ROW: rows}))
    parts = []
    plain = [n for f, n in zip(files, names) if f.dv_change is None]
    if plain:
        kept = df.where(F.col(_FILE).isin(plain))
        positions = _one_chunk(dropped)
        if positions is not None:
            kept = kept.join(F.broadcast(spark.createDataFrame(positions)), [_FILE, _ROW], "left_anti")
        if change_data:
            kept = kept.withColumn(CHANGE_TYPE, F.lit("insert"))
        parts.append(kept)
    if changed:
        if not change_data:
            raise ValueError("a file whose deletion vector changed is change data: read it with change_data=True")
        positions = _one_chunk(changed)
        picked = df.where(F.col(_FILE).isin([n for f, n in zip(files, names) if f.dv_change is not None]))
        picked = picked.drop(CHANGE_TYPE)
        if positions is not None:
            picked = picked.join(F.broadcast(spark.createDataFrame(positions)), [_FILE, _ROW], "inner") \
                .withColumnRenamed("__ct", CHANGE_TYPE)
        else:
            picked = picked.where(F.lit(False)).withColumn(CHANGE_TYPE, F.lit(None).cast("string"))
        parts.append(picked)
    out = parts[0]
    for p in parts[1:]:
        out = out.unionByName(p)
    return out.drop(_FILE, _ROW)


def _one_chunk(tables: list[pa.Table]) -> pa.Table | None:
    """The tables as one table of one chunk, None if empty. PySpark 4.3's createDataFrame(arrow)
    silently drops the chunks after an empty one, so an empty chunk must never reach it."""
    tables = [t for t in tables if t.num_rows]
    return pa.concat_tables(tables).combine_chunks() if tables else None


def _physical_fields(delta_schema: str) -> dict[str, StructField]:
    """Logical column name -> the field as stored in Parquet (physical names, nested ones too)."""
    def physical_type(t):
        if isinstance(t, dict) and t.get("type") == "struct":
            return {**t, "fields": [{**f, "name": _physical_name(f), "type": physical_type(f["type"]), "metadata": {}}
                                    for f in t["fields"]]}
        if isinstance(t, dict) and t.get("type") == "array":
            return {**t, "elementType": physical_type(t["elementType"])}
        if isinstance(t, dict) and t.get("type") == "map":
            return {**t, "keyType": physical_type(t["keyType"]), "valueType": physical_type(t["valueType"])}
        return t

    schema = json.loads(delta_schema)
    stored = StructType.fromJson(physical_type(schema))
    return {f["name"]: StructField(stored.fields[i].name, stored.fields[i].dataType, True)
            for i, f in enumerate(schema["fields"])}


def _physical_name(field: dict) -> str:
    return (field.get("metadata") or {}).get("delta.columnMapping.physicalName", field["name"])


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
