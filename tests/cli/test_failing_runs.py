"""`laminar status` and `laminar check` report a partition whose latest runs failed, with the error
(issue 66: a flow failing on every run showed a stale reason, and check said 0 failed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import write_deltalake
from typer.testing import CliRunner

from laminar_assets.cli import app
from laminar_assets.engine import Agg, Engine, FlowSpec, LaminarError, SchemaMismatchError, Tumbling
from tests.conftest import trades_frame

pytestmark = pytest.mark.spark

PART = "2024-01-01-00:00"
FLOW = FlowSpec(name="f", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.count(), Agg.sum("px")))
ROWS = [("2024-01-01 00:01:00", "a", 1.0, 1)]


def cli(tmp_path, lake, *args):
    flows = tmp_path / "flows"  # a folder of specs, as `--flows` names it
    if not flows.exists():
        flows.mkdir()
        (flows / "f.py").write_text(
            "from laminar_assets.engine import Agg, FlowSpec, Tumbling\n"
            "f = FlowSpec(name='f', source='trades', event_time='ts', window=Tumbling('10m'), keys=('sym',),\n"
            "             aggregates=(Agg.count(), Agg.sum('px')))\n")
    return CliRunner().invoke(app, ["--root", lake.root, "--flows", str(flows), *args],
                              env={"DAGSTER_HOME": str(tmp_path / "dh")})


def test_status_and_check_name_the_partition_whose_runs_fail(spark, lake, tmp_path):
    engine = Engine(spark, lake.root)
    lake.create("trades", ROWS)
    engine.run(FLOW, PART)
    write_deltalake(lake.path("trades"), trades_frame(ROWS).astype({"px": "string"}), mode="overwrite",
                    schema_mode="overwrite")
    for _ in range(2):
        with pytest.raises(SchemaMismatchError):
            engine.run(FLOW, PART)

    out = cli(tmp_path, lake, "status", "--json")
    assert out.exit_code == 0, out.output
    [row] = json.loads(out.output)
    [failing] = row["failing_partitions"]
    assert failing["partition"] == PART and failing["count"] == 2
    assert "needs a numeric column, found string" in failing["error"] and failing["since"] <= failing["last_at"]
    text = cli(tmp_path, lake, "status").output
    assert "the last 2 runs failed" in text and "needs a numeric column" in text, text  # wrapped in its cell

    checked = cli(tmp_path, lake, "check", "--json")
    assert checked.exit_code != 0 and isinstance(checked.exception, LaminarError)
    assert "runs on f 2024-01-01-00:00" in str(checked.exception), checked.exception
    [runs] = [r for r in json.loads(checked.output) if r["check"] == "runs"]
    assert (runs["asset"], runs["partition"], runs["passed"]) == ("f", PART, False)
    assert "the last 2 runs failed" in runs["details"] and "found string" in runs["details"]

    write_deltalake(lake.path("trades"), trades_frame(ROWS), mode="overwrite", schema_mode="overwrite")
    engine.run(FLOW, PART)  # a successful run clears the record
    [row] = json.loads(cli(tmp_path, lake, "status", "--json").output)
    assert row["failing_partitions"] == [] and row["partitions"][0]["failed_runs"] is None


def test_check_names_a_damaged_sink_log_and_goes_on_with_the_other_checks(spark, lake, tmp_path):
    """A sink whose newest commit file was cut short: `laminar check` reports the table and the file (the owner
    check and the integrity check both fail on it) instead of stopping at deltalake's error; `status` still
    answers."""
    lake.create("trades", ROWS)
    Engine(spark, lake.root).run(FLOW, PART)
    entry = max(Path(lake.root).glob("f/_delta_log/*.json"))
    entry.write_bytes(entry.read_bytes()[:-40])
    checked = cli(tmp_path, lake, "check", "--json")
    assert checked.exit_code != 0 and isinstance(checked.exception, LaminarError), checked.output
    rows = {(r["check"], r["partition"]): r for r in json.loads(checked.output)}
    for key in (("sink owner", "f"), ("integrity", "f")):
        assert not rows[key]["passed"] and "is damaged" in rows[key]["details"] and entry.name in rows[key]["details"]
    assert rows[("runs", PART)]["passed"]  # the other checks ran
    assert cli(tmp_path, lake, "status", "--json").exit_code == 0


@pytest.mark.parametrize("command", [["status"], ["check"]])
def test_a_wrong_local_copies_setting_is_one_line_before_anything_is_read(s3_lake, tmp_path, monkeypatch, command):
    """A careless `LAMINAR_CACHE_MAX_MB=abc` on a lake in a bucket: `laminar status` showed every flow as ERROR
    (the reason only in --json); now both commands stop at once, naming the setting."""
    s3_lake.create("trades", ROWS)
    monkeypatch.setenv("LAMINAR_CACHE_MAX_MB", "abc")
    out = cli(tmp_path, s3_lake, *command)
    assert out.exit_code != 0 and isinstance(out.exception, LaminarError), out.output
    assert "LAMINAR_CACHE_MAX_MB is 'abc': expected a number of megabytes" in str(out.exception)
