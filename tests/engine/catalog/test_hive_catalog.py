"""The catalog: every table a run writes is an external Delta table of the session's Hive metastore (a real
embedded Derby metastore: the test session's, tests/conftest.py), sources are found by their catalog name, and
`laminar sql` reads `<schema>.<table>` through the metastore. Each test uses a schema of its own."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from laminar_assets.engine import Agg, CatalogOptions, Engine, FlowSpec, LaminarError, Tumbling, WebhookExport
from laminar_assets.engine.catalog.hive import HiveCatalog
from laminar_assets.engine.delta import open_delta
from laminar_assets.engine.export import dead_letters
from laminar_assets.engine.report import run_query
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
    assert not os.path.exists(lake.path("nope")) and not os.path.exists(lake.path("_laminar/checkpoints/nope"))


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
