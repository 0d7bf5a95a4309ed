"""The catalog: every table a run writes is an external Delta table of the session's Hive metastore (a real
embedded Derby metastore: the test session's, tests/conftest.py), sources are found by their catalog name, and
`laminar sql` reads `<schema>.<table>` through the metastore. Each test uses a schema of its own."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import time

import pandas as pd
import pytest

from laminar_assets.engine import (
    Agg,
    CatalogOptions,
    DimensionJoin,
    Engine,
    FlowSpec,
    LaminarError,
    StageSpec,
    Tumbling,
    WebhookExport,
)
from laminar_assets.engine.catalog.hive import HiveCatalog
from laminar_assets.engine.delta import open_delta
from laminar_assets.engine.export import dead_letters
from laminar_assets.engine.report import run_query
from laminar_assets.engine.spark.metastore import check_metastore
from laminar_assets.engine.spark.session import SparkOptions, jvm_conf
from laminar_assets.errors import CatalogNameError
from laminar_assets.pipeline.tick import table_versions

pytestmark = pytest.mark.spark

REPO = pathlib.Path(__file__).resolve().parents[3]

PART = "2024-01-01-00:00"
ROWS = [("2024-01-01 00:01:00", "a", 10.0, 1), ("2024-01-01 00:12:00", "a", 12.0, 2),
        ("2024-01-01 00:31:00", "b", 7.0, 3)]


def sums(**kw):
    return FlowSpec(**{**dict(name="sums", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                              aggregates=(Agg.count(), Agg.sum("qty")), description="qty per symbol and 10 minutes",
                              owners=("team:markets",), tags={"tier": "gold"}), **kw})


def entries(spark, schema: str) -> dict[str, str]:
    """name -> location, as the metastore records them."""
    out = {}
    for row in spark.sql(f"SHOW TABLE EXTENDED IN {schema} LIKE '*'").collect():
        info = dict(line.split(": ", 1) for line in row["information"].splitlines() if ": " in line)
        out[row["tableName"]] = os.path.normpath("/" + info["Location"].removeprefix("file:").lstrip("/"))
    return out


def properties(spark, name: str) -> dict[str, str]:
    return {r["key"]: r["value"] for r in spark.sql(f"SHOW TBLPROPERTIES {name}").collect()}


@pytest.fixture
def catalog_engine(spark, lake, request):
    schema = f"t_{request.node.name[:40].lower()}".replace("[", "_").replace("]", "_").replace("-", "_")
    return Engine(spark, lake.root, catalog=CatalogOptions(schema=schema))


def test_a_run_registers_its_tables_at_their_locations_with_their_properties(spark, lake, catalog_engine):
    engine, schema = catalog_engine, catalog_engine.catalog.schema
    lake.create("trades", ROWS)
    engine.run(sums(), PART)
    found = entries(spark, schema)
    state = engine.catalog_tables(sums())[1].location
    assert found["sums"] == os.path.normpath(lake.path("sums"))
    assert found["sums__state"] == os.path.normpath(state) and state.startswith(lake.path("_laminar/state/sums/"))
    props = properties(spark, f"{schema}.sums")  # delta-spark's catalog: the Delta log's properties
    assert props["laminar.description"] == "qty per symbol and 10 minutes"
    assert (props["laminar.owners"], props["laminar.tags"]) == ("team:markets", '{"tier": "gold"}')
    # the entry is the table: read by name through the metastore, as any Spark user would
    assert spark.table(f"{schema}.sums").count() == len(lake.read("sums")) > 0
    assert engine.catalog_name(sums()) == f"{schema}.sums"


def test_registration_is_idempotent_and_writes_nothing_when_nothing_changed(spark, lake, catalog_engine):
    engine, schema = catalog_engine, catalog_engine.catalog.schema
    lake.create("trades", ROWS)
    engine.run(sums(), PART)
    before = entries(spark, schema)
    version = lake.table("sums").version()
    lake.append("trades", [("2024-01-01 00:02:00", "b", 1.0, 5)])
    engine.run(sums(), PART)  # a second run: its own commit, nothing from the catalog
    assert lake.table("sums").version() == version + 1
    # a fresh catalog object (a new process) finds every entry in place and changes nothing
    report = HiveCatalog(spark, schema).register(engine.catalog_tables(sums()))
    assert (report.created, report.renamed, report.repointed, report.updated) == ([], [], [], [])
    assert sorted(report.unchanged) == ["sums", "sums__state"]
    assert entries(spark, schema) == before and lake.table("sums").version() == version + 1
    # a changed description: metadata commits (its property, the table's comment), then nothing again
    changed = engine.catalog_tables(sums(description="renamed metric"))
    report = HiveCatalog(spark, schema).register(changed)
    assert report.updated == ["sums"] and lake.table("sums").version() == version + 3
    assert properties(spark, f"{schema}.sums")["laminar.description"] == "renamed metric"
    assert spark.sql(f"DESCRIBE TABLE EXTENDED {schema}.sums").where("col_name = 'Comment'").first()[1] == \
        "renamed metric"
    assert HiveCatalog(spark, schema).register(changed).updated == [] and lake.table("sums").version() == version + 3


def test_the_listing_never_describes_the_sessions_temporary_views(spark, lake, catalog_engine, monkeypatch):
    """pyspark's `spark.sql(query, df=...)` makes and drops a temporary view per DataFrame argument; one dropped
    by another thread while SHOW TABLE EXTENDED described it failed the statement, and a demo run with it. The
    catalog describes only the schema's own tables, named."""
    engine, schema = catalog_engine, catalog_engine.catalog.schema
    lake.create("trades", ROWS)
    engine.run(sums(), PART)
    statements = []
    real = HiveCatalog._sql
    monkeypatch.setattr(HiveCatalog, "_sql", lambda self, statement: statements.append(statement) or real(self, statement))
    spark.range(1).createOrReplaceTempView("_pyspark_listing_test")
    try:
        assert set(HiveCatalog(spark, schema)._listed()) == {"sums", "sums__state"}
        described = [s for s in statements if s.startswith("SHOW TABLE EXTENDED")]
        assert described
        for statement in described:  # what each would describe: never a temporary view
            pattern = statement.rsplit(" LIKE ", 1)[1]
            listed = spark.sql(f"SHOW TABLES IN `{schema}` LIKE {pattern}").collect()
            assert not [r for r in listed if r["isTemporary"]], (statement, listed)
    finally:
        spark.catalog.dropTempView("_pyspark_listing_test")


