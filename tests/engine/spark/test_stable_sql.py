"""Predicates written as map lookups: the same answers as the plain form, and the same generated code
whatever the values (so a run after the first compiles nothing for them)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest
from pyspark.sql import functions as F

from laminar_assets.engine.spark import stable_sql
from laminar_assets.engine.windows import Granularity, Interval, in_ranges_sql

pytestmark = pytest.mark.spark
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def _rows(spark, n=2000, seed=7):
    rng = random.Random(seed)
    data = [(T0 + timedelta(seconds=rng.randrange(0, 5 * 86400), microseconds=rng.randrange(10**6))
             if i % 50 else None, rng.randrange(0, 130) if i % 40 else None, rng.randrange(0, 9) if i % 30 else None)
            for i in range(n)]
    return spark.createDataFrame(data, "ts timestamp, part bigint, v bigint")


def _ranges(rng, granularity):
    out = []
    for _ in range(rng.randrange(0, 6)):
        start = T0 + timedelta(minutes=rng.randrange(0, 5 * 24 * 60))
        out.append(Interval(start, start + timedelta(minutes=rng.choice([1, 30, 60, 24 * 60, 50 * 60]))))
    if rng.random() < 0.3:  # whole partitions, as refills and state reads ask
        key = T0 + timedelta(hours=rng.randrange(0, 100))
        out.append(Interval(key, key + granularity.step))
    return out


def test_lookups_answer_like_the_plain_form(spark):
    df = _rows(spark)
    rng = random.Random(3)
    for trial in range(12):
        granularity = Granularity.HOURLY if trial % 3 else Granularity.DAILY
        ranges = _ranges(rng, granularity)
        values = {rng.randrange(0, 130): tuple(rng.sample(range(9), rng.randrange(1, 4)))
                  for _ in range(rng.choice([0, 3, 70]))}  # 70 keys: beyond MAX_KEYS, the IN form
        plain_in = " OR ".join(f"(part = {k} AND v IN ({', '.join(map(str, vs))}))" for k, vs in values.items())
        got = df.select(
            F.expr(stable_sql.in_ranges_sql("ts", ranges, granularity)).alias("r"),
            F.expr(f"coalesce({in_ranges_sql('ts', ranges)}, false)").alias("r0"),
            F.expr(stable_sql.contains_sql(values, "part", "v")).alias("c"),
            F.expr(f"coalesce({plain_in or 'false'}, false)").alias("c0")).collect()
        assert all(r.r is r.r0 for r in got), (trial, ranges)  # never NULL: false where the plain form is NULL
        assert all(r.c is r.c0 for r in got), (trial, values)


def test_other_values_compile_no_new_code(spark):
    """The point of the lookups: a second run with other ranges and versions reuses the first's code."""
    metrics = spark._jvm.org.apache.spark.metrics.source.CodegenMetrics.METRIC_COMPILATION_TIME()
    df = spark.range(5000).selectExpr("timestamp_micros(1704067200000000 + id * 60000000) AS ts",
                                      "id % 100 AS part", "id % 7 AS v")

    def run(ranges, values):
        keep = F.expr(f"{stable_sql.in_ranges_sql('ts', ranges, Granularity.HOURLY)} OR "
                      f"{stable_sql.contains_sql(values, 'part', 'v')}")
        return df.where(keep).groupBy("part").count().collect()

    hour = timedelta(hours=1)
    run([Interval(T0, T0 + hour), Interval(T0 + 5 * hour, T0 + 6 * hour)], {1: (2, 3), 4: (5,)})
    before = metrics.getCount()
    run([Interval(T0 + 9 * hour, T0 + 10 * hour), Interval(T0 + 20 * hour, T0 + 22 * hour)], {7: (1,), 8: (0, 6)})
    assert metrics.getCount() == before
    # the plain form spells the values into the code: new code to compile
    df.where(F.expr(in_ranges_sql("ts", [Interval(T0 + 30 * hour, T0 + 31 * hour)]))).groupBy("part").count().collect()
    first = metrics.getCount()
    df.where(F.expr(in_ranges_sql("ts", [Interval(T0 + 40 * hour, T0 + 41 * hour)]))).groupBy("part").count().collect()
    assert metrics.getCount() > first
