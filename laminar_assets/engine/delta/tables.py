"""Delta tables as Laminar reads them: pinned snapshots and the history of commits since a version.

Delta commit versions are Laminar's sequence numbers. Snapshot facts (schema,
protocol, configuration, the add actions of a pinned version with their
statistics) come from the `deltalake` package's public API; per-commit actions
come from `delta_log`. A missing commit entry or a vacuumed data file means the
history has expired; it is reported, never skipped.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from laminar_assets import storage
from laminar_assets.errors import LaminarError, SourceNotFoundError, UnsupportedTableFeatureError

from ..windows import Interval
from . import catalog_names, snapshot_cache
from .deletion_vectors import log_deleted_rows, snapshot_deleted_rows
from .file_ranges import key_bounds, may_overlap
from .log import (  # noqa: F401  (re-exported: the planner and tests use them from here)
    CommitKind,
    CommitSummary,
    DataFile,
    action_file,
    commit_summary,
    entry_path,
    file_exists,
    log_damage,
    missing_files,
    partition_text,
    read_commit,
    read_log_entry,
    stats_interval,
)
from .log_snapshot import LogSnapshot
from .schema_history import foreign_versions, retyped_commits, widened_commits, widens

# Reader features Laminar reads correctly; any other is refused by name (Delta protocol, "Table Features").
SUPPORTED_READER_FEATURES = frozenset({
    "deletionVectors",  # rows skipped by position (deletion_vectors.py)
    "columnMapping",  # Parquet columns read by physical name, exposed by logical name
    "timestampNtz",  # Spark reads TIMESTAMP_NTZ natively
    "v2Checkpoint", "vacuumProtocolCheck",  # log-level features: deltalake reads the log
    # files written before a column was widened hold the old Parquet type: Spark's Parquet reader reads
    # them under the new one (`type_changes` refuses the changes it does not read exactly)
    "typeWidening", "typeWidening-preview",
    # VARIANT columns: Spark reads them as variants when the read asks for one (`spark_schema` with the
    # Delta schema); `check_source` refuses a variant as a key, an aggregate or a sink column
    "variantType", "variantType-preview",
})
TYPE_WIDENING = frozenset({"typeWidening", "typeWidening-preview"})
# Reader features Laminar reads that `deltalake`'s scans refuse ("Unsupported table features required", from
# `DeltaTable.deletion_vectors()` too): a snapshot's deletion vectors are then read from the log itself. The
# delta-spark feature matrix found vacuumProtocolCheck (Databricks and delta-spark 4.4 write it) beside deletion
# vectors failing every run that read a snapshot (#63).
UNSCANNED_BY_DELTALAKE = TYPE_WIDENING | {"vacuumProtocolCheck"}


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
    # versions whose log entry is gone, and versions whose files were vacuumed (version -> a file)
    gone: tuple[int, ...] = field(default=(), compare=False)
    vacuumed: tuple[tuple[int, str], ...] = field(default=(), compare=False)
    # files removed by a commit (version, file) that no longer exist: every snapshot before that
    # version may name them, so a run must not read one (looked for only when asked: `source_history`)
    snapshot_gone: tuple[tuple[int, str], ...] = field(default=(), compare=False)
    # (version, why) of commits whose files hold a column the reader reads under another type than the
    # table has now (`with_retyped`): no read with the current schema can merge or sweep them
    retyped: tuple[tuple[int, str], ...] = field(default=(), compare=False)
    # versions at which a column the reader reads had another type family than the table has now
    # (`with_retyped`): a bounded run does not stop at one (the planner's `_bound`)
    foreign: tuple[int, ...] = field(default=(), compare=False)
    # (version, why) of commits that widened a column the reader reads (`with_retyped`: int -> bigint, ...):
    # state built before them is refilled (SCHEMA_CHANGED), not merged with rows read under the new type
    widened: tuple[tuple[int, str], ...] = field(default=(), compare=False)

    def with_retyped(self, now: TableInfo, columns) -> SourceHistory:
        """This history with `retyped` and `foreign` found for a reader of `columns` ("*": all) with
        `now`'s schema."""
        @functools.cache  # opened once for both (a failed open is not cached: it raises again)
        def start() -> str:
            return open_table(self.table, self.uri, self.from_version).schema().to_json()
        return replace(self, retyped=retyped_commits(self.table, self.commits, now.delta_schema, columns, start),
                       foreign=foreign_versions(self.commits, now.delta_schema, columns, start),
                       widened=widened_commits(self.table, self.commits, columns, start))

    def schema_at(self, version: int) -> tuple[int, str] | None:
        """(v, Delta schema JSON) of the schema in effect at `version` as the log tells it (v ==
        `version`: from this history's commits, or the snapshot at `version` opened), or, when the log
        no longer holds `version` (cleaned up), at the oldest version after it that it still opens.
        None when no commit after `version` changed the schema (the latest one was in effect then) or
        the log cannot tell."""
        if self.from_version is None or not self.from_version <= version < self.latest_version:
            return None
        gone_after = [v for v in self.gone if v > version]
        if not gone_after and not any(c.schema for c in self.commits if c.version > version):
            return None  # the common case: no schema change since, and nothing more is read
        known = [c for c in self.commits if c.version <= version and c.schema]
        last_schema = known[-1].schema if known else None
        if last_schema is not None and not any(known[-1].version < v <= version for v in self.gone):
            return version, last_schema
        for at in dict.fromkeys((version, max(gone_after, default=version) + 1)):
            if at > self.latest_version:
                break
            try:
                return at, open_table(self.table, self.uri, at).schema().to_json()
            except LaminarError:  # that version's log entry is gone: try the oldest after it
                continue
        return None

    def snapshot_readable(self, version: int) -> str | None:
        """None when the snapshot at `version` names no file known to be gone, else why it cannot be read."""
        lost = [(v, f) for v, f in self.snapshot_gone if v > version]
        if not lost:
            return None
        v, f = lost[0]
        return (f"the snapshot at version {version} of '{self.table}' names files that were vacuumed after "
                f"commit {v} removed them ({f}{' and more' if len(lost) > 1 else ''})")

    def replaced(self, version: int) -> SourceHistory:
        """This history seen from a watermark at `version` of another table that stood at the same path
        (its Delta id differs): nothing after that version can be read as a change to it."""
        return SourceHistory(self.table, self.uri, version, self.latest_version, (), (
            f"'{self.table}' was recreated since the checkpoint at version {version} (its Delta table id "
            "changed), so its history since the checkpoint is unknown"), self.cdf_enabled)

    def after(self, version: int | None) -> SourceHistory:
        """The same history seen from a later watermark: commits after `version` only. A run reads the
        log once from its oldest watermark and gives every partition its own slice."""
        if version is None or version == self.from_version:
            return self
        if self.from_version is None or version < self.from_version:  # never hand out a slice we did not read
            raise ValueError(f"history of '{self.table}' starts at {self.from_version}, not before {version}")
        if version > self.latest_version:
            return _recreated(self.table, self.uri, version, self.latest_version, self.cdf_enabled)
        gone = tuple(v for v in self.gone if v > version)
        vacuumed = tuple((v, f) for v, f in self.vacuumed if v > version)
        snapshot_gone = tuple((v, f) for v, f in self.snapshot_gone if v > version)
        return SourceHistory(self.table, self.uri, version, self.latest_version,
                             tuple(c for c in self.commits if c.version > version),
                             _expired(self.table, version, gone, vacuumed), self.cdf_enabled, gone, vacuumed,
                             snapshot_gone, tuple((v, why) for v, why in self.retyped if v > version),
                             tuple(v for v in self.foreign if v > version),
                             tuple((v, why) for v, why in self.widened if v > version))