def test_a_renamed_flow_renames_its_entry_and_a_removed_ones_are_left_and_reported(spark, lake, catalog_engine):
    engine, schema = catalog_engine, catalog_engine.catalog.schema
    lake.create("trades", ROWS)
    engine.run(sums(sink="sums_out"), PART)
    old_state = engine.catalog_tables(sums(sink="sums_out"))[1].location
    # the flow is renamed, its sink kept (the owner property moved, as the owner check says)
    open_delta(lake.path("sums_out")).alter.set_table_properties({"laminar.flow": "totals"}, raise_if_not_exists=False)
    totals = sums(name="totals", sink="sums_out")
    lake.append("trades", [("2024-01-01 00:02:00", "b", 1.0, 5)])
    engine.run(totals, PART)
    found = entries(spark, schema)
    assert found["totals"] == os.path.normpath(lake.path("sums_out")) and "sums" not in found
    assert spark.table(f"{schema}.totals").count() == len(lake.read("sums_out"))
    # a webhook export's dead letters are registered too (by a sync: deliveries have no Spark)
    hook = WebhookExport(name="alerts", source="totals", connection="hook")
    dead_letters.write(lake.root, "alerts", [dict(export="alerts", source="totals", idempotency_key="k1", op="insert",
                                                  version=1, partition=PART, status=500, error="no", attempts=5,
                                                  row="{}")])
    report = engine.sync_catalog([totals], [hook])
    assert "alerts__dead_letters" in report.created
    assert spark.table(f"{schema}.alerts__dead_letters").count() == 1
    assert report.left == ["sums__state"]  # the old flow's state: reported, left in place, never dropped
    assert entries(spark, schema)["sums__state"] == os.path.normpath(old_state)
    assert open_delta(old_state).version() >= 0


