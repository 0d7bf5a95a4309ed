"""The deployment end to end, as a production team runs it: `laminar serve` (Spark Connect server +
dagster dev with the daemon) with Dagster's storage on a real PostgreSQL server (dagster.postgres.yaml)
and the lake only in a bucket of a local S3 server, sensors on. Two batches of commits (appends, late
rows, duplicates, updates, deletes) flow through daemon-launched runs; then every run succeeded, every
check passed, and every sink equals an independent recompute. Last, headless Chromium opens the UI
(tests/deploy/ui_browser.py; screenshots kept in .laminar/ui-test/).

One deployment covers both of what used to be two (SQLite with a local lake, Postgres with a bucket):
everything a daemon-launched run does is the same code on either storage and either lake, and each
half is tested on its own elsewhere: `laminar serve` on SQLite with the daemon in
tests/deploy/test_serve_signals.py, runs on a SQLite instance through the same executor and launcher
in tests/orchestration/ and the demo, the local lake everywhere else."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import dagster as dg
import pytest

from laminar_assets import storage
from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.definitions import specs_with_contracts
from laminar_assets.demo.generator import BatchOptions, recent_start, write_batch
from laminar_assets.engine import FlowSpec
from laminar_assets.engine.delta import is_delta_table, open_delta
from laminar_assets.flows import load_specs
from laminar_assets.orchestration.internals.run_launcher import WORKER_TAG
from laminar_assets.orchestration.sensors import ACTIVE
from laminar_assets.pipeline.graph import components
from laminar_assets.pipeline.tick import Cursor, plan_tick
from tests.deploy.processes import free_port, kill_tagged, listening, wait_for
from tests.deploy.ui_browser import (
    Browser,
    PartitionFacts,
    check_asset_checks,
    check_asset_graph,
    check_partition_page,
    check_partition_plots,
)
from tests.reference import assert_frames_match, full_recompute

pytestmark = [pytest.mark.spark, pytest.mark.deployment, pytest.mark.timeout(1500)]
REPO = Path(__file__).resolve().parents[2]
SPECS, _ = specs_with_contracts(load_specs())
[COMPONENT] = components(SPECS)


@pytest.fixture
def postgres(pg_server, pg_database) -> str:
    """A database of its own on the test process's PostgreSQL server (tests/postgres.py), as a SQLAlchemy URL
    for dagster-postgres."""
    return pg_server.url(pg_database).replace("postgresql://", "postgresql+psycopg2://", 1)


@pytest.fixture
def deployment(tmp_path, monkeypatch, s3_server, postgres):
    """`laminar serve` as a production deployment runs it: Dagster's storage on Postgres, the lake in a
    bucket of a local S3 server that the serve process and everything it starts reach through the AWS
    environment."""
    root, home, logs = s3_server.bucket(), tmp_path / "dagster_home", tmp_path / "logs"
    home.mkdir()
    logs.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("LAMINAR_SPARK_REMOTE", "LAMINAR_DAGSTER_YAML")}
    env.update(s3_server.options.as_env())
    storage.mount(root, s3_server.options)  # this process reads the lake too
    monkeypatch.setenv("DAGSTER_PG_URL", postgres)  # this process reads the instance too
    env["DAGSTER_PG_URL"] = postgres
    shutil.copy(REPO / "dagster.postgres.yaml", home / "dagster.yaml")
    env["LAMINAR_DAGSTER_YAML"] = str(REPO / "dagster.postgres.yaml")
    env.update(DAGSTER_HOME=str(home), LAMINAR_ROOT=root)
    ui, spark = free_port(), free_port()
    log = open(logs / "serve.log", "wb")
    # --no-warm-up: serve's warm-up sends three batches of the demo graph and the checks through the new
    # Connect server (87 s beside batch 1's runs on a loaded machine), more work than this test's own two
    # batches, and nothing here needs a warm JVM; the warm-up itself is tested on a Connect server in
    # tests/deploy/test_connect.py
    proc = subprocess.Popen([sys.executable, "-m", "laminar_assets.cli", "--root", root, "serve",
                             "--ui-port", str(ui), "--spark-port", str(spark), "--driver-memory", "2g",
                             "--jit", "quick", "--no-warm-up", "--log-dir", str(logs)],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        started = time.monotonic()
        wait_for(lambda: listening(ui), 300, "the Dagster UI", alive=lambda: proc.poll() is None)
        print(f"{time.monotonic() - started:7.1f} s  the Dagster UI listens")
        assert (logs / "dagster.log").exists() and (logs / "spark-connect.log").exists()  # on this machine, also for s3
        yield root, home, f"http://127.0.0.1:{ui}"
    finally:
        storage.unmount(root)
        ignored_sigint = False
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C does: serve stops dagster, then Spark
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                ignored_sigint = True
        log.close()
        leftovers = kill_tagged("DAGSTER_HOME", str(home), grace=15)
        print((logs / "serve.log").read_text()[-3000:])
        assert not ignored_sigint, "serve did not stop within 120 s of SIGINT (killed)"
        assert not leftovers, f"serve left {len(leftovers)} process(es) running 15 s after it stopped: {leftovers}"
        assert not listening(ui) and not listening(spark)


def caught_up(root: str, instance: dg.DagsterInstance) -> bool:
    """No run in progress, and no partition whose watermark is behind its sources' versions."""
    if instance.get_run_ids(dg.RunsFilter(statuses=ACTIVE), limit=1):
        return False
    plan = plan_tick(COMPONENT, root, CheckpointStore(root), Cursor(), lambda *_: set(), set())
    return plan.empty


