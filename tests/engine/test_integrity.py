"""Lake integrity: no run deletes a file a commit names, no vacuum wedges a flow, no uncommitted file is
left behind, and a failure says what it did. Regressions of issue #44, through the public API."""

from __future__ import annotations

import os

import pandas as pd
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_assets.engine import Agg, Engine, FlowSpec, Mode, Reason, RunFailedError, Tumbling
from tests.conftest import Lake
from tests.lake_invariants import assert_lake_intact, assert_no_orphans
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

H0, H1 = "2024-01-01-00:00", "2024-01-01-01:00"


def _matches_recompute(spark, lake: Lake, flow: FlowSpec) -> None:
    expected = full_recompute(spark, flow, lake.table(flow.sources[0]).to_pyarrow_table())
    assert_frames_match(lake.read(flow.sink), expected, flow.keys)


def test_passes_of_one_run_never_delete_each_others_committed_files(spark, lake):
    """Partitions at different watermarks under a work bound get different target versions, so one
    run makes two passes. The second pass used to write into the first one's folder, deleting the
    files the first had just committed: the sink then named missing files."""
    flow = FlowSpec(name="per_minute", source="trades", event_time="ts", window=Tumbling("1m"), keys=(),
                    aggregates=(Agg.sum("px"),), max_versions_per_run=1)
    engine = Engine(spark, lake.root)
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 01:01:00", "a", 2.0, 1)])
    engine.run_many(flow, [H0, H1])
    lake.append("trades", [("2024-01-01 00:02:00", "a", 3.0, 1), ("2024-01-01 01:02:00", "a", 4.0, 1)])
    engine.run_many(flow, [H1])  # H1 at v1, H0 still at v0
    lake.append("trades", [("2024-01-01 00:03:00", "a", 5.0, 1), ("2024-01-01 01:03:00", "a", 6.0, 1)])
    lake.append("trades", [("2024-01-01 00:04:00", "a", 7.0, 1), ("2024-01-01 01:04:00", "a", 8.0, 1)])

    results = engine.run_many(flow, [H0, H1])
    assert [r.plan.to_versions["trades"] for r in results] == [1, 2]  # two passes in one run
    DeltaTable(lake.path("per_minute")).to_pyarrow_table()  # raised FileNotFoundError before the fix
    assert_lake_intact(lake.root)
    assert_no_orphans(lake.root, ["per_minute"])
    assert all(t.ok for t in engine.integrity(flow))
    while any(r.mode is not Mode.NOOP for r in engine.run_many(flow, [H0, H1])):
        pass
    _matches_recompute(spark, lake, flow)


def _trades(rows) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["id", "ts", "sym", "venue", "account", "px"])
    df["ts"] = pd.to_datetime(df["ts"], utc=True).astype("datetime64[us, UTC]")
    return df


def test_a_sweep_whose_history_was_vacuumed_sweeps_the_snapshot(spark, tmp_path):
    """A source partitioned by venue, without change data: an update and deletes rewrite files, a
    vacuum removes them. The sweep read the rewritten files of those commits and failed on every run
    (PATH_NOT_FOUND), so the flow never caught up. It now sweeps the latest snapshot, says why, and
    records no row twice."""
    root = str(tmp_path / "lake")
    src = os.path.join(root, "trades")
    ids = iter(range(1, 1000))

    def rows(n, extra=()):
        out = []
        for _ in range(n):
            i = next(ids)
            out.append((i, f"2024-01-01 00:{(i * 7) % 60:02d}:00", "ab"[i % 2], ("XNYS", "XNAS")[i % 2], f"acc{i % 3}",
                        float(i)))
        return _trades(out + list(extra))

    write_deltalake(src, rows(6), partition_by=["venue"],
                    configuration={"delta.logRetentionDuration": "interval 0 seconds"})
    flows = [FlowSpec(name="by_sym", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                      aggregates=(Agg.sum("px"), Agg.max("px"))),
             FlowSpec(name="by_account", source="trades", event_time="ts", window=Tumbling("10m"), keys=("account",),
                      aggregates=(Agg.count(),))]
    engine = Engine(spark, root)
    dt = DeltaTable(src)
    dt.create_checkpoint()
    dt.cleanup_metadata()
    write_deltalake(src, rows(4), mode="append")
    write_deltalake(src, rows(4, [(501, None, "a", "XNYS", "x", 3.0)]), mode="append")  # no event time: swept
    DeltaTable(src).delete("sym = 'a' AND ts < '2024-01-01 00:20:00'")
    for flow in flows:
        engine.run(flow, H0)  # swept up to v3
    DeltaTable(src).update(updates={"account": "NULL"}, predicate="id % 3 = 0")  # rewrites, the swept row too
    DeltaTable(src).delete("id = 5")
    DeltaTable(src).delete("id = 8")
    write_deltalake(src, rows(4), mode="append")
    assert DeltaTable(src).vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)  # v8, v9

    for flow in flows:
        first = engine.run(flow, H0)
        assert first.mode is Mode.REFILL
        assert first.sweep is not None and first.sweep.reason is Reason.CHECKPOINT_EXPIRED
        assert "snapshot at version 9" in first.sweep.detail and "vacuumed" in first.sweep.detail
        assert engine.run(flow, H0).mode is Mode.NOOP  # caught up
        lake = Lake(root)
        expected = full_recompute(spark, flow, DeltaTable(src).to_pyarrow_table())
        assert_frames_match(lake.read(flow.sink), expected, flow.keys)
    quarantine = DeltaTable(os.path.join(root, "_laminar", "quarantine", "trades")).to_pandas()
    assert not quarantine.duplicated(["flow", "partition", "rule", "row"]).any()
    swept = quarantine[quarantine["partition"].isna()]
    # the row without an event time, as appended and as the update left it (account NULL): once each
    assert len(swept[swept["flow"] == "by_sym"]) == 2
    assert_lake_intact(root)


