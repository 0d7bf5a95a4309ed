"""`laminar sql` end to end on the trades pipeline's own tables: a sink, each system table, a join, --json,
--limit, an unknown table and a syntax error (one line, non-zero exit)."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from laminar_assets.demo.generator import BatchOptions, write_batch
from laminar_assets.engine import Engine
from laminar_assets.engine.report.overview import topology
from laminar_assets.engine.windows import partition_key
from laminar_assets.errors import LaminarError
from tests.cli.test_cli import SPECS, invoke, run_cli

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def lake(spark, tmp_path_factory):
    """raw_trades and symbols from the demo's generator, then the stage and vwap_1m run by the engine."""
    root = str(tmp_path_factory.mktemp("sqlcli") / "lake")
    write_batch(root, BatchOptions(rows=120, hours=2, bad_share=0.0), batch=0)
    times = DeltaTable(f"{root}/raw_trades").to_pandas(columns=["event_time"])["event_time"]
    engine = Engine(spark, root)
    for name in ("normalized_trades", "vwap_1m"):
        spec = SPECS[name]
        keys = sorted({partition_key(t.to_pydatetime(), spec.granularity) for t in times})
        engine.run_many(spec, keys)
    return root


def sql(lake, tmp_path, *args):
    out = invoke("--root", lake, "sql", *args, home=tmp_path / "dh")
    assert out.exit_code == 0, out.output
    return out.output


def test_query_a_sink(lake, tmp_path):
    rows = json.loads(sql(lake, tmp_path, "SELECT symbol, sum(trades) AS trades FROM vwap_1m GROUP BY symbol "
                                          "ORDER BY symbol", "--json"))
    sink = DeltaTable(f"{lake}/vwap_1m").to_pandas().groupby("symbol")["trades"].sum()
    assert rows == [{"symbol": s, "trades": int(n)} for s, n in sink.items()]
    text = sql(lake, tmp_path, "SELECT symbol, window_start FROM vwap_1m ORDER BY window_start, symbol")
    assert "symbol" in text and "window_start" in text and "rows" in text


def test_each_system_table(lake, tmp_path):
    dag = json.loads(sql(lake, tmp_path, "SELECT * FROM laminar_system.dag_topology", "--json"))
    assert dag == [{"node_id": r["node"], "operator_type": r["kind"], "inputs": r["inputs"], "outputs": r["outputs"],
                    "is_shared": r["is_shared"], "partitioning": r["partitioning"]} for r in topology(list(SPECS.values()))]
    stage = next(r for r in dag if r["node_id"] == "normalized_trades")
    assert stage["operator_type"] == "stage" and stage["inputs"] == ["raw_trades", "symbols"] and stage["is_shared"]
    assert "vwap_1m" in stage["outputs"]
    parts = json.loads(sql(lake, tmp_path, "SELECT * FROM laminar_system.partitions WHERE flow = 'vwap_1m'", "--json"))
    assert len(parts) == 2 and {p["last_reason"] for p in parts} == {"NO_WATERMARK"}
    assert parts[0]["source_versions"] == {"normalized_trades": 1} and parts[0]["seq"] == 1
    runs = json.loads(sql(lake, tmp_path, "SELECT * FROM laminar_system.runs ORDER BY flow", "--json"))
    assert [(r["flow"], r["mode"], r["reason"]) for r in runs] == [
        ("normalized_trades", "REFILL", "NO_WATERMARK"), ("vwap_1m", "REFILL", "NO_WATERMARK")]
    assert all(len(r["partitions"]) == 2 and r["rows_read"] > 0 and r["sink_rows"] > 0 for r in runs)
    assert runs[0]["committed_at"].endswith("+00:00")  # ISO 8601, UTC