@dataclass(frozen=True)
class TableInfo:
    """Snapshot facts of a table at one version (with the opened table, so it is opened once)."""

    name: str
    uri: str
    version: int
    schema: pa.Schema
    partition_columns: tuple[str, ...]
    configuration: dict = field(default_factory=dict, hash=False, compare=False)
    table: DeltaTable | None = field(default=None, hash=False, compare=False, repr=False)
    # column mapping: the Delta schema (JSON, with physical names in its field metadata)
    delta_schema: str | None = field(default=None, hash=False, compare=False, repr=False)
    # the table's Delta id (its first commit's metaData.id): a table recreated at the same path has another
    table_id: str | None = field(default=None, hash=False, compare=False)
    # A snapshot derived from an earlier one (`snapshot_cache.checkout_appended`): `table` is the snapshot at
    # `base_version`, and `appended` the add actions (version, action) of the commits since, which only added
    # files (so schema, configuration, protocol and id are `table`'s); `snapshot_files` lists both
    base_version: int | None = field(default=None, hash=False, compare=False)
    appended: tuple[tuple[int, dict], ...] = field(default=(), hash=False, compare=False, repr=False)
    # commit files the snapshot's checkout read ({version: bytes}): the run's history does not read them again
    log_entries: dict = field(default_factory=dict, hash=False, compare=False, repr=False)
    # the tag of `version`'s commit file as the checkout listed it (an object store's pooled snapshot; None: not
    # known): what the next run's check that nothing moved compares (`unchanged.remember`)
    tag: str | None = field(default=None, hash=False, compare=False)

    @property
    def column_mapping(self) -> str:
        return str(self.configuration.get("delta.columnMapping.mode", "none"))

    @property
    def physical_names(self) -> dict[str, str]:
        """Logical -> physical name of each top-level column (identity without column mapping)."""
        if self.column_mapping == "none" or not self.delta_schema:
            return {n: n for n in self.schema.names}
        fields = json.loads(self.delta_schema)["fields"]
        return {f["name"]: (f.get("metadata") or {}).get("delta.columnMapping.physicalName", f["name"])
                for f in fields}

    def physical(self, column: str | None) -> str | None:
        """The physical (Parquet and statistics) name of a logical column."""
        return None if column is None else self.physical_names.get(column, column)

    @property
    def name_pairs(self) -> tuple[tuple[str, str], ...]:
        """(physical, logical) pairs where they differ, hashable for caches."""
        return tuple(sorted((p, name) for name, p in self.physical_names.items() if p != name))

    @property
    def cdf_enabled(self) -> bool:
        return str(self.configuration.get("delta.enableChangeDataFeed", "false")).lower() == "true"

    def delta(self) -> DeltaTable:
        """The `deltalake` table at `version` (a derived snapshot's is opened at that version: its `table` is
        at `base_version`)."""
        if self.base_version is not None and self.base_version != self.version:
            return open_table(self.name, self.uri, self.version)
        return self.table if self.table is not None else open_table(self.name, self.uri, self.version)

    def at_base(self) -> TableInfo:
        """A derived snapshot's base (itself when it is not derived)."""
        if self.base_version is None or self.base_version == self.version:
            return self
        return replace(self, version=self.base_version, base_version=None, appended=(), log_entries={}, tag=None)


