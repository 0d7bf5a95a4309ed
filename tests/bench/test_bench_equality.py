"""The benchmark's equality check finds wrong answers: a changed integer, a float beyond 1e-9
relative, a missing and an extra window; and accepts float noise within the tolerance."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from bench.equality import compare, compare_all

pytestmark = pytest.mark.spark

KEYS = ["window_start", "window_end", "symbol"]


def _frame(spark, rows):
    t = lambda m: datetime(2024, 1, 2, 9, m, tzinfo=UTC)  # noqa: E731
    data = [(t(m), t(m + 1), sym, n, v) for m, sym, n, v in rows]
    return spark.createDataFrame(data, "window_start timestamp, window_end timestamp, symbol string, "
                                       "trades long, notional double")


def test_equal_sinks_pass_and_float_noise_within_tolerance_is_accepted(spark):
    expected = _frame(spark, [(0, "A", 3, 100.0), (1, "A", 2, 1e6), (1, "B", 1, 0.0)])
    actual = _frame(spark, [(1, "B", 1, 1e-13), (0, "A", 3, 100.0 * (1 + 1e-12)), (1, "A", 2, 1e6)])
    result = compare(expected, actual, KEYS)
    assert result["equal"] and result["rows_expected"] == result["rows_actual"] == 3


def test_each_kind_of_difference_is_counted(spark):
    expected = _frame(spark, [(0, "A", 3, 100.0), (1, "A", 2, 50.0), (2, "A", 1, 10.0), (3, "A", 1, 1.0)])
    actual = _frame(spark, [(0, "A", 4, 100.0), (1, "A", 2, 50.0 * (1 + 1e-8)), (3, "A", 1, 1.0),
                            (4, "A", 1, 1.0)])
    results = compare_all({"x": (expected, actual, KEYS), "same": (expected, expected, KEYS)})
    x = results["x"]
    assert not x["equal"] and results["same"]["equal"]
    assert (x["mismatched_rows"], x["missing_rows"], x["extra_rows"]) == (2, 1, 1)
    flagged = {e["window_start"][11:16]: e["__cols"] for e in compare_all(
        {"x": (expected, actual, KEYS)}, examples=10)["x"]["examples"]}
    assert flagged["09:00"] == "trades" and flagged["09:01"] == "notional"


def test_different_columns_are_not_equal(spark):
    expected = _frame(spark, [(0, "A", 3, 100.0)])
    assert not compare(expected, expected.drop("notional"), KEYS)["equal"]
