"""The engine with the whole lake in a gs:// bucket of a GCS emulator (fake-gcs-server, tests/gcs_server.py):
Spark reads and writes the bucket through Google's GCS connector for Hadoop, deltalake commits through
object_store, Laminar's own files (leases, watermarks, uncommitted files) through google-cloud-storage.

The S3 tests' histories run here as they are (tests/engine/test_object_store.py: a short history with
appends, deletes, updates, a stage and a retracting flow, equal to a recompute; a run whose lease was taken
over never commits twice), then two runs racing on one partition, and a few random histories of the
stateful test (its shortest setting: the object-store matrix runs on few, short histories)."""

from __future__ import annotations

import os
import threading

import pytest

from laminar_assets import storage
from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import Engine, Mode
from laminar_assets.errors import ConcurrentRunError
from tests.conftest import Lake
from tests.engine import test_object_store as on_s3
from tests.engine.stateful_lake import LakeMachine
from tests.engine.test_stateful import run_shard
from tests.gcs_server import using_gcs
from tests.lake_invariants import assert_lake_intact

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("LAMINAR_STATEFUL_GCS_EXAMPLES", "2"))


def test_spark_reads_and_writes_the_bucket_through_the_connector(spark, gcs_lake):
    """The session an engine on a gs:// root set up reads a Delta table's Parquet files and writes Parquet
    files in the bucket itself (the GCS connector: gs:// paths, the emulator's root URL, no credentials)."""
    gcs_lake.create("trades", on_s3.BASE)
    Engine(spark, gcs_lake.root)  # points the session's connector at the root's store
    files = [u for u, _ in storage.list_files(gcs_lake.path("trades")) if u.endswith(".parquet")]
    assert files and all(u.startswith("gs://") for u in files)
    assert spark.read.parquet(*[storage.spark_uri(u) for u in files]).count() == len(on_s3.BASE)
    out = storage.join(gcs_lake.root, "spark-out")
    spark.range(5).repartition(2).write.parquet(storage.spark_uri(out))
    written = [u for u, _ in storage.list_files(out)]
    assert sum(u.endswith(".parquet") for u in written) == 2 and all(u.startswith(out + "/") for u in written)
    assert spark.read.parquet(storage.spark_uri(out)).count() == 5


def test_an_engine_on_a_gs_root_it_cannot_use_fails_in_one_line_before_anything_is_written(spark, gcs_server,
                                                                                         tmp_path):
    """Nobody at the endpoint; a key file that is not there: the engine is not built, the store not mounted."""
    from laminar_assets.errors import StorageError, StoreUnavailableError
    from laminar_assets.storage.gcs import GcsOptions

    bucket = gcs_server.bucket()
    with pytest.raises(StoreUnavailableError, match="cannot connect to the object store at http://127.0.0.1:1"):
        Engine(spark, bucket, store=GcsOptions(endpoint="http://127.0.0.1:1"))
    with pytest.raises(StorageError, match="no usable credentials") as info:
        Engine(spark, bucket, store=GcsOptions(endpoint=gcs_server.endpoint, credentials=str(tmp_path / "k.json")))
    assert "\n" not in str(info.value) and bucket not in storage.registry.mounts()


def test_a_lake_in_a_gcs_bucket_runs_incrementally_and_equals_a_recompute(spark, gcs_lake, tmp_path):
    on_s3.test_a_lake_in_a_bucket_runs_incrementally_and_equals_a_recompute(spark, gcs_lake, tmp_path)


def test_a_run_whose_lease_was_taken_over_does_not_commit_twice_on_gcs(spark, gcs_lake, monkeypatch):
    on_s3.test_a_run_whose_lease_was_taken_over_does_not_commit_twice(spark, gcs_lake, monkeypatch)


