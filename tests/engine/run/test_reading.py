"""Which file groups a run reads in one scan, and the role columns of a merged scan's rows."""

from __future__ import annotations

import pytest

from laminar_assets.engine import Agg, Tumbling
from laminar_assets.engine.delta.log import DataFile
from laminar_assets.engine.delta.tables import snapshot_files, table_info
from laminar_assets.engine.quarantine.records import VERSION
from laminar_assets.engine.run.inputs import RunInputs
from laminar_assets.engine.run.reading import DVER, MAX_NAMED_FILES, SNAP, SRC, FileGroup, ReadSet, read_rows, scans
from laminar_assets.engine.spec.specs import FlowSpec

FLOW = FlowSpec(name="vw", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(),))


def f(name: str, **kw) -> DataFile:
    return DataFile(uri=f"/lake/trades/{name}", rows=1, size=10, **kw)


def test_plain_groups_of_a_source_share_one_scan_and_others_keep_their_own():
    a = FileGroup("trades", (f("a.parquet"),), 3, False, read_version=3)
    b = FileGroup("trades", (f("b.parquet"), f("c.parquet")), 4, True, read_version=4)
    snap = FileGroup("trades", (f("d.parquet"),), None, True, read_version=4)
    cdc = FileGroup("trades", (f("e.parquet", change_data=True),), 5, False, True, 5)
    other = FileGroup("dims", (f("x.parquet"),), 2, False, read_version=2)
    assert scans(ReadSet(groups=[a, cdc, b, snap, other])) == [(cdc,), (a, b, snap), (other,)]


@pytest.mark.parametrize("why, groups", [
    ("one group", [FileGroup("trades", (f("a.parquet"),), 3, False, read_version=3)]),
    ("same file name in two folders", [FileGroup("trades", (f("p=1/a.parquet"),), 3, False, read_version=3),
                                       FileGroup("trades", (f("p=2/a.parquet"),), 4, False, read_version=4)]),
    ("a name that needs quoting", [FileGroup("trades", (f("a b'.parquet"),), 3, False, read_version=3),
                                   FileGroup("trades", (f("c.parquet"),), 4, False, read_version=4)]),
    ("too many names to spell out", [FileGroup("trades", tuple(f(f"{i}.parquet") for i in range(MAX_NAMED_FILES)),
                                               3, False, read_version=3),
                                     FileGroup("trades", (f("z.parquet"),), 4, False, read_version=4)]),
])
def test_groups_stay_apart_when_names_cannot_tell_their_roles(why, groups):
    assert scans(ReadSet(groups=groups)) == [(g,) for g in groups]


@pytest.mark.spark
def test_rows_of_a_merged_scan_carry_the_roles_of_their_files(spark, lake):
    """Three commits, three roles (a commit merged, a commit also in the snapshot, snapshot only):
    one scan, and every row knows its commit, whether the snapshot has it, and its read version."""
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    lake.append("trades", [("2024-01-01 00:02:00", "b", 2.0, 2), ("2024-01-01 00:03:00", "b", 2.0, 2)])
    lake.append("trades", [("2024-01-01 00:04:00", "c", 3.0, 3)])
    info = table_info("trades", lake.path("trades"))
    files = sorted(snapshot_files(info, "ts"), key=lambda d: d.time_range.start)
    groups = [FileGroup("trades", (files[0],), None, True, read_version=2),
              FileGroup("trades", (files[1],), 1, False, read_version=1),
              FileGroup("trades", (files[2],), 2, True, read_version=2)]
    reads = ReadSet(groups=groups)
    assert len(scans(reads)) == 1
    inputs = RunInputs(infos={"trades": info}, histories={}, dims={}, input_schema={})
    rows = read_rows(spark, FLOW, reads, inputs).select("sym", SRC, DVER, SNAP, VERSION).collect()
    got = sorted((r["sym"], r[SRC], r[DVER], r[SNAP], r[VERSION]) for r in rows)
    assert got == [("a", "trades", None, True, 2), ("b", "trades", 1, False, 1), ("b", "trades", 1, False, 1),
                   ("c", "trades", 2, True, 2)]


