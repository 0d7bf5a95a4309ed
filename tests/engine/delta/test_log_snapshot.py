"""A table Laminar writes, replayed from its log by Laminar (`log_snapshot`), answers as `deltalake`'s open of the
same version: version, metadata, schema, protocol, every app's transaction, the live files with their statistics,
across commits that add and remove files (Laminar's own and deltalake's), a checkpoint and commits after it; a
log it does not replay (deletion vectors, the real tables of other engines it cannot) gives None, never another
answer; on the local S3 server it reads each log file once (exact requests)."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.transaction import AddAction

from bench.request_log import RequestLog
from laminar_assets import storage
from laminar_assets.engine.delta import log_snapshot, snapshot_cache
from laminar_assets.engine.delta.log import DataFile
from laminar_assets.engine.delta.log_snapshot import LogSnapshot, replay
from laminar_assets.engine.delta.tables import checkout_table, info_of, snapshot_files
from laminar_assets.engine.output.commit import _remove_action, write_commit
from tests.engine.new_process import on_a_new_machine

TESTDATA = Path(__file__).resolve().parents[2] / "data" / "delta"  # delta-rs's test tables (tests/data/delta)
DAY = datetime(2024, 1, 2, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _fresh_cache():
    snapshot_cache.clear()
    yield
    snapshot_cache.clear()


def _rows(hour: int, n: int, value: float) -> pa.Table:
    return pa.table({"ts": pa.array([DAY + timedelta(hours=hour, minutes=m) for m in range(n)], pa.timestamp("us", "UTC")),
                     "p": pa.array([f"h{hour:02d}"] * n), "v": pa.array([value] * n),
                     "k": pa.array([hour * 100 + m for m in range(n)], pa.int64()),
                     "s": pa.array([f"s{hour}-{m}" for m in range(n)])})


def _write(uri: str, hour: int, n: int, value: float, *, txn: tuple[str, int], mode: str = "append") -> None:
    opts = storage.delta_options(uri)
    if not DeltaTable.is_deltatable(uri, opts):  # as Laminar creates its tables (`commit.ensure_table`)
        DeltaTable.create(uri, schema=_rows(0, 1, 0.0).schema, partition_by=["p"], storage_options=opts,
                          configuration={"laminar.flow": "f", "delta.enableChangeDataFeed": "true",
                                         "delta.checkpointInterval": "10"}, raise_if_key_not_exists=False)
    write_deltalake(uri, _rows(hour, n, value), mode=mode, partition_by=["p"], storage_options=opts,
                    commit_properties=CommitProperties(app_transactions=[Transaction(*txn)]))


def _replace(uri: str, hour: int, n: int, value: float, *, txn: tuple[str, int]) -> None:
    """Laminar's own commit (`write_commit`): the partition's files removed, a new one added, an app transaction."""
    dt = DeltaTable(uri, storage_options=storage.delta_options(uri))
    path = f"p=h{hour:02d}/laminar-{txn[1]}-{hour}.parquet"
    sink = pa.BufferOutputStream()
    pq.write_table(_rows(hour, n, value).drop(["p"]), sink)
    data = sink.getvalue().to_pybytes()
    storage.write(f"{uri}/{path}", data)
    gone = [a for a in pa.table(dt.get_add_actions(flatten=True)).to_pylist() if a["partition.p"] == f"h{hour:02d}"]
    stamp = "%Y-%m-%dT%H:%M:%S.000Z"
    stats = json.dumps({"numRecords": n,
                        "minValues": {"ts": (DAY + timedelta(hours=hour)).strftime(stamp), "k": hour * 100,
                                      "s": f"s{hour}-0"},
                        "maxValues": {"ts": (DAY + timedelta(hours=hour, minutes=n - 1)).strftime(stamp),
                                      "k": hour * 100 + n - 1, "s": f"s{hour}-{n - 1}"},
                        "nullCount": {"ts": 0, "k": 0, "s": 0}})
    add = AddAction(path, len(data), {"p": f"h{hour:02d}"}, 0, True, stats)
    removes = [_remove_action(uri, DataFile(uri=f"{uri}/{a['path']}", rows=a["num_records"], size=a["size_bytes"],
                                            partition_values=(("p", a["partition.p"]),))) for a in gone]
    assert write_commit(uri, dt.version() + 1, [add], removes, transactions=[txn], metadata={"laminar.flow": "f"})


def _same(uri: str, snap: LogSnapshot) -> None:
    """The replayed snapshot answers as deltalake's open of its version."""
    dt = DeltaTable(uri, version=snap.version(), storage_options=storage.delta_options(uri))
    assert snap.version() == dt.version()
    assert json.loads(snap.schema().to_json()) == json.loads(dt.schema().to_json())
    assert snap.protocol() == dt.protocol()
    m, d = snap.metadata(), dt.metadata()
    assert (m.id, m.partition_columns, m.configuration) == (d.id, d.partition_columns, d.configuration)
    apps = {f"laminar/f/{h}" for h in range(6)}
    assert {a: snap.transaction_version(a) for a in apps} == {a: dt.transaction_version(a) for a in apps}
    ours, theirs = info_of("t", uri, snap), info_of("t", uri, dt)
    assert (ours.version, ours.schema, ours.partition_columns, ours.table_id) == \
        (theirs.version, theirs.schema, theirs.partition_columns, theirs.table_id)
    for within in (None, [_hour(1)], [_hour(3), _hour(4)]):
        assert _files(ours, within) == _files(theirs, within)


