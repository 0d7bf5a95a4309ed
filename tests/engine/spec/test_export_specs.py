"""Exports as declared: the spec kinds validate their options, the registry finds them beside flows (Python and
CREATE SINK), orders them after their source and refuses what cannot be delivered, each in one line naming the
export and its file. No server, no Spark."""

from __future__ import annotations

import pytest

from laminar_assets.engine import (
    Connection,
    PostgresExport,
    RedisExport,
    SpecError,
    SqlDefinitionError,
    WebhookExport,
    collect,
    collect_specs,
    compile_sql_definitions,
    export_key,
)
from laminar_assets.engine.export import connections

HEADER = "from laminar_assets.engine import Agg, FlowSpec, PostgresExport, RedisExport, StageSpec, Tumbling, WebhookExport\n"
STAGE = "st = StageSpec(name='st', source='raw', event_time='ts', dedup_key=('id',))\n"
KEYLESS = "rows = StageSpec(name='rows', source='raw', event_time='ts', columns=('ts', 'px'))\n"
FLOW = ("f1 = FlowSpec(name='f1', source='st', event_time='ts', window=Tumbling('1m'), keys=('sym',), "
        "aggregates=[Agg.count(name='n')])\n")


def folder_of(tmp_path, files: dict[str, str]) -> str:
    folder = tmp_path / "flows"
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text if name.endswith(".sql") else HEADER + text)
    return str(folder)


def refused(folder: str) -> str:
    with pytest.raises(SpecError) as info:
        collect(folder)
    text = str(info.value)
    assert "\n" not in text, text
    return text


def test_an_export_spec_is_frozen_keyword_only_and_fills_its_defaults():
    pg = PostgresExport(name="f1_pg", source="f1", connection="analytics")
    assert pg.table == "f1" and pg.schema_name == "public" and pg.table_name == "f1"
    assert PostgresExport(name="x", source="f1", connection="c", table="marts.vwap").schema_name == "marts"
    assert RedisExport(name="r", source="f1", connection="cache").key_prefix == "r"
    assert WebhookExport(name="w", source="f1", connection="hook").retractions == "skip"
    with pytest.raises(TypeError):
        PostgresExport("f1_pg", "f1", "analytics")  # keyword-only
    with pytest.raises(AttributeError):
        pg.table = "other"  # frozen


@pytest.mark.parametrize("make, field, found", [
    (lambda: PostgresExport(name="1x", source="f1", connection="c"), "name", "'1x'"),
    (lambda: PostgresExport(name="x", source="raw/trades", connection="c"), "source", "'raw/trades'"),
    (lambda: PostgresExport(name="x", source="f1", connection="postgresql://u:secret@h/db"), "connection", "found"),
    (lambda: PostgresExport(name="x", source="f1", connection="c", table="a.b.c"), "table", "'a.b.c'"),
    (lambda: PostgresExport(name="x", source="f1", connection="c", table="my table"), "table", "'my table'"),
    (lambda: PostgresExport(name="x", source="f1", connection="c", batch_rows=0), "batch_rows", "0"),
    (lambda: WebhookExport(name="x", source="f1", connection="c", retractions="maybe"), "retractions", "'maybe'"),
    (lambda: WebhookExport(name="x", source="f1", connection="c", max_rows_per_second=-1), "max_rows_per_second", "-1"),
    (lambda: RedisExport(name="x", source="f1", connection="c", key_prefix="a b"), "key_prefix", "'a b'"),
    (lambda: RedisExport(name="x", source="f1", connection="c", key_prefix="laminar:x"), "key_prefix", "'laminar:x'"),
], ids=["name", "source-path", "connection-url", "table-parts", "table-space", "batch", "retractions", "rate", "prefix",
        "prefix-reserved"])
def test_a_bad_option_is_a_spec_error_naming_the_export_and_the_field(make, field, found):
    with pytest.raises(SpecError) as info:
        make()
    assert info.value.field == field and found in str(info.value), str(info.value)


def test_a_connection_written_into_a_spec_is_refused_without_repeating_its_password():
    with pytest.raises(SpecError) as info:
        PostgresExport(name="x", source="f1", connection="postgresql://u:secret@h/db")
    assert info.value.field == "connection"  # (a name is expected: credentials never live in flow files)


def test_the_export_key_is_a_flows_window_and_keys_and_a_stages_dedup_key_and_event_time(tmp_path):
    catalog = collect(folder_of(tmp_path, {"a.py": STAGE + FLOW}))
    stage, flow = catalog.specs
    assert export_key(flow) == ("window_start", "sym")
    assert export_key(stage) == ("id", "ts")


