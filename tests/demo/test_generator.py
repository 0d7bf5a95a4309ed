"""The demo's data generator: where batches start, how later batches continue, and appends."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from deltalake import DeltaTable

from laminar_assets.demo.generator import START, BatchOptions, append_trades, recent_start, write_batch


def _times(root) -> list[datetime]:
    table = DeltaTable(f"{root}/raw_trades").to_pyarrow_table(columns=["event_time"])
    return [t for t in table.column("event_time").to_pylist() if t is not None]


def test_recent_start_is_a_whole_hour_hours_before_now():
    now = datetime(2026, 11, 24, 14, 40, 12, tzinfo=UTC)
    assert recent_start(now) == datetime(2026, 11, 24, 8, tzinfo=UTC)
    assert recent_start(now, hours_back=1) == datetime(2026, 11, 24, 13, tzinfo=UTC)


def test_batches_start_where_asked_and_later_ones_continue_the_table(tmp_path):
    start = datetime(2026, 3, 1, 5, tzinfo=UTC)
    first = write_batch(str(tmp_path), BatchOptions(rows=200, start=start), batch=0)
    assert start <= first.first_time and first.last_time < start + timedelta(hours=3)
    second = write_batch(str(tmp_path), BatchOptions(rows=100, late_share=0.2), batch=1)
    times = _times(tmp_path)
    # late rows land between the first hour and the new one; the new hour follows the last trade
    assert min(times) >= start and second.late > 0
    assert max(times) < start + timedelta(hours=4)
    assert write_batch(str(tmp_path / "default"), BatchOptions(rows=50), batch=0).first_time >= START


def test_append_trades_commits_clean_rows_in_the_range(tmp_path):
    write_batch(str(tmp_path), BatchOptions(rows=50), batch=0)
    before = len(_times(tmp_path))
    lo, hi = START + timedelta(hours=5), START + timedelta(hours=5, minutes=5)
    version = append_trades(str(tmp_path), 20, lo, hi, seed=3)
    assert version == DeltaTable(f"{tmp_path}/raw_trades").version()
    times = _times(tmp_path)
    assert len(times) == before + 20 and all(lo <= t < hi for t in times if t >= lo)
