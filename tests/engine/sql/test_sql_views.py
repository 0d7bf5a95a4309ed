"""CREATE MATERIALIZED VIEW statements compile to the same specs a Python module declares (no Spark)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from laminar_assets.contracts import CONTRACTS, load_contracts, with_contract_rules
from laminar_assets.engine import Agg, FlowSpec, Hopping, StageSpec, Tumbling
from laminar_assets.engine.registry import collect_specs
from laminar_assets.engine.sql.views import compile_sql, compile_sql_file
from laminar_assets.errors import LaminarError, SpecError, SqlDefinitionError
from laminar_assets.flows import load_specs

PIPELINE_SQL = os.path.join(os.path.dirname(__file__), "..", "..", "..", "docs", "sql", "trades_pipeline.sql")


def one(text: str):
    (spec,) = compile_sql(text, origin="t.sql")
    return spec


def test_demo_pipeline_in_sql_compiles_to_the_python_specs():
    """The SQL file and the Python modules define the same flows: equal spec hashes (the hash covers
    everything that changes results), so the engine treats them as one definition."""
    contracts = load_contracts(CONTRACTS)
    python = {s.name: s for s in load_specs()}
    sql = [with_contract_rules(s, contracts) for s in compile_sql_file(PIPELINE_SQL)]
    assert {s.name for s in sql} == {"normalized_trades", "large_trades", "vwap_1m", "ohlc_5m", "positions_1h",
                                      "sector_stats_1h"}
    for spec in sql:
        assert spec.spec_hash == python[spec.name].spec_hash, spec.name
        assert spec.origin.endswith(".sql:" + spec.origin.rsplit(":", 1)[1]) and spec.definition.startswith("CREATE")


def test_flow_parts_map_from_the_select_list():
    spec = one("""
        CREATE MATERIALIZED VIEW f PARTITIONED BY DAY COMMENT 'd' WITH (refresh = 'full', target_lag = '5m',
                                                                  start = '2026-11-01') AS
        SELECT sym, TUMBLE(ts, INTERVAL '30' MINUTE), SUM(px * qty) AS notional, SUM(qty) AS volume,
               SUM(px * qty) / SUM(qty) AS vwap, MIN_BY(px, ts) AS first_px, COUNT(DISTINCT acct) AS accts,
               TOP_K(px, 3) AS top3, APPROX_TOP_K(acct, 2, 50) AS busiest, COUNT(*) AS n
        FROM trades t WHERE t.px > 0 GROUP BY sym, TUMBLE(ts, INTERVAL '30' MINUTE)""")
    assert isinstance(spec, FlowSpec)
    assert (spec.sources, spec.event_time, spec.keys, spec.window) == (("trades",), "ts", ("sym",), Tumbling("30m"))
    assert spec.granularity.value == "daily" and spec.refresh.value == "full" and spec.target_lag == timedelta(minutes=5)
    assert spec.description == "d" and spec.filter == "px > 0" and spec.start == datetime(2026, 11, 1, tzinfo=UTC)
    assert spec.derived == (("_in_notional", "px * qty"),)
    assert spec.aggregates == (
        Agg.sum("_in_notional", name="notional"), Agg.sum("qty", name="volume"), Agg.min_by("px", "ts", name="first_px"),
        Agg.count_distinct("acct", name="accts"), Agg.top_k("px", 3, name="top3"),
        Agg.approx_top_k("acct", 2, name="busiest", max_items=50), Agg.count(name="n"))
    assert spec.post == (("vwap", "notional / volume"),) and spec.hidden == ()
    assert spec.not_incrementalizable == ()


def test_unknown_aggregates_make_a_refill_only_flow_and_post_expressions_hide_their_parts():
    spec = one("""
        CREATE MATERIALIZED VIEW f AS
        SELECT HOP(ts, INTERVAL '10' MINUTE, INTERVAL '1' HOUR), PERCENTILE(px, 0.5) AS med,
               MAX(px) - MIN(px) AS spread,
               RANK() OVER (PARTITION BY HOP(ts, INTERVAL '10' MINUTE, INTERVAL '1' HOUR) ORDER BY MAX(px)) AS rk
        FROM trades GROUP BY HOP(ts, INTERVAL '10' MINUTE, INTERVAL '1' HOUR)""")
    assert spec.window == Hopping(size="1h", slide="10m")  # Flink's order: HOP(time, slide, size)
    assert spec.aggregates[0] == Agg.sql("PERCENTILE(px, 0.5)", name="med")
    assert spec.not_incrementalizable == ("PERCENTILE(px, 0.5)",)
    assert spec.hidden == ("_spread_1", "_spread_2")  # MAX(px) is shared with rk
    assert spec.post == (("spread", "_spread_1 - _spread_2"),
                         ("rk", "RANK() OVER (PARTITION BY window_start ORDER BY _spread_1)"))


def test_incremental_strict_refuses_a_query_it_cannot_maintain_at_load_time():
    with pytest.raises(SqlDefinitionError, match=r"t.sql:2: view 'f': .*incremental_strict.*PERCENTILE\(px, 0.5\)"):
        compile_sql("\nCREATE MATERIALIZED VIEW f WITH (refresh = 'incremental_strict') AS SELECT TUMBLE(ts, "
                    "INTERVAL '1' MINUTE), PERCENTILE(px, 0.5) AS m FROM t GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE)",
                    origin="t.sql")


def test_stage_parts_map_from_projection_join_and_dedup():
    spec = one("""
        CREATE MATERIALIZED VIEW s WITH (event_time = 'at') AS
        SELECT r.*, px * qty AS notional, d.sector
        FROM raw r LEFT JOIN dims d ON r.sym = d.sym WHERE r.qty > 0
        QUALIFY ROW_NUMBER() OVER (PARTITION BY id ORDER BY at) = 1""")
    assert isinstance(spec, StageSpec)
    assert (spec.sources, spec.event_time, spec.columns, spec.filter) == (("raw",), "at", (), "qty > 0")
    assert spec.derived == (("notional", "px * qty"),) and spec.dedup_key == ("id",)
    assert [(j.table, j.on, j.columns, j.how) for j in spec.joins] == [("dims", ("sym",), ("sector",), "left")]
    listed = one("CREATE MATERIALIZED VIEW s2 AS SELECT event_time, sym, px FROM raw WHERE px > 1")
    assert listed.columns == ("event_time", "sym", "px") and listed.joins == ()


@pytest.mark.parametrize("body, line, message", [
    ("SELECT TUMBLE(ts, INTERVAL '1' MINUTE), px AS p FROM t GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE)", 3,
     "column 'px' is neither in GROUP BY nor inside an aggregate"),
    ("SELECT sym, COUNT(*) AS n FROM t GROUP BY sym", 3, "a flow groups by a window"),
    ("SELECT TUMBLE(ts, INTERVAL '7' WEEK), COUNT(*) AS n FROM t GROUP BY TUMBLE(ts, INTERVAL '7' WEEK)", 3,
     "expected an interval like INTERVAL '5' MINUTE"),
    ("SELECT TUMBLE(ts, INTERVAL '1' MINUTE), COUNT(*) AS n FROM a\n RIGHT JOIN b ON a.k = b.k"
     " GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE)", 4, "RIGHT, FULL and CROSS joins cannot be computed per window"),
    ("SELECT TUMBLE(ts, INTERVAL '1' MINUTE), COUNT(*) FROM t GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE)", 3,
     "give 'COUNT(*)' a name"),
    ("SELECT * FROM t QUALIFY RANK() OVER (PARTITION BY k ORDER BY ts) = 1", 3, "QUALIFY supports the dedup form"),
    ("SELECT *, d.x FROM t JOIN d ON t.k = d.j", 3, "join on equal column names"),
    ("SELECT TUMBLE(ts, INTERVAL '1' MINUTE), LAG(SUM(x)) OVER (PARTITION BY k ORDER BY ts) AS l FROM t\n"
     " GROUP BY k, TUMBLE(ts, INTERVAL '1' MINUTE)", 3, "must PARTITION BY the window"),
    ("SELECT * FROM (SELECT * FROM t)", 3, "a subquery is not supported"),
    ("SELECT TUMBLE(ts, INTERVAL '1' MINUTE), COUNT(*) AS n FROM t\n GROUP BY TUMBLE(ts, INTERVAL '5' MINUTE)", 3,
     "the SELECT's window TUMBLE(ts, INTERVAL '1' MINUTE) differs from the GROUP BY's window "
     "TUMBLE(ts, INTERVAL '5' MINUTE)"),
    ("SELECT sym,\n date_trunc('HOUR', HOP(ts, INTERVAL '5' MINUTE, INTERVAL '1' HOUR)) AS h, COUNT(*) AS n FROM t\n"
     " GROUP BY sym, TUMBLE(ts, INTERVAL '5' MINUTE)", 4, "the SELECT's window HOP(ts, INTERVAL '5' MINUTE, INTERVAL "
     "'1' HOUR) differs from the GROUP BY's window TUMBLE(ts, INTERVAL '5' MINUTE)"),
    ("SELECT sym, TUMBLE(ts, INTERVAL '1' MINUTE),\n SUMM(price) AS s FROM t GROUP BY sym, TUMBLE(ts, INTERVAL '1' MINUTE)",
     4, "unknown function SUMM(...): it is no aggregate function of Spark SQL that Laminar knows, so the columns inside "
        "it are neither grouped nor aggregated; did you mean SUM?"),
    ("SELECT sym, TUMBLE(ts, INTERVAL '1' MINUTE), vwapp(px, qty) AS v FROM t GROUP BY sym, TUMBLE(ts, INTERVAL '1' MINUTE)",
     3, "unknown function vwapp(...)"),
    ("SELECT TUMBLE(ts, INTERVAL '99999999999' DAY), COUNT(*) AS n FROM t GROUP BY TUMBLE(ts, INTERVAL '99999999999' DAY)",
     3, "the interval 99999999999 DAY is too long"),
    ("SELECT TUMBLE(ts, INTERVAL '0' MINUTE), COUNT(*) AS n FROM t GROUP BY TUMBLE(ts, INTERVAL '0' MINUTE)",
     3, "expected an interval like INTERVAL '5' MINUTE"),
    ("SELECT TUMBLE(ts, INTERVAL '1' MINUTE),\n APPROX_TOP_K(acct, 2, 10 * 5) AS b\n"
     " FROM t GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE)",
     4, "APPROX_TOP_K's third argument (how many items it tracks) must be a number"),
])
def test_errors_name_the_file_line_and_construct(body, line, message):
    text = f"-- header\nCREATE MATERIALIZED VIEW bad AS\n{body}"
    with pytest.raises(SqlDefinitionError) as info:
        compile_sql(text, origin="flows/bad.sql")
    err = info.value
    assert isinstance(err, SpecError) and message in str(err), str(err)
    assert err.facts["file"] == "flows/bad.sql" and err.facts["line"] == line, err.facts
    assert str(err).startswith(f"flows/bad.sql:{line}")


@pytest.mark.parametrize("text, message", [
    ("CREATE VIEW v AS SELECT 1 FROM t", "expected CREATE MATERIALIZED VIEW"),
    ("CREATE MATERIALIZED VIEW v WITH (colour = 'red') AS SELECT * FROM t", "unknown option 'colour'"),
    ("CREATE MATERIALIZED VIEW v PARTITIONED BY WEEK AS SELECT * FROM t", "PARTITIONED BY HOUR or PARTITIONED BY DAY"),
    ("CREATE MATERIALIZED VIEW v AS SELECT * FROM t WHERE x >", "does not parse"),
])
def test_statement_level_errors(text, message):
    with pytest.raises(SqlDefinitionError, match=message):
        compile_sql(text, origin="x.sql")


def test_sql_files_in_the_flows_package_are_loaded_and_names_defined_twice_fail(tmp_path, monkeypatch):
    specs = {s.name: s for s in load_specs()}
    assert specs["sector_median_1h"].not_incrementalizable == ("PERCENTILE(price, 0.5)",)
    path = os.path.join(os.path.dirname(__file__), "..", "..", "..", "laminar_assets", "flows", "trade_activity.sql")
    with open(path, encoding="utf-8") as fh:
        line = next(i for i, text in enumerate(fh, 1) if "CREATE MATERIALIZED VIEW symbol_activity_15m" in text)
    assert specs["symbol_activity_15m"].origin.endswith(f"trade_activity.sql:{line}")

    pkg = tmp_path / "dupflows"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "one.py").write_text("from laminar_assets.engine import Agg, FlowSpec, Tumbling\n"
                                "f = FlowSpec(name='f', source='t', event_time='ts', window=Tumbling('1m'), "
                                "aggregates=(Agg.count(),))\n")
    (pkg / "two.sql").write_text("CREATE MATERIALIZED VIEW f AS SELECT TUMBLE(ts, INTERVAL '1' MINUTE), COUNT(*) AS n "
                                 "FROM t GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE);\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(SpecError, match=r"duplicate flow name 'f' in .*two.sql:1 and dupflows.one"):
        collect_specs("dupflows")


def test_specs_from_a_plain_folder_of_python_and_sql_files(tmp_path):
    """A dg project's flows folder need not be a package: its .py and .sql files load, each folder's
    modules under their own names (two folders' `flows.py` do not collide)."""
    for name in ("a", "b"):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "flows.py").write_text(
            "from laminar_assets.engine import Agg, FlowSpec, Tumbling\n"
            f"f_{name} = FlowSpec(name='f_{name}', source='t', event_time='ts', window=Tumbling('1m'),\n"
            "                   aggregates=(Agg.count(),))\n")
        (folder / "_helpers.py").write_text("raise RuntimeError('modules starting with _ are not imported')\n")
    (tmp_path / "a" / "more.sql").write_text(
        "CREATE MATERIALIZED VIEW g AS SELECT TUMBLE(ts, INTERVAL '1' MINUTE), COUNT(*) AS n "
        "FROM t GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE);\n")
    assert sorted(s.name for s in collect_specs(str(tmp_path / "a"))) == ["f_a", "g"]
    assert [s.name for s in collect_specs(tmp_path / "b")] == ["f_b"]
    with pytest.raises(LaminarError, match="flows folder .*nowhere.* does not exist"):
        collect_specs(str(tmp_path / "nowhere"))


