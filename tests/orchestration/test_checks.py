"""Each quality check can fail: a corrupted sink row fails the contract and the equivalence check,
a retyped source column stops the run before anything is written."""

from __future__ import annotations

import dagster as dg
import pytest
from deltalake import write_deltalake

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.contracts import load_contracts
from laminar_assets.definitions import CONTRACTS
from laminar_assets.engine import Engine
from laminar_assets.flows import load_specs
from laminar_assets.orchestration.assets import build_asset
from laminar_assets.orchestration.checks import build_contract_check, build_equivalence_check, contract_result, equivalence_result
from laminar_assets.pipeline.settings import LaminarSettings
from tests.orchestration.pipeline import BASE, create_sources, trades

pytestmark = pytest.mark.spark

SPECS = {s.name: s for s in load_specs()}
CONTRACT = load_contracts(CONTRACTS)
SETTINGS = LaminarSettings()
P9 = "2024-01-02-09:00"


def materialized(spark, lake, laminar, instance):
    create_sources(lake, BASE)
    stage = build_asset(SPECS["normalized_trades"], SETTINGS, CONTRACT)
    vwap = build_asset(SPECS["vwap_1m"], SETTINGS, CONTRACT)
    checks = [build_contract_check(SPECS["vwap_1m"], CONTRACT["vwap_1m"], SETTINGS),
              build_equivalence_check(SPECS["vwap_1m"], SETTINGS)]
    assert dg.materialize([stage], partition_key=P9, resources={"laminar": laminar}, instance=instance).success
    result = dg.materialize([vwap, *checks], partition_key=P9, resources={"laminar": laminar}, instance=instance)
    return {e.check_name: e for e in result.get_asset_check_evaluations()}


def test_checks_pass_then_fail_on_a_corrupted_sink_row(spark, lake, laminar, instance):
    evaluations = materialized(spark, lake, laminar, instance)
    assert evaluations["contract"].passed, evaluations["contract"].metadata
    assert evaluations["contract"].metadata["expectations_evaluated"].value == 11
    assert evaluations["equivalence"].passed and evaluations["equivalence"].metadata["windows_checked"].value >= 4

    lake.table("vwap_1m").update(updates={"vwap": "-1.0"}, predicate="symbol = 'XOM'")
    engine = Engine(spark, lake.root)
    contract = contract_result(engine, SPECS["vwap_1m"], CONTRACT["vwap_1m"], P9)
    assert not contract.passed
    [failure] = contract.metadata["failures"].value
    assert failure["expectation"].startswith("between(vwap") and failure["unexpected_count"] == 1
    assert failure["examples"] == [-1.0]
    equivalence = equivalence_result(engine, SPECS["vwap_1m"], P9, sample=60)
    assert not equivalence.passed
    [mismatch] = equivalence.metadata["mismatched_windows"].value
    assert mismatch["keys"] == {"symbol": "XOM"} and mismatch["columns"] == ["vwap"]
    assert mismatch["window_start"].startswith("2024-01-02 09:40") and mismatch["sink"]["vwap"] == -1.0


def test_lost_sink_row_fails_equivalence(spark, lake, laminar, instance):
    materialized(spark, lake, laminar, instance)
    lake.delete("vwap_1m", "symbol = 'AAPL'")
    result = equivalence_result(Engine(spark, lake.root), SPECS["vwap_1m"], P9, sample=60)
    assert not result.passed and result.metadata["windows_checked"].value == 60
    missing = result.metadata["mismatched_windows"].value
    assert {m["keys"]["symbol"] for m in missing} == {"AAPL"} and all(m["sink"]["trades"] is None for m in missing)


def test_a_sink_naming_a_missing_file_fails_both_checks_naming_the_table_and_file(spark, lake, laminar, instance):
    """A reader should never be the first to find a table that names a missing file."""
    import os

    materialized(spark, lake, laminar, instance)
    sink = lake.table("vwap_1m")
    lost = sink.file_uris()[0].removeprefix("file://")
    os.remove(lost)
    engine = Engine(spark, lake.root)
    for result in (contract_result(engine, SPECS["vwap_1m"], CONTRACT["vwap_1m"], P9),
                   equivalence_result(engine, SPECS["vwap_1m"], P9)):
        assert not result.passed
        [broken] = result.metadata["broken_tables"].value
        assert broken["table"] == "vwap_1m" and broken["version"] == sink.version() and broken["missing"] == [lost]
        assert f"vwap_1m at {lake.path('vwap_1m')}, version {sink.version()}: 1 of the" in result.metadata["integrity"].value


def test_retyped_source_column_stops_the_run_before_writing(spark, lake, laminar, instance):
    create_sources(lake, BASE)
    retyped = trades(BASE).astype({"price": "string"})
    write_deltalake(lake.path("raw_trades"), retyped, mode="overwrite", schema_mode="overwrite")
    stage = build_asset(SPECS["normalized_trades"], SETTINGS, CONTRACT)
    result = dg.materialize([stage], partition_key=P9, resources={"laminar": laminar}, instance=instance,
                            raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.is_step_failure)
    assert "column 'price' at version 1: expected double (contract), found string" in failure.step_failure_data.error.message
    assert not lake.table_exists("normalized_trades")
    # counted as a failing run, so `laminar status` and `laminar check` do not show the stage healthy
    mark = CheckpointStore(lake.root).load("normalized_trades", P9)
    assert mark.seq == 0 and mark.source_versions == {} and mark.failed_runs.count == 1
    assert "expected double (contract), found string" in mark.failed_runs.last_error
    assert mark.failed_runs.run_id == result.run_id


