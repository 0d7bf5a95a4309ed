"""Readers of the same Delta snapshot in one process share one open table, and never get a stale one:
not after a new commit, not after the table is deleted and recreated at the same path."""

from __future__ import annotations

import os
import shutil
import threading
import time

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import DeltaError

from laminar_assets.engine.delta import snapshot_cache
from laminar_assets.engine.delta.tables import open_table, table_info
from laminar_assets.errors import SourceNotFoundError


@pytest.fixture(autouse=True)
def _fresh_cache():
    snapshot_cache.clear()
    yield
    snapshot_cache.clear()


class Counting:
    """An opener that counts its calls (and opens for real)."""

    def __init__(self):
        self.calls: list[tuple[str, int | None]] = []
        self._lock = threading.Lock()

    def __call__(self, uri, version):
        with self._lock:
            self.calls.append((uri, version))
        return DeltaTable(uri, version=version)


def _write(path, values, mode="append"):
    write_deltalake(path, pa.table({"v": pa.array(values, pa.int64())}), mode=mode)


def _values(dt: DeltaTable) -> list[int]:
    return sorted(dt.to_pyarrow_table()["v"].to_pylist())


def test_readers_of_the_same_snapshot_share_one_open_table(tmp_path):
    path = str(tmp_path / "t")
    _write(path, [1, 2])
    _write(path, [3])
    opener = Counting()
    first = snapshot_cache.open_snapshot(path, None, opener)
    second = snapshot_cache.open_snapshot(path, None, opener)
    pinned = snapshot_cache.open_snapshot(path, 1, opener)
    assert first is second is pinned and first.version() == 1
    assert opener.calls == [(path, 1)]  # the latest version is opened by number: a commit meanwhile is not mixed in
    assert table_info("t", path).table is first  # the engine's reads go through it


def test_a_new_commit_is_seen_and_an_older_pinned_version_stays_what_it_was(tmp_path):
    path = str(tmp_path / "t")
    _write(path, [1])
    assert _values(open_table("t", path)) == [1]
    _write(path, [2])
    latest = open_table("t", path)
    assert latest.version() == 1 and _values(latest) == [1, 2]
    old = open_table("t", path, 0)
    assert old.version() == 0 and _values(old) == [1]


def test_a_table_recreated_at_the_same_path_is_never_served_from_the_old_snapshot(tmp_path):
    # Same path, same version numbers, same shape of commits, written right after the delete (the
    # file system may hand out the freed inodes again): each round must read its own rows.
    path = str(tmp_path / "t")
    for round_ in range(5):
        if os.path.exists(path):
            shutil.rmtree(path)
        _write(path, [round_])
        _write(path, [round_ + 100])
        dt = open_table("t", path)
        assert dt.version() == 1 and _values(dt) == [round_, round_ + 100], round_
        assert _values(open_table("t", path, 0)) == [round_]


def test_a_recreated_table_whose_newest_commit_repeats_the_old_one_byte_for_byte_misses(tmp_path):
    # Commits written by hand (or by a tool) need no time stamp: version 1 can be the same bytes in
    # both tables. The first commit (the table's UUID, its files) still differs.
    path = str(tmp_path / "t")
    hand_written = '{"commitInfo":{"timestamp":0,"operation":"TXN"}}\n{"txn":{"appId":"a","version":1}}\n'
    for round_ in range(3):
        if os.path.exists(path):
            shutil.rmtree(path)
        _write(path, [round_])
        with open(os.path.join(path, "_delta_log", f"{1:020d}.json"), "w") as fh:
            fh.write(hand_written)
        dt = open_table("t", path)
        assert dt.version() == 1 and _values(dt) == [round_], round_