def test_a_bounded_refill_never_reads_a_vacuumed_snapshot(spark, lake, engine):
    """A work bound makes a refill read the snapshot at an older version; a vacuum may have removed
    files it names. The run used to fail once (PATH_NOT_FOUND) before refilling; now it plans a refill
    at the latest version and says why."""
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.max("px"),), max_versions_per_run=1)
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 00:11:00", "b", 2.0, 2)], cdf=False)
    engine.run(flow, H0)
    lake.delete("trades", "qty = 1")
    lake.append("trades", [("2024-01-01 00:03:00", "a", 5.0, 3)])
    lake.delete("trades", "qty = 2")
    lake.compact("trades")
    lake.table("trades").vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)

    result = engine.run(flow, H0)
    assert (result.mode, result.reason) == (Mode.REFILL, Reason.CHECKPOINT_EXPIRED)
    assert "the snapshot at version 1 of 'trades' names files that were vacuumed" in result.detail
    assert result.plan.to_versions == {"trades": lake.table("trades").version()}
    _matches_recompute(spark, lake, flow)


FLOW = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("px")))
BASE = [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 01:05:00", "b", 2.0, 2)]


def fail_at(step, error):
    def hook(current):
        if current == step:
            raise error
    return hook


@pytest.mark.parametrize("step", ["after_read", "after_state_commit", "after_sink_commit"])
def test_a_failed_pass_leaves_no_uncommitted_files_and_keeps_what_it_committed(spark, lake, step):
    lake.create("trades", BASE)
    Engine(spark, lake.root).run_many(FLOW, [H0, H1])
    lake.append("trades", [("2024-01-01 00:02:00", "a", 3.0, 3), ("2024-01-01 01:06:00", "b", 4.0, 4),
                           (None, "c", 1.0, 1)])
    with pytest.raises(RunFailedError, match="disk full"):
        Engine(spark, lake.root, hook=fail_at(step, OSError("disk full"))).run_many(FLOW, [H0, H1])
    assert_lake_intact(lake.root)
    assert_no_orphans(lake.root, ["f"])
    again = Engine(spark, lake.root).run_many(FLOW, [H0, H1])
    if step == "after_read":  # nothing landed: refilled, and the reason says what failed
        assert all(r.reason is Reason.PREVIOUS_ATTEMPT_FAILED and "disk full" in r.detail for r in again)
    else:  # the state landed: the rerun completes it (its sink re-derived if need be)
        assert all(r.mode is Mode.NOOP for r in again)
    _matches_recompute(spark, lake, FLOW)
    assert_no_orphans(lake.root, ["f"])


def test_a_bug_in_a_pass_propagates_as_it_is_and_the_next_run_recovers(spark, lake):
    """Only failures a retry can cure become failed attempts; a bug (here a KeyError) is not turned
    into a normal RunFailedError. The intent it left is settled by the next run, as after a crash."""
    lake.create("trades", BASE)
    Engine(spark, lake.root).run_many(FLOW, [H0, H1])
    lake.append("trades", [("2024-01-01 00:02:00", "a", 3.0, 3)])
    with pytest.raises(KeyError, match="a bug"):
        Engine(spark, lake.root, hook=fail_at("after_read", KeyError("a bug"))).run(FLOW, H0)
    assert_no_orphans(lake.root, ["f"])
    again = Engine(spark, lake.root).run(FLOW, H0)
    assert again.reason is Reason.PREVIOUS_ATTEMPT_FAILED and "stopped before it committed" in again.detail
    _matches_recompute(spark, lake, FLOW)


def test_a_failure_message_is_true_for_each_partition(spark, lake):
    """A pass that fails after the first partition's watermark moved says so, instead of claiming
    no watermark moved; only the partitions left behind are marked as failed."""
    lake.create("trades", BASE)
    eve = "2023-12-31-23:00"  # the day before H0: its watermark is another block's, written first
    with pytest.raises(RunFailedError) as info:
        Engine(spark, lake.root, hook=fail_at("after_first_watermark", OSError("disk full"))).run_many(FLOW, [eve, H0, H1])
    message = str(info.value)
    assert f"the watermark of partition(s) {H0}, {H1} did not move" in message
    assert f"partition(s) {eve} finished before the failure" in message
    engine = Engine(spark, lake.root)
    assert engine.store.load("f", eve).failed_attempt is None
    assert engine.store.load("f", H0).failed_attempt == engine.store.load("f", H1).failed_attempt == "disk full"
    results = engine.run_many(FLOW, [H0, H1])  # their commits landed: the rerun completes their watermarks
    assert [r.mode for r in results] == [Mode.NOOP, Mode.NOOP]
    _matches_recompute(spark, lake, FLOW)
