"""Delta commits that publish uncommitted Parquet files: replace the rows of some ranges in one atomic commit.

A commit carries one app transaction per partition it replaces (that is how a run proves later
which of its commits landed). It is written per the Delta protocol (`write_commit`): the JSON
entry is published with a put-if-absent (an atomic no-replace link locally, `If-None-Match` on an
object store), so it is either absent or complete, and of two writers one wins. That is one
request on an object store, where `deltalake`'s transaction API makes five; and that API cannot
commit `cdc` actions (a stage rewrite's change data) at all. A table whose protocol asks more of
a writer than these actions (deletion vectors, row tracking, CHECK constraints, ...: see
`own_commit_allowed`), and a commit after which a checkpoint is due, go through
`deltalake.DeltaTable.create_write_transaction`.

Why not `write_deltalake(..., predicate=...)` or `DeltaTable.merge`: both take the rows
as Arrow data in this Python process. The rows of a run are Spark's (written by the
executors, possibly remote), and the driver never collects them. `bench/commit_paths.py`
measures both (docs/PERFORMANCE.md): they commit faster, but they pull every row through the
driver and write one file for all replaced partitions, so replacing one of those partitions
later rewrites every row of all of them instead of its own.
The app-transaction guard (`protocol`, `_refuse_if_taken`) reads the app transactions of all of a commit's
partitions from one read of the log (`delta.transactions`).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Sequence

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import RemoveAction
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from laminar_assets import storage
from laminar_assets.errors import CommitConflictError, ConcurrentRunError

from ..delta.log import DataFile
from ..delta.log_snapshot import LogSnapshot
from ..delta.schema_history import widens_only
from ..delta.tables import TableInfo, info_of, is_delta_table, open_delta, read_in_driver, snapshot_files
from ..delta.transactions import committed as made_commit
from ..delta.transactions import txn_versions_of
from ..spark.frames import nullable, schema_change, spark_schema
from ..spark.read import read_source
from ..windows import Interval, coalesce
from .owner import OWNER_PROPERTY, check_owner, needs_stamp
from .uncommitted import UncommittedFiles, committed, write_uncommitted, write_uncommitted_rows

ATTEMPTS = 8
# Tables Laminar creates write a checkpoint every this many commits (Delta Lake's own default; delta-rs
# writes one every 100). Every run opens its state and sink tables, and deltalake replays each commit
# since the last checkpoint, so a short replay keeps every open fast.
CHECKPOINT_EVERY = 10
CHANGE_DATA_FEED = "delta.enableChangeDataFeed"


def ensure_table(uri: str, schema: pa.Schema, *, reset_on_schema_change: bool, owner: str,
                 change_data: bool = False, opened: DeltaTable | None = None,
                 apps: Sequence[str] = (), spark: SparkSession | None = None,
                 run_id: str = "widen") -> tuple[bool, DeltaTable | None]:
    """Create the table if needed, or add the new columns of `schema` to it. Returns whether an
    existing table was reset to a new schema (a column's type changed or a column went: with
    `reset_on_schema_change`, else an error), and the table as opened when it existed already with
    this schema (None otherwise). `opened`: the
    table as the caller opened it earlier (not opened again).

    With `reset_on_schema_change` and `spark`, a table whose columns `schema` only widens (a source
    column widened: max(quantity) int -> bigint, a wider decimal sum) is widened in place instead of
    reset (`widen_in_place`): its rows stay, each value as it was under the wider type.

    Every table Laminar creates has its change data feed on (`delta.enableChangeDataFeed`), so a
    delta-spark user can `readChangeFeed` it: a commit that writes change data (`change_data`) says
    what each row did, any other commit's added and removed files are its inserts and deletes. A
    table created before that gets the property at its first commit with change data.

    `owner`: the flow writing the table. A table it did not create is refused before anything is
    written (`owner.check_owner`; `apps`, the commit's app transactions, count as evidence for a table
    an earlier Laminar created); a table Laminar creates carries `laminar.flow` = `owner`, and one an
    earlier Laminar created gets it here. Each commit made here names `owner` in its commit info too, as
    a run's commits do: a commit of the table that names no flow was made by someone else."""
    schema = nullable(schema)
    stamp = CommitProperties(custom_metadata=with_user_metadata({OWNER_PROPERTY: owner}))
    try:
        dt = opened if opened is not None else open_delta(uri)
    except TableNotFoundError:
        check_owner(uri, owner)  # an empty folder, or one holding only Laminar's uncommitted files
        config = {"delta.checkpointInterval": str(CHECKPOINT_EVERY), CHANGE_DATA_FEED: "true", OWNER_PROPERTY: owner}
        try:
            DeltaTable.create(uri, schema=schema, mode="ignore", configuration=config, raise_if_key_not_exists=False,
                              storage_options=storage.delta_options(uri), commit_properties=stamp)
        except DeltaError:  # a concurrent run created it first
            if not is_delta_table(uri):
                raise
        check_owner(uri, owner)  # `ignore`: a table someone else created meanwhile stays theirs
        if storage.is_object_store(uri) and (kept := storage.copies.kept()) is not None:
            kept.set_checkpoint_hint(uri, -1)  # no checkpoint yet: the next replay lists the log from version 0
        return False, None
    check_owner(uri, owner, apps=apps, table=dt)
    props = {OWNER_PROPERTY: owner} if needs_stamp(dt) else {}
    if change_data and dt.metadata().configuration.get(CHANGE_DATA_FEED) != "true":
        props[CHANGE_DATA_FEED] = "true"
    if props:
        dt.alter.set_table_properties(props, raise_if_not_exists=False, commit_properties=stamp)
        dt = open_delta(uri)  # the commit then reads the new version
        opened = None
    current = nullable(pa.schema(dt.schema().to_arrow()))
    change = schema_change(current, schema)
    if change == "same":
        return False, dt
    if change == "adds":  # new columns only: the schema evolves, every row stays (NULL in them)
        write_deltalake(uri, schema.empty_table(), mode="append", schema_mode="merge",
                        storage_options=storage.delta_options(uri), commit_properties=stamp)
        return False, None
    if not reset_on_schema_change:
        raise CommitConflictError(f"table at {uri} has schema {current} but this run writes {schema}", table=uri)
    if spark is not None and widens_only(current, schema):
        widen_in_place(spark, uri, dt, schema, stamp, run_id)
        return False, None
    write_deltalake(uri, schema.empty_table(), mode="overwrite", schema_mode="overwrite",
                    storage_options=storage.delta_options(uri), commit_properties=stamp)
    return True, None


