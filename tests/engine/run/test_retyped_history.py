"""A source column retyped and then restored: the commits in between hold files no read with the
current schema can open. The run refills from the latest snapshot (SCHEMA_CHANGED_HISTORY) and the
sweep sweeps it, instead of failing on every run (issue 66)."""

from __future__ import annotations

import pytest
from deltalake import write_deltalake

from laminar_assets.engine import Agg, FlowSpec, Mode, Reason, RowRule, SchemaMismatchError, Tumbling
from laminar_assets.engine.delta.tables import SourceHistory
from tests.conftest import trades_frame
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

PART = "2024-01-01-00:00"
FLOW = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("px")))


def retype_then_restore(lake, engine, *, null_time: bool, append_retyped: bool = False) -> None:
    """v0 price double (run), v1 price string (refused), [v2 more string rows (refused)], then the type
    restored by an overwrite and good rows appended."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 00:02:00", "b", 2.0, 1)])
    engine.run(FLOW, PART)
    bad = [("2024-01-01 00:03:00", "a", 3.0, 1)] + ([(None, "a", 9.0, 1)] if null_time else [])
    write_deltalake(lake.path("trades"), trades_frame(bad).astype({"px": "string"}), mode="overwrite",
                    schema_mode="overwrite")
    with pytest.raises(SchemaMismatchError, match="needs a numeric column, found string"):
        engine.run(FLOW, PART)
    if append_retyped:
        write_deltalake(lake.path("trades"), trades_frame([("2024-01-01 00:04:00", "a", 4.0, 1)]).astype(
            {"px": "string"}), mode="append")
    write_deltalake(lake.path("trades"), trades_frame([("2024-01-01 00:05:00", "a", 5.0, 1)]), mode="overwrite",
                    schema_mode="overwrite")
    lake.append("trades", [("2024-01-01 00:06:00", "b", 6.0, 1)])


def check(spark, lake):
    assert_frames_match(lake.read("f"), full_recompute(spark, FLOW, lake.table("trades").to_pyarrow_table()), FLOW.keys)


def test_the_sweep_heals_when_a_retyped_column_is_restored(spark, lake, engine):
    """On main the sweep re-read the string-typed commit on every run ('quarantine sweep of 'f'
    failed: An error occurred while calling o1739.getResult.'), new commits did not help."""
    retype_then_restore(lake, engine, null_time=True)
    r = engine.run(FLOW, PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.SCHEMA_CHANGED_HISTORY)
    assert "column 'px' as string, which the table now has as double" in r.detail
    assert r.sweep.reason is Reason.SCHEMA_CHANGED_HISTORY and "snapshot at version 3" in r.sweep.sources["trades"]
    check(spark, lake)
    lake.append("trades", [("2024-01-01 00:07:00", "b", 1.0, 1)])
    after = engine.run(FLOW, PART)  # swept and merged from the restored version on
    assert (after.mode, after.reason) == (Mode.INCREMENTAL, Reason.APPEND_ONLY)
    assert lake.read("f").set_index("sym")["count"].to_dict() == {"a": 1, "b": 2}


def test_a_retyped_commit_is_refilled_not_merged(spark, lake, engine):
    """The string rows appended while the column was a string would be merged (read with the double
    schema): on main that run failed once with a bare Py4J message before a refill cured it."""
    retype_then_restore(lake, engine, null_time=False, append_retyped=True)
    r = engine.run(FLOW, PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.SCHEMA_CHANGED_HISTORY)
    check(spark, lake)


def test_the_sweep_falls_back_to_the_snapshot_when_a_read_fails_on_a_type(spark, lake, engine, monkeypatch):
    """The backstop: a commit the log check missed fails Spark's read with a type mismatch; the sweep
    then sweeps the latest snapshot instead of failing on every run."""
    monkeypatch.setattr(SourceHistory, "with_retyped", lambda self, now, columns: self, raising=False)
    retype_then_restore(lake, engine, null_time=True)
    r = engine.run(FLOW, PART)
    assert r.sweep.reason is Reason.SCHEMA_CHANGED_HISTORY
    assert "stores column px as BINARY, read as double" in r.sweep.sources["trades"]
    assert engine.run(FLOW, PART).reason is Reason.NO_NEW_VERSIONS
    check(spark, lake)


def test_a_retyped_column_only_a_rule_reads_is_refilled_over(spark, lake, engine):
    """A flow that does not aggregate the price but checks it in a rule reads it too: on main the
    commit appended while it was a string was merged, and the run failed ("[FAILED_READ_FILE.
    PARQUET_COLUMN_DATA_TYPE_MISMATCH] ... Data type mismatches when reading Parquet column [px]")."""
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.count(), Agg.sum("qty")), rules=(RowRule("positive_px", "px > 0"),))
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    engine.run(flow, PART)
    write_deltalake(lake.path("trades"), trades_frame([("2024-01-01 00:03:00", "a", 3.0, 1)]).astype({"px": "string"}),
                    mode="overwrite", schema_mode="overwrite")
    write_deltalake(lake.path("trades"), trades_frame([("2024-01-01 00:04:00", "a", -4.0, 1)]).astype({"px": "string"}),
                    mode="append")
    write_deltalake(lake.path("trades"), trades_frame([("2024-01-01 00:05:00", "a", 5.0, 1)]), mode="overwrite",
                    schema_mode="overwrite")
    lake.append("trades", [("2024-01-01 00:06:00", "b", 6.0, 2)])
    r = engine.run(flow, PART)
    assert (r.mode, r.reason) == (Mode.REFILL, Reason.SCHEMA_CHANGED_HISTORY)
    assert lake.read("f").set_index("sym")["sum_qty"].to_dict() == {"a": 1, "b": 2}


