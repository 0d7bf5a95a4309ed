"""Reads of a Delta log on an object store cost requests in proportion to what changed, not to the table's age
(issue #62), counted exactly by the local S3 server's request recorder (bench/request_log.py):

- a run's snapshot of a source is the last run's handle moved forward (`snapshot_cache.checkout`): the commits
  since it are read, not every commit since the checkpoint, and a table deleted and recreated at the same path
  is never served from the old handle; commits that only appended files are read once and not moved over
  (`checkout_appended`: the snapshot is the handle's files and theirs), any other commit moves the handle;
- a process with no handle of a source (each run the daemon launches) opens it at its last checkpoint and reads
  each commit since once (deltalake's open at the latest version reads each twice);
- readers of a table's latest snapshot that do not write it (a step's metadata, the checks) share one snapshot,
  proved the latest by one listing of the log from its version (`snapshot_cache.open_snapshot`), the first of
  them after a run the run's handle moved over its commit;
- a commit this process made through a handle is not read back for its app transactions;
- the app transactions of all of a run's partitions come from one read of the log (`transactions`), and give
  what `DeltaTable.transaction_version` gives, across checkpoints."""

from __future__ import annotations

from collections import Counter

import pyarrow as pa
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from bench.request_log import RequestLog
from laminar_assets import storage
from laminar_assets.engine.delta import snapshot_cache
from laminar_assets.engine.delta.integrity import check_table
from laminar_assets.engine.delta.tables import checkout_info, checkout_table, info_of, snapshot_files, table_info
from laminar_assets.engine.delta.transactions import committed, txn_versions_of


@pytest.fixture(autouse=True)
def _fresh_cache():
    snapshot_cache.clear()
    yield
    snapshot_cache.clear()


def _append(uri: str, values, *, txn: tuple[str, int] | None = None, config: dict | None = None) -> None:
    props = CommitProperties(app_transactions=[Transaction(*txn)]) if txn else None
    write_deltalake(uri, pa.table({"v": pa.array(values, pa.int64())}), mode="append", commit_properties=props,
                    storage_options=storage.delta_options(uri), configuration=config)


def _counted(server, fn):
    log = RequestLog(server.endpoint)
    log.start()
    out = fn()
    return out, Counter(r.kind for r in log.requests())


def _files(info) -> list[str]:
    return sorted(f.uri for f in snapshot_files(info, None, keep_null_files=True))


def _fresh_files(uri: str) -> list[str]:
    return _files(info_of("src", uri, DeltaTable(uri, storage_options=storage.delta_options(uri))))


@pytest.mark.parametrize("age", [10, 40])
def test_a_runs_snapshot_reads_the_new_commits_only_whatever_the_tables_age(s3_server, s3_lake, age):
    uri = s3_lake.path("src")
    for i in range(age):
        _append(uri, [i])
    (info, release), first = _counted(s3_server, lambda: checkout_info("src", uri))
    assert info.version == age - 1
    # the first open of the process: no checkpoint yet (deltalake writes one every 100 commits), so the log is
    # replayed from version 0 (`log_snapshot`): the missing pointer, one listing, each commit once. Opening at the
    # latest version read each commit twice (2 x age + 2); deltalake's open at version 0 and the commits since
    # read once, 2 + 2 + (age - 1) and two listings.
    assert first == {"GET": 1 + age, "LIST": 1}
    assert info.table.version() == age - 1 and sorted(info.log_entries) == list(range(age))
    assert _files(info) == _fresh_files(uri)
    release()
    _append(uri, [100])
    _append(uri, [101])
    (info, release), moved = _counted(s3_server, lambda: checkout_info("src", uri))
    # one listing from the handle's version and one read of each new commit (appends: the handle is not moved,
    # which cost deltalake's listing and its two reads of each commit)
    assert info.version == age + 1 and moved == {"LIST": 1, "GET": 2}
    assert info.table.version() == age - 1 and sorted(info.log_entries) == [age, age + 1]
    assert _files(info) == _fresh_files(uri)
    release()
    (info, release), again = _counted(s3_server, lambda: checkout_info("src", uri))
    assert info.version == age + 1 and again == {"LIST": 1}  # nothing new: one listing
    assert sorted(info.log_entries)[-2:] == [age, age + 1]  # the appended commits' files stay with the chain
    assert _files(info) == _fresh_files(uri)
    release()


