"""The Arrow side of the Redis target: a sink's rows as Redis keys and hash fields, and the latest row per key.

A Redis key is one per value of the source's key columns (a flow's group keys, a stage's dedup key):
`<key_prefix>:<value>[:<value>...]`, each value as text with `\\` and `:` escaped by a backslash (a NULL as `\\N`),
so keys of two values can never be read as another pair. Its hash holds the row of that key with the latest time
(a flow's latest window, a stage's latest event time): one field per column that is not NULL, as text
(`text`), plus `_laminar_version`. Everything here is vectorized Arrow; rows become Python values only as
the arguments of one batch's script.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from laminar_assets.errors import ExportError

KEY = "__laminar_key"  # the Redis key of a row
TIME = "__laminar_time"  # its time as an integer (microseconds of a timestamp, days of a date), what scripts compare
_ROW = "__laminar_row"
VERSION_FIELD = "_laminar_version"
NULL_PART = "\\N"


def text(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """`column`'s values as Redis stores them, NULL kept: timestamps in ISO 8601 with microseconds (UTC, with a Z,
    when the column has a zone), dates 2024-01-02, numbers as Arrow writes them (the shortest text that reads back
    the same: 10, 1.5, 1e+20, nan, inf; decimals with their scale), booleans true/false, strings as they are, binary
    as bytes, arrays, maps and structs as JSON."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    t = column.type
    if pa.types.is_timestamp(t):
        if t.tz is not None:
            return pc.strftime(column.cast(pa.timestamp("us", "UTC")), format="%Y-%m-%dT%H:%M:%SZ")
        return pc.strftime(column.cast(pa.timestamp("us")), format="%Y-%m-%dT%H:%M:%S")
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return column.cast(pa.string())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t) or pa.types.is_fixed_size_binary(t):
        return column.cast(pa.binary())
    if pa.types.is_nested(t):
        return pa.array([None if v is None else json.dumps(v, default=str, sort_keys=True) for v in column.to_pylist()],
                        pa.string())
    return column.cast(pa.string())


def key_names(table: pa.Table, prefix: str, group: tuple[str, ...]) -> pa.Array:
    """The Redis key of each row of `table`: the prefix, then each of `group`'s values escaped, joined by `:`."""
    parts = [pa.array([prefix] * table.num_rows, pa.string())]
    for column in group:
        value = text(table.column(column))
        if pa.types.is_binary(value.type):  # a binary key value: its hex digits
            value = pa.array([None if v is None else v.hex() for v in value.to_pylist()], pa.string())
        value = pc.replace_substring(pc.replace_substring(value, "\\", "\\\\"), ":", "\\:")
        parts.append(pc.fill_null(value, NULL_PART))
    if len(parts) == 1:
        return parts[0]
    return pc.binary_join_element_wise(*parts, ":")


def part_count(suffix: str) -> int:
    """How many values a key's text after `<prefix>:` holds (colons not escaped, plus one)."""
    return 1 + sum(1 for m in re.finditer(r"\\.|:", suffix) if m.group() == ":")


