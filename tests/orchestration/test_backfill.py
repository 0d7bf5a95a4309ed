"""Stale partitions after late rows and deletes: one catch-up pass brings every sink to a full recompute."""

import dagster as dg
import pytest

from laminar_assets.definitions import build_definitions
from laminar_assets.flows import load_specs
from laminar_assets.orchestration.internals.in_process import execute_request
from laminar_assets.orchestration.sensors import stale_requests
from laminar_assets.pipeline.settings import LaminarSettings
from tests.orchestration.pipeline import BASE, create_sources, trades
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

SPECS = {s.name: s for s in load_specs()}
PIPE = [SPECS["normalized_trades"], SPECS["vwap_1m"]]


def test_stale_partition_backfill_equals_full_recompute(spark, lake, laminar, instance):
    settings = LaminarSettings()  # two stale partitions -> one range run
    defs = build_definitions(PIPE, settings, resources={"laminar": laminar})
    create_sources(lake, BASE)
    for spec in PIPE:
        for key in ("2024-01-02-09:00", "2024-01-02-10:00"):
            assert execute_request(defs, dg.RunRequest(asset_selection=[dg.AssetKey(spec.name)], partition_key=key),
                                   instance).success
    assert stale_requests(PIPE, settings, laminar) == []
    lake.append("raw_trades", frame=trades([(20, "2024-01-02 09:03:00", "AAPL", "ACC-5", "BUY", 188.0, 100)]))
    lake.delete("raw_trades", "trade_id = 4")

    [stage_run] = stale_requests(PIPE, settings, laminar)  # only the stage is behind its source so far
    assert stage_run.asset_selection == [dg.AssetKey("normalized_trades")]
    assert stage_run.tags["dagster/asset_partition_range_start"] == "2024-01-02-09:00"
    assert execute_request(defs, stage_run, instance).success
    [flow_run] = stale_requests(PIPE, settings, laminar)
    assert flow_run.asset_selection == [dg.AssetKey("vwap_1m")]
    assert execute_request(defs, flow_run, instance).success
    assert stale_requests(PIPE, settings, laminar) == []

    expected = full_recompute(spark, SPECS["vwap_1m"], lake.table("normalized_trades").to_pyarrow_table())
    assert_frames_match(lake.read("vwap_1m"), expected, ("symbol",))
    assert 4 not in lake.read("normalized_trades")["trade_id"].tolist()
