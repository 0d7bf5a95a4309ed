"""`evaluate_sensor` ticks a sensor as the daemon does, also for Definitions that bind no resources."""

from __future__ import annotations

import dagster as dg

from laminar_assets.orchestration.internals.in_process import evaluate_sensor


def test_a_sensor_of_definitions_without_resources_is_evaluated():
    @dg.sensor(target=dg.AssetSelection.all())
    def ticking(context):
        return dg.SkipReason("nothing to do")

    defs = dg.Definitions(sensors=[ticking])
    with dg.instance_for_test() as instance:
        result = evaluate_sensor(defs, "ticking", instance, cursor=None)
    assert result.skip_message == "nothing to do"
