"""Exports as Dagster assets: each a partitioned asset downstream of its flow, in the pipeline sensor's run after
the flow (or alone when it is behind with nothing dirty to carry it), materialized through Dagster into a real
Postgres with the delivery's metadata; a backfill replaces its partitions' rows; an undefined connection fails
the asset in one line."""

from __future__ import annotations

import dagster as dg
import psycopg
import pytest
from deltalake import write_deltalake

from laminar_assets.checkpoints import CheckpointStore, Watermark
from laminar_assets.definitions import specs_with_contracts
from laminar_assets.engine import Agg, FlowSpec, PostgresExport, StageSpec, Tumbling, WebhookExport
from laminar_assets.engine.export import load_record
from laminar_assets.flows import load_specs
from laminar_assets.orchestration.assets import COMPONENT_TAG, build_asset
from laminar_assets.orchestration.builder import build_definitions
from laminar_assets.orchestration.checks import build_equivalence_check
from laminar_assets.orchestration.exports import build_export_asset
from laminar_assets.orchestration.internals.in_process import execute_job_here
from laminar_assets.orchestration.internals.thread_executor import thread_executor
from laminar_assets.orchestration.sensors import build_pipeline_sensor
from laminar_assets.pipeline.graph import components
from laminar_assets.pipeline.settings import LaminarSettings
from laminar_assets.resources import LaminarResource, SparkResource
from tests.engine.export.helpers import flow_rows, target_rows
from tests.orchestration.pipeline import BASE, create_sources

SPECS, _ = specs_with_contracts(load_specs())
BY_NAME = {s.name: s for s in SPECS}
SETTINGS = LaminarSettings(retry_delay_seconds=0, retries=0, sensor_watch_seconds=0)
[PART] = components(SPECS)
VWAP_PG = PostgresExport(name="vwap_1m_pg", source="vwap_1m", connection="analytics", table="vwap_1m")
P9 = "2024-01-02-09:00"


def tick(laminar, instance, cursor):
    sensor = build_pipeline_sensor(PART, SETTINGS, blocking=set(), contracts=set(), exports=[VWAP_PG])
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources={"laminar": laminar}) as ctx:
        return sensor(ctx)


def test_the_definitions_hold_each_export_downstream_of_its_flow_with_its_partitions():
    defs = build_definitions(SPECS, SETTINGS, exports=[VWAP_PG], contracts_dir=None)
    graph = defs.resolve_asset_graph()
    node = graph.get(dg.AssetKey("vwap_1m_pg"))
    assert node.parent_keys == {dg.AssetKey("vwap_1m")}
    assert node.partitions_def == graph.get(dg.AssetKey("vwap_1m")).partitions_def
    assert node.group_name == "exports" and node.kinds == {"postgres"}
    sensor = next(s for s in defs.sensors if s.name == "raw_trades_pipeline")
    assert dg.AssetKey("vwap_1m_pg") in sensor.targets[0].resolvable_to_job.selection.resolve(graph)
    defs.resolve_all_job_defs()  # the sensor's job resolves: its assets share one partitions definition


def test_an_export_step_goes_first_among_ready_steps_and_waits_only_for_its_flows_blocking_checks():
    """In the sensor's run (its assets and checks): the export's step depends on its flow's step and on the flow's
    blocking checks (Dagster's: a failed one holds the delivery back), not on the others, and carries the priority
    by which the executor starts it before the ready checks and flows."""
    from dagster._core.execution.api import create_execution_plan

    hook = WebhookExport(name="normalized_hook", source="normalized_trades", connection="alerts")
    defs = build_definitions(SPECS, SETTINGS, exports=[VWAP_PG, hook])  # the repository's contracts
    job = defs.resolve_implicit_global_asset_job_def()
    wanted = {dg.AssetKey(n) for n in ("normalized_trades", "vwap_1m", "vwap_1m_pg", "normalized_hook")}
    checks = {c for c in job.asset_layer.asset_graph.asset_check_keys if c.asset_key in wanted}
    plan = create_execution_plan(job.get_subset(asset_selection=wanted, asset_check_selection=checks))
    deps = plan.get_executable_step_deps()
    assert deps["vwap_1m_pg"] == {"vwap_1m"}  # vwap_1m's contract does not block: its checks run beside the delivery
    assert deps["normalized_hook"] == {"normalized_trades", "normalized_trades_contract"}  # a blocking contract
    priority = {k: int(plan.get_step_by_key(k).tags.get("dagster/priority", 0)) for k in deps}
    assert priority["vwap_1m_pg"] > max(p for k, p in priority.items() if k not in ("vwap_1m_pg", "normalized_hook"))


