"""GCS (gs://) as a lake's store, against fake-gcs-server on 127.0.0.1 (tests/gcs_server.py): generation
preconditions that two racing writers cannot both pass, what deltalake, pyarrow and Spark's connector are
given, and one clear line for an endpoint nobody answers at, a store that stops answering, a missing key
file, refused credentials and a missing bucket. The protocol's own contract runs on gs:// in
tests/storage/test_stores.py and test_files.py."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_assets import storage
from laminar_assets.errors import StorageError, StoreUnavailableError
from laminar_assets.storage import ObjectStoreOptions
from laminar_assets.storage.gcs import GcsOptions, GcsStore
from tests.gcs_server import start_fake_gcs

ROUNDS = 60


def _race(calls) -> list:
    """Run the calls at the same moment (a barrier), one thread each; their results."""
    out = [None] * len(calls)
    barrier = threading.Barrier(len(calls))

    def run(i):
        barrier.wait()
        out[i] = calls[i]()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return out


def test_two_writers_racing_on_one_object_never_both_win(gcs_server):
    """Two stores (two clients, two connections) race ROUNDS times on a new object's put-if-absent, and on
    a compare-and-swap of one version: each time exactly one wins. (fake-gcs-server checks a write's
    ifGenerationMatch under the lock it writes under: 500 rounds of each, measured, never both.)"""
    bucket = gcs_server.bucket()
    one, two = GcsStore(gcs_server.options), GcsStore(replace(gcs_server.options, project="another"))
    for i in range(ROUNDS):
        uri = storage.join(bucket, "_laminar", "locks", f"p{i}.lock")
        created = _race([lambda u=uri: one.create_tagged(u, b"one"), lambda u=uri: two.create_tagged(u, b"two")])
        assert sum(tag is not None for tag in created) == 1, created
        winner = b"one" if created[0] else b"two"
        data, tag = one.read_tagged(uri)
        assert data == winner and tag == next(t for t in created if t)  # the tag the winner was given
        replaced = _race([lambda u=uri, t=tag: one.replace_tagged(u, b"r1", t),
                          lambda u=uri, t=tag: two.replace_tagged(u, b"r2", t)])
        assert sum(t is not None for t in replaced) == 1, replaced
        assert one.read_tagged(uri) == ((b"r1" if replaced[0] else b"r2"), next(t for t in replaced if t))


def test_deltalake_pyarrow_and_the_store_share_one_bucket(gcs_server):
    """deltalake commits (object_store: put-if-absent of each log entry) and reads, pyarrow writes and
    reads Parquet, on the options the store hands them; a second commit of one version is refused."""
    root = gcs_server.bucket()
    with storage.mounted(root, gcs_server.options):
        table = storage.join(root, "t")
        write_deltalake(table, pa.table({"x": [1]}), storage_options=storage.delta_options(table))
        write_deltalake(table, pa.table({"x": [2]}), mode="append", storage_options=storage.delta_options(table))
        assert sorted(DeltaTable(table, storage_options=storage.delta_options(table)).to_pyarrow_table()
                      .column("x").to_pylist()) == [1, 2]
        log = storage.join(table, "_delta_log", f"{1:020d}.json")
        assert not storage.create(log, b"{}")  # a version is committed once (what deltalake's commit relies on)
        fs, path = storage.filesystem(storage.join(root, "uncommitted", "f.parquet"))
        pq.write_table(pa.table({"y": ["a"]}), path, filesystem=fs)
        assert pq.read_table(path, filesystem=fs).column("y").to_pylist() == ["a"]
        names = [u.rsplit("/", 1)[-1] for u, _ in storage.list_files(root)]
        assert "f.parquet" in names and f"{1:020d}.json" in names


def test_settings_each_client_is_given():
    """The emulator's settings (no credentials) and a key file's, for deltalake, Spark's connector and a
    process Laminar starts; the connector's settings are scheme-wide (it has no per-bucket ones)."""
    emulator = GcsStore(GcsOptions(endpoint="http://127.0.0.1:4443", project="p"))
    delta = emulator.delta_options("gs://b/t")
    assert json.loads(delta["google_service_account_key"]) == {
        "gcs_base_url": "http://127.0.0.1:4443", "disable_oauth": True, "client_email": "", "private_key": "",
        "private_key_id": ""}
    assert delta["allow_http"] == "true" and delta["timeout"] == "10000ms" and delta["max_retries"] == "2"
    spark = emulator.spark_conf("gs://b/t")
    assert spark == emulator.spark_conf()  # one set for the scheme
    assert spark["spark.hadoop.fs.gs.storage.root.url"] == "http://127.0.0.1:4443/"
    assert spark["spark.hadoop.fs.gs.auth.type"] == "UNAUTHENTICATED"
    assert spark["spark.hadoop.fs.gs.impl"] == "com.google.cloud.hadoop.fs.gcs.GoogleHadoopFileSystem"
    keyed = GcsStore(GcsOptions(credentials="/keys/sa.json", request_timeout_s=4, call_timeout_s=9))
    assert keyed.delta_options("gs://b/t")["google_application_credentials"] == "/keys/sa.json"
    assert "google_service_account_key" not in keyed.delta_options("gs://b/t")
    conf = keyed.spark_conf()
    assert conf["spark.hadoop.fs.gs.auth.type"] == "SERVICE_ACCOUNT_JSON_KEYFILE"
    assert conf["spark.hadoop.fs.gs.auth.service.account.json.keyfile"] == "/keys/sa.json"
    assert "spark.hadoop.fs.gs.storage.root.url" not in conf and conf["spark.hadoop.fs.gs.http.max.retry"] == "1"
    assert keyed.env() == {"GOOGLE_APPLICATION_CREDENTIALS": "/keys/sa.json"}
    assert storage.spark_uri("gs://b/t/f.parquet") == "gs://b/t/f.parquet"
    assert storage.resolve_root("gs://b/lake/") == "gs://b/lake"
    with pytest.raises(StorageError, match="S3 options"):
        GcsStore(ObjectStoreOptions(endpoint="http://127.0.0.1:9000"))
    assert GcsStore(ObjectStoreOptions(call_timeout_s=5)).options.call_timeout_s == 5  # a resource's bounds


