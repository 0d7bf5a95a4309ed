"""Retracting a large float value must not leave its rounding error behind (issue: a deleted 1e13 among
prices near 1e2 turned a standard deviation into 0.0 or 24,770). Windows whose float state can no
longer be trusted to 1e-9 are recomputed (PRECISION_LOSS), and the equivalence check catches one
that was not."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laminar_assets.engine import Agg, Engine, EngineOptions, FlowSpec, Hopping, Mode, Reason, Tumbling
from laminar_assets.engine.report.equivalence import check_equivalence
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

HOP = FlowSpec(name="venue_px", source="trades", event_time="ts", window=Hopping("1h", "15m"), keys=("sym",),
               aggregates=(Agg.sum("px"), Agg.stddev_samp("px"), Agg.avg("px"), Agg.var_samp("px"), Agg.count()))
TUMBLE = FlowSpec(name="px_10m", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                  aggregates=(Agg.sum("px"), Agg.stddev_samp("px"), Agg.sum("qty")))
KEYS = ["2024-01-01-00:00", "2024-01-01-01:00"]
NORMAL = [(f"2024-01-01 00:{m:02d}:00", "X", 100.0 + (m % 7) * 1.37, m) for m in range(0, 60, 3)] + \
         [(f"2024-01-01 01:{m:02d}:00", "X", 99.0 + (m % 5) * 2.11, m) for m in range(0, 60, 4)]
OUTLIER = ("2024-01-01 00:50:00", "X", 1e13, 999)


def check(spark, lake, flow):
    """The sink equals a recompute of the windows starting in the partitions run (KEYS), to 1e-9."""
    expected = full_recompute(spark, flow, lake.table("trades").to_pyarrow_table())
    if len(expected):
        starts = __import__("pandas").to_datetime(expected["window_start"], utc=True)
        expected = expected[(starts >= "2024-01-01 00:00:00+00:00") & (starts < "2024-01-01 02:00:00+00:00")]
    assert_frames_match(lake.read(flow.sink), expected.reset_index(drop=True), flow.keys, rel=1e-9)


def test_retracting_a_huge_value_refills_the_windows_that_held_it(spark, lake, engine):
    lake.create("trades", NORMAL + [OUTLIER])
    for flow in (HOP, TUMBLE):
        engine.run_many(flow, KEYS)
    lake.delete("trades", "qty = 999")
    hop = engine.run_many(HOP, KEYS)
    # 00:50 lies in the 1 h windows starting 00:00 ... 00:45 (all of hour 0) and 23:45 (not run here)
    assert [(r.mode, r.reason) for r in hop] == [(Mode.REFILL, Reason.PRECISION_LOSS),
                                                 (Mode.NOOP, Reason.NO_CHANGES_IN_PARTITION)]
    assert "windows starting" in hop[0].detail
    check(spark, lake, HOP)
    stddev = lake.read(HOP.sink)["stddev_samp_px"].tolist()
    assert all(0.5 < s < 10 for s in stddev if s is not None and not math.isnan(s)), stddev
    tumble = engine.run_many(TUMBLE, KEYS)[0]
    # only the 10-minute window that held 1e13 is recomputed; the rest of the hour merges the delete
    assert tumble.reason is Reason.PRECISION_LOSS and not tumble.plan.refill_all
    assert [(r.start.minute, r.end.hour, r.end.minute) for r in tumble.plan.refill] == [(50, 1, 0)]
    check(spark, lake, TUMBLE)


def test_ordinary_retractions_stay_incremental(spark, lake, engine):
    lake.create("trades", NORMAL)
    engine.run_many(HOP, KEYS)
    lake.delete("trades", "qty = 12")  # one row in each hour
    results = engine.run_many(HOP, KEYS)
    assert [r.reason for r in results] == [Reason.RETRACTABLE_CHANGES] * 2
    check(spark, lake, HOP)


def test_the_equivalence_check_catches_a_window_that_lost_precision(spark, lake):
    lake.create("trades", NORMAL + [OUTLIER])
    unguarded = Engine(spark, lake.root, options=EngineOptions(refill_ratio=None, precision_guard=False))
    unguarded.run_many(TUMBLE, KEYS)
    lake.delete("trades", "qty = 999")
    assert unguarded.run(TUMBLE, KEYS[0]).reason is Reason.RETRACTABLE_CHANGES  # the guard is off
    result = check_equivalence(unguarded, TUMBLE, KEYS[0], sample=100)
    assert not result.passed
    assert any("sum_px" in m["columns"] or "stddev_samp_px" in m["columns"] for m in result.mismatches)
    assert {m["window_start"][:16] for m in result.mismatches} == {"2024-01-01 00:50"}
    # a guarded engine repairs it: the next change to that partition refills the lost window
    guarded = Engine(spark, lake.root, options=EngineOptions(refill_ratio=None))
    assert guarded.run(TUMBLE, KEYS[0], force=True).mode is Mode.REFILL
    assert check_equivalence(guarded, TUMBLE, KEYS[0], sample=100).passed


magnitude = st.sampled_from([1e13, -4e12, 2.5e15, 7e9])
small = st.floats(50.0, 150.0, allow_nan=False).map(lambda x: round(x, 4))


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(values=st.lists(small, min_size=3, max_size=12), big=st.lists(magnitude, min_size=1, max_size=3),
       minutes=st.lists(st.integers(0, 119), min_size=15, max_size=15))
def test_mixed_magnitudes_then_deleted_equal_a_recompute(spark, tmp_path_factory, values, big, minutes):
    from tests.conftest import Lake

    lake = Lake(str(tmp_path_factory.mktemp("mixed") / "lake"))
    rows = [(f"2024-01-01 {minutes[i] // 60:02d}:{minutes[i] % 60:02d}:00", "X", v, i) for i, v in enumerate(values)]
    bigs = [(f"2024-01-01 {minutes[-1 - i] // 60:02d}:{minutes[-1 - i] % 60:02d}:30", "X", b, 1000 + i)
            for i, b in enumerate(big)]
    lake.create("trades", rows + bigs)
    engine = Engine(spark, lake.root, options=EngineOptions(refill_ratio=None))
    for flow in (HOP, TUMBLE):
        engine.run_many(flow, KEYS)
    lake.delete("trades", "qty >= 1000")
    for flow in (HOP, TUMBLE):
        engine.run_many(flow, KEYS)
        check(spark, lake, flow)
