"""One `Store` per scheme behind one protocol, and which store serves a URI: the store mounted for its
root (longest prefix), else its scheme's default. Two roots on two S3 servers (each a real local
server) live in one process, each reached with its own endpoint and credentials; object stores
Laminar has no `Store` for are refused by name."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_assets import storage
from laminar_assets.errors import StorageError
from laminar_assets.storage import LocalStore, ObjectStoreOptions, S3Store, Store
from laminar_assets.storage.gcs import GcsStore

A = ObjectStoreOptions(endpoint="http://127.0.0.1:1", access_key_id="key-a", secret_access_key="secret-a")
B = ObjectStoreOptions(endpoint="http://127.0.0.1:2", access_key_id="key-b", secret_access_key="secret-b")


@pytest.fixture(params=["local", "s3", "gcs", "azure"])
def root(request, tmp_path):
    if request.param == "local":
        yield str(tmp_path / "lake")
        return
    if request.param == "gcs":  # fake-gcs-server (tests/gcs_server.py)
        server = request.getfixturevalue("gcs_server")
        bucket = server.bucket()
        with storage.mounted(bucket, server.options):
            yield bucket
        return
    if request.param == "azure":  # Azurite (tests/conftest.py), the Azure store's emulator
        server = request.getfixturevalue("azurite_server")
        container = server.container()
        with storage.mounted(container, server.options):
            yield container
        return
    server = request.getfixturevalue("s3_server")
    bucket = server.bucket()
    with storage.mounted(bucket, server.options):
        yield bucket


def test_every_scheme_has_a_store_with_the_whole_protocol():
    assert set(storage.SCHEMES) >= {"file", "s3", "s3a"}
    for scheme, cls in storage.SCHEMES.items():
        assert isinstance(cls(None), Store), cls  # every method and attribute of the protocol
        assert scheme in cls.schemes
        assert (cls.jars is not None) == cls.object_store  # an object store's Spark connector has its jars
    assert isinstance(storage.store_for("/tmp/lake"), LocalStore)
    assert isinstance(storage.store_for("s3a://bucket/lake"), S3Store)
    assert isinstance(storage.store_for("gs://bucket/lake"), GcsStore)


def test_listing_by_tag_copy_and_examples_through_the_protocol(root):
    store = storage.store_for(root)
    for name in ("a.json", "b.json", "sub/c.json"):
        store.write(storage.join(root, "f", *name.split("/")), name.encode())
    tags = store.list_tagged(storage.join(root, "f"))
    assert [n for n, _ in tags] == ["a.json", "b.json", "sub/c.json"]
    assert tags[1][1] == store.read_tagged(storage.join(root, "f", "b.json"))[1]  # the tag a conditional write takes
    assert [n for n, _ in store.list_tagged(storage.join(root, "f"), after="a.json", until="b.json")] == ["b.json"]
    store.copy(storage.join(root, "f", "a.json"), storage.join(root, "g", "a.json"))
    assert store.read_tagged(storage.join(root, "g", "a.json"))[0] == b"a.json"
    assert len(store.some_files(storage.join(root, "f"), 2)) == 2
    assert store.exists(storage.join(root, "f", "sub", "c.json"))
    assert not store.exists(storage.join(root, "f", "nothing.json"))


def test_the_longest_mounted_prefix_serves_a_uri():
    with storage.mounted("s3://bucket/lake", A) as a, storage.mounted("s3a://bucket/lake/inner/", B) as b:
        assert isinstance(a, S3Store) and a.options == A and b.options == B
        assert storage.store_for("s3://bucket/lake/t/_delta_log/0.json") is a
        assert storage.store_for("s3a://bucket/lake") is a  # s3a:// is s3://
        assert storage.store_for("s3://bucket/lake/inner/t/part-0.parquet") is b
        assert storage.store_for("s3://bucket/lake2/x") is not a  # a sibling whose name starts alike
        assert storage.store_for("s3://other/lake/x").options == ObjectStoreOptions()  # the environment's
        with storage.mounted("s3://", B) as everywhere:  # a bare scheme: every URI no longer prefix claims
            assert storage.store_for("s3://other/lake/x") is everywhere
            assert storage.store_for("s3://bucket/lake/x") is a
        assert storage.mount("s3://bucket/lake", replace(A)) is a  # the same settings keep the store (its clients)
    assert storage.store_for("s3://bucket/lake/x").options == ObjectStoreOptions()  # unmounted on leaving


def test_each_mounted_bucket_gets_its_own_spark_settings():
    """Spark's s3a reads per-bucket settings (`fs.s3a.bucket.<b>.*`): two buckets on two stores in one session."""
    with storage.mounted("s3://bucket-a/lake", A), storage.mounted("s3://bucket-b/lake", B):
        conf = storage.spark_conf()
        assert conf["spark.hadoop.fs.s3a.bucket.bucket-a.endpoint"] == "http://127.0.0.1:1"
        assert conf["spark.hadoop.fs.s3a.bucket.bucket-b.endpoint"] == "http://127.0.0.1:2"
        assert conf["spark.hadoop.fs.s3a.bucket.bucket-a.access.key"] == "key-a"
        assert conf["spark.hadoop.fs.s3a.bucket.bucket-b.secret.key"] == "secret-b"
        only_a = storage.spark_conf("s3://bucket-a/lake/t")
        assert only_a and all(k.startswith("spark.hadoop.fs.s3a.bucket.bucket-a.") for k in only_a)
    aws = S3Store(ObjectStoreOptions(region="eu-west-1")).spark_conf("s3://on-aws/lake")
    assert aws["spark.hadoop.fs.s3a.bucket.on-aws.endpoint"] == "s3.eu-west-1.amazonaws.com"  # not another store's
    assert storage.spark_conf("/tmp/lake") == {}


