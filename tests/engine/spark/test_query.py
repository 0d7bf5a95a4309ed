"""sql_query.Query: SQL text over named DataFrames, run as one statement."""

from __future__ import annotations

import pytest

from laminar_assets.engine.spark.query import Query, frame, union_all


def _fake(name: str) -> Query:
    return Query(f"\x00{name}\x00", {name: object()}, ("a", "b"))


def test_filters_and_new_columns_share_a_select_until_one_refers_to_another():
    q = _fake("t").where("a > 0").add_columns([("c", "a + 1")]).where("b < 5")
    assert q.text.count("SELECT") == 1 and q.columns == ("a", "b", "c")
    nested = q.where("c > 2")  # refers to a column this SELECT adds: it must filter the SELECT's output
    assert nested.text.count("SELECT") == 2 and nested.text.endswith("WHERE (c > 2)")
    assert _fake("t").add_columns([("c", "1")]).add_columns([("d", "c * 2")]).text.count("SELECT") == 2
    assert _fake("t").add_columns([("c", "1")]).add_columns([("d", "cc * 2")]).text.count("SELECT") == 1


def test_replacing_a_column_keeps_its_place_and_later_columns_see_the_new_value():
    q = _fake("t").with_columns([("a", "a * 10"), ("d", "a + 1")])
    assert q.columns == ("a", "b", "d")
    assert "a * 10 AS `a`, `b`" in q.text and q.text.startswith("SELECT *, a + 1 AS `d` FROM (SELECT a * 10")


def test_grouped_and_hinted_selects_are_closed():
    g = _fake("t").select(["a", "count(1) AS n"], group=["a"], columns=("a", "n"))
    assert g.where("n > 1").text.count("SELECT") == 2
    h = _fake("t").select(["*"], hint="COALESCE(1)")
    assert h.add_columns([("c", "1")]).text.count("SELECT") == 2


@pytest.mark.spark
def test_braces_in_the_sql_reach_spark_as_written(spark):
    rows = frame("t", spark.range(3), ("id",)).where("'{x}' = concat('{', 'x}')").add_columns([("s", "'{}'")])
    both = union_all([rows.select(["id", "s"]), frame("u", spark.range(1), ("id",)).select(["id", "'{0}' AS s"])])
    assert sorted((r.id, r.s) for r in both.run(spark).collect()) == [(0, "{0}"), (0, "{}"), (1, "{}"), (2, "{}")]


@pytest.mark.spark
def test_a_comment_in_a_users_expression_ends_with_it(spark, lake):
    """A `--` comment in a rule, filter, derived or post expression ends at the expression's end, not
    at the end of the one SQL statement it is embedded in (which it would otherwise cut short)."""
    from laminar_assets.engine import Agg, Engine, FlowSpec, RowRule, Tumbling
    from tests.reference import assert_frames_match, full_recompute

    flow = FlowSpec(name="c", source="trades", event_time="ts", window=Tumbling("10m"), keys=("sym",),
                    aggregates=(Agg.count(), Agg.sum("d", name="d_sum")), derived={"d": "px * 2 -- doubled"},
                    filter="px > 0 -- positive prices", rules=(RowRule("pos", "qty > 0 -- no shorts"),),
                    post={"avg_d": "d_sum / `count` -- per row"})
    lake.create("trades", [("2024-01-01 00:01:00", "a", 10.0, 1), ("2024-01-01 00:02:00", "a", 11.0, -2),
                           ("2024-01-01 00:03:00", "b", -1.0, 3)])
    r = Engine(spark, lake.root).run(flow, "2024-01-01-00:00")
    assert r.metrics["rows_rejected"] == 1
    expected = full_recompute(spark, flow, lake.table("trades").to_pyarrow_table())
    assert_frames_match(lake.read(flow.sink), expected.reset_index(drop=True), flow.keys)
