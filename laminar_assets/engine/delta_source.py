"""Reading Delta source tables: snapshots, commit history and change files.

Delta commit versions are Laminar's sequence numbers. Snapshot facts (schema,
protocol, configuration, the add actions of a pinned version with their
statistics) come from the `deltalake` package's public API. Per-commit actions
(which files a commit added, removed or wrote as change data, and whether the
change was a data change) are not exposed by that API, so this module reads the
commit's JSON entry from `_delta_log/` — the documented Delta protocol format —
and nothing else by hand. A missing commit entry or data file means the history
has expired; it is reported, never skipped.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from enum import Enum
from functools import lru_cache
from typing import Iterable

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from laminar_assets.errors import SourceNotFoundError, UnsupportedTableFeatureError
from .windows import Interval, closed_range, to_utc


class CommitKind(str, Enum):
    """What one Delta commit did to the data of a table."""

    APPEND = "append"  # only added data files
    CHANGE_DATA = "change_data"  # deletes / updates / merges with a change data feed
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
    missing_files: tuple[str, ...] = ()

    @property
    def touched(self) -> tuple[Interval, ...] | None:
        """Event-time ranges the commit touched; None when some range is unknown."""
        if self.kind in (CommitKind.LAYOUT, CommitKind.METADATA, CommitKind.EMPTY):
            return ()
        files = self.cdc if self.kind is CommitKind.CHANGE_DATA else self.adds + self.removes
        ranges = [f.time_range for f in files]
        if any(r is None for r in ranges):
            return None
        return tuple(ranges)  # type: ignore[arg-type]

    @property
    def rows(self) -> int:
        files = self.cdc if self.kind is CommitKind.CHANGE_DATA else self.adds
        return sum(f.rows or 0 for f in files)


@dataclass(frozen=True)
class SourceHistory:
    """Commits of one source in (from_version, latest_version], as the planner sees them."""

    table: str
    uri: str
    from_version: int | None
    latest_version: int
    commits: tuple[CommitSummary, ...] = ()
    expired: str | None = None  # why the range can no longer be read, if it cannot
    cdf_enabled: bool = False


@dataclass(frozen=True)
class TableInfo:
    """Snapshot facts of a table at one version."""

    name: str
    uri: str
    version: int
    schema: pa.Schema
    partition_columns: tuple[str, ...]
    configuration: dict = field(default_factory=dict, hash=False, compare=False)

    @property
    def cdf_enabled(self) -> bool:
        return str(self.configuration.get("delta.enableChangeDataFeed", "false")).lower() == "true"


def resolve_uri(root: str, name: str) -> str:
    """A table name relative to the storage root, or an absolute path / URI as given."""
    if "://" in name or name.startswith("/"):
        return name.rstrip("/")
    return os.path.join(root, name).rstrip("/")


def _local_path(uri: str) -> str | None:
    if uri.startswith("file://"):
        return uri[len("file://"):]
    if "://" not in uri:
        return uri
    return None


def _exists(uri: str) -> bool:
    local = _local_path(uri)
    if local is not None:
        return os.path.exists(local)
    fs, path = pa.fs.FileSystem.from_uri(uri)
    return fs.get_file_info(path).type != pa.fs.FileType.NotFound


def _read_text(uri: str) -> str | None:
    local = _local_path(uri)
    try:
        if local is not None:
            with open(local, encoding="utf-8") as fh:
                return fh.read()
        fs, path = pa.fs.FileSystem.from_uri(uri)
        with fs.open_input_stream(path) as fh:
            return fh.read().decode("utf-8")
    except (FileNotFoundError, OSError):
        return None


def open_table(name: str, uri: str, version: int | None = None) -> DeltaTable:
    """Open a Delta table or raise `SourceNotFoundError` naming it."""
    try:
        return DeltaTable(uri, version=version)
    except TableNotFoundError as exc:
        raise SourceNotFoundError(
            f"source table '{name}' does not exist: expected a Delta table at {uri}; "
            "create it or fix the flow's source", table=name, version=version,
        ) from exc
    except Exception as exc:  # deltalake raises plain errors for a version it cannot load
        raise SourceNotFoundError(
            f"cannot open Delta table '{name}' at {uri}: {exc}", table=name, version=version,
        ) from exc


def table_info(name: str, uri: str, version: int | None = None) -> TableInfo:
    """Snapshot facts at `version` (latest if None); refuses features a Parquet read gets wrong."""
    dt = open_table(name, uri, version)
    meta = dt.metadata()
    info = TableInfo(
        name=name, uri=uri, version=dt.version(), schema=pa.schema(dt.schema().to_arrow()),
        partition_columns=tuple(meta.partition_columns), configuration=dict(meta.configuration),
    )
    mode = info.configuration.get("delta.columnMapping.mode", "none")
    if mode != "none":
        raise UnsupportedTableFeatureError(
            f"table '{name}' uses column mapping (mode '{mode}'): its Parquet column names differ "
            "from the table's, and Laminar reads Parquet files directly; rewrite the table without "
            "column mapping to use it as a source", table=name, version=info.version,
        )
    return info


def temporal(schema: pa.Schema, column: str) -> bool:
    """Statistics of `column` order like time only for timestamp and date columns (not strings)."""
    if column not in schema.names:
        return False
    t = schema.field(column).type
    return pa.types.is_timestamp(t) or pa.types.is_date(t)


def _parse_stat_time(value) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return to_utc(value)
    try:
        return to_utc(datetime.fromisoformat(str(value).replace("Z", "+00:00")))
    except ValueError:
        try:  # a date column
            return datetime.fromisoformat(str(value)).replace(tzinfo=timezone.utc)
        except ValueError:
            return None


def _stats_interval(lo, hi) -> Interval | None:
    """The interval of a file's min/max statistics. JSON statistics may be truncated to
    milliseconds, so the max is widened by 1 ms."""
    lo_t, hi_t = _parse_stat_time(lo), _parse_stat_time(hi)
    if lo_t is None or hi_t is None:
        return None
    return closed_range(lo_t, hi_t + timedelta(milliseconds=1))


def _range_from_stats(stats_json: str | None, column: str) -> tuple[Interval | None, int | None]:
    if not stats_json:
        return None, None
    try:
        stats = json.loads(stats_json)
    except ValueError:
        return None, None
    rows = stats.get("numRecords")
    rng = _stats_interval((stats.get("minValues") or {}).get(column), (stats.get("maxValues") or {}).get(column))
    if rng is None and rows is not None and (stats.get("nullCount") or {}).get(column) == rows:
        # every event time is null: the file touches no window
        return Interval(datetime(1970, 1, 1, tzinfo=timezone.utc), datetime(1970, 1, 1, tzinfo=timezone.utc)), rows
    return rng, rows


def _range_from_footer(uri: str, column: str) -> tuple[Interval | None, int | None]:
    """Event-time range from a Parquet footer (row-group statistics); reads no data pages."""
    local = _local_path(uri)
    try:
        if local is not None:
            meta = pq.read_metadata(local)
        else:
            fs, path = pa.fs.FileSystem.from_uri(uri)
            with fs.open_input_file(path) as fh:
                meta = pq.read_metadata(fh)
    except (OSError, pa.ArrowInvalid):
        return None, None
    names = meta.schema.names
    if column not in names:
        return None, meta.num_rows
    idx = names.index(column)
    lo = hi = None
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(idx).statistics
        if stats is None or not stats.has_min_max:
            if meta.row_group(i).num_rows and (stats is None or stats.null_count != meta.row_group(i).num_rows):
                return None, meta.num_rows
            continue
        a, b = _parse_stat_time(stats.min), _parse_stat_time(stats.max)
        if a is None or b is None:
            return None, meta.num_rows
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    if lo is None:
        epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
        return Interval(epoch, epoch), meta.num_rows
    return closed_range(lo, hi), meta.num_rows


def _file(root: str, action: dict, column: str | None, *, change_data: bool = False, use_footer: bool = False) -> DataFile:
    from urllib.parse import unquote

    path = unquote(action["path"])
    uri = path if "://" in path or path.startswith("/") else f"{root}/{path}"
    if column is None:
        rows = None
        try:
            rows = json.loads(action.get("stats") or "{}").get("numRecords")
        except ValueError:
            pass
        return DataFile(uri=uri, rows=rows, size=int(action.get("size") or 0),
                        partition_values=tuple(sorted((action.get("partitionValues") or {}).items())),
                        time_range=None, change_data=change_data)
    rng, rows = _range_from_stats(action.get("stats"), column)
    if rng is None and use_footer:
        rng, rows = _range_from_footer(uri, column)
    pv = tuple(sorted((action.get("partitionValues") or {}).items()))
    return DataFile(uri=uri, rows=rows, size=int(action.get("size") or 0), partition_values=pv,
                    time_range=rng, change_data=change_data, time_nulls=_null_count(action.get("stats"), column))


def _null_count(stats_json: str | None, column: str) -> int | None:
    try:
        value = (json.loads(stats_json or "{}").get("nullCount") or {}).get(column)
    except ValueError:
        return None
    return int(value) if isinstance(value, int) else None


def read_commit(table: str, uri: str, version: int, event_time: str | None) -> CommitSummary | None:
    """Summarise commit `version`, or None if its log entry no longer exists.
    `event_time` None: the column's statistics cannot locate rows (every range is unknown)."""
    text = _read_text(f"{uri}/_delta_log/{version:020d}.json")
    if text is None:
        return None
    adds, removes, cdc, missing = [], [], [], []
    info: dict = {}
    metadata_changed = protocol_changed = False
    data_removes = data_adds = layout_only = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        action = json.loads(line)
        if "commitInfo" in action:
            info = action["commitInfo"]
        elif "metaData" in action:
            metadata_changed = True
        elif "protocol" in action:
            protocol_changed = True
        elif "add" in action:
            add = action["add"]
            if add.get("dataChange", True):
                data_adds += 1
                adds.append(_file(uri, add, event_time))
            else:
                layout_only += 1
        elif "remove" in action:
            rem = action["remove"]
            if rem.get("dataChange", True):
                data_removes += 1
                removes.append(_file(uri, rem, event_time, use_footer=True))
            else:
                layout_only += 1
        elif "cdc" in action:
            cdc.append(_file(uri, action["cdc"], event_time, change_data=True, use_footer=True))
    if cdc:
        kind = CommitKind.CHANGE_DATA
    elif data_removes:
        kind = CommitKind.REWRITE
    elif data_adds:
        kind = CommitKind.APPEND
    elif layout_only:
        kind = CommitKind.LAYOUT
    elif metadata_changed or protocol_changed:
        kind = CommitKind.METADATA
    else:
        kind = CommitKind.EMPTY
    readable = cdc if kind is CommitKind.CHANGE_DATA else (adds if kind is CommitKind.APPEND else [])
    missing = [f.uri for f in readable if not _exists(f.uri)]
    ts_ms = info.get("timestamp") or 0
    return CommitSummary(
        version=version, timestamp=datetime.fromtimestamp(ts_ms / 1000, tz=timezone.utc),
        operation=str(info.get("operation", "UNKNOWN")), kind=kind, adds=tuple(adds),
        removes=tuple(removes), cdc=tuple(cdc), missing_files=tuple(missing),
    )