def test_the_sensors_run_delivers_an_export_after_its_flow_and_alone_when_it_is_behind(lake, laminar, instance):
    create_sources(lake, BASE)
    first = tick(laminar, instance, None)
    [request] = first.run_requests
    assert dg.AssetKey("vwap_1m_pg") in request.asset_selection and dg.AssetKey("vwap_1m") in request.asset_selection
    # the flow materialized alone (its sink and a watermark exist), the export never delivered: it runs alone, with
    # the flow's latest partition, once per version of the flow's table (the run key names it)
    write_deltalake(lake.path("vwap_1m"), flow_rows([(9, 1, "a", 1, 1.0)]), configuration={"delta.enableChangeDataFeed": "true"})
    vwap = BY_NAME["vwap_1m"]
    CheckpointStore(lake.root).save(Watermark("vwap_1m", P9, vwap.spec_hash, {"normalized_trades": 0}, 1))
    [alone] = tick(laminar, instance, first.cursor).run_requests
    assert alone.asset_selection == [dg.AssetKey("vwap_1m_pg")] and alone.partition_key == P9
    assert "+vwap_1m_pg@0" in alone.run_key and alone.tags[COMPONENT_TAG] == "raw_trades"
    assert tick(laminar, instance, first.cursor).run_requests[0].run_key == alone.run_key
    # once delivered (the lake's record says so), or while its deliveries fail, it is not asked for again
    from laminar_assets.engine.export.records import ExportRecord, save

    save(lake.root, ExportRecord("vwap_1m_pg", "postgres", "vwap_1m", "t", delivered_version=0))
    assert isinstance(tick(laminar, instance, first.cursor), dg.SkipReason)
    save(lake.root, ExportRecord("vwap_1m_pg", "postgres", "vwap_1m", "t", failed={"count": 1, "since": "x", "error": "e"}))
    assert isinstance(tick(laminar, instance, first.cursor), dg.SkipReason)


VOL = FlowSpec(name="vol", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
               aggregates=(Agg.count(name="n"), Agg.sum("px", name="px_sum")))
VOL_PG = PostgresExport(name="vol_pg", source="vol", connection="analytics", table="vol")
VOL_COLUMNS = "window_start, window_end, sym, n, px_sum"
P0 = "2024-01-01-00:00"


