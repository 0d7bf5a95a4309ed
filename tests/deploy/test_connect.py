"""Every engine path over Spark Connect, as daemon-launched runs use it: the demo's stage (dedup, join,
quarantine) and every flow (persist, observe, sketches), then explain, equivalence and the Great
Expectations contracts, on a real Connect server; the sinks equal an independent local recompute."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from laminar_assets.definitions import specs_with_contracts
from laminar_assets.deploy import ConnectServerOptions, start_connect_server
from laminar_assets.engine import FlowSpec, SparkOptions, build_session
from laminar_assets.errors import EnvironmentProblem
from laminar_assets.flows import load_specs
from tests.delta_features import delete_where, enable_deletion_vectors, snapshot
from tests.deploy.connect_scenario import VECTOR_FLOWS, vector_flow
from tests.deploy.processes import free_port
from tests.reference import assert_frames_match, full_recompute

pytestmark = [pytest.mark.spark, pytest.mark.deployment, pytest.mark.timeout(900)]
SPECS, _ = specs_with_contracts(load_specs())
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server(connect_server):
    """The test process's Connect server (tests/conftest.py), shared with the other tests that need one."""
    return connect_server


def test_the_demo_pipeline_over_spark_connect_equals_a_local_recompute(server, spark, tmp_path):
    root = str(tmp_path / "lake")
    proc = subprocess.run([sys.executable, "-m", "tests.deploy.connect_scenario", root, server.url], cwd=REPO,
                          env={k: v for k, v in os.environ.items() if k != "LAMINAR_SPARK_REMOTE"},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["session"].startswith("pyspark.sql.connect")
    assert "INCREMENTAL" in out["modes"] and "REFILL" in out["modes"]
    assert out["quarantined"] > 0 and out["quarantine_table"]
    # late appends only: the stages' one-job append path (dedup verdict and counts observed), with a
    # rejected row on it; then a kept trade sent again earlier, which the observed verdict refills
    # (the stage reading normalized_trades refills after that refill's deletes: NON_APPEND_ON_NON_RETRACTABLE)
    appends = [a.split("/") for a in out["stage_appends"] if a.startswith("normalized_trades/")]
    assert {(m, r) for _, m, r, _ in appends} == {("INCREMENTAL", "APPEND_ONLY"), ("NOOP", "NO_CHANGES_IN_PARTITION"),
                                                  ("REFILL", "DEDUP_REPLACED_ROW")}, appends
    assert any(m == "INCREMENTAL" and int(n) > 0 for _, m, _, n in appends), appends
    assert all(out["equivalence"].values()) and all(out["contract"].values()), out
    assert "Input [" in out["physical"] or "Scan" in out["physical"]
    stage = DeltaTable(f"{root}/normalized_trades").to_pyarrow_table()
    for flow in (s for s in SPECS if isinstance(s, FlowSpec)):
        expected = full_recompute(spark, flow, stage)
        assert_frames_match(DeltaTable(f"{root}/{flow.sink}").to_pandas(), expected, flow.keys)
    # a column-mapped source with deletion vectors, over Connect: equal to deltalake's own reader
    assert out["vectors"] == ["NO_WATERMARK", "NO_WATERMARK", "DELETION_VECTOR_CHANGES",
                              "NON_APPEND_ON_NON_RETRACTABLE"], out["vectors"]
    rows = snapshot(f"{root}/dv_trades")
    for name in VECTOR_FLOWS:
        flow = vector_flow(name)
        assert_frames_match(DeltaTable(f"{root}/{flow.sink}").to_pandas(), full_recompute(spark, flow, rows), flow.keys)


def test_laminar_sql_over_the_connect_server_reads_delta_tables_by_path(server, tmp_path):
    """The server `laminar serve` starts loads delta-spark (when its jars are installed): `laminar sql`
    through it reads a Delta table by path, with deletion vectors applied, and its history."""
    from laminar_assets.engine.spark import installed_jars

    if not installed_jars("delta"):
        pytest.skip("needs delta-spark's jars (make install puts them in the venv)")
    root = tmp_path / "lake"
    table = str(root / "dv_trades")
    write_deltalake(table, pa.table({"sym": ["a", "b", "c", "a"], "qty": [1, 2, 3, 1]}))
    enable_deletion_vectors(table)
    delete_where(table, lambda t: pc.equal(t["qty"], 1))
    rows = snapshot(table)
    assert rows.num_rows == 2
    env = {**os.environ, "LAMINAR_SPARK_REMOTE": server.url, "LAMINAR_ROOT": str(root)}
    files = sorted(p.relative_to(table) for p in Path(table).rglob("*"))
    # read-only over Connect too: judged by the server's EXPLAIN (a multi-insert overwriting the table's
    # folder) or by the first word delta-spark's lexer reads (a RESTORE hidden from Spark's lexer by a
    # comment that delta-spark's does not nest); the table keeps every file and its version
    refused = [(f"FROM (SELECT 1 AS a) INSERT OVERWRITE DIRECTORY '{table}' USING parquet SELECT *",
                "INSERT OVERWRITE DIRECTORY"),
               (f"/* /* */ RESTORE TABLE delta.`{table}` TO VERSION AS OF 0 -- */ SELECT 1", "RESTORE")]
    # One process runs the reads and the first refusal (a `laminar` process each was an import of Dagster and
    # PySpark and a Connect session each, for the same command); the second refusal is a `laminar` process of
    # its own, whose exit code is the process's
    batch = subprocess.run([sys.executable, "-m", "tests.cli_in_process", json.dumps([
        ["sql", f"SELECT count(*) AS n FROM delta.`{table}`", "--json"],
        ["sql", f"DESCRIBE HISTORY delta.`{table}`", "--json"],
        ["sql", refused[0][0]]])], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert batch.returncode == 0, batch.stderr[-3000:]
    count, described, first = json.loads(batch.stdout.strip().splitlines()[-1])
    for done in (count, described):
        assert done["code"] == 0, done["stderr"][-3000:]
    assert json.loads(count["stdout"]) == [{"n": rows.num_rows}]
    history = json.loads(described["stdout"])
    assert [h["version"] for h in history] == list(range(len(history) - 1, -1, -1)) and len(history) > 1, history
    second = subprocess.run([sys.executable, "-m", "laminar_assets.cli", "sql", refused[1][0]], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=300)
    for (_, found), code, stderr in ((refused[0], first["code"], first["stderr"]),
                                     (refused[1], second.returncode, second.stderr)):
        assert code == 1 and "reads only: it runs one SELECT" in stderr, stderr[-3000:]
        assert f"found {found}" in stderr, stderr[-3000:]
    assert sorted(p.relative_to(table) for p in Path(table).rglob("*")) == files
    assert DeltaTable(table).version() == len(history) - 1


def test_an_unreachable_endpoint_fails_fast_and_clearly():
    with pytest.raises(EnvironmentProblem, match="cannot connect to the Spark Connect server"):
        build_session(SparkOptions(remote=f"sc://127.0.0.1:{free_port()}"))


def test_a_taken_port_is_a_clear_error(server):
    with pytest.raises(EnvironmentProblem, match=f"port {server.options.port} .* already in use"):
        start_connect_server(ConnectServerOptions(port=server.options.port))


def test_the_warm_up_runs_the_graph_on_a_scratch_lake_and_leaves_nothing_behind(server, tmp_path):
    """`laminar serve`'s warm-up sends the demo graph's passes through the server on a temporary
    folder; it removes the folder when it finishes and when it is stopped part way (SIGTERM), and
    the folders of warm-ups killed hours ago."""
    import signal
    import time

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    env = {**{k: v for k, v in os.environ.items() if k != "LAMINAR_SPARK_REMOTE"}, "TMPDIR": str(scratch)}
    cmd = [sys.executable, "-m", "laminar_assets.deploy.warm_up", server.url]
    # Stopped early and part way through its first pass: a stop that landed inside a gRPC wait once
    # left the client's channel locked and the process hung at exit (1 stop in 12 before the fix).
    for pause in (0.5, 3.0):
        stopped = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 120
            while not any(p.name.startswith("laminar-warm-up-") for p in scratch.iterdir()):
                assert stopped.poll() is None and time.monotonic() < deadline, "the warm-up made no scratch folder"
                time.sleep(0.2)
            time.sleep(pause)
            stopped.send_signal(signal.SIGTERM)
            out, _ = stopped.communicate(timeout=60)  # reads as it waits: a full pipe cannot block the exit
            assert stopped.returncode == 130, out[-3000:]
            assert b"warm-up stopped" in out
        finally:
            stopped.kill()
        assert not list(scratch.iterdir()), f"a warm-up stopped after {pause} s left its scratch folder"

    stale = scratch / "laminar-warm-up-killed"  # what a SIGKILLed warm-up leaves: swept once old
    stale.mkdir()
    os.utime(stale, (time.time() - 7 * 3600, time.time() - 7 * 3600))

    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "warm-up done" in done.stdout and "batch 2" in done.stdout and "checks" in done.stdout, done.stdout
    assert not list(scratch.iterdir()), "the warm-up left its scratch folder"


TO_ARROW = r"""
import json, sys
from pyspark.sql import SparkSession
from laminar_assets.engine.spark.frames import to_arrow

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
SQL = ("SELECT TIMESTAMP'2024-01-02 03:04:05.123456' AS ts, TIMESTAMP_NTZ'2024-01-02 03:04:05' AS ntz, "
       "DATE'2024-01-02' AS d, CAST(1.25 AS DECIMAL(10, 2)) AS dec, named_struct('a', 1, 'b', 'x') AS st, "
       "map('k', 1.5) AS m, array(1, NULL) AS arr, CAST('bin' AS BINARY) AS b, CAST(NULL AS STRING) AS n, "
       "id FROM range(3)")
asked = []
schema = spark.client.schema
spark.client.schema = lambda *a, **k: (asked.append(1), schema(*a, **k))[1]
ours = to_arrow(spark.sql(SQL))
ours_asked = len(asked)
theirs = spark.sql(SQL).toArrow()
print(json.dumps({"equal": ours.equals(theirs), "schema": str(ours.schema) == str(theirs.schema),
                  "rows": ours.num_rows, "ours_asked": ours_asked, "theirs_asked": len(asked) - ours_asked}))
"""


def test_to_arrow_over_connect_is_toarrow_without_its_schema_round_trip(server):
    """Connect's `toArrow` asks the server for the schema (a whole analysis) before executing; `to_arrow` takes it
    from the execution's answer: the same table (timestamps, decimals, nested types, nulls), one request fewer."""
    proc = subprocess.run([sys.executable, "-c", TO_ARROW, server.url], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "LAMINAR_SPARK_REMOTE"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"equal": True, "schema": True, "rows": 3, "ours_asked": 0, "theirs_asked": 1}, out


SELECT_FRAME = r"""
import json, sys
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from laminar_assets.engine.spark.frames import select_frame, to_arrow

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
rows = spark.range(10).selectExpr("id", "id % 3 AS g")
SQL = "SELECT g, SUM(id) AS total, map('{{k}}', 1) AS braces FROM {rows} WHERE id > 2 GROUP BY g ORDER BY g"
commands = []
execute_command = spark.client.execute_command
spark.client.execute_command = lambda command, *a, **k: (commands.append(command.WhichOneof("command_type")),
                                                         execute_command(command, *a, **k))[1]
ours = to_arrow(select_frame(spark, SQL, {"rows": rows}))
ours_commands = list(commands)
theirs = to_arrow(spark.sql(SQL, rows=rows))
broken = select_frame(spark, "SELECT no_such_column FROM {rows}", {"rows": rows})  # no error yet: nothing analysed
try:
    to_arrow(broken)
    error = None
except AnalysisException as exc:
    error = type(exc).__name__
print(json.dumps({"equal": ours.equals(theirs), "rows": ours.num_rows, "ours": ours_commands,
                  "theirs": commands[len(ours_commands):], "error": error}))
"""


def test_a_laminar_select_over_connect_is_analysed_once_when_it_runs(server):
    """Connect's `spark.sql` executes a command on the server (an analysis of the whole statement) before it returns
    a frame, which the action analyses again; `select_frame` makes the same frame without that command: the same
    rows, no command sent, and an error in the text raised by the action, as Spark's AnalysisException."""
    proc = subprocess.run([sys.executable, "-c", SELECT_FRAME, server.url], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "LAMINAR_SPARK_REMOTE"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out == {"equal": True, "rows": 3, "ours": [], "theirs": ["sql_command"], "error": "AnalysisException"}, out


SOURCE_CHECK = r"""
import json, sys
import pyarrow as pa
from pyspark.sql import SparkSession
from laminar_assets.engine import Agg, FlowSpec, RowRule, SchemaMismatchError, SpecError, Tumbling
from laminar_assets.engine.delta.tables import TableInfo
from laminar_assets.engine.run.validate import check_source

spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
info = TableInfo("trades", "file:///nowhere/trades", 7, pa.schema([("ts", pa.timestamp("us", "UTC")), ("sym", pa.string()),
                                                                   ("px", pa.float64()), ("qty", pa.int64())]), ())
common = dict(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
              rules=(RowRule("positive", "px > 0"), RowRule("sized", "qty IS NOT NULL")),
              derived={"notional": "px * qty", "lot": "qty DIV 100"}, filter="lot >= 0")
good = FlowSpec(aggregates=(Agg.count(), Agg.sum("notional"), Agg.max("px")), post={"avg": "sum_notional / count"},
                **common)
bad = FlowSpec(aggregates=(Agg.count(), Agg.sum("notional")), post={"avg": "sum_notional / count", "x": "nosuch + 1"},
               **common)
asked = []
schema = spark.client.schema
spark.client.schema = lambda *a, **k: (asked.append(1), schema(*a, **k))[1]
checked = check_source(spark, good, info)
good_asked = len(asked)
try:
    check_source(spark, bad, info)
    field = None
except SpecError as exc:
    field = exc.field
derived = FlowSpec(aggregates=(Agg.count(),), **{**common, "derived": {"notional": "px * qty", "lot": "nosuch DIV 100"}})
try:
    check_source(spark, derived, info)
    derived_field = None
except SchemaMismatchError as exc:  # a column the source lacks: named with the field that uses it
    derived_field = exc.facts.get("field")
print(json.dumps({"good_asked": good_asked, "types": checked.types, "bad_field": field,
                  "derived_field": derived_field}))
"""


def test_a_source_check_over_connect_asks_three_analyses_and_still_names_a_bad_field(server):
    """A daemon-launched run checks each spec against its source afresh, each analysis a request to the server: the
    rules, the derived columns with the filter, and the aggregates with the post columns are analysed once each
    (they were one request per rule twice, per derived column, per post column, plus the source's columns); a
    field that does not compile is still named, from a second look piece by piece."""
    proc = subprocess.run([sys.executable, "-c", SOURCE_CHECK, server.url], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env={k: v for k, v in os.environ.items() if k != "LAMINAR_SPARK_REMOTE"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["good_asked"] == 3, out
    assert out["types"]["notional"] == "double" and out["bad_field"] == "post.x", out
    assert out["derived_field"] == "derived.lot", out  # its message names the columns before it, no raw Spark error


STAGE_APPENDS = """
import json, sys, tempfile
from laminar_assets.definitions import specs_with_contracts
from laminar_assets.demo.generator import BatchOptions, write_batch
from laminar_assets.engine import Engine, FlowSpec, SparkOptions, build_session
from laminar_assets.flows import load_specs

spark = build_session(SparkOptions(remote=sys.argv[1], shuffle_partitions=2))
root = sys.argv[2]
stages = [s for s in specs_with_contracts(load_specs())[0] if not isinstance(s, FlowSpec)]
engine = Engine(spark, root)
keys = ["2024-01-02-09:00", "2024-01-02-10:00", "2024-01-02-11:00"]
write_batch(root, BatchOptions(rows=300, seed=5), batch=0)
for stage in stages:
    engine.run_many(stage, keys)
write_batch(root, BatchOptions(rows=60, seed=6, late_share=1.0, duplicate_share=0.1, update_share=0.0,
                               delete_share=0.0, bad_share=0.0), batch=1)
asked = []
analyze = spark.client._analyze
spark.client._analyze = lambda *a, **k: (asked.append(k.get("method")), analyze(*a, **k))[1]
out = {}
for stage in stages:
    asked.clear()
    runs = engine.run_many(stage, keys)
    out[stage.name] = {"asked": list(asked), "runs": sorted({f"{r.mode.value}/{r.reason.value}" for r in runs})}
print(json.dumps(out))
"""


def test_a_stage_appending_over_connect_asks_one_analysis(server, tmp_path):
    """A stage's run of appends only is one Spark job; before it, the schemas of its new rows, of the rows the
    output keeps and of what the output can hold come from one analysis of the joined rows (they were five
    requests to the server, a quarter of the stage's pass)."""
    proc = subprocess.run([sys.executable, "-c", STAGE_APPENDS, server.url, str(tmp_path / "lake")], cwd=REPO,
                          capture_output=True, text=True, timeout=600,
                          env={k: v for k, v in os.environ.items() if k != "LAMINAR_SPARK_REMOTE"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["normalized_trades"]["runs"] == ["INCREMENTAL/APPEND_ONLY"], out  # the one-job path
    for name, stage in out.items():
        assert stage["asked"] == ["schema"], (name, stage)
