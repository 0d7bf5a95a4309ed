"""Partition keys are checked where they enter a run, before anything is read or written: a key that
names no partition of the flow, or one its windows' arithmetic cannot hold, is an error naming the flow
and the key, never a bare OverflowError or the watermark of a partition no orchestrator offers."""

from __future__ import annotations

import os

import pytest

from laminar_assets.engine import Agg, Engine, FlowSpec, Hopping, LaminarError

FLOW = FlowSpec(name="f", source="trades", event_time="ts", window=Hopping("20m", "10m"), aggregates=(Agg.count(),),
                start="2024-01-01")


@pytest.mark.parametrize("key,problem", [
    ("2026-12-01-16:30", r"hourly partition key \(the start of an hour, like '2026-12-01-16:00'\), found '2026-12-01-16:30'"),
    ("9999-12-31-23:00", "hourly partition from 1000-01-01-00:00 to 9999-12-30-23:00, found '9999-12-31-23:00'"),
    ("0001-01-01-00:00", "hourly partition from 1000-01-01-00:00 to 9999-12-30-23:00, found '0001-01-01-00:00'"),
    ("2023-12-31-23:00", r"partition 2023-12-31-23:00 of 'f' is before its first partition \(2024-01-01 00:00 UTC\)"),
    ("2999-01-01-00:00", "partition 2999-01-01-00:00 of 'f' starts more than 1 day after now"),
])
def test_a_bad_key_is_refused_naming_flow_and_key_before_anything_is_written(lake, key, problem):
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    engine = Engine(None, lake.root)  # refused before Spark is asked for anything
    with pytest.raises(LaminarError, match=problem) as info:
        engine.run_many(FLOW, ["2024-01-01-00:00", key])
    assert info.value.facts == {"flow": "f", "partition": key}
    assert not os.path.exists(os.path.join(lake.root, "_laminar"))  # no lease, intent or watermark of either key
