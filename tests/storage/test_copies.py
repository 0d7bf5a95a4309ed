"""The local copies of immutable log files (`storage.copies`): served only under the tag a listing gives, checked,
bounded, and never the copy of another table at the same path."""

from __future__ import annotations

import os
import tempfile
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from bench.request_log import RequestLog
from laminar_assets import storage
from laminar_assets.engine.delta import snapshot_cache
from laminar_assets.errors import StorageError
from laminar_assets.storage.copies import Copies, kept


def test_a_copy_is_served_only_under_its_uri_and_tag(tmp_path):
    copies = Copies(tmp_path)
    copies.put("s3://b/t/_delta_log/00000000000000000000.json", '"e1"', b"commit zero")
    assert copies.get("s3://b/t/_delta_log/00000000000000000000.json", '"e1"') == b"commit zero"
    assert copies.get("s3://b/t/_delta_log/00000000000000000000.json", '"e2"') is None  # another version there
    assert copies.get("s3://b/u/_delta_log/00000000000000000000.json", '"e1"') is None  # another table


def test_a_damaged_copy_is_dropped_and_the_store_read(tmp_path):
    copies = Copies(tmp_path)
    copies.put("s3://b/t/x.json", "1", b"the bytes of the commit")
    [path] = [p for p in (tmp_path / "objects").rglob("*") if p.is_file()]
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF
    path.write_bytes(bytes(raw))
    assert copies.get("s3://b/t/x.json", "1") is None and not path.exists()
    copies.put("s3://b/t/x.json", "1", b"the bytes of the commit")
    path.write_bytes(path.read_bytes()[:10])  # torn
    assert copies.get("s3://b/t/x.json", "1") is None


def test_copies_stay_within_their_bound_dropping_those_read_longest_ago(tmp_path):
    copies = Copies(tmp_path, max_bytes=10_000)
    for i in range(40):
        copies.put(f"s3://b/t/{i}.json", "t", bytes(1_000))
        os.utime(copies._path(f"s3://b/t/{i}.json", "t"), (i, i))  # put in this order, a second apart
    kept_files = [p for p in (tmp_path / "objects").rglob("*") if p.is_file()]
    assert sum(p.stat().st_size for p in kept_files) <= 10_000
    assert copies.get("s3://b/t/39.json", "t") is not None and copies.get("s3://b/t/0.json", "t") is None


def test_the_checkpoint_hint_is_the_tables_own(tmp_path):
    copies = Copies(tmp_path)
    assert copies.checkpoint_hint("s3://b/t") is None
    copies.set_checkpoint_hint("s3://b/t", 20)
    copies.set_checkpoint_hint("s3://b/u", -1)
    assert (copies.checkpoint_hint("s3://b/t"), copies.checkpoint_hint("s3://b/u")) == (20, -1)


def test_the_setting_turns_copies_off_and_a_wrong_bound_is_named(tmp_path, monkeypatch):
    monkeypatch.setenv("LAMINAR_CACHE_DIR", "off")
    assert kept() is None
    monkeypatch.setenv("LAMINAR_CACHE_DIR", str(tmp_path / "c"))
    assert kept() is not None and kept().directory == tmp_path / "c"
    monkeypatch.setenv("LAMINAR_CACHE_MAX_MB", "lots")
    with pytest.raises(StorageError, match="LAMINAR_CACHE_MAX_MB is 'lots': expected a number of megabytes"):
        kept()


def _append(uri: str, value: int) -> None:
    write_deltalake(uri, pa.table({"v": pa.array([value], pa.int64())}), mode="append",
                    storage_options=storage.delta_options(uri))


def _values(table) -> list[int]:
    return sorted(table.to_pyarrow_table()["v"].to_pylist())


def test_a_table_recreated_at_the_path_is_replayed_as_itself_not_from_the_old_tables_copies(s3_lake, s3_server):
    uri = f"{s3_lake.root}/t"
    for i in range(12):
        _append(uri, i)
    DeltaTable(uri, storage_options=storage.delta_options(uri)).create_checkpoint()  # at 11
    _append(uri, 12)
    snapshot_cache.clear()
    old = snapshot_cache._replayed(uri)
    assert old is not None and old.version() == 12 and kept().checkpoint_hint(uri) == 11
    snapshot_cache.clear()
    log = RequestLog(s3_server.endpoint)
    log.start()
    again = snapshot_cache._replayed(uri)
    # the same table on the same machine: one listing from the checkpoint, everything else from the copies
    assert [r.kind for r in log.requests()] == ["LIST"] and again.version() == 12
    storage.delete_tree(uri)
    for i in range(3):  # versions 0-2 again, at the same names; the hint names a checkpoint the new log lacks
        _append(uri, 100 + i)
    snapshot_cache.clear()
    log.start()
    new = snapshot_cache._replayed(uri)
    requests = log.requests()
    assert new is not None and new.version() == 2 and _values(new) == [100, 101, 102]
    # the hint's listing (nothing from 11 on) disproved it: the pointer (absent), a listing from 0, three commits
    assert Counter(r.kind for r in requests) == {"LIST": 2, "GET": 4}
    assert kept().checkpoint_hint(uri) == -1
    assert sorted(a["path"] for a in new.add_actions()) == sorted(
        p.rsplit("/", 1)[-1] for p in DeltaTable(uri, storage_options=storage.delta_options(uri)).file_uris())