@pytest.mark.parametrize("uri", ["gcs://bucket/lake", "adl://account.azuredatalakestore.net/lake"])
def test_object_stores_without_a_store_are_refused_by_name(uri):
    scheme = uri.split("://")[0]
    for attempt in (lambda: storage.store_for(uri), lambda: storage.resolve_root(uri), lambda: storage.read(uri),
                    lambda: storage.mount(uri, A), lambda: storage.is_object_store(uri)):
        with pytest.raises(StorageError, match=f"{scheme}:// is not supported yet") as info:
            attempt()
        assert uri in str(info.value) and "s3://" in str(info.value)  # what to use instead


def test_two_roots_on_two_servers_each_reach_their_own(s3_server, second_s3_server):
    """Two roots mounted with two stores' options in one process: Laminar's own files, deltalake's
    commits and pyarrow's Parquet files each land on the root's own server, and nowhere else."""
    one, two = s3_server.bucket(), second_s3_server.bucket()
    with storage.mounted(one, s3_server.options), storage.mounted(two, second_s3_server.options):
        for root, text in ((one, b"one"), (two, b"two")):
            assert storage.create(storage.join(root, "_laminar", "locks", "p.lock"), text)
            write_deltalake(storage.join(root, "t"), pa.table({"x": [len(text)]}),
                            storage_options=storage.delta_options(storage.join(root, "t")))
            fs, path = storage.filesystem(storage.join(root, "uncommitted", "f.parquet"))
            pq.write_table(pa.table({"y": [text.decode()]}), path, filesystem=fs)
        for root, text in ((one, b"one"), (two, b"two")):
            assert storage.read(storage.join(root, "_laminar", "locks", "p.lock")) == text
            assert not storage.create(storage.join(root, "_laminar", "locks", "p.lock"), b"again")  # put-if-absent
            table = DeltaTable(storage.join(root, "t"), storage_options=storage.delta_options(storage.join(root, "t")))
            assert table.to_pyarrow_table().column("x").to_pylist() == [len(text)]
    for server, root, other in ((s3_server, one, two), (second_s3_server, two, one)):
        client = server.options.client()
        bucket, other_bucket = root[len("s3://"):].split("/")[0], other[len("s3://"):].split("/")[0]
        keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
        assert "lake/_laminar/locks/p.lock" in keys and "lake/uncommitted/f.parquet" in keys
        assert any(k.startswith("lake/t/_delta_log/") for k in keys)
        assert other_bucket not in [b["Name"] for b in client.list_buckets()["Buckets"]]


def test_two_roots_with_their_own_credentials_in_one_process(s3proxy_server):
    """s3proxy checks signatures: a root mounted with refused credentials fails in one line, and the root
    beside it, mounted with the right ones, keeps working (each store signs with its own key)."""
    good, bad = s3proxy_server.bucket(), s3proxy_server.bucket()
    wrong = replace(s3proxy_server.options, access_key_id="nobody", secret_access_key="wrong-secret")
    with storage.mounted(good, s3proxy_server.options), storage.mounted(bad, wrong):
        with pytest.raises(StorageError, match="refused the credentials") as info:
            storage.write(storage.join(bad, "x.json"), b"{}")
        assert bad in str(info.value) and "wrong-secret" not in str(info.value)
        storage.write(storage.join(good, "x.json"), b"{}")
        assert storage.read(storage.join(good, "x.json")) == b"{}"
        with pytest.raises(StorageError, match="refused the credentials"):
            storage.mount(bad + "/deeper", wrong, check=True)  # a mount that is checked first
