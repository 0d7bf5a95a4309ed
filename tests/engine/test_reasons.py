"""Each planner reason, produced by a real situation on real Delta tables."""

from __future__ import annotations

import re
import time

import pytest
from deltalake import write_deltalake

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import (
    Agg,
    Engine,
    EngineOptions,
    FlowSpec,
    LatePolicy,
    Mode,
    Reason,
    StrictRefreshError,
    Tumbling,
)
from laminar_assets.errors import ConcurrentRunError
from tests.conftest import trades_frame
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

PART = "2024-01-01-00:00"
BASE = [("2024-01-01 00:01:00", "a", 10.0, 1), ("2024-01-01 00:12:00", "a", 12.0, 2),
        ("2024-01-01 00:31:00", "b", 7.0, 3)]


def sums(**kw):
    return FlowSpec(**{**dict(name="sums", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                              aggregates=(Agg.count(), Agg.sum("qty"))), **kw})


def highs(**kw):
    return FlowSpec(**{**dict(name="highs", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                              aggregates=(Agg.max("px"), Agg.count())), **kw})


def distincts(**kw):
    return FlowSpec(**{**dict(name="distincts", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                              aggregates=(Agg.count_distinct("px"), Agg.count())), **kw})


def check(spark, lake, flow):
    expected = full_recompute(spark, flow, lake.table("trades").to_pyarrow_table())
    assert_frames_match(lake.read(flow.sink), expected, flow.keys)


def test_first_run_then_appends_then_nothing(spark, lake, engine):
    lake.create("trades", BASE)
    assert engine.run(sums(), PART).reason is Reason.NO_WATERMARK
    lake.append("trades", [("2024-01-01 00:02:00", "b", 1.0, 5)])
    r = engine.run(sums(), PART)
    assert (r.mode, r.reason) == (Mode.INCREMENTAL, Reason.APPEND_ONLY)
    assert r.metrics["rows_read"] == 1 and r.metrics["files_read"] == 1
    assert engine.run(sums(), PART).reason is Reason.NO_NEW_VERSIONS
    lake.append("trades", [("2024-01-01 05:00:00", "b", 1.0, 5)])
    r = engine.run(sums(), PART)
    assert (r.mode, r.reason) == (Mode.NOOP, Reason.NO_CHANGES_IN_PARTITION)
    assert r.plan.other_partitions == ("2024-01-01-05:00",)
    sink = lake.read("sums")
    assert sorted(sink["count"].tolist()) == [1, 1, 1, 1]


def test_delete_on_retractable_flow_is_incremental(spark, lake, engine):
    lake.create("trades", BASE)
    engine.run(sums(), PART)
    lake.delete("trades", "qty = 2")
    r = engine.run(sums(), PART)
    assert (r.mode, r.reason) == (Mode.INCREMENTAL, Reason.RETRACTABLE_CHANGES)
    assert r.metrics["rows_retracted"] == 1
    check(spark, lake, sums())


