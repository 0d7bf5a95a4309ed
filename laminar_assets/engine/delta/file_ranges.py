"""Event-time ranges of data files, from Delta statistics and Parquet footers (no data is read).

Statistics in the log may be truncated to milliseconds, so ranges are widened by 1 ms; a file
whose event times are all null touches no window (an empty range at the epoch).
"""

from __future__ import annotations

import json
from bisect import bisect_left
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.fs  # noqa: F401  (pa.fs)
import pyarrow.parquet as pq

from laminar_assets import storage

from ..windows import Interval, closed_range, later, to_utc


def _parse_stat_time(value) -> datetime | None:
    if value is None:
        return None
    if isinstance(value, datetime):
        return to_utc(value)
    try:
        return to_utc(datetime.fromisoformat(str(value).replace("Z", "+00:00")))
    except ValueError:
        try:  # a date column
            return datetime.fromisoformat(str(value)).replace(tzinfo=UTC)
        except ValueError:
            return None


def stats_interval(lo, hi) -> Interval | None:
    """The interval of a file's min/max statistics. JSON statistics may be truncated to
    milliseconds, so the max is widened by 1 ms."""
    lo_t, hi_t = _parse_stat_time(lo), _parse_stat_time(hi)
    if lo_t is None or hi_t is None:
        return None
    return closed_range(lo_t, later(hi_t, timedelta(milliseconds=1)))


def range_from_stats(stats_json: str | None, column: str) -> tuple[Interval | None, int | None]:
    if not stats_json:
        return None, None
    try:
        stats = json.loads(stats_json)
    except ValueError:
        return None, None
    rows = stats.get("numRecords")
    rng = stats_interval((stats.get("minValues") or {}).get(column), (stats.get("maxValues") or {}).get(column))
    if rng is None and rows is not None and (stats.get("nullCount") or {}).get(column) == rows:
        # every event time is null: the file touches no window
        return Interval(datetime(1970, 1, 1, tzinfo=UTC), datetime(1970, 1, 1, tzinfo=UTC)), rows
    return rng, rows


def footer_facts(uri: str, column: str) -> tuple[Interval | None, int | None, int | None]:
    """(event-time range, rows, null event times) from a Parquet footer's row-group statistics;
    reads no data pages. For files whose log entry has no statistics (change data files)."""
    try:
        fs, path = storage.filesystem(uri)
        with fs.open_input_file(path) as fh:
            meta = pq.read_metadata(fh)
    except (OSError, pa.ArrowInvalid):
        return None, None, None
    # by path: `schema.names` lists leaf names, so a nested field `meta.ts` would also match `ts`
    idx = next((i for i in range(len(meta.schema)) if meta.schema.column(i).path == column), None)
    if idx is None:
        return None, meta.num_rows, None
    lo = hi = None
    nulls: int | None = 0
    for i in range(meta.num_row_groups):
        stats = meta.row_group(i).column(idx).statistics
        if nulls is not None:
            nulls = nulls + stats.null_count if stats is not None and stats.has_null_count else None
        if stats is None or not stats.has_min_max:
            if meta.row_group(i).num_rows and (stats is None or stats.null_count != meta.row_group(i).num_rows):
                return None, meta.num_rows, None
            continue
        a, b = _parse_stat_time(stats.min), _parse_stat_time(stats.max)
        if a is None or b is None:
            return None, meta.num_rows, None
        lo = a if lo is None else min(lo, a)
        hi = b if hi is None else max(hi, b)
    if lo is None or hi is None:  # set together: no row group had a min and max
        epoch = datetime(1970, 1, 1, tzinfo=UTC)
        return Interval(epoch, epoch), meta.num_rows, nulls
    return closed_range(lo, hi), meta.num_rows, nulls


def null_count(stats_json: str | None, column: str) -> int | None:
    try:
        value = (json.loads(stats_json or "{}").get("nullCount") or {}).get(column)
    except ValueError:
        return None
    return int(value) if isinstance(value, int) else None


# Wider than any truncation of timestamp statistics (milliseconds), or a whole day for a date (whose
# value stands for the day): the exact check on each kept file decides.
_SLACK = {"timestamp": timedelta(seconds=1), "date": timedelta(days=1)}


