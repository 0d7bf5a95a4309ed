"""The sensor's search for dirty partitions is bounded by the flow's partitions: from its first one to
now + future_horizon. A row dated 1900 or 9999 in a new commit widens the file's min/max statistics to
a century or eight millennia, and the search listed every hour in between (1.1M keys and 10 s for 1900;
out of memory for 9999)."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import Agg, FlowSpec, Hopping
from laminar_assets.engine.report import staleness
from laminar_assets.pipeline.graph import components
from laminar_assets.pipeline.settings import LaminarSettings
from laminar_assets.pipeline.tick import Cursor, plan_tick

NOW = datetime(2026, 12, 1, 16, 40, tzinfo=UTC)
SETTINGS = LaminarSettings(partitions_start="2026-11-30", future_horizon="6h")
FLOW = FlowSpec(name="f", source="trades", event_time="ts", window=Hopping("20m", "10m"), aggregates=(Agg.count(),))
MOST_KEYS = 200  # the searched span: 2026-11-30 00:00 to 2026-12-01 23:00, 48 hours


@pytest.fixture
def bounded(monkeypatch):
    """Fails the search as soon as it would list more partitions than the searched span holds."""
    listed = []

    def partitions_overlapping(events, granularity):
        count = (events.end - events.start) // granularity.step + 1
        assert count <= MOST_KEYS, f"asked to list {count} partitions of {events}"
        keys = real(events, granularity)
        listed.append(len(keys))
        return keys

    real = staleness.partitions_overlapping
    monkeypatch.setattr(staleness, "partitions_overlapping", partitions_overlapping)
    return listed


def write(root: str, *times: datetime, mode: str = "error") -> None:
    rows = pa.table({"ts": pa.array(times, pa.timestamp("us", tz="UTC")), "qty": pa.array([1] * len(times), pa.int64())})
    write_deltalake(f"{root}/trades", rows, mode=mode)


def tick(root: str, cursor: Cursor | None = None):
    [part] = components([FLOW])
    return plan_tick(part, root, CheckpointStore(root), cursor or Cursor(), lambda *_: set(), set(), SETTINGS, NOW)


@pytest.mark.parametrize("bad", [datetime(1900, 1, 2, 9, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999, tzinfo=UTC),
                                 datetime(1, 1, 1, tzinfo=UTC), NOW + timedelta(days=3)])
def test_a_row_far_outside_the_partitions_costs_no_more_than_the_partitions(tmp_path, bounded, bad):
    root = str(tmp_path)
    write(root, NOW - timedelta(hours=2))
    first = tick(root)
    assert first.dirty["f"] == ("2026-12-01-14:00",)
    write(root, NOW - timedelta(minutes=30), bad, mode="append")  # one file: its statistics span to the bad row
    plan = tick(root, first.cursor)
    keys = plan.dirty["f"]
    if bad > NOW:  # the file's range runs from 16:10 to the bad row: searched up to now + 6 h
        assert keys == tuple(f"2026-12-01-{h}:00" for h in range(16, 23))
    else:  # from the flow's first partition to 16:10
        assert keys[0] == "2026-11-30-00:00" and keys[-1] == "2026-12-01-16:00" and len(keys) == 41
    assert sum(bounded) <= 2 * MOST_KEYS
    [note] = plan.notes
    assert "f: new commits of 'trades' hold event times outside the partitions searched (2026-11-30 00:00 to " \
           "2026-12-01 23:00: its first partition to now + future_horizon), " in note
    assert f"as {'late' if bad > NOW else 'early'} as {bad.isoformat(' ', 'minutes')[:16]}" in note


def test_rows_outside_the_contract_bounds_search_nothing(tmp_path, bounded):
    """The contract's event-time bounds were not applied to the search: rows outside them are never
    aggregated (the sweep quarantines them as event_time_out_of_bounds), so they make no partition dirty."""
    root = str(tmp_path)
    write(root, NOW - timedelta(hours=2), datetime(9999, 12, 30, tzinfo=UTC))
    flow = dataclasses.replace(FLOW, event_time_bounds=("2026-11-01", "2026-12-01T18:00"))
    [part] = components([flow])
    plan = plan_tick(part, root, CheckpointStore(root), Cursor(), lambda *_: set(), set(),
                     LaminarSettings(partitions_start="2000-01-01", future_horizon="400d"), NOW)
    assert plan.dirty["f"] == ("2026-12-01-14:00", "2026-12-01-15:00", "2026-12-01-16:00", "2026-12-01-17:00")


def test_the_far_away_note_names_the_rows_times_not_the_contract_bounds(tmp_path, bounded):
    """With event-time bounds (raw_trades' contract: 2000 to 2100), a row dated 9999 was noted 'as late as
    2100-01-01 00:00': the bound, which is no row's time."""
    root = str(tmp_path)
    write(root, NOW - timedelta(minutes=30), datetime(9999, 12, 30, 7, 15, tzinfo=UTC))
    flow = dataclasses.replace(FLOW, event_time_bounds=("2000-01-01", "2100-01-01"))
    [part] = components([flow])
    [note] = plan_tick(part, root, CheckpointStore(root), Cursor(), lambda *_: set(), set(), SETTINGS, NOW).notes
    assert "as late as 9999-12-30 07:15" in note and "as late as 2100" not in note
    assert "(its event_time_bounds allow 2000-01-01 00:00 to 2100-01-01 00:00: rows outside them are quarantined " \
           "as event_time_out_of_bounds)" in note


def test_a_source_whose_checkpoint_is_gone_fails_the_tick_naming_table_version_and_file(tmp_path):
    """The tick opened sources with `deltalake` directly: its error named no table."""
    import glob
    import os

    from deltalake import DeltaTable

    from laminar_assets.engine import SourceError

    root = str(tmp_path)
    write(root, NOW)
    write(root, NOW, mode="append")
    DeltaTable(f"{root}/trades").create_checkpoint()
    [checkpoint] = glob.glob(f"{root}/trades/_delta_log/*.checkpoint.parquet")
    os.remove(checkpoint)
    with pytest.raises(SourceError, match="whose file is missing") as info:
        tick(root)
    assert info.value.facts == {"table": "trades", "version": 1, "file": checkpoint}
