"""Fixtures for the Dagster layer: a real temporary instance and resources on the shared Spark."""

from __future__ import annotations

import dagster as dg
import pytest

from laminar_assets.resources import LaminarResource, SparkResource


@pytest.fixture
def instance(tmp_path):
    home = tmp_path / "dagster_home"
    home.mkdir()
    with dg.instance_for_test(temp_dir=str(home)) as inst:
        yield inst


@pytest.fixture
def laminar(lake) -> LaminarResource:
    # stop_at_end=False: reuse the test session's SparkSession instead of one per run.
    return LaminarResource(root=lake.root, spark=SparkResource(master="local[2]", shuffle_partitions=2,
                                                               stop_at_end=False))