def test_added_nullable_source_column_is_accepted_and_reported(spark, lake, laminar, instance):
    create_sources(lake, BASE)
    wider = trades(BASE).assign(fee=0.5)
    write_deltalake(lake.path("raw_trades"), wider, mode="overwrite", schema_mode="merge")
    stage = build_asset(SPECS["normalized_trades"], SETTINGS, CONTRACT)
    result = dg.materialize([stage], partition_key=P9, resources={"laminar": laminar}, instance=instance)
    [mat] = result.asset_materializations_for_node("normalized_trades")
    assert mat.metadata["source_columns_added"].value == {"raw_trades": ["fee"]}


def test_a_range_run_records_the_contract_per_partition(spark, lake, laminar, instance):
    """Sensor runs are range runs: the check validates the partitions together, and on a failure one by
    one, and records one evaluation per partition (what holding consumers per partition reads)."""
    from laminar_assets.contracts.model import ExpectationRule

    create_sources(lake, BASE)
    stage = build_asset(SPECS["normalized_trades"], SETTINGS, CONTRACT)
    vwap = build_asset(SPECS["vwap_1m"], SETTINGS, CONTRACT)
    strict = CONTRACT["vwap_1m"].model_copy(update={"expectations": [
        *CONTRACT["vwap_1m"].expectations, ExpectationRule(expect="between", column="vwap", max=300)]})
    check = build_contract_check(SPECS["vwap_1m"], strict, SETTINGS)  # MSFT (410) trades in 10:00 only
    span = {"dagster/asset_partition_range_start": P9, "dagster/asset_partition_range_end": "2024-01-02-10:00"}
    kw = dict(resources={"laminar": laminar}, instance=instance, tags=span)
    assert dg.materialize([stage], **kw).success
    result = dg.materialize([vwap, check], raise_on_error=False, **kw)
    by_partition = {e.partition: e.passed for e in result.get_asset_check_evaluations()}
    assert by_partition == {P9: True, "2024-01-02-10:00": False, None: False}
    key = dg.AssetCheckKey(dg.AssetKey("vwap_1m"), "contract")
    infos = {i.partition_key: i for i in instance.event_log_storage.get_asset_check_partition_info(
        [key], partition_keys=[P9, "2024-01-02-10:00"])}
    assert infos[P9].latest_execution_status.value == "SUCCEEDED" and infos[P9].is_current
    assert infos["2024-01-02-10:00"].latest_execution_status.value == "FAILED"


@pytest.mark.parametrize("fetch", ["driver", "spark"])
def test_a_row_count_rule_is_checked_per_partition_from_one_fetch(spark, lake, laminar, instance, fetch):
    """A row-count rule cannot be validated on the union of partitions: each partition's rows of one
    fetch are validated. The driver reads small local sink files itself (no Spark job); otherwise one
    Spark job fetches the range, not one per partition. Both give the same outcomes."""
    from laminar_assets.contracts.model import ExpectationRule
    from laminar_assets.engine import EngineOptions
    from laminar_assets.orchestration.checks import contract_outcomes
    from tests.engine.test_one_pass import Jobs

    create_sources(lake, BASE)
    span = {"dagster/asset_partition_range_start": P9, "dagster/asset_partition_range_end": "2024-01-02-10:00"}
    assets = [build_asset(SPECS[n], SETTINGS, CONTRACT) for n in ("normalized_trades", "vwap_1m")]
    assert dg.materialize(assets, resources={"laminar": laminar}, instance=instance, tags=span).success
    sink = lake.read("vwap_1m")
    counts = sink.groupby(sink["window_start"].dt.strftime("%Y-%m-%d-%H:00")).size().to_dict()
    assert set(counts) == {P9, "2024-01-02-10:00"} and len(set(counts.values())) == 2
    small, big = sorted(counts, key=counts.get)
    rules = [r for r in CONTRACT["vwap_1m"].expectations if r.expect != "row_count_between"]
    capped = CONTRACT["vwap_1m"].model_copy(update={"expectations": [
        *rules, ExpectationRule(expect="row_count_between", min=1, max=counts[small])]})
    engine = Engine(spark, lake.root, options=EngineOptions(driver_write_below_bytes=0) if fetch == "spark" else None)
    outcomes, jobs = Jobs(spark).count(
        lambda: contract_outcomes(engine, SPECS["vwap_1m"], capped, [P9, "2024-01-02-10:00"]))
    assert {k: ok for k, (ok, _) in outcomes.items()} == {small: True, big: False}
    assert outcomes[big][1]["rows_checked"] == counts[big] and outcomes[small][1]["ge_engine"] == "pandas"
    assert outcomes[big][1]["rows_fetched_by"] == fetch
    [failure] = outcomes[big][1]["failures"].value
    assert failure["expectation"].startswith("row_count_between") and failure["observed"] == counts[big]
    assert jobs == (1 if fetch == "spark" else 0)
