"""A flow's asset with a catalog: its run registers the sink, and `dagster/table_name` is the catalog name a
query engine resolves (the test session's embedded metastore, tests/conftest.py)."""

from __future__ import annotations

import dagster as dg
import pytest

from laminar_assets.orchestration.assets import build_asset
from laminar_assets.pipeline.settings import LaminarSettings
from laminar_assets.resources import LaminarResource
from tests.engine.catalog.test_hive_catalog import PART, ROWS, sums

pytestmark = pytest.mark.spark


def test_the_assets_table_name_is_its_catalog_name(spark, lake, laminar, instance):
    lake.create("trades", ROWS)
    resource = LaminarResource(root=laminar.root, spark=laminar.spark, catalog_schema="t_dagster_assets")
    result = dg.materialize([build_asset(sums(), LaminarSettings(retries=0))], partition_key=PART,
                            resources={"laminar": resource}, instance=instance)
    [mat] = result.asset_materializations_for_node("sums")
    assert mat.metadata["dagster/table_name"].value == "t_dagster_assets.sums"
    assert spark.table("t_dagster_assets.sums").count() == len(lake.read("sums")) > 0
