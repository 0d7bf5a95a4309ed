"""Laminar on a Spark standalone cluster (a master and two workers from the pyspark wheel, on
127.0.0.1): the differential test's fixed histories and the demo run with `master=spark://...` and
give the results of local mode. Both run in one driver process and one application on the cluster
(each application costs a driver JVM and two executor JVMs): pytest in a subprocess runs the fixed
histories, then tests/deploy/cluster_demo.py. The differential test's lake is local: driver and
executors share this machine's file system. The demo's lake is only in a bucket (a local S3 server):
they share nothing but the bucket, the executors write their files through s3a and the driver commits
through deltalake. (The demo on a local lake is the same path as the differential test's, so it is
not run again here.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.cluster import standalone_cluster

pytestmark = [pytest.mark.spark, pytest.mark.deployment, pytest.mark.timeout(1200)]
REPO = Path(__file__).resolve().parents[2]


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


def test_the_differential_test_and_the_demo_in_a_bucket_in_one_application_on_a_cluster(cluster, s3_server,
                                                                                         tmp_path):
    """One driver process (pytest) and one application on the cluster for both scenarios (each
    application costs a driver JVM and a pair of executor JVMs): the differential test's fixed
    histories on a local lake, then the demo with its lake only in a bucket
    (tests/deploy/cluster_demo.py)."""
    before = len(_apps(cluster))
    # The fixed histories, which exercise every path (the random ones run locally, where they are
    # cheaper); the bucket variants are left out: the demo runs the cluster against a bucket.
    # pytest in a process that ends with pytest's exit code, not an abort of the teardown after its deltalake
    # reads (docs/known-limits.md, "Exit codes")
    pytest_then_exit = "import pytest; from laminar_assets.process_exit import run_then_exit; run_then_exit(pytest.main)"
    demo = json.dumps({"root": s3_server.bucket(), "env": s3_server.options.as_env()})
    driver = tmp_path / "driver"  # the driver's folders (pytest's basetemp): no Parquet file may land there
    proc = subprocess.run([sys.executable, "-c", pytest_then_exit, "-q", "-p", "no:cacheprovider",
                           "--basetemp", str(driver), "tests/engine/test_differential.py", "-k",
                           "fixed and not s3 or the_demo", "tests/deploy/cluster_demo.py"], cwd=REPO,
                          capture_output=True, text=True, timeout=1100,
                          env=_driver_env(cluster, LAMINAR_TEST_SPARK_MASTER=cluster.url, LAMINAR_TEST_CLUSTER_DEMO=demo))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    # the two fixed histories on the cluster, then the demo
    assert "3 passed" in proc.stdout and "failed" not in proc.stdout, proc.stdout[-2000:]
    apps = _apps(cluster)[before:]
    assert [a["name"] for a in apps] == ["laminar"] and apps[0]["cores"] == 2, apps
    # the demo's lake is only in the bucket: no Parquet file anywhere on disk, not in the driver's folders,
    # not in the workers' work folders (the histories' local lakes are gone with their temporary folders)
    local = [p for folder in (driver, cluster.folder) for p in Path(folder).rglob("*.parquet")]
    assert not local, local[:5]
