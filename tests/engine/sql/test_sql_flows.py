"""SQL-defined flows run like Python ones: the demo pipeline in SQL gives the same sinks, and a query
Laminar cannot maintain incrementally recomputes exactly the windows its changes touch."""

from __future__ import annotations

import pandas as pd
import pytest

from laminar_assets.contracts import CONTRACTS, load_contracts, with_contract_rules
from laminar_assets.demo.generator import BatchOptions, write_batch
from laminar_assets.engine import Engine, Mode, Reason, StageSpec
from laminar_assets.engine.sql.views import compile_sql, compile_sql_file
from laminar_assets.errors import SpecError
from laminar_assets.flows import load_specs
from tests.conftest import Lake
from tests.engine.sql.test_sql_views import PIPELINE_SQL
from tests.reference import assert_frames_match, sql_recompute

pytestmark = pytest.mark.spark
KEYS = ["2024-01-02-08:00", "2024-01-02-09:00", "2024-01-02-10:00", "2024-01-02-11:00", "2024-01-02-12:00"]


def _pipeline(spark, root: str, specs) -> dict:
    """Both demo batches through `specs`; returns every sink as pandas."""
    engine = Engine(spark, root)
    write_batch(root, BatchOptions(rows=150, seed=11), batch=0)
    for spec in specs:
        engine.run_many(spec, KEYS)
    write_batch(root, BatchOptions(rows=60, seed=11, late_share=0.3, update_share=0.1, delete_share=0.1), batch=1)
    for spec in specs:
        engine.run_many(spec, KEYS)
    return {s.sink: Lake(root).read(s.sink) for s in specs}


def test_demo_pipeline_in_sql_gives_the_same_sinks_as_in_python(spark, tmp_path):
    contracts = load_contracts(CONTRACTS)
    python = [s for s in load_specs() if not s.origin.endswith(".sql") and ".sql:" not in s.origin]
    sql = [with_contract_rules(s, contracts) for s in compile_sql_file(PIPELINE_SQL)]
    by_name = {s.name: s for s in sql}
    sql = [by_name[s.name] for s in python]  # same graph order
    got_python = _pipeline(spark, str(tmp_path / "py"), python)
    got_sql = _pipeline(spark, str(tmp_path / "sql"), sql)
    for spec in python:
        expected, actual = got_python[spec.sink], got_sql[spec.sink]
        assert len(expected) > 0, spec.name
        if isinstance(spec, StageSpec):  # rows, not windows: compare in trade_id order
            order = lambda df: df[sorted(df.columns)].sort_values("trade_id").reset_index(drop=True)  # noqa: E731
            pd.testing.assert_frame_equal(order(actual), order(expected))
        else:
            assert_frames_match(actual, expected, list(spec.keys), rel=0)


REFILL_ONLY = """
CREATE MATERIALIZED VIEW medians AS
SELECT sym, TUMBLE(ts, INTERVAL '15' MINUTE), PERCENTILE(px, 0.5) AS median_px, COUNT(*) AS n,
       SUM(px * qty) / SUM(qty) AS vwap,
       RANK() OVER (PARTITION BY TUMBLE(ts, INTERVAL '15' MINUTE) ORDER BY COUNT(*) DESC, sym) AS busiest
FROM trades GROUP BY sym, TUMBLE(ts, INTERVAL '15' MINUTE)
"""


def test_refill_only_query_recomputes_exactly_the_touched_windows(spark, lake):
    (spec,) = compile_sql(REFILL_ONLY, origin="test.sql")
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1), ("2024-01-01 00:10:00", "b", 2.0, 2),
                           ("2024-01-01 00:40:00", "a", 5.0, 2), ("2024-01-01 00:50:00", "b", 7.0, 3)])
    engine = Engine(spark, lake.root)
    part = "2024-01-01-00:00"
    (first,) = engine.run_many(spec, [part])
    assert (first.mode, first.reason) == (Mode.REFILL, Reason.NO_WATERMARK)

    lake.append("trades", [("2024-01-01 00:05:00", "a", 3.0, 1)])  # an append into the first window only
    plan = engine.plan(spec, part)
    assert (plan.mode, plan.reason) == (Mode.REFILL, Reason.QUERY_NOT_INCREMENTALIZABLE)
    assert plan.detail.startswith("QUERY_NOT_INCREMENTALIZABLE: PERCENTILE(px, 0.5)")
    assert [(f"{r.start:%H:%M}", f"{r.end:%H:%M}") for r in plan.refill] == [("00:00", "00:15")]  # window starts
    assert not plan.refill_all
    engine.run_many(spec, [part])
    lake.delete("trades", "px = 7.0")  # a delete in the last window
    (last,) = engine.run_many(spec, [part])
    assert last.reason is Reason.QUERY_NOT_INCREMENTALIZABLE
    assert [(f"{r.start:%H:%M}", f"{r.end:%H:%M}") for r in last.plan.refill] == [("00:45", "01:00")]
    expected = sql_recompute(spark, spec, lake.table("trades").to_pyarrow_table())
    assert_frames_match(lake.read("medians"), expected, ["sym"])


def test_an_aggregate_that_does_not_compile_names_the_flow_and_expression(spark, lake):
    (spec,) = compile_sql("CREATE MATERIALIZED VIEW bad AS SELECT TUMBLE(ts, INTERVAL '1' MINUTE), "
                          "PERCENTILE(no_such_column, 0.5) AS m FROM trades GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE)",
                          origin="bad.sql")
    lake.create("trades", [("2024-01-01 00:01:00", "a", 1.0, 1)])
    with pytest.raises(SpecError, match=r"aggregate m = PERCENTILE\(no_such_column, 0.5\) of flow 'bad' does not "
                                        r"compile against 'trades'"):
        Engine(spark, lake.root).run_many(spec, ["2024-01-01-00:00"])