@pytest.mark.spark
def test_roles_of_one_group_scans_and_beside_a_data_column_named_metadata(spark, lake):
    """A one-group scan's rows all take that group's role; the file name comes from the file
    relation's metadata even when the source has a data column of its own called `_metadata`."""
    from tests.conftest import trades_frame

    def frame(rows, tag):
        df = trades_frame(rows)
        df["_metadata"] = tag
        return df

    lake.create("trades", frame=frame([("2024-01-01 00:01:00", "a", 1.0, 1)], "first"))
    lake.append("trades", frame=frame([("2024-01-01 00:02:00", "b", 2.0, 2)], "second"))
    info = table_info("trades", lake.path("trades"))
    files = sorted(snapshot_files(info, "ts"), key=lambda d: d.time_range.start)
    inputs = RunInputs(infos={"trades": info}, histories={}, dims={}, input_schema={})

    def roles(groups):
        rows = read_rows(spark, FLOW, ReadSet(groups=groups), inputs).select("sym", "_metadata", DVER, SNAP, VERSION)
        return sorted(tuple(r) for r in rows.collect())

    assert roles([FileGroup("trades", (files[1],), 1, True, read_version=1)]) == [("b", "second", 1, True, 1)]
    assert roles([FileGroup("trades", tuple(files), None, True, read_version=1)]) == [
        ("a", "first", None, True, 1), ("b", "second", None, True, 1)]
    assert roles([FileGroup("trades", (files[0],), None, True, read_version=1),
                  FileGroup("trades", (files[1],), 1, False, read_version=1)]) == [
        ("a", "first", None, True, 1), ("b", "second", 1, False, 1)]


def _scan_output_rows(df) -> list[int]:
    """Rows each Parquet scan of `df`'s last execution put out: with Parquet's row-group filter, the
    rows of the row groups it did not skip (Spark's SQL metric `numOutputRows` of the file scans)."""
    plan = df._jdf.queryExecution().executedPlan()
    if plan.getClass().getSimpleName() == "AdaptiveSparkPlanExec":
        plan = plan.finalPhysicalPlan()
    leaves = plan.collectLeaves()
    out = []
    for i in range(leaves.size()):
        leaf = leaves.apply(i)
        if "Scan" in leaf.getClass().getSimpleName():
            out.append(int(leaf.metrics().apply("numOutputRows").value()))
    return out


@pytest.mark.spark
def test_a_key_refill_reads_only_the_row_groups_that_may_hold_its_keys(spark, lake):
    """One file, its rows sorted by symbol into row groups of 10: a refill of symbol 'c''s groups
    alone reads its snapshot-only rows through a scan filter on the key that Parquet pushes down to
    its row groups, so only c's row group is decoded, and no later step sees the other symbols."""
    from dataclasses import replace
    from datetime import UTC, datetime, timedelta
    from types import SimpleNamespace

    from deltalake import WriterProperties, write_deltalake

    from laminar_assets import storage
    from laminar_assets.engine.run.plan import Mode, PartitionPlan, Reason
    from laminar_assets.engine.run.reading import read_set
    from laminar_assets.engine.windows import Interval
    from tests.conftest import trades_frame

    rows = sorted(((f"2024-01-01 00:{5 * i:02d}:00", sym, 1.0, i) for sym in "abcd" for i in range(10)),
                  key=lambda t: (t[1], t[0]))
    write_deltalake(lake.path("trades"), trades_frame(rows), storage_options=storage.delta_options(lake.path("trades")),
                    writer_properties=WriterProperties(max_row_group_size=10))
    info = table_info("trades", lake.path("trades"))
    hour = Interval(datetime(2024, 1, 1, tzinfo=UTC), datetime(2024, 1, 1, 1, tzinfo=UTC))
    plan = PartitionPlan(flow=FLOW.name, partition="2024-01-01-00:00", interval=hour, needed=hour, mode=Mode.REFILL,
                         reason=Reason.NON_APPEND_ON_NON_RETRACTABLE, detail="", spec_hash=FLOW.spec_hash,
                         from_versions={"trades": 0}, to_versions={"trades": 0}, refill_groups=(1,),
                         group_windows=(Interval(hour.start, hour.start + timedelta(minutes=10)),),
                         group_keys=(("c",),))
    inputs = RunInputs(infos={"trades": info}, histories={"trades": SimpleNamespace(commits=[])}, dims={},
                       input_schema={})
    reads = read_set(FLOW, [plan], inputs)
    [group] = reads.groups
    assert len(group.files) == 1 and group.version is None and group.only == "`sym` IN ('c')"
    df = read_rows(spark, FLOW, reads, inputs)
    assert sorted(r["sym"] for r in df.collect()) == ["c"] * 10
    assert _scan_output_rows(df) == [10], "c's row group of the file's 4"
    # with a window refilled whole beside them, its rows are of use too: every row group may hold some
    plan = replace(plan, refill=(Interval(hour.start + timedelta(minutes=20), hour.start + timedelta(minutes=30)),))
    [group] = read_set(FLOW, [plan], inputs).groups
    assert group.only == ("(((`ts` >= TIMESTAMP'2024-01-01 00:20:00.000000+00:00' AND "
                          "`ts` < TIMESTAMP'2024-01-01 00:30:00.000000+00:00')) OR (`sym` IN ('c')))")
    got = read_rows(spark, FLOW, ReadSet(groups=[group]), inputs).collect()
    assert sorted((r["sym"], r["ts"].minute) for r in got if r["sym"] != "c") == [
        (s, m) for s in "abd" for m in (20, 25)]
    assert sum(r["sym"] == "c" for r in got) == 10
