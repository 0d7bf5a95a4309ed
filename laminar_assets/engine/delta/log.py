"""One Delta commit, as the planner needs it: what kind of change, which files, which event times.

The `deltalake` API exposes snapshots but not the actions of one commit, so this
module reads the commit's JSON entry from `_delta_log/` (the documented Delta
protocol format) and nothing else by hand. Event-time ranges come from the add
actions' statistics, and for change-data and removed files from their Parquet
footers, so no data is scanned.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime
from decimal import Decimal
from enum import Enum
from functools import lru_cache
from urllib.parse import unquote

import pyarrow.fs  # noqa: F401  (pa.fs)

from laminar_assets import storage
from laminar_assets.errors import SourceError

from ..windows import Interval
from .deletion_vectors import DeletedRows, DeletionVector, DvChange
from .file_ranges import footer_facts, null_count, range_from_stats, stats_interval  # noqa: F401


def partition_text(value) -> str | None:
    """A typed partition value (as `deltalake` returns it from a snapshot's add actions) as the string
    the Delta log holds for it, the form a commit's partition values are read in (`_file`), so a snapshot
    read and a commit read give one value. Spark casts it to the column's type (`spark.read.read_files`),
    as delta-spark casts the log's string: binary as its UTF-8 text (the log is JSON text: `deltalake`
    gives the bytes of that text), times in UTC (Laminar's sessions run in UTC), decimals without an
    exponent, floats as Java writes NaN and infinities. `str()` is wrong for bytes (`"b'hello'"`)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).decode("utf-8")
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, datetime):
        if value.tzinfo is not None:
            return value.astimezone(UTC).replace(tzinfo=None).isoformat(timespec="microseconds") + "Z"
        return value.isoformat(sep=" ", timespec="microseconds")
    if isinstance(value, date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, float):
        if value != value:
            return "NaN"
        if value in (float("inf"), float("-inf")):
            return "Infinity" if value > 0 else "-Infinity"
        return repr(value)
    return str(value)  # integers


class CommitKind(str, Enum):
    """What one Delta commit did to the data of a table."""

    APPEND = "append"  # only added data files
    CHANGE_DATA = "change_data"  # deletes / updates / merges with a change data feed
    DELETION_VECTORS = "deletion_vectors"  # rows deleted (or restored) through deletion vectors, plus adds
    REWRITE = "rewrite"  # removed data without change data: rows are unknown
    LAYOUT = "layout"  # compaction, z-order: dataChange=false, no row changed
    METADATA = "metadata"  # schema, properties or protocol only
    EMPTY = "empty"  # no file actions at all


@dataclass(frozen=True)
class DataFile:
    """One Parquet file of a table (data or change data) with what is known of it."""

    uri: str
    rows: int | None
    size: int
    partition_values: tuple[tuple[str, str | None], ...] = ()
    time_range: Interval | None = None  # None: not known from statistics
    change_data: bool = False
    time_nulls: int | None = None  # null event times in the file; None: not known from statistics
    # rows a read of the file skips (its deletion vector); not part of the file's identity
    deleted: DeletedRows | None = field(default=None, compare=False, hash=False)
    # set on a file whose deletion vector a commit changed: the read yields only the rows it changed
    dv_change: DvChange | None = None
    # (min, max) statistics of the key columns a snapshot listing asked for (`tables.snapshot_files`),
    # None where unknown: a refill of some keys skips the files that cannot hold them (`KeyProbe`)
    bounds: tuple[tuple[object, object], ...] | None = field(default=None, compare=False, hash=False)

    @property
    def needs_row_positions(self) -> bool:
        return self.deleted is not None or self.dv_change is not None