def test_delete_on_non_retractable_flow_refills_only_touched_windows(spark, lake, engine):
    lake.create("trades", BASE)
    engine.run(distincts(), PART)
    lake.update("trades", {"px": "100.0"}, "qty = 2")  # 00:12 -> window 00:10
    r = engine.run(distincts(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE)
    assert not r.plan.refill_all and len(r.plan.refill) == 1
    assert r.plan.refill[0].start.minute == 10 and r.plan.refill[0].end.minute == 20
    assert r.metrics["windows_touched"] == 1
    check(spark, lake, distincts())


def merge_first(spark, lake) -> Engine:
    """An engine that always merges deletes and updates of extremes first (no up-front estimate):
    these tables have a row or two per group, where the estimate rightly expects every group to lose
    its extreme and would recompute instead."""
    return Engine(spark, lake.root, options=EngineOptions(extreme_refill="merge"))


def test_an_update_that_raises_a_max_merges(spark, lake):
    engine = merge_first(spark, lake)
    lake.create("trades", BASE)
    engine.run(highs(), PART)
    lake.update("trades", {"px": "100.0"}, "qty = 2")  # the window's only row: its new price is the max
    r = engine.run(highs(), PART)
    assert (r.mode, r.reason) == (Mode.INCREMENTAL, Reason.RETRACTABLE_CHANGES)
    check(spark, lake, highs())


def test_a_max_is_recomputed_only_when_no_row_holding_it_is_left(spark, lake):
    engine = merge_first(spark, lake)
    # window 00:10 of 'a': 12.0 (qty 2), 12.0 (qty 5), 11.0 (qty 4); of 'b': 20.0 (qty 7)
    lake.create("trades", [*BASE, ("2024-01-01 00:14:00", "a", 11.0, 4), ("2024-01-01 00:15:00", "a", 12.0, 5),
                           ("2024-01-01 00:13:00", "b", 20.0, 7)])
    engine.run(highs(), PART)
    lake.delete("trades", "qty = 2")  # one of two rows holding 12.0
    r = engine.run(highs(), PART)
    assert (r.mode, r.reason) == (Mode.INCREMENTAL, Reason.RETRACTABLE_CHANGES)
    check(spark, lake, highs())
    lake.delete("trades", "qty = 4")  # not the max
    assert engine.run(highs(), PART).reason is Reason.RETRACTABLE_CHANGES
    lake.append("trades", [("2024-01-01 00:16:00", "a", 9.0, 6), ("2024-01-01 00:17:00", "b", 30.0, 8)])
    lake.delete("trades", "qty = 5")  # the last row holding 12.0: the max is now 9.0, which the state never kept
    r = engine.run(highs(), PART)
    # only group (00:10, 'a') is recomputed from the snapshot; (00:10, 'b') merges its appended 30.0
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.EXTREME_RETRACTED)
    assert r.plan.refill == () and not r.plan.refill_all
    assert [(w.start.minute, w.end.minute) for w in r.plan.group_windows] == [(10, 20)]
    assert len(r.plan.refill_groups) == 1 and r.metrics["refilled_groups"] == 1
    assert "1 group(s) recomputed" in r.plan.detail and "00:10" in r.plan.detail
    check(spark, lake, highs())
    assert engine.run(highs(), PART).reason is Reason.NO_NEW_VERSIONS


def many_trades(n: int) -> list:
    """`n` trades a minute apart from 00:00 over symbols a..d, prices cycling 1..9 (ties at each extreme)."""
    return [(f"2024-01-01 {i // 60:02d}:{i % 60:02d}:00", "abcd"[i % 4], float(1 + i % 9), i) for i in range(n)]


def _estimates(detail: str) -> tuple[float, float]:
    """The expected seconds of merging first and of recomputing up front, as a plan's detail gives them."""
    found = re.search(r"merging first ~([0-9.]+)s .* up front ~([0-9.]+)s", detail)
    assert found, detail
    return float(found[1]), float(found[2])


def test_a_sparse_delete_of_extremes_takes_the_path_its_estimate_finds_cheaper(spark, lake, engine):
    lake.create("trades", many_trades(60))  # 6 windows x 4 symbols, 2-3 rows per group
    engine.run(highs(), PART)
    lake.delete("trades", "qty = 3")  # one row of 60 (not its group's max): ~0.4 of 24 groups expected to lose theirs
    r = engine.run(highs(), PART)
    merging, up_front = _estimates(r.detail)
    assert "some group with probability 33%" in r.detail, r.detail
    # the window's few rows cost less than a third of a chance of a second pass: recomputed up front
    assert up_front < merging and (r.mode, r.reason) == (Mode.REFILL, Reason.EXTREME_RETRACTED), r.detail
    assert [(w.start.minute, w.end.minute) for w in r.plan.refill] == [(0, 10)]
    check(spark, lake, highs())
    lake.delete("trades", "qty = 7")
    r = merge_first(spark, lake).run(highs(), PART)  # merging first asked for: merged, no estimate made
    assert (r.mode, r.reason) == (Mode.INCREMENTAL, Reason.RETRACTABLE_CHANGES) and "merging first" not in r.detail
    check(spark, lake, highs())