def test_exports_are_found_beside_flows_in_python_and_sql_and_come_after_their_source(tmp_path):
    sql = ("-- exports\nCREATE SINK f1_pg FROM f1 INTO POSTGRES COMMENT 'minute counts'\n"
           "  WITH (connection = 'analytics', table = 'marts.f1', batch_rows = '500', owners = 'team:x');\n"
           "CREATE SINK st_hook FROM st INTO WEBHOOK WITH (connection = 'alerts', retractions = 'send', "
           "max_rows_per_second = 50);\n")
    folder = folder_of(tmp_path, {"a_exports.py": "st_cache = RedisExport(name='st_cache', source='st', connection='c')\n",
                                  "b_flows.py": STAGE + FLOW, "sinks.sql": sql})
    catalog = collect(folder)
    assert [s.name for s in catalog.specs] == ["st", "f1"]
    assert [e.name for e in catalog.exports] == ["st_cache", "st_hook", "f1_pg"]  # by source, then as found
    pg = next(e for e in catalog.exports if e.name == "f1_pg")
    assert (pg.table, pg.batch_rows, pg.description, pg.owners) == ("marts.f1", 500, "minute counts", ("team:x",))
    assert pg.origin.endswith("flows/sinks.sql:2") and pg.definition.startswith("CREATE SINK f1_pg")
    hook = next(e for e in catalog.exports if e.name == "st_hook")
    assert (hook.retractions, hook.max_rows_per_second) == ("send", 50)
    assert catalog.source_of(pg).name == "f1"
    assert [s.name for s in collect_specs(folder)] == ["st", "f1"]  # the specs alone, as before


def test_a_sql_file_mixing_views_and_sinks_keeps_the_views_line_numbers():
    text = ("CREATE SINK s FROM v INTO POSTGRES WITH (connection = 'c');\n"
            "CREATE MATERIALIZED VIEW v AS SELECT TUMBLE(ts, INTERVAL '1' MINUTE), COUNT(*) AS n\n"
            "FROM raw GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE);\n"
            "CREATE SINK s2 FROM v INTO REDIS WITH (connection = 'c');\n"
            "CREATE MATERIALIZED VIEW bad AS SELECT nosuch(ts) FROM raw GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE);\n")
    with pytest.raises(SqlDefinitionError) as info:
        compile_sql_definitions(text, origin="x.sql")
    assert "x.sql:5" in str(info.value), str(info.value)
    specs, exports = compile_sql_definitions(text.rsplit("CREATE MATERIALIZED VIEW bad", 1)[0], origin="x.sql")
    assert [s.name for s in specs] == ["v"] and specs[0].origin == "x.sql:2"
    assert [(e.name, e.kind, e.origin) for e in exports] == [("s", "postgres", "x.sql:1"), ("s2", "redis", "x.sql:4")]


@pytest.mark.parametrize("statement, expected", [
    ("CREATE SINK s FROM f1 INTO KAFKA WITH (connection = 'c')", "unknown kind of target 'KAFKA'"),
    ("CREATE SINK s FROM f1 INTO POSTGRES WITH (connection = 'c', colour = 'red')", "unknown option 'colour'"),
    ("CREATE SINK s FROM f1 INTO POSTGRES", "a sink needs WITH (connection = '<name>')"),
    ("CREATE SINK s f1 INTO POSTGRES WITH (connection = 'c')", "expected FROM"),
    ("CREATE SINK s FROM f1 INTO POSTGRES WITH (connection = 'c', connection = 'd')", "option 'connection' is given twice"),
    ("CREATE SINK s FROM f1 INTO POSTGRES WITH (connection = 'c', batch_rows = 'many')", "batch_rows"),
    ("CREATE SINK s FROM f1 INTO WEBHOOK WITH (connection = 'c') EXTRA", "unexpected text"),
], ids=["kind", "option", "connection", "from", "twice", "type", "trailing"])
def test_a_bad_create_sink_names_file_line_and_construct(statement, expected):
    with pytest.raises(SqlDefinitionError) as info:
        compile_sql_definitions("\n\n" + statement + ";\n", origin="flows/sinks.sql")
    text = str(info.value)
    assert "flows/sinks.sql:3" in text and expected in text and "\n" not in text, text


def test_an_export_of_a_raw_source_table_is_refused(tmp_path):
    text = refused(folder_of(tmp_path, {"a.py": STAGE + "x = PostgresExport(name='x', source='raw', connection='c')\n"}))
    assert "export 'x' (flows/a.py) reads 'raw', a source table, not a flow or stage" in text, text