def widen_in_place(spark: SparkSession, uri: str, dt: DeltaTable, schema: pa.Schema, stamp: CommitProperties,
                   run_id: str) -> None:
    """Rewrite every file of the table at `uri` (as `dt` holds it) with its columns cast to the wider types of
    `schema` (new columns NULL), in one commit that also sets `schema`: a reader sees the old rows under the
    old schema or the same rows under the new one, never a mix, and deltalake's readers (exports) never meet
    a file whose type differs from the table's. Each old file becomes one new file (its rows stay together,
    as the per-partition layout wants). A concurrent commit fails it (the run fails; the next one widens)."""
    info = info_of(os.path.basename(uri), uri, dt)
    files = snapshot_files(info, None, keep_null_files=True)
    have = set(info.schema.names)
    rewritten = None
    if files:
        plain = not any(f.needs_row_positions for f in files)  # file names come with plain reads only
        df = read_source(spark, files, info, file_name=_SOURCE_FILE if plain else None)
        cols = [F.col(f"`{f.name}`").cast(f.dataType).alias(f.name) if f.name in have else
                F.lit(None).cast(f.dataType).alias(f.name) for f in spark_schema(schema).fields]
        by = [F.xxhash64(_SOURCE_FILE).alias(_SOURCE_FILE)] if plain else []
        rewritten = write_uncommitted(df.select(*cols, *by), uri, f"{run_id}-widen", by=_SOURCE_FILE if plain else None)
    props = CommitProperties(custom_metadata=stamp.custom_metadata, max_commit_retries=0)
    try:
        dt.create_write_transaction(list(rewritten.adds) if rewritten else [], mode="overwrite", schema=nullable(schema),
                                    commit_properties=props)
    except CommitFailedError as exc:
        if rewritten is not None:
            rewritten.discard()
        raise CommitConflictError(f"widening the columns of {uri} to {schema} conflicted with a concurrent commit; "
                                  "the next run widens them", table=uri) from exc
    if rewritten is not None:
        committed(rewritten)


