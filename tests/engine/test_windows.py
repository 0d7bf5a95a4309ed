"""Window and interval math (pure)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from laminar_assets.engine.windows import (
    Granularity,
    Interval,
    WindowShape,
    check_partition,
    closed_range,
    coalesce,
    describe_duration,
    in_ranges_sql,
    parse_duration,
    partition_id,
    partition_interval,
    partition_key,
    partition_span,
    partitions_overlapping,
    pieces_by_partition,
    sql_timestamp,
    to_micros,
)

T0 = datetime(2024, 1, 1, tzinfo=UTC)
times = st.integers(-10**6, 10**7).map(lambda s: T0 + timedelta(seconds=s, microseconds=s % 997))
shapes = st.sampled_from([
    WindowShape(timedelta(minutes=1), timedelta(minutes=1)),
    WindowShape(timedelta(minutes=10), timedelta(minutes=5)),
    WindowShape(timedelta(hours=1), timedelta(minutes=15)),
])


@pytest.mark.parametrize("text,expected", [
    ("1m", timedelta(minutes=1)), ("15 minutes", timedelta(minutes=15)), ("1h", timedelta(hours=1)),
    ("1d", timedelta(days=1)), ("30s", timedelta(seconds=30)),
])
def test_parse_duration(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("value,text", [
    (timedelta(days=1), "1 day"), (timedelta(hours=2), "2 hours"), (timedelta(minutes=90), "90 minutes"),
    (timedelta(days=400), "400 days"), (timedelta(seconds=1), "1 second"), (timedelta(milliseconds=1500), "1500 milliseconds"),
    (timedelta(microseconds=7), "7 microseconds"), (timedelta(0), "0 microseconds"),
])
def test_a_duration_is_described_in_the_units_a_setting_uses(value, text):
    """Messages said '1 day, 0:00:00' (Python's text of a timedelta) for a future_horizon of '1d'."""
    assert describe_duration(value) == text
    if value and not value % timedelta(seconds=1):
        assert parse_duration(text) == value  # what a message says can be written back as a setting


def test_parse_duration_rejects_garbage():
    with pytest.raises(ValueError, match="expected a duration"):
        parse_duration("soon")


@given(times, shapes)
def test_windows_of_contain_the_time(ts, shape):
    windows = shape.windows_of(ts)
    assert len(windows) == shape.copies
    assert all(w.contains(ts) and w.end - w.start == shape.size for w in windows)


@given(times, times, shapes)
def test_starts_overlapping_matches_brute_force(a, b, shape):
    lo, hi = min(a, b), max(a, b) + timedelta(microseconds=1)
    events = Interval(lo, hi)
    starts = shape.starts_overlapping(events)
    # every window holding an endpoint of the range is inside the computed start range
    for ts in (lo, hi - timedelta(microseconds=1)):
        for w in shape.windows_of(ts):
            assert starts is not None and starts.contains(w.start)
    # and the range is tight: its first and last windows do overlap the events
    first = Interval(starts.start, starts.start + shape.size)
    last = Interval(starts.end - shape.slide, starts.end - shape.slide + shape.size)
    assert first.overlaps(events) and last.overlaps(events)


@given(times)
def test_partition_key_round_trip(ts):
    for g in Granularity:
        key = partition_key(ts, g)
        assert partition_interval(key, g).contains(ts)


def test_partition_keys_use_dagster_formats():
    assert partition_key(T0.replace(hour=13, minute=5), Granularity.HOURLY) == "2024-01-01-13:00"
    assert partition_key(T0.replace(hour=13), Granularity.DAILY) == "2024-01-01"
    with pytest.raises(ValueError, match="hourly partition key like"):
        partition_interval("2024-01-01", Granularity.HOURLY)


def test_partitions_overlapping_and_coalesce():
    rng = Interval(T0.replace(hour=1, minute=30), T0.replace(hour=3))
    assert partitions_overlapping(rng, Granularity.HOURLY) == ["2024-01-01-01:00", "2024-01-01-02:00"]
    merged = coalesce([Interval(T0, T0 + timedelta(hours=1)), Interval(T0 + timedelta(minutes=30), T0 + timedelta(hours=2)),
                       Interval(T0 + timedelta(hours=3), T0 + timedelta(hours=4))])
    assert merged == (Interval(T0, T0 + timedelta(hours=2)), Interval(T0 + timedelta(hours=3), T0 + timedelta(hours=4)))


def test_naive_times_are_utc():
    assert Interval(datetime(2024, 1, 1), datetime(2024, 1, 2)).start.tzinfo == UTC


@given(times, times)
def test_sql_range_text_names_exact_microseconds(a, b):
    lo, hi = sorted((a, b))
    text = in_ranges_sql("ts", [Interval(lo, hi + timedelta(microseconds=1))])
    assert sql_timestamp(lo) in text and text.startswith("((`ts` >= TIMESTAMP'")
    literal = sql_timestamp(lo)[len("TIMESTAMP'"):-len("+00:00'")]
    assert datetime.fromisoformat(literal).replace(tzinfo=UTC) == lo


def test_sql_range_text_edge_cases():
    assert in_ranges_sql("ts", []) == "false"
    assert sql_timestamp(datetime(1, 1, 1)) == "TIMESTAMP'0001-01-01 00:00:00.000000+00:00'"
    # touching ranges merge into one condition; a backquote in a name is escaped
    hour = timedelta(hours=1)
    text = in_ranges_sql("a`b", [Interval(T0, T0 + hour), Interval(T0 + hour, T0 + 2 * hour)])
    assert text.count(">=") == 1 and "`a``b`" in text


interval_lists = st.lists(st.tuples(times, st.integers(0, 3 * 86400 * 10**6)), max_size=6).map(
    lambda xs: [Interval(a, a + timedelta(microseconds=d)) for a, d in xs])


@given(interval_lists, st.lists(times, max_size=20), st.sampled_from(list(Granularity)))
def test_pieces_by_partition_cover_exactly_the_ranges(ranges, probes, granularity):
    pieces = pieces_by_partition(ranges, granularity, limit=10_000)
    spans = [(partition_id(partition_key(iv.start, granularity), granularity),
              partition_id(partition_key(iv.end - timedelta(microseconds=1), granularity), granularity))
             for iv in coalesce(ranges) if iv.start < iv.end]
    shared = any(a[1] == b[0] for a, b in zip(spans, spans[1:]))  # two disjoint pieces in one partition
    assert (pieces is None) == shared
    if pieces is None:
        return
    for t in [*probes, *(iv.start for iv in ranges), *(iv.end for iv in ranges)]:
        inside = any(iv.contains(t) for iv in ranges)
        piece = pieces.get(partition_id(partition_key(t, granularity), granularity))
        assert inside == (piece is not None and piece[0] <= to_micros(t) < piece[1]), t


def test_pieces_by_partition_limits():
    hour = timedelta(hours=1)
    assert pieces_by_partition([Interval(T0, T0 + 3 * hour)], Granularity.HOURLY, limit=3) is not None
    assert pieces_by_partition([Interval(T0, T0 + 3 * hour)], Granularity.HOURLY, limit=2) is None
    two_in_one = [Interval(T0, T0 + timedelta(minutes=10)), Interval(T0 + timedelta(minutes=20), T0 + hour)]
    assert pieces_by_partition(two_in_one, Granularity.HOURLY, limit=10) is None
    assert pieces_by_partition([], Granularity.DAILY, limit=10) == {}


@pytest.mark.parametrize("key,granularity,expected", [
    ("2026-12-01-16:30", Granularity.HOURLY, "the start of an hour, like '2026-12-01-16:00'"),
    ("2026-12-1-16:00", Granularity.HOURLY, "like '2026-12-01-16:00'"),
    ("2026-12-1", Granularity.DAILY, "a date, like '2026-12-01'"),
])
def test_a_key_that_is_not_the_start_of_a_partition_is_refused(key, granularity, expected):
    """strptime reads '16:30' as a time: the key named no partition, and a run wrote a watermark for it."""
    with pytest.raises(ValueError, match=expected):
        partition_interval(key, granularity)


@pytest.mark.parametrize("key,granularity", [
    ("9999-12-31-23:00", Granularity.HOURLY), ("9999-12-31", Granularity.DAILY), ("0001-01-01-00:00", Granularity.HOURLY),
    ("0999-12-31", Granularity.DAILY),
])
def test_a_key_outside_the_partition_span_is_a_value_error_not_an_overflow(key, granularity):
    last = "9999-12-30-23:00" if granularity is Granularity.HOURLY else "9999-12-30"
    with pytest.raises(ValueError, match=f"partition from 1000-01-01.* to {last}, found '{key}'"):
        partition_interval(key, granularity)


def test_a_partition_whose_windows_overflow_is_refused():
    assert check_partition("9999-12-30", Granularity.DAILY, timedelta(hours=1)).end == datetime(9999, 12, 31, tzinfo=UTC)
    with pytest.raises(ValueError, match="too close to the first or last representable time"):
        check_partition("9999-12-30", Granularity.DAILY, timedelta(days=2))


def test_a_range_ending_at_the_last_instant_has_an_end():
    """A file whose statistics hold 9999-12-31 23:59:59.999999 (a 'max timestamp' sentinel)."""
    last = datetime.max.replace(tzinfo=UTC)
    assert closed_range(datetime(2026, 1, 1, tzinfo=UTC), last).end == last


def test_partition_span_runs_from_the_first_partition_to_the_one_holding_the_horizon():
    until = datetime(2026, 12, 2, 17, 40, tzinfo=UTC)
    assert partition_span(datetime(2026, 12, 1, tzinfo=UTC), until, Granularity.HOURLY) == \
        Interval(datetime(2026, 12, 1, tzinfo=UTC), datetime(2026, 12, 2, 18, tzinfo=UTC))
    assert partition_span(None, datetime.max.replace(tzinfo=UTC), Granularity.DAILY) == \
        Interval(datetime(1000, 1, 1, tzinfo=UTC), datetime(9999, 12, 31, tzinfo=UTC))
    assert partition_span(until, until - timedelta(days=3), Granularity.HOURLY).start == until  # empty, not an error


@pytest.mark.parametrize("size,slide", [(timedelta(minutes=1), timedelta(minutes=1)),
                                        (timedelta(minutes=10), timedelta(minutes=5))])
def test_windows_near_the_last_instant_end_there(size, slide):
    """An expired history touching 9999-12-31 23:59:59.999999 refills windows whose end is past the
    last representable instant: their end is that instant, not an OverflowError (found by the
    stateful test: far-away rows, then a vacuumed log)."""
    last = datetime.max.replace(tzinfo=UTC)
    shape = WindowShape(size=size, slide=slide)
    starts = shape.starts_overlapping(closed_range(datetime(9999, 12, 31, 23, 50, tzinfo=UTC), last))
    assert starts is not None and starts.end == last
    assert shape.events_of_starts(starts).end == last
    assert shape.windows_of(last)[-1].end == last
