"""Sources with deletion vectors and column mapping: real tables written by Databricks and
delta-spark (tests/data/delta, from delta-rs's test data), and tables these tests write.

The reference for every comparison is `deltalake`'s own reader (`QueryBuilder`
applies deletion vectors), which shares no code with the engine's reads.
"""

from __future__ import annotations

import json
import os
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_assets.engine import Agg, Engine, FlowSpec, Mode, Reason, SchemaMismatchError, Tumbling, UnsupportedTableFeatureError
from laminar_assets.engine.delta.deletion_vectors import (
    DeletedRows,
    DeletionVector,
    log_deleted_rows,
    snapshot_deleted_rows,
)
from laminar_assets.engine.delta.log import CommitKind, read_commit
from laminar_assets.engine.delta.tables import snapshot_files, table_info
from tests.conftest import trades_frame
from tests.delta_features import delete_where, enable_deletion_vectors, live_adds, rename_column, snapshot
from tests.reference import Recomputes, assert_frames_match, full_recompute

DATA = os.path.join(os.path.dirname(__file__), "..", "..", "data", "delta")
HOUR0, HOUR1 = "1970-01-01-00:00", "1970-01-01-01:00"


def _versions(table: str) -> list[int]:
    log = os.path.join(DATA, table, "_delta_log")
    return sorted(int(n[:20]) for n in os.listdir(log) if n.endswith(".json"))


def _copy_upto(table: str, target: str, version: int) -> None:
    """The table as a writer had left it at `version`: data files, and log entries up to it."""
    src = os.path.join(DATA, table)
    if not os.path.exists(target):
        shutil.copytree(src, target, ignore=shutil.ignore_patterns("_delta_log"))
        os.makedirs(os.path.join(target, "_delta_log"))
    for name in os.listdir(os.path.join(src, "_delta_log")):
        if name[:20].isdigit() and int(name[:20]) <= version and name.endswith((".json", ".checkpoint.parquet")):
            shutil.copy(os.path.join(src, "_delta_log", name), os.path.join(target, "_delta_log", name))


# --- deletion vectors: decoding, without Spark -------------------------------------------------


@pytest.mark.parametrize("table", ["table-with-dv-small", "table_with_deletion_logs", "cdf-table-with-cdc-and-dvs"])
def test_log_decoder_agrees_with_deltalake_at_every_version(table, tmp_path):
    """Our decoding of the log's vectors (pyroaring) equals deltalake's selection vectors."""
    target = str(tmp_path / table)
    compared = 0
    for version in _versions(table):
        _copy_upto(table, target, version)
        from_deltalake = {os.path.basename(f.uri): sorted(f.deleted.positions().to_pylist())
                          for f in snapshot_files(table_info(table, target), None) if f.deleted is not None}
        ours = {}
        for rel, add in live_adds(target).items():  # a replay of the log's add and remove actions
            vector = DeletionVector.from_action(target, add.get("deletionVector"))
            if vector is not None:
                ours[os.path.basename(rel)] = sorted(vector.bitmap())
        assert ours == from_deltalake, (table, version)
        compared += len(ours)
    assert compared > 0


@pytest.mark.parametrize("table", ["table-with-dv-small", "table_with_deletion_logs", "cdf-table-with-cdc-and-dvs"])
def test_vectors_replayed_from_the_log_equal_deltalakes_at_every_version(table):
    """`log_deleted_rows` (a table with type widening, which deltalake refuses to scan, gets its snapshot's
    vectors from its checkpoint and the JSON commits after it) equals deltalake's own at every version, those
    read through a checkpoint included."""
    path = os.path.join(DATA, table)
    compared = 0
    for version in _versions(table):
        theirs = {os.path.basename(p): sorted(rows.positions().to_pylist())
                  for p, rows in snapshot_deleted_rows(DeltaTable(path, version=version)).items()}
        ours = {os.path.basename(p): sorted(rows.positions().to_pylist())
                for p, rows in log_deleted_rows(path, version).items()}
        assert ours == theirs, (table, version)
        compared += len(ours)
    assert compared > 0