def test_a_source_by_catalog_name_is_read_at_its_location_and_an_unknown_name_fails_first(spark, lake,
                                                                                         catalog_engine):
    engine = catalog_engine
    raw = f"{engine.catalog.schema}_raw"
    lake.create("landing/trades_v2", ROWS)
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {raw}")
    spark.sql(f"CREATE TABLE {raw}.trades USING delta LOCATION '{lake.path('landing/trades_v2')}'")
    result = engine.run(sums(source=f"{raw}.trades"), PART)
    assert result.metrics["rows_read"] == 3
    assert sorted(lake.read("sums")["count"].tolist()) == [1, 1, 1]
    # the Spark-free readers (the sensors' version reads) find it where the run found it
    lake.append("landing/trades_v2", [("2024-01-01 00:02:00", "b", 1.0, 5)])
    assert table_versions(lake.root, (f"{raw}.trades",))[0] == {f"{raw}.trades": 1}
    missing = sums(name="nope", source=f"{raw}.missing")
    with pytest.raises(CatalogNameError) as err:
        engine.run(missing, PART)
    message = str(err.value)
    assert f"'{raw}.missing'" in message and "Hive metastore" in message and "\n" not in message
    assert not os.path.exists(lake.path("nope")) and not os.path.exists(lake.path("_laminar/watermarks/nope"))


def test_a_dimension_by_catalog_name_is_joined_at_its_location_and_an_unknown_one_fails_first(spark, lake,
                                                                                            catalog_engine):
    engine = catalog_engine
    ref = f"{engine.catalog.schema}_ref"
    lake.create("trades", ROWS)
    lake.create("reference/symbols_v3", frame=pd.DataFrame({"sym": ["a", "b"], "sector": ["tech", "energy"]}))
    spark.sql(f"CREATE SCHEMA IF NOT EXISTS {ref}")
    spark.sql(f"CREATE TABLE {ref}.symbols USING delta LOCATION '{lake.path('reference/symbols_v3')}'")
    stage = StageSpec(name="sectors", source="trades", event_time="ts",
                      joins=(DimensionJoin(f"{ref}.symbols", on=("sym",), columns=("sector",)),))
    assert engine.run(stage, PART).mode.value == "REFILL"
    out = lake.read("sectors").sort_values("ts")
    assert out["sector"].tolist() == ["tech", "tech", "energy"][:len(out)] and len(out) == 3
    # a new version of the dimension, found where the run found it by the Spark-free readers (the sensors)
    lake.append("reference/symbols_v3", frame=pd.DataFrame({"sym": ["c"], "sector": ["retail"]}))
    assert table_versions(lake.root, (f"{ref}.symbols",))[0] == {f"{ref}.symbols": 1}
    missing = StageSpec(name="nope", source="trades", event_time="ts",
                        joins=(DimensionJoin(f"{ref}.missing", on=("sym",), columns=("sector",)),))
    with pytest.raises(CatalogNameError) as err:
        engine.run(missing, PART)
    assert str(err.value).startswith(f"joined table '{ref}.missing' of 'nope' is not a table of the catalog")
    assert not os.path.exists(lake.path("nope")) and not os.path.exists(lake.path("_laminar/watermarks/nope"))


def test_laminar_sql_reads_a_flow_by_its_catalog_name(spark, lake, catalog_engine):
    engine, schema = catalog_engine, catalog_engine.catalog.schema
    lake.create("trades", ROWS)
    engine.run(sums(), PART)
    result = run_query(spark, lake.root, [sums()], f"SELECT sym, sum(count) AS n FROM {schema}.sums GROUP BY sym "
                       "ORDER BY sym", catalog=schema)
    assert result.rows == [("a", 2), ("b", 1)]
    with pytest.raises(LaminarError, match="another catalog or database|unknown table"):
        run_query(spark, lake.root, [sums()], f"SELECT * FROM {schema}.sums")  # no catalog named: refused


def test_the_documented_settings_name_the_metastore(tmp_path):
    conf = jvm_conf(SparkOptions(metastore=str(tmp_path / "ms")))
    assert conf["spark.sql.catalogImplementation"] == "hive"
    assert conf["spark.hadoop.javax.jdo.option.ConnectionURL"] == \
        f"jdbc:derby:;databaseName={tmp_path}/ms/metastore_db;create=true"
    assert "spark.sql.catalogImplementation" not in jvm_conf(SparkOptions())