_SOURCE_FILE = "__from"  # the old file a row came from: one new file per old one


def split_by_range(info: TableInfo, column: str, ranges: Sequence[Interval]) -> tuple[list[DataFile], list[DataFile]]:
    """Files of a table wholly inside `ranges` by statistics, and files only partly inside them. Touching
    ranges count as one: a file of several adjacent partitions (`uncommitted._write_table`,
    `partitions_per_file`) replaced by a pass over all of them is inside."""
    ranges = coalesce(ranges)
    inside, partial = [], []
    for f in snapshot_files(info, column, ranges):
        r = f.time_range
        if r is not None and any(r.start >= x.start and r.end <= x.end for x in ranges):
            inside.append(f)
        else:
            partial.append(f)
    return inside, partial


def replace_ranges(
    spark: SparkSession, uncommitted: UncommittedFiles, *, table_uri: str, column: str, ranges: Sequence[Interval],
    transactions: Sequence[tuple[str, int]], metadata: dict, run_id: str, append_only: bool = False,
    owner: str, reset_on_schema_change: bool = False, change_data: UncommittedFiles | None = None,
    opened: DeltaTable | None = None, remove_files: Sequence[DataFile] = (), driver_write_below_bytes: int = 0,
) -> int:
    """Atomically replace the rows of `table_uri` whose `column` lies in `ranges` by the files of `uncommitted`.

    One Delta commit removes the files holding only rows of the ranges, rewrites files that also
    hold rows outside them (tables written before files were laid out per partition), adds the
    files of `uncommitted` (and `change_data` files) and records `transactions`. A concurrent commit makes it
    list again and retry. With `append_only`, nothing is removed. `remove_files`: files removed
    besides (a stage's files holding keys it recomputes, whose other rows the files of `uncommitted` hold
    again); when a concurrent commit removed one of them, the commit is refused. Returns the rows added.
    `opened`: the table as the run opened it before it read from it; the first attempt commits on
    that snapshot, so a commit by anyone since then conflicts and is listed again. `owner`: the flow
    writing; a table it did not create is refused before anything is committed (`ensure_table`). The rows a
    partly replaced file keeps are written again by the driver when its files are under
    `driver_write_below_bytes` (else by a Spark job): one file per gap between the ranges (`_outside`)."""
    reset, opened = ensure_table(table_uri, uncommitted.schema, reset_on_schema_change=reset_on_schema_change, owner=owner,
                                 change_data=change_data is not None, opened=opened, apps=[a for a, _ in transactions],
                                 spark=spark, run_id=run_id)
    metadata = with_user_metadata(metadata)
    for attempt in range(1, ATTEMPTS + 1):
        # The commit is based on the snapshot the file list comes from: a concurrent commit in
        # between makes it fail and we list again, instead of removing a file another run rewrote.
        dt = opened if attempt == 1 and opened is not None else open_delta(table_uri)
        read_version = dt.version()
        _refuse_if_taken(dt, table_uri, transactions)
        removes, extra = [], []
        if not append_only and not reset and ranges:
            info = info_of(os.path.basename(table_uri), table_uri, dt)
            inside, partial = split_by_range(info, column, ranges)
            removes = [_remove_action(table_uri, f) for f in inside + partial]
            if partial:
                extra = [_keep_outside(spark, info, partial, column, ranges, run_id=run_id,
                                       driver_below=driver_write_below_bytes)]
        if remove_files:
            _still_there(dt, table_uri, remove_files)
            named = {r.path for r in removes}
            removes += [a for a in (_remove_action(table_uri, f) for f in remove_files) if a.path not in named]
        adds = list(uncommitted.adds) + [a for e in extra for a in e.adds]
        if change_data is None and not own_commit_allowed(dt):
            props = CommitProperties(app_transactions=[Transaction(a, v) for a, v in transactions],
                                     custom_metadata=metadata, max_commit_retries=0)
            try:
                dt.create_write_transaction(adds + removes, mode="append", schema=nullable(uncommitted.schema),
                                            commit_properties=props, post_commithook_properties=_hooks(dt))
                made_commit(dt, read_version, dict(transactions))
                committed(uncommitted, *extra)
                return uncommitted.rows
            except CommitFailedError:
                pass
        elif (entry := write_commit(table_uri, read_version + 1, adds, removes,
                                    change_data.adds if change_data else (), transactions=transactions,
                                    metadata=metadata)) is not None:
            made_commit(dt, read_version, dict(transactions))
            if isinstance(dt, LogSnapshot):  # moved over it later without reading it back
                dt.made(read_version + 1, entry)
            committed(uncommitted, *([change_data] if change_data else []), *extra)
            _checkpoint_if_due(dt, read_version + 1)
            return uncommitted.rows
        time.sleep(0.05 * attempt)
    raise CommitConflictError(f"commit to {table_uri} kept conflicting with concurrent writers after "
                              f"{ATTEMPTS} attempts", table=table_uri)