def resolve_uri(root: str, name: str) -> str:
    """A table name relative to the storage root, or an absolute path / URI as given; a source's catalog name
    (`raw.trades`) at the location a run recorded for it (`catalog_names`)."""
    if "://" in name or name.startswith("/"):
        return name.rstrip("/")
    if catalog_names.looks_like_name(name) and (found := catalog_names.recorded(root, name)) is not None:
        return found
    return os.path.join(root, name).rstrip("/")


def open_table(name: str, uri: str, version: int | None = None) -> DeltaTable:
    """Open a Delta table for reading or raise `SourceNotFoundError` naming it. Readers of the same
    snapshot in one process share one open table (`snapshot_cache`): never commit through it."""
    try:
        return snapshot_cache.open_snapshot(uri, version, _open_named(name))
    except (DeltaError, OSError, ValueError) as exc:  # e.g. a version whose log entry is gone
        raise open_error(name, uri, version, exc) from exc


def open_error(name: str, uri: str, version: int | None, exc: Exception) -> LaminarError:
    """The error of a failed open: the damaged file when one is the cause, else deltalake's first line."""
    damage = log_damage(name, uri, version)  # deltalake's error names neither the version nor the file
    if damage is not None:
        return damage
    first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__  # not its backtrace
    return SourceNotFoundError(f"cannot open Delta table '{name}' at {uri}: {first_line}", table=name, version=version)


def _open(uri: str, version: int | None) -> DeltaTable:
    return open_delta(uri, version)


def open_delta(uri: str, version: int | None = None) -> DeltaTable:
    """A `deltalake` table at `uri` (a path or an object-store URI, reached with this process's
    store options): a handle of its own, which a writer may commit through."""
    return DeltaTable(uri, version=version, storage_options=storage.delta_options(uri))


def is_delta_table(uri: str) -> bool:
    """Whether a Delta table exists at `uri`."""
    return DeltaTable.is_deltatable(uri, storage_options=storage.delta_options(uri))


def table_info(name: str, uri: str, version: int | None = None) -> TableInfo:
    """Snapshot facts at `version` (latest if None); refuses features a Parquet read gets wrong."""
    return info_of(name, uri, open_table(name, uri, version))