@pytest.mark.spark
def test_a_materialization_delivers_the_flow_to_postgres_with_its_metadata(spark, lake, instance, pg_server, pg_database):
    url = pg_server.url(pg_database)
    laminar = LaminarResource(root=lake.root, connections={"analytics": url},
                              spark=SparkResource(master="local[2]", shuffle_partitions=2, stop_at_end=False))
    flow, export = build_asset(VOL, SETTINGS), build_export_asset(VOL_PG, VOL, SETTINGS)
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 00:12:00", "b", 2.0, 1),
                           ("2024-01-01 00:13:00", "a", 3.0, 1)])

    def materialize(assets, **kw):
        return dg.materialize(assets, partition_key=P0, resources={"laminar": laminar}, instance=instance, **kw)

    def sink():  # the sink's rows, in the target's column order
        return sorted(tuple(r[c] for c in VOL_COLUMNS.split(", ")) for r in lake.table("vol").to_pyarrow_table().to_pylist())

    result = materialize([flow, export])
    assert result.success
    [mat] = result.asset_materializations_for_node("vol_pg")
    md = mat.metadata
    assert (md["mode"].value, md["reason"].value) == ("FULL", "NO_DELIVERED_VERSION")
    assert md["delivered_version"].value == lake.table("vol").version() and md["lag_versions"].value == 0
    for key in ("rows_upserted", "rows_deleted", "lag_seconds", "commit_age_seconds", "seconds_total"):
        assert isinstance(md[key], (dg.IntMetadataValue, dg.FloatMetadataValue)), key
    assert pg_database in md["target"].value
    assert target_rows(pg_server, pg_database, "vol", VOL_COLUMNS) == sink()
    # a late row, a correction and a delete, merged by the flow's commit; the sensor's run (tagged with the part,
    # with the flow's equivalence check, through the thread executor) delivers the changes only, and the export's step
    # starts right after the flow's, never waiting for the check (one Spark step at a time; the export, which does no
    # Spark work, runs in a lane of its own beside it, so the two start together in either order)
    lake.append("trades", [("2024-01-01 00:14:00", "c", 5.0, 1)])
    lake.update("trades", {"px": "20.0"}, "sym = 'b'")
    lake.delete("trades", "px = 1.0")
    one_step_at_a_time = thread_executor.configured({"max_concurrent": 1})
    job = dg.Definitions(assets=[flow, export], asset_checks=[build_equivalence_check(VOL, SETTINGS)],
                         resources={"laminar": laminar},
                         jobs=[dg.define_asset_job("sensor_run", executor_def=one_step_at_a_time)]).resolve_job_def("sensor_run")
    result = execute_job_here(job, instance=instance, partition_key=P0, tags={COMPONENT_TAG: "trades"}, run_config={})
    assert result.success
    events = [(e.event_type_value, e.step_key) for e in result.all_events]
    started = [step for kind, step in events if kind == "STEP_START"]
    assert started[0] == "vol" and sorted(started[1:]) == ["vol_equivalence", "vol_pg"], started
    assert events.index(("STEP_START", "vol_pg")) < events.index(("STEP_SUCCESS", "vol_equivalence")), events
    [evaluation] = result.get_asset_check_evaluations()  # the check still runs, after the delivery
    assert evaluation.check_name == "equivalence" and evaluation.passed
    md = result.asset_materializations_for_node("vol_pg")[0].metadata
    assert (md["mode"].value, md["reason"].value, md["partitions_replaced"].value) == ("INCREMENTAL", "NEW_VERSIONS", [])
    assert target_rows(pg_server, pg_database, "vol", VOL_COLUMNS) == sink()
    # a backfill of the export alone repairs its partition's rows in the target
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("UPDATE vol SET n = -1")
    md = materialize([export]).asset_materializations_for_node("vol_pg")[0].metadata
    assert (md["reason"].value, md["partitions_replaced"].value) == ("PARTITIONS_REPLACED", [P0])
    assert target_rows(pg_server, pg_database, "vol", VOL_COLUMNS) == sink()
    assert load_record(lake.root, "vol_pg").delivered_version == lake.table("vol").version()
    # a connection nobody defined: the asset fails in one line naming the export and how to define it
    lost = PostgresExport(name="vol_lost", source="vol", connection="nowhere", table="lost")
    result = dg.materialize([build_export_asset(lost, VOL, SETTINGS)], partition_key=P0,
                            resources={"laminar": laminar}, instance=instance, raise_on_error=False)
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    text = failure.step_failure_data.user_failure_data.description
    assert "export 'vol_lost' names connection 'nowhere', which is not defined" in text and "\n" not in text, text
    # laminar_system.exports: each export's delivered version, lag and failures, for `laminar sql`
    from laminar_assets.engine.report import run_query

    got = run_query(spark, lake.root, [VOL], "SELECT export, delivered_version, lag_versions, failed_deliveries, "
                    "last_error FROM laminar_system.exports ORDER BY export", exports=[lost, VOL_PG]).records()
    version = lake.table("vol").version()
    assert [r["export"] for r in got] == ["vol_lost", "vol_pg"]
    assert (got[1]["delivered_version"], got[1]["lag_versions"], got[1]["failed_deliveries"]) == (version, 0, 0)
    assert got[0]["delivered_version"] is None and got[0]["failed_deliveries"] == 1 and "nowhere" in got[0]["last_error"]


def test_a_create_sink_in_a_dg_projects_flows_folder_is_an_asset_of_the_component(tmp_path):
    from laminar_assets.orchestration.component import LaminarComponent

    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "trades.sql").write_text(
        "CREATE MATERIALIZED VIEW trades_1m AS SELECT symbol, TUMBLE(event_time, INTERVAL '1' MINUTE), COUNT(*) AS n\n"
        "FROM raw_trades GROUP BY symbol, TUMBLE(event_time, INTERVAL '1' MINUTE);\n"
        "CREATE SINK trades_1m_pg FROM trades_1m INTO POSTGRES WITH (connection = 'analytics');\n")
    defs = LaminarComponent(flows=str(flows), partitions_start="2024-01-01").build_defs(None)  # no lake_root: no context
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey("trades_1m_pg")).parent_keys == {dg.AssetKey("trades_1m")}