def _hour(h: int):
    from laminar_assets.engine.windows import Interval

    return Interval(DAY + timedelta(hours=h), DAY + timedelta(hours=h + 1))


def _files(info, within) -> list[tuple]:
    return sorted((f.uri, f.rows, f.size, f.partition_values, f.time_range, f.time_nulls, f.bounds)
                  for f in snapshot_files(info, "ts", within, keep_null_files=True, bounds_of=("k", "s", "v", "p")))


def _history(uri: str) -> None:
    _write(uri, 1, 3, 1.0, txn=("laminar/f/1", 1))
    _write(uri, 2, 2, 1.0, txn=("laminar/f/2", 1))
    _replace(uri, 1, 4, 2.0, txn=("laminar/f/1", 2))
    _write(uri, 3, 5, 1.0, txn=("laminar/f/3", 1))
    _replace(uri, 2, 1, 3.0, txn=("laminar/f/2", 2))


def _replayed(uri: str) -> LogSnapshot:
    table, release = checkout_table(uri)
    release()
    assert isinstance(table, LogSnapshot), type(table)
    return table


def test_a_replayed_table_answers_as_deltalakes_open_through_replaces_and_a_checkpoint(tmp_path):
    uri = str(tmp_path / "t")
    _history(uri)
    for version in range(6):  # the table created, then five commits
        snap = replay(uri, {v: "" for v in range(version + 1)}, None)
        assert snap is not None and snap.version == version
        _same(uri, LogSnapshot(uri, snap, None))
    DeltaTable(uri).create_checkpoint()  # at version 5
    _replace(uri, 3, 2, 4.0, txn=("laminar/f/3", 2))
    _write(uri, 4, 2, 1.0, txn=("laminar/f/4", 1))
    after = replay(uri, {v: "" for v in range(5, 8)}, 5)
    assert after is not None and after.version == 7
    _same(uri, LogSnapshot(uri, after, None))


def test_a_log_it_does_not_replay_gives_none(tmp_path):
    uri = str(tmp_path / "t")
    _history(uri)
    assert replay(uri, {0: "", 2: ""}, None) is None  # a commit missing from the listing
    assert replay(uri, {v: "" for v in range(6)}, 3) is None  # no checkpoint at 3
    v2 = {"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": ["v2Checkpoint"],
                       "writerFeatures": ["v2Checkpoint"]}}
    Path(uri, "_delta_log", f"{6:020d}.json").write_text(json.dumps(v2) + "\n")
    assert replay(uri, {v: "" for v in range(7)}, None) is None  # V2 checkpoints may keep files in sidecars
    assert replay(uri, {v: "" for v in range(6)}, None) is not None
    Path(uri, "_delta_log", f"{1:020d}.json").unlink()
    assert replay(uri, {v: "" for v in range(6)}, None) is None  # a commit file gone
    with_dv = str(tmp_path / "dv")
    shutil.copytree(TESTDATA / "table-with-dv-small", with_dv)
    versions = sorted(int(p.name[:20]) for p in Path(with_dv, "_delta_log").glob("*.json"))
    assert replay(with_dv, {v: "" for v in versions}, None) is None  # deletion vectors: deltalake's


