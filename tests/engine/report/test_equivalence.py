"""The equivalence check recomputes several partitions in one pass and pins each mismatch to the
partition that holds it; a partition without a watermark has nothing to compare yet."""

from __future__ import annotations

import pytest

from laminar_assets.engine import Agg, Engine, EngineOptions, FlowSpec, Hopping, Tumbling
from laminar_assets.engine.report.equivalence import _differs, check_equivalence, check_equivalence_many
from tests.arrow_python_files import forbid_python_files

pytestmark = pytest.mark.spark

TUMBLE = FlowSpec(name="px_1m", source="trades", event_time="ts", window=Tumbling("1m"), keys=("sym",),
                  aggregates=(Agg.sum("px"), Agg.count()))
HOP = FlowSpec(name="px_hop", source="trades", event_time="ts", window=Hopping("30m", "10m"), keys=("sym",),
               aggregates=(Agg.sum("qty"), Agg.max("px")))
KEYS = ["2024-01-01-00:00", "2024-01-01-01:00", "2024-01-01-02:00"]
ROWS = [(f"2024-01-01 0{h}:{m:02d}:00", s, 100.0 + m + h, m) for h in range(3) for m in range(0, 60, 7)
        for s in ("X", "Y")]


@pytest.fixture(params=["driver-compare", "spark-compare"])
def engine(request, spark, lake) -> Engine:
    """Both ways the sink is compared: read by the driver (small local sinks; Spark only recomputes),
    and joined with the recomputed windows in Spark (sinks the driver does not read)."""
    spark_side = request.param == "spark-compare"
    return Engine(spark, lake.root, options=EngineOptions(driver_write_below_bytes=0) if spark_side else None)


def test_value_comparison_rules():
    nan = float("nan")
    assert not _differs(None, None, True, None, "x", 1e-9)
    assert _differs(None, 1.0, True, None, "x", 1e-9) and _differs(1, None, False, None, "x", 1e-9)
    assert not _differs(nan, nan, True, None, "x", 1e-9)
    assert _differs(nan, 1.0, True, None, "x", 1e-9) and _differs(1.0, nan, True, None, "x", 1e-9)
    assert not _differs(1.0 + 1e-12, 1.0, True, None, "x", 1e-9) and _differs(1.001, 1.0, True, None, "x", 1e-9)
    assert not _differs(0.0, 1e-13, True, None, "x", 1e-9)  # absolute floor near zero
    assert _differs(3, 4, False, None, "x", 1e-9) and not _differs("a", "a", False, None, "x", 1e-9)
    inf = float("inf")
    assert not _differs(inf, inf, True, None, "x", 1e-9) and _differs(1e300, inf, True, None, "x", 1e-9)
    assert _differs(-inf, inf, True, None, "x", 1e-9) and _differs(inf, 5.0, True, None, "x", 1e-9)
    band = {"lo__p50": 10.0, "hi__p50": 12.0}
    assert not _differs(11.0, 10.5, True, band, "p50", 1e-9) and _differs(13.0, 10.5, True, band, "p50", 1e-9)


@pytest.mark.parametrize("flow", [TUMBLE, HOP], ids=["tumbling", "hopping"])
def test_many_partitions_pass_together_and_a_mismatch_stays_in_its_partition(spark, lake, engine, flow):
    lake.create("trades", ROWS)
    engine.run_many(flow, KEYS)
    results = check_equivalence_many(engine, flow, KEYS + ["2024-01-01-05:00"], sample=6)
    assert results["2024-01-01-05:00"] is None  # never run: no watermark
    assert all(results[k].passed and 3 <= results[k].windows_checked <= 6 for k in KEYS), results
    # everything in a partition, when the sample covers it
    assert check_equivalence(engine, flow, KEYS[1], sample=1000).windows_checked == 60 // int(
        flow.shape.slide.total_seconds() // 60)

    column = "sum_px" if flow is TUMBLE else "max_px"
    lake.table(flow.sink).update(updates={column: "-5.0"},
                                 predicate="sym = 'Y' AND window_start >= '2024-01-01 01:00:00' "
                                           "AND window_start < '2024-01-01 02:00:00'")
    after = check_equivalence_many(engine, flow, KEYS, sample=1000)
    assert after[KEYS[0]].passed and after[KEYS[2]].passed
    bad = after[KEYS[1]]
    assert not bad.passed and {m["keys"]["sym"] for m in bad.mismatches} == {"Y"}
    assert all(m["window_start"].startswith("2024-01-01 01:") and m["columns"] == [column]
               for m in bad.mismatches), bad.mismatches