def test_sensors_keep_every_flow_fresh_through_daemon_launched_runs(deployment, spark):
    started = time.monotonic()

    def mark(what: str) -> None:  # where the test's time goes (-s shows it)
        print(f"{time.monotonic() - started:7.1f} s  {what}")

    root, home, ui = deployment
    instance = dg.DagsterInstance.from_config(str(home))
    assert type(instance.run_storage).__name__ == "PostgresRunStorage"
    # recent data, as `laminar demo` writes: the UI plots only the latest partitions
    write_batch(root, BatchOptions(rows=200, seed=3, start=recent_start()), batch=0)
    wait_for(lambda: caught_up(root, instance) and is_delta_table(storage.join(root, "vwap_1m")), 600,
             "batch 1 to reach every sink", every=3)
    mark("batch 1 in every sink")
    first_runs = len(instance.get_run_ids())
    write_batch(root, BatchOptions(rows=60, seed=3, late_share=0.2, update_share=0.05, delete_share=0.05),
                batch=1)
    wait_for(lambda: len(instance.get_run_ids()) > first_runs and caught_up(root, instance), 600,
             "batch 2 to reach every sink", every=3)
    mark("batch 2 in every sink")

    runs = instance.get_runs()
    assert runs and all(r.status is dg.DagsterRunStatus.SUCCESS for r in runs), \
        [(r.run_id, r.status) for r in runs]
    # one run per tick for the whole graph, never one per (flow, partition)
    assert all(set(r.asset_selection or ()) >= {dg.AssetKey("normalized_trades")} or
               r.tags.get("laminar/component") for r in runs)
    assert len(runs) <= 6, f"{len(runs)} runs for two batches"
    # the run workers ran their steps with Laminar's thread executor, independent steps side by side
    assert all(any("Executing steps in up to" in (e.message or "") for e in instance.all_logs(r.run_id))
               for r in runs)
    # the daemon's first run starts the warm workers (and goes through the code server); the newest
    # run, a batch later, was handed to one of them (dagster.yaml's run_launcher)
    assert WORKER_TAG not in runs[-1].tags and WORKER_TAG in runs[0].tags, [r.tags for r in runs]
    checks = [c for c in instance.event_log_storage.get_asset_check_partition_info(
        [dg.AssetCheckKey(dg.AssetKey(s.name), n) for s in SPECS for n in ("contract", "equivalence")],
        partition_keys=None)]
    assert checks and all(c.latest_execution_status.value == "SUCCEEDED" for c in checks), \
        [(c.check_key.to_user_string(), c.partition_key, c.latest_execution_status) for c in checks
         if c.latest_execution_status.value != "SUCCEEDED"]
    stage = open_delta(storage.join(root, "normalized_trades")).to_pyarrow_table()
    for spec in SPECS:
        if isinstance(spec, FlowSpec):
            expected = full_recompute(spark, spec, stage)
            assert_frames_match(open_delta(storage.join(root, spec.sink)).to_pandas(), expected, spec.keys)
    mark("runs, checks and sinks checked")

    # the same deployment in a real browser (headless Chromium): graph, partition page, checks, plots
    browser = Browser(ui, REPO / ".laminar" / "ui-test")
    try:
        check_asset_graph(browser, ["raw_trades", "symbols", *(s.name for s in SPECS)])
        for spec in SPECS:
            check_asset_checks(browser, spec.name, ["contract"] + (["equivalence"] if isinstance(spec, FlowSpec) else []))
        for name in ("normalized_trades", "vwap_1m"):
            record = instance.fetch_materializations(dg.AssetKey(name), limit=1).records[0]
            md = record.asset_materialization.metadata
            check_partition_page(browser, PartitionFacts(name, record.partition_key, md["mode"].value,
                                                         md["reason"].value, md["versions_to"].value))
        # the run's numbers and the asset's rolling hit and fallback rates, plotted
        check_partition_plots(browser, "vwap_1m", "rows_read", "refilled_share", "recent_hit_rate",
                              "recent_refill_share")
    finally:
        browser.close()
    mark("the UI checked in Chromium")
