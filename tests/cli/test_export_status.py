"""`laminar status` shows each export's delivered version, its lag behind the source table and its last delivery,
and while deliveries fail, how many and the last error: from the lake's records, without reaching the target.
No Spark."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from laminar_assets.cli import app
from laminar_assets.engine import Connection, Exporter, ExportTargetError
from tests.engine.export.helpers import EXPORT, FLOW, Sink, exporter, flow_rows

FLOWS = ("from laminar_assets.engine import Agg, FlowSpec, PostgresExport, Tumbling\n"
         "m1 = FlowSpec(name='m1', source='raw', event_time='ts', window=Tumbling('1m'), keys=('sym',),\n"
         "              aggregates=(Agg.count(name='n'), Agg.sum('px', name='total')))\n"
         "m1_pg = PostgresExport(name='m1_pg', source='m1', connection='pg', table='m1', batch_rows=3)\n")


def status(tmp_path, root: str, *args):
    flows = tmp_path / "flows"
    if not flows.exists():
        flows.mkdir()
        (flows / "m1.py").write_text(FLOWS)
    result = CliRunner().invoke(app, ["--root", root, "--flows", str(flows), "status", *args],
                                env={"DAGSTER_HOME": str(tmp_path / "dh"), "COLUMNS": "400"})
    assert result.exit_code == 0, result.output
    return result.output


def test_status_shows_each_exports_delivered_version_lag_and_failures(tmp_path, pg_server, pg_database):
    root = str(tmp_path / "lake")
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0)]))
    [row] = [r for r in json.loads(status(tmp_path, root, "--json")) if r["kind"] == "export"]
    assert (row["export"], row["delivered_version"], row["delivered_at"]) == ("m1_pg", None, None)  # never delivered
    exporter(root, pg_server, pg_database).deliver(EXPORT, FLOW)
    sink.replace_hour(1, flow_rows([(1, 0, "a", 1, 1.0)]))
    [row] = [r for r in json.loads(status(tmp_path, root, "--json")) if r["kind"] == "export"]
    assert (row["delivered_version"], row["source_version"], row["lag_versions"]) == (0, 1, 1)
    assert row["lag_seconds"] >= 0 and row["mode"] == "FULL" and row["target_kind"] == "postgres"
    assert row["failed"] is None and pg_database in row["target"]
    down = Exporter(root, connections={"pg": Connection("pg", "postgresql://etl:hush@127.0.0.1:9/db")})
    with pytest.raises(ExportTargetError):
        down.deliver(EXPORT, FLOW)
    text = status(tmp_path, root)
    assert "exports" in text and "m1_pg" in text and "the last delivery" in text and "hush" not in text, text
    [row] = [r for r in json.loads(status(tmp_path, root, "--json")) if r["kind"] == "export"]
    assert row["failed"]["count"] == 1 and "cannot reach Postgres at host=127.0.0.1" in row["failed"]["error"]
    assert row["delivered_version"] == 0  # the last success is kept


def test_status_shows_a_redis_exports_delivered_version_and_target_without_its_password(tmp_path, redis_server,
                                                                                       redis_url):
    from tests.engine.export.redis_helpers import REDIS_EXPORT

    root = str(tmp_path / "lake")
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "m1.py").write_text(FLOWS.replace("PostgresExport", "RedisExport").replace(
        "m1_pg = RedisExport(name='m1_pg', source='m1', connection='pg', table='m1', batch_rows=3)",
        "m1_cache = RedisExport(name='m1_cache', source='m1', connection='cache', key_prefix='pos', batch_rows=2)"))
    with redis_server.client() as c:
        c.acl_setuser("etl", enabled=True, passwords=["+hush-hush"], keys=["*"], commands=["+@all"])
    sink = Sink(root, "m1")
    sink.replace_hour(0, flow_rows([(0, 0, "a", 1, 1.0), (0, 1, "b", 1, 1.0)]))
    url = redis_server.url(user="etl", password="hush-hush")
    Exporter(root, connections={"cache": Connection("cache", url)}).deliver(REDIS_EXPORT, FLOW)
    sink.replace_hour(1, flow_rows([(1, 0, "a", 1, 1.0)]))
    [row] = [r for r in json.loads(status(tmp_path, root, "--json")) if r["kind"] == "export"]
    assert (row["export"], row["target_kind"], row["delivered_version"], row["lag_versions"]) == ("m1_cache", "redis", 0, 1)
    assert row["target"].startswith("Redis keys pos:* on host=127.0.0.1") and "user=etl" in row["target"]
    assert "hush" not in json.dumps(row) and "hush" not in status(tmp_path, root)


HOOK_FLOWS = ("from laminar_assets.engine import StageSpec, WebhookExport\n"
              "large_trades = StageSpec(name='large_trades', source='trades', event_time='ts')\n"
              "large_trades_hook = WebhookExport(name='large_trades_hook', source='large_trades', connection='alerts')\n")


def test_status_shows_a_webhooks_dead_letters_and_rows_sent(tmp_path, webhook_receiver):
    from tests.engine.export.webhook_helpers import HOOK, STAGE, Trades
    from tests.engine.export.webhook_helpers import exporter as hook_exporter

    root = str(tmp_path / "lake")
    flows = tmp_path / "flows"
    flows.mkdir()
    (flows / "hooks.py").write_text(HOOK_FLOWS)
    trades = Trades(root)
    trades.append((0, "a", 1.0))
    hook_exporter(root, webhook_receiver.url).deliver(HOOK, STAGE)
    trades.append((1, "b", 2.0), (2, "c", 3.0))
    webhook_receiver.rule = lambda body: 400 if body["row"]["sym"] == "b" else None  # refused: a dead letter
    hook_exporter(root, webhook_receiver.url).deliver(HOOK, STAGE)
    [row] = [r for r in json.loads(status(tmp_path, root, "--json")) if r["kind"] == "export"]
    assert (row["export"], row["delivered_version"], row["dead_letters"], row["rows_sent"], row["pending_rows"]) == \
        ("large_trades_hook", 1, 1, 1, 0)
    assert row["dead_letter_table"].endswith("_laminar/dead_letters/large_trades_hook")
    text = status(tmp_path, root)
    assert "dead letters" in text and "│ 1            │" in text, text