def _still_there(dt: DeltaTable, table_uri: str, files: Sequence[DataFile]) -> None:
    """Refuse a commit that would remove files another commit removed, or gave a deletion vector,
    since the run read them: the rows the run kept from them may be stale (and a remove without the
    vector would not cancel the file)."""
    present = {f.uri: f for f in snapshot_files(info_of(os.path.basename(table_uri), table_uri, dt), None,
                                                keep_null_files=True)}
    gone = [f.uri for f in files if f.uri not in present or present[f.uri].deleted is not None]
    if gone:
        raise CommitConflictError(f"{len(gone)} file(s) of {table_uri} this run rewrites were removed or had rows "
                                  f"deleted by another commit since it read them (first: {gone[0]}); the next run "
                                  "recomputes them", table=table_uri)


def with_user_metadata(metadata: dict) -> dict:
    """The commit info fields of a commit: `metadata` (the `laminar.*` facts, top-level fields that
    Laminar's own readers use) and the same facts as the commit's `userMetadata`, the one free-form
    field that delta-spark's DESCRIBE HISTORY and Databricks show."""
    facts = {k: v for k, v in metadata.items() if k.startswith("laminar.")}
    return {**metadata, "userMetadata": json.dumps(facts, sort_keys=True)} if facts else dict(metadata)


def _refuse_if_taken(dt: DeltaTable, table_uri: str, transactions: Sequence[tuple[str, int]]) -> None:
    """Refuse to commit a partition's run `seq` when the table already holds it or a later one: another
    run committed that partition meanwhile (its lease expired, or two processes raced). Checked on the
    snapshot each attempt commits on, so of two runs with one seq only the first commit lands."""
    done_by_app = txn_versions_of(dt, table_uri, [app for app, _seq in transactions])
    for app, seq in transactions:
        done = done_by_app[app]
        if done is not None and done >= seq:
            raise ConcurrentRunError(
                f"another run committed run {done} of {app} to {table_uri} while this run was about to commit "
                f"run {seq}; nothing of this run was committed: run it again and it continues from there",
                table=table_uri, version=dt.version())


def _remove_action(table_uri: str, f: DataFile) -> RemoveAction:
    rel = _relative(table_uri, f.uri)
    return RemoveAction(path=rel, data_change=True, deletion_timestamp=int(time.time() * 1000),
                        size=f.size, partition_values=dict(f.partition_values))


_GAP = "__gap"  # which gap between the replaced ranges a kept row lies in: its file


