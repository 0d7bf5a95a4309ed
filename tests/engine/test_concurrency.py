"""Two runs of one partition never both write; runs of different partitions both succeed."""

from __future__ import annotations

import json
import os
import threading

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


def test_stale_lease_of_a_dead_process_is_taken_over(spark, lake):
    lake.create("trades", ROWS)
    lock = os.path.join(lake.root, "_laminar", "locks", "c", "2024-01-01-00-00.lock")
    os.makedirs(os.path.dirname(lock))
    import socket

    with open(lock, "w") as fh:
        json.dump({"run_id": "dead", "pid": 2 ** 22 + 17, "host": socket.gethostname(), "started": 0}, fh)
    Engine(spark, lake.root).run(FLOW, "2024-01-01-00:00")
    assert not os.path.exists(lock)


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