def test_a_snapshot_derived_from_appends_equals_the_tables_and_any_other_commit_moves_the_handle(s3_server, s3_lake):
    uri = s3_lake.path("src")
    write_deltalake(uri, pa.table({"p": ["a", "b"], "v": pa.array([1, 2], pa.int64())}), partition_by=["p"],
                    storage_options=storage.delta_options(uri))
    info, release = checkout_info("src", uri)
    release()
    for values in ([3], [4]):  # appends, one of them to a partition of its own
        write_deltalake(uri, pa.table({"p": ["a" if values == [3] else "c"], "v": pa.array(values, pa.int64())}),
                        mode="append", storage_options=storage.delta_options(uri))
    info, release = checkout_info("src", uri)
    assert (info.version, info.base_version, info.table.version()) == (2, 0, 0)
    fresh = info_of("src", uri, DeltaTable(uri, storage_options=storage.delta_options(uri)))
    assert info.schema == fresh.schema and info.table_id == fresh.table_id
    assert sorted((f.uri, f.rows, f.size, f.partition_values) for f in snapshot_files(info, None)) == \
        sorted((f.uri, f.rows, f.size, f.partition_values) for f in snapshot_files(fresh, None))
    assert sorted(info.delta().to_pyarrow_table()["v"].to_pylist()) == [1, 2, 3, 4]  # opened at its version
    release()
    DeltaTable(uri, storage_options=storage.delta_options(uri)).delete("v = 1")  # removes a file: not an append
    (info, release), moved = _counted(s3_server, lambda: checkout_info("src", uri))
    # one listing; the new commit read here, then the handle (Laminar's replay of the log) moves over the commits
    # since its version without listing again (deltalake's move of its own handle listed the log: 2 listings)
    assert (info.version, info.base_version, info.table.version()) == (3, None, 3) and moved["LIST"] == 1
    assert _files(info) == _fresh_files(uri)
    release()
    write_deltalake(uri, pa.table({"p": ["a"], "v": pa.array([5], pa.int64())}), mode="append",
                    storage_options=storage.delta_options(uri))
    DeltaTable(uri, storage_options=storage.delta_options(uri)).create_checkpoint()
    info, release = checkout_info("src", uri)  # a checkpoint listed among the new commits: opened afresh from it
    assert (info.version, info.base_version, info.table.version()) == (4, None, 4)
    assert _files(info) == _fresh_files(uri)
    release()


def test_a_process_with_no_handle_opens_a_source_at_its_checkpoint_and_reads_each_commit_since_once(
        s3_server, s3_lake):
    uri = s3_lake.path("src")
    for i in range(12):
        _append(uri, [i])
    DeltaTable(uri, storage_options=storage.delta_options(uri)).create_checkpoint()  # at version 11
    for i in range(12, 17):
        _append(uri, [i])
    log = RequestLog(s3_server.endpoint)
    log.start()
    info, release = checkout_info("src", uri)
    gets = Counter(r.key.rsplit("/", 1)[-1] for r in log.requests() if r.kind == "GET")
    assert (info.version, info.table.version()) == (16, 16)  # replayed from the checkpoint (`log_snapshot`)
    assert sorted(info.log_entries) == [12, 13, 14, 15, 16]  # for the run's history: not read again
    assert _files(info) == _fresh_files(uri)
    # the pointer, the checkpoint once, each commit since once, none before (deltalake's open at the checkpoint
    # read the pointer and listed the log again, and read the checkpoint as its reader does)
    assert gets == {"_last_checkpoint": 1, f"{11:020d}.checkpoint.parquet": 1,
                    **{f"{v:020d}.json": 1 for v in range(12, 17)}}
    assert Counter(r.kind for r in log.requests())["LIST"] == 1  # from the checkpoint
    release()
    snapshot_cache.clear()  # a new process again; a delete since the checkpoint is not an append
    DeltaTable(uri, storage_options=storage.delta_options(uri)).delete("v = 13")
    log.start()
    info, release = checkout_info("src", uri)
    # on this machine: one listing from the checkpoint the last replay started from; the checkpoint and commits
    # 12-16 from the copies it kept (`storage.copies`), the new commit read
    assert [(r.kind, r.key.rsplit("/", 1)[-1]) for r in log.requests()] == [("LIST", ""), ("GET", f"{17:020d}.json")]
    assert (info.version, info.table.version()) == (17, 17)
    assert _files(info) == _fresh_files(uri) and sorted(info.log_entries) == [12, 13, 14, 15, 16, 17]
    assert sorted(info.delta().to_pyarrow_table()["v"].to_pylist()) == [i for i in range(17) if i != 13]
    release()


