"""Spark reads of Delta file sets, and Spark writes of Parquet that `deltalake` commits.

Spark never opens the Delta log: it reads exactly the Parquet files a pinned
snapshot or a commit names, and writes new Parquet files into the table's
folder. The commit (adds, removes, the app transaction that makes a run
idempotent) goes through `deltalake.DeltaTable.create_write_transaction`.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Iterable, Sequence

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, RemoveAction
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StringType, StructField, StructType

from .delta_source import DataFile, _local_path, snapshot_files, table_info
from laminar_assets.errors import CommitConflictError
from .windows import Interval

CHANGE_TYPE = "_change_type"


def spark_path(uri: str) -> str:
    local = _local_path(uri)
    return f"file://{os.path.abspath(local)}" if local is not None else uri


def spark_schema(schema: pa.Schema) -> StructType:
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def read_files(
    spark: SparkSession, files: Sequence[DataFile], schema: pa.Schema, partition_columns: Sequence[str] = (),
    *, change_data: bool = False, file_column: str | None = None,
) -> DataFrame:
    """Rows of `files` with the table's schema; partition values come from the Delta log.
    `file_column`: also return the name of the file each row came from (its basename)."""
    full = spark_schema(schema)
    file_fields = [f for f in full.fields if f.name not in partition_columns]
    if change_data:
        file_fields.append(StructField(CHANGE_TYPE, StringType(), True))
    file_schema = StructType(file_fields)
    if not files:
        empty = spark.createDataFrame([], StructType(list(full.fields) + ([file_schema[CHANGE_TYPE]] if change_data else [])))
        return empty.withColumn(file_column, F.lit(None).cast("string")) if file_column else empty
    groups: dict[tuple, list[str]] = {}
    for f in files:
        groups.setdefault(f.partition_values, []).append(spark_path(f.uri))
    frames = []
    for values, paths in groups.items():
        df = spark.read.schema(file_schema).parquet(*paths)
        if file_column:
            df = df.select("*", F.element_at(F.split(F.col("_metadata.file_path"), "/"), -1).alias(file_column))
        lookup = dict(values)
        for field in full.fields:
            if field.name in partition_columns:
                df = df.withColumn(field.name, F.lit(lookup.get(field.name)).cast(field.dataType))
        order = [f.name for f in full.fields] + ([CHANGE_TYPE] if change_data else []) + \
            ([file_column] if file_column else [])
        frames.append(df.select(*order))
    out = frames[0]
    for df in frames[1:]:
        out = out.unionByName(df)
    return out


# --- writing ---------------------------------------------------------------


def _stat_value(value):
    if isinstance(value, datetime):
        return value.isoformat(timespec="microseconds").replace("+00:00", "Z")
    if isinstance(value, (bytes, bytearray)):
        return None
    return value


def _file_stats(path: str) -> tuple[int, str]:
    """numRecords, min/max/nullCount of top-level primitive columns, from the Parquet footer."""
    import json

    meta = pq.read_metadata(path)
    mins, maxs, nulls = {}, {}, {}
    schema = meta.schema.to_arrow_schema()
    for idx, field in enumerate(schema):
        if pa.types.is_nested(field.type) or pa.types.is_binary(field.type) or pa.types.is_large_binary(field.type):
            continue
        lo = hi = None
        nc = 0
        complete = True
        for rg in range(meta.num_row_groups):
            col = meta.row_group(rg).column(meta.schema.names.index(field.name))
            st = col.statistics
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


def stage(df: DataFrame, table_uri: str, run_id: str, *, max_files: int = 1, folder: str = "laminar",
          partition_values: dict[str, str] | None = None) -> StagedFiles:
    """Write `df` as Parquet under `<table>/<folder>/<run_id>/`; empty files are dropped.
    `partition_values`: the Delta partition the files belong to (their columns are not in `df`)."""
    local = _local_path(table_uri)
    if local is None:
        raise NotImplementedError("writing to object stores needs a local staging path in this version")
    rel_dir = f"{folder}/{run_id}"
    out = df.coalesce(max_files) if max_files else df
    out.write.mode("errorifexists").parquet(spark_path(f"{table_uri}/{rel_dir}"))
    adds, rows, schema = [], 0, None
    folder = os.path.join(local, rel_dir)
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not name.endswith(".parquet"):
            if name.startswith(".") or name.startswith("_"):
                os.remove(path)
            continue
        n, stats = _file_stats(path)
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
    return StagedFiles(tuple(adds), rows, schema)


def nullable(schema: pa.Schema) -> pa.Schema:
    return pa.schema([pa.field(f.name, f.type, True) for f in schema])


def ensure_table(uri: str, schema: pa.Schema, *, reset_on_schema_change: bool, change_data: bool = False) -> bool:
    """Create the table if needed; returns True if an existing table was reset to a new schema."""
    schema = nullable(schema)
    try:
        dt = DeltaTable(uri)
    except TableNotFoundError:
        config = {"delta.enableChangeDataFeed": "true"} if change_data else None
        try:
            DeltaTable.create(uri, schema=schema, mode="ignore", configuration=config)
        except Exception:  # a concurrent run created it first
            if not DeltaTable.is_deltatable(uri):
                raise
        return False
    current = pa.schema(dt.schema().to_arrow())
    if [(f.name, str(f.type)) for f in current] == [(f.name, str(f.type)) for f in schema]:
        return False
    if not reset_on_schema_change:
        raise CommitConflictError(f"table at {uri} has schema {current} but this run writes {schema}")
    write_deltalake(uri, schema.empty_table(), mode="overwrite", schema_mode="overwrite")
    return True


def files_in_range(table_uri: str, column: str, rng: Interval, version: int | None = None) -> tuple[list[DataFile], list[DataFile]]:
    """Files of a table (at `version`, else the latest) wholly inside `rng` by stats, and files partly inside it."""
    info = table_info(os.path.basename(table_uri), table_uri, version)
    inside, partial = [], []
    for f in snapshot_files(info, column, [rng]):
        if f.time_range is not None and f.time_range.start >= rng.start and f.time_range.end <= rng.end:
            inside.append(f)
        else:
            partial.append(f)
    return inside, partial


def replace_range(
    spark: SparkSession, df: DataFrame, *, table_uri: str, column: str, rng: Interval | Sequence[Interval],
    run_id: str, app_id: str | None = None, txn_version: int | None = None, metadata: dict, max_files: int = 1,
    append_only: bool = False, reset_on_schema_change: bool = False,
    transactions: Sequence[tuple[str, int]] = (),
) -> int:
    """Atomically replace the rows of `table_uri` with `column` in `rng` (one range or several
    disjoint ones) by `df`.

    One Delta commit removes the files holding only rows of the ranges, rewrites
    files that also hold rows outside them, adds the new files, and records the app
    transactions (`app_id`, `txn_version`, plus `transactions`). Retries on concurrent
    commits. With `append_only`, nothing is removed. Returns the number of rows written.
    """
    ranges = [rng] if isinstance(rng, Interval) else list(rng)
    txns = ([(app_id, txn_version)] if app_id is not None else []) + list(transactions)
    staged = stage(df, table_uri, run_id, max_files=max_files)
    schema = staged.schema or pa.schema([])
    if staged.schema is None:  # nothing written and Spark wrote no schema file
        schema = _arrow_schema_of(df)
    reset = ensure_table(table_uri, schema, reset_on_schema_change=reset_on_schema_change)
    attempts = 0
    while True:
        attempts += 1
        removes: list[RemoveAction] = []
        extra: list[AddAction] = []
        # The commit is based on the same snapshot the file list comes from: a concurrent commit
        # in between makes it fail (max_commit_retries=0) and we list again, instead of removing
        # a file another run already rewrote.
        dt = DeltaTable(table_uri)
        read_version = dt.version()
        if not append_only and not reset:
            inside, partial = {}, {}
            for r in ranges:
                whole, part = files_in_range(table_uri, column, r, read_version)
                inside.update({f.uri: f for f in whole})
                partial.update({f.uri: f for f in part})
            partial = {u: f for u, f in partial.items() if u not in inside}  # ranges are disjoint
            for f in list(inside.values()) + list(partial.values()):
                removes.append(_remove_action(table_uri, f))
            if partial:
                keep = read_partial_keep(spark, table_uri, partial.values(), column, ranges)
                extra = list(stage(keep, table_uri, f"{run_id}-keep-{attempts}", max_files=1).adds)
        props = CommitProperties(
            app_transactions=[Transaction(a, v) for a, v in txns], custom_metadata=metadata, max_commit_retries=0,
        )
        try:
            dt.create_write_transaction(
                list(staged.adds) + extra + removes, mode="append", schema=nullable(schema), commit_properties=props,
            )
            return staged.rows
        except CommitFailedError as exc:
            if attempts >= 8:
                raise CommitConflictError(
                    f"commit to {table_uri} kept conflicting with concurrent writers after {attempts} attempts: {exc}",
                    table=table_uri,
                ) from exc
            time.sleep(0.05 * attempts)


def _remove_action(table_uri: str, f: DataFile) -> RemoveAction:
    rel = os.path.relpath(_local_path(f.uri) or f.uri, _local_path(table_uri) or table_uri)
    return RemoveAction(
        path=rel, data_change=True, deletion_timestamp=int(time.time() * 1000),
        size=f.size, partition_values=dict(f.partition_values),
    )


def read_partial_keep(spark: SparkSession, table_uri: str, files: Iterable[DataFile], column: str,
                      rng: Interval | Sequence[Interval]) -> DataFrame:
    """Rows of `files` outside the range(s): what a replace must write back."""
    info = table_info(os.path.basename(table_uri), table_uri)
    df = read_files(spark, list(files), info.schema, info.partition_columns)
    c = F.col(column)
    outside = c.isNull()
    inside = F.lit(False)
    for r in ([rng] if isinstance(rng, Interval) else rng):
        inside = inside | ((c >= F.lit(r.start)) & (c < F.lit(r.end)))
    return df.where(outside | ~inside)


def _arrow_schema_of(df: DataFrame) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(df.schema, timezone="UTC")


def new_run_id() -> str:
    return f"{datetime.utcnow():%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:10]}"


# --- rewrites with a change data feed ---------------------------------------


def replace_range_with_change_data(
    spark: SparkSession, df: DataFrame, *, table_uri: str, column: str, rng: Interval, run_id: str,
    app_id: str, txn_version: int, metadata: dict,
) -> tuple[int, int, int]:
    """Replace the rows of `rng` by `df` and record the exact row changes as Delta change data.

    Spark computes the difference between the old and new rows of the range
    (`EXCEPT ALL` both ways). With no deleted rows the commit is a plain append of
    the inserted rows; otherwise one commit removes the range's files, adds the new
    ones and adds `_change_data` files holding the deletes and inserts, so readers
    of this table (downstream flows) see precise changes instead of a rewrite.
    Returns (rows written, rows inserted, rows deleted).
    """
    new = df.persist()
    try:
        schema = _arrow_schema_of(new)
        ensure_table(table_uri, schema, reset_on_schema_change=False, change_data=True)
        for attempt in range(1, 9):
            dt = DeltaTable(table_uri)
            read_version = dt.version()
            inside, partial = files_in_range(table_uri, column, rng, read_version)
            info = table_info(os.path.basename(table_uri), table_uri, read_version)
            old_all = read_files(spark, inside + partial, info.schema, info.partition_columns).select(*new.columns)
            c = F.col(column)
            old = old_all.where((c >= F.lit(rng.start)) & (c < F.lit(rng.end)))
            deleted = old.exceptAll(new).persist()
            n_deleted = deleted.count()
            props = dict(app_id=app_id, txn_version=txn_version, metadata=metadata)
            if n_deleted == 0:
                inserted = stage(new.exceptAll(old), table_uri, f"{run_id}-{attempt}")
                if _commit(dt, list(inserted.adds), [], [], read_version, schema, **props):
                    deleted.unpersist()
                    return inserted.rows, inserted.rows, 0
                deleted.unpersist()
                continue
            data = stage(new, table_uri, f"{run_id}-{attempt}")
            keep = stage(read_partial_keep(spark, table_uri, partial, column, rng), table_uri,
                         f"{run_id}-{attempt}-keep") if partial else StagedFiles((), 0, None)
            changes = deleted.withColumn(CHANGE_TYPE, F.lit("delete")).unionByName(
                new.exceptAll(old).withColumn(CHANGE_TYPE, F.lit("insert")))
            cdc = stage(changes, table_uri, f"{run_id}-{attempt}", folder="_change_data/laminar")
            removes = [_remove_action(table_uri, f) for f in inside + partial]
            ok = _commit(dt, list(data.adds) + list(keep.adds), removes, list(cdc.adds), read_version, schema, **props)
            deleted.unpersist()
            if ok:
                return data.rows, cdc.rows - n_deleted, n_deleted
        raise CommitConflictError(f"commit to {table_uri} kept conflicting with concurrent writers", table=table_uri)
    finally:
        new.unpersist()


def _commit(dt: DeltaTable, adds, removes, cdc, read_version: int, schema: pa.Schema, *, app_id: str,
            txn_version: int, metadata: dict) -> bool:
    """One atomic commit; False if another writer took the version first (the caller retries)."""
    if not cdc:
        props = CommitProperties(app_transactions=[Transaction(app_id, txn_version)], custom_metadata=metadata,
                                 max_commit_retries=0)
        try:
            dt.create_write_transaction(list(adds) + list(removes), mode="append", schema=nullable(schema),
                                        commit_properties=props)
            return True
        except CommitFailedError:
            return False
    return _write_commit_with_cdc(dt.table_uri, read_version + 1, adds, removes, cdc, app_id=app_id,
                                  txn_version=txn_version, metadata=metadata)


def _write_commit_with_cdc(uri: str, version: int, adds, removes, cdc, *, app_id: str, txn_version: int,
                           metadata: dict) -> bool:
    """Write commit `version` with `cdc` actions, which deltalake's transaction API cannot commit.

    This follows the Delta protocol exactly: the JSON entry is written to a
    temporary file and published with an atomic no-replace link, so a commit is
    either absent or complete, and a concurrent writer of the same version wins
    cleanly (we return False and the caller retries on the new snapshot).
    """
    import json

    local = _local_path(uri)
    if local is None:
        raise NotImplementedError("change-data commits need a local table path in this version")
    now = int(time.time() * 1000)
    info = {"timestamp": now, "operation": "WRITE", "readVersion": version - 1, "isBlindAppend": False,
            "operationParameters": {"mode": "Overwrite", "predicate": "laminar partition replace"},
            "engineInfo": "laminar", "clientVersion": "laminar-0.1", **metadata}
    lines = [{"commitInfo": info}, {"txn": {"appId": app_id, "version": txn_version, "lastUpdated": now}}]
    for a in adds:
        lines.append({"add": {"path": a.path, "partitionValues": dict(a.partition_values), "size": a.size,
                              "modificationTime": a.modification_time, "dataChange": True, "stats": a.stats}})
    for r in removes:
        lines.append({"remove": {"path": r.path, "dataChange": True, "deletionTimestamp": now,
                                 "extendedFileMetadata": True, "partitionValues": dict(r.partition_values or {}),
                                 "size": r.size}})
    for c in cdc:
        lines.append({"cdc": {"path": c.path, "partitionValues": {}, "size": c.size, "dataChange": False}})
    log = os.path.join(local, "_delta_log")
    target = os.path.join(log, f"{version:020d}.json")
    tmp = os.path.join(log, f".tmp-{uuid.uuid4().hex}.json")
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write("\n".join(json.dumps(line) for line in lines) + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    try:
        os.link(tmp, target)
        return True
    except FileExistsError:
        return False
    finally:
        os.remove(tmp)
