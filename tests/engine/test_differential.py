"""Incremental runs over random Delta histories equal a full recompute (correctness rule 1)."""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from deltalake import DeltaTable
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laminar_assets.engine import Agg, Engine, FlowSpec, Hopping, Mode, Reason, Tumbling
from tests.conftest import Lake
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

ALL_KINDS = (
    Agg.count(), Agg.count("px", name="n_px"), Agg.sum("qty"), Agg.sum("px"), Agg.avg("px"),
    Agg.var_samp("px"), Agg.stddev_samp("px"), Agg.min("px"), Agg.max("qty"), Agg.first("px"),
    Agg.last("px"), Agg.approx_count_distinct("qty"), Agg.approx_percentile("px", 0.5),
)
RETRACTABLE = (
    Agg.count(), Agg.count("px", name="n_px"), Agg.sum("qty"), Agg.sum("px"), Agg.avg("px"),
    Agg.var_samp("px"), Agg.stddev_samp("px"),
)
NON_RETRACTABLE = (
    Agg.count(), Agg.min("px"), Agg.max("qty"), Agg.first("px"), Agg.last("qty"),
    Agg.approx_count_distinct("sym"), Agg.approx_percentile("qty", 0.9),
)
FLOWS = (
    FlowSpec(name="tumble_all", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
             aggregates=ALL_KINDS),
    FlowSpec(name="tumble_retract", source="trades", event_time="ts", window=Tumbling("15m"), keys=("sym",),
             aggregates=RETRACTABLE, filter="qty IS NULL OR qty >= 1"),
    FlowSpec(name="hop_retract", source="trades", event_time="ts", window=Hopping("20m", "10m"), keys=("sym",),
             aggregates=RETRACTABLE, derived={"notional": "px * qty"}),
    FlowSpec(name="hop_other", source="trades", event_time="ts", window=Hopping("30m", "10m"), keys=(),
             aggregates=NON_RETRACTABLE),
)
PARTITIONS = ("2023-12-31-23:00", "2024-01-01-00:00", "2024-01-01-01:00")

row = st.tuples(
    st.integers(0, 119 * 60 + 59).map(lambda s: f"2024-01-01 {s // 3600:02d}:{(s // 60) % 60:02d}:{s % 60:02d}"),
    st.sampled_from(["a", "b", "c"]),
    st.one_of(st.none(), st.floats(1.0, 1000.0, allow_nan=False).map(lambda x: round(x, 3))),
    st.one_of(st.none(), st.integers(0, 5)),
)
bad_row = st.sampled_from([(None, "a", 1.0, 1), ("2024-01-01 00:30:00", None, 2.0, 2)])
op = st.one_of(
    st.tuples(st.just("append"), st.lists(row, min_size=1, max_size=8)),
    st.tuples(st.just("append"), st.lists(st.one_of(row, bad_row), min_size=1, max_size=4)),
    st.tuples(st.just("delete"), st.integers(0, 5)),
    st.tuples(st.just("update"), st.integers(0, 5)),
    st.tuples(st.just("compact"), st.none()),
    st.tuples(st.just("cleanup"), st.none()),
    st.tuples(st.just("run"), st.lists(st.booleans(), min_size=len(FLOWS) * len(PARTITIONS),
                                       max_size=len(FLOWS) * len(PARTITIONS))),
)
EXAMPLES = int(os.environ.get("LAMINAR_DIFFERENTIAL_EXAMPLES", "5"))


def _apply(lake: Lake, kind: str, arg) -> None:
    if kind == "append":
        lake.append("trades", arg)
    elif kind == "delete":
        lake.delete("trades", f"qty = {arg}")
    elif kind == "update":
        lake.update("trades", {"px": "px + 1.5", "ts": "ts - INTERVAL 20 MINUTES"}, f"qty = {arg}")
    elif kind == "compact":
        lake.compact("trades")
    elif kind == "cleanup":
        dt = lake.table("trades")
        dt.create_checkpoint()
        dt.cleanup_metadata()