def test_readers_of_the_latest_snapshot_share_one_proved_by_a_listing(s3_server, s3_lake):
    uri = s3_lake.path("src")
    for i in range(6):
        _append(uri, [i])
    first, opened = _counted(s3_server, lambda: table_info("src", uri))
    # deltalake's open (the pointer, a listing, each commit twice), then one listing for its commit file's tag
    assert first.version == 5 and opened == {"GET": 1 + 2 * 6, "LIST": 2}
    again, shared = _counted(s3_server, lambda: table_info("src", uri))
    assert again.table is first.table and shared == {"LIST": 1}  # nothing newer: the same snapshot
    integrity, checked = _counted(s3_server, lambda: check_table("src", uri))
    assert integrity.ok and integrity.version == 5 and checked == {"LIST": 2}  # the log's listing, the files'
    _append(uri, [6])
    newer, moved = _counted(s3_server, lambda: table_info("src", uri))
    # the newest commit listed is opened at exactly that version (deltalake's open of it), not an older snapshot
    assert newer.version == 6 and newer.table is not first.table and moved["LIST"] == 2
    assert _files(newer) == _fresh_files(uri)
    pinned, at_version = _counted(s3_server, lambda: table_info("src", uri, 6))
    assert pinned.table is newer.table and at_version == {"LIST": 1}  # a given version: its tag checked
    for found, _size in storage.list_files(uri):  # the table deleted and recreated at the path, at version 6 again
        storage.delete(found)
    for i in range(7):
        _append(uri, [100 + i])
    recreated = table_info("src", uri)
    assert recreated.version == 6 and recreated.table is not newer.table  # another commit file at version 6
    assert sorted(recreated.table.to_pyarrow_table()["v"].to_pylist()) == list(range(100, 107))
    assert table_info("src", uri, 6).table is recreated.table


def _commit_through(table: DeltaTable, uri: str, app: str, seq: int) -> None:
    """A commit as a run makes it: through its handle (which stays at its version), after the guard's read of the
    app transactions, with no retry, recorded as the process's own (`transactions.committed`)."""
    read_version = table.version()
    txn_versions_of(table, uri, [app])
    props = CommitProperties(app_transactions=[Transaction(app, seq)], max_commit_retries=0)
    table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=props)
    committed(table, read_version, {app: seq})


