"""A crash at any step, then a rerun, equals a run that never failed (correctness rules 2 and 3)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from datetime import datetime

import pytest

from laminar_assets import storage
from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import Agg, Engine, FlowSpec, Hopping, Mode, Reason, Tumbling
from laminar_assets.engine.executor import STEPS
from laminar_assets.errors import InjectedCrash
from tests.lake_invariants import assert_lake_intact
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

RETRACTING = FlowSpec(name="vol", source="trades", event_time="ts", window=Hopping("20m", "10m"), keys=("sym",),
                      aggregates=(Agg.count(), Agg.sum("qty"), Agg.avg("px"), Agg.stddev_samp("px")))
EXTREMES = FlowSpec(name="ext", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.min("px"), Agg.last("px"), Agg.approx_count_distinct("qty")))
PART = "2024-01-01-00:00"
BASE = [("2024-01-01 00:01:00", "a", 10.0, 1), ("2024-01-01 00:12:00", "a", 12.0, 2),
        ("2024-01-01 00:31:00", "b", 7.0, 3)]


def crash_at(step):
    def hook(current):
        if current == step:
            raise InjectedCrash(f"injected crash at {step}")
    return hook


def _check(spark, lake, flow):
    assert_lake_intact(lake.root)
    expected = full_recompute(spark, flow, lake.table("trades").to_pyarrow_table())
    expected = expected[expected["window_start"] >= "2024-01-01"] if len(expected) else expected
    actual = lake.read(flow.sink)
    assert_frames_match(actual, expected.reset_index(drop=True), flow.keys)


@pytest.fixture(params=["local", "s3"])
def any_lake(request, lake):
    """A lake in a local folder, or in a bucket of the local S3 server (or of the GCS emulator, where a test
    asks for it by name: the commit steps below)."""
    if request.param == "gcs":
        return request.getfixturevalue("gcs_lake")
    return lake if request.param == "local" else request.getfixturevalue("s3_lake")


# In a bucket, one flow: the commit protocol is the same for both flows. Nor at the two commit steps a
# single-partition run is SIGKILLed at in a bucket below (test_sigkill_at_a_commit_step_then_a_rerun_equals_a_clean_run
# [s3-one-after_state_commit] and [s3-one-after_sink_commit]): a kill there leaves no less behind than a raise.
KILLED_IN_A_BUCKET = ("after_state_commit", "after_sink_commit")
CRASHES = [pytest.param(step, where, flow, id=f"{step}-{where}-{kind}")
           for where, flow, kind in [("local", RETRACTING, "retracting"), ("local", EXTREMES, "extremes"),
                                     ("s3", RETRACTING, "retracting")]
           for step in STEPS if not (where == "s3" and step in KILLED_IN_A_BUCKET)]
# On gs:// (fake-gcs-server), the commit steps only: the protocol is the store's own there.
CRASHES += [pytest.param(step, "gcs", RETRACTING, id=f"{step}-gcs-retracting") for step in KILLED_IN_A_BUCKET]


@pytest.mark.parametrize("step,any_lake,flow", CRASHES, indirect=["any_lake"])
def test_crash_during_incremental_run(spark, any_lake, flow, step):
    lake = any_lake
    lake.create("trades", BASE)
    Engine(spark, lake.root).run(flow, PART)
    lake.append("trades", [("2024-01-01 00:02:00", "a", 11.0, 4), ("2024-01-01 00:45:00", "c", 1.0, 1)])
    lake.delete("trades", "qty = 2")

    with pytest.raises(InjectedCrash):
        Engine(spark, lake.root, hook=crash_at(step)).run(flow, PART)

    again = Engine(spark, lake.root).run(flow, PART)
    if step == "after_watermark":
        assert again.mode is Mode.NOOP  # the crashed run had completed everything
    _check(spark, lake, flow)
    # Nothing was double counted or lost: a further change is applied exactly once.
    lake.append("trades", [("2024-01-01 00:03:00", "a", 13.0, 5)])
    Engine(spark, lake.root).run(flow, PART)
    _check(spark, lake, flow)


@pytest.mark.parametrize("step", STEPS)
def test_crash_during_first_run(spark, lake, step):
    lake.create("trades", BASE)
    with pytest.raises(InjectedCrash):
        Engine(spark, lake.root, hook=crash_at(step)).run(RETRACTING, PART)
    result = Engine(spark, lake.root).run(RETRACTING, PART)
    if step in ("after_intent", "after_read"):
        assert result.mode is Mode.REFILL  # nothing landed: the partition is computed again
    _check(spark, lake, RETRACTING)


def test_failed_attempt_refills_next_time(spark, lake):
    lake.create("trades", BASE)
    engine = Engine(spark, lake.root)
    engine.run(RETRACTING, PART)
    lake.append("trades", [("2024-01-01 00:04:00", "a", 1.0, 1)])
    with pytest.raises(InjectedCrash):
        Engine(spark, lake.root, hook=crash_at("after_read")).run(RETRACTING, PART)
    result = engine.run(RETRACTING, PART)
    assert (result.mode, result.reason) == (Mode.REFILL, Reason.PREVIOUS_ATTEMPT_FAILED)
    _check(spark, lake, RETRACTING)


# The killed run is a Spark Connect client of the test process's server, as a daemon-launched run is: its
# driver work runs on the server, its commits in the killed process.
KILL_SCRIPT = textwrap.dedent("""
    import os, signal, sys
    from laminar_assets.engine import Engine, SparkOptions, build_session
    from tests.engine.test_crash_safety import RETRACTING, PART, KEYS
    spark = build_session(SparkOptions(remote=sys.argv[4], shuffle_partitions=1))
    def hook(step):
        if step == sys.argv[2]:
            os.kill(os.getpid(), signal.SIGKILL)
    engine = Engine(spark, sys.argv[1], hook=hook)
    if sys.argv[3] == "many":
        engine.run_many(RETRACTING, KEYS)
    else:
        engine.run(RETRACTING, PART)