def test_a_second_process_on_the_embedded_metastore_gets_one_clear_line(spark, tmp_path):
    """Derby's one-process rule (docs/catalog.md): while this session holds the metastore, another JVM's first
    catalog statement fails at once with a CatalogError naming the metastore and the way out."""
    spark.sql("SHOW SCHEMAS").collect()  # this process holds the metastore from here on
    url = spark.conf.get("spark.hadoop.javax.jdo.option.ConnectionURL")
    folder = os.path.dirname(url.split("databaseName=", 1)[1].split(";", 1)[0])
    code = ("import sys\n"
            "from laminar_assets.engine import SparkOptions, build_session\n"
            "from laminar_assets.engine.catalog.hive import HiveCatalog\n"
            "from laminar_assets.errors import CatalogError\n"
            f"spark = build_session(SparkOptions(master='local[1]', jit='quick', metastore={folder!r}))\n"
            "try:\n"
            "    HiveCatalog(spark, 'laminar').register([])\n"
            "except CatalogError as exc:\n"
            "    print('CatalogError:', exc)\n"
            "    sys.exit(3)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=240,
                         env={**os.environ, "PYTHONPATH": str(REPO)}, cwd=tmp_path)
    assert out.returncode == 3, out.stderr[-2000:]
    line = out.stdout.strip().splitlines()[-1]
    assert f"Derby at {folder}/metastore_db" in line and "open in another process" in line
    assert "LAMINAR_SPARK_REMOTE" in line


# --- a metastore database on Postgres ----------------------------------------------------------------------------

def test_a_postgres_url_names_the_metastore_database_and_its_password_stays_off_command_lines(monkeypatch):
    """`postgresql://` (Dagster's form) and `jdbc:postgresql:` URLs: Hive's settings with the credentials apart, bounded
    waits, pgjdbc on the driver's class path; a JVM started as a process of its own reads the password from its
    environment. A socket directory (which pgjdbc cannot reach) is refused in one line."""
    from laminar_assets.deploy.connect_server import ConnectServerOptions, server_command
    from laminar_assets.engine.spark.metastore import metastore_env
    from laminar_assets.errors import EnvironmentProblem

    url = "postgresql+psycopg2://hive:s3cr%40t-pw@db.example:5433/metastore?sslmode=require"
    conf = jvm_conf(SparkOptions(metastore=url))
    assert conf["spark.hadoop.javax.jdo.option.ConnectionURL"] == \
        "jdbc:postgresql://db.example:5433/metastore?sslmode=require&connectTimeout=5&loginTimeout=10" \
        "&options=-c%20lock_timeout%3D30000"
    assert (conf["spark.hadoop.javax.jdo.option.ConnectionUserName"],
            conf["spark.hadoop.javax.jdo.option.ConnectionPassword"]) == ("hive", "s3cr@t-pw")
    assert conf["spark.driver.extraClassPath"].endswith("postgresql-42.7.14.jar")
    assert "derby" not in conf["spark.driver.extraJavaOptions"]
    jdbc = jvm_conf(SparkOptions(metastore="jdbc:postgresql://db.example/metastore?user=hive&password=s3cr%40t-pw"))
    assert jdbc["spark.hadoop.javax.jdo.option.ConnectionURL"].startswith("jdbc:postgresql://db.example:5432/metastore?")
    assert "s3cr" not in jdbc["spark.hadoop.javax.jdo.option.ConnectionURL"]
    command = " ".join(server_command(ConnectServerOptions(spark=SparkOptions(metastore=url))))
    assert "s3cr" not in command and "ConnectionPassword=${env.LAMINAR_METASTORE_PASSWORD}" in command
    assert metastore_env(url) == {"LAMINAR_METASTORE_PASSWORD": "s3cr@t-pw"}
    # given in the environment, the password is only referred to by a local session's settings too
    monkeypatch.setenv("LAMINAR_METASTORE_PASSWORD", "s3cr@t-pw")
    conf = jvm_conf(SparkOptions(metastore="postgresql://hive@db.example:5433/metastore"))
    assert conf["spark.hadoop.javax.jdo.option.ConnectionPassword"] == "${env.LAMINAR_METASTORE_PASSWORD}"
    with pytest.raises(EnvironmentProblem, match="TCP") as err:
        jvm_conf(SparkOptions(metastore="postgresql://hive:s3cr%40t-pw@/metastore?host=/run/postgresql"))
    assert "s3cr" not in str(err.value)