@pytest.mark.parametrize("name", sorted(p.name for p in TESTDATA.iterdir() if p.is_dir()))
def test_the_real_tables_of_other_engines_replay_as_deltalake_opens_them_or_not_at_all(tmp_path, name):
    uri = str(tmp_path / name)
    shutil.copytree(TESTDATA / name, uri)
    log = Path(uri, "_delta_log")
    versions = sorted(int(p.name[:20]) for p in log.glob("*.json"))
    snap = replay(uri, {v: "" for v in versions}, None) if versions and versions[0] == 0 else None
    if snap is None:
        return  # left to deltalake (deletion vectors, a log that starts at a checkpoint, ...)
    table = LogSnapshot(uri, snap, None)
    dt = DeltaTable(uri)
    assert (table.version(), json.loads(table.schema().to_json()), table.protocol()) == \
        (dt.version(), json.loads(dt.schema().to_json()), dt.protocol())
    assert table.metadata().configuration == dt.metadata().configuration
    assert sorted(a["path"] for a in table.add_actions()) == \
        sorted(pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist())


def test_on_s3_the_run_replays_its_tables_reading_each_log_file_once_and_moves_over_new_commits(s3_lake, s3_server):
    uri = f"{s3_lake.root}/t"
    _history(uri)
    on_a_new_machine()  # no copies of the commits `_history` wrote
    log = RequestLog(s3_server.endpoint)
    log.start()
    table, release = checkout_table(uri)
    requests = log.requests()
    assert isinstance(table, LogSnapshot)
    # the pointer (absent), one listing, commits 0-5 once each: deltalake's open alone is 2 + 2 x 6
    assert Counter(r.kind for r in requests) == Counter({"GET": 7, "LIST": 1}), [(r.kind, r.key) for r in requests]
    assert table.tag is not None
    _same(uri, table)
    release()
    _replace(uri, 3, 2, 4.0, txn=("laminar/f/3", 2))
    log.start()
    moved, release = checkout_table(uri)
    requests = log.requests()
    assert moved is table and moved.version() == 6  # the pooled snapshot, moved over the new commit
    assert Counter(r.kind for r in requests) == Counter({"GET": 1, "LIST": 1}), [(r.kind, r.key) for r in requests]
    _same(uri, moved)
    release()
    DeltaTable(uri, storage_options=storage.delta_options(uri)).create_checkpoint()
    snapshot_cache.clear()  # a new process: from the checkpoint
    _write(uri, 4, 2, 1.0, txn=("laminar/f/4", 1))
    log.start()
    fresh = _replayed(uri)
    requests = log.requests()
    assert fresh.version() == 7
    # one listing from the checkpoint this machine's last replay started from (none: version 0), which lists the
    # new checkpoint; the checkpoint and commit 7 (deltalake wrote both: no copies). No pointer.
    assert Counter(r.kind for r in requests) == Counter({"GET": 2, "LIST": 1}), [(r.kind, r.key) for r in requests]
    _same(uri, fresh)
    on_a_new_machine()
    log.start()
    fresh = _replayed(uri)
    requests = log.requests()
    # the pointer, one listing, the checkpoint, commit 7
    assert Counter(r.kind for r in requests) == Counter({"GET": 3, "LIST": 1}), [(r.kind, r.key) for r in requests]
    _same(uri, fresh)
    snapshot_cache.clear()
    log.start()
    again = _replayed(uri)
    requests = log.requests()
    # the same machine again: one listing from the checkpoint; its file and commit 7 are this machine's copies
    assert [r.kind for r in requests] == ["LIST"], [(r.kind, r.key) for r in requests]
    _same(uri, again)


