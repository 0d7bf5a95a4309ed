"""Dagster idioms on a real instance: table metadata, owners/tags/freshness from the spec, retries of
transient failures (a retried run equals a clean one), and the run-failure alert sensor."""

from __future__ import annotations

import dataclasses
import json
import threading
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, HTTPServer
from unittest.mock import patch

import dagster as dg
import pytest

from laminar_assets.engine import Agg, Engine, EngineOptions, FlowSpec, Tumbling
from laminar_assets.errors import CommitConflictError, ConcurrentRunError, LaminarError, RunFailedError, SchemaMismatchError
from laminar_assets.flows import load_specs
from laminar_assets.orchestration.alerts import Alert, build_failure_sensor, send
from laminar_assets.orchestration.assets import build_asset
from laminar_assets.pipeline.settings import LaminarSettings
from laminar_assets.resources import LaminarResource, SparkResource
from tests.orchestration.pipeline import BASE, create_sources
from tests.reference import assert_frames_match, full_recompute

SPECS = {s.name: s for s in load_specs()}
SETTINGS = LaminarSettings(retries=2, retry_delay_seconds=0)
P9 = "2024-01-02-09:00"
FLOW = FlowSpec(name="vwap", source="normalized_trades", event_time="event_time", window=Tumbling("1m"),
                keys=("symbol",), aggregates=(Agg.sum("quantity", name="volume"), Agg.count(name="trades")),
                owners=("data-eng@example.com", "team:markets"), tags={"tier": "gold"}, target_lag="15m")


def test_owners_tags_and_freshness_come_from_the_spec():
    asset = build_asset(FLOW, SETTINGS)
    key = dg.AssetKey("vwap")
    spec = asset.specs_by_key[key]
    assert list(spec.owners) == ["data-eng@example.com", "team:markets"]
    assert spec.tags.get("tier") == "gold"
    assert spec.freshness_policy is not None and spec.freshness_policy.fail_window.to_timedelta() == timedelta(minutes=15)
    assert asset.op.retry_policy.max_retries == 2
    # the project's partition start, unless the spec sets its own
    assert spec.partitions_def.start == SETTINGS.partitions_start
    own = build_asset(dataclasses.replace(FLOW, start="2026-11-01"), SETTINGS)
    assert own.specs_by_key[key].partitions_def.start.isoformat() == "2026-11-01T00:00:00+00:00"
    assert FLOW.spec_hash == FlowSpec(name="vwap", source="normalized_trades", event_time="event_time",
                                      window=Tumbling("1m"), keys=("symbol",),
                                      aggregates=FLOW.aggregates).spec_hash  # catalog facts do not refill


def _run_failed(raising) -> RunFailedError:
    """The error the engine raises for a failure inside a run: a RunFailedError from the exception `raising` raises."""
    try:
        try:
            raising()
        except Exception as cause:
            raise RunFailedError("run of 'vwap' failed") from cause
    except RunFailedError as exc:
        return exc
    raise AssertionError("nothing was raised")


def _raise(exc: BaseException):
    def raising() -> None:
        raise exc
    return raising


def test_retryable_errors_are_only_the_transient_ones():
    assert CommitConflictError("conflict").retryable and ConcurrentRunError("held").retryable
    assert not SchemaMismatchError("gone").retryable and not LaminarError("x").retryable
    assert _run_failed(_raise(ConnectionResetError("peer reset"))).retryable
    assert not _run_failed(_raise(ValueError("bad expression"))).retryable


def test_a_spark_connect_session_lost_to_a_restarted_server_is_retryable_and_the_retry_gets_a_new_session():
    """What the Connect client raises when its server restarted while it retried (measured: a server killed under
    `laminar serve`): the session closed, `[NO_ACTIVE_SESSION]` raised from None over the gRPC error."""
    from pyspark.errors.exceptions.connect import SparkConnectException

    def lost() -> None:
        try:
            raise RuntimeError("INVALID_HANDLE.SESSION_CHANGED")  # stands for the gRPC error, its context
        except RuntimeError:
            raise SparkConnectException(errorClass="NO_ACTIVE_SESSION", messageParameters={}) from None

    assert _run_failed(lost).retryable
    assert _run_failed(_raise(SparkConnectException(errorClass="NO_ACTIVE_SESSION", messageParameters={}))).retryable
    assert not _run_failed(_raise(SparkConnectException(
        "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column with name `x` cannot be resolved. Did you mean one of the "
        "following? [`y`]."))).retryable

    class Session:  # the one attribute get_session asks a Connect session
        is_stopped = False

    spark = SparkResource(remote="sc://127.0.0.1:1")
    first = Session()
    spark._session = first
    assert spark.get_session() is first
    first.is_stopped = True
    built = []
    with patch("laminar_assets.resources.spark.build_session", lambda options: built.append(options) or Session()):
        renewed = spark.get_session()
    assert renewed is not first and spark.get_session() is renewed and built[0].remote == "sc://127.0.0.1:1"


