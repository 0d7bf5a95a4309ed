"""Laminar on a Spark standalone cluster (a master and two workers from the pyspark wheel, on
127.0.0.1): the differential test's fixed histories and the demo run with `master=spark://...` and
give the results of local mode. The differential test's lake is local: driver and executors share
this machine's file system. The demo's lake is only in a bucket (a local S3 server): they share
nothing but the bucket, the executors write their files through s3a and the driver commits through
deltalake. (The demo on a local lake is the same path as the differential test's, so it is not run
again here.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from laminar_assets.definitions import specs_with_contracts
from laminar_assets.engine import FlowSpec
from laminar_assets.flows import load_specs
from tests.deploy.cluster import standalone_cluster
from tests.reference import assert_frames_match, full_recompute

pytestmark = [pytest.mark.spark, pytest.mark.deployment, pytest.mark.timeout(1200)]
REPO = Path(__file__).resolve().parents[2]
SPECS, _ = specs_with_contracts(load_specs())


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with standalone_cluster(tmp_path_factory.mktemp("cluster"), workers=2, python=sys.executable) as running:
        yield running


def _driver_env(cluster, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LAMINAR_SPARK_", "PYTEST_"))}
    return {**env, **cluster.env, **extra}


def _apps(cluster) -> list[dict]:
    status = cluster.status()
    return status.get("activeapps", []) + status.get("completedapps", [])


def test_the_differential_test_passes_on_a_standalone_cluster(cluster):
    before = len(_apps(cluster))
    # The fixed histories, which exercise every path (the random ones run locally, where they are
    # cheaper); the bucket variants are left out: the next test runs the cluster against a bucket.
    # pytest in a process that ends with pytest's exit code, not an abort of the teardown after its deltalake
    # reads (docs/known-limits.md, "Exit codes")
    pytest_then_exit = "import pytest; from laminar_assets.process_exit import run_then_exit; run_then_exit(pytest.main)"
    proc = subprocess.run([sys.executable, "-c", pytest_then_exit, "-q", "-p", "no:cacheprovider",
                           "tests/engine/test_differential.py", "-k", "fixed and not s3"], cwd=REPO,
                          capture_output=True, text=True, timeout=900,
                          env=_driver_env(cluster, LAMINAR_TEST_SPARK_MASTER=cluster.url))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-2000:]
    assert len(_apps(cluster)) == before + 1, "the differential test did not run on the cluster"


def test_the_demo_on_a_standalone_cluster_with_the_lake_only_in_a_bucket(cluster, spark, s3_server, tmp_path):
    from laminar_assets.engine.delta import open_delta
    from tests.object_store import using

    root, home = s3_server.bucket(), tmp_path / "dagster_home"
    home.mkdir()
    shutil.copy(REPO / "dagster.yaml", home / "dagster.yaml")
    before = len(_apps(cluster))
    proc = subprocess.run([sys.executable, "-m", "laminar_assets.cli", "--root", root, "demo", "--rows", "50"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900,
                          env=_driver_env(cluster, LAMINAR_SPARK_MASTER=cluster.url, DAGSTER_HOME=str(home),
                                          PYTHONPATH=str(REPO), **s3_server.options.as_env()))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    apps = _apps(cluster)[before:]
    assert [a["name"] for a in apps] == ["laminar"] and apps[0]["cores"] == 2, apps
    # no Parquet file anywhere on disk: not in the driver's folder, not in the workers' work folders
    local = [p for folder in (tmp_path, cluster.folder) for p in Path(folder).rglob("*.parquet")]
    assert not local, local[:5]
    with using(s3_server):
        stage = open_delta(f"{root}/normalized_trades").to_pyarrow_table()
        assert stage.num_rows > 0
        for flow in (s for s in SPECS if isinstance(s, FlowSpec)):
            expected = full_recompute(spark, flow, stage)
            assert_frames_match(open_delta(f"{root}/{flow.sink}").to_pandas(), expected, flow.keys)

