"""LaminarComponent's attributes are checked when the defs.yaml loads: a misspelled key, a bad start,
an unknown flow under `schedules`, a missing folder are errors naming the field (the team-project
test, test_component.py, runs the component through `dg` itself)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from laminar_assets.engine.registry import collect_specs
from laminar_assets.errors import LaminarError
from laminar_assets.flows import load_specs
from laminar_assets.orchestration.builder import build_definitions
from laminar_assets.orchestration.component import LaminarComponent
from laminar_assets.pipeline.settings import LaminarSettings


@pytest.mark.parametrize("attributes,where", [
    ({"spark": {"mastr": "local[2]"}}, "mastr"),
    ({"s3": {"endpont": "http://127.0.0.1:9000"}}, "endpont"),
    ({"partitions_start": "2026-13-01"}, "expected an ISO date"),
    ({"partition_start": "2026-11-01"}, "partition_start"),
    ({"engine": {"refil_ratio": 0.3}}, "engine: 'refil_ratio' is not an engine option; the options are refill_ratio"),
    ({"engine": {"refill_ratio": "most"}}, "engine: refill_ratio: Input should be a valid number"),
    ({"engine": {"future_horizon": "2d"}}, "future_horizon is this component's own attribute"),
])
def test_a_misspelled_or_bad_attribute_is_an_error_naming_it(attributes, where):
    with pytest.raises(ValidationError, match=where):
        LaminarComponent(**attributes)


def test_typed_spark_and_s3_attributes_reach_the_resource():
    component = LaminarComponent(spark={"remote": "sc://127.0.0.1:15002", "conf": {"spark.x": "1"}},
                                 s3={"endpoint": "http://127.0.0.1:9000", "path_style": True})
    assert component.spark.remote == "sc://127.0.0.1:15002" and component.s3.path_style is True


def test_a_schedule_of_an_unknown_flow_names_the_known_ones():
    with pytest.raises(LaminarError, match=r"schedule for unknown flow 'vwap_1mm': expected one of .*vwap_1m"):
        build_definitions(load_specs(), LaminarSettings(schedules={"vwap_1mm": "*/15 * * * *"}))


def test_a_flows_module_that_does_not_exist_names_the_field():
    with pytest.raises(LaminarError, match=r"flows module 'teamproj.flowz' cannot be imported.*\[field=flows\]"):
        collect_specs("teamproj.flowz")


def test_the_docs_snippet_that_creates_raw_trades_writes_what_the_example_flow_reads(tmp_path, monkeypatch):
    """docs/dg-component.md's first-try snippet, run as shown, gives the columns the scaffolded flow uses."""
    import pathlib
    import re

    from deltalake import DeltaTable

    from laminar_assets.engine.sql.views import compile_sql
    from laminar_assets.orchestration.component import EXAMPLE_FLOW

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "dg-component.md").read_text()
    [snippet] = [b for b in re.findall(r"```python\n(.*?)```", doc, re.S) if "write_deltalake" in b]
    monkeypatch.chdir(tmp_path)
    exec(compile(snippet, "dg-component.md", "exec"), {})
    table = DeltaTable(str(tmp_path / ".laminar" / "lake" / "raw_trades"))
    [flow] = compile_sql(EXAMPLE_FLOW, origin="trades_1m.sql")
    columns = {f.name for f in table.schema().fields}
    assert {flow.event_time, *flow.keys, "price", "quantity"} <= columns and table.to_pandas().shape[0] == 2


def test_the_engine_attribute_becomes_the_settings_engine_options():
    from laminar_assets.engine import EngineOptions

    component = LaminarComponent(engine={"refill_ratio": 0.3, "precision_guard": False}, future_horizon="6h")
    settings = LaminarSettings(engine=component.engine, future_horizon=component.future_horizon)
    options = EngineOptions.of(settings.engine_options())
    assert (options.refill_ratio, options.precision_guard, options.future_horizon.total_seconds()) == (0.3, False, 21600)


def test_the_settings_attributes_are_the_settings_fields_described_and_checked_alike():
    """LaminarSettings is the one declaration of the project settings: the component has an attribute for
    each, with its description (which `dg` shows: every attribute is described in the component's schema),
    and refuses what the settings refuse when it loads, naming the attribute."""
    schema = LaminarComponent.model().model_json_schema()["properties"]
    assert not [name for name, field in schema.items() if not field.get("description")]
    for name, field in LaminarSettings.model_fields.items():
        assert LaminarComponent.model_fields[name].default is None
        assert schema[name]["description"].startswith(field.description)
    for attributes, where in (({"retries": -1}, r"retries\n.*greater than or equal to 0"),
                              ({"sensor_interval_seconds": 0}, r"sensor_interval_seconds\n.*greater than or equal to 1"),
                              ({"future_horizon": "-1h"}, r"future_horizon\n.*expected a duration")):
        with pytest.raises(ValidationError, match=where):
            LaminarComponent(**attributes)
    component = LaminarComponent(partitions_start="2025-01-01", retry_delay_seconds=3, schedules={"vwap_1m": "@daily"})
    settings = component.settings()
    assert (settings.partitions_start.year, settings.retry_delay_seconds, settings.retries) == (2025, 3.0, 2)
    assert settings.schedules == {"vwap_1m": "@daily"} and LaminarComponent().settings() == LaminarSettings()
