"""The aggregate algebra: merge is associative with an identity, retraction undoes a merge (for
the extremes: exactly until every row holding the extreme is gone, which the state then says),
and finalize(merge of partials) equals Spark's own aggregate over all rows."""

from __future__ import annotations

import math
from datetime import datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import functions as F

from laminar_assets.engine import Agg
from laminar_assets.engine.aggregates.algebra import EVENT_TS, SIGN, implementation
from laminar_assets.engine.spark.frames import interpreted
from tests.reference import aggregate_column as ref_agg
from tests.reference import plain

pytestmark = pytest.mark.spark

AGGS = (
    Agg.count(), Agg.count("x", name="cx"), Agg.sum("x"), Agg.sum("i"), Agg.avg("x"), Agg.var_samp("x"),
    Agg.stddev_samp("x"), Agg.min("x"), Agg.max("i"), Agg.first("x"), Agg.last("i"),
    Agg.approx_count_distinct("i"), Agg.approx_percentile("x", 0.3), Agg.count_distinct("i"),
    Agg.min_by("x", "i"), Agg.max_by("i", "x"), Agg.top_k("x", 3), Agg.approx_top_k("i", 2),
)
SCHEMA = "ex int, x double, i bigint, __ts timestamp, part int, __sign int"
T0 = datetime(2024, 1, 1)
# Each example checks BATCH data sets at once, each its own group (`ex`) of one Spark query: the same
# cases as BATCH examples of one data set, for a fraction of the Spark jobs (each costs about a second).
# An example's first draw is Hypothesis's simplest one; two examples of BATCH (the extremes' tests: 2 * BATCH)
# data sets check at least as many random ones as the examples before (#60).
BATCH = 6

values = st.tuples(
    st.one_of(st.none(), st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False)),
    st.one_of(st.none(), st.integers(-50, 50)),
    st.integers(0, 3600),
    st.integers(0, 2),
)


def _impls(df, aggs, exact=True):
    return [implementation(a, df.schema[a.column].dataType if a.column else None, exact_holders=exact) for a in aggs]


def frame(spark, batches, sign=1):
    """The rows of every data set in `batches`, column `ex` its index."""
    return spark.createDataFrame([(e, x, i, T0 + timedelta(seconds=s), p, sign)
                                  for e, rows in enumerate(batches) for x, i, s, p in rows], SCHEMA)


def partials(spark, batches, sign=1, aggs=AGGS, exact=True):
    """One partial state per data set and `part`."""
    df = frame(spark, batches, sign)
    impls = _impls(df, aggs, exact)
    before = [e for im in impls for e in im.pre_partial_exprs(["ex", "part", SIGN])]
    if before:
        df = df.selectExpr("*", *before)
    return df.groupBy("ex", "part", SIGN).agg(*[F.expr(e) for im in impls for e in im.partial()]).drop(SIGN), impls


def merge(states, impls):
    """Merge state rows that share `ex` into one state per data set."""
    extra = [e for im in impls for e in im.pre_merge_exprs(["ex"])]
    if extra:
        states = states.selectExpr("*", *extra)
    return states.groupBy("ex").agg(*[F.expr(e) for im in impls for e in im.merge()]).withColumn("part", F.lit(0))


def finalize(state, impls, *extra) -> dict[int, dict]:
    """Each data set's finalized aggregates (and `extra` expressions), by `ex`."""
    rows = state.selectExpr("ex", *[im.finalize() for im in impls], *extra).collect()
    return {r["ex"]: {k: v for k, v in r.asDict().items() if k != "ex"} for r in rows}


def close(a, b):
    if hasattr(a, "asDict") or isinstance(a, list):
        a, b = plain(a), plain(b)
        return a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-6)
    return a == b


