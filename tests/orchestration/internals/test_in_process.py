"""`evaluate_sensor` ticks a sensor as the daemon does, also for Definitions that bind no resources, but without
a pipeline sensor's watch for commits."""

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


def test_a_sensor_evaluated_here_does_not_watch_for_commits_and_the_daemon_default_does():
    """The demo and the in-process bench tick again on their own: a tick that watched its sources first would only
    make each of their last ticks slower. Ticks elsewhere (the daemon's code server) watch."""
    from laminar_assets.orchestration.sensors import WATCHING

    @dg.sensor(target=dg.AssetSelection.all())
    def ticking(context):
        return dg.SkipReason(f"watching: {WATCHING.get()}")

    defs = dg.Definitions(sensors=[ticking])
    with dg.instance_for_test() as instance:
        assert evaluate_sensor(defs, "ticking", instance, cursor=None).skip_message == "watching: False"
    assert WATCHING.get()