def may_overlap(actions: pa.Table, column: str, ranges: list[Interval]) -> pa.Table:
    """The rows of a table's add actions (`get_add_actions(flatten=True)`) whose `column`
    statistics may overlap one of `ranges`, filtered in Arrow: a table with one file per hourly
    partition holds thousands of files after a year, and turning each into a Python dict is what a
    listing would spend its time on. Conservative: files without usable timestamp or date statistics are kept, and
    every kept file is still checked exactly by its caller."""
    lo_name, hi_name = f"min.{column}", f"max.{column}"
    if not ranges or lo_name not in actions.column_names or hi_name not in actions.column_names:
        return actions
    lo, hi = actions[lo_name], actions[hi_name]
    if lo.type != hi.type or not (pa.types.is_timestamp(lo.type) or pa.types.is_date(lo.type)):
        return actions
    keep = pa.compute.or_(pa.compute.is_null(lo), pa.compute.is_null(hi))  # no nulls in this mask
    slack = _SLACK["date" if pa.types.is_date(lo.type) else "timestamp"]
    for r in ranges:
        start, end = _bound(r.start - slack, lo.type), _bound(r.end + slack, lo.type)
        # Kleene logic: `null OR true` is true (a missing statistic keeps the file)
        keep = pa.compute.or_kleene(keep, pa.compute.and_kleene(pa.compute.less(lo, end), pa.compute.greater_equal(hi, start)))
    return actions.filter(keep)


def _bound(t: datetime, typ: pa.DataType) -> pa.Scalar:
    """`t` (UTC) as a scalar comparable with statistics of type `typ` (a naive timestamp is UTC)."""
    if pa.types.is_date(typ):
        return pa.scalar(t.date(), type=typ)
    naive = pa.scalar(t.replace(tzinfo=None), type=pa.timestamp("us"))
    return naive.cast(pa.timestamp(typ.unit, tz=typ.tz), safe=False)


Bounds = tuple[tuple[object, object], ...]  # (min, max) per key column; None where unknown


def key_bounds(actions: pa.Table, columns: list[str | None]) -> list[Bounds]:
    """Per add action (`get_add_actions(flatten=True)` rows), the min/max statistics of `columns`
    (physical names; None: a column the table lacks) that can bound key values: integer and string
    columns only (other types compare differently in Python and Parquet), None where a file has none.
    A truncated string statistic still bounds its values: the Delta protocol has writers shorten a
    maximum only to a larger value (delta-spark appends a tie-breaker, arrow-rs increments)."""
    kinds = []
    for c in columns:
        lo, hi = f"min.{c}", f"max.{c}"
        typ = actions.schema.field(lo).type if c is not None and lo in actions.column_names \
            and hi in actions.column_names else None
        kinds.append("int" if typ is not None and pa.types.is_integer(typ) else
                     "str" if typ is not None and (pa.types.is_string(typ) or pa.types.is_large_string(typ)) else None)
    per_column = []
    for c, kind in zip(columns, kinds):
        if kind is None:
            per_column.append([(None, None)] * actions.num_rows)
            continue
        per_column.append(list(zip(actions[f"min.{c}"].to_pylist(), actions[f"max.{c}"].to_pylist())))
    return [tuple(pair) for pair in zip(*per_column)] if per_column else [() for _ in range(actions.num_rows)]


class KeyProbe:
    """Which files may hold rows of some keys, by their statistics (`DataFile.bounds`, the key columns
    in the order of the values' tuples). Column by column: a file is skipped when one key column's
    (min, max) holds none of the values of that column, the same test as `c1 IN (...) AND c2 IN (...)`,
    so no file holding a row that test accepts is skipped. Conservative: a file without statistics, or
    a column whose statistics are of another type than its values, keeps the file."""

    def __init__(self, values) -> None:
        values = {tuple(v) for v in values}
        self.none = not values
        columns = list(zip(*values))
        self.columns = [sorted(set(c)) if _one_kind(c) else None for c in columns]  # None: not comparable

    def may_hold(self, bounds: Bounds | None) -> bool:
        if bounds is None:
            return True
        if self.none:
            return False  # no keys: no file holds one
        return all(_any_within(values, bound) for values, bound in zip(self.columns, bounds))


def _kind(value) -> str | None:
    if isinstance(value, bool):
        return None
    return "int" if isinstance(value, int) else "str" if isinstance(value, str) else None


def _one_kind(values) -> bool:
    kinds = {_kind(v) for v in values}
    return len(kinds) == 1 and None not in kinds


def _any_within(values: list | None, bound: tuple[object, object]) -> bool:
    """Whether one of the sorted `values` may lie in a column's (min, max); True when that cannot be told."""
    if values is None:
        return True
    kind = _kind(values[0])
    lo, hi = (b if _kind(b) == kind else None for b in bound)
    first = bisect_left(values, lo) if lo is not None else 0
    return first < len(values) and (hi is None or values[first] <= hi)