def test_join_of_system_table_and_sink(lake, tmp_path):
    rows = json.loads(sql(lake, tmp_path, """
        SELECT p.partition, p.last_mode, count(*) AS windows
        FROM vwap_1m v JOIN laminar_system.partitions p
          ON p.flow = 'vwap_1m' AND date_format(v.window_start, 'yyyy-MM-dd-HH:00') = p.partition
        GROUP BY p.partition, p.last_mode ORDER BY p.partition""", "--json"))
    assert len(rows) == 2 and all(r["last_mode"] == "REFILL" and r["windows"] > 0 for r in rows)


def test_table_output_keeps_brackets_and_says_when_truncated(lake, tmp_path):
    text = sql(lake, tmp_path, "SELECT '[red]x[/red]' AS `a[b]`, symbol FROM vwap_1m", "--limit", "2")
    assert "[red]x[/red]" in text and "a[b]" in text
    assert "showing the first 2 rows" in text and "--limit" in text


# What the JVM itself prints on stderr when Spark starts (every Spark command of the CLI shows these; Spark's
# "Setting default log level" lines no longer: engine/spark/log4j2.properties, and the tests below fail on them).
JVM_NOISE = ("WARNING: Using incubator modules", "Warning: Java versions")


def one_error_line(proc) -> str:
    """The single line Laminar printed on stderr (the JVM's start-up lines aside), without tracebacks."""
    lines = [x for x in proc.stderr.splitlines() if x.strip() and not x.startswith(JVM_NOISE)]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Py4J" not in proc.stderr and "JVM stacktrace" not in proc.stderr
    return lines[0]


def test_unknown_table_and_syntax_error_are_one_line(lake, tmp_path):
    proc = run_cli("--root", lake, "sql", "SELECT * FROM vwap_5m", home=tmp_path / "dh")
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert "unknown table 'vwap_5m' in the query; did you mean 'vwap_1m'?" in line and "laminar_system.runs" in line, line
    proc = run_cli("--root", lake, "sql", "SELECT * FROM vwap_1m WHERE symbol =", home=tmp_path / "dh")
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert line.startswith("error: query failed: [PARSE_SYNTAX_ERROR]") and "end of input" in line, line
    assert not proc.stdout.strip()


def files_under(path) -> dict[str, int]:
    """Every file under `path` (relative name -> size): what a refused statement must leave as it was."""
    return {os.path.relpath(os.path.join(d, f), path): os.path.getsize(os.path.join(d, f))
            for d, _, names in os.walk(path) for f in names}


# Statements a probe ran through `laminar sql` with exit code 0 before its guard judged statements by
# Spark's own parse: sqlglot could not parse them, and a deny-list let what it could not parse through.
DAMAGING = {
    "insert_overwrite_directory": ("FROM symbols INSERT OVERWRITE DIRECTORY '{lake}/symbols' USING parquet "
                                   "SELECT * WHERE false", "symbols", "INSERT OVERWRITE DIRECTORY"),
    "restore": ("RESTORE TABLE delta.`{lake}/vwap_1m` TO VERSION AS OF 0", "vwap_1m", "RESTORE"),
    "reorg_purge": ("REORG TABLE delta.`{lake}/vwap_1m` APPLY (PURGE)", "vwap_1m", "REORG"),
}


@pytest.mark.parametrize("case", sorted(DAMAGING))
def test_a_statement_that_writes_is_refused_before_anything_runs(lake, tmp_path, case):
    statement, table, kind = DAMAGING[case]
    before, version = files_under(f"{lake}/{table}"), DeltaTable(f"{lake}/{table}").version()
    with pytest.raises(LaminarError) as info:
        invoke("--root", lake, "sql", statement.format(lake=lake), home=tmp_path / "dh")
    message = str(info.value)
    assert f"found {kind}" in message and "reads only" in message and "\n" not in message, message
    assert os.path.isdir(f"{lake}/{table}/_delta_log")
    assert files_under(f"{lake}/{table}") == before and DeltaTable(f"{lake}/{table}").version() == version