def test_small_table_deletes_two_rows_by_vector():
    info = table_info("dv", os.path.join(DATA, "table-with-dv-small"))
    (f,) = snapshot_files(info, None)
    assert sorted(f.deleted.positions().to_pylist()) == [0, 9] and f.deleted.count == 2
    commit = read_commit("dv", info.uri, 1, None)
    assert commit.kind is CommitKind.DELETION_VECTORS and commit.dv_rows == 2
    deleted, restored = commit.adds[0].dv_change.signed_positions()
    assert deleted.to_pylist() == [0, 9] and restored.to_pylist() == []


@pytest.mark.parametrize("also", [(), ("vacuumProtocolCheck",)], ids=["plain", "vacuum-protocol-check"])
def test_vectors_of_files_in_escaped_partition_folders_are_found(tmp_path, also):
    """deltalake names a snapshot's files with vectors by URL, percent-encoded (`p=a%2520b` for the folder
    `p=a%20b`): a file in a partition folder with a space, a colon (every timestamp) or a % keeps its vector in
    a snapshot read, also when the vectors come from the log (vacuumProtocolCheck, which deltalake's scans
    refuse). Found by the delta-spark feature matrix (#63): the vector was not found, a refill read the row."""
    path = str(tmp_path / "t")
    write_deltalake(path, pa.table({"id": [1, 2, 3], "p": ["a b", "a b", "x:y%z"]}), partition_by=["p"])
    enable_deletion_vectors(path)
    delete_where(path, lambda t: pc.equal(t["id"], 1))  # through deltalake's reader, which refuses `also`
    if also:
        enable_deletion_vectors(path, also=also)
    files = snapshot_files(table_info("t", path), None)
    assert {f.partition_values: f.deleted.positions().to_pylist() if f.deleted else [] for f in files} == \
        {(("p", "a b"),): [0], (("p", "x:y%z"),): []}


def test_inline_vector_and_bad_vector_are_read_or_refused():
    import struct

    from pyroaring import BitMap64

    from tests.delta_features import z85_encode

    data = struct.pack("<i", 1681511377) + BitMap64([3, 5, 2**33]).serialize()
    padded = data + b"\0" * (-len(data) % 4)
    inline = DeletionVector("/t", "i", z85_encode(padded), None, len(data), 3)
    assert sorted(inline.bitmap()) == [3, 5, 2**33]
    wrong = DeletionVector("/t", "i", z85_encode(padded), None, len(data), 4)
    with pytest.raises(Exception, match="holds 3 rows, its descriptor says 4"):
        wrong.bitmap()
    assert DeletedRows.from_selection(pa.array([True, False, True])).positions().to_pylist() == [1]


# --- flows over the real tables, version by version ---------------------------------------------

