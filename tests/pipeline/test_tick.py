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
from laminar_assets.pipeline.tick import LOCAL_POLL_SECONDS, Cursor, plan_tick, watch_for_commits

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


class Clock:
    """A clock that moves only when the watch sleeps, and runs `on_sleep[i]` at its i-th sleep (a commit
    landing while the watch waits), so the watch's looks are counted, not timed."""

    def __init__(self, *on_sleep) -> None:
        self.now, self.slept, self.on_sleep = 0.0, [], list(on_sleep)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds
        if self.on_sleep:
            self.on_sleep.pop(0)()

    def watch(self, root: str, versions: dict[str, int], seconds: float = 0.9):
        return watch_for_commits(root, ("trades",), versions, seconds=seconds, sleep=self.sleep, clock=lambda: self.now)


def test_a_watch_with_no_commit_looks_until_its_time_is_up_and_finds_nothing(tmp_path):
    root = str(tmp_path)
    write(root, NOW)
    clock = Clock()
    assert clock.watch(root, {"trades": 0}) == {}
    assert sum(clock.slept) == pytest.approx(0.9) and max(clock.slept) == LOCAL_POLL_SECONDS


def test_a_watch_answers_a_burst_of_commits_once_the_log_is_quiet(tmp_path):
    """An append then its corrections, milliseconds apart: the watch looks again after each find, and answers
    with the last, so one run covers the burst instead of the first commit alone."""
    root = str(tmp_path)
    write(root, NOW)
    one = lambda: write(root, NOW, mode="append")  # noqa: E731
    clock = Clock(lambda: None, lambda: (one(), one()), one, lambda: None)
    assert clock.watch(root, {"trades": 0}) == {"trades": 3}
    assert len(clock.slept) == 4  # nothing, two commits, one more, then a quiet look ends it


def test_a_watch_sees_a_source_created_while_it_waits_and_stops_at_its_deadline_in_a_burst(tmp_path):
    root = str(tmp_path)
    keep_writing = [lambda: write(root, NOW, mode="append")] * 50
    clock = Clock(lambda: write(root, NOW), *keep_writing)
    # created during its first wait, a commit during each of the others, the last one seen by the look at the deadline
    assert clock.watch(root, {}, seconds=0.5) == {"trades": len(clock.slept) - 1} and len(clock.slept) >= 10
    assert sum(clock.slept) == pytest.approx(0.5)  # a writer that never pauses does not hold the tick past its time
