"""The engine with the whole lake in a container of Azurite (Azure's Storage emulator, tests/conftest.py):
Laminar's own files through the Azure store (ETag preconditions), Delta commits through deltalake's Azure
client, and Spark's Parquet reads and writes through hadoop-azure's ABFS on the emulator's blob endpoint.
The object-store matrix on its shortest histories (issue #60's CI budget): one incremental history equal
to a recompute, two runs racing on one partition, and a few random stateful histories."""

from __future__ import annotations

import os
import threading

import pytest

from laminar_assets import storage
from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import Engine, Mode, Reason
from laminar_assets.errors import ConcurrentRunError, InjectedCrash
from tests.engine.stateful_lake import LakeMachine
from tests.engine.test_object_store import BASE, FLOW, H0, H1, RETRACTING, STAGE, _matches_recompute
from tests.engine.test_stateful import run_shard
from tests.lake_invariants import assert_lake_intact, assert_no_orphans

pytestmark = pytest.mark.spark

EXAMPLES = int(os.environ.get("LAMINAR_STATEFUL_AZURE_EXAMPLES", "3"))


def test_a_lake_on_azure_runs_incrementally_and_equals_a_recompute(spark, azure_lake):
    lake = azure_lake
    lake.create("trades", BASE)
    engine = Engine(spark, lake.root)
    assert [r.reason for r in engine.run_many(FLOW, [H0, H1])] == [Reason.NO_WATERMARK] * 2
    lake.append("trades", [("2024-01-01 00:02:00", "a", 4.0, 4), ("2024-01-01 01:06:00", "b", 5.0, 1)])
    assert [r.reason for r in engine.run_many(FLOW, [H0, H1])] == [Reason.APPEND_ONLY] * 2
    lake.delete("trades", "qty = 2")  # change data: the retracting flow merges, COUNT(DISTINCT) refills
    assert engine.run(RETRACTING, H0).reason is Reason.NO_WATERMARK
    assert engine.run_many(FLOW, [H0, H1])[0].reason is Reason.NON_APPEND_ON_NON_RETRACTABLE
    lake.update("trades", {"px": "px + 1.0"}, "sym = 'a'")
    assert engine.run(RETRACTING, H0).reason is Reason.RETRACTABLE_CHANGES
    engine.run_many(FLOW, [H0, H1])
    engine.run_many(STAGE, [H0, H1])  # a stage's change-data commit is written with a put-if-absent
    assert engine.run(FLOW, H0).mode is Mode.NOOP

    _matches_recompute(spark, lake, FLOW)
    _matches_recompute(spark, lake, RETRACTING, until="2024-01-01 01:00")
    assert_lake_intact(lake.root)
    assert_no_orphans(lake.root, ["per_sym", "sums", "clean"])
    keys = [u for u, _ in storage.list_files(lake.root)]
    assert all(k.startswith(lake.root + "/") for k in keys)  # all of it in the container, under the root
    assert any("/_laminar/watermarks/per_sym/" in k for k in keys) and any("/_laminar/state/per_sym/" in k for k in keys)


def test_two_runs_racing_on_one_partition_commit_once(spark, azure_lake):
    """Two engines start the same partition's run at the same moment: the lease is a put-if-absent
    (If-None-Match: *) that Azurite checks with the write, so exactly one commits and the other gets a
    retryable ConcurrentRunError from the lease, before it computes anything."""
    lake = azure_lake
    lake.create("trades", BASE)
    engines = [Engine(spark, lake.root) for _ in range(2)]
    barrier = threading.Barrier(2)
    outcomes: list[object] = []

    def race(engine: Engine) -> None:
        barrier.wait(60)
        try:
            outcomes.append(engine.run(FLOW, H0))
        except Exception as exc:  # noqa: BLE001  (judged below)
            outcomes.append(exc)

    threads = [threading.Thread(target=race, args=(e,)) for e in engines]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    failed = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(outcomes) == 2 and len(failed) == 1, outcomes
    assert isinstance(failed[0], ConcurrentRunError) and failed[0].retryable, failed
    # stopped by the lease (put-if-absent), not only by the Delta commit's run sequence behind it: with
    # the lease's precondition dropped, both runs computed and the second one's commit was refused
    assert "being processed by another run" in str(failed[0]), failed
    assert CheckpointStore(lake.root).load("per_sym", H0).seq == 1
    _matches_recompute(spark, lake, FLOW, until="2024-01-01 01:00")
    assert_lake_intact(lake.root)


class _Containers:
    """What LakeMachine asks of a server (`bucket()`: a new lake's root), on Azurite."""

    def __init__(self, server) -> None:
        self.server = server

    def bucket(self) -> str:
        return self.server.container()


def test_random_histories_on_azure_keep_every_invariant(spark, azurite_server):
    """The stateful test's machine (tests/engine/stateful_lake.py) with its lakes in Azurite: its shortest
    histories only (EXAMPLES), the same invariants after every step."""
    LakeMachine.spark, LakeMachine.s3 = spark, _Containers(azurite_server)
    try:
        with storage.mounted("abfss://", azurite_server.options):
            run_shard(LakeMachine, 300, EXAMPLES)
    finally:
        LakeMachine.s3 = None


@pytest.mark.parametrize("step", ["after_state_commit", "after_sink_commit"])
def test_a_crash_at_a_commit_step_then_a_rerun_equals_a_clean_run(spark, azure_lake, step):
    """The crash test (tests/engine/test_crash_safety.py) at its two commit steps, on Azure: the commit
    protocol is the same on every store, so only the steps between the two commits are run here."""
    from tests.engine import test_crash_safety as crash

    lake = azure_lake
    lake.create("trades", crash.BASE)
    Engine(spark, lake.root).run(crash.RETRACTING, crash.PART)
    lake.append("trades", [("2024-01-01 00:02:00", "a", 11.0, 4), ("2024-01-01 00:45:00", "c", 1.0, 1)])
    lake.delete("trades", "qty = 2")
    with pytest.raises(InjectedCrash):
        Engine(spark, lake.root, hook=crash.crash_at(step)).run(crash.RETRACTING, crash.PART)
    Engine(spark, lake.root).run(crash.RETRACTING, crash.PART)
    crash._check(spark, lake, crash.RETRACTING)
    lake.append("trades", [("2024-01-01 00:03:00", "a", 13.0, 5)])  # applied exactly once
    Engine(spark, lake.root).run(crash.RETRACTING, crash.PART)
    crash._check(spark, lake, crash.RETRACTING)