def test_the_resource_mounts_its_gs_root_with_its_gcs_fields(gcs_server):
    from laminar_assets.resources import LaminarResource, SparkResource

    bucket = gcs_server.bucket()
    resource = LaminarResource(root=bucket, spark=SparkResource(), gcs_endpoint=gcs_server.endpoint,
                               gcs_project="p", s3_call_timeout_s=5.0)
    assert resource.store(bucket) == GcsOptions(endpoint=gcs_server.endpoint, project="p", call_timeout_s=5.0)
    try:
        assert resource.resolved_root() == bucket
        mounted = storage.store_for(storage.join(bucket, "x.json"))
        assert isinstance(mounted, GcsStore) and mounted.options.endpoint == gcs_server.endpoint
        assert resource.checkpoints().partitions("nothing") == []  # reaches the bucket with those options
    finally:
        storage.unmount(bucket)


def _one_line_within(seconds: float, fn, error=StorageError, match: str = ""):
    started = time.monotonic()
    with pytest.raises(error, match=match) as info:
        fn()
    assert time.monotonic() - started < seconds
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_an_unreachable_endpoint_is_one_line_at_once():
    with storage.mounted("gs://bucket/lake", GcsOptions(endpoint="http://127.0.0.1:1")):
        message = _one_line_within(5, lambda: storage.check_reachable("gs://bucket/lake"), StoreUnavailableError,
                                   "cannot connect")
        assert "gs://bucket/lake" in message and "http://127.0.0.1:1" in message and "STORAGE_EMULATOR_HOST" in message


