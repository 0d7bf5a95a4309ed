"""The demo with the lake only in a bucket, run by tests/deploy/test_cluster.py inside its driver
process on the standalone cluster, after the differential test's fixed histories: `laminar demo`
(the CLI's own command, in this process) finds this process's Spark session on the cluster and runs
in the same application, so the cluster test pays for one driver JVM and one pair of executors, not
two. Then every sink equals a recompute of the stage, on the same cluster.

Not collected on its own (its name does not start with test_): it needs the cluster and the bucket the
outer test started, which reach it as LAMINAR_TEST_CLUSTER_DEMO (JSON: the bucket's root and the AWS
environment that reaches its S3 server)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from laminar_assets.cli import app
from laminar_assets.definitions import specs_with_contracts
from laminar_assets.engine import FlowSpec
from laminar_assets.engine.delta import open_delta
from laminar_assets.flows import load_specs
from tests.reference import assert_frames_match, full_recompute

REPO = Path(__file__).resolve().parents[2]
SETTINGS = "LAMINAR_TEST_CLUSTER_DEMO"


def test_the_demo_with_the_lake_only_in_a_bucket(spark, tmp_path, monkeypatch):
    given = json.loads(os.environ[SETTINGS])
    root, home = given["root"], tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    for name, value in {**given["env"], "DAGSTER_HOME": str(home),
                        "LAMINAR_SPARK_MASTER": spark.sparkContext.master}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)  # the driver's folder, searched for Parquet files by the outer test
    application = spark.sparkContext.applicationId
    code = app(["--root", root, "demo", "--rows", "50"], standalone_mode=False)
    assert code in (None, 0), f"laminar demo ended with {code}"
    assert spark.sparkContext.applicationId == application  # the demo ran in this application

    specs, _ = specs_with_contracts(load_specs())
    stage = open_delta(f"{root}/normalized_trades").to_pyarrow_table()
    assert stage.num_rows > 0
    for flow in (s for s in specs if isinstance(s, FlowSpec)):
        expected = full_recompute(spark, flow, stage)
        assert_frames_match(open_delta(f"{root}/{flow.sink}").to_pandas(), expected, flow.keys)
