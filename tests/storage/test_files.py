"""Laminar's file I/O by URI, on a local folder and on S3: the conditional writes leases and
watermarks rely on, and clear errors for a store that cannot be used."""

from __future__ import annotations

import os
import time

import pytest

from laminar_assets import storage
from laminar_assets.errors import StorageError
from laminar_assets.storage import ObjectStoreOptions
from tests.object_store import using


@pytest.fixture(params=["local", "s3", "gcs", "azure"])
def root(request, tmp_path):
    if request.param == "local":
        yield str(tmp_path / "lake")
        return
    if request.param == "gcs":  # fake-gcs-server (tests/gcs_server.py)
        from tests.gcs_server import using_gcs

        with using_gcs(request.getfixturevalue("gcs_server")) as server:
            yield server.bucket()
        return
    if request.param == "azure":  # Azurite (tests/conftest.py), the Azure store's emulator
        server = request.getfixturevalue("azurite_server")
        container = server.container()
        with storage.mounted(container, server.options):
            yield container
        return
    server = request.getfixturevalue("s3_server")
    with using(server):
        yield server.bucket()


def test_write_read_and_replace_atomically(root):
    uri = storage.join(root, "_laminar", "checkpoints", "f", "p.json")
    assert storage.read(uri) is None and not storage.exists(uri)
    storage.write(uri, b"one")
    storage.write(uri, b"two")
    assert storage.read(uri) == b"two" and storage.exists(uri)
    assert [u.rsplit("/", 1)[-1] for u, _ in storage.list_files(storage.join(root, "_laminar"))] == ["p.json"]
    assert storage.list_dirs(storage.join(root, "_laminar", "checkpoints")) == ["f"]


def test_put_if_absent_and_compare_and_swap(root):
    uri = storage.join(root, "_laminar", "locks", "f", "p.lock")
    assert storage.create(uri, b"first")
    assert not storage.create(uri, b"second")  # there already
    data, tag = storage.read_tagged(uri)
    assert data == b"first"
    assert storage.replace_if(uri, b"taken over", tag)
    assert not storage.replace_if(uri, b"too late", tag)  # the version it read is gone
    _, now = storage.read_tagged(uri)
    assert not storage.delete(uri, tag=tag)  # only the version read may be deleted
    assert storage.delete(uri, tag=now) and storage.read(uri) is None
    storage.delete(uri)  # deleting what is gone is no error


def test_read_many_gives_each_object_in_order_and_none_for_a_missing_one(root):
    uris = [storage.join(root, "log", f"{i:020d}.json") for i in range(5)]
    for i, uri in enumerate(uris):
        if i != 3:
            storage.write(uri, f"commit {i}".encode())
    assert storage.read_many(uris) == [b"commit 0", b"commit 1", b"commit 2", None, b"commit 4"]
    assert storage.read_many([]) == [] and storage.read_many(uris[:1]) == [b"commit 0"]


def test_read_many_on_an_object_store_reads_side_by_side(monkeypatch, s3_server):
    """Its reads are in flight together (each waits at a barrier the others must reach), so a log's commits cost
    one request's latency, not one each; any failure is raised."""
    import threading

    from laminar_assets.storage import files

    with using(s3_server):
        uris = [storage.join(s3_server.bucket(), f"{i}.json") for i in range(3)]
        meet = threading.Barrier(3, timeout=30)
        monkeypatch.setattr(files, "read_tagged", lambda uri: (meet.wait(), (uri.encode(), f"tag-{uri[-6]}"))[1])
        assert storage.read_many(uris) == [u.encode() for u in uris]
        assert storage.read_many_tagged(uris) == [(u.encode(), f"tag-{i}") for i, u in enumerate(uris)]

        def fail(uri):
            raise StorageError(f"cannot read {uri}")

        monkeypatch.setattr(files, "read_tagged", fail)
        with pytest.raises(StorageError, match="0.json"):
            storage.read_many(uris)


def test_delete_tree_removes_only_the_folder(root):
    keep = storage.join(root, "t", "keep.parquet")
    storage.write(keep, b"x")
    for name in ("a.parquet", "sub/b.parquet"):
        storage.write(storage.join(root, "t", "laminar", "run-1", *name.split("/")), b"y")
    storage.delete_tree(storage.join(root, "t", "laminar", "run-1"))
    assert [u for u, _ in storage.list_files(storage.join(root, "t"))] == [keep]


def _failing_within(seconds: float, fn, match: str):
    started = time.monotonic()
    with pytest.raises(StorageError, match=match) as info:
        fn()
    assert time.monotonic() - started < seconds
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_an_unreachable_endpoint_is_one_line_within_seconds():
    unreachable = ObjectStoreOptions(endpoint="http://127.0.0.1:1", access_key_id="k", secret_access_key="s")
    with storage.mounted("s3://bucket/lake", unreachable):
        message = _failing_within(15, lambda: storage.check_reachable("s3://bucket/lake"), "cannot connect")
        assert "s3://bucket/lake" in message and "http://127.0.0.1:1" in message and "AWS_ENDPOINT_URL" in message


def test_an_unreachable_endpoint_from_the_environment_is_named(monkeypatch, s3_server):
    """With the endpoint in AWS_ENDPOINT_URL (no store mounted), the message said 'AWS S3 (default region)':
    the store the clients were not asked to reach. The environment is read when a request is made (not at
    import, nor once per process): the default store's client follows it."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "k")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "s")
    message = _failing_within(15, lambda: storage.check_reachable("s3://bucket/lake"), "cannot connect")
    assert "cannot connect to http://127.0.0.1:1:" in message and "AWS S3" not in message
    bucket = s3_server.bucket()
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3_server.endpoint)  # a client kept from before would still fail
    storage.check_reachable(bucket)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    assert ObjectStoreOptions(region="eu-west-1").describe() == "AWS S3 (region eu-west-1)"


def test_a_missing_bucket_says_what_to_fix(s3_server):
    with using(s3_server):
        message = _failing_within(15, lambda: storage.check_reachable("s3://no-such-bucket/lake"), "does not exist")
        assert "'no-such-bucket'" in message and "create it" in message


def test_wrong_credentials_say_what_to_fix(s3proxy_server):
    """s3proxy checks signatures (moto accepts any key)."""
    bucket = s3proxy_server.bucket()
    wrong = ObjectStoreOptions(endpoint=s3proxy_server.endpoint, access_key_id="nobody", secret_access_key="wrong-secret")
    with storage.mounted(bucket, wrong):
        message = _failing_within(15, lambda: storage.check_reachable(bucket), "refused the credentials")
        assert "AWS_ACCESS_KEY_ID" in message and "wrong-secret" not in message  # the secret is never shown


def test_object_stores_laminar_does_not_support_yet_are_refused_by_name():
    with pytest.raises(StorageError, match="gcs:// is not supported yet"):  # gs:// is
        storage.is_object_store("gcs://bucket/lake")
    assert storage.resolve_root("s3a://bucket/lake/") == "s3://bucket/lake"
    assert storage.resolve_root("lake") == os.path.abspath("lake")
    assert storage.spark_uri("s3://bucket/t/f.parquet") == "s3a://bucket/t/f.parquet"


def test_a_root_of_a_scheme_with_no_store_is_refused_by_name():
    with pytest.raises(StorageError, match=r"hdfs://nn/lake: hdfs:// is not a storage root .* s3://"):
        storage.resolve_root("hdfs://nn/lake")