def test_a_store_that_stops_answering_fails_within_its_bounds():
    """The emulator frozen (SIGSTOP): a read fails after its attempts (2 x 0.5 s), in one line naming the
    object and the endpoint; the next call fails at once instead of waiting again."""
    server = start_fake_gcs()
    try:
        root = server.bucket()
        quick = replace(server.options, request_timeout_s=0.5, call_timeout_s=1.5, max_attempts=2)
        store = GcsStore(quick)
        store.write(storage.join(root, "w.json"), b"{}")
        os.kill(server.process.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 5  # stopped: the signal takes a moment to reach every thread
        while _state(server.process.pid) != "T" and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            message = _one_line_within(4, lambda: store.read_tagged(storage.join(root, "w.json")),
                                       StoreUnavailableError, "did not answer")
            assert f"{root}/w.json" in message and server.endpoint in message
            _one_line_within(0.5, lambda: store.exists(storage.join(root, "w.json")), StoreUnavailableError,
                             "not waited on again")
        finally:
            os.kill(server.process.pid, signal.SIGCONT)
    finally:
        server.stop()


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def test_a_missing_key_file_and_refused_credentials_say_what_to_fix(gcs_server, tmp_path):
    """A key file that is not there; and a service account's key whose token request is refused (its
    token_uri points at the emulator, which has no token endpoint): one line each, the key never shown."""
    bucket = gcs_server.bucket()
    missing = GcsStore(GcsOptions(endpoint=gcs_server.endpoint, credentials=str(tmp_path / "nothing.json")))
    message = _one_line_within(10, lambda: missing.check_reachable(bucket), match="no usable credentials")
    assert "nothing.json" in message and "GOOGLE_APPLICATION_CREDENTIALS" in message

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    path = tmp_path / "sa.json"
    path.write_text(json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "k1",
                                "private_key": key, "client_email": "laminar@p.iam.gserviceaccount.com",
                                "client_id": "1", "token_uri": f"{gcs_server.endpoint}/token"}))
    refused = GcsStore(GcsOptions(endpoint=gcs_server.endpoint, credentials=str(path), call_timeout_s=5))
    message = _one_line_within(10, lambda: refused.check_reachable(bucket), match="refused the credentials")
    assert bucket in message and "PRIVATE KEY" not in message and key.splitlines()[1] not in message


def test_a_missing_bucket_says_what_to_fix(gcs_server):
    with storage.mounted("gs://no-such-bucket/lake", gcs_server.options):
        message = _one_line_within(10, lambda: storage.check_reachable("gs://no-such-bucket/lake"),
                                   match="does not exist")
        assert "'no-such-bucket'" in message and "create it" in message


def test_a_timeout_deltalake_or_spark_met_on_gcs_is_recognized_with_its_gs_uri():
    """The texts deltalake (object_store) and Spark's connector give for a GCS that does not answer become
    the one-line failure about the gs:// object (not an s3:// one)."""
    from laminar_assets.storage.failures import recognize

    delta = ("Generic GCS error\n \x1b[31m↳\x1b[0m Error performing GET http://127.0.0.1:4443/b/lake%2Ft%2F_delta_log"
             "%2F00000000000000000003.json in 10.0s - HTTP error\n  ↳ operation timed out")
    found = recognize([delta])
    assert found is not None and found.kind == "timeout"
    assert found.uri == "gs://b/lake/t/_delta_log/00000000000000000003.json" and found.endpoint == "http://127.0.0.1:4443"
    spark = ("java.net.SocketTimeoutException: Read timed out while reading gs://b/lake/t/part-0.parquet "
             "(com.google.cloud.hadoop.repackaged.gcs...)")
    found = recognize(["Job aborted", spark])
    assert found is not None and found.kind == "timeout" and found.uri == "gs://b/lake/t/part-0.parquet"

