"""What a Parquet footer says about the event time (for change data files, which have no statistics
in the Delta log), and which files a snapshot listing keeps for a set of event-time ranges."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from laminar_assets.engine.delta.file_ranges import footer_facts


def test_footer_facts_read_the_top_level_column_not_a_nested_field_of_the_same_name(tmp_path):
    ts = pa.timestamp("us", tz="UTC")
    at = datetime(2024, 1, 1, 0, 5, tzinfo=UTC)
    table = pa.table({
        "meta": pa.array([{"ts": at}, {"ts": at}], type=pa.struct([("ts", ts)])),  # a leaf named `ts` too
        "ts": pa.array([None, datetime(2024, 1, 1, 0, 7, tzinfo=UTC)], type=ts),
        "id": pa.array([1, 2], type=pa.int32()),
    })
    path = str(tmp_path / "part.parquet")
    pq.write_table(table, path)
    rng, rows, nulls = footer_facts(path, "ts")
    assert (rows, nulls) == (2, 1)
    assert rng is not None and rng.start == datetime(2024, 1, 1, 0, 7, tzinfo=UTC)
    assert footer_facts(path, "missing") == (None, 2, None)


def _table_of_files(path: str, typ: pa.DataType, n: int) -> None:
    """A Delta table whose log lists `n` files (never read) with statistics of column `t`: file i
    spans [i h, i h + 59 min 59.999 s] (statistics truncated to ms), every 7th has no statistics
    for `t`, every 11th holds only nulls."""
    import json
    import time
    from datetime import timedelta

    from deltalake import DeltaTable
    from deltalake.transaction import AddAction

    schema = pa.schema([("t", typ), ("v", pa.int64())])
    DeltaTable.create(path, schema=schema)
    t0 = datetime(2024, 1, 1, tzinfo=UTC)

    def stat(t: datetime) -> str:
        return t.date().isoformat() if pa.types.is_date(typ) else t.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"

    adds = []
    for i in range(n):
        lo, hi = t0 + timedelta(hours=i), t0 + timedelta(hours=i, minutes=59, seconds=59, microseconds=999_999)
        stats = {"numRecords": 10, "minValues": {"v": 0}, "maxValues": {"v": 1}, "nullCount": {"t": 0, "v": 0}}
        if i % 11 == 0:
            stats["nullCount"]["t"] = 10
        elif i % 7:
            stats["minValues"]["t"], stats["maxValues"]["t"] = stat(lo), stat(hi)
        adds.append(AddAction(f"f{i}.parquet", 100, {}, int(time.time() * 1000), True, json.dumps(stats)))
    DeltaTable(path).create_write_transaction(adds, mode="append", schema=schema)



@pytest.mark.parametrize("typ", [pa.timestamp("us", tz="UTC"), pa.timestamp("us"), pa.date32()],
                         ids=["timestamp", "timestamp_ntz", "date"])
def test_files_pruned_in_arrow_are_the_files_the_exact_check_keeps(tmp_path, typ):
    """`snapshot_files(..., within)` filters the add actions in Arrow before the exact check on
    each file: the same files as the exact check over every file, at range edges too."""
    from datetime import timedelta

    from laminar_assets.engine.delta.tables import snapshot_files, table_info
    from laminar_assets.engine.windows import Interval

    path = str(tmp_path / "t")
    _table_of_files(path, typ, 300)
    info = table_info("t", path)
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    everything = snapshot_files(info, "t")
    cases = [[Interval(t0 + timedelta(hours=5), t0 + timedelta(hours=6))],  # exactly one file's hour
             [Interval(t0 + timedelta(hours=9, minutes=59, seconds=59, milliseconds=999), t0 + timedelta(hours=10))],
             [Interval(t0 + timedelta(days=2, hours=3), t0 + timedelta(days=2, hours=4, minutes=1)),
              Interval(t0 + timedelta(days=9), t0 + timedelta(days=9, hours=1))],
             [Interval(t0 - timedelta(days=3), t0 - timedelta(days=2))]]  # before every file
    for ranges in cases:
        exact = [f.uri for f in everything if f.time_range is None or any(f.time_range.overlaps(r) for r in ranges)]
        pruned = [f.uri for f in snapshot_files(info, "t", ranges)]
        assert pruned == exact, ranges
        assert len(pruned) < len(everything)


# --- skipping files by their key statistics (a stage's changed keys, #49) ------------------------

from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from laminar_assets.engine.delta.file_ranges import KeyProbe, key_bounds  # noqa: E402
from laminar_assets.engine.delta.tables import snapshot_files, table_info  # noqa: E402

_keys = st.tuples(st.integers(-5, 40), st.text("abc", max_size=3))


def _bounds(rows: list[tuple]) -> tuple:
    return tuple((min(col), max(col)) for col in zip(*rows))


@given(files=st.lists(st.lists(_keys, min_size=1, max_size=6), min_size=1, max_size=6),
       values=st.lists(_keys, min_size=1, max_size=5))
def test_a_probe_never_skips_a_file_holding_a_row_the_key_test_accepts(files, values):
    """A row passes `c1 IN (...) AND c2 IN (...)` (`reading.group_values_sql`): its file must be kept."""
    probe = KeyProbe(values)
    for rows in files:
        member = any(all(r[i] in {v[i] for v in values} for i in range(2)) for r in rows)
        if member:
            assert probe.may_hold(_bounds(rows))


def test_a_probe_skips_files_whose_ranges_hold_no_value_and_keeps_unknown_ones():
    probe = KeyProbe([(5,), (70,)])
    assert [probe.may_hold(((lo, hi),)) for lo, hi in [(1, 4), (1, 5), (6, 69), (60, 80), (71, 90)]] \
        == [False, True, False, True, False]
    assert probe.may_hold(None) and probe.may_hold(((None, None),)) and probe.may_hold(((None, 5),))
    assert probe.may_hold((("a", "z"),)), "statistics of another type than the values tell nothing"
    assert not probe.may_hold(((None, 4),)) and not probe.may_hold(((71, None),))


def test_snapshot_files_keep_integer_and_string_key_statistics(tmp_path):
    from deltalake import write_deltalake

    path = str(tmp_path / "t")
    long = "x" * 40
    write_deltalake(path, pa.table({"id": pa.array([3, 9], pa.int64()), "code": ["b", long],
                                    "px": [1.0, 2.0]}))
    write_deltalake(path, pa.table({"id": pa.array([20, 30], pa.int64()), "code": ["c", "d"],
                                    "px": [3.0, 4.0]}), mode="append")
    files = snapshot_files(table_info("t", path), None, bounds_of=("id", "code", "px", "missing"))
    got = sorted(f.bounds for f in files)
    assert got == [((3, 9), ("b", long), (None, None), (None, None)),
                   ((20, 30), ("c", "d"), (None, None), (None, None))]
    assert [KeyProbe([(25, "c", 0.0, 0)]).may_hold(b) for b in got] == [False, True]
    acts = pa.table(table_info("t", path).delta().get_add_actions(flatten=True))
    assert key_bounds(acts, []) == [(), ()]