""")
# the last hour of one ISO week (a Sunday) and three of the next: two blocks of watermarks (`CheckpointStore`), so a kill between
# the run's writes of them leaves the first block's partitions finished and the others' intents
KEYS = ["2023-12-31-23:00", "2024-01-01-00:00", "2024-01-01-01:00", "2024-01-01-02:00"]
MORE = [("2024-01-01 00:05:00", "b", 3.0, 2), ("2024-01-01 01:25:00", "a", 4.0, 3), ("2024-01-01 02:45:00", "c", 5.0, 1)]


def _kill_at(lake, step: str, how: str, server) -> None:
    # the killed process reaches the lake's store through the AWS environment (as a deployed run does)
    store = storage.env(lake.root)
    proc = subprocess.run([sys.executable, "-c", KILL_SCRIPT, lake.root, step, how, server.url],
                          cwd=os.getcwd(), capture_output=True, text=True, timeout=300,
                          env={**os.environ, **store, "PYTHONPATH": os.getcwd()})
    assert proc.returncode == -9, proc.stderr[-2000:]


def _check_hours(spark, lake, flow, keys: list[str]) -> None:
    """The sink equals a recompute of the windows starting in the hours of `keys` (adjacent)."""
    import pandas as pd

    expected = full_recompute(spark, flow, lake.table("trades").to_pyarrow_table())
    if len(expected):
        first = pd.Timestamp(datetime.strptime(keys[0], "%Y-%m-%d-%H:%M"), tz="UTC")
        starts = pd.to_datetime(expected["window_start"], utc=True)
        expected = expected[(starts >= first) & (starts < first + pd.Timedelta(hours=len(keys)))].reset_index(drop=True)
    assert_frames_match(lake.read(flow.sink), expected, flow.keys)


# Real kills (kill -9 of the process) pinned to each commit step: after the state commit, after the
# sink commit (before any watermark), and between the watermarks of a multi-partition run.
@pytest.mark.parametrize("how,step", [("one", "after_state_commit"), ("one", "after_sink_commit"),
                                      ("many", "after_state_commit"), ("many", "after_sink_commit"),
                                      ("many", "after_first_watermark")])
def test_sigkill_at_a_commit_step_then_a_rerun_equals_a_clean_run(spark, connect_server, any_lake, how, step):
    lake = any_lake
    lake.create("trades", BASE + MORE[1:])
    keys = KEYS if how == "many" else [PART]
    Engine(spark, lake.root).run_many(RETRACTING, keys)
    lake.append("trades", MORE[:1] + [("2024-01-01 02:50:00", "a", 6.0, 2)])
    lake.delete("trades", "qty = 3")
    _kill_at(lake, step, how, connect_server)
    marks = [CheckpointStore(lake.root).load("vol", k) for k in keys]
    pending = [m.pending is not None for m in marks]
    # after the first block's watermarks (the first day's one hour), before the next day's
    assert pending == ([False] + [True] * (len(keys) - 1) if step == "after_first_watermark" else [True] * len(keys))
    # the dead run still "holds" each partition it did not finish: its watermark names it, with its pid
    assert [m.holder is not None for m in marks] == pending
    assert all(m.holder.run_id == m.pending.run_id for m in marks if m.pending)
    results = Engine(spark, lake.root).run_many(RETRACTING, keys)
    # recovery finished the killed run from its committed state; nothing was left to do
    assert {r.mode for r in results} == {Mode.NOOP}
    _check_hours(spark, lake, RETRACTING, keys)
    lake.append("trades", [("2024-01-01 00:59:00", "a", 7.0, 1)])  # and later changes apply exactly once
    Engine(spark, lake.root).run_many(RETRACTING, keys)
    _check_hours(spark, lake, RETRACTING, keys)
