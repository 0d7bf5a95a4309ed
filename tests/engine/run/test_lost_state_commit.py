"""A state table that lost a commit (its newest log file deleted by hand, or restored from an older backup) holds an
older run of a partition than the partition's watermark says: merging into it would silently miss the lost run's
rows. The run is refused before anything is written, naming the table, the runs and the refill that recovers; that
refill recomputes the partition whole, equal to a full recompute, and runs go on incrementally from there."""

from __future__ import annotations

import glob
import os

import pytest

from laminar_assets.engine import Agg, Engine, FlowSpec, Mode, Reason, Tumbling
from laminar_assets.errors import CheckpointError

FLOW = FlowSpec(name="lost", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("qty")))
PART = "2024-01-01-00:00"


def test_a_state_table_that_lost_a_commit_is_refused_then_recomputed(spark, lake):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    engine = Engine(spark, lake.root)
    engine.run_many(FLOW, [PART])
    lake.append("trades", [("2024-01-01 00:02:00", "a", 2.0, 2)])
    engine.run_many(FLOW, [PART])  # the state's newest commit holds this run
    state_log = glob.glob(os.path.join(lake.root, "_laminar", "state", FLOW.name, "*", "_delta_log"))[0]
    newest = max(glob.glob(os.path.join(state_log, "*.json")))
    os.remove(newest)  # lost by hand
    lake.append("trades", [("2024-01-01 00:03:00", "a", 3.0, 4)])
    for _ in range(2):  # refused every time: never merged into the state that lost a run
        with pytest.raises(CheckpointError, match=r"holds run 1 of partition 2024-01-01-00:00 but its watermark says "
                                                  r"run 2 committed.*laminar refill lost --partition-range"):
            engine.run_many(FLOW, [PART])
    [result] = engine.run_many(FLOW, [PART], force=True)  # what `laminar refill` runs
    assert (result.mode, result.reason) == (Mode.REFILL, Reason.FORCED_BY_USER)
    sink = lake.read(FLOW.sink_name)
    assert (int(sink["count"].sum()), int(sink["sum_qty"].sum())) == (3, 7)  # every row, the lost run's too
    lake.append("trades", [("2024-01-01 00:04:00", "a", 1.0, 1)])
    [result] = engine.run_many(FLOW, [PART])  # and on from there, incrementally
    assert result.mode is Mode.INCREMENTAL
    sink = lake.read(FLOW.sink_name)
    assert (int(sink["count"].sum()), int(sink["sum_qty"].sum())) == (4, 8)