def test_convert_to_delta_is_refused_and_the_folder_stays_plain_parquet(lake, tmp_path):
    folder = tmp_path / "plain"
    folder.mkdir()
    pq.write_table(pa.table({"x": [1, 2]}), folder / "part-0.parquet")
    with pytest.raises(LaminarError, match="found CONVERT TO DELTA"):
        invoke("--root", lake, "sql", f"CONVERT TO DELTA parquet.`{folder}`", home=tmp_path / "dh")
    assert os.listdir(folder) == ["part-0.parquet"]  # no _delta_log: not turned into a Delta table


def test_java_method_is_refused_before_the_jvm_runs_it(lake, tmp_path, spark):
    probe = "laminar.sql.probe"
    with pytest.raises(LaminarError, match="java_method"):
        invoke("--root", lake, "sql", f"SELECT java_method('java.lang.System', 'setProperty', '{probe}', 'x')",
               home=tmp_path / "dh")
    assert spark._jvm.java.lang.System.getProperty(probe) is None


def test_an_explain_cannot_hide_a_file_read_behind_a_nested_comment(lake, tmp_path):
    """Spark's lexer nests `/* */` comments: the EXPLAIN below explains a CSV read of a file outside the lake
    (a header names the columns after its first line, and the unknown column's error lists them), while a
    regex that does not nest finds a string literal there. `laminar sql` judges what Spark parsed."""
    secret = tmp_path / "secret.csv"
    secret.write_text("top secret\n")
    statement = (f"EXPLAIN /* /* */ SELECT ' */ SELECT nosuch FROM csv.`{secret}` WITH (\"header\" = \"true\") --'")
    with pytest.raises(LaminarError) as info:
        invoke("--root", lake, "sql", statement, home=tmp_path / "dh")
    message = str(info.value)
    assert f"found csv.`{secret}`" in message and "top secret" not in message, message


def test_explain_show_and_describe_of_lake_tables(lake, tmp_path, caplog):
    """The statement kinds docs/cli.md lists, on a lake table by name: EXPLAIN and SHOW see its view (sqlglot
    keeps what follows EXPLAIN or SHOW as one string), DESCRIBE HISTORY [LIMIT n] reads its log by path (as
    DESCRIBE DETAIL does: its first run costs a Spark job), DESCRIBE FUNCTION names no table; and sqlglot logs
    nothing on stderr."""
    plan = json.loads(sql(lake, tmp_path, "EXPLAIN SELECT * FROM vwap_1m v JOIN laminar_system.partitions p "
                                          "ON p.flow = 'vwap_1m'", "--json"))[0]["plan"]
    assert "Physical Plan" in plan and "NOT_FOUND" not in plan, plan
    columns = json.loads(sql(lake, tmp_path, "SHOW COLUMNS IN vwap_1m", "--json"))
    assert [c["col_name"] for c in columns] == DeltaTable(f"{lake}/vwap_1m").schema().to_arrow().names
    history = json.loads(sql(lake, tmp_path, "describe history `vwap_1m` limit 1", "--json"))
    assert [h["version"] for h in history] == [DeltaTable(f"{lake}/vwap_1m").version()]
    by_path = json.loads(sql(lake, tmp_path, f"DESCRIBE HISTORY '{lake}/vwap_1m'", "--json"))  # delta-spark's form
    assert by_path[0] == history[0]
    assert "reflect" in sql(lake, tmp_path, "DESCRIBE FUNCTION reflect")
    assert not [r for r in caplog.records if r.name.startswith("sqlglot")], caplog.records


def test_time_travel_on_a_lake_table_by_name_says_to_read_it_by_path(lake, tmp_path):
    with pytest.raises(LaminarError) as info:
        invoke("--root", lake, "sql", "SELECT * FROM vwap_1m VERSION AS OF 0", home=tmp_path / "dh")
    message = str(info.value)
    assert "TIME_TRAVEL" in message and f"{lake}/vwap_1m` VERSION AS OF <n>" in message and "\n" not in message