def checkout_info(name: str, uri: str, *, listed: dict[int, str] | None = None) -> tuple[TableInfo, Callable[[], None]]:
    """`table_info` at the latest version, for one run: on an object store the snapshot comes from the
    process's pool (`snapshot_cache.checkout`: the last run's handle moved forward, reading only the commits
    since), and the returned `release` gives it back; call it when the run is done with the snapshot (the
    `TableInfo` must not be read after). Elsewhere `table_info` as it is, and `release` does nothing.
    `listed`: the log's commit files as the caller listed them just before (`snapshot_cache.checkout`)."""
    if not storage.is_object_store(uri):
        return table_info(name, uri), _nothing
    try:
        held = snapshot_cache.checkout_appended(uri, _open_named(name), listed=listed)
    except (DeltaError, OSError, ValueError) as exc:  # opened as `open_table` does, for its errors
        raise open_error(name, uri, None, exc) from exc
    try:
        info = info_of(name, uri, held.table)
    except BaseException:
        snapshot_cache.give_back_held(uri, held)
        raise
    if held.version != held.base:  # the commits since only added files (`snapshot_cache.checkout_appended`)
        info = replace(info, version=held.version, base_version=held.base, appended=held.appended)
    info = replace(info, log_entries=held.entries, tag=held.tag)
    return info, lambda: snapshot_cache.give_back_held(uri, held)


def checkout_table(uri: str, *, name: str | None = None) -> tuple[DeltaTable, Callable[[], None]]:
    """A table Laminar writes (state, sink) at its latest version, for one run: on an object store from the
    process's pool like `checkout_info` (the run may commit through it: that leaves the handle where it was);
    `release` gives it back. Raises `TableNotFoundError` when there is no table yet, and a `SourceError` naming
    the table (`name`, else its URI) and the damaged file when its log cannot be read (`deltalake`'s own error
    names neither)."""
    try:
        if not storage.is_object_store(uri):
            return open_delta(uri), _nothing
        dt, tag = snapshot_cache.checkout(uri, _open, replay=True)
    except TableNotFoundError:
        raise
    except DeltaError as exc:
        raise open_error(name or uri, uri, None, exc) from None
    version = dt.version()
    return dt, lambda: snapshot_cache.give_back(uri, dt, version, tag)


def _nothing() -> None:
    return None


def _open_named(name: str) -> Callable[[str, int | None], DeltaTable]:
    def opener(uri: str, version: int | None) -> DeltaTable:
        try:
            return _open(uri, version)
        except TableNotFoundError as exc:
            raise SourceNotFoundError(
                f"source table '{name}' does not exist: expected a Delta table at {uri}; "
                "create it or fix the flow's source", table=name, version=version,
            ) from exc
    return opener


def info_of(name: str, uri: str, dt: DeltaTable) -> TableInfo:
    """`table_info` of a table already open (at the version it was opened at)."""
    meta = dt.metadata()
    schema = dt.schema()
    info = TableInfo(
        name=name, uri=uri, version=dt.version(), schema=pa.schema(schema.to_arrow()),
        partition_columns=tuple(meta.partition_columns), configuration=dict(meta.configuration), table=dt,
        delta_schema=schema.to_json(), table_id=str(meta.id),
    )
    unsupported = sorted(set(dt.protocol().reader_features or []) - SUPPORTED_READER_FEATURES)
    if unsupported:
        raise UnsupportedTableFeatureError(
            f"table '{name}' at version {info.version} needs reader feature(s) {', '.join(unsupported)}, "
            f"which Laminar cannot read correctly yet (supported: {', '.join(sorted(SUPPORTED_READER_FEATURES))}); "
            "use a source without them", table=name, version=info.version, feature=",".join(unsupported),
        )
    if TYPE_WIDENING & set(dt.protocol().reader_features or []):
        refuse_unreadable_widening(info)
    return info


def type_changes(delta_schema: str | None) -> list[tuple[str, str, str, int | None]]:
    """The type changes a Delta schema (JSON) records (type widening: field metadata `delta.typeChanges`,
    a list of {fromType, toType[, fieldPath][, tableVersion]}), each as (column path, from type, the
    column's type now, version or None). Data files written before a change hold the column under its
    from type; a reader reads them under the type the column has now (the last change's `toType`)."""
    found: list[tuple[str, str, str, int | None]] = []

    def leaf(typ, path: str):
        """The type at `path` ("element", "key", "value" steps) under `typ`."""
        for step in [s for s in path.split(".") if s]:
            if not isinstance(typ, dict):
                return None
            typ = typ.get({"element": "elementType", "key": "keyType", "value": "valueType"}.get(step, step))
        return typ

    def walk(typ, prefix: str) -> None:
        if not isinstance(typ, dict):
            return
        if typ.get("type") == "struct":
            for f in typ.get("fields", []):
                for change in (f.get("metadata") or {}).get("delta.typeChanges") or []:
                    sub = str(change.get("fieldPath") or "")
                    now = leaf(f["type"], sub)
                    version = change.get("tableVersion")
                    found.append((prefix + f["name"] + (f".{sub}" if sub else ""), str(change.get("fromType")),
                                  now if isinstance(now, str) else json.dumps(now),
                                  int(version) if version is not None else None))
                walk(f["type"], f"{prefix}{f['name']}.")
        elif typ.get("type") == "array":
            walk(typ.get("elementType"), f"{prefix}element.")
        elif typ.get("type") == "map":
            walk(typ.get("keyType"), f"{prefix}key.")
            walk(typ.get("valueType"), f"{prefix}value.")

    if delta_schema:
        walk(json.loads(delta_schema), "")
    return found