@lru_cache(maxsize=4096)
def _cached_commit(table: str, uri: str, version: int, event_time: str | None, stamp: float) -> CommitSummary | None:
    return read_commit(table, uri, version, event_time)


def source_history(table: str, uri: str, from_version: int | None, latest: int, event_time: str,
                   *, info: TableInfo | None = None) -> SourceHistory:
    """Commits in (from_version, latest]; `expired` says why the range is unreadable, if it is.
    `info`: the snapshot at `latest` if the caller already opened it."""
    info = info if info is not None and info.version == latest else table_info(table, uri, latest)
    if from_version is not None and from_version > latest:
        return SourceHistory(table, uri, from_version, latest, (), (
            f"'{table}' is at version {latest}, behind the checkpoint at version {from_version}: "
            "the table was recreated or restored, so its history since the checkpoint is unknown"), info.cdf_enabled)
    if from_version is None or from_version >= latest:
        return SourceHistory(table, uri, from_version, latest, (), None, info.cdf_enabled)
    stats_column = event_time if temporal(info.schema, event_time) else None
    commits: list[CommitSummary] = []
    for version in range(from_version + 1, latest + 1):
        path = f"{uri}/_delta_log/{version:020d}.json"
        local = _local_path(path)
        stamp = os.path.getmtime(local) if local and os.path.exists(local) else 0.0
        summary = _cached_commit(table, uri, version, stats_column, stamp)
        if summary is None:
            return SourceHistory(
                table, uri, from_version, latest, tuple(commits),
                f"commit {version} of '{table}' is no longer in the Delta log (log clean-up); "
                f"the checkpoint at version {from_version} is older than the history Delta keeps",
                info.cdf_enabled,
            )
        if summary.missing_files:
            return SourceHistory(
                table, uri, from_version, latest, tuple(commits),
                f"commit {version} of '{table}' refers to files that were vacuumed "
                f"({summary.missing_files[0]}{' and more' if len(summary.missing_files) > 1 else ''})",
                info.cdf_enabled,
            )
        commits.append(summary)
    return SourceHistory(table, uri, from_version, latest, tuple(commits), None, info.cdf_enabled)


