"""The `laminar` CLI end to end: the demo (through Dagster), dag, status, explain, refill, generate, errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest
from typer.testing import CliRunner

from laminar_assets.cli import app
from laminar_assets.flows import load_specs
from tests.cli_in_process import run_in_process
from tests.reference import assert_frames_match, full_recompute, sql_recompute

SPECS = {s.name: s for s in load_specs()}


def invoke(*args, home):
    result = CliRunner().invoke(app, list(args), env={"DAGSTER_HOME": str(home)}, catch_exceptions=False)
    return result


def test_dag_json_shape(tmp_path):
    out = invoke("--root", str(tmp_path), "dag", "--json", home=tmp_path / "dh")
    assert out.exit_code == 0, out.output
    rows = {r["node"]: r for r in json.loads(out.output)}
    assert set(rows["normalized_trades"]) == {"node", "kind", "inputs", "outputs", "is_shared", "partitioning"}
    assert rows["raw_trades"]["kind"] == "source" and rows["symbols"]["kind"] == "source"
    assert rows["normalized_trades"] == {
        "node": "normalized_trades", "kind": "stage", "inputs": ["raw_trades", "symbols"],
        "outputs": ["large_trades", "ohlc_5m", "positions_1h", "sector_median_1h", "sector_stats_1h",
                    "symbol_activity_15m", "vwap_1m"],
        "is_shared": True, "partitioning": "hourly"}
    assert rows["vwap_1m"]["kind"] == "flow" and rows["vwap_1m"]["outputs"] == []


def run_cli(*args, home):
    """`laminar ARGS` in a fresh process (through `main()`, as the installed command runs): its exit code is the
    process's, after `run_then_exit`. Each such process imports the CLI (Dagster, PySpark) again, seconds of CPU:
    tests of what a command says use `cli(...)`, and these child processes stay where the process itself is
    what is tested (its exit code, a command that runs Dagster or writes tables and then exits, a kill)."""
    env = {**os.environ, "DAGSTER_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "laminar_assets.cli", *args],
                          capture_output=True, text=True, env=env, timeout=120)


def cli(*args, home) -> subprocess.CompletedProcess:
    """`laminar ARGS` in this process, through the entry point's own error handling (tests/cli_in_process.py):
    the code it would exit with, and what it wrote to stdout and stderr, without a child's seconds of imports."""
    return run_in_process(list(args), {"DAGSTER_HOME": str(home)})