def refuse_unreadable_widening(info: TableInfo) -> None:
    """Raise `UnsupportedTableFeatureError` when a column of a table with type widening was widened in a way
    Laminar does not read exactly (`widens`: every widening Delta allows is read by Spark's Parquet reader,
    which casts an old file's values to the column's new type as delta-spark does), naming the table, the
    column, both types and the version."""
    for path, old, now, version in type_changes(info.delta_schema):
        if widens(old, now):
            continue
        at = f"at version {version}" if version is not None else f"at or before version {info.version}"
        raise UnsupportedTableFeatureError(
            f"table '{info.name}' at version {info.version} has column {path!r} changed from {old} to {now} {at} "
            "(type widening), which Laminar cannot read correctly from the files written before the change; "
            "have the producer rewrite those files (delta-spark: REORG TABLE ... APPLY (UPGRADE UNIFORM(...)) or "
            "ALTER TABLE ... DROP FEATURE 'typeWidening') or use a source without it",
            table=info.name, version=info.version, column=path, feature="typeWidening", from_type=old, to_type=now,
        )


def collations(delta_schema: str | None) -> dict[str, tuple[str, str]]:
    """Collated string columns of a Delta schema (JSON): {path: (top-level column, collation)} for every
    string whose collation is not plain byte order. Writers record a collation in the field metadata
    `__COLLATIONS` ({path from the field: "provider.name[.version]"}, Delta's `collations` feature; OSS
    delta-spark 4.4 writes it with `spark.databricks.delta.schema.typeCheck.enabled` off, without the
    feature in the protocol); Arrow and `deltalake` read such a column as a plain string."""
    found: dict[str, tuple[str, str]] = {}

    def walk(typ, prefix: str, top: str | None) -> None:
        if not isinstance(typ, dict):
            return
        if typ.get("type") == "struct":
            for f in typ.get("fields", []):
                column = top or f["name"]
                for key, collation in ((f.get("metadata") or {}).get("__COLLATIONS") or {}).items():
                    if str(collation).split(".")[:2] != ["spark", "UTF8_BINARY"]:
                        found[prefix + key] = (column, str(collation))
                walk(f["type"], f"{prefix}{f['name']}.", column)
        elif typ.get("type") == "array":
            walk(typ.get("elementType"), f"{prefix}element.", top)
        elif typ.get("type") == "map":
            walk(typ.get("keyType"), f"{prefix}key.", top)
            walk(typ.get("valueType"), f"{prefix}value.", top)

    if delta_schema:
        walk(json.loads(delta_schema), "", None)
    return found


def refuse_collated(info: TableInfo, columns) -> None:
    """Raise `UnsupportedTableFeatureError` when a reader of `columns` ("*": all) of the table would read a
    collated string column (`collations`). Spark with Delta groups, joins and compares such a column by its
    collation (UTF8_LCASE: 'A' = 'a'; UNICODE: ICU order); Laminar reads the Parquet strings and its state
    and sinks compare bytes, so its rollups would split or order keys differently: a refusal, never a wrong
    answer. A collated column the reader does not use is read as it is stored and changes nothing."""
    columns = set(columns)
    used = [(path, column, collation) for path, (column, collation) in collations(info.delta_schema).items()
            if "*" in columns or column in columns]
    if not used:
        return
    path, column, collation = used[0]
    more = f" (and {', '.join(repr(p) for p, _, _ in used[1:])})" if len(used) > 1 else ""
    raise UnsupportedTableFeatureError(
        f"table '{info.name}' at version {info.version} has column {path!r} with collation {collation}{more}, "
        "which Laminar reads as a plain (byte-ordered, case-sensitive) string while Spark groups and compares "
        "it by its collation; have the producer write it as plain STRING (for UTF8_LCASE e.g. "
        f"LOWER({column})), or leave it out of the flow's keys, filters, rules and derived columns",
        table=info.name, version=info.version, column=path, feature="collations", collation=collation,
    )


