"""The Azure store (`laminar_assets.storage.azure`) against Azurite, the Azure Storage emulator: which URIs
it takes and keeps, its ETag preconditions under a race, the settings deltalake, pyarrow and Spark get, and
one clear line for an endpoint that cannot be reached or a key that is refused. (The store protocol's
contract tests run on Azure too: tests/storage/test_files.py and test_stores.py, parametrized.)"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_assets import storage
from laminar_assets.errors import StorageError, StoreUnavailableError
from laminar_assets.storage import AzureOptions, AzureStore

ROOT = "abfss://lake@acct.dfs.core.windows.net/root"


@pytest.mark.parametrize("uri", [ROOT, "abfs://lake@acct.dfs.core.windows.net/root/",
                                 "abfss://lake@acct.blob.core.windows.net/root", "wasbs://lake@acct.blob.core.windows.net/root",
                                 "wasb://lake@acct.dfs.core.windows.net/root"])
def test_every_spelling_of_an_azure_uri_is_kept_as_one(uri):
    assert storage.resolve_root(uri) == ROOT
    assert isinstance(storage.store_for(uri), AzureStore)
    with storage.mounted(ROOT, AzureOptions(endpoint="http://127.0.0.1:1", account_key="k")) as mounted:
        assert storage.store_for(storage.join(uri, "t", "_delta_log", "0.json")) is mounted


def test_az_uris_take_their_account_from_the_environment(monkeypatch):
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT", raising=False)
    monkeypatch.delenv("AZURE_STORAGE_ACCOUNT_NAME", raising=False)
    with pytest.raises(StorageError, match="names no storage account: set AZURE_STORAGE_ACCOUNT_NAME"):
        storage.resolve_root("az://lake/root")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "acct")
    assert storage.resolve_root("az://lake/root") == ROOT
    with pytest.raises(StorageError, match="names its container and account"):
        storage.resolve_root("abfss://lake/root")  # no account: which one is unknown


def test_spark_settings_are_the_accounts_own_and_keep_the_key_out_of_sight():
    real = AzureStore(AzureOptions(account_key="real-key", request_timeout_s=7))
    conf = real.spark_conf(ROOT)
    assert conf["spark.hadoop.fs.azure.account.key.acct.dfs.core.windows.net"] == "real-key"
    assert conf["spark.hadoop.fs.azure.http.read.timeout"] == "7000"
    assert real.spark_uri(ROOT + "/t/f.parquet") == ROOT + "/t/f.parquet"
    assert "real-key" not in repr(real) and "real-key" not in real.describe()
    # an emulator: ABFS's blob-endpoint client on the blob host, reached through fs.azure.abfs.endpoint
    emulator = AzureStore(AzureOptions(endpoint="http://127.0.0.1:10000", account_key="k"))
    assert emulator.spark_uri(ROOT + "/t") == "abfs://lake@acct.dfs.core.windows.net/root/t"
    conf = emulator.spark_conf(ROOT)
    host = "acct.dfs.core.windows.net"
    assert conf[f"spark.hadoop.fs.azure.abfs.endpoint.{host}"] == "127.0.0.1:10000"
    assert conf[f"spark.hadoop.fs.azure.fns.account.service.type.{host}"] == "BLOB"
    assert conf[f"spark.hadoop.fs.azure.always.use.https.{host}"] == "false"
    assert emulator.delta_options(ROOT)["azure_storage_endpoint"] == "http://127.0.0.1:10000/acct"


def _failing_within(seconds: float, fn, error=StorageError, match: str = ""):
    started = time.monotonic()
    with pytest.raises(error, match=match) as info:
        fn()
    assert time.monotonic() - started < seconds
    message = str(info.value)
    assert "\n" not in message and "Traceback" not in message
    return message


def test_an_unreachable_endpoint_is_one_line_within_seconds():
    root = "abfss://lake@devstoreaccount1.dfs.core.windows.net/root"
    with storage.mounted(root, AzureOptions(endpoint="http://127.0.0.1:1", account_key="a2V5")):
        message = _failing_within(15, lambda: storage.check_reachable(root), StoreUnavailableError, "cannot connect")
        assert root in message and "http://127.0.0.1:1/devstoreaccount1" in message and "AZURE_STORAGE_ENDPOINT" in message
        _failing_within(15, lambda: storage.write(storage.join(root, "x.json"), b"{}"), StoreUnavailableError,
                        "cannot connect")


def test_a_wrong_key_a_missing_container_and_no_key_say_what_to_fix(azurite_server, monkeypatch):
    root = azurite_server.container()
    wrong = replace(azurite_server.options, account_key="d3Jvbmcta2V5LXdyb25nLWtleQ==")
    with storage.mounted(root, wrong):
        message = _failing_within(15, lambda: storage.check_reachable(root), match="refused the credentials")
        assert "(AuthorizationFailure)" in message and "AZURE_STORAGE_ACCOUNT_KEY" in message
        assert wrong.account_key not in message
        _failing_within(15, lambda: storage.write(storage.join(root, "x.json"), b"{}"), match="refused")
    missing = root.replace(root.split("://")[1].split("@")[0], "no-such-container", 1)
    with storage.mounted(missing, azurite_server.options):
        _failing_within(15, lambda: storage.check_reachable(missing), match="'no-such-container' does not exist")
    for name in ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_KEY", "AZURE_STORAGE_SAS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    with storage.mounted(root, AzureOptions(endpoint=azurite_server.endpoint)):
        _failing_within(15, lambda: storage.read(storage.join(root, "x.json")), match="no credentials")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", azurite_server.options.account_key)  # read when used
    with storage.mounted(root, AzureOptions(endpoint=azurite_server.endpoint)):
        storage.check_reachable(root)


RACES = 50


def test_two_writers_racing_on_create_if_absent_one_wins_every_time(azurite_server):
    """Two threads put-if-absent the same blob at the same moment, RACES times: Azurite checks
    If-None-Match: * with the write, so exactly one wins each race (the lease rule rests on this)."""
    root = azurite_server.container()
    store = AzureStore(azurite_server.options)
    store.create_tagged(storage.join(root, "warm"), b"")  # the client's connections, made before the races
    barrier = threading.Barrier(2)
    wins: list[int] = []

    def writer(i: int, who: bytes) -> None:
        barrier.wait()
        if store.create_tagged(storage.join(root, "locks", f"{i}.lock"), who) is not None:
            wins.append(i)

    for i in range(RACES):
        threads = [threading.Thread(target=writer, args=(i, w)) for w in (b"a", b"b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert sorted(wins) == list(range(RACES)), f"{len(wins)} wins in {RACES} races"
    # compare-and-swap races the same way: of two replaces from one read version, one wins
    uri = storage.join(root, "locks", "0.lock")
    replaced: list[str] = []
    for _ in range(10):
        _, tag = store.read_tagged(uri)
        barrier.reset()

        def swap(who: str, tag=tag) -> None:
            barrier.wait()
            if store.replace_tagged(uri, who.encode(), tag) is not None:
                replaced.append(who)

        threads = [threading.Thread(target=swap, args=(w,)) for w in ("a", "b")]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(replaced) == 10, replaced


def test_deltalake_and_pyarrow_reach_the_lake_with_the_stores_settings(azure_lake, azurite_server):
    root = azure_lake.root
    table = storage.join(root, "t")
    write_deltalake(table, pa.table({"x": [1, 2]}), storage_options=storage.delta_options(table))
    write_deltalake(table, pa.table({"x": [3]}), mode="append", storage_options=storage.delta_options(table))
    assert sorted(DeltaTable(table, storage_options=storage.delta_options(table)).to_pyarrow_table()
                  .column("x").to_pylist()) == [1, 2, 3]
    fs, path = storage.filesystem(storage.join(root, "uncommitted", "f.parquet"))
    pq.write_table(pa.table({"y": ["a"]}), path, filesystem=fs)
    assert pq.read_table(path, filesystem=fs).column("y").to_pylist() == ["a"]
    names = [u.rsplit("/", 1)[-1] for u, _ in storage.list_files(root)]
    assert "f.parquet" in names and "00000000000000000001.json" in names


def test_a_frozen_emulator_fails_each_python_client_within_its_bounds(tmp_path):
    """Azurite stopped (SIGSTOP) after a table was written: the Azure SDK's calls and deltalake's give up
    within the options' bounds with one line naming the endpoint; then the store's calls fail at once."""
    import os
    import signal

    from laminar_assets.deploy.azurite import Azurite
    from laminar_assets.engine.run.protocol import store_unavailable

    with Azurite(log=str(tmp_path / "azurite.log")) as server:
        root = server.container()
        bounds = replace(server.options, connect_timeout_s=1, request_timeout_s=1, max_attempts=2, call_timeout_s=2)
        with storage.mounted(root, bounds):
            table = storage.join(root, "t")
            write_deltalake(table, pa.table({"x": [1]}), storage_options=storage.delta_options(table))
            storage.write(storage.join(root, "w.json"), b"{}")
            os.killpg(server.process.pid, signal.SIGSTOP)
            try:
                message = _failing_within(8, lambda: storage.read(storage.join(root, "w.json")), StoreUnavailableError,
                                          "did not answer within its time bounds")
                assert "http://127.0.0.1:" in message and "w.json" in message
                _failing_within(1, lambda: storage.read(storage.join(root, "w.json")), StoreUnavailableError,
                                "did not answer a moment ago")  # the next calls do not wait again
                started = time.monotonic()
                with pytest.raises(Exception) as info:  # noqa: B017  (deltalake's own error, recognized below)
                    DeltaTable(table, storage_options=storage.delta_options(table)).to_pyarrow_table()
                assert time.monotonic() - started < 10
                found = store_unavailable(info.value)
                assert found is not None and "\n" not in found.message and "_delta_log" in found.message, info.value
            finally:
                os.killpg(server.process.pid, signal.SIGCONT)


def test_the_resource_reaches_an_azure_root_with_its_azure_fields():
    from laminar_assets.resources import LaminarResource, SparkResource

    resource = LaminarResource(root="abfs://lake@acct.blob.core.windows.net/root", spark=SparkResource(),
                               azure_endpoint="http://127.0.0.1:1", azure_account_key="k", s3_call_timeout_s=5.0)
    expected = AzureOptions(endpoint="http://127.0.0.1:1", account_key="k", call_timeout_s=5.0)
    try:
        assert resource.resolved_root() == ROOT
        assert storage.store_for(storage.join(ROOT, "t")) == AzureStore(expected)
    finally:
        storage.unmount(ROOT)


def test_a_spark_started_as_a_process_gets_no_azure_key_on_its_command_line():
    """jvm_conf(secrets=False) is what a Connect server is started with: ABFS's account keys stay out."""
    from laminar_assets.engine import SparkOptions
    from laminar_assets.engine.spark.session import jvm_conf

    with storage.mounted(ROOT, AzureOptions(account_key="the-key", sas_token="the-sas")):
        assert "the-key" in str(storage.spark_conf())
        assert "the-key" not in str(jvm_conf(SparkOptions(), secrets=False))