def _keep_outside(spark: SparkSession, info: TableInfo, files: Sequence[DataFile], column: str,
                  ranges: Sequence[Interval], *, run_id: str, driver_below: int) -> UncommittedFiles:
    """The rows of `files` outside the ranges written again: what a replace must write back. One file per gap
    between the (coalesced) ranges, so a kept file's statistics never span a replaced range and a later pass over
    that range alone does not find it partly inside and write it back again. Files under `driver_below` bytes
    are read and written by the driver (pyarrow: no Spark job), others by a Spark job. `info`: the table at the
    snapshot the commit is based on (not opened again)."""
    table_uri = info.uri
    ranges = coalesce(ranges)
    rows = read_in_driver(info, list(files), max_bytes=driver_below - 1)
    if rows is not None and pa.types.is_timestamp(rows.schema.field(column).type):
        c = rows.column(column)
        inside = pa.array([False] * rows.num_rows)
        gap = pa.array([0] * rows.num_rows, pa.int64())
        for r in ranges:
            start, end = pa.scalar(r.start, c.type), pa.scalar(r.end, c.type)
            inside = pc.or_(inside, pc.fill_null(pc.and_(pc.greater_equal(c, start), pc.less(c, end)), False))
            gap = pc.add(gap, pc.cast(pc.fill_null(pc.greater_equal(c, start), False), pa.int64()))
        kept = rows.filter(pc.invert(inside)).append_column(_GAP, gap.filter(pc.invert(inside)))
        return write_uncommitted_rows(kept, [(table_uri, f"{run_id}-keep", rows.column_names)], by=_GAP)[0]
    df = read_source(spark, list(files), info)
    c = F.col(column)
    inside_col = F.lit(False)
    gap_col = F.lit(0)
    for r in ranges:
        inside_col = inside_col | ((c >= F.lit(r.start)) & (c < F.lit(r.end)))
        gap_col = gap_col + F.when(c >= F.lit(r.start), 1).otherwise(0)
    kept_df = df.where(c.isNull() | ~inside_col).withColumn(_GAP, gap_col)
    return write_uncommitted(kept_df.repartition(_GAP), table_uri, f"{run_id}-keep", by=_GAP)


def _hooks(dt: DeltaTable) -> PostCommitHookProperties:
    """What `deltalake` does after a commit on `dt` (made with no retry: it is version `dt.version()` + 1): the
    checkpoint when the interval says so, as always, and the log clean-up only with that checkpoint. The clean-up
    lists the whole log (a request per 1,000 files) after every commit otherwise, and deletes only expired files
    before a checkpoint: skipped between checkpoints, the files that expired meanwhile wait for the next one (at
    most `delta.checkpointInterval` commits), as in delta-spark, which cleans up only after a checkpoint
    (`doLogCleanup`). `None` keeps the table's own setting (`delta.enableExpiredLogCleanup`) for that commit."""
    interval = int(dt.metadata().configuration.get("delta.checkpointInterval") or 100)
    due = (dt.version() + 2) % interval == 0  # the commit is version v = dt.version() + 1; due when (v + 1) % interval
    return PostCommitHookProperties(create_checkpoint=True, cleanup_expired_logs=None if due else False)


def _checkpoint_if_due(dt: DeltaTable, version: int) -> None:
    """Write a checkpoint at `version` when the table's interval says so, as delta-rs does after its
    own commits: otherwise every open of the table replays all of its JSON commits."""
    interval = int(dt.metadata().configuration.get("delta.checkpointInterval") or 100)
    if (version + 1) % interval == 0:  # delta-rs's rule: versions 99, 199, ... for the default 100
        open_delta(dt.table_uri, version=version).create_checkpoint()


def _relative(table_uri: str, file_uri: str) -> str:
    """A data file's path as its table's log names it (relative to the table)."""
    local, table_local = storage.local_path(file_uri), storage.local_path(table_uri)
    if local is not None and table_local is not None:
        return os.path.relpath(local, table_local)
    return storage.normalized(file_uri)[len(storage.normalized(table_uri)) + 1:]


# What a table's protocol may ask of a writer for `write_commit` to be a valid commit of it: nothing beyond the
# actions it writes. Writer version 4 (Laminar's tables: change data feed on) and below, or these table features;
# the features' own rules are checked on the table (`own_commit_allowed`).
_OWN_WRITER_FEATURES = frozenset({"appendOnly", "invariants", "changeDataFeed", "timestampNtz"})
_OWN_READER_FEATURES = frozenset({"timestampNtz"})
_FIELD_RULES = ("delta.generationExpression", "delta.invariants", "delta.identity", "delta.columnMapping")