def test_dense_deletes_of_extremes_recompute_the_touched_windows_up_front(spark, lake):
    # a third of the rows of windows 00:00-00:30, ~2 rows a group: ~5 extremes expected to be lost, so a
    # second pass is all but sure after merging first
    engine = Engine(spark, lake.root)
    lake.create("trades", many_trades(60))
    engine.run(highs(), PART)
    lake.delete("trades", "qty % 3 = 0 AND qty < 30")
    r = engine.run(highs(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.EXTREME_RETRACTED)
    assert "some group with probability 99%" in r.detail and "of recomputing the 3 touched window(s)" in r.detail
    merging, up_front = _estimates(r.detail)
    assert up_front < merging, r.detail
    assert [(w.start.minute, w.end.minute) for w in r.plan.refill] == [(0, 30)] and not r.plan.refill_all
    check(spark, lake, highs())
    # the same deletes merged first find the windows after the pass, with the same result
    lake.append("trades", [("2024-01-01 00:05:30", "a", 50.0, 100)])
    lake.delete("trades", "qty % 3 = 1 AND qty < 30")
    r = merge_first(spark, lake).run(highs(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.EXTREME_RETRACTED)
    assert "expected" not in r.detail
    check(spark, lake, highs())


def test_deletes_and_updates_a_count_distinct_cannot_retract_recompute_only_their_groups(spark, lake, engine):
    lake.create("trades", many_trades(60))  # 6 windows x 4 symbols
    engine.run(distincts(), PART)
    lake.update("trades", {"px": "100.0"}, "qty = 13")  # (00:10, 'b')
    lake.delete("trades", "qty = 30")  # (00:30, 'c')
    moved = {"ts": "CAST('2024-01-01 00:41:00' AS TIMESTAMP)", "sym": "'e'"}
    lake.update("trades", moved, "qty = 50")  # (00:50, 'c') -> (00:40, 'e')
    lake.append("trades", [("2024-01-01 00:12:30", "a", 77.0, 100)])  # an unchanged group of a touched window merges
    r = engine.run(distincts(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE), r.detail
    assert r.plan.refill == () and len(r.plan.refill_groups) == 4, r.detail
    assert [(w.start.minute, w.end.minute) for w in r.plan.group_windows] == [(10, 20), (30, 0)]  # 00:30-01:00
    assert "4 of ~16 group(s) in 4 window(s) recomputed" in r.detail
    check(spark, lake, distincts())
    lake.delete("trades", "sym = 'e'")  # the group's only row: the group is gone
    r = engine.run(distincts(), PART)
    assert len(r.plan.refill_groups) == 1
    check(spark, lake, distincts())


@pytest.fixture
def driver_in_new_york(monkeypatch):
    """The driver's local time zone 5 hours behind UTC (Spark's session stays UTC): a window start
    collected as a local datetime would name the wrong partition."""
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def test_groups_are_found_in_their_own_partition_by_a_driver_outside_utc(spark, lake, driver_in_new_york):
    # the large-pass path collects the groups that lost an extreme through Spark rows, as the job
    # finding a count_distinct's changed groups always does
    engine = Engine(spark, lake.root, options=EngineOptions(extreme_refill="merge", single_task_below_bytes=0,
                                                            driver_write_below_bytes=0))
    lake.create("trades", many_trades(60))
    engine.run(highs(), PART)
    engine.run(distincts(), PART)
    lake.delete("trades", "qty = 7")  # the only row holding (00:00, 'd')'s max 8.0
    r = engine.run(highs(), PART)
    assert (r.reason, len(r.plan.refill_groups)) == (Reason.EXTREME_RETRACTED, 1), r.detail
    check(spark, lake, highs())
    r = engine.run(distincts(), PART)
    assert (r.reason, len(r.plan.refill_groups)) == (Reason.NON_APPEND_ON_NON_RETRACTABLE, 1), r.detail
    check(spark, lake, distincts())


def test_dense_deletes_a_count_distinct_cannot_retract_recompute_whole_windows(spark, lake, engine):
    lake.create("trades", many_trades(60))
    engine.run(distincts(), PART)
    lake.delete("trades", "qty < 20 AND qty % 2 = 0")  # every group of windows 00:00-00:20
    r = engine.run(distincts(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE)
    assert r.plan.refill_groups == () and [(w.start.minute, w.end.minute) for w in r.plan.refill] == [(0, 20)]
    assert "group(s) changed, the windows are recomputed" in r.detail
    check(spark, lake, distincts())


def test_rewrite_without_change_data_feed_refills(spark, lake, engine):
    lake.create("trades", BASE, cdf=False)
    engine.run(sums(), PART)
    lake.delete("trades", "qty = 1")
    r = engine.run(sums(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.REWRITE_WITHOUT_CHANGE_DATA)
    check(spark, lake, sums())


def test_log_cleanup_expires_checkpoint(spark, lake, engine):
    lake.create("trades", BASE, **{"delta.logRetentionDuration": "interval 0 seconds"})
    engine.run(sums(), PART)
    lake.append("trades", [("2024-01-01 00:03:00", "a", 1.0, 1)])
    lake.append("trades", [("2024-01-01 00:04:00", "a", 1.0, 1)])
    dt = lake.table("trades")
    dt.create_checkpoint()
    dt.cleanup_metadata()
    r = engine.run(sums(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.CHECKPOINT_EXPIRED)
    assert "no longer in the Delta log" in r.detail
    check(spark, lake, sums())


def test_vacuumed_files_expire_checkpoint(spark, lake, engine):
    lake.create("trades", BASE)
    engine.run(sums(), PART)
    lake.append("trades", [("2024-01-01 00:03:00", "a", 1.0, 1)])
    lake.delete("trades", "qty = 1")  # removes the file the append added
    lake.table("trades").vacuum(retention_hours=0, dry_run=False, enforce_retention_duration=False)
    r = engine.run(sums(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.CHECKPOINT_EXPIRED)
    assert "vacuumed" in r.detail
    check(spark, lake, sums())


def test_spec_change_refills_and_reshapes_sink(spark, lake, engine):
    lake.create("trades", BASE)
    engine.run(sums(), PART)
    wider = sums(aggregates=(Agg.count(), Agg.sum("qty"), Agg.avg("px")))
    r = engine.run(wider, PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.SPEC_CHANGED)
    check(spark, lake, wider)


def test_schema_change_refills(spark, lake, engine):
    lake.create("trades", frame=trades_frame(BASE).astype({"qty": "int32"}))
    engine.run(sums(), PART)
    widened = trades_frame(BASE + [("2024-01-01 00:05:00", "a", 1.0, 9)]).astype({"qty": "int64"})
    write_deltalake(lake.path("trades"), widened, mode="overwrite", schema_mode="overwrite")
    r = engine.run(sums(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.SCHEMA_CHANGED)
    assert "qty: int -> bigint" in r.detail
    check(spark, lake, sums())


def test_policies_and_forced_refill(spark, lake, engine):
    lake.create("trades", BASE)
    full = sums(refresh="full")
    engine.run(full, PART)
    assert engine.run(full, PART).reason is Reason.FORCED_BY_POLICY
    engine.run(sums(), PART)
    assert engine.run(sums(), PART, force=True).reason is Reason.FORCED_BY_USER


def test_incremental_strict_fails_with_the_reason(spark, lake, engine):
    lake.create("trades", BASE)
    strict = distincts(refresh="incremental_strict")
    with pytest.raises(StrictRefreshError) as info:
        engine.run(strict, PART)
    assert info.value.reason == "NO_WATERMARK"
    engine.run(strict, PART, force=True)  # an explicit refill bootstraps it
    lake.append("trades", [("2024-01-01 00:02:00", "b", 1.0, 5)])
    assert engine.run(strict, PART).reason is Reason.APPEND_ONLY
    lake.delete("trades", "qty = 5")
    with pytest.raises(StrictRefreshError) as info:
        engine.run(strict, PART)
    assert info.value.reason == "NON_APPEND_ON_NON_RETRACTABLE"
    assert "incremental_strict" in str(info.value)


def test_frozen_partition_ignores_late_rows(spark, lake, engine):
    lake.create("trades", BASE)
    frozen = sums(late=LatePolicy(freeze_after="1d"))
    engine.run(frozen, PART)
    lake.append("trades", [("2024-01-01 00:02:00", "b", 1.0, 5)])  # committed "now", years later
    r = engine.run(frozen, PART)
    assert (r.mode, r.reason) == (Mode.NOOP, Reason.PARTITION_FROZEN)
    assert lake.read("sums")["count"].sum() == 3


def test_bounded_work_leaves_versions_pending_then_catches_up(spark, lake, engine):
    lake.create("trades", BASE)
    bounded = sums(max_versions_per_run=1)
    engine.run(bounded, PART)
    for minute in (2, 3, 4):
        lake.append("trades", [(f"2024-01-01 00:0{minute}:00", "a", 1.0, minute)])
    r = engine.run(bounded, PART)
    assert r.metrics["pending_versions"] == 2 and r.plan.to_versions == {"trades": 1}
    engine.run(bounded, PART)
    r = engine.run(bounded, PART)
    assert r.metrics["pending_versions"] == 0
    check(spark, lake, sums())


def test_schema_widening_under_non_retractable_aggregate_refills(spark, lake, engine):
    lake.create("trades", frame=trades_frame(BASE).astype({"qty": "int32"}))
    flow = sums(name="qmax", aggregates=(Agg.max("qty"), Agg.count()))
    engine.run(flow, PART)
    widened = trades_frame(BASE + [("2024-01-01 00:05:00", "a", 1.0, 9)]).astype({"qty": "int64"})
    write_deltalake(lake.path("trades"), widened, mode="overwrite", schema_mode="overwrite")
    assert engine.run(flow, PART).reason is Reason.SCHEMA_CHANGED
    check(spark, lake, flow)


def test_recreated_source_expires_the_checkpoint(spark, lake, engine):
    lake.create("trades", BASE)
    for minute in (2, 3):
        lake.append("trades", [(f"2024-01-01 00:0{minute}:00", "a", 1.0, 1)])
    engine.run(sums(), PART)  # watermark at version 2
    import shutil

    shutil.rmtree(lake.path("trades"))
    lake.create("trades", BASE[:1])  # version 0 again
    r = engine.run(sums(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.CHECKPOINT_EXPIRED)
    assert "recreated" in r.detail
    check(spark, lake, sums())


def test_deleted_watermark_file_refills_instead_of_wedging(spark, lake, engine):
    lake.create("trades", BASE)
    engine.run(sums(), PART)
    engine.run(sums(), PART, force=True)
    CheckpointStore(lake.root).forget("sums", PART)  # as a user deleting its watermark would
    r = engine.run(sums(), PART)
    assert r.reason is Reason.NO_WATERMARK
    assert engine.run(sums(), PART).reason is Reason.NO_NEW_VERSIONS
    check(spark, lake, sums())


def test_a_watermark_older_than_the_table_is_refused_then_a_forced_refill_recovers_it(spark, lake, engine):
    """A watermark restored from a backup (or left by an earlier version) is older than the table's run: an
    incremental run would count rows twice, so it is refused, with the way out; a forced refill recomputes the
    partition from its source and continues the table's run sequence, and later runs are incremental again."""
    lake.create("trades", BASE)
    engine.run(sums(), PART)
    store = CheckpointStore(lake.root)
    old = store.load("sums", PART)
    lake.append("trades", [("2024-01-01 00:20:00", "a", 1.0, 1)])
    engine.run(sums(), PART)
    store.save(old)  # the backup's watermark, one run behind the table
    lake.append("trades", [("2024-01-01 00:21:00", "b", 2.0, 2)])
    with pytest.raises(ConcurrentRunError, match=r"older than the table .*laminar refill sums --partition-range "
                                                 r"2024-01-01-00:00...2024-01-01-00:00"):
        engine.run(sums(), PART)
    assert engine.run(sums(), PART, force=True).reason is Reason.FORCED_BY_USER
    check(spark, lake, sums())
    lake.append("trades", [("2024-01-01 00:22:00", "a", 3.0, 1)])
    assert engine.run(sums(), PART).mode is Mode.INCREMENTAL
    check(spark, lake, sums())


def test_vacuum_seen_by_a_long_lived_engine_refills_instead_of_failing(spark, lake, engine):
    """A vacuum deletes data files and touches no log entry: a process that already summarised the
    commit must still see that its files are gone (CHECKPOINT_EXPIRED), with no failed run first."""
    lake.create("trades", [("2024-01-01 00:10:00", "a", 1.0, 1), ("2024-01-01 01:10:00", "a", 2.0, 2)])
    hour0, hour1 = PART, "2024-01-01-01:00"
    engine.run_many(sums(), [hour0, hour1])
    lake.append("trades", [("2024-01-01 00:20:00", "b", 3.0, 3), ("2024-01-01 01:20:00", "b", 4.0, 4)])
    assert engine.run(sums(), hour0).reason is Reason.APPEND_ONLY  # v1's summary is now cached
    lake.compact("trades")
    lake.table("trades").vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    plan = engine.plan(sums(), hour1)
    assert (plan.mode, plan.reason) == (Mode.REFILL, Reason.CHECKPOINT_EXPIRED), plan.detail
    assert "vacuumed" in plan.detail
    assert engine.run(sums(), hour1).reason is Reason.CHECKPOINT_EXPIRED
    check(spark, lake, sums())


def test_source_recreated_past_the_watermark_version_refills(spark, lake, engine):
    """A table deleted and created again at the same path whose versions have caught up with the
    watermark's: its commits after that version are another table's, so merging them would be wrong."""
    lake.create("trades", BASE)
    for minute in (2, 3):
        lake.append("trades", [(f"2024-01-01 00:0{minute}:00", "a", 1.0, 1)])
    engine.run(sums(), PART)  # watermark at version 2
    import shutil

    shutil.rmtree(lake.path("trades"))
    lake.create("trades", BASE[:1])  # version 0 of another table
    for minute in (4, 5, 6):
        lake.append("trades", [(f"2024-01-01 00:0{minute}:00", "b", 2.0, 1)])  # versions 1-3
    r = engine.run(sums(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.CHECKPOINT_EXPIRED)
    assert "recreated" in r.detail
    check(spark, lake, sums())
    assert engine.run(sums(), PART).reason is Reason.NO_NEW_VERSIONS


def test_a_group_refill_reads_only_the_files_that_may_hold_its_keys(spark, lake, engine):
    """Each symbol's trades in files of their own (a table clustered by symbol): a correction of
    one symbol's trade recomputes its group from the one file whose statistics hold the symbol."""
    lake.create("trades", [t for t in many_trades(60) if t[1] == "a"])
    for sym in "bcd":
        lake.append("trades", [t for t in many_trades(60) if t[1] == sym])
    engine.run(distincts(), PART)
    lake.update("trades", {"px": "100.0"}, "qty = 13")  # (00:10, 'b')
    r = engine.run(distincts(), PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE), r.detail
    assert r.plan.group_keys == (("b",),) and len(r.plan.refill_groups) == 1
    assert r.metrics["files_read"] == 1, "of the window's 4 snapshot files, the one holding 'b' (4 without statistics)"
    check(spark, lake, distincts())
    lake.delete("trades", "qty = 14 OR qty = 25")  # (00:10, 'c') and (00:20, 'b')
    r = engine.run(distincts(), PART)
    assert sorted(r.plan.group_keys) == [("b",), ("c",)], r.detail
    # the delete rewrote the rest of b's and c's files as one file (b..c): that one, not a's or d's
    assert r.metrics["files_read"] == 1
    check(spark, lake, distincts())


def test_a_group_whose_hash_collides_with_a_changed_one_keeps_its_state(spark, lake, monkeypatch):
    """Groups are named by a 64-bit hash; files are skipped by the changed groups' key values. A group
    sharing a changed group's hash but not its keys (forced here: a real collision is too rare to meet)
    must stay an ordinary group: its state kept, not dropped while its file goes unread."""
    from datetime import UTC, datetime

    from laminar_assets.engine.flow import job as flow_job
    from laminar_assets.engine.run.plan import ChangedGroups

    engine = Engine(spark, lake.root, options=EngineOptions(group_refill_share=0.9))  # 2 of ~4 groups: by group
    lake.create("trades", [t for t in many_trades(60) if t[1] == "a"])
    for sym in "bcd":
        lake.append("trades", [t for t in many_trades(60) if t[1] == sym])
    engine.run(distincts(), PART)
    micros = int(datetime(2024, 1, 1, 0, 10, tzinfo=UTC).timestamp() * 1_000_000)
    d_hash = spark.sql(f"SELECT xxhash64(timestamp_micros({micros}), 'd') AS h").first()["h"]  # group (00:10, 'd')
    real = flow_job.changed_groups

    def colliding(*args):
        found = real(*args)
        return {k: ChangedGroups(g.count + 1, (*g.hashes, d_hash), g.values) for k, g in found.items()}

    monkeypatch.setattr(flow_job, "changed_groups", colliding)
    lake.update("trades", {"px": "100.0"}, "qty = 13")  # (00:10, 'b')
    r = engine.run(distincts(), PART)
    assert d_hash in r.plan.refill_groups and r.plan.group_keys == (("b",),), r.detail
    assert r.metrics["files_read"] == 1  # d's file is not read
    check(spark, lake, distincts())