def column_fate(info: TableInfo, column: str, *, max_versions: int = 1000) -> str | None:
    """How a logical column the table once had left it: 'renamed to X at version V' (column mapping
    keeps the physical name) or 'dropped at version V'; None if the log does not show it."""
    if info.column_mapping == "none":
        return None
    now = {p: name for name, p in info.physical_names.items()}
    newer: int | None = None  # the version of the newest schema change seen so far (walking back)
    for version in range(info.version, max(-1, info.version - max_versions), -1):
        text = read_log_entry(info.name, info.uri, version)
        if text is None:
            return None
        for line in text.splitlines():
            if '"metaData"' not in line:
                continue
            fields = json.loads(json.loads(line)["metaData"]["schemaString"])["fields"]
            then = {f["name"]: (f.get("metadata") or {}).get("delta.columnMapping.physicalName", f["name"])
                    for f in fields}
            if column in then and newer is not None:
                physical = then[column]
                if physical in now:
                    return f"renamed to {now[physical]!r} at version {newer}"
                return f"dropped at version {newer}"
            newer = version
    return None


def temporal(schema: pa.Schema, column: str) -> bool:
    """Statistics of `column` order like time only for timestamp and date columns (not strings)."""
    if column not in schema.names:
        return False
    t = schema.field(column).type
    return pa.types.is_timestamp(t) or pa.types.is_date(t)


def _recreated(table: str, uri: str, from_version: int, latest: int, cdf: bool) -> SourceHistory:
    return SourceHistory(table, uri, from_version, latest, (), (
        f"'{table}' is at version {latest}, behind the checkpoint at version {from_version}: "
        "the table was recreated or restored, so its history since the checkpoint is unknown"), cdf)


def _expired(table: str, since: int | None, gone: tuple[int, ...], vacuumed: tuple[tuple[int, str], ...]) -> str | None:
    if gone:
        return (f"commit {gone[0]} of '{table}' is no longer in the Delta log (log clean-up); "
                f"the checkpoint at version {since} is older than the history Delta keeps")
    if vacuumed:
        version, path = vacuumed[0]
        more = " and more" if len(vacuumed) > 1 else ""
        return f"commit {version} of '{table}' refers to files that were vacuumed ({path}{more})"
    return None


def source_history(table: str, uri: str, from_version: int | None, latest: int, event_time: str,
                   *, info: TableInfo | None = None, check_snapshots: bool = False,
                   at_latest: bool = False) -> SourceHistory:
    """Commits in (from_version, latest]; `expired` says why the range is unreadable, if it is.
    `info`: the snapshot at `latest` if the caller already opened it. Log entries are parsed once
    per process; whether their files still exist is checked on every call. `check_snapshots`: also
    look whether the files each commit removed still exist (`snapshot_gone`), for runs that may read
    a snapshot older than `latest` (a spec that bounds its work per run). `at_latest`: `latest` is the
    table's latest version (as just listed): a file a commit added that no later commit removed is in the
    latest snapshot, which no vacuum deletes from, so it is not looked for (`missing_files`)."""
    info = info if info is not None and info.version == latest else table_info(table, uri, latest)
    if from_version is not None and from_version > latest:
        return _recreated(table, uri, from_version, latest, info.cdf_enabled)
    if from_version is None or from_version >= latest:
        return SourceHistory(table, uri, from_version, latest, (), None, info.cdf_enabled)
    stats_column = info.physical(event_time) if temporal(info.schema, event_time) else None
    commits: list[CommitSummary] = []
    gone: list[int] = []
    vacuumed: list[tuple[int, str]] = []
    snapshot_gone: list[tuple[int, str]] = []
    versions = range(from_version + 1, latest + 1)
    entries: dict[int, bytes | None] = dict(info.log_entries)
    if storage.is_object_store(uri):  # the entries the snapshot did not read, side by side (a local log is cached)
        unread = [v for v in versions if v not in entries]
        entries.update(zip(unread, storage.read_many_immutable([(entry_path(uri, v), None) for v in unread])))
    for version in versions:
        if version in entries and entries[version] is None:  # read just now: gone
            gone.append(version)
            continue
        summary = commit_summary(table, uri, version, stats_column, info.name_pairs, entry=entries.get(version))
        if summary is None:
            gone.append(version)
            continue
        commits.append(summary)
    # Files removed after each commit, up to `latest` (when every commit since was read): a file a commit
    # added that no later one removed is in the latest snapshot, which no vacuum deletes from
    later: set[str] = set()
    for summary in reversed(commits):  # newest first: `later` holds what the commits after this one removed
        lost = missing_files(summary, removed_since=later if at_latest and not gone else None)
        if lost:
            vacuumed.insert(0, (summary.version, lost[0]))
        later.update(summary.removed)
    if check_snapshots:
        for summary in commits:
            snapshot_gone += [(summary.version, f) for f in summary.removed if not file_exists(f)][:1]
    return SourceHistory(table, uri, from_version, latest, tuple(commits),
                         _expired(table, from_version, tuple(gone), tuple(vacuumed)), info.cdf_enabled,
                         tuple(gone), tuple(vacuumed), tuple(snapshot_gone))


