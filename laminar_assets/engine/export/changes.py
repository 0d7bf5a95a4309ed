"""What an export reads of its source's Delta table: the table pinned at one version, whether its change feed
still covers a range of versions, the net change per key over that range, and the rows of the pinned snapshot.

Every table Laminar writes has its change data feed on. A commit with change data says what each row did; any
other commit's added and removed files are its inserts and deletes (a flow's sink replaces whole files): the
`deltalake` change-feed reader (`DeltaTable.load_cdf`, Rust, no Python file objects) gives both as rows with
`_change_type` and `_commit_version`. Rows stay Arrow from the reader to the target: batches streamed, the
range's changes held as one Arrow table while they are collapsed per key, never as Python objects.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from deltalake import DeltaTable

from laminar_assets import storage
from laminar_assets.errors import ExportError

from ..delta.arrow_reads import arrow_dataset
from ..delta.log import CommitKind, commit_summary, entry_path, file_exists
from ..delta.tables import is_delta_table, open_delta
from ..windows import Interval
from .protocol import Reason

CHANGE_TYPE, COMMIT_VERSION = "_change_type", "_commit_version"
_ORDER = "__laminar_order"  # (version, 0 for a row's old state, 1 for its new one): the order of a key's changes
_ROW = "__laminar_row"
NEW_STATES = ("insert", "update_postimage")


@dataclass(frozen=True)
class Pinned:
    """A source table at the version a delivery reads: everything is read from this snapshot."""

    name: str
    uri: str
    version: int
    table_id: str
    table: DeltaTable
    delta_fields: list[dict]
    schema: pa.Schema

    def dataset(self) -> ds.Dataset:
        return arrow_dataset(self.uri, self.table)


def pin(name: str, uri: str) -> Pinned | None:
    """The table at `uri` at its latest version (None when it does not exist yet), with its schema as Arrow
    types a target can take (views and large types made plain)."""
    if not is_delta_table(uri):
        return None
    dt = open_delta(uri)
    fields = json.loads(dt.schema().to_json())["fields"]
    return Pinned(name, uri, dt.version(), str(dt.metadata().id), dt, fields, plain_schema(pa.schema(dt.schema().to_arrow())))


def plain_schema(schema: pa.Schema) -> pa.Schema:
    """`schema` with string/binary views and large variants as plain string/binary (what CSV and clients take)."""
    return pa.schema([pa.field(f.name, _plain(f.type), f.nullable) for f in schema])


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    return t


def feed_gap(pinned: Pinned, since: int) -> tuple[Reason, str] | None:
    """Why the change feed of (since, pinned.version] cannot be read as the changes of that range, or None when
    it can: a commit's log entry cleaned up, a file it names vacuumed (CHANGE_FEED_EXPIRED), a commit deleting
    rows through deletion vectors (CHANGE_FEED_UNREADABLE), or a schema that changed (SCHEMA_CHANGED)."""
    schema_set = False
    versions = range(since + 1, pinned.version + 1)
    entries: dict[int, bytes | None] = {}
    if storage.is_object_store(pinned.uri):  # the entries side by side (a local log's are cached)
        entries = dict(zip(versions, storage.read_many([entry_path(pinned.uri, v) for v in versions])))
    for version in versions:
        commit = None if version in entries and entries[version] is None else \
            commit_summary(pinned.name, pinned.uri, version, None, entry=entries.get(version))
        if commit is None:
            return Reason.CHANGE_FEED_EXPIRED, (f"commit {version} of '{pinned.name}' is no longer in its Delta log (log "
                                                f"clean-up), so its changes since version {since} are unknown")
        if commit.kind is CommitKind.DELETION_VECTORS:
            return Reason.CHANGE_FEED_UNREADABLE, (f"commit {version} of '{pinned.name}' deleted rows through deletion "
                                                   "vectors, whose rows the change feed reader does not give")
        files = commit.cdc if commit.kind is CommitKind.CHANGE_DATA else (*commit.adds, *commit.removes)
        gone = next((f.uri for f in files if not file_exists(f.uri)), None)
        if gone is not None:
            return Reason.CHANGE_FEED_EXPIRED, (f"commit {version} of '{pinned.name}' names a file that was vacuumed "
                                                f"({gone}), so its changes are unknown")
        schema_set = schema_set or commit.schema is not None
    if schema_set and json.loads(open_delta(pinned.uri, since).schema().to_json())["fields"] != pinned.delta_fields:
        return Reason.SCHEMA_CHANGED, f"the schema of '{pinned.name}' changed since version {since}"
    return None


def change_rows(pinned: Pinned, since: int) -> pa.Table:
    """Every change row of (since, pinned.version]: the table's columns, `_change_type` and `_commit_version`."""
    reader = pa.RecordBatchReader.from_stream(pinned.table.load_cdf(starting_version=since + 1,
                                                                    ending_version=pinned.version))
    wanted = pa.schema([*pinned.schema, pa.field(CHANGE_TYPE, pa.string()), pa.field(COMMIT_VERSION, pa.int64())])
    out = []
    for batch in reader:
        columns = [batch.column(f.name).cast(f.type) if f.name in batch.schema.names else pa.nulls(batch.num_rows, f.type)
                   for f in wanted]
        out.append(pa.RecordBatch.from_arrays(columns, schema=wanted))
    return pa.Table.from_batches(out, schema=wanted)