@dataclass(frozen=True)
class CommitSummary:
    """The facts of one commit that the planner needs."""

    version: int
    timestamp: datetime
    operation: str
    kind: CommitKind
    adds: tuple[DataFile, ...] = ()
    removes: tuple[DataFile, ...] = ()
    cdc: tuple[DataFile, ...] = ()
    # every file the commit removed, with or without a data change (compaction): snapshots before the
    # commit name them, so a vacuum that deleted one makes those snapshots unreadable
    removed: tuple[str, ...] = ()
    # the table schema (Delta JSON) the commit set with a metaData action; None: the one before stays
    schema: str | None = field(default=None, compare=False)

    @property
    def touched(self) -> tuple[Interval, ...] | None:
        """Event-time ranges the commit touched; None when some range is unknown."""
        if self.kind in (CommitKind.LAYOUT, CommitKind.METADATA, CommitKind.EMPTY):
            return ()
        files = self.cdc if self.kind is CommitKind.CHANGE_DATA else self.adds + self.removes
        if self.kind is CommitKind.DELETION_VECTORS:
            files = self.readable
        ranges = [f.time_range for f in files]
        if any(r is None for r in ranges):
            return None
        return tuple(ranges)  # type: ignore[arg-type]

    @property
    def readable(self) -> tuple[DataFile, ...]:
        """The files an incremental read of this commit opens (adds of an append, change data)."""
        if self.kind is CommitKind.CHANGE_DATA:
            return self.cdc
        return self.adds if self.kind in (CommitKind.APPEND, CommitKind.DELETION_VECTORS) else ()

    @property
    def rows(self) -> int:
        files = self.cdc if self.kind is CommitKind.CHANGE_DATA else self.adds
        return sum(f.rows or 0 for f in files)

    @property
    def dv_rows(self) -> int:
        """Rows deleted or restored through deletion vectors (from the descriptors)."""
        return sum(f.dv_change.rows for f in self.adds if f.dv_change is not None)



def _uri(root: str, path: str) -> str:
    """The URI of a file an action names (relative paths are URL-encoded and under the table)."""
    path = unquote(path)
    return path if "://" in path or path.startswith("/") else f"{root}/{path}"


def _file(root: str, action: dict, column: str | None, *, change_data: bool = False, use_footer: bool = False,
          names: dict[str, str] | None = None) -> DataFile:
    """One file of an action. `column`: the event time's physical name; `names`: physical -> logical
    column names of a table with column mapping (partition values are keyed by physical name)."""
    uri = _uri(root, action["path"])
    dv = DeletionVector.from_action(root, action.get("deletionVector"))
    deleted = DeletedRows(vector=dv) if dv is not None else None
    names = names or {}
    pv = tuple(sorted((names.get(k, k), v) for k, v in (action.get("partitionValues") or {}).items()))
    if column is None:
        rows = None
        try:
            rows = json.loads(action.get("stats") or "{}").get("numRecords")
        except ValueError:
            pass
        return DataFile(uri=uri, rows=rows, size=int(action.get("size") or 0), partition_values=pv,
                        time_range=None, change_data=change_data, deleted=deleted)
    rng, rows = range_from_stats(action.get("stats"), column)
    nulls = null_count(action.get("stats"), column)
    if rng is None and use_footer:  # change data files carry no statistics in the log
        rng, rows, nulls = footer_facts(uri, column)
    return DataFile(uri=uri, rows=rows, size=int(action.get("size") or 0), partition_values=pv,
                    time_range=rng, change_data=change_data, time_nulls=nulls, deleted=deleted)


action_file = _file  # one add action's file, for a snapshot derived from its base and appended commits (tables.py)