def test_spark_aggregates_sqlglot_does_not_know_are_refill_only_aggregates():
    spec = one("CREATE MATERIALIZED VIEW f AS SELECT sym, TUMBLE(ts, INTERVAL '1' MINUTE), try_sum(px) AS s, "
               "every(px > 0) AS pos FROM t GROUP BY sym, TUMBLE(ts, INTERVAL '1' MINUTE)")
    assert spec.aggregates == (Agg.sql("TRY_SUM(px)", name="s"), Agg.sql("EVERY(px > 0)", name="pos"))


def test_a_select_window_equal_to_the_group_by_window_in_other_words_is_the_same_window():
    spec = one("CREATE MATERIALIZED VIEW f AS SELECT TUMBLE(ts, INTERVAL '5 minutes') AS w, COUNT(*) AS n FROM t "
               "GROUP BY TUMBLE(ts, INTERVAL '5' MINUTE)")
    assert spec.window == Tumbling("5m")


def test_a_window_or_freeze_after_out_of_range_in_with_names_the_view():
    with pytest.raises(SqlDefinitionError, match=r"t.sql:1: view 'f': .*expected a duration of at most 999999999 days"):
        compile_sql("CREATE MATERIALIZED VIEW f WITH (freeze_after = '99999999999d') AS SELECT TUMBLE(ts, INTERVAL '1' "
                    "MINUTE), COUNT(*) AS n FROM t GROUP BY TUMBLE(ts, INTERVAL '1' MINUTE)", origin="t.sql")