def test_a_reader_after_a_run_takes_the_runs_handle_and_reads_only_its_commit(s3_server, s3_lake):
    """The readers after a run (its asset's metadata, a preview, its checks) ask for the table the run just
    committed: the handle the run committed through and gave back is moved over that commit for them (a listing,
    the commit read once: the handle is the run's replay of its log, `log_snapshot`), not the table opened afresh
    (the pointer, a listing, each commit since its checkpoint twice). The handle then serves readers only: the next
    run's checkout opens its own. A handle the process did not commit through (a source's) stays in the pool for
    the next run."""
    uri = s3_lake.path("sink")
    for i in range(6):
        _append(uri, [i], config={"delta.checkpointInterval": "100"} if i == 0 else None)
    table, release = checkout_table(uri)
    _commit_through(table, uri, "laminar/f/a", 1)
    release()
    adopted = snapshot_cache.stats()["adopted"]  # (counted over the process's life)
    info, requests = _counted(s3_server, lambda: table_info("sink", uri))
    # the listing from the handle's version (the same table, and its latest version), the replay's move over the
    # commit: one read of it; an open: the pointer, a listing and each of the 7 commits twice
    assert info.table is table and info.version == 6 and requests == {"LIST": 1, "GET": 1}, requests
    assert _files(info) == _fresh_files(uri)
    again, shared = _counted(s3_server, lambda: table_info("sink", uri))
    assert again.table is table and shared == {"LIST": 1}  # shared as any snapshot opened for readers
    assert snapshot_cache.stats()["adopted"] == adopted + 1
    run_table, release = checkout_table(uri)  # a run after: not the readers' handle
    assert run_table is not table and run_table.version() == 6
    release()
    # a source's handle: someone else's commit since; the reader opens its own, the next run moves the pooled one
    src = s3_lake.path("src")
    _append(src, [1])
    source_table, release = checkout_table(src)
    release()
    _append(src, [2])
    assert table_info("src", src).table is not source_table
    moved, release = checkout_table(src)
    assert moved is source_table and moved.version() == 1
    release()
    assert snapshot_cache.stats()["adopted"] == adopted + 1
    # recreated at the path: the handle given back is not this table
    snapshot_cache.clear()
    for found, _size in storage.list_files(uri):
        storage.delete(found)
    _append(uri, [0])
    table, release = checkout_table(uri)
    _commit_through(table, uri, "laminar/f/a", 1)
    release()
    for found, _size in storage.list_files(uri):
        storage.delete(found)
    _append(uri, [100])
    _append(uri, [101])
    recreated = table_info("sink", uri)
    assert recreated.table is not table and sorted(recreated.table.to_pyarrow_table()["v"].to_pylist()) == [100, 101]


def test_two_runs_at_once_hold_handles_of_their_own(s3_server, s3_lake):
    uri = s3_lake.path("src")
    _append(uri, [1])
    (a, release_a), (b, release_b) = checkout_info("src", uri), checkout_info("src", uri)
    assert a.table is not b.table
    release_a()
    _append(uri, [2])
    c, release_c = checkout_info("src", uri)  # moves the handle given back, never the one `b` holds
    assert c.table is a.table and c.version == 1 and b.table.version() == 0
    release_b()
    release_c()


def test_a_table_recreated_at_the_same_path_is_not_served_from_the_pooled_handle(s3_server, s3_lake):
    uri = s3_lake.path("src")
    _append(uri, [1])
    _append(uri, [2])
    info, release = checkout_info("src", uri)
    release()
    for found, _size in storage.list_files(uri):
        storage.delete(found)
    _append(uri, [7])
    _append(uri, [8])  # version 1 again, another table
    info, release = checkout_info("src", uri)
    assert info.version == 1 and sorted(info.delta().to_pyarrow_table()["v"].to_pylist()) == [7, 8]
    release()


@pytest.mark.parametrize("commits", [4, 13])
def test_app_transactions_of_all_partitions_come_from_one_read_of_the_log(s3_server, s3_lake, commits):
    uri = s3_lake.path("state")
    apps = [f"laminar/f/p{i}" for i in range(6)]
    _append(uri, [0], config={"delta.checkpointInterval": "5"})
    for i in range(1, commits):
        _append(uri, [i], txn=(apps[i % 5], i))  # apps[5] never commits
    if commits > 10:
        DeltaTable(uri, storage_options=storage.delta_options(uri)).create_checkpoint()
    dt = DeltaTable(uri, storage_options=storage.delta_options(uri))
    want = {a: dt.transaction_version(a) for a in apps}
    got, requests = _counted(s3_server, lambda: txn_versions_of(dt, uri, apps))
    assert got == want and got[apps[5]] is None and got[apps[1]] is not None
    checkpoint = dt.version() if commits > 10 else -1
    # _last_checkpoint (+ the checkpoint) and each commit after it, once for all six apps
    assert sum(requests.values()) == (2 if checkpoint >= 0 else 1) + dt.version() - checkpoint
    again, requests = _counted(s3_server, lambda: txn_versions_of(dt, uri, apps))
    assert again == want and not requests  # the same handle at the same version: kept