def test_a_method_it_does_not_answer_is_deltalakes_at_the_same_version(s3_lake):
    uri = f"{s3_lake.root}/t"
    _history(uri)
    table = _replayed(uri)
    _write(uri, 5, 1, 1.0, txn=("laminar/f/5", 1))  # a newer version: the delegate stays at the replayed one
    rows = table.to_pyarrow_table()
    assert rows.num_rows == 4 + 1 + 5 and table.version() == 5
    assert table.transaction_version("laminar/f/5") is None


def test_a_remove_cancels_the_add_of_the_same_path_string_as_deltalake_matches_them(tmp_path):
    uri = str(tmp_path / "t")
    _history(uri)
    log = Path(uri, "_delta_log")
    add = {"add": {"path": "p=h09/a%20b.parquet", "partitionValues": {"p": "h09"}, "size": 1, "modificationTime": 0,
                   "dataChange": True, "stats": json.dumps({"numRecords": 1})}}
    log.joinpath(f"{6:020d}.json").write_text(json.dumps(add) + "\n")
    gone = {"remove": {"path": "p=h09/a b.parquet", "dataChange": True, "deletionTimestamp": 0}}  # decoded: another
    log.joinpath(f"{7:020d}.json").write_text(json.dumps(gone) + "\n")
    snap = replay(uri, {v: "" for v in range(8)}, None)
    dt = DeltaTable(uri)
    assert snap is not None and "p=h09/a%20b.parquet" in snap.adds  # the decoded remove names another file
    assert sorted(snap.adds) == sorted(pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist())


def test_a_damaged_log_is_left_to_deltalake_and_the_replay_moves_as_deltalake_does(s3_lake):
    uri = f"{s3_lake.root}/t"
    _history(uri)
    log = storage.join(uri, "_delta_log")
    table = _replayed(uri)
    dt = DeltaTable(uri, storage_options=storage.delta_options(uri))
    dt.alter.set_table_properties({"laminar.note": "x"}, raise_if_not_exists=False)  # version 6, by deltalake
    storage.write(storage.join(log, f"{7:020d}.json"), b'{"txn": {"appId": "a"}}\n')  # no version: damaged
    assert replay(uri, {v: "" for v in range(8)}, None) is None
    with pytest.raises(ValueError, match="cannot move the replayed snapshot"):
        table.update_incremental()
    assert table.version() == 5
    assert table.to_pyarrow_table().num_rows == 4 + 1 + 5  # its deltalake delegate is at its version
    storage.delete(storage.join(log, f"{7:020d}.json"))
    table.update_incremental()  # to version 6, as deltalake's update_incremental
    assert table.version() == 6 and table.metadata().configuration["laminar.note"] == "x"
    assert table.to_pyarrow_table().num_rows == 10
    _same(uri, table)


def test_a_log_seldom_checkpointed_or_a_damaged_checkpoint_is_left_to_deltalake(tmp_path, monkeypatch):
    uri = str(tmp_path / "t")
    _history(uri)  # versions 0-5
    monkeypatch.setattr(log_snapshot, "MAX_COMMITS", 4)  # more commits since the checkpoint than a replay reads
    assert replay(uri, {v: "" for v in range(6)}, None) is None
    monkeypatch.setattr(log_snapshot, "MAX_COMMITS", 200)
    assert replay(uri, {v: "" for v in range(6)}, None) is not None
    DeltaTable(uri).create_checkpoint()
    checkpoint = Path(uri, "_delta_log", f"{5:020d}.checkpoint.parquet")
    whole = checkpoint.read_bytes()
    assert replay(uri, {5: ""}, 5) is not None
    footer = int.from_bytes(whole[-8:-4], "little")
    for damaged in (b"not parquet at all", whole[:len(whole) // 2], whole[:-8] + (10**9).to_bytes(4, "little") + b"PAR1",
                    whole[:-8 - footer] + bytes(footer) + whole[-8:]):
        checkpoint.write_bytes(damaged)  # pyarrow: ArrowInvalid (a ValueError), or an OSError for some footers
        assert replay(uri, {5: ""}, 5) is None