def test_variant_paths_compile_to_variant_get_and_a_named_group_by_expression_is_a_derived_key():
    """Spark 4's `payload:price::double` (#63): sqlglot's Spark dialect fails on it and reads `SELECT payload:price`
    as the alias placeholder `payload AS :price`; Laminar's dialect makes both a `variant_get` of the path. A GROUP
    BY expression the select list names becomes a derived key column; an unnamed one is still refused."""
    (spec,) = compile_sql("CREATE MATERIALIZED VIEW v AS SELECT TUMBLE(et, INTERVAL '10' MINUTE), "
                          "payload:venue::string AS venue, SUM(payload:price::double) AS notional, "
                          "COUNT(payload:a.b[0]) AS n FROM orders WHERE payload:side::string = 'buy' "
                          "GROUP BY TUMBLE(et, INTERVAL '10' MINUTE), payload:venue::string", origin="v.sql")
    derived = dict(spec.derived)
    assert spec.keys == ("venue",) and derived["venue"] == "CAST(VARIANT_GET(payload, '$.venue') AS STRING)"
    assert derived[spec.aggregates[0].column] == "CAST(VARIANT_GET(payload, '$.price') AS DOUBLE)"
    assert derived[spec.aggregates[1].column] == "VARIANT_GET(payload, '$.a.b[0]')"
    assert spec.filter == "CAST(VARIANT_GET(payload, '$.side') AS STRING) = 'buy'"
    with pytest.raises(SqlDefinitionError, match="name this key in the select list"):
        compile_sql("CREATE MATERIALIZED VIEW w AS SELECT TUMBLE(et, INTERVAL '10' MINUTE), COUNT(*) AS n FROM orders "
                    "GROUP BY TUMBLE(et, INTERVAL '10' MINUTE), payload:venue::string", origin="w.sql")