def test_kll_quantiles_pass_within_the_sketch_rank_error_and_fail_beyond_it(spark, lake, engine):
    """Past k values a KLL sketch's answer depends on the order it saw them: a window merged from six
    appends and the same window recomputed in one pass may give neighbouring values, which must pass;
    a value far from the quantile must not."""
    flow = FlowSpec(name="qty_p50", source="trades", event_time="ts", window=Tumbling("1h"), keys=("sym",),
                    aggregates=(Agg.approx_percentile("qty", 0.5, name="p50", k=50), Agg.count()))
    rows = [(f"2024-01-01 00:{m:02d}:{s:02d}", "X", 1.0, (m * 61 + s * 7) % 97) for m in range(60) for s in (0, 30)]
    lake.create("trades", rows[:20])
    engine.run_many(flow, KEYS[:1])
    for i in range(20, len(rows), 20):  # merged in six steps: a different compaction order
        lake.append("trades", rows[i:i + 20])
        engine.run_many(flow, KEYS[:1])
    assert check_equivalence(engine, flow, KEYS[0], sample=1000).passed
    lake.table(flow.sink).update(updates={"p50": "90.0"}, predicate="sym = 'X'")  # about the 93rd percentile
    bad = check_equivalence(engine, flow, KEYS[0], sample=1000)
    assert not bad.passed and bad.mismatches[0]["columns"] == ["p50"], bad.mismatches


def test_a_small_sample_always_includes_windows_the_sink_holds(spark, lake, engine, monkeypatch):
    """Half the sample comes from the windows the sink has (read from its Delta files): in a sparse
    partition a wrong value there is found even when the sample is far smaller than the partition.
    Neither the runs nor the checks hand pyarrow a Python file (tests/arrow_python_files.py)."""
    forbid_python_files(monkeypatch)
    sparse = [("2024-01-01 01:13:05", "X", 101.0, 3), ("2024-01-01 01:41:50", "Y", 99.0, 4),
              ("2024-01-01 00:20:00", "X", 100.0, 1)]
    lake.create("trades", sparse)
    engine.run_many(TUMBLE, KEYS[:2])
    assert check_equivalence(engine, TUMBLE, KEYS[1], sample=4).passed
    lake.table(TUMBLE.sink).update(updates={"sum_px": "-1.0"},
                                   predicate="window_start >= '2024-01-01 01:00:00'")
    bad = check_equivalence(engine, TUMBLE, KEYS[1], sample=4)
    assert bad.windows_checked == 4
    assert {m["window_start"][:16] for m in bad.mismatches} == {"2024-01-01 01:13", "2024-01-01 01:41"}
    assert check_equivalence(engine, TUMBLE, KEYS[0], sample=4).passed  # the other partition is untouched


def test_many_mismatches_in_one_partition_do_not_hide_another_partitions(spark, lake, engine):
    """At most 20 mismatches are reported per partition; a partition with 120 wrong rows must not use
    up the report of another partition with one."""
    rows = [(f"2024-01-01 0{h}:{m:02d}:10", s, 100.0 + m, 1) for h in range(2) for m in range(60) for s in ("X", "Y")]
    lake.create("trades", rows)
    engine.run_many(TUMBLE, KEYS[:2])
    lake.table(TUMBLE.sink).update(updates={"sum_px": "-5.0"}, predicate="window_start < '2024-01-01 01:00:00'")
    lake.table(TUMBLE.sink).update(updates={"sum_px": "-7.0"},
                                   predicate="window_start = '2024-01-01 01:30:00' AND sym = 'X'")
    results = check_equivalence_many(engine, TUMBLE, KEYS[:2], sample=1000)
    assert len(results[KEYS[0]].mismatches) == 20
    [one] = results[KEYS[1]].mismatches
    assert one["window_start"].startswith("2024-01-01 01:30") and one["keys"] == {"sym": "X"}