def snapshot_files(info: TableInfo, event_time: str | None, within: Iterable[Interval] | None = None,
                   *, keep_null_files: bool = False, bounds_of: tuple[str, ...] = ()) -> list[DataFile]:
    """Data files of the pinned snapshot, pruned to those whose statistics overlap `within`.
    Files whose event times are all null are left out unless `keep_null_files`. `bounds_of`: columns
    whose min/max statistics each file keeps (`DataFile.bounds`), for refills of some keys."""
    if info.at_base() is not info:  # a derived snapshot: its base's files and the files appended since
        return [*snapshot_files(info.at_base(), event_time, within, keep_null_files=keep_null_files,
                                bounds_of=bounds_of), *_appended_files(info, event_time, within, keep_null_files)]
    dt = info.delta()
    if isinstance(dt, LogSnapshot):  # a table Laminar writes, replayed from its log: its add actions as written
        return _action_files(info, dt.add_actions(), event_time, within, keep_null_files, bounds_of=bounds_of)
    ranges = list(within) if within is not None else None
    deleted = {}
    features = set(dt.protocol().reader_features or [])
    if "deletionVectors" in features:
        # deltalake refuses to scan a table with type widening or the vacuum protocol check: its vectors
        # are read from the log then (keyed by path). deltalake keys them by URL, percent-encoded: a partition
        # folder with an escaped character (`pts=2024-01-01 00%3A00%3A00`, any timestamp) is `%20` and `%253A`
        # there, so the URL is decoded once before it is matched with the path below. Matched undecoded, the
        # vector was never found and a refill read the deleted rows again (the feature matrix, #63).
        found = log_deleted_rows(info.uri, info.version) if features & UNSCANNED_BY_DELTALAKE \
            else {unquote(url): rows for url, rows in snapshot_deleted_rows(dt).items()}
        deleted = {_normal(p): rows for p, rows in found.items()}
    if event_time is not None and not temporal(info.schema, event_time):
        event_time = None  # e.g. string times: their statistics do not order like time
    stat = info.physical(event_time)  # statistics are keyed by physical name; partition values are not
    actions = pa.table(dt.get_add_actions(flatten=True))
    if event_time is not None and stat is not None and ranges is not None:  # (stat: None only without event_time)
        actions = may_overlap(actions, stat, ranges)  # in Arrow: only candidates become Python dicts
    bounds = key_bounds(actions, [info.physical(c) if c in info.schema.names else None for c in bounds_of]) \
        if bounds_of else [None] * actions.num_rows
    actions = actions.to_pylist()
    files = []
    for a, b in zip(actions, bounds):
        rng = stats_interval(a.get(f"min.{stat}"), a.get(f"max.{stat}")) if event_time else None
        all_null = event_time and a.get("num_records") is not None and \
            a.get(f"null_count.{stat}") == a.get("num_records")
        if rng is None and all_null and not keep_null_files:
            continue  # all event times null: no window can use these rows
        if ranges is not None and rng is not None and not any(rng.overlaps(r) for r in ranges):
            continue
        pv = tuple(sorted((k[len("partition."):], partition_text(v)) for k, v in a.items()
                          if k.startswith("partition.")))  # the log's strings, as a commit's files have them
        path = unquote(a["path"])
        uri = path if "://" in path or path.startswith("/") else f"{info.uri}/{path}"
        nulls = a.get(f"null_count.{stat}") if event_time else None
        files.append(DataFile(uri=uri, rows=a.get("num_records"), size=int(a.get("size_bytes") or 0),
                              partition_values=pv, time_range=rng,
                              time_nulls=int(nulls) if nulls is not None else None,
                              deleted=deleted.get(_normal(uri)), bounds=b))
    return files