def test_a_wrong_password_or_an_unreachable_metastore_database_is_one_line_before_any_jvm(pg_server, pg_database,
                                                                                         lake):
    """Checked with psycopg before a JVM starts (a local session's, a Connect server's): one CatalogError line within
    seconds naming the database and what to do, never the password, instead of Hive's retries and a Py4J trace."""
    from laminar_assets.deploy.connect_server import ConnectServerOptions, start_connect_server
    from laminar_assets.errors import CatalogError
    from tests.deploy.processes import free_port
    from tests.postgres import PASSWORD, PASSWORD_ROLE

    port = pg_server.tcp_port()
    wrong = f"postgresql://{PASSWORD_ROLE}:not-{PASSWORD}@127.0.0.1:{port}/{pg_database}"
    cases = {wrong: f'password authentication failed for user "{PASSWORD_ROLE}"',
             f"postgresql://{PASSWORD_ROLE}:{PASSWORD}@127.0.0.1:{free_port()}/{pg_database}": "Connection refused",
             f"postgresql://{PASSWORD_ROLE}:{PASSWORD}@127.0.0.1:{port}/nodb": 'database "nodb" does not exist'}
    for url, said in cases.items():
        started = time.monotonic()
        with pytest.raises(CatalogError) as err:
            check_metastore(url)
        message = str(err.value)
        assert said in message and "\n" not in message and PASSWORD not in message, message
        assert f"{PASSWORD_ROLE}@127.0.0.1:" in message and time.monotonic() - started < 5
    # the user's path: `laminar sql` with LAMINAR_METASTORE set fails in one line, before its JVM starts
    lake.create("trades", ROWS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "LAMINAR_CATALOG": "laminar", "LAMINAR_METASTORE": wrong}
    env.pop("LAMINAR_SPARK_REMOTE", None)
    started = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "laminar_assets.cli", "--root", lake.root, "sql",
                          "SELECT * FROM laminar.sums"], capture_output=True, text=True, timeout=120, env=env, cwd=REPO)
    assert out.returncode == 1 and time.monotonic() - started < 30, out.stderr[-2000:]
    said = [line for line in (out.stdout + out.stderr).splitlines() if "error" in line.lower()]
    assert len(said) == 1 and "password authentication failed" in said[0], out.stderr[-2000:]
    assert PASSWORD not in out.stdout + out.stderr and "Traceback" not in out.stderr and "Py4J" not in out.stderr
    # and the start of a Connect server (`laminar serve`)
    with pytest.raises(CatalogError, match="password authentication failed"):
        start_connect_server(ConnectServerOptions(port=free_port(), spark=SparkOptions(metastore=wrong)))


CLIENT = """
import sys
from laminar_assets.engine import CatalogOptions, Engine, SparkOptions, build_session
from tests.engine.catalog.test_hive_catalog import PART, sums
spark = build_session(SparkOptions(remote=sys.argv[1]))
engine = Engine(spark, sys.argv[2], catalog=CatalogOptions(schema="laminar"))
engine.run(sums(), PART)
print("ran", flush=True)
sys.stdin.readline()  # the other JVM registers meanwhile
print("seen", sorted(r[1] for r in spark.sql("SHOW TABLES IN laminar").collect()),
      spark.sql("SELECT count(*) FROM laminar.extra").first()[0], flush=True)
"""

LOCAL = """
import sys
from laminar_assets.engine import SparkOptions, build_session
from laminar_assets.engine.catalog import CatalogTable
from laminar_assets.engine.catalog.hive import HiveCatalog
from laminar_assets.engine.report import run_query
spark = build_session(SparkOptions.from_env(master="local[1]", shuffle_partitions=1, java_options="-XX:+UseSerialGC"))
catalog = HiveCatalog(spark, "laminar")
print("resolved", catalog.resolve("laminar.sums"), flush=True)
print("rows", run_query(spark, sys.argv[1], [], "SELECT sym, sum(count) AS n FROM laminar.sums GROUP BY sym ORDER BY sym",
                        catalog="laminar").rows, flush=True)
print("registered", catalog.register([CatalogTable(name="extra", location=sys.argv[2], kind="sink")]).created,
      flush=True)
"""