def _run_history(spark, cdf: bool, first_rows, ops) -> dict[str, list]:
    folder = tempfile.mkdtemp(prefix="laminar-diff-")
    try:
        lake = Lake(os.path.join(folder, "lake"))
        lake.create("trades", first_rows, cdf=cdf, **{"delta.logRetentionDuration": "interval 0 seconds"})
        engine = Engine(spark, lake.root)
        seen: dict[str, list] = {f.name: [] for f in FLOWS}

        def run(flow, partition):
            result = engine.run(flow, partition)
            seen[flow.name].append((result.mode, result.reason))

        for kind, arg in ops:
            if kind == "run":
                for i, flow in enumerate(FLOWS):
                    for j, partition in enumerate(PARTITIONS):
                        if arg[i * len(PARTITIONS) + j]:
                            run(flow, partition)
            else:
                _apply(lake, kind, arg)
        for flow in FLOWS:
            for partition in PARTITIONS:
                run(flow, partition)
        snapshot = DeltaTable(lake.path("trades")).to_pyarrow_table()
        for flow in FLOWS:
            expected = full_recompute(spark, flow, snapshot)
            actual = lake.read(flow.sink) if os.path.exists(lake.path(flow.sink)) else expected.iloc[0:0]
            assert_frames_match(actual, expected, flow.keys)
        return seen
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(cdf=st.booleans(), first_rows=st.lists(row, min_size=1, max_size=10), ops=st.lists(op, min_size=2, max_size=7))
def test_incremental_equals_full_recompute(spark, cdf, first_rows, ops):
    seen = _run_history(spark, cdf, first_rows, ops)
    # With a change data feed, a retractable flow never needs a refill for deletes/updates.
    if cdf:
        allowed = {Reason.NO_WATERMARK, Reason.CHECKPOINT_EXPIRED}
        for mode, reason in seen["hop_retract"] + seen["tumble_retract"]:
            assert mode is not Mode.REFILL or reason in allowed, reason


def test_fixed_history_exercises_every_path(spark):
    """A hand-picked history that hits append, retract, refill, compaction and expiry paths."""
    run_all = ("run", [True] * (len(FLOWS) * len(PARTITIONS)))
    one = [False] * (len(FLOWS) * len(PARTITIONS))
    one[1] = True  # tumble_all, 2024-01-01-00:00
    ops = [
        run_all,
        ("append", [("2024-01-01 00:05:00", "a", 10.0, 1), ("2024-01-01 01:55:00", "b", 20.0, 2)]),
        ("run", one),
        ("append", [("2024-01-01 00:01:00", "a", 11.0, 3)]),  # late row
        ("update", 1),
        ("delete", 2),
        run_all,
        ("compact", None),
        ("append", [("2024-01-01 00:59:59", "c", 5.0, 4), (None, "c", 1.0, 1)]),
        ("cleanup", None),  # drops commits after the watermarks: CHECKPOINT_EXPIRED
        ("append", [("2024-01-01 01:00:00", "c", 6.0, 4)]),
        run_all,
    ]
    first = [("2024-01-01 00:00:00", "a", 1.0, 1), ("2024-01-01 00:10:00", "b", 2.0, 2),
             ("2024-01-01 01:10:00", "c", 3.0, 3), ("2024-01-01 00:20:00", "a", None, 2)]
    seen = _run_history(spark, True, first, ops)
    reasons = {r for runs in seen.values() for _, r in runs}
    for expected in (Reason.NO_WATERMARK, Reason.APPEND_ONLY, Reason.RETRACTABLE_CHANGES,
                     Reason.NON_APPEND_ON_NON_RETRACTABLE, Reason.CHECKPOINT_EXPIRED, Reason.NO_NEW_VERSIONS):
        assert expected in reasons, (expected, reasons)
