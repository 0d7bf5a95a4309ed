"""The rolling hit and fallback rates a materialization carries: read from the latest materialization's
`recent_modes` (one record), or from the older materializations one by one when it has none."""

from __future__ import annotations

from types import SimpleNamespace

import dagster as dg

from laminar_assets.engine import Mode
from laminar_assets.flows import load_specs
from laminar_assets.orchestration.assets import RECENT, RECENT_MODES, recent_rates

VWAP = next(s for s in load_specs() if s.name == "vwap_1m")
KEY = dg.AssetKey(VWAP.name)


def run(*modes: Mode) -> list:
    """A run's results as `recent_rates` reads them (only their modes)."""
    return [SimpleNamespace(mode=m) for m in modes]


def record(instance: dg.DagsterInstance, metadata: dict) -> None:
    instance.report_runless_asset_event(dg.AssetMaterialization(KEY, metadata=metadata))


class CountingInstance:
    """The instance, with the limits of its `fetch_materializations` calls kept."""

    def __init__(self, instance: dg.DagsterInstance):
        self.instance, self.limits = instance, []

    def fetch_materializations(self, key, *, limit):
        self.limits.append(limit)
        return self.instance.fetch_materializations(key, limit=limit)


def test_rates_of_a_first_run_are_its_own():
    with dg.instance_for_test() as instance:
        rates = recent_rates(instance, VWAP, run(Mode.INCREMENTAL, Mode.REFILL, Mode.NOOP, Mode.INCREMENTAL))
    assert rates[RECENT_MODES] == "INRI"  # newest (the last partition) first
    assert rates["recent_partition_runs"] == 4
    assert rates["recent_incremental_share"] == 0.5 and rates["recent_noop_share"] == 0.25
    assert rates["recent_hit_rate"] == round(2 / 3, 4)


def test_rates_follow_the_latest_materialization_with_one_read():
    with dg.instance_for_test() as instance:
        counting = CountingInstance(instance)
        window = ""
        for n in range(30):  # runs of 5 partitions: the window fills to RECENT, then rolls
            modes = [Mode.NOOP if (n + i) % 3 == 0 else Mode.INCREMENTAL if i % 2 else Mode.REFILL for i in range(5)]
            rates = recent_rates(counting, VWAP, run(*modes))  # type: ignore[arg-type]
            window = ("".join(m.value[0] for m in reversed(modes)) + window)[:RECENT]
            assert rates[RECENT_MODES] == window
            assert rates["recent_partition_runs"] == len(window)
            assert rates["recent_refill_share"] == round(window.count("R") / len(window), 4)
            worked = window.replace("N", "")
            assert rates["recent_hit_rate"] == round(worked.count("I") / len(worked), 4)
            for _ in modes:  # a range run records a materialization per partition, each with the range's rates
                record(instance, {"mode": modes[0].value, **rates})
        assert counting.limits == [1] * 30  # one record a run, whatever the history holds


def test_materializations_without_recent_modes_are_read_one_by_one():
    """Materializations recorded before `recent_modes` existed: their own modes, newest first."""
    with dg.instance_for_test() as instance:
        for mode in [Mode.REFILL] * 3 + [Mode.INCREMENTAL] * 2:
            record(instance, {"mode": mode.value})
        record(instance, {"note": "a materialization reported by hand, without a mode"})
        counting = CountingInstance(instance)
        rates = recent_rates(counting, VWAP, run(Mode.NOOP))  # type: ignore[arg-type]
        assert rates[RECENT_MODES] == "NIIRRR"
        assert counting.limits == [1, RECENT - 1]
        assert rates["recent_hit_rate"] == 0.4