def _appended_files(info: TableInfo, event_time: str | None, within: Iterable[Interval] | None,
                    keep_null_files: bool) -> list[DataFile]:
    """`snapshot_files` of the files a derived snapshot's appended commits added, from their add actions (as a
    commit's files are read, `log._file`), pruned as `snapshot_files` prunes: no key bounds (a refill of some
    keys reads them, `KeyProbe.may_hold`), no deletion vector (an appended commit adds none)."""
    return _action_files(info, [action for _version, action in info.appended], event_time, within, keep_null_files)


def _action_files(info: TableInfo, actions: Iterable[dict], event_time: str | None, within: Iterable[Interval] | None,
                  keep_null_files: bool, *, bounds_of: Iterable[str] = ()) -> list[DataFile]:
    """`snapshot_files` of add actions as the log writes them (a derived snapshot's appended commits, a replayed
    snapshot's live files): see `_appended_files`. `bounds_of`: as `snapshot_files`, from the JSON statistics."""
    bounds_of = tuple(bounds_of)
    if event_time is not None and not temporal(info.schema, event_time):
        event_time = None
    stat = info.physical(event_time)
    ranges = list(within) if within is not None else None
    names = dict(info.name_pairs)
    files = []
    for action in actions:
        f = action_file(info.uri, action, stat, names=names)
        if event_time and f.rows is not None and f.time_nulls == f.rows:  # all event times null
            if not keep_null_files:
                continue
            f = replace(f, time_range=None)
        rng = f.time_range if event_time else None
        if ranges is not None and rng is not None and not any(rng.overlaps(r) for r in ranges):
            continue
        files.append(replace(f, bounds=_json_bounds(info, action, bounds_of)) if bounds_of else f)
    return files


def _json_bounds(info: TableInfo, action: dict, columns: tuple[str, ...]) -> tuple:
    """`file_ranges.key_bounds` of one add action from its JSON statistics: (min, max) of each of `columns`
    (logical names) that is an integer or string column, (None, None) where the file has none or the column
    is of another type (their values compare otherwise in Python and Parquet)."""
    try:
        stats = json.loads(action.get("stats") or "{}")
    except ValueError:
        stats = {}
    low, high = (stats.get("minValues") or {}), (stats.get("maxValues") or {})
    out: list[tuple[object, object]] = []
    for column in columns:
        typ = info.schema.field(column).type if column in info.schema.names else None
        kind = int if typ is not None and pa.types.is_integer(typ) else \
            str if typ is not None and (pa.types.is_string(typ) or pa.types.is_large_string(typ)) else None
        name = info.physical(column)
        lo, hi = low.get(name), high.get(name)
        if kind is None or not (type(lo) is kind and type(hi) is kind):  # noqa: E721  (bool is not an int here)
            out.append((None, None))
        else:
            out.append((lo, hi))
    return tuple(out)


def _normal(uri: str) -> str:
    """A file URI compared across `deltalake` (file:///x) and the log (/x, relative paths joined)."""
    local = storage.local_path(uri)
    return os.path.abspath(local) if local is not None else storage.normalized(uri)


def read_in_driver(info: TableInfo, files: list[DataFile], *, max_bytes: int) -> pa.Table | None:
    """The rows of `files` read by the driver (pyarrow, no Spark job) in the table's schema, for a few small
    files; None when Spark must read them: more than `max_bytes` of files, deletion vectors, column mapping,
    partition columns, or a file Arrow cannot read in the table's schema (e.g. INT96 times). Local files and
    object-store files alike (pyarrow's filesystem)."""
    if (sum(f.size for f in files) > max_bytes or any(f.needs_row_positions for f in files)
            or info.column_mapping != "none" or info.partition_columns):
        return None
    if not files:
        return info.schema.empty_table()
    fmt = ds.ParquetFileFormat()
    try:  # missing columns (added to the table later) come back as nulls, as Spark reads them
        if all(storage.is_object_store(f.uri) for f in files):
            # each small file whole, in one GET (side by side): pyarrow reading it from the store asks for its
            # footer first and then its columns (two GETs, and a HEAD where the size is not given)
            found = storage.read_many([f.uri for f in files])
            if any(data is None for data in found):
                return None  # a file gone: Spark reads them, and says which
            fragments = [fmt.make_fragment(pa.BufferReader(data)) for data in found]
            return ds.FileSystemDataset(fragments, schema=info.schema, format=fmt).to_table()
        fs, _ = storage.filesystem(files[0].uri)
        located = [pafs.FileInfo(storage.filesystem(f.uri)[1], size=f.size) if f.size > 0
                   else storage.filesystem(f.uri)[1] for f in files]
        return ds.dataset(located, schema=info.schema, format=fmt, filesystem=fs).to_table()
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None