def test_a_failed_open_is_not_kept_and_waiting_readers_get_its_error(tmp_path):
    path = str(tmp_path / "t")
    _write(path, [1])
    calls, entered, release = [], threading.Event(), threading.Event()

    def flaky(uri, version):
        calls.append(version)
        if len(calls) == 1:
            entered.set()
            release.wait(10)
            raise OSError("disk hiccup")
        return DeltaTable(uri, version=version)

    errors = []

    def first():
        try:
            snapshot_cache.open_snapshot(path, None, flaky)
        except OSError as exc:
            errors.append(("first", str(exc)))

    def waiting():
        try:
            snapshot_cache.open_snapshot(path, None, flaky)
        except OSError as exc:
            errors.append(("waiting", str(exc)))

    a = threading.Thread(target=first)
    a.start()
    assert entered.wait(10)
    shared = snapshot_cache.stats()["shared"]
    b = threading.Thread(target=waiting)  # asks while the first open is under way: waits for it
    b.start()
    deadline = time.monotonic() + 10
    while snapshot_cache.stats()["shared"] == shared and time.monotonic() < deadline:
        time.sleep(0.01)  # until it found the pending entry
    release.set()
    a.join(10)
    b.join(10)
    assert sorted(errors) == [("first", "disk hiccup"), ("waiting", "disk hiccup")]
    assert _values(snapshot_cache.open_snapshot(path, None, flaky)) == [1]  # not kept: opened again
    assert calls == [0, 0]


def test_threads_asking_at_once_wait_for_one_open(tmp_path):
    path = str(tmp_path / "t")
    for i in range(20):
        _write(path, [i])
    opener = Counting()
    got, start = [], threading.Barrier(6)

    def read():
        start.wait()
        got.append(snapshot_cache.open_snapshot(path, None, opener))

    threads = [threading.Thread(target=read) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 6 and all(t is got[0] for t in got)
    assert len(opener.calls) == 1


def test_a_path_that_is_not_a_table_yet_is_an_error_until_it_is(tmp_path):
    path = str(tmp_path / "later")
    with pytest.raises(SourceNotFoundError, match="later"):
        open_table("later", path)
    os.makedirs(os.path.join(path, "_delta_log"))  # a log folder without commits: not a table yet
    with pytest.raises(SourceNotFoundError, match="later"):
        open_table("later", path)
    shutil.rmtree(path)
    _write(path, [7])
    assert _values(open_table("later", path)) == [7]


def test_snapshots_that_cannot_be_checked_are_opened_every_time(tmp_path):
    path = str(tmp_path / "t")
    _write(path, [1])
    _write(path, [2])
    DeltaTable(path).create_checkpoint()
    os.remove(os.path.join(path, "_delta_log", f"{0:020d}.json"))  # version 0's commit has expired
    opener = Counting()
    for _ in range(2):
        snapshot_cache.open_snapshot(path, 1, opener)  # checked: cached
    calls = []
    for _ in range(2):
        with pytest.raises(DeltaError):  # version 0 cannot be loaded any more; each reader gets the error
            snapshot_cache.open_snapshot(path, 0, lambda u, v: calls.append(v) or DeltaTable(u, version=v))
    assert opener.calls == [(path, 1)] and calls == [0, 0]
    # (a table in a bucket is checked by its commit file's tag: tests/engine/delta/test_log_reads_on_s3.py)


def test_only_a_few_snapshots_are_kept(tmp_path):
    opener = Counting()
    paths = [str(tmp_path / f"t{i}") for i in range(snapshot_cache.MAX_SNAPSHOTS + 2)]
    for p in paths:
        _write(p, [1])
        snapshot_cache.open_snapshot(p, None, opener)
    snapshot_cache.open_snapshot(paths[-1], None, opener)  # recent: kept
    snapshot_cache.open_snapshot(paths[0], None, opener)  # the oldest: dropped, opened again
    assert [c[0] for c in opener.calls].count(paths[-1]) == 1
    assert [c[0] for c in opener.calls].count(paths[0]) == 2


def test_a_snapshot_is_shared_only_for_a_while(tmp_path, monkeypatch):
    path = str(tmp_path / "t")
    _write(path, [1])
    opener = Counting()
    snapshot_cache.open_snapshot(path, None, opener)
    snapshot_cache.open_snapshot(path, None, opener)
    assert len(opener.calls) == 1
    monkeypatch.setattr(snapshot_cache, "KEEP_SECONDS", 0.0)  # every entry is now too old
    snapshot_cache.open_snapshot(path, None, opener)
    assert len(opener.calls) == 2
