"""LaminarComponent's attributes are checked when the defs.yaml loads: a misspelled key, a bad start,
an unknown flow under `schedules`, a missing folder are errors naming the field (the team-project
test, test_component.py, runs the component through `dg` itself)."""

from __future__ import annotations

import re

import dagster as dg
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
    ({"engine": {"refil_ratio": 0.3}},
     "engine: 'refil_ratio' is not an engine option; did you mean 'refill_ratio'\\? the options are refill_ratio"),
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
    with pytest.raises(LaminarError, match=r"schedule for unknown flow 'vwap_1mm': did you mean 'vwap_1m'\? "
                                             r"expected one of .*vwap_1m"):
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


def test_the_spark_and_s3_attributes_are_the_resources_fields():
    """SparkResource and LaminarResource's s3_* fields are the one declaration of the component's `spark` and `s3`
    attributes: the same names (s3 without its prefix), types, defaults and descriptions, so a field added to a
    resource is an attribute of the component; every one described (Dagster's UI shows a resource's descriptions),
    and the S3 ones all options of the store they reach (ObjectStoreOptions)."""
    import dataclasses

    from laminar_assets.orchestration.component import S3Attributes, SparkAttributes
    from laminar_assets.resources import LaminarResource, SparkResource
    from laminar_assets.storage import ObjectStoreOptions

    def shown(model, prefix=""):
        return {prefix + name: (f.annotation, f.get_default(call_default_factory=True), f.description)
                for name, f in model.model_fields.items()}

    spark = {k: v for k, v in shown(SparkResource).items() if k != "stop_at_end"}
    s3 = {k: v for k, v in shown(LaminarResource).items() if k.startswith("s3_")}
    assert shown(SparkAttributes) == spark and shown(S3Attributes, "s3_") == s3
    assert len(spark) == 7 and len(s3) == 7 and all(description for _, _, description in [*spark.values(), *s3.values()])
    assert {name.removeprefix("s3_") for name in s3} <= {f.name for f in dataclasses.fields(ObjectStoreOptions)}
    schema = LaminarComponent.model().model_json_schema()["$defs"]  # what `dg` shows of them
    for model, fields, prefix in ((SparkAttributes, spark, ""), (S3Attributes, s3, "s3_")):
        assert {prefix + n: p.get("description") for n, p in schema[model.__name__]["properties"].items()} == \
            {n: d for n, (_, _, d) in fields.items()}


def test_a_defs_yaml_s_spark_and_s3_attributes_reach_the_resource_as_written():
    """A defs.yaml loaded by dg's own component loader (in process): build_defs gives the resource exactly the
    attributes written (s3 ones under their s3_ names), and a Spark JIT the engine does not know is an error naming
    spark.jit and its defs.yaml line when the defs.yaml loads, not when a run starts."""
    from dagster.components.testing import create_defs_folder_sandbox

    attributes = {"flows": "flows", "lake_root": "s3://bucket/lake", "partitions_start": "2026-01-01",
                  "spark": {"remote": "sc://127.0.0.1:15002", "conf": {"spark.x": "1"}, "jit": "quick"},
                  "s3": {"endpoint": "http://127.0.0.1:9000", "path_style": True, "call_timeout_s": 12}}
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(LaminarComponent, defs_path="trades", defs_yaml_contents={
            "type": "laminar_assets.LaminarComponent", "attributes": attributes})
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            laminar = defs.resources["laminar"]
            assert isinstance(component, LaminarComponent)
            assert defs.resolve_asset_graph().get(dg.AssetKey("trades_1m")) is not None
        assert laminar.spark.model_dump() == {**attributes["spark"], "master": None, "shuffle_partitions": 4,
                                              "driver_memory": "2g", "metastore": None, "stop_at_end": True}
        assert {k: getattr(laminar, k) for k in laminar.model_fields if k.startswith("s3_")} == \
            {"s3_endpoint": "http://127.0.0.1:9000", "s3_region": None, "s3_access_key_id": None,
             "s3_secret_access_key": None, "s3_path_style": True, "s3_request_timeout_s": None, "s3_call_timeout_s": 12}
        assert laminar.store("s3://bucket/lake").call_timeout_s == 12
        with sandbox.swap_defs_file(path / "defs.yaml", {"type": "laminar_assets.LaminarComponent", "attributes": {
                **attributes, "spark": {"jit": "fast"}}}):
            with pytest.raises(Exception) as raised:  # noqa: B017  (dg's own error, whose cause names the attribute)
                with sandbox.load_component_and_build_defs(defs_path=path):
                    pass
    causes = []
    error: BaseException | None = raised.value
    while error is not None:
        causes.append(str(error))
        error = error.__cause__ or error.__context__
    named = r"spark\.SparkAttributes\.jit at .*defs\.yaml:\d+`\n.*expected one of hot, quick, tiered, not 'fast'"
    assert any(re.search(named, c) for c in causes), causes