def test_processes_share_a_postgres_metastore_database(lake, pg_server, pg_database, tmp_path):
    """What embedded Derby cannot do: while the Spark Connect server of `laminar serve` holds the metastore (a flow's
    run through it registered its sink there), a JVM of its own (as `laminar sql`'s, from LAMINAR_METASTORE) reads that
    sink by its name and registers a table, which the server sees at once. Hive's tables are created in the empty
    database on first use; the password reaches neither a command line nor the server's log."""
    import psycopg

    from laminar_assets.deploy import ConnectServerOptions, start_connect_server
    from tests.conftest import TEST_JAVA_OPTIONS
    from tests.deploy.processes import free_port
    from tests.postgres import PASSWORD, PASSWORD_ROLE

    url = f"postgresql://{PASSWORD_ROLE}:{PASSWORD}@127.0.0.1:{pg_server.tcp_port()}/{pg_database}"
    lake.create("trades", ROWS)
    lake.create("extra", ROWS[:2])
    env = {**os.environ, "PYTHONPATH": str(REPO), "LAMINAR_CATALOG": "laminar", "LAMINAR_METASTORE": url,
           "LAMINAR_SPARK_JIT": "quick"}
    env.pop("LAMINAR_SPARK_REMOTE", None)
    log = tmp_path / "connect.log"
    options = ConnectServerOptions(port=free_port(), log_path=str(log), spark=SparkOptions(
        master="local[1]", driver_memory="1g", shuffle_partitions=1, jit="quick", java_options=TEST_JAVA_OPTIONS,
        metastore=url, conf={"spark.sql.warehouse.dir": str(tmp_path / "warehouse")}))
    with start_connect_server(options) as server:
        client = subprocess.Popen([sys.executable, "-c", CLIENT, server.url, lake.root], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
        try:
            assert client.stdout.readline().strip() == "ran", client.stderr.read()[-3000:]
            # its password in LAMINAR_METASTORE_PASSWORD, as docs/catalog.md advises: no command line holds it
            local = subprocess.run([sys.executable, "-c", LOCAL, lake.root, lake.path("extra")], capture_output=True,
                                   text=True, timeout=300, cwd=tmp_path, env={
                                       **env, "LAMINAR_METASTORE": url.replace(f":{PASSWORD}@", "@"),
                                       "LAMINAR_METASTORE_PASSWORD": PASSWORD})
            assert local.returncode == 0, local.stderr[-3000:]
            client.stdin.write("go\n")
            client.stdin.flush()
            seen = client.stdout.readline().strip()
            assert client.wait(timeout=120) == 0, client.stderr.read()[-3000:]
        finally:
            if client.poll() is None:
                client.kill()
        command = " ".join(open(f"/proc/{pid}/cmdline").read().replace("\0", " ")
                           for pid in _group(server.process.pid))
    lines = dict(line.split(" ", 1) for line in local.stdout.strip().splitlines())
    assert os.path.normpath(lines["resolved"]) == os.path.normpath(lake.path("sums"))
    assert lines["rows"] == "[('a', 2), ('b', 1)]" and lines["registered"] == "['extra']"
    assert seen == "seen ['extra', 'sums', 'sums__state'] 2"
    # the entries are in Postgres (Hive's own tables, made on first use), not in a Derby anywhere
    with psycopg.connect(pg_server.url(pg_database)) as conn:
        names = sorted(r[0] for r in conn.execute(
            'SELECT t."TBL_NAME" FROM "TBLS" t JOIN "DBS" d ON t."DB_ID" = d."DB_ID" WHERE d."NAME" = \'laminar\''))
    assert names == ["extra", "sums", "sums__state"]
    assert not list(tmp_path.rglob("metastore_db"))
    assert PASSWORD not in command and "javax.jdo.option.ConnectionURL" in command
    assert PASSWORD not in log.read_text(errors="replace")


def _group(pid: int) -> list[int]:
    """The processes of `pid`'s process group (the Connect server's launcher and its JVM)."""
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getpgid(int(entry)) == pid:
                    out.append(int(entry))
            except OSError:
                continue
    return out
