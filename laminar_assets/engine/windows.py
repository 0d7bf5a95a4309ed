"""Window, partition and interval math. Time is UTC; every interval is [start, end).

This module is the only place that knows how event times map to windows and
windows to Dagster-style partitions. Everything except `window_columns` is a
pure function of its arguments.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pyspark is imported where a Spark column is built, never when the module loads
    from pyspark.sql import Column

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_DURATION_RE = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d|seconds?|minutes?|hours?|days?)\s*$", re.I)
_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1), "second": timedelta(seconds=1), "seconds": timedelta(seconds=1),
    "m": timedelta(minutes=1), "min": timedelta(minutes=1),
    "minute": timedelta(minutes=1), "minutes": timedelta(minutes=1),
    "h": timedelta(hours=1), "hour": timedelta(hours=1), "hours": timedelta(hours=1),
    "d": timedelta(days=1), "day": timedelta(days=1), "days": timedelta(days=1),
}


def parse_duration(value: str | timedelta) -> timedelta:
    """Parse '1m', '15 minutes', '1h', '1d' (or pass a timedelta through); a ValueError for anything else,
    a duration too long to represent included."""
    if isinstance(value, timedelta):
        return value
    match = _DURATION_RE.match(value) if isinstance(value, str) else None
    if not match:
        raise ValueError(f"expected a duration like '1m', '15 minutes', '1h' or '1d', found {value!r}")
    try:
        return int(match.group(1)) * _UNITS[match.group(2).lower()]
    except OverflowError:
        raise ValueError(f"expected a duration of at most {timedelta.max.days} days, found {value!r}") from None


_NAMED_UNITS = (("day", timedelta(days=1)), ("hour", timedelta(hours=1)), ("minute", timedelta(minutes=1)),
                ("second", timedelta(seconds=1)), ("millisecond", timedelta(milliseconds=1)))


def describe_duration(value: timedelta) -> str:
    """A duration for a message, in the largest unit it is a whole number of: '1 day', '2 hours', '90 minutes'
    (what a user writes in a setting; Python's own text, '1 day, 0:00:00', reads like a clock time)."""
    for name, unit in _NAMED_UNITS:
        if value and not value % unit:
            count = value // unit
            return f"{count} {name}{'' if abs(count) == 1 else 's'}"
    micros = _micros(value)
    return f"{micros} microsecond{'' if abs(micros) == 1 else 's'}"


def to_utc(value: datetime) -> datetime:
    """Naive datetimes are taken as UTC; aware ones are converted to UTC."""
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def to_micros(value: datetime) -> int:
    delta = to_utc(value) - EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def from_micros(micros: int) -> datetime:
    """The instant `micros` after the epoch; past the last representable instant (the end of a
    window that starts in 9999-12-31) it is that instant, as `later` does."""
    try:
        return EPOCH + timedelta(microseconds=micros)
    except OverflowError:
        if micros > 0:
            return datetime.max.replace(tzinfo=UTC)
        raise


def _micros(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


@dataclass(frozen=True, order=True)
class Interval:
    """A half-open UTC time interval [start, end)."""

    start: datetime
    end: datetime

    def __post_init__(self) -> None:
        object.__setattr__(self, "start", to_utc(self.start))
        object.__setattr__(self, "end", to_utc(self.end))
        if self.end < self.start:
            raise ValueError(f"interval end {self.end} is before start {self.start}")

    def overlaps(self, other: Interval) -> bool:
        return self.start < other.end and other.start < self.end

    def contains(self, ts: datetime) -> bool:
        return self.start <= to_utc(ts) < self.end

    def intersect(self, other: Interval) -> Interval | None:
        start, end = max(self.start, other.start), min(self.end, other.end)
        return Interval(start, end) if start < end else None

    def __str__(self) -> str:
        return f"[{self.start.isoformat()}, {self.end.isoformat()})"


def share_inside(part: Interval | None, rng: Interval) -> float:
    """The share of `part` (e.g. a file's event-time range) inside `rng`: 1 when `part` is unknown
    (None) or a single instant inside it, 0 when they do not overlap."""
    if part is None:
        return 1.0
    inside = part.intersect(rng)
    if inside is None:
        return 1.0 if part.start == part.end and rng.contains(part.start) else 0.0
    span = (part.end - part.start).total_seconds()
    return (inside.end - inside.start).total_seconds() / span if span > 0 else 1.0


def later(t: datetime, delta: timedelta) -> datetime:
    """`t + delta`, or the last representable instant when that passes it (a file whose statistics
    say 9999-12-31 23:59:59.999999 still has a range)."""
    try:
        return to_utc(t) + delta
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC)


def closed_range(lo: datetime, hi: datetime) -> Interval:
    """The smallest [start, end) interval holding the closed range [lo, hi] (stats min/max); its end
    stops at the last representable instant."""
    return Interval(lo, later(hi, timedelta(microseconds=1)))


def coalesce(intervals: Iterable[Interval]) -> tuple[Interval, ...]:
    """Merge overlapping or touching intervals; the result is sorted and disjoint."""
    out: list[Interval] = []
    for iv in sorted(intervals):
        if out and iv.start <= out[-1].end:
            if iv.end > out[-1].end:
                out[-1] = Interval(out[-1].start, iv.end)
        else:
            out.append(iv)
    return tuple(out)


# --- windows ---------------------------------------------------------------


@dataclass(frozen=True)
class WindowShape:
    """Tumbling (slide == size) or hopping (slide divides size) windows aligned to the epoch."""

    size: timedelta
    slide: timedelta

    @property
    def is_hopping(self) -> bool:
        return self.slide != self.size

    @property
    def copies(self) -> int:
        """How many windows contain one event time."""
        return _micros(self.size) // _micros(self.slide)

    def windows_of(self, ts: datetime) -> list[Interval]:
        """Every window containing `ts`, earliest first."""
        us, size, slide = to_micros(ts), _micros(self.size), _micros(self.slide)
        last = us - (us % slide)
        starts = [last - i * slide for i in range(self.copies)]
        return [Interval(from_micros(s), from_micros(s + size)) for s in sorted(starts)]

    def starts_overlapping(self, events: Interval) -> Interval | None:
        """The range of window starts whose window overlaps `events` (as [first, last + slide))."""
        size, slide = _micros(self.size), _micros(self.slide)
        lo, hi = to_micros(events.start), to_micros(events.end)  # events are [lo, hi)
        if hi <= lo:
            return None
        first = (lo - size) - ((lo - size) % slide) + slide  # smallest start with start + size > lo
        if first + size <= lo:
            first += slide
        last = (hi - 1) - ((hi - 1) % slide)  # largest start <= hi - 1
        if last < first:
            return None
        return Interval(from_micros(first), from_micros(last + slide))

    def events_of_starts(self, starts: Interval) -> Interval:
        """The event-time range covered by windows whose start lies in `starts`."""
        return Interval(starts.start, later(starts.end - self.slide, self.size))


def window_columns(ts_col: str, shape: WindowShape) -> tuple[list[str], list[tuple[str, str]]]:
    """Spark SQL that assigns events (timestamp column `ts_col`) to windows: the expressions of a
    first step (hopping windows: `__copy`, one row per window holding the event, by `posexplode`;
    none for tumbling ones) and the columns a second step adds: `window_start`, `window_end` and
    `__primary`, which marks exactly one copy (the latest window) so input rows are counted once."""
    # Microsecond arithmetic in 64 bits: a 15-minute slide times 3 copies overflows an int.
    size, slide = f"{_micros(shape.size)}L", f"{_micros(shape.slide)}L"
    us = f"unix_micros({_ident(ts_col)})"
    last = f"({us} - pmod({us}, {slide}))"
    if shape.copies == 1:
        return [], [("__primary", "true"), ("window_start", f"timestamp_micros({last})"),
                    ("window_end", f"timestamp_micros({last} + {size})")]
    ws = f"({last} - CAST(__copy AS BIGINT) * {slide})"
    return ([f"posexplode(sequence(0, {shape.copies - 1})) AS (__copy, __copy_v)"],
            [("__primary", f"{ws} = {last}"), ("window_start", f"timestamp_micros({ws})"),
             ("window_end", f"timestamp_micros({ws} + {size})")])


# --- partitions ------------------------------------------------------------


class Granularity(str, Enum):
    """Dagster-style time partitioning of a flow."""

    HOURLY = "hourly"
    DAILY = "daily"

    @property
    def step(self) -> timedelta:
        return timedelta(hours=1) if self is Granularity.HOURLY else timedelta(days=1)

    @property
    def article(self) -> str:
        """'an hourly' or 'a daily', for messages."""
        return "an hourly" if self is Granularity.HOURLY else "a daily"

    @property
    def key_format(self) -> str:
        # The same formats Dagster uses for HourlyPartitionsDefinition / DailyPartitionsDefinition.
        return "%Y-%m-%d-%H:%M" if self is Granularity.HOURLY else "%Y-%m-%d"


def partition_key(ts: datetime, granularity: Granularity) -> str:
    """The key of the partition containing `ts`."""
    step = _micros(granularity.step)
    us = to_micros(ts)
    return from_micros(us - us % step).strftime(granularity.key_format)


# The partitions Laminar names and computes. Keys have four-digit years: fixed width, so their text
# order is their time order (as Dagster's keys). The last partition ends a day before the last instant
# a datetime or a Spark timestamp holds, which leaves room for the arithmetic around a partition's
# windows (a window's end, a file range's end + 1 microsecond).
PARTITION_SPAN = Interval(datetime(1000, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC))


def partition_interval(key: str, granularity: Granularity) -> Interval:
    """The [start, end) interval of a partition key. Raises ValueError, saying what was expected, for
    a key that is malformed, not the start of a partition (an hourly key ending in ':30') or not
    inside `PARTITION_SPAN`."""
    try:
        start = datetime.strptime(key, granularity.key_format).replace(tzinfo=UTC)
    except ValueError as exc:
        example = datetime(2024, 1, 31, 13).strftime(granularity.key_format)
        raise ValueError(f"expected {granularity.article} partition key like '{example}', found {key!r}") from exc
    if not PARTITION_SPAN.start <= start < PARTITION_SPAN.end:  # before `+ step`: it may overflow
        first, last = (partition_key(t, granularity) for t in (PARTITION_SPAN.start, PARTITION_SPAN.end - granularity.step))
        raise ValueError(f"expected {granularity.article} partition from {first} to {last}, found {key!r}")
    written = partition_key(start, granularity)
    if written != key:  # strptime also takes '16:30', '2024-1-2'
        what = "the start of an hour" if granularity is Granularity.HOURLY else "a date"
        raise ValueError(f"expected {granularity.article} partition key ({what}, like {written!r}), found {key!r}")
    return Interval(start, start + granularity.step)


def check_partition(key: str, granularity: Granularity, reach: timedelta = timedelta(0)) -> Interval:
    """`partition_interval`, also refusing a partition whose windows, reaching `reach` beyond it on
    either side (a flow's window size), pass the first or last instant a timestamp holds."""
    part = partition_interval(key, granularity)
    try:  # + an hour: room for the arithmetic on a window's end (a file range's end + 1 microsecond)
        part.start - reach - timedelta(hours=1)
        part.end + reach + timedelta(hours=1)
    except OverflowError:
        raise ValueError(f"partition {key!r} is too close to the first or last representable time for windows "
                         f"reaching {describe_duration(reach)} beyond their partition") from None
    return part


def partition_span(first: datetime | None, until: datetime, granularity: Granularity) -> Interval:
    """The partitions from the one starting at `first` (None: the first of `PARTITION_SPAN`) to the one
    holding `until`, as [start of the first, end of the last), inside `PARTITION_SPAN`."""
    lo = max(to_utc(first), PARTITION_SPAN.start) if first is not None else PARTITION_SPAN.start
    hi = min(to_utc(until), PARTITION_SPAN.end - granularity.step)
    if hi < lo:
        return Interval(lo, lo)
    return Interval(partition_interval(partition_key(lo, granularity), granularity).start,
                    partition_interval(partition_key(hi, granularity), granularity).end)


def partitions_overlapping(events: Interval, granularity: Granularity, *, limit: int | None = None) -> list[str]:
    """Keys of every partition overlapping `events` (the first `limit` of them), in time order. One key
    per partition: callers bound `events` (e.g. to a `partition_span`) or `limit` when a range comes
    from data."""
    step = _micros(granularity.step)
    first = to_micros(events.start) - to_micros(events.start) % step
    keys: list[str] = []
    cursor = first
    end = to_micros(events.end)
    while cursor < end and (limit is None or len(keys) < limit):
        keys.append(from_micros(cursor).strftime(granularity.key_format))
        cursor += step
    return keys


def pieces_by_partition(ranges, granularity: Granularity, *, limit: int) -> dict[int, tuple[int, int]] | None:
    """Each partition's piece of `ranges` as [start, end) microseconds, by partition number (see
    `partition_id`); None when a partition holds two disjoint pieces or more than `limit` hold one."""
    step = _micros(granularity.step)
    out: dict[int, tuple[int, int]] = {}
    for iv in coalesce(ranges):  # disjoint: two pieces in one partition come from two intervals
        lo, hi = to_micros(iv.start), to_micros(iv.end)
        while lo < hi:
            pid = lo // step
            end = min(hi, (pid + 1) * step)
            if pid in out or len(out) >= limit:
                return None
            out[pid] = (lo, end)
            lo = end
    return out


def partition_id(key: str, granularity: Granularity) -> int:
    """A partition's number: whole steps (hours or days) since the epoch."""
    return to_micros(partition_interval(key, granularity).start) // _micros(granularity.step)


def partition_id_column(col: str, granularity: Granularity):
    """Spark column: the number (`partition_id`) of the partition holding timestamp column `col`."""
    from pyspark.sql import functions as F

    return F.expr(partition_id_sql(col, granularity))


def partition_id_sql(col: str, granularity: Granularity) -> str:
    """`partition_id_column` as Spark SQL text."""
    return partition_id_of_sql(_ident(col), granularity)


def partition_id_of_sql(timestamp_sql: str, granularity: Granularity) -> str:
    """`partition_id_sql` of a timestamp-valued SQL expression instead of a column."""
    return f"CAST(floor(unix_micros({timestamp_sql}) / {_micros(granularity.step)}) AS BIGINT)"


def partition_key_column(col: str, granularity: Granularity):
    """Spark column: the key (as `partition_key` formats it) of the partition holding timestamp `col`."""
    from pyspark.sql import functions as F

    pattern = "yyyy-MM-dd-HH:'00'" if granularity is Granularity.HOURLY else "yyyy-MM-dd"
    return F.date_format(F.col(col), pattern)


def in_ranges(col: str, ranges) -> Column:
    """Spark condition: timestamp column `col` lies in one of the [start, end) `ranges`."""
    from pyspark.sql import functions as F

    # One SQL text, not a tree of Column objects: with local Spark every Column operation is a
    # Py4J round trip, and a run's range lists run to hundreds of ranges.
    return F.expr(in_ranges_sql(col, ranges))


def in_ranges_sql(col: str, ranges) -> str:
    """`in_ranges` as Spark SQL text (`false` for no ranges)."""
    c = _ident(col)
    terms = [f"({c} >= {sql_timestamp(r.start)} AND {c} < {sql_timestamp(r.end)})" for r in coalesce(ranges)]
    return "(" + " OR ".join(terms) + ")" if terms else "false"


def sql_timestamp(t: datetime) -> str:
    """A Spark SQL TIMESTAMP literal of the UTC instant `t`, to the microsecond."""
    return f"TIMESTAMP'{to_utc(t).replace(tzinfo=None).isoformat(sep=' ', timespec='microseconds')}+00:00'"


def _ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def divides(part: timedelta, whole: timedelta) -> bool:
    return _micros(part) > 0 and _micros(whole) % _micros(part) == 0
