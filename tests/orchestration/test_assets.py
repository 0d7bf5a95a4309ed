"""Materializing partitions through Dagster: results, metadata keys and types, failures, concurrency."""

from __future__ import annotations

import dagster as dg
import pytest

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.flows import load_specs
from laminar_assets.orchestration.assets import build_asset
from laminar_assets.orchestration.checks import build_lag_check
from laminar_assets.pipeline.settings import LaminarSettings
from tests.orchestration.pipeline import BASE, create_sources, trades
from tests.reference import assert_frames_match, full_recompute

pytestmark = pytest.mark.spark

SPECS = {s.name: s for s in load_specs()}
SETTINGS = LaminarSettings(retry_delay_seconds=0)  # a held lease is retried: no waiting in tests
STAGE, VWAP = build_asset(SPECS["normalized_trades"], SETTINGS), build_asset(SPECS["vwap_1m"], SETTINGS)
P9, P10 = "2024-01-02-09:00", "2024-01-02-10:00"
NUMERIC = ["pending_versions", "versions_read", "files_read", "bytes_read", "rows_read", "rows_rejected", "rows_quarantined",
           "windows_touched",
           "state_rows", "sink_rows", "seconds_read", "seconds_state", "seconds_merge", "seconds_write",
           "seconds_total", "source_version_normalized_trades"]


def materialize(assets, key, laminar, instance, **kw):
    return dg.materialize(assets, partition_key=key, resources={"laminar": laminar}, instance=instance, **kw)


def metadata(result, name):
    [mat] = result.asset_materializations_for_node(name)
    return mat.metadata


def test_materialize_stage_and_flow_with_metadata(spark, lake, laminar, instance):
    create_sources(lake, BASE)
    for key in (P9, P10):
        assert materialize([STAGE], key, laminar, instance).success
    result = materialize([VWAP], P9, laminar, instance)
    md = metadata(result, "vwap_1m")
    assert md["mode"].value == "REFILL" and md["reason"].value == "NO_WATERMARK"
    for key in NUMERIC:
        assert isinstance(md[key], (dg.IntMetadataValue, dg.FloatMetadataValue)), (key, md[key])
    assert md["rows_read"].value == 3 and md["sink_rows"].value == 3
    assert "vwap" in md["preview"].value
    # a late row and a correction, then the same partition again: incremental
    lake.append("raw_trades", frame=trades([(5, "2024-01-02 09:01:30", "AAPL", "ACC-9", "BUY", 189.0, 100)]))
    lake.update("raw_trades", {"price": "200.0"}, "trade_id = 2")
    materialize([STAGE], P9, laminar, instance)
    md = metadata(materialize([VWAP], P9, laminar, instance), "vwap_1m")
    assert (md["mode"].value, md["reason"].value) == ("INCREMENTAL", "RETRACTABLE_CHANGES")
    expected = full_recompute(spark, SPECS["vwap_1m"], lake.table("normalized_trades").to_pyarrow_table())
    import pandas as pd

    expected = expected[pd.to_datetime(expected["window_start"], utc=True) < pd.Timestamp("2024-01-02 10:00", tz="UTC")]
    assert_frames_match(lake.read("vwap_1m"), expected.reset_index(drop=True), ("symbol",))


def test_partition_range_runs_in_one_run(spark, lake, laminar, instance):
    create_sources(lake, BASE)
    from laminar_assets.orchestration.sensors import RANGE_END, RANGE_START

    result = dg.materialize([STAGE], tags={RANGE_START: P9, RANGE_END: P10},
                            resources={"laminar": laminar}, instance=instance)
    assert result.success
    runs = instance.get_runs()
    assert len(runs) == 1
    mats = result.asset_materializations_for_node("normalized_trades")
    assert {m.partition for m in mats} == {P9, P10}
    by_key = {m.partition: m.metadata for m in mats}
    assert all(md["partitions"].value == 2 for md in by_key.values())
    # each partition's materialization carries that partition's own mode, reason, versions and rows
    # (the UI's partition page and per-partition plots read them), not the range's
    for key in (P9, P10):
        md = by_key[key]
        assert (md["mode"].value, md["reason"].value) == ("REFILL", "NO_WATERMARK")
        assert md["versions_to"].value == {"raw_trades": 0, "symbols": 0}
        state = CheckpointStore(lake.root).load("normalized_trades", key)
        assert md["dagster/partition_row_count"].value == md["sink_rows"].value > 0
        assert state is not None
    assert by_key[P9]["rows_read"].value + by_key[P10]["rows_read"].value == len(BASE)
    # one log entry for the step, a line per partition (every entry is an event the instance stores)
    logs = [r.event_log_entry.user_message for r in instance.get_records_for_run(runs[0].run_id).records
            if r.event_log_entry.dagster_event is None and r.event_log_entry.step_key == "normalized_trades"]
    assert len(logs) == 1 and logs[0].splitlines() == [
        f"normalized_trades {key}: REFILL (NO_WATERMARK) — partition {key} has no watermark yet" for key in (P9, P10)]


def test_failure_carries_engine_message_and_keeps_watermark(spark, lake, laminar, instance):
    create_sources(lake, BASE)
    result = materialize([VWAP], P9, laminar, instance, raise_on_error=False)  # stage output missing
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "source table 'normalized_trades' does not exist" in failure.step_failure_data.error.message
    mark = CheckpointStore(lake.root).load("vwap_1m", P9)  # the failure is recorded; nothing moved
    assert mark.source_versions == {} and mark.seq == 0 and mark.failed_runs.count == 1
    assert "source table 'normalized_trades' does not exist" in mark.failed_runs.last_error


def test_concurrent_materialization_of_one_partition_does_not_write(spark, lake, laminar, instance):
    create_sources(lake, BASE)
    store = CheckpointStore(lake.root)
    with store.hold("normalized_trades", P9, "another-run"):  # a live run of this process holds the partition
        result = materialize([STAGE], P9, laminar, instance, raise_on_error=False)
    assert not result.success
    failure = [e for e in result.all_events if e.is_step_failure][0]
    assert "being processed by another run" in failure.step_failure_data.error.message
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retries) == SETTINGS.retries  # a held partition is transient: retried, then the message stays
    assert not lake.table_exists("normalized_trades")
    assert materialize([STAGE], P9, laminar, instance).success


def test_watermark_lag_check(spark, lake, laminar, instance):
    create_sources(lake, BASE)
    materialize([STAGE], P9, laminar, instance)
    check = build_lag_check(SPECS["normalized_trades"])
    ok = dg.materialize([STAGE, check], partition_key=P9, resources={"laminar": laminar}, instance=instance)
    [evaluation] = ok.get_asset_check_evaluations()
    assert evaluation.passed and evaluation.metadata["partitions_checked"].value == 1
    lake.append("raw_trades", frame=trades([(9, "2024-01-02 09:30:00", "XOM", "ACC-1", "BUY", 111.0, 100)]))
    result = check(laminar=laminar)
    assert not result.passed
    assert result.metadata["stale_partitions"].value == 1 and result.metadata["max_versions_behind"].value == 1

