"""Uncommitted files: Parquet files written into a table's folder ahead of the `deltalake` commit
that names them.

Spark never opens the Delta log: it reads exactly the Parquet files a pinned
snapshot or a commit names (`spark_read`), and a run's output is written here as
new Parquet files under the table's folder (`write_uncommitted`), each with its Delta
statistics from the footer. The commit that publishes them is `delta_write`'s job.

Files are laid out per partition: `write_uncommitted(..., by=column)` writes one file per value
of a partition-id column, so replacing one partition's rows later removes that
partition's files and rewrites nobody else's. Small outputs are written by the driver
from Arrow batches instead of a Spark write job (`through_driver`, `write_uncommitted_rows`); a
flow's small pass over adjacent partitions writes their rows into one file (`partitions_per_file`):
on an object store each file costs a PUT when it is written and a HEAD and a GET whenever a run
reads it, and a batched pass's per-partition files are tiny. A later pass over some of them
carries the others' rows forward (`commit.replace_ranges`).

Every call writes into a folder of its own (`<folder>/<run id>-<token>`) that did
not exist before, so no write ever overwrites or deletes another's files, whatever run,
pass or attempt made them. The only files removed are uncommitted ones no commit names: a run
that holds a `scope()` removes, when it ends, each folder it wrote whose files it did not
commit (after checking the table's recent commits), so neither a failed pass nor an empty
write leaves files behind. A killed process leaves its uncommitted files for Delta's VACUUM.

On an object store the files are written straight into the bucket (by the executors through
s3a, or by the driver through pyarrow): no local folder that other machines cannot see, and no
rename, which an object store does not have. Files Spark writes per partition keep the folder
Spark gave them (`__p=<id>/part-...`); on a local disk they are moved up into the write's folder.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake.transaction import AddAction
from pyspark.sql import DataFrame, SparkSession

from laminar_assets import storage
from laminar_assets.errors import InjectedCrash, LaminarError

from ..delta.log import read_log_entry
from ..spark.frames import arrow_schema_of, empty_frame, spark_schema, to_arrow

log = logging.getLogger(__name__)


def _stat_value(value):
    if isinstance(value, datetime):
        return value.isoformat(timespec="microseconds").replace("+00:00", "Z")
    if isinstance(value, (bytes, bytearray)):
        return None
    return value


def file_stats(uri: str) -> tuple[int, str]:
    """numRecords, min/max/nullCount of top-level primitive columns, from the Parquet footer."""
    fs, path = storage.filesystem(uri)
    with fs.open_input_file(path) as fh:
        meta = pq.read_metadata(fh)
    return footer_stats(meta)


def footer_stats(meta: pq.FileMetaData) -> tuple[int, str]:
    """`file_stats` of a footer already at hand (a file the driver just wrote)."""
    mins, maxs, nulls = {}, {}, {}
    schema = meta.schema.to_arrow_schema()
    for column in schema:
        if pa.types.is_nested(column.type) or pa.types.is_binary(column.type) or pa.types.is_large_binary(column.type):
            continue
        lo = hi = None
        nc = 0
        complete = bounded = True
        for rg in range(meta.num_row_groups):
            st = meta.row_group(rg).column(meta.schema.names.index(column.name)).statistics
            if st is None:
                complete = False
                break
            nc += st.null_count or 0
            if st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
            elif st.num_values > (st.null_count or 0):  # values without a min/max (e.g. too long to keep)
                bounded = False
        if not complete:
            continue
        nulls[column.name] = nc
        if lo is not None and bounded:  # a min/max must hold every value: readers skip files by them
            if isinstance(lo, datetime):
                # Delta statistics may be read at millisecond precision: floor min, ceil max.
                lo = lo - timedelta(microseconds=lo.microsecond % 1000)
                assert hi is not None  # set with lo
                if hi.microsecond % 1000:
                    try:
                        hi = hi + timedelta(microseconds=1000 - hi.microsecond % 1000)
                    except OverflowError:  # no millisecond above 9999-12-31 23:59:59.999999: no min/max
                        continue
            mins[column.name], maxs[column.name] = _stat_value(lo), _stat_value(hi)
    stats = {"numRecords": meta.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return meta.num_rows, json.dumps(stats, default=str)


@dataclass(frozen=True)
class UncommittedFiles:
    """Parquet files written into a table folder (by Spark or by the driver), not yet committed."""

    adds: tuple[AddAction, ...]
    rows: int
    schema: pa.Schema | None
    folders: tuple[str, ...] = ()  # the folders (URIs) the files are in (each one write call's own)

    def rows_by_partition(self) -> dict[int, int]:
        """Rows written per partition number, for files written with `by="__p"` (from their names:
        `p-<id>-part-...`, or `__p=<id>/part-...` where Spark's folders were kept)."""
        out: dict[int, int] = {}
        for a in self.adds:
            match = re.search(r"(?:^|/)(?:p-|__p=)(-?\d+)[-/]", a.path)
            if match:
                pid = int(match.group(1))
                out[pid] = out.get(pid, 0) + json.loads(a.stats)["numRecords"]
        return out

    def plus(self, other: UncommittedFiles) -> UncommittedFiles:
        """Both writes' files, committed together."""
        return UncommittedFiles(self.adds + other.adds, self.rows + other.rows, self.schema, self.folders + other.folders)

    def discard(self) -> None:
        """Delete files that were never handed to a commit (a pass that escalates, then writes anew)."""
        for folder in self.folders:
            storage.delete_tree(folder)


@dataclass
class _Scope:
    """The writes of one run: which folders it wrote, and which of them a commit took."""

    started_ms: int
    written: dict[str, tuple[str, str]] = field(default_factory=dict)  # folder -> (table URI, folder in the table)
    committed: set[str] = field(default_factory=set)


_SCOPE: ContextVar[_Scope | None] = ContextVar("laminar_uncommitted_scope", default=None)
# How far before a run's start its commits' timestamps may lie (clock steps): `_named_since` looks this far back.
_CLOCK_SLACK_MS = 10 * 60 * 1000


@contextmanager
def scope() -> Iterator[None]:
    """Track every write of the block. When it ends, successfully or not, each folder it wrote that
    no commit took is removed, unless a commit of its table since the block began names one of its
    files (then it stays: never delete what a commit may name). A simulated kill (`InjectedCrash`)
    leaves everything, as a real one would. Scopes nest: an inner block shares the outer one."""
    if _SCOPE.get() is not None:
        yield
        return
    current = _Scope(int(time.time() * 1000))
    token = _SCOPE.set(current)
    crashed = failed = False
    try:
        yield
    except InjectedCrash:
        crashed = True
        raise
    except BaseException:
        failed = True
        raise
    finally:
        _SCOPE.reset(token)
        if not crashed:
            try:
                for folder, (table_uri, rel_dir) in current.written.items():
                    if folder not in current.committed:
                        _discard_unless_named(table_uri, rel_dir, folder, current.started_ms)
                    elif storage.local_path(folder) is not None and os.path.isdir(folder) and \
                            not any(names for _, _, names in os.walk(folder)):
                        _remove(table_uri, folder)  # a commit of no rows took nothing from it
            except (LaminarError, OSError) as exc:
                if not failed:
                    raise
                # the block's own error is what the caller reports (e.g. a store that stopped answering
                # fails the clean-up too); what stays is named by no commit, and Delta's VACUUM reclaims it, as a
                # killed run's
                log.warning("uncommitted files were not cleaned up after a failure (%s)", exc)


def committed(*files: UncommittedFiles | None) -> None:
    """Record that a commit took these files: the scope must never remove them."""
    current = _SCOPE.get()
    if current is not None:
        for f in files:
            if f is not None:
                current.committed.update(f.folders)


def _register(table_uri: str, rel_dir: str, folder: str) -> None:
    current = _SCOPE.get()
    if current is not None:
        current.written[folder] = (table_uri, rel_dir)


def _discard_unless_named(table_uri: str, rel_dir: str, folder: str, since_ms: int) -> None:
    local = storage.local_path(folder)
    if local is not None and not os.path.isdir(local):
        return
    has_files = bool(storage.list_files(folder))
    if has_files and _named_since(table_uri, rel_dir, since_ms - _CLOCK_SLACK_MS):
        return
    _remove(table_uri, folder)


def _remove(table_uri: str, folder: str) -> None:
    """Delete an uncommitted folder's files, and on a local disk the folders above it, up to the
    table's, when left empty (an object store has no folders)."""
    storage.delete_tree(folder)
    storage.remove_empty_dirs(os.path.dirname(folder), table_uri)


def _named_since(table_uri: str, rel_dir: str, since_ms: int) -> bool:
    """Whether a commit of the table made at or after `since_ms` names a file under `rel_dir`
    (the table's newest commits, read back until one is older)."""
    names = [u.rsplit("/", 1)[-1] for u, _ in storage.list_files(storage.join(table_uri, "_delta_log"))]
    versions = sorted((int(n[:20]) for n in names if n.endswith(".json") and n[:20].isdigit()), reverse=True)
    prefix = rel_dir + "/"
    for version in versions:
        text = read_log_entry(os.path.basename(table_uri), table_uri, version) or ""
        stamp = None
        for line in text.splitlines():
            action = json.loads(line) if line.strip() else {}
            for kind in ("add", "cdc"):
                if kind in action and unquote(action[kind]["path"]).startswith(prefix):
                    return True
            if "commitInfo" in action:
                stamp = action["commitInfo"].get("timestamp")
        if stamp is not None and stamp < since_ms:
            return False
    return False


def write_uncommitted(df: DataFrame, table_uri: str, run_id: str, *, by: str | None = None, max_files: int = 1,
          folder: str = "laminar", partition_values: dict[str, str] | None = None,
          through_driver: bool = False, partitions_per_file: int = 1) -> UncommittedFiles:
    """Write `df` as Parquet into a new folder `<table>/<folder>/<run_id>-<token>/` (one Spark job);
    empty files are dropped.

    `by`: a column of partition ids; the files are split by it (one per id when `df` is already
    partitioned by it) and the column itself is not written. Otherwise at most `max_files` files.
    `partition_values`: the Delta partition the files belong to (their columns are not in `df`).
    `through_driver`: Spark sends the rows to the driver as Arrow batches and pyarrow writes the
    files (one per id of `by`), instead of a Spark write job. Only for outputs the caller knows
    to be small: it saves the write job's commit protocol and one writer per file, at the price of
    holding the rows in the driver. `partitions_per_file` (with `through_driver`): rows of up to that many
    consecutive ids of `by` (adjacent partitions) go into one file (`_write_table`)."""
    rel_dir, target = _target(table_uri, folder, run_id)
    if through_driver:
        table = to_arrow(df)
        written = _write_table(table, target, by, partitions_per_file=partitions_per_file)
        return _uncommitted(target, rel_dir, partition_values, lambda: _plain_types(_without(table, by).schema), written)
    writer = (df.write.partitionBy(by) if by else (df.coalesce(max_files) if max_files else df).write)
    # "overwrite" replaces nothing: the folder is new for every call (`_target`). Spark Connect does
    # not accept "errorifexists".
    writer.mode("overwrite").parquet(storage.spark_uri(target))
    return _uncommitted(target, rel_dir, partition_values, lambda: arrow_schema_of(df.drop(by) if by else df))


def write_uncommitted_table(table: pa.Table, table_uri: str, run_id: str, *, folder: str = "laminar",
                            partition_values: dict[str, str] | None = None) -> UncommittedFiles:
    """Rows the driver holds as Arrow, written as `write_uncommitted(..., through_driver=True)` writes the rows it
    collects: one file in a new folder `<table>/<folder>/<run_id>-<token>/` (none when there are no rows)."""
    rel_dir, target = _target(table_uri, folder, run_id)
    written = _write_table(table, target, None)
    return _uncommitted(target, rel_dir, partition_values, lambda: _plain_types(table.schema), written)


def collect_rows(df: DataFrame) -> pa.Table:
    """The rows of a small output, sent to the driver as Arrow batches (one Spark job)."""
    return to_arrow(df)


def write_uncommitted_rows(table: pa.Table, outputs: list[tuple[str, str, list[str]]], *, by: str,
               folder: str = "laminar", partitions_per_file: int = 1) -> list[UncommittedFiles]:
    """Several tables' uncommitted files from rows collected as Arrow (`collect_rows`): each output (table
    URI, run id, columns) writes those columns of every row, split by `by` (`partitions_per_file`: see
    `_write_table`)."""
    out = []
    for table_uri, run_id, columns in outputs:
        rel_dir, target = _target(table_uri, folder, run_id)
        part = table.select([by, *[c for c in columns if c != by]])
        written = _write_table(part, target, by, partitions_per_file=partitions_per_file)
        out.append(_uncommitted(target, rel_dir, None, lambda part=part: _plain_types(_without(part, by).schema), written))
    return out


def _target(table_uri: str, folder: str, run_id: str) -> tuple[str, str]:
    """A folder of the table no other write has used or will use: `<folder>/<run id>-<token>`
    (its URI: a local path, or an object-store URI)."""
    rel_dir = f"{folder}/{run_id}-{uuid.uuid4().hex[:12]}"
    target = storage.join(table_uri, *rel_dir.split("/"))
    _register(table_uri, rel_dir, target)
    return rel_dir, target


def _without(table: pa.Table, column: str | None) -> pa.Table:
    return table.drop_columns([column]) if column else table


def _write_table(table: pa.Table, target: str, by: str | None, *, partitions_per_file: int = 1) -> list[_Written]:
    """Rows collected in the driver written under `target` (a new folder's URI) as `_uncommitted` names
    Spark's files: one file per value of `by`, named `p-<value>-part-....parquet`. Each file is
    encoded in memory and stored with one write (one PUT on an object store: no multipart upload, no
    listing or footer read afterwards); returns what was written, footers included.

    `partitions_per_file` > 1: `by` holds integer ids of partitions (a flow's `__p`: consecutive ids are
    neighbouring partitions in time); each run of consecutive ids with the same `id // partitions_per_file`
    is one file, named `p-<first>-to-<last>-part-....parquet`. Its statistics then span only those
    partitions, never one between them that has no rows here, so a later pass over some of them finds it
    partly inside its range and writes the others' rows back (at most `partitions_per_file` partitions'
    worth), and a pass over a partition outside them never reads it."""
    local = storage.local_path(target)
    if local is not None:
        os.makedirs(local)  # new: `_target` never hands out a folder twice
    table = table.cast(_plain_types(table.schema))
    if table.num_rows == 0:
        return []
    name = f"part-00000-{uuid.uuid4().hex}.parquet"
    if not by:
        return [_put_parquet(table, target, name)]
    # sorted by the partition id, each id's rows are one slice: one file per id, however many ids
    table = table.sort_by(by)
    ids = table.column(by)
    rest = table.drop_columns([by])
    pieces: list[tuple[Any, Any, int]] = []  # (first id, last id, rows), one per file
    for run in pc.value_counts(ids).to_pylist():  # in order of first appearance: sorted order here
        value, count = run["values"], run["counts"]
        last = pieces[-1] if pieces else None
        if (partitions_per_file > 1 and last is not None and value is not None and last[1] is not None
                and value == last[1] + 1 and value // partitions_per_file == last[0] // partitions_per_file):
            pieces[-1] = (last[0], value, last[2] + count)
        else:
            pieces.append((value, value, count))
    start, out = 0, []
    for first, final, count in pieces:
        prefix = _prefix(f"{by}={_HIVE_NULL if first is None else first}")
        if final != first:
            prefix += f"to-{final}-"
        out.append(_put_parquet(rest.slice(start, count), target, f"{prefix}{name}"))
        start += count
    return out


@dataclass(frozen=True)
class _Written:
    """A file the driver wrote: its name in the write's folder, size and footer."""

    name: str
    size: int
    meta: pq.FileMetaData
    schema: pa.Schema


def _put_parquet(table: pa.Table, target: str, name: str) -> _Written:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    data = sink.getvalue()
    uri, local = storage.join(target, name), storage.local_path(target)
    if local is not None:  # a new file in a new folder: no rename needed (nothing names it yet)
        with open(uri, "wb") as fh:
            fh.write(data)
    else:
        storage.write(uri, data.to_pybytes())
    return _Written(name, data.size, pq.read_metadata(pa.BufferReader(data)),
                    pq.read_schema(pa.BufferReader(data)).remove_metadata())


_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # what Spark names the folder of NULL partition values


def _prefix(folder: str) -> str:
    """The file-name prefix of a file moved up out of Spark's `col=value` folder(s): `p-<value>-` for
    `__p=<value>` (no leading "_" or ".": Spark and Hadoop skip such files as hidden)."""
    return folder.replace(os.sep, "-").replace("=", "-").lstrip("_.") + "-"


def _plain_types(schema: pa.Schema) -> pa.Schema:
    """`schema` with 32-bit-offset strings and binaries (as Spark writes them: a session set to
    large Arrow types would otherwise write files whose schema differs from the table's)."""
    return pa.schema([f.with_type(_plain_type(f.type)) for f in schema])


def _plain_type(t: pa.DataType) -> pa.DataType:
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(t.value_field.with_type(_plain_type(t.value_type)))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_plain_type(f.type)) for f in t])
    if pa.types.is_map(t):
        return pa.map_(_plain_type(t.key_type), t.item_field.with_type(_plain_type(t.item_type)))
    return t


