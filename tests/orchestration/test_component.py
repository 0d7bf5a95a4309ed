"""`LaminarComponent` in a team's own `dg` project, as the team uses it: `dg scaffold defs` writes its
defs.yaml and an example flow, `dg list defs` lists Laminar's assets, checks and sensors beside the
team's own asset, `dg launch` materializes a partition; then `dg dev` (webserver and daemon) runs
Laminar's sensor on a new commit, and the team's asset downstream of the flow, under
`AutomationCondition.eager()`, materializes after each Laminar run that updated the flow."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta

import dagster as dg
import pandas as pd
import pytest
from deltalake import DeltaTable, write_deltalake

from tests.deploy.processes import free_port, kill_tagged, listening, wait_for
from tests.orchestration.team_project import BIN, expected_minutes, listed, make_project, trades
from tests.orchestration.team_project import dg as run_dg

pytestmark = [pytest.mark.spark, pytest.mark.deployment, pytest.mark.timeout(1200)]


def sink_matches(lake: str, raw: pd.DataFrame) -> None:
    got = DeltaTable(f"{lake}/trades_1m").to_pandas()[["window_start", "symbol", "volume", "trades"]]
    got = got.sort_values(["window_start", "symbol"]).reset_index(drop=True)
    want = expected_minutes(raw)
    pd.testing.assert_frame_equal(got.astype({"volume": "int64", "trades": "int64"}),
                                  want.astype({"volume": "int64", "trades": "int64"}), check_dtype=False)


def materializations(instance: dg.DagsterInstance, asset: str, partition: str) -> list:
    records = instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=dg.AssetKey(asset), asset_partitions=[partition]), limit=50).records
    return sorted(records, key=lambda r: r.timestamp)


def test_a_team_project_scaffolds_lists_runs_and_automates_downstream(tmp_path):
    started = time.monotonic()

    def stage(what: str) -> None:  # where the test's time goes (-s shows it)
        print(f"{time.monotonic() - started:7.1f} s  {what}")

    # new rows land in this hour, older ones two hours back: the team's asset automates the latest two hours
    # (team_project.EAGER), so a test that crosses the top of the hour still sees this hour automated, and
    # the hour of the one-off launch is never automated.
    hour = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    older = f"{hour - timedelta(hours=2):%Y-%m-%d-%H}:00"
    latest = f"{hour:%Y-%m-%d-%H}:00"
    project, lake = tmp_path / "teamproj", str(tmp_path / "lake")
    env = make_project(project, lake, hour - timedelta(days=1))
    raw = pd.concat([trades(hour - timedelta(hours=2), 60, 1, seed=1), trades(hour, 40, 61, seed=2)], ignore_index=True)
    write_deltalake(f"{lake}/raw_trades", raw)

    # scaffold: defs.yaml with the lake and the partition start, an example flow, a contracts folder
    params = f'{{"lake_root": "{lake}", "partitions_start": "{hour - timedelta(days=1):%Y-%m-%d}"}}'
    proc = run_dg(project, env, "scaffold", "defs", "laminar_assets.LaminarComponent", "trades", "--json-params", params)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = project / "src" / "teamproj" / "defs" / "trades"
    assert (folder / "flows" / "trades_1m.sql").exists() and (folder / "data_contracts").is_dir()
    text = (folder / "defs.yaml").read_text()
    assert "type: laminar_assets.LaminarComponent" in text and lake in text

    stage("scaffolded")
    proc = run_dg(project, env, "list", "components")
    assert proc.returncode == 0 and "laminar_assets.LaminarComponent" in proc.stdout, proc.stderr[-3000:]
    found = listed(project, env)
    assets = {a["asset_key"] for a in found["assets"]}
    assert {"trades_1m", "raw_trades", "busiest_symbol"} <= assets
    checks = {c["key"] for c in found["asset_checks"]}
    assert {"trades_1m:equivalence", "trades_1m:watermark_lag"} <= checks
    assert "raw_trades_pipeline" in {s["name"] for s in found["sensors"]}

    stage("listed")
    # a one-off materialization from the command line
    proc = run_dg(project, env, "launch", "--assets", "trades_1m", "--partition", older, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    sink_matches(lake, raw[raw["event_time"] < hour])

    stage("dg launch done")
    # the deployment: Laminar's sensor picks up the latest hour, Declarative Automation the team's asset
    port = free_port()
    log = open(tmp_path / "dg-dev.log", "wb")
    server = subprocess.Popen([str(BIN / "dg"), "dev", "--host", "127.0.0.1", "--port", str(port)], cwd=project,
                              env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: listening(port), 240, "dg dev's webserver", alive=lambda: server.poll() is None)
        instance = dg.DagsterInstance.from_config(env["DAGSTER_HOME"])
        stage("dg dev up")
        wait_for(lambda: materializations(instance, "trades_1m", latest), 300, "the sensor's run of trades_1m",
                 alive=lambda: server.poll() is None)
        stage("sensor run done")
        sink_matches(lake, raw)
        wait_for(lambda: materializations(instance, "busiest_symbol", latest), 300,
                 "the team's eager asset after Laminar's run", alive=lambda: server.poll() is None)

        stage("eager asset done")
        # a new commit: Laminar's run updates the flow, then the team's asset follows it
        more = trades(hour, 30, 101, seed=3)
        write_deltalake(f"{lake}/raw_trades", more, mode="append")
        raw = pd.concat([raw, more], ignore_index=True)
        wait_for(lambda: len(materializations(instance, "trades_1m", latest)) >= 2, 300,
                 "the sensor's run after the new commit", alive=lambda: server.poll() is None)
        sink_matches(lake, raw)
        stage("second sensor run done")
        laminar_done = materializations(instance, "trades_1m", latest)[-1].timestamp
        wait_for(lambda: materializations(instance, "busiest_symbol", latest)[-1].timestamp > laminar_done, 300,
                 "the team's asset after the second Laminar run", alive=lambda: server.poll() is None)
        stage("second eager run done")
        report = materializations(instance, "busiest_symbol", latest)[-1].asset_materialization.metadata
        volumes = raw[raw["event_time"] >= hour].groupby("symbol")["quantity"].sum()
        assert report["symbol"].value == volumes.idxmax() and report["volume"].value == volumes.max()
        # Laminar's own assets are not under Declarative Automation: its runs come from its sensor
        runs = instance.get_runs(dg.RunsFilter(tags={"laminar/component": "raw_trades"}))
        assert runs and all(r.status == dg.DagsterRunStatus.SUCCESS for r in runs)
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)
            try:
                server.wait(60)
            except subprocess.TimeoutExpired:
                server.kill()
        log.close()
        leftovers = kill_tagged("DAGSTER_HOME", env["DAGSTER_HOME"], grace=15)
        print((tmp_path / "dg-dev.log").read_text()[-4000:])
    assert not leftovers, f"dg dev left {len(leftovers)} process(es) running: {leftovers}"
    assert not listening(port)