def test_a_process_that_writes_little_still_keeps_the_folder_within_its_bound(tmp_path):
    """Each run the daemon launches is a new process writing a few commits: the folder is pruned at a process's
    first write when no process did in the last ten minutes, not only after one process wrote an eighth of it."""
    for i in range(30):  # thirty processes, 1 kB each, within ten minutes: one prune (the first, of nothing)
        Copies(tmp_path, max_bytes=10_000).put(f"s3://b/t/{i}.json", "t", bytes(1_000))
    assert sum(p.stat().st_size for p in (tmp_path / "objects").rglob("*") if p.is_file()) > 10_000
    os.utime(tmp_path / "pruned", (0, 0))  # ten minutes later
    Copies(tmp_path, max_bytes=10_000).put("s3://b/t/next.json", "t", bytes(1_000))
    assert sum(p.stat().st_size for p in (tmp_path / "objects").rglob("*") if p.is_file()) <= 10_000


@pytest.mark.parametrize("written", ["5", "[1]", '"x"', '{"uri": "s3://b/t", "checkpoint": "7"}', "{", ""])
def test_a_hint_file_that_is_not_a_hint_is_no_hint(tmp_path, written):
    copies = Copies(tmp_path)
    copies.set_checkpoint_hint("s3://b/t", 3)
    copies._hint_path("s3://b/t").write_text(written)
    assert copies.checkpoint_hint("s3://b/t") is None


def test_a_folder_the_process_cannot_change_costs_reads_not_runs(tmp_path, monkeypatch):
    copies = Copies(tmp_path)
    copies.put("s3://b/t/x.json", "1", b"bytes")
    [path] = [p for p in (tmp_path / "objects").rglob("*") if p.is_file()]
    path.write_bytes(b"damaged")

    def refused(*args, **kwargs):
        raise PermissionError("read-only folder")

    monkeypatch.setattr(Path, "unlink", refused)  # what a folder shared read-only does (root may change any)
    monkeypatch.setattr(tempfile, "mkstemp", refused)
    assert copies.get("s3://b/t/x.json", "1") is None  # the damaged copy stays (not deleted), unused
    copies.put("s3://b/t/y.json", "1", b"more")  # not kept, no error
    assert copies.get("s3://b/t/y.json", "1") is None


def test_the_same_bucket_key_and_bytes_on_another_endpoint_is_read_from_that_endpoint(s3_server, second_s3_server):
    """S3's ETag of a single-part upload is the MD5 of the bytes, so two stores give the same tag to the same bytes
    at the same key: a copy is kept per store too, and a reader of the second store reads the second store."""
    uri = "s3://same-name/t/_delta_log/00000000000000000000.json"
    for server in (s3_server, second_s3_server):
        server.options.client().create_bucket(Bucket="same-name")
    with storage.mounted("s3://same-name", s3_server.options):
        tag = storage.create_tagged(uri, b"commit zero")
        storage.keep_written(uri, tag, b"commit zero")
        assert storage.read_many_immutable([(uri, tag)]) == [b"commit zero"]
    with storage.mounted("s3://same-name", second_s3_server.options):
        assert storage.create_tagged(uri, b"commit zero") == tag  # the same tag on the other store
        log = RequestLog(second_s3_server.endpoint)
        log.start()
        assert storage.read_many_immutable([(uri, tag)]) == [b"commit zero"]
        assert [r.kind for r in log.requests()] == ["GET"]  # read there, not taken from the first store's copy


@pytest.mark.parametrize("limit", ["inf", "1e400", "-5", "nan"])
def test_a_bound_that_is_no_size_is_named(tmp_path, monkeypatch, limit):
    monkeypatch.setenv("LAMINAR_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("LAMINAR_CACHE_MAX_MB", limit)
    with pytest.raises(StorageError, match=f"LAMINAR_CACHE_MAX_MB is '{limit}': expected a number of megabytes"):
        kept()


def test_a_copy_moved_under_another_objects_name_is_not_served(tmp_path):
    copies = Copies(tmp_path)
    copies.put("s3://b/t/_delta_log/00000000000000000001.json", "1", b"commit one")
    copies.put("s3://b/t/_delta_log/00000000000000000002.json", "2", b"commit two")
    one = copies._path("s3://b/t/_delta_log/00000000000000000001.json", "1")
    two = copies._path("s3://b/t/_delta_log/00000000000000000002.json", "2")
    a, b = one.read_bytes(), two.read_bytes()
    one.write_bytes(b), two.write_bytes(a)  # swapped by hand (a careless cp or rsync)
    assert copies.get("s3://b/t/_delta_log/00000000000000000001.json", "1") is None
    assert copies.get("s3://b/t/_delta_log/00000000000000000002.json", "2") is None


def test_the_folder_setting_expands_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("LAMINAR_CACHE_DIR", "~/lamcache")
    assert kept().directory == tmp_path / "lamcache"