def _uncommitted(target: str, rel_dir: str, partition_values: dict[str, str] | None, schema_if_empty,
            written: list[_Written] | None = None) -> UncommittedFiles:
    """The files written under `target` as add actions (statistics from their footers). `written`: the
    files the driver wrote, with their footers (nothing is listed or read back); else Spark's files,
    found by listing the folder."""
    adds, rows, schema = [], 0, None
    local = storage.local_path(target)
    found: list[tuple[str, int, _Written | None]]
    if written is not None:
        found = [(storage.join(target, w.name), w.size, w) for w in written]
    elif local is not None:
        found = [(p, os.path.getsize(p), None) for p in _flatten(local)]
    else:
        found = [(u, size, None) for u, size in storage.list_files(target) if u.endswith(".parquet")]
    for uri, size, w in found:
        relative = uri[len(target):].lstrip("/").replace(os.sep, "/")
        n, stats = footer_stats(w.meta) if w is not None else file_stats(uri)
        if schema is None:
            if w is not None:
                schema = w.schema
            else:
                fs, path = storage.filesystem(uri)
                schema = pq.read_schema(path, filesystem=fs).remove_metadata()
        if n == 0:
            storage.delete(uri)
            continue
        rows += n
        adds.append(AddAction(
            path=f"{rel_dir}/{relative}", size=size, partition_values=dict(partition_values or {}),
            modification_time=int(time.time() * 1000), data_change=True, stats=stats,
        ))
    return UncommittedFiles(tuple(adds), rows, schema if schema is not None else schema_if_empty(), (target,))


def read_uncommitted(spark: SparkSession, files: UncommittedFiles, table_uri: str) -> DataFrame:
    """The rows of files this run wrote under `table_uri` (not committed yet), read back in one scan with
    their known schema (no inference job). Small files are read a few per task, not one task each."""
    if not files.adds:
        return empty_frame(spark, files.schema)
    paths = [storage.spark_uri(storage.join(table_uri, *a.path.split("/"))) for a in files.adds]
    # recursiveFileLookup: no partition column is inferred from a kept `__p=<id>/` folder
    df = spark.read.schema(spark_schema(files.schema)).option("recursiveFileLookup", "true").parquet(*paths)
    tasks = int(spark.conf.get("spark.sql.shuffle.partitions") or 4)
    return df.coalesce(tasks) if len(paths) > tasks else df


def _flatten(folder: str) -> list[str]:
    """The Parquet files Spark wrote under `folder`, moved up out of `col=value` subfolders (so no
    reader infers a partition column from the path); Spark's side files are removed."""
    out = []
    for dirpath, _dirs, names in os.walk(folder, topdown=False):
        rel = os.path.relpath(dirpath, folder)
        prefix = "" if rel == "." else _prefix(rel)
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
