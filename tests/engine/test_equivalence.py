"""The equivalence check recomputes several partitions in one pass and pins each mismatch to the
partition that holds it; a partition without a watermark has nothing to compare yet."""

from __future__ import annotations

import pytest

from laminar_assets.engine import Agg, FlowSpec, Hopping, Tumbling
from laminar_assets.engine.equivalence import check_equivalence, check_equivalence_many

pytestmark = pytest.mark.spark

TUMBLE = FlowSpec(name="px_1m", source="trades", event_time="ts", window=Tumbling("1m"), keys=("sym",),
                  aggregates=(Agg.sum("px"), Agg.count()))
HOP = FlowSpec(name="px_hop", source="trades", event_time="ts", window=Hopping("30m", "10m"), keys=("sym",),
               aggregates=(Agg.sum("qty"), Agg.max("px")))
KEYS = ["2024-01-01-00:00", "2024-01-01-01:00", "2024-01-01-02:00"]
ROWS = [(f"2024-01-01 0{h}:{m:02d}:00", s, 100.0 + m + h, m) for h in range(3) for m in range(0, 60, 7)
        for s in ("X", "Y")]


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