LOGS_FLOWS = (
    FlowSpec(name="logs_sum", source="src", event_time="t", window=Tumbling("10m"), keys=(),
             derived={"t": "timestamp_seconds(id * 60)"}, aggregates=(Agg.count(), Agg.sum("age"), Agg.sum("nbr"))),
    FlowSpec(name="logs_max", source="src", event_time="t", window=Tumbling("30m"), keys=(),
             derived={"t": "timestamp_seconds(id * 60)"}, aggregates=(Agg.count(), Agg.max("nbr"), Agg.min("age"))),
)
CDF_FLOWS = (
    FlowSpec(name="cdf_sum", source="src", event_time="t", window=Tumbling("10m"), keys=("comment",),
             derived={"t": "timestamp_seconds(id * 60)"}, aggregates=(Agg.count(), Agg.sum("id"))),
    FlowSpec(name="cdf_max", source="src", event_time="t", window=Tumbling("30m"), keys=(),
             derived={"t": "timestamp_seconds(id * 60)"}, aggregates=(Agg.count(), Agg.max("id"))),
)
SMALL_FLOWS = (
    FlowSpec(name="small", source="src", event_time="t", window=Tumbling("20m"), keys=(),
             derived={"t": "timestamp_seconds(value * 600)"},
             aggregates=(Agg.count(), Agg.sum("value"), Agg.count_distinct("value"))),
)
MAPPED_FLOWS = (
    FlowSpec(name="mapped", source="src", event_time="t", window=Tumbling("1h"), keys=("description",),
             derived={"t": "timestamp_seconds(newid * 60)"}, aggregates=(Agg.count(), Agg.sum("newid"))),
)
NAMES_FLOWS = (
    FlowSpec(name="names", source="src", event_time="t", window=Tumbling("1h"), keys=("company",),
             derived={"t": "TIMESTAMP'1970-01-01 00:10:00'", "company": "`Company Very Short`",
                      "super_name": "`Super Name`"},
             aggregates=(Agg.count(), Agg.max("super_name"))),
)


def _walk(spark, tmp_path, table: str, flows, start: int = 0) -> list[tuple[int, str, Mode, Reason, str]]:
    """Copy the table commit by commit; after each, run every flow incrementally and compare its sink
    with a recompute from deltalake's reader at that version."""
    target = str(tmp_path / "lake" / "src")
    engine = Engine(spark, str(tmp_path / "lake"))
    recompute = Recomputes(spark)  # again only after a commit that changed rows (not after an OPTIMIZE)
    seen = []
    for version in [v for v in _versions(table) if v >= start]:
        _copy_upto(table, target, version)
        rows = snapshot(target)
        for flow in flows:
            for r in engine.run_many(flow, [HOUR0, HOUR1]):
                seen.append((version, flow.name, r.mode, r.reason, r.detail))
            expected = recompute(flow, rows)
            sink = str(tmp_path / "lake" / flow.sink)
            actual = DeltaTable(sink).to_pandas() if os.path.exists(sink) else expected.iloc[0:0]
            assert_frames_match(actual, expected, flow.keys)
    return seen


def _assert_vector_commits_are_changes(seen, table: str, tmp_path) -> None:
    target = str(tmp_path / "lake" / "src")
    dv_versions = [v for v in _versions(table) if read_commit(table, target, v, None).kind is CommitKind.DELETION_VECTORS]
    assert dv_versions, "the table has no deletion-vector commit"
    for version in dv_versions:
        runs = [(m, r, d) for v, _, m, r, d in seen if v == version]
        # the event time is derived, so no statistics place the change: every partition must act on it
        assert runs and all(m is not Mode.NOOP for m, _, _ in runs), (version, runs)
        assert any(r is Reason.DELETION_VECTOR_CHANGES or "through deletion vectors" in d for _, r, d in runs), (version, runs)


@pytest.mark.spark
def test_table_with_deletion_logs_version_by_version(spark, tmp_path):
    seen = _walk(spark, tmp_path, "table_with_deletion_logs", LOGS_FLOWS)
    _assert_vector_commits_are_changes(seen, "table_with_deletion_logs", tmp_path)
    # both merge the deletes; max/min recompute a window only when the last row holding its extreme went
    assert any(n == "logs_sum" and r is Reason.DELETION_VECTOR_CHANGES for _, n, _, r, _ in seen)
    assert {r for _, n, _, r, _ in seen if n == "logs_max"} & {Reason.DELETION_VECTOR_CHANGES, Reason.EXTREME_RETRACTED}


@pytest.mark.spark
def test_cdf_table_with_vectors_version_by_version(spark, tmp_path):
    seen = _walk(spark, tmp_path, "cdf-table-with-cdc-and-dvs", CDF_FLOWS)
    _assert_vector_commits_are_changes(seen, "cdf-table-with-cdc-and-dvs", tmp_path)
    reasons = {r for _, n, _, r, _ in seen if n == "cdf_sum"}
    assert {Reason.DELETION_VECTOR_CHANGES, Reason.RETRACTABLE_CHANGES, Reason.APPEND_ONLY} <= reasons, reasons


