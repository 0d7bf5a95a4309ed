"""All definitions load: one asset per spec, sources as observable assets, a sensor per connected part."""

from __future__ import annotations

import dagster as dg

from laminar_assets.definitions import build_definitions, defs
from laminar_assets.engine import Agg, FlowSpec, Tumbling
from laminar_assets.flows import load_specs
from laminar_assets.pipeline.settings import LaminarSettings


def test_definitions_load_and_validate():
    dg.Definitions.validate_loadable(defs)
    keys = {k.to_user_string() for k in defs.resolve_all_asset_keys()}
    specs = load_specs()
    assert {s.name for s in specs} <= keys
    assert {"raw_trades", "symbols"} <= keys
    # one pipeline sensor per connected part
    assert {s.name for s in defs.sensors} == {"raw_trades_pipeline", "stale_partitions", "laminar_run_failures",
                                                "laminar_run_recoveries"}
    graph = defs.resolve_asset_graph()
    vwap = graph.get(dg.AssetKey("vwap_1m"))
    assert vwap.parent_keys == {dg.AssetKey("normalized_trades")}
    assert isinstance(vwap.partitions_def, dg.HourlyPartitionsDefinition)
    assert defs.resolve_job_def("vwap_1m_latest") is not None


def test_adding_a_spec_adds_an_asset():
    extra = FlowSpec(name="extra", source="raw_trades", event_time="event_time", window=Tumbling("1h"),
                     aggregates=(Agg.count(),), partitioning="daily")
    built = build_definitions([*load_specs(), extra], LaminarSettings())
    asset = built.resolve_asset_graph().get(dg.AssetKey("extra"))
    assert isinstance(asset.partitions_def, dg.DailyPartitionsDefinition)
    assert asset.parent_keys == {dg.AssetKey("raw_trades")}


def test_building_them_warns_of_nothing():
    """Every process that loads the definitions (code server, each launched run) logs what they warn
    of: the beta/preview features Laminar uses on purpose are silenced, and nothing deprecated is used."""
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        build_definitions(load_specs(), LaminarSettings(schedules={"vwap_1m": "*/15 * * * *"}))
    assert [f"{w.category.__name__}: {w.message}" for w in caught] == []