# One SQL call per aggregate kind of `spec.kinds.KINDS`: a kind added to the table without a way to write it in
# SQL (or a refusal listed here) fails the test below, instead of SQL flows silently computing it refill-only.
SQL_OF_KIND = {
    "count": "COUNT(*)", "sum": "SUM(px)", "avg": "AVG(px)", "var_samp": "VAR_SAMP(px)",
    "stddev_samp": "STDDEV_SAMP(px)", "min": "MIN(px)", "max": "MAX(px)", "first": "FIRST(px)", "last": "LAST(px)",
    "approx_count_distinct": "APPROX_COUNT_DISTINCT(qty)", "approx_percentile": "APPROX_PERCENTILE(px, 0.5)",
    "count_distinct": "COUNT(DISTINCT qty)", "min_by": "MIN_BY(px, qty)", "max_by": "MAX_BY(qty, px)",
    "top_k": "TOP_K(px, 2)", "approx_top_k": "APPROX_TOP_K(px, 2)",
    "sql": "PERCENTILE(px, 0.5)",  # any aggregate the algebra does not know: kept per window, refill-only
}
NO_SQL_FORM: dict[str, str] = {}  # kind -> why SQL flows cannot name it (none today)


def test_every_aggregate_kind_has_a_sql_form_that_compiles_to_it():
    from laminar_assets.engine.spec.kinds import KINDS

    assert set(SQL_OF_KIND) | set(NO_SQL_FORM) == set(KINDS), \
        f"kinds without a SQL form or a listed refusal: {sorted(set(KINDS) - set(SQL_OF_KIND) - set(NO_SQL_FORM))}"
    select = ", ".join(f"{call} AS a_{kind}" for kind, call in SQL_OF_KIND.items())
    spec = one(f"CREATE MATERIALIZED VIEW k AS SELECT sym, TUMBLE(ts, INTERVAL '1' MINUTE), {select} "
               "FROM trades GROUP BY sym, TUMBLE(ts, INTERVAL '1' MINUTE)")
    assert {a.name: a.kind for a in spec.aggregates} == {f"a_{kind}": kind for kind in SQL_OF_KIND}