def read_commit(table: str, uri: str, version: int, event_time: str | None,
                names: tuple[tuple[str, str], ...] = (), *, entry: bytes | None = None) -> CommitSummary | None:
    """Summarise commit `version`, or None if its log entry no longer exists (log clean-up).
    `event_time` None: the column's statistics cannot locate rows (every range is unknown); else its
    physical name. `names`: (physical, logical) column names of a table with column mapping.
    `entry`: the commit file's bytes when the caller read them already (not read again).
    Whether the commit's files still exist is not part of the summary: see `missing_files`."""
    text = entry.decode("utf-8") if entry is not None else read_log_entry(table, uri, version)
    if text is None:
        return None
    mapping = dict(names)
    add_actions: list[dict] = []
    remove_actions: list[dict] = []
    cdc: list[DataFile] = []
    info: dict = {}
    metadata_changed = protocol_changed = False
    schema: str | None = None
    layout_only = 0
    removed: list[str] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError as exc:
            raise damaged_entry(table, uri, version, number, exc) from None
        if "commitInfo" in action:
            info = action["commitInfo"]
        elif "metaData" in action:
            metadata_changed = True
            schema = action["metaData"].get("schemaString") or schema
        elif "protocol" in action:
            protocol_changed = True
        elif "add" in action or "remove" in action:
            kind, act = ("add", action["add"]) if "add" in action else ("remove", action["remove"])
            if kind == "remove":
                removed.append(_uri(uri, act["path"]))
            if not act.get("dataChange", True):
                layout_only += 1
            else:
                (add_actions if kind == "add" else remove_actions).append(act)
        elif "cdc" in action:
            cdc.append(_file(uri, action["cdc"], event_time, change_data=True, use_footer=True, names=mapping))
    # A remove and an add of the same path replace the file's deletion vector: rows deleted or
    # restored in place. Their rows are known (new vector minus old), unlike a removed file's.
    readded = {a["path"] for a in add_actions}
    old_dv = {r["path"]: r.get("deletionVector") for r in remove_actions if r["path"] in readded}
    adds = []
    for a in add_actions:
        f = _file(uri, a, event_time, names=mapping)
        if a["path"] in old_dv:
            change = DvChange(DeletionVector.from_action(uri, old_dv[a["path"]]),
                              DeletionVector.from_action(uri, a.get("deletionVector")))
            share = change.rows / f.rows if f.rows else 1.0
            f = replace(f, deleted=None, dv_change=change, rows=change.rows, size=int(f.size * min(1.0, share)))
        adds.append(f)
    removes = [_file(uri, r, event_time, use_footer=True, names=mapping) for r in remove_actions
               if r["path"] not in old_dv]
    if cdc:
        kind = CommitKind.CHANGE_DATA
    elif removes:
        kind = CommitKind.REWRITE
    elif old_dv:
        kind = CommitKind.DELETION_VECTORS
    elif adds:
        kind = CommitKind.APPEND
    elif layout_only:
        kind = CommitKind.LAYOUT
    elif metadata_changed or protocol_changed:
        kind = CommitKind.METADATA
    else:
        kind = CommitKind.EMPTY
    ts_ms = info.get("timestamp") or 0
    return CommitSummary(
        version=version, timestamp=datetime.fromtimestamp(ts_ms / 1000, tz=UTC),
        operation=str(info.get("operation", "UNKNOWN")), kind=kind, adds=tuple(adds),
        removes=tuple(removes), cdc=tuple(cdc), removed=tuple(removed), schema=schema,
    )


def file_exists(uri: str) -> bool:
    return storage.exists(uri)


def read_log_entry(table: str, uri: str, version: int) -> str | None:
    """The JSON text of commit `version`, or None when the entry is gone. Any other I/O error is a
    `SourceError`: an unreadable log is not an expired one."""
    path = entry_path(uri, version)
    try:
        data = storage.read_many_immutable([(path, None)])[0]  # kept for the next process (a sensor's read, a run's)
    except OSError as exc:
        raise SourceError(f"cannot read commit {version} of '{table}' ({path}): {exc}", table=table,
                          version=version) from exc
    return data.decode("utf-8") if data is not None else None


def entry_path(uri: str, version: int) -> str:
    return f"{uri}/_delta_log/{version:020d}.json"


def last_commit_after(uri: str, version: int | None) -> int | None:
    """The last of the commits right after `version` whose entries exist (None: the table's first is
    version 0), or `version` when the next one is not there: one existence check per commit found plus
    one, so a sensor can look for new commits without opening the table (and on an object store with
    one request when there is none). A checkpoint never stands without its commit's entry."""
    while storage.exists(entry_path(uri, 0 if version is None else version + 1)):
        version = 0 if version is None else version + 1
    return version


def looks_cost_requests(uri: str) -> bool:
    """Whether each look for a commit (`last_commit_after`) is a request to an object store, not a local
    file check: how often to look is the caller's trade between requests and latency."""
    return storage.is_object_store(uri)


def damaged_entry(table: str, uri: str, version: int, line: int, exc: Exception) -> SourceError:
    """The error of a commit entry that is not JSON: a Delta writer never leaves one (it writes the
    entry whole, or not at all), so it was cut short or edited by hand."""
    path = entry_path(uri, version)
    return SourceError(f"the Delta log of '{table}' is damaged: the entry of commit {version} is not valid JSON at line "
                       f"{line} ({exc}); Delta writers never leave such an entry, so it was truncated or edited: restore "
                       "the file from a backup, or recreate the table", table=table, version=version, file=path)