def test_a_bounded_run_does_not_stop_at_a_version_where_a_read_column_had_another_type(spark, lake, engine):
    """Issue 66: under max_versions_per_run, a run of a partition the retyping commits do not touch
    stopped at the version where `px` was text. Its sweep read that version with its schema and the
    rule `px > 0` failed ("quarantine sweep of 'f' failed: [CAST_INVALID_INPUT] ..."), on every run: the
    bound stopped there again, so no partition of the flow ever moved. The bound now takes the text
    versions in the same run, up to one whose schema the flow reads (here the restore)."""
    flow = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.count(), Agg.sum("qty")), rules=(RowRule("positive_px", "px > 0"),),
                    max_versions_per_run=1)
    empty, busy = PART, "2024-01-01-01:00"  # the retyping commits touch only the second hour (and no time)
    lake.create("trades", [("2024-01-01 01:01:00", "a", 1.0, 1)])
    engine.run_many(flow, [empty, busy])
    write_deltalake(lake.path("trades"), trades_frame([("2024-01-01 01:03:00", "a", 3.0, 2), (None, "b", 9.0, 1)])
                    .astype({"px": "string"}), mode="overwrite", schema_mode="overwrite")
    write_deltalake(lake.path("trades"), trades_frame([("2024-01-01 01:05:00", "a", 5.0, 4), (None, "b", -1.0, 1)]),
                    mode="overwrite", schema_mode="overwrite")
    first, second = engine.run_many(flow, [empty, busy])
    assert first.plan.to_versions == {"trades": 2}  # past version 1, where px was text
    assert (second.mode, second.reason) == (Mode.REFILL, Reason.SCHEMA_CHANGED_HISTORY)
    assert second.sweep.reason is Reason.SCHEMA_CHANGED_HISTORY  # the sweep (credited to the partition that
    assert "snapshot at version 2" in second.sweep.sources["trades"]  # worked) swept the latest snapshot
    assert engine.run_many(flow, [empty, busy])[0].reason is Reason.NO_NEW_VERSIONS
    expected = full_recompute(spark, flow, lake.table("trades").to_pyarrow_table())
    assert_frames_match(lake.read("f"), expected, flow.keys)
    assert lake.read("f").set_index("sym")["sum_qty"].to_dict() == {"a": 4}
