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