def own_commit_allowed(dt: DeltaTable) -> bool:
    """Whether `write_commit` may commit to `dt`'s table: its protocol asks nothing of a writer beyond the add,
    remove and app-transaction actions (no deletion vectors, row tracking, in-commit timestamps, column mapping,
    CHECK constraints, generated or identity columns, invariants, append-only, clustering), and the next commit
    is not one that writes a checkpoint (`deltalake` writes it from the snapshot its commit leaves). Any other
    table is committed through `deltalake`, which refuses what it cannot write. Laminar's own tables, as Laminar
    creates them, qualify."""
    protocol = dt.protocol()
    writer = set(protocol.writer_features or ())
    reader = set(protocol.reader_features or ())
    if protocol.min_writer_version > 4 and not (protocol.min_writer_version == 7 and writer <= _OWN_WRITER_FEATURES):
        return False
    if protocol.min_reader_version > 1 and not (protocol.min_reader_version == 3 and reader <= _OWN_READER_FEATURES):
        return False
    config = dt.metadata().configuration
    if str(config.get("delta.appendOnly", "false")).lower() == "true" or any(k.startswith("delta.constraints.")
                                                                          for k in config):
        return False
    if str(config.get("delta.columnMapping.mode", "none")).lower() != "none":
        return False
    if _checkpoint_due(dt):
        return False
    return not any(rule in key for key in _field_metadata_keys(json.loads(dt.schema().to_json())) for rule in _FIELD_RULES)


def _field_metadata_keys(typ) -> Iterable[str]:
    """Every key of every field's metadata in a Delta schema (as JSON), nested fields included."""
    if isinstance(typ, dict):
        for f in typ.get("fields", ()):
            yield from (f.get("metadata") or {}).keys()
            yield from _field_metadata_keys(f.get("type"))
        for k in ("elementType", "keyType", "valueType"):
            yield from _field_metadata_keys(typ.get(k))


def _checkpoint_due(dt: DeltaTable) -> bool:
    """Whether the commit after `dt`'s version is one after which the table's interval asks for a checkpoint."""
    interval = int(dt.metadata().configuration.get("delta.checkpointInterval") or 100)
    return (dt.version() + 2) % interval == 0


def write_commit(uri: str, version: int, adds, removes, cdc=(), *, transactions, metadata: dict) -> bytes | None:
    """Write commit `version` of the table at `uri` (adds, removes, change data `cdc`, app `transactions`) per the
    Delta protocol; the entry written, or None if another writer took the version first. The entry is written with a put-if-absent
    (a hard link of a complete file locally, `If-None-Match` on an object store), so it is either absent or
    complete, and of two writers one wins: one request on an object store, where `deltalake` makes five (a
    listing for the latest version, the PUT, then a listing and two reads of the new commit to move its
    snapshot over it). Only for tables `own_commit_allowed` admits, or for change data, which `deltalake`'s
    transaction API cannot commit."""
    now = int(time.time() * 1000)
    info = {"timestamp": now, "operation": "WRITE", "readVersion": version - 1,
            "isBlindAppend": not removes and not cdc,
            "operationParameters": {"mode": "Overwrite" if removes else "Append", "predicate": "laminar partition replace"},
            "engineInfo": "laminar", "clientVersion": "laminar-0.2", **metadata}
    lines = [{"commitInfo": info}]
    lines += [{"txn": {"appId": a, "version": v, "lastUpdated": now}} for a, v in transactions]
    for a in adds:
        lines.append({"add": {"path": a.path, "partitionValues": dict(a.partition_values), "size": a.size,
                              "modificationTime": a.modification_time, "dataChange": True, "stats": a.stats}})
    for r in removes:
        lines.append({"remove": {"path": r.path, "dataChange": True, "deletionTimestamp": now,
                                 "extendedFileMetadata": True, "partitionValues": dict(r.partition_values or {}),
                                 "size": r.size}})
    for c in cdc:
        lines.append({"cdc": {"path": c.path, "partitionValues": {}, "size": c.size, "dataChange": False}})
    entry = ("\n".join(json.dumps(line) for line in lines) + "\n").encode()
    path = storage.join(uri, "_delta_log", f"{version:020d}.json")
    tag = storage.create_tagged(path, entry)
    if tag is None:
        return None
    storage.keep_written(path, tag, entry)  # the next process on this machine reads its copy
    return entry