def test_two_runs_racing_on_one_partition_commit_once(spark, gcs_lake):
    """Two engines start the same partition's run at the same moment: exactly one commits, the other fails
    at the partition's lease (GCS's create-if-absent) with a retryable ConcurrentRunError. A run that holds
    the lease waits (at most 60 s) until the other has failed or come as far, so that a store whose
    put-if-absent let both in shows (both pass the lease; the commit's run sequence then stops the second
    with "another run committed") instead of passing because one run finished before the other began."""
    lake = gcs_lake
    lake.create("trades", on_s3.BASE)
    barrier, arrived, done = threading.Barrier(2), threading.Semaphore(0), [threading.Event(), threading.Event()]
    outcomes: list = [None, None]

    def hook_of(i: int):
        def hook(step: str) -> None:
            if step == "after_intent":  # this run holds the partition's lease
                arrived.release()
                done[1 - i].wait(60)  # the other run failed, or came this far too (see watch)
        return hook

    engines = [Engine(spark, lake.root, hook=hook_of(i)) for i in range(2)]

    def run(i: int) -> None:
        barrier.wait()
        try:
            outcomes[i] = engines[i].run(on_s3.FLOW, on_s3.H0)
        except ConcurrentRunError as exc:
            outcomes[i] = exc
        finally:
            done[i].set()

    def watch() -> None:  # both past the lease: let both go on (a broken store shows as two commits)
        arrived.acquire()
        if arrived.acquire(timeout=60):
            for event in done:
                event.set()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)] + [threading.Thread(target=watch,
                                                                                             daemon=True)]
    for t in threads:
        t.start()
    for t in threads[:2]:
        t.join(300)
    committed = [o for o in outcomes if not isinstance(o, Exception)]
    failed = [o for o in outcomes if isinstance(o, ConcurrentRunError)]
    assert len(committed) == 1 and len(failed) == 1, outcomes
    assert committed[0].mode is Mode.REFILL and failed[0].retryable
    # the lease stopped it (a put-if-absent that let both in would leave only the commit's run sequence
    # to stop the second: "another run committed run 1")
    assert "being processed by another run" in str(failed[0]) and "per_sym" in str(failed[0])
    assert CheckpointStore(lake.root).load("per_sym", on_s3.H0).seq == 1
    on_s3._matches_recompute(spark, lake, on_s3.FLOW, until="2024-01-01 01:00")
    assert_lake_intact(lake.root)


def test_random_histories_on_gcs_keep_every_invariant(spark, gcs_server):
    LakeMachine.spark, LakeMachine.s3 = spark, gcs_server
    try:
        with using_gcs(gcs_server):
            run_shard(LakeMachine, 300, EXAMPLES)
    finally:
        LakeMachine.s3 = None


def test_a_gcs_that_stops_answering_mid_run_fails_the_run_within_its_bounds(spark):
    """The emulator frozen (SIGSTOP) once a run holds its leases: the run fails in one line naming a gs://
    object within a few of its budgets (1 s attempts, 2 s a call: 6.6 s measured), not in minutes; thawed,
    the next run settles the failed one and the sink equals a recompute."""
    import signal
    import time
    from dataclasses import replace

    from laminar_assets.errors import StoreUnavailableError
    from tests.gcs_server import start_fake_gcs

    server = start_fake_gcs()  # an emulator of its own: it is frozen
    try:
        quick = replace(server.options, request_timeout_s=1.0, call_timeout_s=2.0)
        lake = Lake(server.bucket())
        with storage.mounted(lake.root, quick):
            lake.create("trades", on_s3.BASE)
            Engine(spark, lake.root, store=quick).run(on_s3.FLOW, on_s3.H0)
            lake.append("trades", [("2024-01-01 00:02:00", "a", 4.0, 4)])
            frozen = [0.0]

            def freeze(step: str) -> None:
                if step == "after_intent":
                    os.kill(server.process.pid, signal.SIGSTOP)
                    frozen[0] = time.monotonic()

            try:
                with pytest.raises(StoreUnavailableError, match="did not answer within its time bounds") as info:
                    Engine(spark, lake.root, store=quick, hook=freeze).run(on_s3.FLOW, on_s3.H0)
                assert time.monotonic() - frozen[0] < 30
            finally:
                os.kill(server.process.pid, signal.SIGCONT)
            message = str(info.value)
            assert "\n" not in message and f"{lake.root}/" in message and server.endpoint in message
            time.sleep(quick.call_timeout_s + 0.5)  # the store's calls fail at once for one call's budget
            again = Engine(spark, lake.root, store=quick).run(on_s3.FLOW, on_s3.H0)
            assert again.mode is Mode.REFILL
            on_s3._matches_recompute(spark, lake, on_s3.FLOW, until="2024-01-01 01:00")
            assert_lake_intact(lake.root)
    finally:
        server.stop()