@dataclass(frozen=True)
class NetChanges:
    """The net effect of a range of changes per key: `upserts` (the table's columns, one row per key: its last
    new state) and `deletes` (the key columns of keys whose last change removed them and that existed before
    the range). Keys whose old and new rows are equal (a file rewritten with the same rows) are in neither."""

    upserts: pa.Table
    deletes: pa.Table
    change_rows: int


def net_changes(changes: pa.Table, schema: pa.Schema, key: tuple[str, ...]) -> NetChanges:
    """Collapse change rows per key: order a key's changes by version, the old state of a row before its new
    one within a version; the last one says what the key holds after the range (a new state: upsert it; an old
    one: it is gone), the first one what it held before (an old state: it existed)."""
    columns = schema.names
    if changes.num_rows == 0:
        return NetChanges(schema.empty_table(), schema.empty_table().select(list(key)), 0)
    is_new = pc.is_in(changes.column(CHANGE_TYPE), value_set=pa.array(NEW_STATES))
    order = pc.add(pc.multiply(changes.column(COMMIT_VERSION), 2), pc.cast(is_new, pa.int64()))
    table = changes.append_column(_ORDER, order).append_column(_ROW, pa.array(np.arange(changes.num_rows), pa.int64()))
    table = table.sort_by([(_ORDER, "ascending"), (_ROW, "ascending")])
    table = table.set_column(table.schema.get_field_index(_ROW), _ROW, pa.array(np.arange(table.num_rows), pa.int64()))
    ends = table.group_by(list(key), use_threads=False).aggregate([(_ROW, "min"), (_ROW, "max")])
    first = table.take(ends.column(f"{_ROW}_min"))  # rows are numbered in change order: a key's first change
    last = table.take(ends.column(f"{_ROW}_max"))
    existed = pc.invert(pc.is_in(first.column(CHANGE_TYPE), value_set=pa.array(NEW_STATES)))
    ends_new = pc.is_in(last.column(CHANGE_TYPE), value_set=pa.array(NEW_STATES))
    same = _rows_equal(first, last, [c for c in columns if c not in key])
    upsert = pc.and_(ends_new, pc.invert(pc.and_(existed, same)))
    delete = pc.and_(pc.invert(ends_new), existed)
    return NetChanges(last.filter(upsert).select(columns), last.filter(delete).select(list(key)), changes.num_rows)