def test_a_redis_export_materialized_alone_delivers_into_a_real_redis_without_spark(tmp_path, instance, redis_url):
    from laminar_assets.engine import RedisExport
    from tests.engine.export.helpers import FLOW, Sink
    from tests.engine.export.redis_helpers import assert_equal

    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "a", 2, 2.0), (0, 1, "b", 1, 1.0)]))
    export = RedisExport(name="m1_cache", source="m1", connection="cache", key_prefix="pos")
    laminar = LaminarResource(root=root, connections={"cache": redis_url}, spark=SparkResource(stop_at_end=False))
    asset = build_export_asset(export, FLOW, SETTINGS)
    assert asset.specs_by_key[dg.AssetKey("m1_cache")].kinds == {"redis"}
    result = dg.materialize([asset], partition_key="2024-01-02-00:00", resources={"laminar": laminar},
                            instance=instance)
    md = result.asset_materializations_for_node("m1_cache")[0].metadata
    assert (md["mode"].value, md["reason"].value, md["rows_upserted"].value) == ("FULL", "NO_DELIVERED_VERSION", 2)
    assert md["target"].value.startswith("Redis keys pos:* on host=127.0.0.1")
    assert_equal(redis_url, sink)


BIG = StageSpec(name="big", source="trades", event_time="ts", filter="px > 2", columns=("ts", "sym", "px"))
BIG_HOOK = WebhookExport(name="big_hook", source="big", connection="alerts", timeout_seconds=0.3, backoff_seconds=0.01,
                         max_backoff_seconds=0.05, max_attempts=2, max_rows_per_second=None)


@pytest.mark.spark
def test_a_webhook_export_asset_sends_new_rows_and_fails_alone_while_its_receiver_is_down(spark, lake, instance,
                                                                                          webhook_receiver):
    """Through Dagster: the stage's new rows reach a real receiver on 127.0.0.1 with the delivery's counts in the
    asset's metadata; a receiver that is down fails the export's step in one line naming the export and the webhook,
    the stage's own asset materializes and the delivered version stays; the export materialized alone later sends
    what is pending, and nothing it delivered before."""
    laminar = LaminarResource(root=lake.root, connections={"alerts": webhook_receiver.url},
                              spark=SparkResource(master="local[2]", shuffle_partitions=2, stop_at_end=False))
    stage, hook = build_asset(BIG, SETTINGS), build_export_asset(BIG_HOOK, BIG, SETTINGS)

    def materialize(assets, **kw):
        return dg.materialize(assets, partition_key=P0, resources={"laminar": laminar}, instance=instance,
                              tags={COMPONENT_TAG: "trades"}, **kw)

    def sent():
        return sorted((e["row"]["sym"], e["row"]["px"]) for e in webhook_receiver.events())

    lake.create("trades", [("2024-01-01 00:01:00", "a", 5.0, 1), ("2024-01-01 00:02:00", "b", 1.0, 1)])
    md = materialize([stage, hook]).asset_materializations_for_node("big_hook")[0].metadata
    assert (md["reason"].value, md["rows_skipped"].value, sent()) == ("NO_DELIVERED_VERSION", 1, [])  # initial="skip"
    delivered = md["delivered_version"].value
    webhook_receiver.down()
    lake.append("trades", [("2024-01-01 00:03:00", "c", 7.0, 1), ("2024-01-01 00:04:00", "d", 0.5, 1)])
    result = materialize([stage, hook], raise_on_error=False)
    assert not result.success and result.asset_materializations_for_node("big")  # the stage's own run is unaffected
    [failure] = [e for e in result.all_events if e.event_type_value == "STEP_FAILURE"]
    text = failure.step_failure_data.user_failure_data.description
    assert text.startswith(f"export 'big_hook': cannot reach the webhook at http://127.0.0.1:{webhook_receiver.port}"), text
    assert "\n" not in text and "the next delivery sends the 1 pending row(s)" in text
    assert load_record(lake.root, "big_hook").delivered_version == delivered
    webhook_receiver.up()
    alone = dg.materialize([hook], partition_key=P0, resources={"laminar": laminar}, instance=instance)
    md = alone.asset_materializations_for_node("big_hook")[0].metadata
    assert (md["mode"].value, md["rows_sent"].value, md["dead_letters"].value, md["retries"].value) == \
        ("INCREMENTAL", 1, 0, 0)
    assert (md["delivered_version"].value, md["lag_versions"].value) == (delivered + 1, 0)
    assert sent() == [("c", 7.0)]  # the pending row; the partition's rows delivered (or skipped) before not again
    [got] = [r for r in webhook_receiver.received if r.answer == 200]
    assert got.key == got.body["idempotency_key"] and got.body["op"] == "insert" and got.body["version"] == delivered + 1