def assert_same(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert close(a[k], b[k]), (k, a[k], b[k])


def _settings(n: int):
    return settings(max_examples=n, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def batches(rows, size=BATCH):
    return st.lists(rows, min_size=size, max_size=size)


def removals(data, batch):
    """For each data set, rows to retract (never all of them)."""
    return [data.draw(st.lists(st.sampled_from(range(len(rows))), unique=True, max_size=len(rows) - 1))
            for rows in batch]


@_settings(2)
@given(batches(st.lists(values, min_size=1, max_size=30)))
def test_merge_is_associative_and_matches_spark(spark, batch):
    parts, impls = partials(spark, batch)
    p = {i: parts.where(f"part = {i}") for i in range(3)}
    left = merge(merge(p[0].unionByName(p[1]), impls).unionByName(p[2]), impls)
    right = merge(p[0].unionByName(merge(p[1].unionByName(p[2]), impls)), impls)
    flat = merge(parts, impls)
    a, b, c = finalize(left, impls), finalize(right, impls), finalize(flat, impls)
    # and equal to Spark's own aggregates over all rows
    df = frame(spark, batch)
    ref = df.groupBy("ex").agg(
        F.count(F.lit(1)).alias("count"), F.count("x").alias("cx"), F.sum("x").alias("sum_x"),
        F.sum("i").alias("sum_i"), F.avg("x").alias("avg_x"), F.var_samp("x").alias("var_samp_x"),
        F.stddev_samp("x").alias("stddev_samp_x"), F.min("x").alias("min_x"), F.max("i").alias("max_i"),
        F.min_by("x", F.when(F.col("x").isNotNull(), F.struct(EVENT_TS, "x"))).alias("first_x"),
        F.max_by("i", F.when(F.col("i").isNotNull(), F.struct(EVENT_TS, "i"))).alias("last_i"),
        F.hll_sketch_estimate(F.hll_sketch_agg("i")).alias("approx_count_distinct_i"),
        F.when(F.count("x") > 0, F.kll_sketch_get_quantile_double(F.kll_sketch_agg_double("x"), F.lit(0.3)))
        .alias("approx_percentile_x"),
        *[ref_agg(a, df).alias(a.name) for a in AGGS[-5:]],
    ).collect()
    ref = {r["ex"]: {k: v for k, v in r.asDict().items() if k != "ex"} for r in ref}
    assert a.keys() == b.keys() == c.keys() == ref.keys() == set(range(BATCH))
    for e in range(BATCH):
        assert_same(a[e], b[e])
        assert_same(a[e], c[e])
        assert_same(a[e], ref[e])


@_settings(2)
@given(batches(st.lists(values, min_size=1, max_size=20)))
def test_empty_state_is_the_identity(spark, batch):
    parts, impls = partials(spark, batch)
    empty, _ = partials(spark, [])
    with interpreted(spark, True):  # a small pass's merge into empty state, as the engine runs it
        with_empty, alone = (finalize(merge(parts.unionByName(empty), impls), impls),
                             finalize(merge(parts, impls), impls))
    assert with_empty.keys() == alone.keys() == set(range(BATCH))
    for e in range(BATCH):
        assert_same(with_empty[e], alone[e])


@_settings(2)
@given(batches(st.lists(values, min_size=2, max_size=25)), st.data())
def test_retraction_undoes_rows_for_retractable_aggregates(spark, batch, data):
    _check_retraction(spark, batch, removals(data, batch), AGGS)


def _check_retraction(spark, batch, removed, aggs, exact=True):
    """`batch`: data sets, `removed`: the rows retracted from each.

    `exact`: partials count every holder of an extreme, as in a small pass, whose queries the engine
    runs interpreted; else a lower bound, as in a larger pass, whose queries Spark compiles (by default
    both switch at 1 MiB of input, EngineOptions). Each is checked the way the engine runs it; the merge
    test above compiles every aggregate too."""
    with interpreted(spark, exact):
        _retraction(spark, batch, removed, aggs, exact)


def _retraction(spark, batch, removed, aggs, exact):
    kept = [[r for k, r in enumerate(rows) if k not in gone] for rows, gone in zip(batch, removed)]
    all_state, impls = partials(spark, batch, aggs=aggs, exact=exact)
    minus, _ = partials(spark, [[rows[k] for k in gone] for rows, gone in zip(batch, removed)], sign=-1,
                        aggs=aggs, exact=exact)
    merged = merge(merge(all_state, impls).unionByName(minus), impls)
    flags = [f"coalesce({im.gone_expr()}, false) AS `gone {im.agg.name}`" for im in impls if im.gone_expr()]
    retracted = finalize(merged, impls, *flags)  # one query: the values and the extremes' flags
    direct = finalize(merge(partials(spark, kept, aggs=aggs)[0], impls), impls)
    assert retracted.keys() == direct.keys() == set(range(len(batch)))
    for e, rows in enumerate(batch):
        gone = {im.agg.name: retracted[e][f"gone {im.agg.name}"] for im in impls if im.gone_expr()}
        for im in impls:
            if im.retractable:
                name = im.agg.name
                if gone.get(name):
                    continue  # the run recomputes the window: checked below
                assert close(retracted[e][name], direct[e][name]), (name, retracted[e][name], direct[e][name])
        # an extreme is flagged exactly when every row holding it was retracted (and rows are left);
        # with a lower bound of the holders, at least then (never later: a missed one would be wrong)
        for im in impls:
            if im.gone_expr() is None:
                continue
            holders = _holders(im, rows)
            expected = bool(holders) and set(holders) <= set(removed[e])
            assert gone[im.agg.name] == expected if exact else (gone[im.agg.name] or not expected), \
                (im.agg.name, holders, removed[e], rows)


def _holders(im, rows) -> list[int]:
    """Indexes of the rows holding the aggregate's extreme over `rows` (same tie rule as the state)."""
    x, i = 0, 1
    kind = im.agg.kind
    col = x if im.agg.column == "x" else i

    def key(k):
        r = rows[k]
        if kind in ("min", "max"):
            return r[col]
        if kind in ("first", "last"):
            return None if r[col] is None else (r[2], r[col])
        by = x if im.agg.by == "x" else i  # min_by / max_by: (by, value), ties by value
        return None if r[by] is None else (r[by], r[col] if r[col] is not None else float("-inf"))
    keyed = [(key(k), k) for k in range(len(rows)) if key(k) is not None]
    if not keyed:
        return []
    pick = min if kind in ("min", "first", "min_by") else max
    best = pick(v for v, _ in keyed)
    return [k for v, k in keyed if v == best]


EXTREMES = (Agg.min("x"), Agg.max("i"), Agg.first("x"), Agg.last("i"), Agg.min_by("x", "i"), Agg.max_by("i", "x"))
few = st.tuples(st.sampled_from([None, 1.0, 2.0, 3.0]), st.sampled_from([None, 1, 2]), st.integers(0, 2),
                st.integers(0, 2))


@_settings(2)
@given(batches(st.lists(few, min_size=2, max_size=12), 2 * BATCH), st.data())
def test_extremes_with_ties_retract_until_no_holder_is_left(spark, batch, data):
    """Few distinct values, so extremes are tied and retractions hit holders: the state answers
    exactly while a holder is left, and says it cannot exactly when none is."""
    _check_retraction(spark, batch, removals(data, batch), EXTREMES)


@_settings(2)
@given(batches(st.lists(few, min_size=2, max_size=12), 2 * BATCH), st.data())
def test_extremes_counting_a_lower_bound_of_holders_never_miss_a_retracted_extreme(spark, batch, data):
    """A large pass counts one holder per partial of added rows and every row of a partial of
    retracted ones: its state may flag a group early (it is recomputed, exactly), never late."""
    _check_retraction(spark, batch, removals(data, batch), EXTREMES, exact=False)


def test_deleting_one_of_two_tied_minimum_rows_keeps_the_minimum(spark):
    rows = [(1.0, 1, 0, 0), (1.0, 2, 1, 0), (3.0, 2, 2, 0)]
    _check_retraction(spark, [rows] * 3, [
        [0],     # min x = 1.0 still held by row 1
        [0, 1],  # no row holds 1.0: gone
        [2],     # not a holder of min x: nothing changes
    ], EXTREMES)