def one_error_line(proc) -> str:
    """The single non-blank line on stderr (asserted), without tracebacks."""
    lines = [line for line in proc.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    return lines[0]


def refill_killed_holding_its_slot(root, home, flow: str) -> str:
    """Start `laminar refill FLOW` in a process of its own, kill it (SIGKILL) once its run holds the flow's
    concurrency slot (before its step starts Spark, if it is that quick), and return the run's id."""
    import dagster as dg

    env = {**os.environ, "DAGSTER_HOME": str(home)}
    child = subprocess.Popen([sys.executable, "-m", "laminar_assets.cli", "--root", str(root), "refill", flow],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with dg.DagsterInstance.from_config(str(home)) as instance:
            deadline = time.monotonic() + 300
            while not (slots := instance.event_log_storage.get_concurrency_info(f"laminar_{flow}").claimed_slots):
                assert child.poll() is None, f"the refill ended ({child.returncode}) before it held the slot"
                assert time.monotonic() < deadline, "the refill never held its slot"
                time.sleep(0.1)
    finally:
        child.kill()
        child.wait()
    return slots[0].run_id


@pytest.mark.process
def test_errors_are_one_red_line_and_nonzero(tmp_path):
    (tmp_path / "_laminar").mkdir()  # a lake, so each command gets as far as its own error
    for args, text in [(["explain", "nope"], "unknown flow 'nope'; known flows: large_trades"),
                       (["explain", "vwap-1m"], "unknown flow 'vwap-1m'; did you mean 'vwap_1m'? known flows: "),
                       (["explain", "OHLC_5M"], "unknown flow 'OHLC_5M'; did you mean 'ohlc_5m'? known flows: "),
                       (["refill", "vwap_1m", "--partition-range", "2024-01-02"], "must look like A...B"),
                       (["refill", "vwap_1m", "--partition-range", "2024-01-02...2024-01-03"],
                        "bad partition in --partition-range"),
                       (["status", "--bogus"], "No such option"),
                       (["serve", "--jit", "fast"], "jit must be one of hot, quick, tiered, got 'fast'")]:
        # `serve` in a process of its own: a check that moved after its servers start must not start them here
        proc = (run_cli if args[0] == "serve" else cli)("--root", str(tmp_path), *args, home=tmp_path / "dh")
        assert proc.returncode != 0, args
        assert text in one_error_line(proc), (args, proc.stderr)


@pytest.mark.process
def test_error_line_keeps_bracketed_facts(tmp_path):
    """The `[flow=...]` facts of a LaminarError are text, not rich markup."""
    (tmp_path / "_laminar").mkdir()
    proc = run_cli("--root", str(tmp_path), "explain", "nope", home=tmp_path / "dh")
    assert proc.returncode == 1
    assert one_error_line(proc).endswith("[flow=nope]"), proc.stderr


@pytest.mark.process
def test_failed_refill_is_one_line_naming_flow_range_and_cause(tmp_path):
    """A run that fails inside Dagster: no Dagster log lines or stack traces on the console, one line that
    names the flow, the range and the Laminar error; the failure is still recorded in the Dagster instance."""
    import dagster as dg

    lake, home = tmp_path / "lake", tmp_path / "dh"
    (lake / "_laminar").mkdir(parents=True)  # a lake without tables: the flow's source is missing
    span = "...".join(f"{datetime.now(UTC) - timedelta(hours=h):%Y-%m-%d-%H}:00" for h in (2, 1))  # inside the asset's partitions
    proc = run_cli("--root", str(lake), "refill", "vwap_1m", "--partition-range", span, home=home)
    assert proc.returncode == 1
    line = one_error_line(proc)
    assert "STEP_FAILURE" not in proc.stderr + proc.stdout and "Stack Trace" not in proc.stderr + proc.stdout
    assert "vwap_1m" in line and span in line, line
    assert "source table 'normalized_trades' does not exist" in line and "[table=normalized_trades]" in line, line
    assert "dagster._core" not in line and "Failure:" not in line, line
    with dg.DagsterInstance.from_config(str(home)) as instance:
        [run] = instance.get_runs()
        events = instance.all_logs(run.run_id)
    assert any(e.dagster_event and e.dagster_event.is_step_failure for e in events)


def hour(hours_ago: int, minute: str = "00") -> str:
    return f"{datetime.now(UTC) - timedelta(hours=hours_ago):%Y-%m-%d-%H}:{minute}"


@pytest.mark.parametrize("span,problem", [
    (lambda: f"{hour(1)}...{hour(3)}", "ends before it starts: expected the earlier partition first"),
    (lambda: f"{hour(3, '30')}...{hour(1)}", "(the start of an hour, like '"),
    (lambda: f"{hour(3)}...9999-12-31-23:00", "partition from 1000-01-01-00:00 to 9999-12-30-23:00, found '9999-12-31-23:00'"),
    (lambda: f"0001-01-01-00:00...{hour(1)}", "partition from 1000-01-01-00:00 to 9999-12-30-23:00, found '0001-01-01-00:00'"),
    (lambda: f"2024-01-02-09:00...{hour(1)}", "2024-01-02-09:00 of 'vwap_1m' is before its first partition"),
], ids=["reversed", "half_past", "year_9999", "year_1", "before_start"])
def test_a_bad_refill_range_fails_before_dagster_or_spark_start(tmp_path, monkeypatch, span, problem):
    """Reversed ends failed with IndexError after Spark had started; a start at 16:30 refilled only 17:00
    while echoing 16:30; 9999-12-31-23:00 raised OverflowError. Now each is an error naming the flow,
    raised before any run (the only way to Dagster and Spark here) begins."""
    from laminar_assets.errors import LaminarError
    from laminar_assets.orchestration.internals import in_process

    def no_run(*args, **kwargs):
        raise AssertionError("a Dagster run (and its Spark session) was started")

    monkeypatch.setattr(in_process, "execute_request", no_run)
    lake = tmp_path / "lake"
    (lake / "_laminar").mkdir(parents=True)
    with pytest.raises(LaminarError) as info:
        invoke("--root", str(lake), "refill", "vwap_1m", "--partition-range", span(), home=tmp_path / "dh")
    assert problem in info.value.message and info.value.facts["flow"] == "vwap_1m", info.value


def test_failure_message_of_an_unexpected_exception_is_its_own_first_line():
    """Not a LaminarError: the innermost exception (Dagster wraps it in its own), first line only."""
    import dagster as dg

    from laminar_assets.orchestration.internals.in_process import QUIET_CONSOLE, failure_message

    @dg.asset
    def broken():
        raise ValueError("boom\nsecond line")

    with dg.DagsterInstance.ephemeral() as instance:
        outcome = dg.materialize([broken], instance=instance, raise_on_error=False, run_config=QUIET_CONSOLE)
    assert failure_message(outcome) == "ValueError: boom"


def test_explain_text_keeps_brackets_of_plan_and_spec(tmp_path, monkeypatch):
    """Spark's formatted plan (`Input [9]: [...]`) and user text are printed as they are, not as rich markup."""
    (tmp_path / "_laminar").mkdir()
    import laminar_assets.engine.report as report
    from laminar_assets.cli import CliContext
    from laminar_assets.engine.report.overview import logical

    plan = ("(2) HashAggregate [codegen id : 1]\nInput [9]: [ts#1, sym#2, px#3]\n"
            "Keys [3]: [sym#2, window#30]\nResults [1]: [/sum(px#3)]")
    canned = {
        "logical": {**logical(SPECS["vwap_1m"]), "description": "per [sym] minute", "filter": "sym <> '[x]'"},
        "physical": plan,
        "strategy": {"partition": "2024-01-02-09:00", "mode": "INCREMENTAL", "reason": "NEW_VERSIONS",
                     "detail": "versions [3, 4] of [raw_trades]", "watermark": None, "to_versions": {"raw": 4},
                     "pending_versions": {"raw": 0}, "pending_commits": [], "estimated_read": {},
                     "refill_all": False, "refill": []},
    }
    monkeypatch.setattr(report, "explain", lambda engine, spec, key: canned)
    monkeypatch.setattr(CliContext, "engine", lambda self: None)
    out = invoke("--root", str(tmp_path), "explain", "vwap_1m", "--partition", "2024-01-02-09:00",
                 home=tmp_path / "dh")
    assert out.exit_code == 0, out.output
    for text in ("Input [9]: [ts#1, sym#2, px#3]", "Keys [3]: [sym#2, window#30]", "Results [1]: [/sum(px#3)]",
                 "[codegen id : 1]", "per [sym] minute", "sym <> '[x]'", "versions [3, 4] of [raw_trades]"):
        assert text in out.output, (text, out.output)


def test_quarantine_example_rows_keep_brackets(tmp_path, monkeypatch):
    import laminar_assets.engine.quarantine as quarantine

    (tmp_path / "_laminar" / "quarantine" / "raw_trades").mkdir(parents=True)
    row = '{"sym": "[b]ad", "qty": -1}'
    monkeypatch.setattr(quarantine, "summarize", lambda uri, examples: [
        {"source": "raw_trades", "flow": "normalized_trades", "rule": "positive_quantity", "rows": 1,
         "min_version": 1, "max_version": 1, "examples": [row]}])
    out = invoke("--root", str(tmp_path), "quarantine", home=tmp_path / "dh")
    assert out.exit_code == 0, out.output
    assert '"[b]ad"' in out.output, out.output


@pytest.mark.parametrize("args", [["status"], ["status", "--json"], ["explain", "vwap_1m"], ["quarantine"],
                                  ["refill", "vwap_1m"], ["check"]])
def test_missing_root_is_one_line_naming_it_and_the_fix(tmp_path, args):
    """Commands that read a lake fail on a root that does not exist instead of reporting an empty lake
    (`check` in a process of its own: the process's exit code too)."""
    missing = tmp_path / "nowhere"
    proc = (run_cli if args == ["check"] else cli)("--root", str(missing), *args, home=tmp_path / "dh")
    assert proc.returncode == 1, (args, proc.stdout)
    line = one_error_line(proc)
    assert str(missing) in line and "does not exist" in line and "laminar demo" in line and "--root" in line, line
    assert not proc.stdout.strip(), proc.stdout
    assert not missing.exists()


@pytest.mark.parametrize("args", [["status"], ["check"], ["refill", "vwap_1m"]])
def test_a_root_that_is_some_other_folder_is_refused(tmp_path, args):
    """`--root` pointing at a folder that is not a lake (a file in it, folders without a Delta log): `check`
    said every check passed and `status` showed every source missing, with exit code 0 (`check` in a process
    of its own: the process's exit code too)."""
    other = tmp_path / "project"
    (other / "src").mkdir(parents=True)
    (other / "notes.txt").write_text("hi")
    proc = (run_cli if args == ["check"] else cli)("--root", str(other), *args, home=tmp_path / "dh")
    assert proc.returncode == 1, (args, proc.stdout)
    line = one_error_line(proc)
    assert str(other) in line and "holds no Delta table and no _laminar/ folder" in line and "--root" in line, line
    assert sorted(p.name for p in other.iterdir()) == ["notes.txt", "src"]  # nothing written


@pytest.mark.process
def test_commands_that_create_or_need_no_lake_work_on_a_new_root(tmp_path):
    new = tmp_path / "new" / "lake"
    assert cli("--root", str(new), "dag", home=tmp_path / "dh").returncode == 0
    # `generate` in a process of its own: it writes Delta tables, then the process must end with code 0
    proc = run_cli("--root", str(new), "generate", "--rows", "50", "--batch", "0", home=tmp_path / "dh")
    assert proc.returncode == 0, proc.stderr
    assert "broken " in proc.stdout and "new versions [0]" in proc.stdout, proc.stdout  # what it wrote, counted
    assert (new / "raw_trades").is_dir()


@pytest.mark.parametrize("args, named", [
    (["status", "--bogus"], "--bogus"),
    (["demo", "--rows", "3"], "'--rows'"),
    (["quarantine", "--examples", "many"], "'--examples'"),
    (["explain"], "argument 'flow'"),
    (["explain", "vwap_1m", "--partition"], "'--partition'"),
    (["--root"], "'--root'"),
    (["nosuchcommand"], "'nosuchcommand'"),
])
def test_usage_errors_exit_2_naming_the_option(tmp_path, args, named):
    # one in a process of its own: the process's exit code is 2 too
    proc = (run_cli if args == ["nosuchcommand"] else cli)(*args, home=tmp_path / "dh")
    assert proc.returncode == 2, (args, proc.stderr)
    line = one_error_line(proc)
    assert line.startswith("error: ") and named in line, (args, line)
    assert "--help" in line, line  # where to look next


@pytest.mark.parametrize("option", ["--root", "--flows"])
def test_a_laminar_option_after_the_command_says_where_it_goes(tmp_path, option):
    """`laminar serve --root X`: typer's "No such option" alone sent the user to `laminar serve --help`, which does
    not list it."""
    proc = cli("serve", option, str(tmp_path), home=tmp_path / "dh")
    assert proc.returncode == 2
    line = one_error_line(proc)
    assert f"{option} is an option of `laminar` itself and goes before the command: `laminar {option} ... serve" in line


def test_no_arguments_shows_help_without_an_error_line(tmp_path):
    proc = cli(home=tmp_path / "dh")
    assert proc.returncode == 2
    assert "Usage" in proc.stdout + proc.stderr and "error:" not in proc.stdout + proc.stderr


@pytest.fixture
def demo_base():
    """A folder for the demo outside pytest's temporary root: the demo's embedded Postgres runs as pgserver's own
    user when the tests run as root, and every pytest process that starts closes that root to other users."""
    import shutil
    import tempfile
    from pathlib import Path

    base = Path(tempfile.mkdtemp(prefix="laminar-demo-test-"))
    yield base
    shutil.rmtree(base, ignore_errors=True)


def assert_exports_delivered(root) -> None:
    """The demo's exports delivered (its embedded targets, #61): the embedded Postgres, started again on the data
    the demo left, holds exactly vwap_1m's rows, and the receiver got every row large_trades holds."""
    import psycopg
    from deltalake import DeltaTable

    from laminar_assets.deploy.embedded_targets import embedded_folder, start_embedded_targets
    from laminar_assets.flows import load_exports

    sink = DeltaTable(str(root / "vwap_1m")).to_pyarrow_table()
    columns = sink.column_names
    expected = sorted(tuple(r[c] for c in columns) for r in sink.to_pylist())
    environ: dict[str, str] = {}
    postgres = [e for e in load_exports() if e.kind == "postgres"]
    with start_embedded_targets(postgres, embedded_folder(str(root)), environ=environ), \
            psycopg.connect(environ["LAMINAR_CONNECTION_ANALYTICS_URL"]) as conn:
        got = sorted(conn.execute(f"SELECT {', '.join(columns)} FROM public.vwap_1m").fetchall())
        delivered = conn.execute("SELECT delivered_version FROM laminar_exports WHERE export = 'vwap_1m_pg'").fetchone()
    assert len(got) == len(expected) > 0 and got == expected
    assert delivered == (DeltaTable(str(root / "vwap_1m")).version(),)

    received: dict = {}
    with open(os.path.join(embedded_folder(str(root)), "webhooks", "alerts.jsonl")) as fh:
        for line in fh:
            request = json.loads(line)
            assert len(request["idempotency_key"]) == 64  # the request's own key
            events = request["body"].get("events", [request["body"]])  # rows_per_request > 1: a list of them
            assert len(events) <= next(e.rows_per_request for e in load_exports() if e.kind == "webhook")
            for event in events:
                assert len(event["idempotency_key"]) == 64
                if event["op"] == "insert":  # retractions="skip": a cancelled trade's alert stays sent
                    received[event["row"]["trade_id"]] = event["row"]
    large = DeltaTable(str(root / "large_trades")).to_pyarrow_table().to_pylist()
    assert large and {r["trade_id"] for r in large} <= set(received)
    assert all(received[r["trade_id"]]["notional"] == r["notional"] for r in large)


@pytest.mark.spark
def test_demo_then_status_explain_refill_generate(spark, demo_base):
    root, home = demo_base / "lake", demo_base / "dh"
    out = invoke("--root", str(root), "demo", "--rows", "200", home=home)
    assert out.exit_code == 0, out.output
    assert "exports: what the demo delivered" in out.output and "vwap_1m_pg" in out.output
    assert_exports_delivered(root)
    assert "batch 2" in out.output and "RETRACTABLE_CHANGES" in out.output and "NO_WATERMARK" in out.output
    assert "laminar serve" in out.output  # the next step: the deployment
    # every flow's sink equals a full recompute of its input after the second batch
    from deltalake import DeltaTable

    stage = DeltaTable(str(root / "normalized_trades")).to_pyarrow_table()
    for name in ("vwap_1m", "ohlc_5m", "sector_stats_1h", "positions_1h"):
        spec = SPECS[name]
        expected = full_recompute(spark, spec, stage)
        assert_frames_match(DeltaTable(str(root / name)).to_pandas(), expected, spec.keys)
    for name in ("symbol_activity_15m", "sector_median_1h"):  # SQL views: against their own SELECT run by Spark
        assert_frames_match(DeltaTable(str(root / name)).to_pandas(), sql_recompute(spark, SPECS[name], stage),
                            SPECS[name].keys)
    assert "QUERY_NOT_INCREMENTAL" in out.output  # sector_median_1h after the second batch (the column may cut it)
    large = DeltaTable(str(root / "large_trades")).to_pandas()
    assert sorted(large["trade_id"]) == sorted(t for t, n in zip(stage["trade_id"].to_pylist(),
                                                                  stage["notional"].to_pylist()) if n > 250_000)

    # the broken rows of both batches (negative quantity, then zero price) are quarantined, not aggregated
    quarantined = json.loads(invoke("--root", str(root), "quarantine", "--json", home=home).output)
    assert {(q["source"], q["flow"], q["rule"]) for q in quarantined} >= {
        ("raw_trades", "normalized_trades", "positive_quantity"), ("raw_trades", "normalized_trades", "positive_price")}
    assert all(q["examples"] for q in quarantined)
    assert min(stage["quantity"].to_pylist()) > 0 and min(stage["price"].to_pylist()) > 0
    assert "quarantined" in out.output

    status = json.loads(invoke("--root", str(root), "status", "--json", home=home).output)
    vwap = next(r for r in status if r["flow"] == "vwap_1m")
    assert set(vwap) == {"flow", "kind", "source_versions", "partitions_materialized", "stale_partitions",
                         "pending_versions", "partitions", "rates", "failing_partitions", "held_partitions"}
    assert vwap["failing_partitions"] == [] and vwap["held_partitions"] == []  # every run let go of its partitions
    # batch 1 filled every partition (NO_WATERMARK), batch 2 merged its corrections into vwap_1m
    rates = vwap["rates"]
    assert rates["refills_by_reason"].get("NO_WATERMARK", 0) >= 5 and rates["incremental"] >= 1
    assert rates["partition_runs"] == rates["incremental"] + rates["refill"] + rates["noop"]
    # 08:00 too: the run spans 08:00-12:00 for every asset (hopping windows reach back); it holds no rows
    assert vwap["partitions_materialized"] == 5 and vwap["stale_partitions"] == []
    # versions behind, not stale: later stage commits that touched none of this partition's windows
    assert vwap["pending_versions"] == max(max(p["versions_behind"].values()) for p in vwap["partitions"])
    # the stage's watermark holds the dimension's version too, so its status shows it, up to date
    stage_status = next(r for r in status if r["flow"] == "normalized_trades")
    assert set(stage_status["source_versions"]) == {"raw_trades", "symbols"}
    assert all(p["watermark"]["symbols"] == 0 and p["versions_behind"]["symbols"] == 0
               for p in stage_status["partitions"])

    # the demo's data starts a few hours before now: its first hour is the stage's first event time
    first = min(stage["event_time"].to_pylist()).replace(minute=0, second=0, microsecond=0)
    hour0, hour1 = (f"{first + timedelta(hours=h):%Y-%m-%d-%H:%M}" for h in (0, 1))
    report = json.loads(invoke("--root", str(root), "explain", "ohlc_5m", "--partition", hour1,
                               "--json", home=home).output)
    assert set(report) == {"logical", "physical", "strategy"}
    # open/high/low/close retract while a row holding the extreme is left; volume (a sum) always
    assert [(a["kind"], a["retractable"]) for a in report["logical"]["aggregates"]] == [
        ("first", True), ("max", True), ("min", True), ("last", True), ("sum", True)]
    assert "HashAggregate" in report["physical"] or "Aggregate" in report["physical"]
    assert report["strategy"]["mode"] == "NOOP" and report["strategy"]["reason"] == "NO_NEW_VERSIONS"

    text = invoke("--root", str(root), "explain", "sector_median_1h", "--partition", hour1, home=home).output
    for part in ("== sql == (laminar_assets/flows/trade_activity.sql:", "PERCENTILE(price, 0.5) AS median_price",
                 "== logical == (compiled from the SQL)", "median_price = PERCENTILE(price, 0.5)  state",
                 "refill-only: PERCENTILE(price, 0.5)", "== strategy =="):
        assert part in text, (part, text)

    generated = invoke("--root", str(root), "generate", "--rows", "50", "--batch", "2", home=home)
    assert generated.exit_code == 0 and "new versions" in generated.output
    stale = json.loads(invoke("--root", str(root), "status", "--json", home=home).output)
    [stage_status] = [r for r in stale if r.get("flow") == "normalized_trades"]  # exports' rows come last
    assert stage_status["stale_partitions"], stage_status
    key = stage_status["stale_partitions"][0]["partition"]
    text = invoke("--root", str(root), "explain", "normalized_trades", "--partition", key, home=home).output
    assert "== logical ==" in text and "== physical ==" in text and "== strategy ==" in text
    assert "Input [" in text and "]: [" in text  # Spark's column lists survive the console
    assert ("INCREMENTAL" in text or "REFILL" in text) and "NOOP" not in text

    # a refill killed (kill -9) while its run holds vwap_1m's concurrency slot does not wedge the flow:
    # the next refill fails that run and takes the slot (it used to wait forever, spinning)
    killed_run = refill_killed_holding_its_slot(root, home, "vwap_1m")
    refilled = invoke("--root", str(root), "refill", "vwap_1m", "--partition-range", f"{hour0}...{hour1}",
                      home=home)
    assert refilled.exit_code == 0, refilled.output
    assert "2 partition(s)" in refilled.output and "FORCED_BY_USER" in refilled.output
    assert f"run {killed_run} was left STARTED by a process that is gone" in refilled.output, refilled.output
    import dagster as dg

    with dg.DagsterInstance.from_config(str(home)) as instance:
        assert instance.get_run_by_id(killed_run).status == dg.DagsterRunStatus.FAILURE
        assert instance.event_log_storage.get_concurrency_info("laminar_vwap_1m").claimed_slots == []
    from laminar_assets.checkpoints import CheckpointStore

    assert CheckpointStore(str(root)).load("vwap_1m", hour0).last_reason == "FORCED_BY_USER"

    # the quality gate: every contract and equivalence check passes (equivalence compares at each
    # partition's watermark versions, so partitions left stale by `generate` are still comparable)
    checked = invoke("--root", str(root), "check", "--json", home=home)
    assert checked.exit_code == 0, checked.output
    results = json.loads(checked.output)
    assert {r["check"] for r in results} == {"contract", "equivalence", "integrity", "sink owner", "runs"}
    assert all(r["passed"] for r in results)
    assert {r["asset"] for r in results if r["check"] == "sink owner"} == set(SPECS)  # each sink its flow's own
    integrity = {r["partition"] for r in results if r["check"] == "integrity"}
    assert {"vwap_1m", "normalized_trades", "quarantine of raw_trades"} <= integrity
    assert any(t.startswith("vwap_1m state ") for t in integrity)

    # a table that names a missing file: `laminar check` says which table, version and file, before a reader does
    sink = DeltaTable(str(root / "vwap_1m"))
    lost = sink.file_uris()[0]
    os.remove(lost.removeprefix("file://"))
    broken = cli("--root", str(root), "check", "--json", home=home)  # this process's Spark, not a JVM of its own
    assert broken.returncode == 1
    [bad] = [r for r in json.loads(broken.stdout) if r["check"] == "integrity" and not r["passed"]]
    assert bad["asset"] == "vwap_1m" and bad["partition"] == "vwap_1m"
    assert f"vwap_1m at {root / 'vwap_1m'}, version {sink.version()}: 1 of the" in bad["details"]
    assert os.path.basename(lost) in bad["details"]
    last = broken.stderr.strip().splitlines()[-1]
    assert "checks failed" in last and "integrity on vwap_1m" in last and "Traceback" not in broken.stderr


def test_a_misspelled_setting_stops_every_command_before_it_runs(tmp_path, monkeypatch):
    """`status`, `dag`, `sql` and `generate` read no setting of their own and ran (generate even committed) with
    a misspelled `[tool.laminar]` key that every Dagster run would then refuse (a careless-user review)."""
    project = tmp_path / "pyproject.toml"
    project.write_text("[tool.laminar]\nfuture_horizion = '1d'\n")
    monkeypatch.setattr("laminar_assets.pipeline.settings.project_file", lambda *a, **k: project)
    lake = tmp_path / "lake"
    for args in (["status"], ["dag"], ["sql", "SELECT 1"], ["generate", "--batch", "1", "--rows", "50"]):
        proc = cli("--root", str(lake), *args, home=tmp_path / "dh")
        assert proc.returncode == 1, (args, proc.stdout)
        assert f"{project} [tool.laminar]: future_horizion: not a setting (did you mean 'future_horizon'? " \
            in one_error_line(proc), (args, proc.stderr)
    assert not lake.exists()  # nothing was written
