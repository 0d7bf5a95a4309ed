"""A store that stops answering fails every call within the store's time bounds, in one line naming
the endpoint and the object: boto3, deltalake and pyarrow against a local S3 server frozen with
SIGSTOP (it accepts connections and never answers, as a hung store does), and killed.

On main an s3a call could wait (1 + 3 SDK retries) x (1 + 3 S3A retries) x 30 s and a run on a frozen
server hung for 240+ s; deltalake's failure was a raw "Generic S3 error" with ANSI colour codes."""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from dataclasses import replace

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_assets import storage
from laminar_assets.errors import StoreUnavailableError
from laminar_assets.storage import ObjectStoreOptions, failures
from laminar_assets.storage.options import S3A_FLOOR_S

# short bounds, so each frozen call costs about two seconds
BOUNDS = dict(connect_timeout_s=1.0, request_timeout_s=1.0, call_timeout_s=2.0)
SLACK = 3.0  # a call ends within its budget plus this (backoff between attempts, a loaded machine)


@contextmanager
def frozen(server):
    """The server's process stopped (SIGSTOP) while the block runs: the kernel still accepts
    connections, nobody answers. Always resumed (SIGCONT), also on failure."""
    os.kill(server.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(server.process.pid, signal.SIGCONT)


@pytest.fixture
def bounded(second_s3_server):
    """(server, root, options): a bucket on a server of this test's own, reached with short bounds."""
    options = replace(second_s3_server.options, **BOUNDS)
    root = second_s3_server.bucket()
    with storage.mounted("s3://", options), storage.mounted(root, options):
        yield second_s3_server, root, options


def _fails_within(seconds: float, call):
    started = time.monotonic()
    with pytest.raises(Exception) as info:  # noqa: PT011  (each client raises its own kind; checked below)
        call()
    took = time.monotonic() - started
    assert took < seconds, f"failed after {took:.1f} s, bounds {seconds:.1f} s"
    return info.value, took


def _one_clear_line(message: str, endpoint: str, uri: str) -> None:
    assert "\n" not in message and "\x1b" not in message, message
    assert endpoint in message and uri in message, message
    assert "laminar-local-secret" not in message  # the test servers' secret key, never in a message


def test_every_client_fails_within_the_bounds_on_a_frozen_store(bounded):
    server, root, options = bounded
    table, obj = storage.join(root, "t"), storage.join(root, "k.json")
    write_deltalake(table, pa.table({"x": [1, 2]}), storage_options=storage.delta_options(table))
    storage.write(obj, b"{}")
    budget = options.call_timeout_s + SLACK
    with frozen(server):
        # boto3 (watermarks, leases): the store's own error, one line
        err, _ = _fails_within(budget, lambda: storage.read(obj))
        assert isinstance(err, StoreUnavailableError) and err.retryable
        _one_clear_line(str(err), server.endpoint, obj)
        assert "did not answer" in str(err)
        # the store found not answering is not waited on again for a call's budget: clean-up calls after a
        # failure (records, leases, uncommitted files) fail at once instead of one budget each
        err, took = _fails_within(0.5, lambda: storage.write(storage.join(root, "other.json"), b"{}"))
        assert isinstance(err, StoreUnavailableError) and took < 0.5
        # deltalake (Delta logs, commits) and pyarrow (Parquet files, log entries): their own errors, read
        # as one line by `failures` (what the engine raises)
        for call in (lambda: DeltaTable(table, storage_options=storage.delta_options(table)).version(),
                     lambda: (lambda fs, p: fs.open_input_stream(p).read())(*storage.filesystem(obj))):
            err, _ = _fails_within(budget, call)
            found = failures.recognize([str(err)])
            assert found is not None and found.kind == "timeout", str(err)
            line = str(failures.unavailable(found, bounds=options.budget()))
            _one_clear_line(line, server.endpoint, "s3://" + obj.split("://", 1)[1].split("/")[0])
    time.sleep(options.call_timeout_s)  # the store answers again once its pause is over
    assert storage.read(obj) == b"{}"
    assert DeltaTable(table, storage_options=storage.delta_options(table)).version() == 0


def test_a_killed_store_is_one_line_without_colour_codes(bounded):
    server, root, _ = bounded
    table = storage.join(root, "t")
    write_deltalake(table, pa.table({"x": [1]}), storage_options=storage.delta_options(table))
    server.stop()
    err, _ = _fails_within(10, lambda: DeltaTable(table, storage_options=storage.delta_options(table)).version())
    assert "\x1b[" in str(err) or "Generic S3 error" in str(err)  # what deltalake says, as on main
    found = failures.recognize([str(err)])
    assert found is not None and found.kind == "unreachable", str(err)
    line = str(failures.unavailable(found))
    _one_clear_line(line, server.endpoint, table)
    assert "cannot connect" in line and "AWS S3 (default region)" not in line
    err, _ = _fails_within(10, lambda: storage.read(storage.join(root, "k.json")))
    assert isinstance(err, StoreUnavailableError) and "cannot connect" in str(err)


def test_each_client_is_held_to_the_call_budget():
    """The settings each client gets keep a call on a hung store within `call_timeout_s` (s3a at its
    15 s floor). On main s3a retried in two layers: up to 16 attempts of 30 s."""
    import botocore.config  # noqa: F401  (the client's Config is read back below)

    options = ObjectStoreOptions(endpoint="http://127.0.0.1:9", access_key_id="k", secret_access_key="s")
    assert options.call_timeout_s <= 30 and options.request_timeout_s <= 10
    client = options.client()
    config = client.meta.config
    attempts = config.retries["total_max_attempts"]
    assert attempts * config.read_timeout <= options.call_timeout_s
    delta = options.delta_options()
    seconds = {k: float(delta[k].removesuffix("ms")) / 1000 for k in ("timeout", "retry_timeout")}
    assert seconds["timeout"] + seconds["retry_timeout"] <= options.call_timeout_s
    s3a = {k.removeprefix("spark.hadoop.fs.s3a."): v for k, v in options.spark_conf().items()}
    assert s3a["attempts.maximum"] == "0"  # one layer of retries: S3A's
    attempt = int(s3a["connection.timeout"]) / 1000
    assert attempt >= S3A_FLOOR_S and int(s3a["connection.request.timeout"]) / 1000 == attempt
    assert (int(s3a["retry.limit"]) + 1) * attempt <= options.call_timeout_s
    short = ObjectStoreOptions(**BOUNDS)
    assert short.attempts(short.request_timeout_s) == 2 and short.attempts(S3A_FLOOR_S) == 1
    with pytest.raises(Exception, match="call_timeout_s must be a number of seconds > 0"):
        ObjectStoreOptions(call_timeout_s=0)
    # the Dagster resource sets them too (unset: the defaults)
    from laminar_assets.resources import LaminarResource, SparkResource

    store = LaminarResource(root="s3://b/lake", spark=SparkResource(), s3_request_timeout_s=2.0,
                            s3_call_timeout_s=5.0).store()
    assert (store.request_timeout_s, store.call_timeout_s) == (2.0, 5.0)
    assert LaminarResource(root="s3://b/lake", spark=SparkResource()).store() == ObjectStoreOptions()


def test_a_lease_a_frozen_store_kept_is_taken_over_by_this_process_next_run(bounded):
    """A run that fails because the store stopped answering cannot release its lease either. The lease
    names this very process, alive, so on main it blocked every later run of the partition here for
    `lease_seconds` (6 hours); the process knows that run ended, so its next run takes the lease over.
    A lease a live run of this process holds still excludes."""
    from laminar_assets.checkpoints import CheckpointStore
    from laminar_assets.errors import ConcurrentRunError

    server, root, options = bounded
    leases, lock = CheckpointStore(root), storage.join(root, "_laminar", "locks", "f", "p.lock")
    with pytest.raises(RuntimeError, match="the run's own error"):
        with leases.lease("f", "p", "run-1"):
            held = storage.read(lock)
            os.kill(server.process.pid, signal.SIGSTOP)
            try:
                raise RuntimeError("the run's own error")  # the release below meets the frozen store
            finally:
                threading.Timer(options.call_timeout_s + 1, os.kill, (server.process.pid, signal.SIGCONT)).start()
    time.sleep(2 * options.call_timeout_s + 1.5)  # resumed, and the store's pause after the failure is over
    # the frozen server still had the DELETE in its socket and ran it when resumed; a store cut off by the
    # network never gets it: the lease stays as the failed run wrote it
    storage.write(lock, held)
    with leases.lease("f", "p", "run-2"):
        with pytest.raises(ConcurrentRunError, match="run-2"):
            with leases.lease("f", "p", "run-3"):
                pass


def test_what_s3a_says_is_read_as_the_object_and_the_store_it_was_mounted_with():
    """s3a names the object, not the endpoint: the line takes the endpoint from the store mounted for the
    object. Spark's own timeouts (a broadcast) about a plan over s3a:// paths are no store's failure."""
    s3a = ("org.apache.hadoop.fs.s3a.AWSClientIOException: getFileStatus on s3a://b-1/lake/t/part-0.parquet: "
           "software.amazon.awssdk.core.exception.SdkClientException: Unable to execute HTTP request: Read timed out")
    with storage.mounted("s3://b-1", ObjectStoreOptions(endpoint="http://127.0.0.1:9", access_key_id="k",
                                                        secret_access_key="hidden")):
        found = failures.recognize(["An error occurred while calling o51.collectToPython.", s3a])
        assert found == failures.StoreFailure("timeout", "s3://b-1/lake/t/part-0.parquet", None, "s3a")
        line = str(failures.unavailable(found))
        _one_clear_line(line, "http://127.0.0.1:9", "s3://b-1/lake/t/part-0.parquet")
        assert "hidden" not in line
    assert failures.recognize(["java.util.concurrent.TimeoutException: Futures timed out after [300 seconds] "
                               "in FileScan parquet [s3a://b-1/lake/t]"]) is None
    assert failures.plain("a\n  \x1b[31m↳\x1b[0m b") == "a ↳ b"