def log_damage(table: str, uri: str, version: int | None = None) -> SourceError | None:
    """Why a table's log cannot be read, when the cause is one file: the checkpoint `_last_checkpoint`
    names is missing, or a JSON commit entry a reader of `version` (latest if None) replays is not JSON.
    For the error of a failed open (`deltalake` names neither the version nor the file); None when
    neither is the cause. Lists the log: only called after an open failed."""
    log = f"{uri}/_delta_log"
    names = {f.rsplit("/", 1)[-1]: f for f, _ in storage.list_files(log) if f.rsplit("/", 2)[-2] == "_delta_log"}
    hint_path = f"{log}/_last_checkpoint"
    checkpoint = -1
    if "_last_checkpoint" in names:
        try:
            checkpoint = int(json.loads(storage.read(hint_path) or b"{}")["version"])
        except (ValueError, KeyError, TypeError) as exc:
            return SourceError(f"the Delta log of '{table}' is damaged: its _last_checkpoint is not a checkpoint hint "
                               f"({exc}); restore it, or remove it so readers replay the JSON commits", table=table,
                               file=hint_path)
    if checkpoint >= 0 and (version is None or version >= checkpoint) and \
            not any(n.startswith(f"{checkpoint:020d}.checkpoint") for n in names):
        missing = f"{log}/{checkpoint:020d}.checkpoint.parquet"
        return SourceError(f"the Delta log of '{table}' is damaged: its _last_checkpoint names the checkpoint of version "
                           f"{checkpoint}, whose file is missing; restore the file from a backup, or remove "
                           "_last_checkpoint if every JSON commit since version 0 is still in the log", table=table,
                           version=checkpoint, file=missing)
    commits = sorted(int(n[:20]) for n in names if len(n) == 25 and n.endswith(".json") and n[:20].isdigit())
    start = checkpoint + 1 if version is None or version >= checkpoint else 0
    for v in (v for v in commits if v >= start and (version is None or v <= version)):
        text = (storage.read(entry_path(uri, v)) or b"").decode("utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            try:
                if line.strip():
                    json.loads(line)
            except ValueError as exc:
                return damaged_entry(table, uri, v, number, exc)
    return None


def _entry_stamp(local: str) -> tuple[float, int]:
    try:
        st = os.stat(local)
    except FileNotFoundError:
        return (0.0, -1)
    return (st.st_mtime, st.st_size)


@lru_cache(maxsize=8192)
def _cached_commit(table: str, uri: str, version: int, event_time: str | None, names: tuple,
                   stamp: tuple) -> CommitSummary | None:
    return read_commit(table, uri, version, event_time, names)


def commit_summary(table: str, uri: str, version: int, event_time: str | None,
                   names: tuple[tuple[str, str], ...] = (), *, entry: bytes | None = None) -> CommitSummary | None:
    """`read_commit`, cached while a local log entry is unchanged (entries are immutable once written;
    a table recreated at the same path writes new ones). On an object store knowing whether an entry
    changed costs a request as reading it does, so it is read, unless the caller read it just before
    (`entry`: the run's snapshot did, `snapshot_cache.checkout_appended`)."""
    local = storage.local_path(f"{uri}/_delta_log/{version:020d}.json")
    if local is None:
        return read_commit(table, uri, version, event_time, names, entry=entry)
    return _cached_commit(table, uri, version, event_time, names, _entry_stamp(local))


def missing_files(commit: CommitSummary, *, removed_since: set[str] | None = None) -> list[str]:
    """Files the commit's incremental read needs that no longer exist (vacuumed). Never cached:
    a vacuum removes files without touching the log, so a long-lived process must look again.
    `removed_since`: every file the commits after this one up to the latest version removed, when the
    caller read them all: a data file none of them removed is in the latest snapshot, and a vacuum never
    deletes a file the latest snapshot names, so it is not looked for (a request each on an object store)."""
    needed = [f.uri for f in commit.readable if removed_since is None or f.uri in removed_since]
    for f in commit.readable:  # a change read of a deletion vector needs both vectors
        if f.dv_change is not None:
            needed += [dv.file_uri for dv in (f.dv_change.old, f.dv_change.new) if dv is not None and dv.file_uri]
        elif f.deleted is not None and f.deleted.vector is not None and f.deleted.vector.file_uri:
            needed.append(f.deleted.vector.file_uri)
    return [u for u in needed if not file_exists(u)]
