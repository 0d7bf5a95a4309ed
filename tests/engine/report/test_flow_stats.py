"""Hit and fallback rates from real runs: every partition run leaves an outcome record (NOOPs too),
summed per flow by `flow_stats`, shown by `laminar status` and `laminar_system.flow_stats`."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pandas as pd
import pytest

from laminar_assets.engine import Agg, Engine, FlowSpec, Tumbling
from laminar_assets.engine.report import stats_by_flow
from laminar_assets.engine.report import system_tables as st
from laminar_assets.engine.run.outcomes import read_outcomes
from tests.conftest import Lake

pytestmark = pytest.mark.spark

PART = "2024-01-01-00:00"
HIGH = FlowSpec(name="highs", source="raw", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                aggregates=(Agg.max("px", name="high"), Agg.count(name="trades")))


def raw(rows) -> pd.DataFrame:
    df = pd.DataFrame(rows, columns=["trade_id", "ts", "sym", "px"])
    df["ts"] = pd.to_datetime(df["ts"], utc=True).astype("datetime64[us, UTC]")
    return df.astype({"trade_id": "int64", "px": "float64"})


@pytest.fixture(scope="module")
def ran(spark, tmp_path_factory):
    """Four runs of one partition: the first (REFILL, NO_WATERMARK), an append (INCREMENTAL), nothing
    new (NOOP), and a delete of the only row holding a window's high (EXTREME_RETRACTED: REFILL of that window)."""
    lake = Lake(str(tmp_path_factory.mktemp("stats") / "lake"))
    lake.create("raw", frame=raw([(1, "2024-01-01 00:01:00", "AAA", 10.0), (2, "2024-01-01 00:02:00", "AAA", 12.0),
                                  (3, "2024-01-01 00:31:00", "BBB", 20.0)]))
    engine = Engine(spark, lake.root)
    results = [engine.run(HIGH, PART)]
    lake.append("raw", frame=raw([(4, "2024-01-01 00:45:00", "BBB", 21.0)]))
    results.append(engine.run(HIGH, PART))
    results.append(engine.run(HIGH, PART))
    lake.delete("raw", "trade_id = 2")
    results.append(engine.run(HIGH, PART))
    return lake, engine, results


def test_every_partition_run_is_recorded_with_its_mode_and_reason(ran):
    lake, _, results = ran
    records = read_outcomes(lake.root, "highs")
    assert [r["run_id"] for r in records] == [x.run_id for x in results]
    got = [(p["mode"], p["reason"]) for r in records for p in r["partitions"]]
    assert got == [(x.mode.value, x.reason.value) for x in results]
    assert [m for m, _ in got] == ["REFILL", "INCREMENTAL", "NOOP", "REFILL"]
    assert got[-1][1] == "EXTREME_RETRACTED"
    first, append, noop, delete = (r["partitions"][0] for r in records)
    assert first["refilled_windows"] == 6 and first["refilled_share"] == 1.0  # the whole hour of 10-minute windows
    assert delete["refilled_windows"] == 1 and delete["refilled_share"] == pytest.approx(1 / 6, abs=1e-6)
    assert append["refilled_windows"] == 0 and append["change_rows"] == 1 and append["rows_read"] == 1
    assert noop["change_rows"] == 0 and noop["rows_read"] == 0
    assert first["change_rows"] == 3 and delete["change_rows"] >= 1
    # a period: nothing recorded before the runs or after now
    assert read_outcomes(lake.root, "highs", until=datetime(2020, 1, 1, tzinfo=UTC)) == []
    assert read_outcomes(lake.root, "highs", since=datetime.now(UTC) + timedelta(seconds=1)) == []


def test_rates_sum_the_records(ran):
    lake, _, results = ran
    [stats] = stats_by_flow(lake.root, [HIGH])
    assert (stats.runs, stats.partition_runs, stats.incremental, stats.refill, stats.noop) == (4, 4, 1, 2, 1)
    assert (stats.share(stats.incremental), stats.share(stats.refill), stats.share(stats.noop)) == (0.25, 0.5, 0.25)
    assert stats.hit_rate == pytest.approx(1 / 3, abs=1e-4)
    assert stats.refills_by_reason == {results[0].reason.value: 1, results[3].reason.value: 1}
    assert stats.windows_per_refill == 3.5  # (6 + 1) / 2
    read = sum(x.metrics.get("rows_read", 0) for x in results)
    assert stats.rows_read == read and stats.rows_read_per_change == round(read / stats.change_rows, 2)
    [empty] = stats_by_flow(lake.root, [HIGH], since=datetime.now(UTC) + timedelta(hours=1))
    assert empty.partition_runs == 0 and empty.hit_rate is None


def test_system_tables_show_outcomes_and_daily_stats(ran):
    lake, engine, results = ran
    got = st.run_query(engine.spark, lake.root, [HIGH], "SELECT * FROM laminar_system.flow_outcomes ORDER BY at")
    rows = [dict(zip(got.columns, r)) for r in got.rows]
    assert [(r["run_id"], r["mode"], r["reason"]) for r in rows] == \
        [(x.run_id, x.mode.value, x.reason.value) for x in results]
    got = st.run_query(engine.spark, lake.root, [HIGH], "SELECT * FROM laminar_system.flow_stats")
    [day] = [dict(zip(got.columns, r)) for r in got.rows]
    [stats] = stats_by_flow(lake.root, [HIGH])
    assert day["day"] == datetime.now(UTC).date() or day["day"] == rows[0]["at"].date()
    assert {k: day[k] for k in ("runs", "partition_runs", "incremental", "refill", "noop", "hit_rate",
                                "refills_by_reason", "windows_per_refill")} == \
        {k: stats.to_json()[k] for k in ("runs", "partition_runs", "incremental", "refill", "noop", "hit_rate",
                                         "refills_by_reason", "windows_per_refill")}


def test_laminar_status_shows_the_rates(ran, tmp_path):
    from tests.cli.test_cli import invoke

    lake = ran[0]
    flows = tmp_path / "flows"  # a dg project's flows folder, as `--flows` names it
    flows.mkdir()
    (flows / "highs.py").write_text(
        "from laminar_assets.engine import Agg, FlowSpec, Tumbling\n"
        "highs = FlowSpec(name='highs', source='raw', event_time='ts', window=Tumbling('10m'), keys=('sym',),\n"
        "                 aggregates=(Agg.max('px', name='high'), Agg.count(name='trades')))\n")
    common = ("--root", lake.root, "--flows", str(flows), "status")
    out = invoke(*common, "--json", "--since", "1h", home=tmp_path / "dh")
    assert out.exit_code == 0, out.output
    [row] = json.loads(out.output)
    assert row["rates"]["partition_runs"] == 4 and row["rates"]["hit_rate"] == pytest.approx(1 / 3, abs=1e-4)
    text = invoke(*common, home=tmp_path / "dh").output
    assert "hit rate" in text and "33%" in text and "partition runs, since" in text
    bad = invoke(*common, "--since", "soon", home=tmp_path / "dh")
    assert bad.exit_code != 0 and "expected a duration like '1m'" in bad.output and "(or 'all')" in bad.output
    assert bad.output.count("expected a duration") == 1, bad.output  # said once, not twice in one line
