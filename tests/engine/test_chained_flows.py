"""A flow over another flow's sink: the rollup of a rollup (hourly from per-minute), whose source
has `window_start`/`window_end` columns of its own. Incremental runs equal a full recompute."""

from __future__ import annotations

import dataclasses

import pytest

from laminar_assets.engine import Agg, FlowSpec, Hopping, Tumbling
from laminar_assets.errors import SpecError
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

PARTITION = "2024-01-01-00:00"
PARTITIONS = ("2023-12-31-23:00", PARTITION)  # hopping windows of the first minutes start in the hour before
MINUTE = FlowSpec(name="minute_bars", source="trades", event_time="ts", window=Tumbling("1m"), keys=("sym",),
                  aggregates=(Agg.sum("qty", name="volume"), Agg.max("px", name="high")))
HOURLY = FlowSpec(name="hourly_bars", source="minute_bars", event_time="window_start", window=Tumbling("1h"),
                  keys=("sym",), derived={"minute_end": "window_end"},
                  aggregates=(Agg.sum("volume", name="volume"), Agg.max("high", name="high"),
                              Agg.count(name="minutes"), Agg.max("minute_end", name="last_minute_end")))


def _check(spark, lake, engine, rollup):
    for spec in (MINUTE, rollup):
        engine.run_many(spec, list(PARTITIONS))
    expected = full_recompute(spark, rollup, lake.table("minute_bars").to_pyarrow_table())
    actual = engine.sink_frames(rollup, list(PARTITIONS)).toPandas()
    assert_frames_match(actual, expected, ["window_start", "sym"])


@pytest.mark.parametrize("window", [Tumbling("1h"), Hopping("30m", "10m")], ids=["tumbling", "hopping"])
def test_a_flow_over_a_flows_sink_windows_by_its_window_start(spark, lake, engine, window):
    rollup = dataclasses.replace(HOURLY, window=window)
    lake.create("trades", [("2024-01-01T00:01:10", "A", 10.0, 5), ("2024-01-01T00:01:50", "A", 12.0, 1),
                           ("2024-01-01T00:07:00", "B", 3.0, 2)])
    _check(spark, lake, engine, rollup)
    # late rows, an update and a delete reach the hourly rollup through the minute sink's changes
    lake.append("trades", [("2024-01-01T00:02:00", "A", 11.0, 4), ("2024-01-01T00:59:59", "B", 4.0, 1)])
    lake.update("trades", {"qty": "7"}, "sym = 'B' AND px = 3.0")
    lake.delete("trades", "px = 12.0")
    _check(spark, lake, engine, rollup)


def test_an_aggregate_over_the_sources_own_window_column_is_refused(lake, engine):
    """In aggregates, `window_end` is the flow's window: an aggregate naming the source's column of
    that name would silently read the flow's instead, so the spec check says to derive it."""
    lake.create("trades", [("2024-01-01T00:01:10", "A", 10.0, 5)])
    engine.run(MINUTE, PARTITION)
    bad = dataclasses.replace(HOURLY, name="bad_rollup", aggregates=(Agg.max("window_end", name="last_end"),))
    with pytest.raises(SpecError) as err:
        engine.run(bad, PARTITION)
    assert err.value.field == "aggregates.last_end" and err.value.facts["table"] == "minute_bars"
    assert "derived={'source_window_end': 'window_end'}" in str(err.value)
