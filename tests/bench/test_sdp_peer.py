"""The Spark Declarative Pipelines peer (bench/sdp_peer.py) without running `spark-pipelines` (two JVMs,
30+ s a run: the benchmark runs it, `python -m bench.run --only sdp`): its SQL gives the full recompute's
answer, its project is one the CLI accepts, the event log is read right, the report shows it, and a
separately measured result merges only into a report of the same workload."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import render, report, sdp_alone, sdp_command, sdp_project
from bench.specs import bench_specs


def _select(sql: str) -> str:
    """The query of a `CREATE MATERIALIZED VIEW name AS <query>;` statement."""
    return sql.split(" AS\n", 1)[1].rstrip().rstrip(";")


@pytest.mark.spark
def test_the_views_sql_equals_the_full_recompute(spark, tmp_path):
    import pyarrow.parquet as pq

    from bench.equality import compare
    from bench.variants import reference_query, sink_keys
    from bench.workload import START, trades, uniform_times

    rng = np.random.default_rng(7)
    folder = tmp_path / "source"
    folder.mkdir()
    for i in range(2):  # two files, as the base and a delta
        times = uniform_times(rng, 3_000, START, START.replace(hour=2))
        pq.write_table(trades(rng, 1 + i * 3_000, times), folder / f"part-{i}.parquet")
    for spec in bench_specs(str(tmp_path / "trades")):
        got = spark.sql(_select(sdp_project.flow_sql(spec, f"file://{folder}")))
        expected = reference_query(spark.read.parquet(f"file://{folder}"), spec)
        result = compare(expected, got, sink_keys(spec))
        assert result["equal"] and result["rows_expected"] > 0, (spec.name, result)


def test_the_project_is_one_the_cli_accepts(tmp_path):
    from pyspark.pipelines.cli import load_pipeline_spec

    root = tmp_path / "sdp"
    sdp_project.write_project(str(root), bench_specs("/lake/trades"), str(root / "source"), driver_memory="2g",
                           shuffle_partitions=4)
    spec = load_pipeline_spec(root / "spark-pipeline.yml")
    assert spec.configuration == {"spark.sql.shuffle.partitions": "4"}  # static settings go to spark-defaults
    assert [p.name for p in root.joinpath("transformations").iterdir()] == ["flows.sql"]
    sql = (root / "transformations" / "flows.sql").read_text()
    assert sql.count("CREATE MATERIALIZED VIEW") == 2 and f"parquet.`file://{root}/source`" in sql
    defaults = dict(line.split(" ", 1) for line in (root / "conf" / "spark-defaults.conf").read_text().splitlines())
    assert defaults["spark.sql.catalogImplementation"] == "hive" and defaults["spark.eventLog.enabled"] == "true"
    assert defaults["spark.driver.memory"] == "2g"


def _event_log(path: Path) -> None:
    run, graph = "run-op", "graph-op"
    ev = [
        {"Event": "SparkListenerApplicationStart", "Timestamp": 1_000},
        {"Event": "org.apache.spark.sql.connect.service.SparkListenerConnectOperationStarted", "operationId": graph,
         "eventTime": "5000", "statementText": "pipeline_command {\n  create_dataflow_graph {\n"},
        {"Event": "org.apache.spark.sql.connect.service.SparkListenerConnectOperationFinished", "operationId": graph,
         "eventTime": "6000"},
        {"Event": "org.apache.spark.sql.connect.service.SparkListenerConnectOperationStarted", "operationId": run,
         "eventTime": "8000", "statementText": "pipeline_command {\n  start_run {\n"},
        {"Event": "SparkListenerJobStart", "Job ID": 0, "Submission Time": 9_000, "Stage IDs": [0],
         "Properties": {"spark.job.tags": f"SparkConnect_OperationTag_User__Session_s_Operation_{run}"}},
        {"Event": "SparkListenerJobStart", "Job ID": 1, "Submission Time": 10_000, "Stage IDs": [1, 2],
         "Properties": {"spark.job.tags": f"x_Operation_{run},y"}},
        {"Event": "SparkListenerTaskEnd", "Stage ID": 0, "Task Metrics": {
            "Executor Run Time": 1500, "Input Metrics": {"Records Read": 700, "Bytes Read": 10},
            "Output Metrics": {"Records Written": 0, "Bytes Written": 0}}},
        {"Event": "SparkListenerTaskEnd", "Stage ID": 2, "Task Metrics": {
            "Executor Run Time": 500, "Input Metrics": {"Records Read": 0, "Bytes Read": 0},
            "Output Metrics": {"Records Written": 30, "Bytes Written": 99}}},
        {"Event": "SparkListenerJobEnd", "Job ID": 0, "Completion Time": 12_000},
        {"Event": "SparkListenerJobEnd", "Job ID": 1, "Completion Time": 13_000},
        {"Event": "org.apache.spark.sql.connect.service.SparkListenerConnectOperationFinished", "operationId": run,
         "eventTime": "14000"},
        {"Event": "SparkListenerApplicationEnd", "Timestamp": 14_500},
    ]
    path.write_text("\n".join(json.dumps(e) for e in ev) + '\n{"Event": "torn')


def test_the_event_log_gives_the_refresh_time_its_jobs_and_rows(tmp_path):
    _event_log(tmp_path / "local-1")
    out = sdp_command.parse_event_log(str(tmp_path / "local-1"))
    assert out["refresh_s"] == 6.0 and out["app_s"] == 13.5
    assert out["phases_s"] == {"session": 4.0, "graph": 3.0, "refresh": 6.0, "after": 0.5}
    assert out["spark_jobs"] == 2 and out["spark_jobs_s"] == 4.0  # overlapping jobs counted once
    assert (out["rows_read"], out["rows_written"], out["bytes_written"], out["task_s"]) == (700, 30, 99, 2.0)


def _with_sdp(size: dict, t_sdp: float, *, equal: bool = True) -> dict:
    flows = {"bench_vwap_1m": {"equal": equal}, "bench_ohlc_5m": {"equal": True}}
    sdp = {"wall_s": t_sdp, "refresh_s": t_sdp / 4, "phases_s": {"launch_and_exit": 5.0, "refresh": t_sdp / 4},
           "spark_jobs": 8, "spark_jobs_s": 2.0, "task_s": 3.0, "rows_read": 20_200_000, "source_rows": 10_100_000,
           "rows_written": 68_760, "table_rows": {"bench_vwap_1m": 57_300, "bench_ohlc_5m": 11_460},
           "files_kept": {"bench_vwap_1m": 0, "bench_ohlc_5m": 0}, "recomputed_whole_table": True, "round": 0}
    return {**size, "t_sdp_s": t_sdp, "t_sdp_refresh_s": t_sdp / 4, "sdp": sdp,
            "rounds": [{"equality_sdp": {"sdp": flows}}]}


def test_the_report_shows_the_peer_beside_streaming_as_a_ratio_to_laminar_batched(tmp_path):
    from bench.render import markdown
    from tests.bench.test_bench_report import _fake, _size

    r = report.summarize(_fake(by_size=[_size(1_000_000, 10.0, 20.0), _with_sdp(_size(10_000_000, 12.0, 150.0), 48.0)]))
    assert r["t_sdp_s"] == 48.0 and r["t_sdp_refresh_s"] == 12.0
    assert r["ratio_sdp_vs_inc_batched"] == pytest.approx(12.0 / 3.0)  # batched pass: 12 / 4 s in the fake
    assert r["sdp"]["recomputed_whole_table"] and r["sdp"]["results_equal"]
    render.write_all(r, str(tmp_path))
    md = (tmp_path / "latest.md").read_text()
    assert "| Spark Declarative Pipelines: whole `spark-pipelines run` command | 48.00 |" in md
    assert "**Whole table recomputed: yes**" in md and "## Spark Declarative Pipelines" in md
    plain = report.summarize(_fake())
    assert plain["sdp"] is None and "Spark Declarative" not in markdown(plain)


def test_a_crashed_peer_fails_the_run_but_is_not_a_wrong_answer():
    from tests.bench.test_bench_report import _fake, _size

    r = report.summarize(_fake(by_size=[{**_size(10_000_000, 12.0, 150.0), "sdp_errors": ["round 1: boom"]}]))
    assert r["errors"] == ["sdp B=10,000,000: round 1: boom"] and r["results_equal"] is True
    report.summarize(r)  # summarizing again (as --only sdp does) adds no duplicate
    assert len(r["errors"]) == 1


def test_a_separate_measurement_merges_only_into_a_report_of_the_same_workload():
    from tests.bench.test_bench_report import _fake, _size

    settings = {"base_hours": 96, "delta_rows": 100_000, "rounds": 3, "seed": 1}
    when = {"started_at": "now", "load_avg_1m": [0.1, 0.2], "code": {}, "settings": settings}
    measured = {**_with_sdp({"base_rows": 10_000_000}, 40.0), "sdp_equal": True, "sdp_errors": [],
                "rounds": [{"t_sdp_s": 40.0, "equality_sdp": {"sdp": {}}}]}
    other = _fake(settings={**settings, "seed": 2}, by_size=[_size(10_000_000, 12.0, 150.0)])
    assert not sdp_alone._merge(other, measured, when, {})
    same = _fake(settings=settings, by_size=[_size(10_000_000, 12.0, 150.0)])
    assert sdp_alone._merge(same, measured, when, {"load_avg_1m_by_phase": {"B=10,000,000 round 1 sdp": 1.5,
                                                                             "B=10,000,000 generate": 9.0}})
    target = same["by_size"][0]
    assert target["t_sdp_s"] == 40.0 and target["sdp_measured_separately"]["started_at"] == "now"
    assert same["memory"]["load_avg_1m_by_phase"] == {"B=10,000,000 round 1 sdp": 1.5}
    r = report.summarize(same)
    assert r["t_sdp_s"] == 40.0 and r["sdp"]["measured_separately"]["started_at"] == "now"