@pytest.mark.spark
def test_small_table_and_column_mapped_tables(spark, tmp_path):
    seen = _walk(spark, tmp_path / "small", "table-with-dv-small", SMALL_FLOWS)
    # count_distinct cannot retract: version 1's deletes refill (the derived event time gives no statistics)
    assert {r for v, _, _, r, _ in seen if v == 1} == {Reason.NON_APPEND_ON_NON_RETRACTABLE}
    # the partition column 'id' is renamed to 'newid' at version 3 (Databricks RENAME COLUMN)
    old_name = FlowSpec(name="mapped", source="src", event_time="t", window=Tumbling("1h"), keys=("description",),
                        derived={"t": "timestamp_seconds(id * 60)"}, aggregates=(Agg.count(), Agg.sum("id")))
    with pytest.raises(SchemaMismatchError, match="'id' of source 'src', which was renamed to 'newid' at version 3"):
        _walk(spark, tmp_path / "part", "table_with_partitioning_mapping", (old_name,))
    seen = _walk(spark, tmp_path / "part", "table_with_partitioning_mapping", MAPPED_FLOWS, start=3)
    assert seen[0][3] is Reason.SPEC_CHANGED and {r for *_, r, _ in seen[2:]} == {Reason.APPEND_ONLY}
    _walk(spark, tmp_path / "names", "table_with_column_mapping", NAMES_FLOWS)


# --- tables these tests write: timestamps, statistics, renames ----------------------------------

FLOW = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("px"), Agg.avg("qty")))
MAXF = FlowSpec(name="g", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.count_distinct("px")))  # cannot retract: deletes refill
PART0, PART1 = "2024-01-01-00:00", "2024-01-01-01:00"


def _rows(hour: int, n: int, base: float = 0.0):
    return [(f"2024-01-01 {hour:02d}:{m % 60:02d}:00", "ab"[m % 2], base + m, m % 4) for m in range(n)]


@pytest.mark.spark
def test_mapped_table_with_vectors_prunes_by_statistics_and_merges_deletes(spark, lake):
    write_deltalake(lake.path("trades"), trades_frame(_rows(0, 40)), configuration={"delta.columnMapping.mode": "name"})
    write_deltalake(lake.path("trades"), trades_frame(_rows(1, 40, 100.0)), mode="append")
    enable_deletion_vectors(lake.path("trades"))
    info = table_info("trades", lake.path("trades"))
    assert info.physical("px").startswith("col-")
    names = {p: name for name, p in info.physical_names.items()}
    engine = Engine(spark, lake.root)
    for flow in (FLOW, MAXF):
        engine.run_many(flow, [PART0, PART1])
    delete_where(lake.path("trades"), lambda t: pc.equal(t["qty"], 1), column_names={v: k for k, v in names.items()})
    results = {flow.name: engine.run_many(flow, [PART0, PART1]) for flow in (FLOW, MAXF)}
    assert [r.reason for r in results["f"]] == [Reason.DELETION_VECTOR_CHANGES] * 2
    assert [r.reason for r in results["g"]] == [Reason.NON_APPEND_ON_NON_RETRACTABLE] * 2
    # statistics (keyed by physical name) still prune: hour 0's refill reads only hour 0's file
    assert results["g"][0].metrics["files_read"] == 1
    write_deltalake(lake.path("trades"), trades_frame([("2024-01-01 00:05:30", "a", 7.0, 1)]), mode="append")
    delete_where(lake.path("trades"), lambda t: pc.greater(t["px"], 130.0), column_names={v: k for k, v in names.items()})
    for flow in (FLOW, MAXF):
        engine.run_many(flow, [PART0, PART1])
        assert_frames_match(lake.read(flow.sink), full_recompute(spark, flow, snapshot(lake.path("trades"))), flow.keys)


