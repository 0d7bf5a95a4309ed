"""`laminar status` and `laminar check` report a partition whose latest runs failed, with the error
(issue 66: a flow failing on every run showed a stale reason, and check said 0 failed)."""

from __future__ import annotations

import json

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
