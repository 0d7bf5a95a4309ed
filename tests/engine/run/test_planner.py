"""The planner is a pure function: each reason from a constructed situation, no Spark, no files."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime

import pytest

from laminar_assets.checkpoints import Watermark
from laminar_assets.engine import Agg, FlowSpec, Hopping, LatePolicy, Mode, Reason, StageSpec, Tumbling
from laminar_assets.engine.delta.tables import CommitKind, CommitSummary, DataFile, SourceHistory
from laminar_assets.engine.run.planner import PlannerInput, plan_partition
from laminar_assets.engine.spec.specs import DimensionJoin
from laminar_assets.engine.windows import Interval

T0 = datetime(2024, 1, 1, tzinfo=UTC)
PART = "2024-01-01-00:00"
RETRACT = FlowSpec(name="f", source="src", event_time="ts", window=Tumbling("10m"), keys=("k",),
                   aggregates=(Agg.sum("x"), Agg.count()))
NON_RETRACTABLE = FlowSpec(name="f", source="src", event_time="ts", window=Tumbling("10m"), keys=("k",),
                            aggregates=(Agg.count_distinct("x"),))


def at(minute: int, second: int = 0) -> datetime:
    return T0.replace(minute=minute % 60, hour=minute // 60, second=second)


def file(lo: int, hi: int, rows: int = 10) -> DataFile:
    return DataFile(uri=f"mem://{lo}-{hi}", rows=rows, size=100, time_range=Interval(at(lo), at(hi)))


def commit(version: int, kind: CommitKind, *files: DataFile, ts: datetime = T0) -> CommitSummary:
    if kind is CommitKind.CHANGE_DATA:
        return CommitSummary(version, ts, "DELETE", kind, cdc=files)
    if kind is CommitKind.REWRITE:
        return CommitSummary(version, ts, "DELETE", kind, removes=files, adds=files)
    return CommitSummary(version, ts, "WRITE", kind, adds=files)


def history(*commits: CommitSummary, start: int = 3, expired: str | None = None) -> SourceHistory:
    latest = commits[-1].version if commits else start
    return SourceHistory("src", "mem://src", start, latest, tuple(commits), expired)


def mark(spec=RETRACT, version: int = 3, **kw) -> Watermark:
    return Watermark(spec.name, PART, spec.spec_hash, {"src": version, **kw.pop("extra", {})}, 1, **kw)


def plan(spec=RETRACT, watermark=None, hist=None, **kw):
    hist = hist if hist is not None else history()
    return plan_partition(PlannerInput(spec=spec, partition=PART, watermark=watermark, histories={"src": hist}, **kw))


def test_no_watermark_refills_whole_partition():
    p = plan(watermark=None)
    assert (p.mode, p.reason, p.refill_all) == (Mode.REFILL, Reason.NO_WATERMARK, True)


def test_append_only_is_incremental():
    p = plan(watermark=mark(), hist=history(commit(4, CommitKind.APPEND, file(1, 2)), commit(5, CommitKind.APPEND, file(3, 4))))
    assert (p.mode, p.reason) == (Mode.INCREMENTAL, Reason.APPEND_ONLY)
    assert p.incremental_versions == {"src": (4, 5)}
    assert p.to_versions == {"src": 5} and p.from_versions == {"src": 3}


def test_retractable_changes_stay_incremental():
    p = plan(watermark=mark(), hist=history(commit(4, CommitKind.CHANGE_DATA, file(1, 2))))
    assert (p.mode, p.reason) == (Mode.INCREMENTAL, Reason.RETRACTABLE_CHANGES)


def test_delete_under_non_retractable_refills_only_touched_windows():
    p = plan(NON_RETRACTABLE, mark(NON_RETRACTABLE), history(commit(4, CommitKind.APPEND, file(1, 2)),
                                              commit(5, CommitKind.CHANGE_DATA, file(21, 22))))
    assert (p.mode, p.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE)
    assert p.refill == (Interval(at(20), at(30)),) and not p.refill_all
    assert p.incremental_versions == {"src": (4,)}  # the append still merges into the other windows
    assert "count_distinct" in p.detail and "commit 5" in p.detail


def test_changes_under_extremes_merge():
    """min, max, first, last, min_by and max_by retract (until no row holds the extreme: the run
    then recomputes that window, tests/engine/test_reasons.py)."""
    spec = FlowSpec(name="e", source="src", event_time="ts", window=Tumbling("10m"), keys=("k",),
                    aggregates=(Agg.min("x"), Agg.max("x"), Agg.first("x"), Agg.last("x"), Agg.min_by("x", "y"),
                                Agg.max_by("x", "y")))
    p = plan(spec, mark(spec), history(commit(4, CommitKind.CHANGE_DATA, file(21, 22))))
    assert (p.mode, p.reason) == (Mode.INCREMENTAL, Reason.RETRACTABLE_CHANGES)


HIGHS = FlowSpec(name="e", source="src", event_time="ts", window=Tumbling("10m"), keys=("k",),
                aggregates=(Agg.max("x"), Agg.last("x")))


# The touched window (20-30) is 1 of the partition's 6 and holds a sixth of its 6 MB: recomputing it up front
# reads 1 MB. Merging first reads the change (100 bytes) and no state; a pass costs 0.5 s and 1 MB takes 1 s.
COSTS = dict(partition_bytes={"src": 6_000_000}, state_bytes=0, pass_seconds=0.5, scan_bytes_per_second=1e6,
             extreme_refill="cost")


@pytest.mark.parametrize("changed_rows, groups, pass_seconds, expected", [
    # L = 2 extremes x 60 groups x changed/600 rows expected lost; P(some) = 1 - exp(-L); up front 0.5 + 1.0 s;
    # merging first 0.5 s, then with P(some) a second pass of 0.5 s + (1 - exp(-L)) x 1 MB read
    (1, 60, 0.5, Mode.INCREMENTAL),  # L 0.2: 0.5 + 18% x 0.68 = 0.62 s against 1.5
    (6, 60, 0.5, Mode.INCREMENTAL),  # L 1.2: 0.5 + 70% x 1.20 = 1.34 s against 1.5
    (6, 60, 2.0, Mode.REFILL),  # the same with passes of 2 s: 2 + 70% x 2.70 = 3.89 s against 3.0
    (60, 60, 0.5, Mode.REFILL),  # L 12, a group surely loses one: 0.5 + 1.5 = 2.0 s against 1.5
    (6, 6, 0.5, Mode.INCREMENTAL),  # L 0.12: 0.5 + 11% x 0.61 = 0.57 s against 1.5
])
def test_extremes_are_recomputed_up_front_when_that_is_expected_to_cost_less(changed_rows, groups, pass_seconds,
                                                                             expected):
    hist = history(commit(4, CommitKind.CHANGE_DATA, file(21, 22, rows=changed_rows)))
    p = plan(HIGHS, mark(HIGHS), hist, state_groups=groups, partition_rows=600, **{**COSTS, "pass_seconds": pass_seconds})
    assert p.mode is expected
    assert "expected cost of merging first" in p.detail and "of recomputing the 1 touched window(s) up front" in p.detail
    if expected is Mode.REFILL:
        assert p.reason is Reason.EXTREME_RETRACTED and p.detail.startswith("recomputing the windows")
        assert p.refill == (Interval(at(20), at(30)),) and p.incremental_versions == {"src": ()}
    else:
        assert p.reason is Reason.RETRACTABLE_CHANGES and "; merging first: " in p.detail
    # without the estimate's inputs, or merging first asked for, or strict: always merge first
    assert plan(HIGHS, mark(HIGHS), hist).mode is Mode.INCREMENTAL
    assert plan(HIGHS, mark(HIGHS), hist, **{**COSTS, "state_groups": groups}).mode is Mode.INCREMENTAL  # no rows
    assert plan(HIGHS, mark(HIGHS), hist, state_groups=groups, partition_rows=600,
                **{**COSTS, "extreme_refill": "merge"}).mode is Mode.INCREMENTAL
    strict = replace(HIGHS, refresh="incremental_strict")
    assert plan(strict, mark(strict), hist, state_groups=groups, partition_rows=600, **COSTS).mode is Mode.INCREMENTAL
    # "windows": up front whatever the estimate, and without its inputs
    p = plan(HIGHS, mark(HIGHS), hist, extreme_refill="windows")
    assert (p.mode, p.reason, p.refill) == (Mode.REFILL, Reason.EXTREME_RETRACTED, (Interval(at(20), at(30)),))
    assert "extreme_refill is 'windows'" in p.detail


def test_the_second_pass_of_merging_first_reads_only_the_windows_expected_to_lose_an_extreme():
    # changes in 3 of 6 windows (20-50): L = 2 x 60 x 3/600 = 0.6, some group loses one with P = 45%, in
    # ~1 - exp(-0.6/3) = 18% of the 3 MB of the touched windows: 0.5 + 45% x (0.5 + 0.54) = 0.97 s against 3.5
    hist = history(commit(4, CommitKind.CHANGE_DATA, file(21, 22, rows=1), file(31, 32, rows=1), file(41, 42, rows=1)))
    p = plan(HIGHS, mark(HIGHS), hist, state_groups=60, partition_rows=600, **COSTS)
    assert (p.mode, p.reason) == (Mode.INCREMENTAL, Reason.RETRACTABLE_CHANGES)
    assert "merging first ~0.97s" in p.detail and "3 touched window(s) up front ~3.50s" in p.detail, p.detail
    # every pass that keeps windows reads the partition's state, so merging first reads it twice with P = 45 %:
    # with 8 MB of it, 0.5 + 8 + 45% x (0.5 + 8 + 0.54) = 12.58 s against 0.5 + 3 + 8 = 11.5 up front
    p = plan(HIGHS, mark(HIGHS), hist, state_groups=60, partition_rows=600, **{**COSTS, "state_bytes": 8_000_000})
    assert "merging first ~12.58s" in p.detail and "up front ~11.50s" in p.detail, p.detail
    assert (p.mode, p.reason) == (Mode.REFILL, Reason.EXTREME_RETRACTED), p.detail


@pytest.mark.parametrize("found, expected_groups", [((11, 12), (11, 12)), ((11, 12, 13, 14, 15, 16), ())])
def test_changes_under_non_retractable_recompute_their_groups_unless_most_of_the_windows(found, expected_groups):
    # 60 groups over the partition's 6 windows: the 2 touched windows hold ~20
    hist = history(commit(4, CommitKind.APPEND, file(1, 2)), commit(5, CommitKind.CHANGE_DATA, file(21, 32)))
    p = plan(NON_RETRACTABLE, mark(NON_RETRACTABLE), hist, changed_groups=found, group_refill_share=0.25,
             state_groups=60)
    assert (p.mode, p.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE)
    assert p.refill_groups == expected_groups and p.incremental_versions == {"src": (4,)}
    if expected_groups:
        assert p.refill == () and p.group_windows == (Interval(at(20), at(40)),)
        assert "2 of ~20 group(s) in 2 window(s) recomputed" in p.detail
    else:
        assert p.refill == (Interval(at(20), at(40)),) and p.group_windows == ()
        assert "6 of ~20 group(s) changed, the windows are recomputed" in p.detail


def test_escalated_groups_add_to_what_the_plan_merges():
    hist = history(commit(4, CommitKind.CHANGE_DATA, file(21, 22)))
    p = plan(HIGHS, mark(HIGHS), hist, escalation=Reason.EXTREME_RETRACTED, escalation_scope=(Interval(at(20), at(30)),),
             escalation_groups=(7, 3))
    assert (p.mode, p.reason) == (Mode.REFILL, Reason.EXTREME_RETRACTED)
    assert p.refill_groups == (3, 7) and p.group_windows == (Interval(at(20), at(30)),) and p.refill == ()
    assert p.incremental_versions == {"src": (4,)}  # every other group still merges the commit
    assert "2 group(s) recomputed" in p.detail


def test_an_escalation_of_a_bounded_run_whose_snapshot_was_vacuumed_refills_at_the_latest_version():
    base = history(commit(4, CommitKind.CHANGE_DATA, file(21, 22)), commit(5, CommitKind.APPEND, file(1, 2)))
    hist = replace(base, snapshot_gone=((5, "part-0.parquet"),))
    bounded = replace(HIGHS, max_versions_per_run=1)
    p = plan(bounded, mark(bounded), hist, escalation=Reason.EXTREME_RETRACTED,
             escalation_scope=(Interval(at(20), at(30)),), escalation_groups=(7,))
    assert (p.mode, p.reason, p.refill_all) == (Mode.REFILL, Reason.CHECKPOINT_EXPIRED, True)
    assert p.to_versions == {"src": 5} and "vacuumed" in p.detail


def test_a_delete_whose_rows_the_flow_leaves_out_recomputes_nothing():
    hist = history(commit(4, CommitKind.CHANGE_DATA, file(21, 22)))
    p = plan(NON_RETRACTABLE, mark(NON_RETRACTABLE), hist, changed_groups=(), group_refill_share=0.5, state_groups=60)
    assert (p.mode, p.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE)
    assert (p.refill, p.refill_groups, p.group_windows, p.refill_all) == ((), (), (), False)
    assert "nothing is recomputed" in p.detail


def test_an_update_counts_half_of_its_change_rows_as_retracted():
    # 120 change rows of an UPDATE: 60 pre-images retracted; 2 x 6 x 60/600 = 1.2 expected losses (70%): merging
    # first, 1.34 s expected against 1.5; as a DELETE of 120 rows 2.4 (91%): 1.78 s, recomputed up front
    cdc = (file(21, 22, rows=120),)
    update = history(CommitSummary(4, T0, "UPDATE", CommitKind.CHANGE_DATA, cdc=cdc))
    p = plan(HIGHS, mark(HIGHS), update, state_groups=6, partition_rows=600, **COSTS)
    assert p.mode is Mode.INCREMENTAL and "~1.2 extreme(s) expected to be lost" in p.detail, p.detail
    delete = history(CommitSummary(4, T0, "DELETE", CommitKind.CHANGE_DATA, cdc=cdc))
    p = plan(HIGHS, mark(HIGHS), delete, state_groups=6, partition_rows=600, **COSTS)
    assert (p.mode, p.reason) == (Mode.REFILL, Reason.EXTREME_RETRACTED) and "~2.4 extreme(s)" in p.detail, p.detail


def test_hopping_refill_scope_covers_every_window_holding_the_change():
    spec = FlowSpec(name="h", source="src", event_time="ts", window=Hopping("30m", "10m"),
                    aggregates=(Agg.count_distinct("x"),))
    p = plan(spec, mark(spec), history(commit(4, CommitKind.CHANGE_DATA, file(25, 26))))
    assert p.refill == (Interval(at(0), at(30)),)  # windows starting 00:00, 00:10, 00:20


def test_rewrite_without_change_data_refills():
    p = plan(watermark=mark(), hist=history(commit(4, CommitKind.REWRITE, file(5, 6))))
    assert (p.mode, p.reason) == (Mode.REFILL, Reason.REWRITE_WITHOUT_CHANGE_DATA)
    assert "enableChangeDataFeed" in p.detail


def test_unknown_time_range_refills_whole_partition():
    unknown = DataFile(uri="mem://x", rows=1, size=1, time_range=None)
    p = plan(NON_RETRACTABLE, mark(NON_RETRACTABLE), history(commit(4, CommitKind.CHANGE_DATA, unknown)))
    assert p.refill_all and p.reason is Reason.NON_APPEND_ON_NON_RETRACTABLE


def test_expired_history_refills():
    p = plan(watermark=mark(), hist=history(expired="commit 4 is gone"))
    assert (p.mode, p.reason) == (Mode.REFILL, Reason.CHECKPOINT_EXPIRED)


def test_spec_change_refills():
    old = mark().with_(spec_hash="0123456789abcdef")
    assert plan(watermark=old).reason is Reason.SPEC_CHANGED


def test_failed_attempt_refills():
    assert plan(watermark=mark(failed_attempt="boom")).reason is Reason.PREVIOUS_ATTEMPT_FAILED


def test_policy_full_and_forced():
    full = FlowSpec(name="f", source="src", event_time="ts", window=Tumbling("10m"), keys=("k",),
                    aggregates=(Agg.sum("x"), Agg.count()), refresh="full")
    assert plan(full, mark(full)).reason is Reason.FORCED_BY_POLICY
    assert plan(watermark=mark(), force=True).reason is Reason.FORCED_BY_USER


def test_schema_change_refills():
    p = plan(watermark=mark(input_schema={"x": "int"}), input_schema={"x": "bigint"})
    assert p.reason is Reason.SCHEMA_CHANGED and "int -> bigint" in p.detail


def test_dimension_change_refills():
    stage = StageSpec(name="s", source="src", event_time="ts",
                      joins=(DimensionJoin("dim", on=("k",), columns=("v",)),))
    same = plan(stage, mark(stage, extra={"dim": 2}), dimension_versions={"dim": 2})
    assert same.reason is Reason.NO_NEW_VERSIONS
    moved = plan(stage, mark(stage, extra={"dim": 2}), dimension_versions={"dim": 3})
    assert (moved.mode, moved.reason) == (Mode.REFILL, Reason.DIMENSION_CHANGED)
    # recreated at the same path and back at the same version: another table (its Delta id)
    ids = dict(source_ids={"dim": "old-id"})
    assert plan(stage, mark(stage, extra={"dim": 2}, **ids), dimension_versions={"dim": 2},
                dimension_ids={"dim": "old-id"}).reason is Reason.NO_NEW_VERSIONS
    rebuilt = plan(stage, mark(stage, extra={"dim": 2}, **ids), dimension_versions={"dim": 2},
                   dimension_ids={"dim": "new-id"})
    assert (rebuilt.mode, rebuilt.reason) == (Mode.REFILL, Reason.DIMENSION_CHANGED) and "recreated" in rebuilt.detail


def test_stage_refills_on_deletes():
    stage = StageSpec(name="s", source="src", event_time="ts")
    p = plan(stage, mark(stage), history(commit(4, CommitKind.CHANGE_DATA, file(1, 2))))
    assert p.reason is Reason.NON_APPEND_ON_NON_RETRACTABLE


def test_no_new_versions_and_no_changes_in_partition():
    assert plan(watermark=mark()).reason is Reason.NO_NEW_VERSIONS
    elsewhere = file(90, 95)  # 01:30 - 01:35, another partition
    p = plan(watermark=mark(), hist=history(commit(4, CommitKind.APPEND, elsewhere)))
    assert (p.mode, p.reason) == (Mode.NOOP, Reason.NO_CHANGES_IN_PARTITION)
    assert p.to_versions == {"src": 4}  # the watermark still moves past the irrelevant version
    assert p.other_partitions == ("2024-01-01-01:00",)


def test_a_file_reaching_year_9999_names_a_bounded_list_of_other_partitions(monkeypatch):
    """One row dated 9999 (or year 1) makes a file's range span millennia: the plan listed every hour of
    it as another partition touched and ran the run out of memory."""
    from laminar_assets.engine.run import planner
    from laminar_assets.engine.windows import closed_range

    def partitions_overlapping(events, granularity, **kw):
        assert kw.get("limit") is not None and kw["limit"] <= 200, f"asked to list every partition of {events}"
        return real(events, granularity, **kw)

    real = planner.partitions_overlapping
    monkeypatch.setattr(planner, "partitions_overlapping", partitions_overlapping)
    far = DataFile(uri="mem://far", rows=2, size=100, time_range=closed_range(datetime(1, 1, 1, tzinfo=UTC),
                                                                             datetime.max.replace(tzinfo=UTC)))
    p = plan(watermark=mark(), hist=history(commit(4, CommitKind.APPEND, far)))
    assert (p.mode, p.reason) == (Mode.INCREMENTAL, Reason.APPEND_ONLY)
    assert len(p.other_partitions) == 100 and p.other_partitions[0] == "1000-01-01-00:00" and p.other_partitions_unknown


def test_layout_only_commits_change_nothing():
    compaction = CommitSummary(4, T0, "OPTIMIZE", CommitKind.LAYOUT)
    assert plan(NON_RETRACTABLE, mark(NON_RETRACTABLE), history(compaction)).reason is Reason.NO_CHANGES_IN_PARTITION


@pytest.mark.parametrize("limits,expected_to,expected_pending", [
    ({"max_versions_per_run": 2}, 5, 2),
    ({"max_rows_per_run": 25}, 5, 2),  # 10 + 10 rows fit, the third commit would pass 25
    ({"max_rows_per_run": 1}, 4, 3),  # always at least one commit
])
def test_bounded_work_leaves_versions_pending(limits, expected_to, expected_pending):
    spec = FlowSpec(name="f", source="src", event_time="ts", window=Tumbling("10m"), keys=("k",),
                    aggregates=(Agg.sum("x"), Agg.count()), **limits)
    hist = history(*[commit(v, CommitKind.APPEND, file(1, 2)) for v in range(4, 8)])
    p = plan(spec, mark(spec), hist)
    assert p.to_versions == {"src": expected_to}
    assert p.pending_versions == {"src": expected_pending}


def test_a_bounded_run_goes_past_versions_where_a_read_column_had_another_type_family():
    """Issue 66: versions 5 and 6 hold `x` as text between doubles (`SourceHistory.foreign`). A run
    bounded to one version stopped at 5 and read it with its schema; the bound now takes the run on
    to 7, the first version after it with today's types, and says so. Version 4 (today's types)
    is a stop like any other."""
    spec = replace(RETRACT, max_versions_per_run=1)
    hist = replace(history(*[commit(v, CommitKind.APPEND, file(31, 32)) for v in range(4, 9)]), foreign=(5, 6))
    assert plan(spec, mark(spec), hist).to_versions == {"src": 4}
    p = plan(spec, mark(spec, version=4), hist.after(4))
    assert p.to_versions == {"src": 7} and p.pending_versions == {"src": 1}
    assert (p.mode, p.reason) == (Mode.INCREMENTAL, Reason.APPEND_ONLY) and p.incremental_versions == {"src": (5, 6, 7)}
    assert "would stop at version 5 of 'src'" in p.detail and "goes on to version 7" in p.detail


def test_frozen_partition_ignores_late_changes():
    spec = FlowSpec(name="f", source="src", event_time="ts", window=Tumbling("10m"), keys=("k",),
                    aggregates=(Agg.sum("x"),), late=LatePolicy(freeze_after="1d"))
    late = commit(4, CommitKind.APPEND, file(1, 2), ts=datetime(2024, 1, 5, tzinfo=UTC))
    p = plan(spec, mark(spec), history(late))
    assert (p.mode, p.reason) == (Mode.NOOP, Reason.PARTITION_FROZEN)
    fresh = commit(4, CommitKind.APPEND, file(1, 2), ts=datetime(2024, 1, 1, 12, tzinfo=UTC))
    assert plan(spec, mark(spec), history(fresh)).reason is Reason.APPEND_ONLY


def test_plan_is_frozen_and_serialises():
    p = plan(watermark=mark(), hist=history(commit(4, CommitKind.APPEND, file(1, 2))))
    with pytest.raises(AttributeError):
        p.mode = Mode.NOOP  # type: ignore[misc]
    data = p.to_json()
    assert data["mode"] == "INCREMENTAL" and data["reason"] == "APPEND_ONLY"


STAGE = StageSpec(name="s", source="src", event_time="ts", dedup_key=("id",))


@pytest.mark.parametrize("found, keyed", [((11, 5), True), (tuple(range(30)), False)])
def test_a_stage_recomputes_its_changed_keys_unless_they_are_most_of_its_rows(found, keyed):
    hist = history(commit(4, CommitKind.APPEND, file(1, 2)), commit(5, CommitKind.CHANGE_DATA, file(21, 32)))
    p = plan(STAGE, mark(STAGE), hist, changed_groups=found, group_refill_share=0.5, state_groups=40)
    assert (p.mode, p.reason) == (Mode.REFILL, Reason.NON_APPEND_ON_NON_RETRACTABLE)
    assert p.incremental_versions == {"src": (4,)}
    if keyed:  # the other keys' new rows merge as appends
        assert (p.refill_groups, p.group_windows, p.refill) == ((5, 11), (Interval(at(0), at(60)),), ())
        assert "2 key(s) of 40 output row(s) recomputed" in p.detail
    else:
        assert (p.refill_groups, p.refill, p.refill_all) == ((), (Interval(at(0), at(60)),), True)
        assert "30 key(s) changed of 40 output row(s), the partition is recomputed" in p.detail


def test_a_stage_change_whose_rows_it_leaves_out_recomputes_nothing():
    hist = history(commit(4, CommitKind.CHANGE_DATA, file(21, 22)))
    p = plan(STAGE, mark(STAGE), hist, changed_groups=(), group_refill_share=0.5, state_groups=40)
    assert (p.refill, p.refill_groups, p.refill_all) == ((), (), False) and "nothing is recomputed" in p.detail


def test_a_commit_that_widened_a_read_column_refills_with_schema_changed():
    """Delta type widening (`SourceHistory.widened`): state built before the widening is recomputed, not
    merged with rows read under the new type, even when the column is not one whose type the input schema
    holds (a filter's); a watermark after the widening merges as usual."""
    filtered = replace(RETRACT, filter="q > 0")
    why = "column 'q' of 'src' was widened from integer to long at version 4"
    hist = replace(history(commit(4, CommitKind.METADATA), commit(5, CommitKind.APPEND, file(1, 2))),
                   widened=((4, why),))
    p = plan(filtered, mark(filtered), hist)
    assert (p.mode, p.reason, p.refill_all) == (Mode.REFILL, Reason.SCHEMA_CHANGED, True) and why in p.detail
    p = plan(filtered, mark(filtered, version=4), hist.after(4))
    assert (p.mode, p.reason) == (Mode.INCREMENTAL, Reason.APPEND_ONLY)
