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