@pytest.mark.spark
def test_renaming_a_used_column_names_old_and_new(spark, lake):
    write_deltalake(lake.path("trades"), trades_frame(_rows(0, 10)), configuration={"delta.columnMapping.mode": "name"})
    engine = Engine(spark, lake.root)
    engine.run(FLOW, PART0)
    version = rename_column(lake.path("trades"), "qty", "quantity")
    with pytest.raises(SchemaMismatchError) as info:
        engine.run(FLOW, PART0)
    message = str(info.value)
    assert "'qty'" in message and "renamed to 'quantity' at version" in message and f"version {version}" in message
    # a flow on the new name refills (its spec changed) and reads the renamed column's old files
    renamed = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                       aggregates=(Agg.count(), Agg.sum("px"), Agg.avg("quantity")))
    r = engine.run(renamed, PART0)
    assert r.reason is Reason.SPEC_CHANGED
    assert_frames_match(lake.read("f"), full_recompute(spark, renamed, snapshot(lake.path("trades"))), ("sym",))


def test_unknown_reader_feature_is_refused_by_name(lake):
    lake.create("trades", _rows(0, 3), cdf=False)
    path = lake.path("trades")
    with open(os.path.join(path, "_delta_log", f"{1:020d}.json"), "w") as fh:
        fh.write(json.dumps({"commitInfo": {"timestamp": 0, "operation": "SET TBLPROPERTIES"}}) + "\n")
        fh.write(json.dumps({"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                                          "readerFeatures": ["deletionVectors", "variantShredding-preview"],
                                          "writerFeatures": ["deletionVectors", "variantShredding-preview"]}}) + "\n")
    with pytest.raises(UnsupportedTableFeatureError) as info:
        table_info("trades", path)
    assert "variantShredding-preview" in str(info.value) and "version 1" in str(info.value) and "'trades'" in str(info.value)


def test_a_type_change_type_widening_does_not_read_exactly_is_refused_naming_it(lake):
    """Type widening is read (Spark reads a file written before a widening under the wider type); a recorded
    type change that is no widening (here bigint -> int, which no Delta writer records) is refused, naming
    table, column, both types and version, before anything reads the files."""
    lake.create("trades", _rows(0, 3), cdf=False)
    path = lake.path("trades")
    entry = [json.loads(line) for line in open(os.path.join(path, "_delta_log", f"{0:020d}.json"))]
    meta = next(e["metaData"] for e in entry if "metaData" in e)
    schema = json.loads(meta["schemaString"])

    def commit(version: int, change: dict) -> None:
        for f in schema["fields"]:
            if f["name"] == "qty":
                f["type"], f["metadata"] = change["toType"], {"delta.typeChanges": [change]}
        with open(os.path.join(path, "_delta_log", f"{version:020d}.json"), "w") as fh:
            fh.write(json.dumps({"commitInfo": {"timestamp": 0, "operation": "CHANGE COLUMN"}}) + "\n")
            fh.write(json.dumps({"protocol": {"minReaderVersion": 3, "minWriterVersion": 7,
                                              "readerFeatures": ["typeWidening"],
                                              "writerFeatures": ["typeWidening"]}}) + "\n")
            fh.write(json.dumps({"metaData": {**meta, "schemaString": json.dumps(schema)}}) + "\n")

    commit(1, {"fromType": "integer", "toType": "long"})  # a widening: read
    assert table_info("trades", path).version == 1
    commit(2, {"fromType": "decimal(30,2)", "toType": "long", "tableVersion": 2})
    with pytest.raises(UnsupportedTableFeatureError) as info:
        table_info("trades", path)
    message = str(info.value)
    assert "'trades'" in message and "'qty'" in message and "from decimal(30,2) to long at version 2" in message, message