def test_what_abfs_and_deltalake_say_of_a_silent_azure_store_is_read_as_one_line():
    """ABFS names neither the path nor the host (the Azure store mounted is named); deltalake names the
    blob's URL (the emulator's path style: account, container, blob), read back as the abfss:// object."""
    from laminar_assets.storage import failures

    abfs = ("An error occurred while calling o112.parquet.\n: Status code: -1 error code: null error message: "
            "java.net.SocketTimeoutException: Read timed out\n\tat org.apache.hadoop.fs.azurebfs.services."
            "AbfsRestOperation.executeHttpOperation(AbfsRestOperation.java:547)")
    delta = ("Generic MicrosoftAzure error: Error performing GET http://127.0.0.1:5/acct/lake/root/t/_delta_log/"
             "_last_checkpoint in 1ms: error sending request\n  tcp connect error: Connection refused")
    with storage.mounted(ROOT, AzureOptions(endpoint="http://127.0.0.1:5", account_key="k")):
        found = failures.recognize([abfs])
        assert found.kind == "timeout" and found.where() == "http://127.0.0.1:5"
        found = failures.recognize([delta])
        assert found.kind == "unreachable" and found.uri == ROOT + "/t/_delta_log/_last_checkpoint"
        message = failures.unavailable(found).message
        assert "AZURE_STORAGE_ENDPOINT" in message and "\n" not in message