class FlakyLaminar(LaminarResource):
    """A resource whose first run fails with a commit conflict right after the state commit."""

    def engine(self, **options) -> Engine:
        def hook(step: str) -> None:
            if step == "after_state_commit" and not FAILED:
                FAILED.append(step)
                raise CommitConflictError("injected: a concurrent writer committed first")

        return Engine(self.spark.get_session(), self.resolved_root(), hook=hook,
                      options=EngineOptions(lease_seconds=self.lease_seconds, **options))


FAILED: list[str] = []


@pytest.mark.spark
def test_a_retried_run_equals_a_clean_one_and_carries_table_metadata(spark, lake, laminar, instance):
    create_sources(lake, BASE)
    stage = build_asset(SPECS["normalized_trades"], SETTINGS)
    resources = {"laminar": laminar}
    assert dg.materialize([stage], partition_key=P9, resources=resources, instance=instance).success
    flaky = FlakyLaminar(root=laminar.root, spark=laminar.spark)
    FAILED.clear()
    result = dg.materialize([build_asset(FLOW, SETTINGS)], partition_key=P9, resources={"laminar": flaky},
                            instance=instance)
    assert result.success and FAILED == ["after_state_commit"]
    retries = [e for e in result.all_events if e.event_type_value == "STEP_UP_FOR_RETRY"]
    assert len(retries) == 1
    expected = full_recompute(spark, FLOW, lake.table("normalized_trades").to_pyarrow_table())
    assert_frames_match(lake.read("vwap"), expected, FLOW.keys)
    [mat] = result.asset_materializations_for_node("vwap")
    md = mat.metadata
    columns = [c.name for c in md["dagster/column_schema"].schema.columns]
    assert columns == ["window_start", "window_end", "symbol", "volume", "trades"]
    assert md["dagster/row_count"].value == len(expected) == md["dagster/partition_row_count"].value
    assert md["dagster/table_name"].value == "vwap" and md["dagster/uri"].value.endswith("/vwap")


class _Hook(BaseHTTPRequestHandler):
    received: list[dict] = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hook.received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.mark.spark
def test_a_failed_run_is_alerted_to_a_webhook(lake, laminar, instance):
    broken = FlowSpec(name="broken", source="missing_table", event_time="ts", window=Tumbling("1m"),
                      aggregates=(Agg.count(),))
    result = dg.materialize([build_asset(broken, SETTINGS)], partition_key=P9, resources={"laminar": laminar},
                            instance=instance, raise_on_error=False)
    assert not result.success
    server = HTTPServer(("127.0.0.1", 0), _Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        sensor = build_failure_sensor(LaminarSettings(alert=f"http://127.0.0.1:{server.server_port}/hook"))
        [entry] = instance.all_logs(result.run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        failure = entry.dagster_event
        context = dg.build_run_status_sensor_context(
            sensor_name=sensor.name, dagster_instance=instance, dagster_run=result.dagster_run,
            dagster_event=failure).for_run_failure()
        _Hook.received.clear()
        sensor(context)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    [alert] = _Hook.received
    assert alert["run_id"] == result.run_id and alert["assets"] == ["broken"]
    assert "source table 'missing_table' does not exist" in alert["message"] and alert["text"].startswith("Laminar run")


def test_an_unreachable_or_malformed_alert_target_fails_clearly():
    alert = Alert("r1", "job", "boom", ("a",), None, None)
    with pytest.raises(LaminarError, match="could not deliver the alert for run r1"):
        send("http://127.0.0.1:9/none", alert)
    with pytest.raises(LaminarError, match="is not 'log', a URL or 'package.module:function'"):
        send("slack", alert)
    got = []
    import tests.orchestration.test_idioms as me

    me.CALLED = got
    send("tests.orchestration.test_idioms:remember", alert)
    assert got == [alert]


CALLED: list = []


def remember(alert: Alert) -> None:
    CALLED.append(alert)


def test_every_asset_has_its_own_pool_and_the_instance_limits_pools(tmp_path):
    import shutil
    from pathlib import Path

    from laminar_assets.definitions import build_definitions

    shutil.copy(Path(__file__).resolve().parents[2] / "dagster.yaml", tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as inst:
        config = inst.get_concurrency_config()
        assert config.pool_config.default_pool_limit == 1
        assert config.run_queue_config.max_concurrent_runs == 2
        assert inst.run_coordinator.dequeue_interval_seconds == 0.5  # requested runs start within ~0.5 s (instance.py)
        # a pipeline sensor's tick watches its sources for most of a second: other sensors tick beside it
        assert inst.get_settings("sensors") == {"use_threads": True, "num_workers": 4}
    defs = build_definitions(load_specs(), LaminarSettings())
    graph = defs.resolve_asset_graph()
    for spec in load_specs():
        node = graph.get(dg.AssetKey(spec.name))
        assert node.pools == {f"laminar_{spec.name}"}, (spec.name, node.pools)


def test_the_postgres_instance_template_differs_from_the_default_only_in_storage():
    from pathlib import Path

    import yaml

    repo = Path(__file__).resolve().parents[2]
    default = yaml.safe_load((repo / "dagster.yaml").read_text())
    postgres = yaml.safe_load((repo / "dagster.postgres.yaml").read_text())
    assert postgres.pop("storage") == {"postgres": {"postgres_url": {"env": "DAGSTER_PG_URL"}}}
    assert postgres == default