def snapshot_files(info: TableInfo, event_time: str | None, within: Iterable[Interval] | None = None,
                   *, keep_null_files: bool = False) -> list[DataFile]:
    """Data files of the pinned snapshot, pruned to those whose statistics overlap `within`.
    Files whose event times are all null are left out unless `keep_null_files`."""
    dt = open_table(info.name, info.uri, info.version)
    ranges = list(within) if within is not None else None
    if "deletionVectors" in (dt.protocol().reader_features or []):
        dvs = pa.table(dt.deletion_vectors())
        if dvs.num_rows:
            raise UnsupportedTableFeatureError(
                f"table '{info.name}' has deletion vectors at version {info.version}: a plain Parquet read "
                "would return deleted rows; run OPTIMIZE/PURGE (REORG TABLE ... APPLY (PURGE)) to "
                "materialise them, or disable deletion vectors", table=info.name, version=info.version,
            )
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    if event_time is not None and not temporal(info.schema, event_time):
        event_time = None  # e.g. string times: their statistics do not order like time
    files = []
    for a in actions:
        rng = _stats_interval(a.get(f"min.{event_time}"), a.get(f"max.{event_time}")) if event_time else None
        all_null = event_time and a.get("num_records") is not None and \
            a.get(f"null_count.{event_time}") == a.get("num_records")
        if rng is None and all_null and not keep_null_files:
            continue  # all event times null: no window can use these rows
        if ranges is not None and rng is not None and not any(rng.overlaps(r) for r in ranges):
            continue
        pv = tuple(sorted((k[len("partition."):], None if v is None else str(v))
                          for k, v in a.items() if k.startswith("partition.")))
        from urllib.parse import unquote

        path = unquote(a["path"])
        uri = path if "://" in path or path.startswith("/") else f"{info.uri}/{path}"
        nulls = a.get(f"null_count.{event_time}") if event_time else None
        files.append(DataFile(uri=uri, rows=a.get("num_records"), size=int(a.get("size_bytes") or 0),
                              partition_values=pv, time_range=rng,
                              time_nulls=int(nulls) if nulls is not None else None))
    return files