def test_app_transactions_of_a_local_table_match_deltalakes(tmp_path):
    uri = str(tmp_path / "state")
    write_deltalake(uri, pa.table({"v": [0]}), configuration={"delta.checkpointInterval": "3"})
    for i in range(1, 9):
        write_deltalake(uri, pa.table({"v": [i]}), mode="append",
                        commit_properties=CommitProperties(app_transactions=[Transaction(f"a{i % 3}", i)]))
    dt = DeltaTable(uri)
    apps = ["a0", "a1", "a2", "nope"]
    assert txn_versions_of(dt, uri, apps) == {a: dt.transaction_version(a) for a in apps}


def test_a_written_tables_handle_is_moved_over_its_own_commits_and_its_app_transactions_read_from_there(
        s3_server, s3_lake):
    uri = s3_lake.path("state")
    apps = ["laminar/f/a", "laminar/f/b"]
    _append(uri, [0], config={"delta.checkpointInterval": "100"})
    for i in range(1, 8):
        _append(uri, [i], txn=(apps[i % 2], i))
    table, release = checkout_table(uri)
    assert txn_versions_of(table, uri, apps) == {apps[0]: 6, apps[1]: 7}
    release()
    _append(uri, [8], txn=(apps[0], 8))  # the run's own commit (a commit through a handle leaves it where it was)
    (table, release), moved = _counted(s3_server, lambda: checkout_table(uri))
    # the handle is the replay of the table's log (`log_snapshot`): moved by a listing and one read of the commit
    assert table.version() == 8 and moved == {"LIST": 1, "GET": 1}
    got, requests = _counted(s3_server, lambda: txn_versions_of(table, uri, apps))
    assert got == {apps[0]: 8, apps[1]: 7} and not requests  # replayed with the commit
    # a commit through the handle, as a run's (no retry): its app transactions are known, not read back
    props = CommitProperties(app_transactions=[Transaction(apps[1], 9)], max_commit_retries=0)
    table.create_write_transaction([], mode="append", schema=table.schema(), commit_properties=props)
    committed(table, 8, {apps[1]: 9})
    release()
    _append(uri, [10], txn=(apps[0], 10))  # and someone else's after it
    (table, release), moved = _counted(s3_server, lambda: checkout_table(uri))
    got, requests = _counted(s3_server, lambda: txn_versions_of(table, uri, apps))
    assert table.version() == 10 and got == {apps[0]: 10, apps[1]: 9} and not requests
    assert moved == {"LIST": 1, "GET": 2}  # both commits read once
    assert got == {a: table.transaction_version(a) for a in apps}
    release()


def test_a_sensor_watching_a_source_in_a_bucket_makes_one_request_a_look(s3_server, s3_lake):
    """A watching tick looks at the next commit's entry only (a HEAD), never lists or reads the log: one request per
    source table and look while nothing happens, one more per commit found, every 0.25 s by default on a store."""
    from laminar_assets.pipeline.tick import OBJECT_STORE_POLL_SECONDS, watch_for_commits

    uri = f"{s3_lake.root}/trades"
    _append(uri, [1])
    log = RequestLog(s3_server.endpoint)

    def commit():  # the append's own requests, made while the watch sleeps, in a phase of their own
        log.mark("writer")
        _append(uri, [2])
        log.mark("watch")

    slept, now, on_sleep = [], [0.0], [lambda: None, commit, lambda: None]

    def sleep(seconds):
        slept.append(seconds)
        now[0] += seconds
        on_sleep.pop(0)()

    log.start()
    log.mark("watch")
    moved = watch_for_commits(s3_lake.root, ("trades",), {"trades": 0}, seconds=5, sleep=sleep, clock=lambda: now[0])
    watched = Counter(r.kind for r in log.requests() if r.phase == "watch")
    assert moved == {"trades": 1}
    assert slept == [OBJECT_STORE_POLL_SECONDS] * 3
    assert watched == {"HEAD": 5}  # looks: nothing, nothing, commit 1 there and 2 not, nothing newer