def test_an_export_of_an_unknown_name_is_refused_listing_the_flows(tmp_path):
    text = refused(folder_of(tmp_path, {"a.py": STAGE + "x = PostgresExport(name='x', source='nope', connection='c')\n"}))
    assert "reads 'nope', which is no flow or stage of these definitions (known: st)" in text, text


def test_a_keyless_stage_goes_to_a_webhook_but_not_to_postgres_or_redis(tmp_path):
    ok = folder_of(tmp_path, {"a.py": KEYLESS + "w = WebhookExport(name='w', source='rows', connection='c')\n"})
    assert [e.name for e in collect(ok).exports] == ["w"]
    (tmp_path / "flows" / "b.py").write_text(HEADER + "p = PostgresExport(name='p', source='rows', connection='c')\n")
    text = refused(ok)
    assert "export 'p' (flows/b.py): stage 'rows' has no dedup key" in text and "WebhookExport" in text, text


def test_a_stage_without_its_key_in_its_columns_is_refused(tmp_path):
    stage = "st = StageSpec(name='st', source='raw', event_time='ts', dedup_key=('id',), columns=('ts', 'px'))\n"
    text = refused(folder_of(tmp_path, {"a.py": stage + "p = PostgresExport(name='p', source='st', connection='c')\n"}))
    assert "without its key column(s) ['id']" in text, text


@pytest.mark.parametrize("extra, expected", [
    ("x = PostgresExport(name='F1', source='f1', connection='c')\n", "differ only in case"),
    ("x = PostgresExport(name='raw', source='f1', connection='c')\n", "the name of the source table 'raw'"),
    ("x = PostgresExport(name='f1', source='f1', connection='c')\n", "duplicate export name 'f1'"),
    ("a = PostgresExport(name='a', source='f1', connection='c', table='T')\n"
     "b = PostgresExport(name='b', source='st', connection='c', table='public.t')\n", "both write postgres table"),
    ("a = PostgresExport(name='a', source='f1', connection='c', table='laminar_exports')\n", "delivered versions"),
    ("a = RedisExport(name='a', source='f1', connection='c', key_prefix='pos')\n"
     "b = RedisExport(name='b', source='st', connection='c', key_prefix='pos:eu')\n", "keys pos:eu:*, inside the keys pos:*"),
], ids=["case", "source-asset", "duplicate", "same-table", "bookkeeping", "nested-prefix"])
def test_names_and_targets_that_collide_are_refused(tmp_path, extra, expected):
    text = refused(folder_of(tmp_path, {"a.py": STAGE + FLOW + extra}))
    assert expected in text, text


def test_an_invalid_export_in_python_names_its_file_and_line(tmp_path):
    text = refused(folder_of(tmp_path, {"a.py": STAGE + "\nx = PostgresExport(name='x', source='st', connection='c', "
                                        "batch_rows=-5)\n"}))
    assert text.startswith("flows/a.py:4: PostgresExport 'x': expected a positive integer"), text


def test_a_connections_repr_and_safe_url_never_show_its_secrets(monkeypatch):
    conn = Connection("analytics", "postgresql://etl:hunter2@db.example:5432/marts?sslmode=require&password=x2",
                      {"password": "pw-hidden", "schema": "public"})
    shown = repr(conn) + str(conn) + conn.safe_url
    assert "hunter2" not in shown and "pw-hidden" not in shown and "x2" not in shown, shown
    assert "etl:***@db.example:5432/marts" in conn.safe_url and "'schema': 'public'" in repr(conn)
    monkeypatch.setenv("LAMINAR_CONNECTION_ANALYTICS_URL", "postgresql://etl@db/marts")
    monkeypatch.setenv("LAMINAR_CONNECTION_ANALYTICS_PASSWORD", "from-env")
    found = connections.from_environment("analytics")
    assert found.url == "postgresql://etl@db/marts" and found.option("password") == "from-env"
    assert "from-env" not in repr(found)


def test_an_undefined_connection_is_one_line_naming_export_connection_and_how_to_define_it(monkeypatch):
    monkeypatch.delenv("LAMINAR_CONNECTION_NOWHERE_URL", raising=False)
    with pytest.raises(Exception) as info:
        connections.resolve("f1_pg", "nowhere", {})
    text = str(info.value)
    assert "export 'f1_pg' names connection 'nowhere', which is not defined" in text and \
        "LAMINAR_CONNECTION_NOWHERE_URL" in text and "LaminarResource(connections=" in text and "\n" not in text, text