def time_numbers(column: pa.ChunkedArray | pa.Array, where: str) -> pa.Array:
    """`column` (a row's time: timestamp, date or integer) as int64 numbers that order like it."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    t = column.type
    if pa.types.is_timestamp(t):
        return pc.cast(column, pa.timestamp("us", t.tz), safe=False).cast(pa.int64())
    if pa.types.is_date(t):
        return column.cast(pa.date32()).cast(pa.int32()).cast(pa.int64())
    if pa.types.is_integer(t):
        return column.cast(pa.int64())
    raise ExportError(f"{where}: its time column has type {t}, expected a timestamp, date or integer", export=where)


def keyed(table: pa.Table, prefix: str, group: tuple[str, ...], time: str, where: str) -> pa.Table:
    """`table` with its Redis key and its time as a number appended (`KEY`, `TIME`)."""
    return table.append_column(KEY, key_names(table, prefix, group)).append_column(TIME, time_numbers(table.column(time),
                                                                                                      where))


def latest(table: pa.Table) -> pa.Table:
    """One row per `KEY` of a `keyed` table: the one of the latest `TIME` (the last read, on a tie)."""
    if table.num_rows <= 1:
        return table
    numbered = table.append_column(_ROW, pa.array(np.arange(table.num_rows), pa.int64()))
    ordered = numbered.sort_by([(TIME, "ascending"), (_ROW, "ascending")])
    ordered = ordered.set_column(ordered.schema.get_field_index(_ROW), _ROW,
                                 pa.array(np.arange(ordered.num_rows), pa.int64()))
    last = ordered.group_by(KEY, use_threads=False).aggregate([(_ROW, "max")]).column(f"{_ROW}_max")
    return ordered.take(last).drop_columns([_ROW])


def fields(table: pa.Table, columns: list[str]) -> list[list]:
    """Per row of `table`: [name, value, name, value, ...] of its columns that are not NULL."""
    texts = [(c, text(table.column(c)).to_pylist()) for c in columns]
    out = []
    for i in range(table.num_rows):
        row: list = []
        for name, values in texts:
            if values[i] is not None:
                row += (name, values[i])
        out.append(row)
    return out


def affected(tables: list[pa.Table], deletes: pa.Table | None, prefix: str, group: tuple[str, ...], time: str,
             where: str) -> pa.Table:
    """The keys a delivery touches: `KEY`, the key columns, and `TIME` = the latest time of a row it upserts (that
    row is in the table at the delivered version, so the key's latest row is at least as late), NULL for a key
    that was only deleted (its surviving row, if any, may be of any time)."""
    parts = []
    for t in tables:
        if t.num_rows:
            parts.append(keyed(t.select([*group, time]), prefix, group, time, where).drop_columns([time]))
    if deletes is not None and deletes.num_rows:
        d = deletes.select(list(group))
        parts.append(d.append_column(KEY, key_names(d, prefix, group)).append_column(TIME, pa.nulls(d.num_rows, pa.int64())))
    if not parts:
        return pa.table({KEY: pa.array([], pa.string()), TIME: pa.array([], pa.int64())})
    both = pa.concat_tables(parts, promote_options="permissive")
    out = both.group_by([KEY, *group], use_threads=False).aggregate([(TIME, "max")])  # a key's values are its KEY's
    return out.rename_columns([TIME if n == f"{TIME}_max" else n for n in out.column_names]).sort_by(KEY)


def rows_of_keys(dataset: ds.Dataset, schema: pa.Schema, keys: pa.Table, prefix: str, group: tuple[str, ...], time: str,
                 where: str, batch_rows: int) -> pa.Table:
    """The latest row of each key of `keys` in `dataset` (the table at the delivered version), read with a filter:
    the key columns' values, and, when every key has a row upserted (`TIME` set), rows no earlier than the
    earliest of those times (the files of older windows are skipped by their statistics)."""
    wanted = keys.column(KEY)
    condition = None
    for column in group:
        values = pc.unique(keys.column(column))
        # a string or binary column is compared as its plain type: files written by deltalake's update and delete
        # hold string_view, which pyarrow's filter pushdown cannot compare with the dataset's string
        field = ds.field(column)
        if pa.types.is_string(values.type) or pa.types.is_binary(values.type):
            field = field.cast(values.type)
        part = field.isin(values.drop_null())
        if values.null_count:
            part = part | ds.field(column).is_null()
        condition = part if condition is None else condition & part
    bounds = keys.column(TIME)
    if keys.num_rows and bounds.null_count == 0:
        since = pa.scalar(pc.min(bounds).as_py(), pa.int64())
        lowest = _time_scalar(since, dataset.schema.field(time).type)
        part = ds.field(time) >= lowest
        condition = part if condition is None else condition & part
    found = None
    for batch in dataset.to_batches(filter=condition, batch_size=max(batch_rows, 1024)):
        if not batch.num_rows:
            continue
        rows = keyed(_conform(pa.Table.from_batches([batch]), schema), prefix, group, time, where)
        rows = rows.filter(pc.is_in(rows.column(KEY), value_set=wanted))
        found = latest(rows if found is None else pa.concat_tables([found, rows]))
    if found is None:
        return keyed(schema.empty_table(), prefix, group, time, where)
    return found


def _time_scalar(number: pa.Scalar, t: pa.DataType) -> pa.Scalar:
    if pa.types.is_timestamp(t):
        return pa.scalar(number.as_py(), pa.int64()).cast(pa.timestamp("us", t.tz)).cast(t)
    if pa.types.is_date(t):
        return pa.scalar(number.as_py(), pa.int32()).cast(pa.date32()).cast(t)
    return number.cast(t)


def _conform(table: pa.Table, schema: pa.Schema) -> pa.Table:
    columns = [table.column(f.name).cast(f.type) if f.name in table.schema.names else pa.nulls(table.num_rows, f.type)
               for f in schema]
    return pa.Table.from_arrays(columns, schema=schema)


def chunks(table: pa.Table, rows: int) -> Iterator[pa.Table]:
    for start in range(0, table.num_rows, rows):
        yield table.slice(start, rows)
