"""`Engine.run_many`: several partitions share Spark jobs and commits, with the same plans and the
same results as running them one by one, and the same crash safety."""

from __future__ import annotations

import pytest

from laminar_assets.engine import Engine, Mode, Reason
from laminar_assets.engine.executor import STEPS
from laminar_assets.errors import InjectedCrash
from tests.engine.test_crash_safety import EXTREMES, RETRACTING, crash_at
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

KEYS = ["2024-01-01-00:00", "2024-01-01-01:00", "2024-01-01-02:00"]
BASE = [("2024-01-01 00:01:00", "a", 10.0, 1), ("2024-01-01 00:42:00", "b", 12.0, 2),
        ("2024-01-01 01:05:00", "a", 7.0, 3), ("2024-01-01 01:55:00", "b", 8.0, 1),
        ("2024-01-01 02:10:00", "a", 9.0, 4)]


def check(spark, lake, flow):
    expected = full_recompute(spark, flow, lake.table("trades").to_pyarrow_table())
    expected = expected[(expected["window_start"] >= "2024-01-01") & (expected["window_start"] < "2024-01-01 03:00")]
    assert_frames_match(lake.read(flow.sink), expected.reset_index(drop=True), flow.keys)


def changes(lake):
    lake.append("trades", [("2024-01-01 00:15:00", "a", 11.0, 5), ("2024-01-01 02:20:00", "b", 3.0, 1)])
    lake.delete("trades", "px = 7.0")  # hour 01:00
    lake.update("trades", {"px": "13.0"}, "px = 12.0")  # hour 00:00


@pytest.mark.parametrize("flow", [RETRACTING, EXTREMES], ids=["retractable", "min-last"])
def test_batched_runs_equal_a_full_recompute_and_one_by_one_runs(spark, lake, engine, tmp_path, flow):
    lake.create("trades", BASE)
    first = engine.run_many(flow, KEYS)
    assert [r.reason for r in first] == [Reason.NO_WATERMARK] * 3
    assert first[0].metrics["batch_partitions"] == 3
    check(spark, lake, flow)
    changes(lake)
    second = engine.run_many(flow, KEYS)
    modes = [r.mode for r in second]
    # approx_count_distinct cannot retract: the hours with a delete or update refill, the append-only hour does not
    assert modes == ([Mode.INCREMENTAL] * 3 if flow is RETRACTING else [Mode.REFILL, Mode.REFILL, Mode.INCREMENTAL])
    check(spark, lake, flow)
    # the same history, one partition at a time, gives the same sink
    from tests.conftest import Lake

    other = Lake(str(tmp_path / "other"))
    other.create("trades", BASE)
    solo = Engine(spark, other.root)
    for k in KEYS:
        solo.run(flow, k)
    changes(other)
    assert [solo.run(flow, k).reason for k in KEYS] == [r.reason for r in second]
    assert_frames_match(lake.read(flow.sink), other.read(flow.sink), flow.keys)
    # nothing new: every partition is a NOOP
    assert {r.mode for r in engine.run_many(flow, KEYS)} == {Mode.NOOP}


@pytest.mark.parametrize("step", STEPS)
def test_a_crash_in_a_batched_run_then_a_rerun_equals_a_clean_run(spark, lake, step):
    lake.create("trades", BASE)
    Engine(spark, lake.root).run_many(RETRACTING, KEYS)
    changes(lake)
    with pytest.raises(InjectedCrash):
        Engine(spark, lake.root, hook=crash_at(step)).run_many(RETRACTING, KEYS)
    Engine(spark, lake.root).run_many(RETRACTING, KEYS)
    check(spark, lake, RETRACTING)
    marks = [Engine(spark, lake.root).store.load(RETRACTING.name, k) for k in KEYS]
    assert all(m.pending is None and m.committed for m in marks)
    assert {m.source_versions["trades"] for m in marks} == {lake.table("trades").version()}


def test_a_range_with_a_new_partition_still_sees_the_changes_of_the_materialized_ones(spark, lake, engine):
    """A sensor's range run mixes partitions never materialized (they refill from the snapshot) with
    materialized ones that have new commits; the new one must not hide the others' history (it did:
    they planned NOOP and the late rows, update and delete were lost)."""
    lake.create("trades", BASE)
    engine.run_many(RETRACTING, KEYS)
    changes(lake)
    lake.append("trades", [("2024-01-01 03:30:00", "a", 1.0, 1)])
    results = engine.run_many(RETRACTING, ["2024-01-01-03:00", *KEYS])
    assert results[0].reason is Reason.NO_WATERMARK
    assert [r.mode for r in results[1:]] == [Mode.INCREMENTAL] * 3
    expected = full_recompute(spark, RETRACTING, lake.table("trades").to_pyarrow_table())
    expected = expected[(expected["window_start"] >= "2024-01-01") & (expected["window_start"] < "2024-01-01 04:00")]
    assert_frames_match(lake.read(RETRACTING.sink), expected.reset_index(drop=True), RETRACTING.keys)


def test_a_run_lists_only_the_source_files_its_partitions_can_use(spark, lake, engine):
    """A run's snapshot listing (refill files, refill-cost estimates) is limited to the event times
    its partitions' windows can use; a refill of one hour still equals a full recompute."""
    for i, hour in enumerate(["00", "01", "02"]):  # one file per hour
        rows = [r for r in BASE if r[0][11:13] == hour]
        lake.create("trades", rows) if i == 0 else lake.append("trades", rows)
    version = lake.table("trades").version()
    everything = engine.gather(RETRACTING, [None])
    assert len(everything.snapshot(RETRACTING, "trades", version)) == 3
    limited = engine.gather(RETRACTING, [None])
    limited.limit_to(RETRACTING, [KEYS[1]])
    [f] = limited.snapshot(RETRACTING, "trades", version)
    assert f.time_range.start.hour == 1
    engine.run_many(RETRACTING, KEYS)
    [r] = engine.run_many(RETRACTING, [KEYS[1]], force=True)
    assert r.mode is Mode.REFILL and r.metrics["files_read"] == 1
    check(spark, lake, RETRACTING)