def net_rows(changes: pa.Table, schema: pa.Schema) -> tuple[pa.Table, pa.Table]:
    """For exports without a key: (rows inserted, rows deleted) by each commit of the range, whole, as multisets
    per commit: a row one commit inserted and deleted the same number of times (a file rewritten with the same
    rows) is in neither; a row one commit inserted and a later one deleted is in both. Netting per commit, not over
    the range, keeps what a delivery sends the same whatever versions it covers: a delivery killed after it sent
    a row's insert, and the next one, which covers the commit that deleted the row too, sends that insert again
    (under the same key) and the deletion, where netting the range sent neither and the receiver kept a row the
    table no longer has. Each row keeps `_commit_version`, the version of the commit that inserted (deleted) it.
    A table with a column that cannot be compared (nested types) cancels nothing: every change row is given."""
    columns = [*schema.names, COMMIT_VERSION]
    if changes.num_rows == 0:
        empty = changes.schema.empty_table().select(columns)
        return empty, empty
    is_new = pc.is_in(changes.column(CHANGE_TYPE), value_set=pa.array(NEW_STATES))
    if not all(_groupable(f.type) for f in schema):
        return changes.filter(is_new).select(columns), changes.filter(pc.invert(is_new)).select(columns)
    table = changes.append_column(_ROW, pa.array(np.arange(changes.num_rows), pa.int64())) \
        .append_column(_ORDER, pc.if_else(is_new, 1, -1))
    groups = table.group_by([*schema.names, COMMIT_VERSION], use_threads=False).aggregate([(_ORDER, "sum"),
                                                                                           (_ROW, "list")])
    net = groups.column(f"{_ORDER}_sum").to_numpy()
    members = groups.column(f"{_ROW}_list").combine_chunks()
    rows = pc.list_flatten(members).to_numpy()  # every change row, by group
    group = pc.list_parent_indices(members).to_numpy()
    new = is_new.to_numpy(zero_copy_only=False)[rows]
    versions = table.column(COMMIT_VERSION).to_numpy()[rows]

    def earliest(mask: np.ndarray, count: np.ndarray) -> pa.Array:
        """Of each group's rows in `mask`, the `count[group]` of the earliest versions, in the feed's order."""
        picked, picked_group = rows[mask], group[mask]
        order = np.lexsort((picked, versions[mask], picked_group))
        picked, picked_group = picked[order], picked_group[order]
        starts = np.flatnonzero(np.r_[True, picked_group[1:] != picked_group[:-1]]) if len(picked) else picked
        rank = np.arange(len(picked)) - np.repeat(starts, np.diff(np.r_[starts, len(picked)]))
        return pa.array(np.sort(picked[rank < count[picked_group]]), pa.int64())

    inserted = earliest(new & (net[group] > 0), net)
    deleted = earliest(~new & (net[group] < 0), -net)
    return table.take(inserted).select(columns), table.take(deleted).select(columns)


def _groupable(t: pa.DataType) -> bool:
    return not (pa.types.is_nested(t) or pa.types.is_dictionary(t))


def _rows_equal(a: pa.Table, b: pa.Table, columns: list[str]) -> pa.Array:
    """Per row, whether `a` and `b` hold equal values in `columns` (two nulls are equal; a column whose type
    cannot be compared counts as different, so the row is written again: never wrong, only more work)."""
    same = pa.array([True] * a.num_rows, pa.bool_())
    for c in columns:
        x, y = a.column(c), b.column(c)
        try:
            eq = pc.equal(x, y)
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid, pa.ArrowTypeError):
            return pa.array([False] * a.num_rows, pa.bool_())
        both_null = pc.and_(pc.is_null(x), pc.is_null(y))
        same = pc.and_(same, pc.or_(pc.fill_null(eq, False), both_null))
    return same


def in_ranges(table: pa.Table, column: str, ranges: tuple[Interval, ...]) -> pa.Array:
    """Per row, whether `column` falls in one of `ranges` ([start, end))."""
    values = table.column(column)
    hit = pa.array([False] * table.num_rows, pa.bool_())
    for r in ranges:
        lo, hi = pa.scalar(r.start, values.type), pa.scalar(r.end, values.type)
        hit = pc.or_(hit, pc.fill_null(pc.and_(pc.greater_equal(values, lo), pc.less(values, hi)), False))
    return hit


def snapshot_batches(pinned: Pinned, batch_rows: int, *, column: str | None = None,
                     ranges: tuple[Interval, ...] = ()) -> Iterator[pa.RecordBatch]:
    """The rows of the pinned snapshot (only those whose `column` lies in `ranges`, when given), streamed in
    batches of at most `batch_rows` rows, in the pinned schema."""
    dataset = pinned.dataset()
    where = None
    if column is not None and ranges:
        field = dataset.schema.field(column)
        for r in ranges:
            part = (ds.field(column) >= pa.scalar(r.start, field.type)) & (ds.field(column) < pa.scalar(r.end, field.type))
            where = part if where is None else where | part
    for batch in dataset.to_batches(filter=where, batch_size=batch_rows):
        if batch.num_rows:
            yield conform(batch, pinned.schema)


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """`batch` in `schema`: its columns in that order and types (a column it lacks, added later, as nulls)."""
    columns = [batch.column(f.name).cast(f.type) if f.name in batch.schema.names else pa.nulls(batch.num_rows, f.type)
               for f in schema]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def check_key(export_name: str, pinned: Pinned, key: tuple[str, ...]) -> None:
    """Refuse (before anything is read or written) a key whose columns the table does not have."""
    missing = [k for k in key if k not in pinned.schema.names]
    if missing:
        raise ExportError(f"export '{export_name}': its key column(s) {missing} are not columns of '{pinned.name}' at "
                          f"version {pinned.version} ({', '.join(pinned.schema.names)})", export=export_name,
                          table=pinned.name)
