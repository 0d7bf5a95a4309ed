"""Fuzzing the definitions surface: whatever a data engineer passes to FlowSpec / StageSpec, or writes in a
CREATE MATERIALIZED VIEW, the outcome is a valid spec or a SpecError naming the flow (and for SQL, the
file): never a TypeError, ValueError, OverflowError or any other exception. No Spark."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from laminar_assets.engine import (
    Agg,
    DimensionJoin,
    FactJoin,
    FlowSpec,
    Hopping,
    LatePolicy,
    RowRule,
    SpecError,
    SqlDefinitionError,
    StageSpec,
    Tumbling,
    check_tables,
    compile_sql,
    order_specs,
)
from laminar_assets.engine.spec.kinds import KINDS

FUZZ = settings(max_examples=300, derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

IDENT = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
TEXT = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
JUNK = st.one_of(st.none(), st.integers(-3, 3), st.floats(allow_nan=True), st.just(()), st.just([1]), st.just({}))


def mostly(good, *bad):
    """`good` nine times in ten, else one of `bad` (text and junk values by default): most specs get far
    enough to meet the checks of their later fields."""
    wrong = st.one_of(*(bad or (TEXT, JUNK)))
    return st.integers(0, 9).flatmap(lambda i: good if i else wrong)


NAME = mostly(IDENT)
TABLE = mostly(st.sampled_from(["trades", "t", "st", "q"]),
               st.sampled_from(["./t", "T", "a/../t", ".", "", "_laminar/x", "s3://b/t", "/abs/t", "t/", "../up"]),
               TEXT, JUNK)
COLUMN = mostly(st.sampled_from(["ts", "sym", "px", "qty"]), IDENT, TEXT, JUNK)
UNITS = ["ms", "s", "m", "min", "h", "d", "minutes", "days", "w", ""]
DURATION = mostly(
    st.sampled_from(["1m", "5m", "10m", "15m", "30m", "1h", "1d", "2h", "7m"]),
    st.builds(lambda n, u: f"{n}{u}", st.integers(-10, 10**12), st.sampled_from(UNITS)),
    st.sampled_from(["0m", "-5m", "100000d", "99999999999d", "1 minute", " 5 MINUTES "]),
    st.builds(lambda s: timedelta(seconds=s), st.integers(-10**6, 10**10)), TEXT, JUNK,
)
WINDOW = mostly(st.one_of(st.builds(Tumbling, DURATION), st.builds(Hopping, DURATION, DURATION)))
EXPR = mostly(st.sampled_from(["px * 2", "qty > 0", "sum_qty / 2", "upper(sym)", "window_start"]),
              st.sampled_from(["px AS y", "\x00a\x00", "", "   ", "qty >"]), TEXT, JUNK)
AGG = mostly(
    st.builds(Agg, mostly(st.sampled_from(list(KINDS))), COLUMN, st.one_of(st.none(), IDENT, mostly(IDENT)),
              quantile=st.one_of(st.none(), st.floats(-1, 2), JUNK),
              precision=st.one_of(st.none(), st.integers(-5, 10**6), JUNK), by=st.one_of(st.none(), COLUMN),
              k=st.one_of(st.none(), st.integers(-5, 20_000), JUNK), expr=st.one_of(st.none(), EXPR)),
    st.sampled_from([Agg.count(), Agg.sum("px"), Agg.max_by("px", "ts"), Agg.top_k("px", 3), Agg.sql("max(px)", name="m"),
                     Agg.approx_top_k("sym", 5, max_items=3), Agg.approx_count_distinct("sym", lg_config_k=40)]),
    JUNK,
)
PAIRS = mostly(st.dictionaries(IDENT, EXPR, max_size=3), st.dictionaries(TEXT, EXPR, max_size=2),
               st.lists(st.tuples(IDENT, EXPR), max_size=2), st.just([("a",)]), st.just(["ab"]), JUNK, TEXT)
MOMENT = mostly(st.sampled_from(["2026-11-01", "2026-11-01T10:00", "2026-11-02T00:00:00+00:00"]),
                st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30)),
                st.datetimes(timezones=st.just(UTC)), st.sampled_from(["2026-11-01T10:30", "soon"]), TEXT, JUNK)
RULE = mostly(st.builds(RowRule, NAME, EXPR, st.one_of(st.none(), TABLE)))
COMMON = dict(
    partitioning=mostly(st.sampled_from(["hourly", "daily"])), filter=st.one_of(st.none(), EXPR),
    derived=PAIRS, sink=st.one_of(st.none(), TABLE), refresh=mostly(st.sampled_from(["auto", "full", "incremental_strict"])),
    late=mostly(st.builds(LatePolicy, st.one_of(st.none(), DURATION))),
    max_versions_per_run=mostly(st.one_of(st.none(), st.integers(-2, 5))),
    max_rows_per_run=mostly(st.one_of(st.none(), st.integers(-2, 5))),
    description=mostly(TEXT, JUNK),
    rules=mostly(st.lists(RULE, max_size=2)),
    event_time_bounds=mostly(st.one_of(st.none(), st.tuples(MOMENT, MOMENT))),
    owners=mostly(st.lists(st.sampled_from(["a@b.io", "team:x"]), max_size=2), st.just(["team:"]), TEXT, JUNK),
    tags=PAIRS, target_lag=st.one_of(st.none(), DURATION), start=st.one_of(st.none(), MOMENT),
)
SOURCE = mostly(TABLE, st.lists(TABLE, max_size=3))
FLOW_ARGS = st.fixed_dictionaries(
    {"name": NAME, "source": SOURCE, "event_time": COLUMN, "window": WINDOW,
     "aggregates": mostly(st.lists(AGG, min_size=1, max_size=3), AGG, JUNK)},
    optional={**COMMON,
              "keys": mostly(st.lists(COLUMN, max_size=3), COLUMN),
              "post": PAIRS, "hidden": mostly(st.lists(IDENT, max_size=2), st.lists(JUNK, max_size=1), JUNK),
              "joins": mostly(st.lists(mostly(st.builds(
                  FactJoin, TABLE, NAME, EXPR, mostly(st.lists(COLUMN, max_size=2)),
                  mostly(st.sampled_from(["inner", "left", "right"])))), max_size=2))})
STAGE_ARGS = st.fixed_dictionaries(
    {"name": NAME, "source": SOURCE, "event_time": COLUMN},
    optional={**COMMON,
              "columns": mostly(st.lists(COLUMN, max_size=3)),
              "dedup_key": mostly(st.lists(COLUMN, max_size=2), COLUMN),
              "joins": mostly(st.lists(mostly(st.builds(
                  DimensionJoin, TABLE, mostly(st.lists(COLUMN, max_size=2), COLUMN), mostly(st.lists(COLUMN, max_size=2)),
                  mostly(st.sampled_from(["inner", "left", "outer"])))), max_size=2))})


def built_or_named(cls, kwargs):
    """The spec `kwargs` make, checked as the registry would; or the SpecError, which must name the flow."""
    try:
        spec = cls(**kwargs)
    except SpecError as exc:
        assert exc.flow is kwargs["name"] or exc.flow == kwargs["name"], (exc.flow, kwargs["name"], exc)
        return None
    assert spec.spec_hash and repr(spec)
    try:
        check_tables([spec])
        order_specs([spec])
    except SpecError as exc:
        assert exc.flow == spec.name, exc
    return spec


@FUZZ
@given(FLOW_ARGS)
def test_any_flow_arguments_give_a_flow_or_a_spec_error_naming_it(kwargs):
    built_or_named(FlowSpec, kwargs)


@FUZZ
@given(STAGE_ARGS)
def test_any_stage_arguments_give_a_stage_or_a_spec_error_naming_it(kwargs):
    built_or_named(StageSpec, kwargs)


INTERVAL = mostly(
    st.sampled_from(["INTERVAL '1' MINUTE", "INTERVAL '5' MINUTE", "INTERVAL '5 minutes'", "INTERVAL '1' HOUR",
                     "INTERVAL '15' MINUTES"]),
    st.builds(lambda n, u: f"INTERVAL '{n}' {u}", st.one_of(st.integers(-5, 10**12), st.sampled_from(["1.5", "x", "inf",
                                                                                                   "nan", ""])),
              st.sampled_from(["SECOND", "MINUTE", "MINUTES", "HOUR", "DAY", "WEEK", "MONTH", ""])),
    st.sampled_from(["5", "'5m'", "INTERVAL 5 MINUTE"]),
)
WINDOW_SQL = mostly(
    st.one_of(st.builds(lambda i: f"TUMBLE(ts, {i})", INTERVAL),
              st.builds(lambda i, j: f"HOP(ts, {i}, {j})", INTERVAL, INTERVAL)),
    st.sampled_from(["TUMBLE(ts)", "HOP(ts, INTERVAL '1' MINUTE)", "TUMBLE(1, INTERVAL '1' MINUTE)", "TUMBLE(q.ts, INTERVAL '1' "
                     "MINUTE)", "TUMBLE(t.ts, INTERVAL '1' MINUTE)"]))
ITEM = mostly(
    st.sampled_from(["sym", "window_start", "COUNT(*) AS n", "SUM(px) AS s", "SUM(px * qty) / SUM(qty) AS vwap",
                     "MIN_BY(px, ts) AS m", "PERCENTILE(px, 0.5) AS p", "COUNT(DISTINCT sym) AS d", "TOP_K(px, 3) AS k",
                     "APPROX_TOP_K(sym, 2) AS a", "RANK() OVER (PARTITION BY window_start ORDER BY SUM(px)) AS r",
                     "try_sum(px) AS t2", "AVG(px) AS a2", "MAX(px) - MIN(px) AS spread"]),
    st.sampled_from(["px", "SUMM(px) AS s", "vwapp(px, qty) AS v", "TOP_K(px, x) AS k", "RANK() OVER (ORDER BY px) AS r",
                     "SUM(px)", "q.bid AS b", "*", "s AS s2", "SUM(px) AS window_start", "COUNT(*) AS n",
                     "upper(sym) AS u"]),
    WINDOW_SQL, st.builds(lambda w: f"{w} AS w", WINDOW_SQL),
)
WITH = st.lists(mostly(st.sampled_from([
    "refresh = 'auto'", "target_lag = '5m'", "sink = 'elsewhere'", "start = '2026-11-01'", "freeze_after = '2h'",
    "owners = 'a@b.io'", "max_rows_per_run = 100"]), st.sampled_from([
    "refresh = 'sometimes'", "target_lag = '-1m'", "sink = './x'", "sink = '_laminar/q'", "sink = ''", "start = 'soon'",
    "freeze_after = '99999999999d'", "max_rows_per_run = 0", "max_rows_per_run = 'x'", "tags = 'a:b, c'",
    "colour = 'red'", "event_time = 'ts'", "start = '0095-01-01'"])), max_size=3)
GROUP = mostly(
    st.builds(lambda keys, w: " GROUP BY " + ", ".join([*keys, w]), st.lists(st.just("sym"), max_size=1), WINDOW_SQL),
    st.builds(lambda keys, w: " GROUP BY " + ", ".join([*keys, *w]), st.lists(st.sampled_from(["sym", "px * 2", "1"]),
                                                                               max_size=2), st.lists(WINDOW_SQL, max_size=2)),
    st.sampled_from(["", " GROUP BY sym"]))
VIEW = st.builds(
    lambda name, part, comment, with_, items, source, join, where, group: (
        f"CREATE MATERIALIZED VIEW {name}{part}{comment}"
        + (f" WITH ({', '.join(with_)})" if with_ else "")
        + f" AS SELECT {', '.join(items) or '1'} FROM {source}{join}{where}{group}"),
    mostly(IDENT, st.sampled_from(["`weird name`", "1x", "select"])),
    mostly(st.sampled_from(["", " PARTITIONED BY HOUR", " PARTITIONED BY DAY"]), st.just(" PARTITIONED BY WEEK")),
    st.sampled_from(["", " COMMENT 'c'"]), WITH, st.lists(ITEM, min_size=1, max_size=4),
    mostly(st.just("t"), st.sampled_from(["t AS x", "(SELECT 1)", "s3.t"])),
    mostly(st.just(""), st.sampled_from([" JOIN q ON t.sym = q.sym", " LEFT JOIN q USING (sym)", " CROSS JOIN q", " JOIN q"])),
    mostly(st.sampled_from(["", " WHERE px > 0"]), st.sampled_from([" WHERE SUM(px) > 0", " WHERE"])),
    GROUP,
)


def mutated(text: str, cut: int, insert: str) -> str:
    at = cut % (len(text) + 1)
    return text[:at] + insert + text[at + len(insert) % 3:]


@FUZZ
@given(st.lists(VIEW, min_size=1, max_size=2), st.integers(0, 400),
       mostly(st.just(""), st.sampled_from([";", ",", ")", "(", "'", " GROUP BY ", " AS ", "\n"])))
def test_any_view_text_gives_specs_or_a_sql_definition_error_naming_the_file(views, cut, insert):
    text = mutated(";\n".join(views) + ";", cut, insert)
    try:
        specs = compile_sql(text, origin="fuzz.sql")
    except SqlDefinitionError as exc:
        assert exc.facts["file"] == "fuzz.sql" and exc.message.startswith("fuzz.sql"), exc
        return
    for spec in specs:
        assert spec.spec_hash and spec.origin.startswith("fuzz.sql")
    try:
        check_tables(specs)
        order_specs(specs)
    except SpecError as exc:
        assert exc.flow in {s.name for s in specs}, exc


PLACE = st.sampled_from(["trades", "t", "./t", "T", "t/", "t/sub", "a/../t", "st", "_laminar/x", "_Laminar", ".", "..",
                         "../t", "s3://b/t", "s3a://b/T/", "/abs/t", "/abs/t/../u", "file:///abs/t", "q", "Q/"])


@FUZZ
@given(st.lists(st.tuples(PLACE, st.lists(PLACE, min_size=1, max_size=2), st.booleans()), min_size=1, max_size=4),
       st.sampled_from([None, "/abs", "/abs/lake", "s3://b", "s3://b/lake"]))
def test_any_graph_of_tables_loads_in_order_or_fails_naming_a_flow_of_it(tables, root):
    specs = [StageSpec(name=f"s{i}", source=sources, event_time="ts", sink=sink) if stage else
             FlowSpec(name=f"f{i}", source=sources, event_time="ts", window=Tumbling("1m"), aggregates=[Agg.count()],
                      sink=sink)
             for i, (sink, sources, stage) in enumerate(tables)]
    try:
        check_tables(specs, root=root)
        ordered = order_specs(specs)
    except SpecError as exc:
        assert exc.flow in {s.name for s in specs} and "\n" not in str(exc), exc
        return
    assert sorted(s.name for s in ordered) == sorted(s.name for s in specs)
