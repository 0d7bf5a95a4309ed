"""Event-time ranges of data files, from Delta statistics and Parquet footers (no data is read).

Statistics in the log may be truncated to milliseconds, so ranges are widened by 1 ms; a file
whose event times are all null touches no window (an empty range at the epoch).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.fs  # noqa: F401  (pa.fs)
import pyarrow.parquet as pq

from laminar_assets import storage

from ..windows import Interval, closed_range, to_utc


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
    return closed_range(lo_t, hi_t + timedelta(milliseconds=1))


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
    if lo is None:
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
