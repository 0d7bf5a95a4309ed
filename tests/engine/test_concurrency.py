"""Two runs of one partition never both write; runs of different partitions both succeed."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest

from laminar_assets.engine import Agg, ConcurrentRunError, Engine, FlowSpec, Tumbling
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

FLOW = FlowSpec(name="c", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("qty"), Agg.max("px")))
ROWS = [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 01:01:00", "b", 2.0, 2),
        ("2024-01-01 02:01:00", "c", 3.0, 3)]


def test_same_partition_twice_fails_clearly(spark, lake):
    lake.create("trades", ROWS)
    inside, release = threading.Event(), threading.Event()
    errors = []

    def hook(step):
        if step == "after_read":
            inside.set()
            release.wait(60)

    def first():
        try:
            Engine(spark, lake.root, hook=hook).run(FLOW, "2024-01-01-00:00")
        except Exception as exc:  # noqa: BLE001  (pragma: no cover - reported below)
            errors.append(exc)

    t = threading.Thread(target=first)
    t.start()
    assert inside.wait(120)
    with pytest.raises(ConcurrentRunError, match="being processed by another run"):
        Engine(spark, lake.root).run(FLOW, "2024-01-01-00:00")
    release.set()
    t.join(120)
    assert not errors
    assert lake.read("c")["count"].tolist() == [1]


def test_a_partition_a_dead_process_held_is_taken_over(spark, lake):
    """A run killed after its intent leaves the watermark naming it as holder, with a pid no process has now: the
    next run takes the partition over, settles the intent and clears the holder (no lease object anywhere)."""
    import subprocess

    from laminar_assets.checkpoints import CheckpointStore, Holder, PendingRun

    lake.create("trades", ROWS)
    Engine(spark, lake.root).run(FLOW, "2024-01-01-00:00")
    store = CheckpointStore(lake.root)
    mark = store.load("c", "2024-01-01-00:00")
    gone = subprocess.Popen(["true"])
    gone.wait()
    dead = Holder(run_id="dead", host=socket.gethostname(), started=time.time(), pid=gone.pid, process_started="0:0")
    store.save(mark.with_(holder=dead, pending=PendingRun(seq=mark.seq + 1, run_id="dead", target_versions={},
                                                          mode="REFILL", reason="NO_WATERMARK")))
    lake.append("trades", [("2024-01-01 00:02:00", "a", 4.0, 4)])
    Engine(spark, lake.root).run(FLOW, "2024-01-01-00:00")
    after = store.load("c", "2024-01-01-00:00")
    assert after.holder is None and after.pending is None and after.seq == mark.seq + 1
    assert lake.read("c")["count"].tolist() == [2]
    locks = os.path.join(lake.root, "_laminar", "locks")
    assert not [f for _d, _s, files in os.walk(locks) for f in files]  # the sweep's lease, freed, is the only one


def test_different_partitions_run_concurrently(spark, lake):
    lake.create("trades", ROWS)
    errors = []

    def run(part):
        try:
            Engine(spark, lake.root).run(FLOW, part)
        except Exception as exc:  # noqa: BLE001  (the thread's error is asserted on below)
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in ("2024-01-01-00:00", "2024-01-01-01:00", "2024-01-01-02:00")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not errors, errors
    expected = full_recompute(spark, FLOW, lake.table("trades").to_pyarrow_table())
    assert_frames_match(lake.read("c"), expected, FLOW.keys)


def test_a_run_whose_claim_loses_undoes_its_other_claims_and_commits_nothing(spark, lake, monkeypatch):
    """Another run writes one partition's watermark between this run's reading it and its intent: the intent's
    conditional write fails, the intents of the other partitions are undone (as they were, no failure recorded),
    nothing is committed, and the error names the partition; the next run goes on from there."""
    from laminar_assets.checkpoints import CheckpointStore
    from laminar_assets.engine.executor import Engine as EngineClass

    keys = ["2024-01-01-00:00", "2024-01-01-01:00"]
    lake.create("trades", ROWS)
    Engine(spark, lake.root).run_many(FLOW, keys)
    lake.append("trades", [("2024-01-01 00:02:00", "a", 4.0, 4), ("2024-01-01 01:02:00", "b", 5.0, 5)])
    store = CheckpointStore(lake.root)
    before = {k: store.load("c", k) for k in keys}
    versions = lake.table("c").version()
    plan_all = EngineClass._plan_all

    def planned_then_overtaken(self, spec, marks, inputs, force):
        plans = plan_all(self, spec, marks, inputs, force)
        store.save(before[keys[1]].with_(last_reason="ANOTHER_RUN"))  # another run's write of the second partition
        return plans

    monkeypatch.setattr(EngineClass, "_plan_all", planned_then_overtaken)
    with pytest.raises(ConcurrentRunError, match="wrote its watermark after this run read it") as err:
        Engine(spark, lake.root).run_many(FLOW, keys)
    monkeypatch.undo()
    assert err.value.facts["partition"] == keys[1]
    first = store.load("c", keys[0])
    assert first.with_(updated_at=None) == before[keys[0]].with_(updated_at=None)  # undone: no intent, no failure
    assert store.load("c", keys[1]).last_reason == "ANOTHER_RUN"
    assert lake.table("c").version() == versions
    Engine(spark, lake.root).run_many(FLOW, keys)
    assert lake.read("c").sort_values("window_start")["count"].tolist() == [2, 2]
