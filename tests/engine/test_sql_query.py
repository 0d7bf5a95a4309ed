"""sql_query.Query: SQL text over named DataFrames, run as one statement."""

from __future__ import annotations

import pytest

from laminar_assets.engine.sql_query import Query, frame, union_all


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
