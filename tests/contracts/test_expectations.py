"""Great Expectations runs a contract with its pandas engine on small outputs and its Spark engine on
large ones; both give the same verdict and the same failures."""

from __future__ import annotations

from datetime import datetime

import pytest

from laminar_assets.contracts import load_contracts
from laminar_assets.contracts.expectations import validate
from laminar_assets.definitions import CONTRACTS

pytestmark = pytest.mark.spark

VWAP = load_contracts(CONTRACTS)["vwap_1m"]
T = datetime(2024, 1, 2, 9, 0)


def vwap_rows(spark, rows):
    columns = ["window_start", "window_end", "symbol", "vwap", "volume", "trades"]
    return spark.createDataFrame(rows, columns).withColumn("notional", rows_notional())


def rows_notional():
    from pyspark.sql import functions as F

    return F.col("vwap") * F.col("volume")


def good(i: int):
    return (T, T.replace(minute=1), f"S{i}", 100.0 + i, 10 + i, 1 + i)


@pytest.mark.parametrize("limit, engine", [(0, "spark"), (19, "spark"), (20, "pandas"), (1000, "pandas")])
def test_engines_agree_on_a_passing_frame(spark, limit, engine):
    summary = validate(vwap_rows(spark, [good(i) for i in range(20)]), VWAP, local_rows=limit)
    assert summary.success and summary.engine == engine and summary.failures == ()
    assert summary.rows == 20  # one row over the limit goes to Spark, and is still counted
    assert summary.evaluated == len(VWAP.rules())


def test_engines_agree_on_failures(spark):
    rows = [good(i) for i in range(20)]
    rows[3] = (T, T.replace(minute=1), "S3", -1.0, 13, 4)   # vwap out of range
    rows[7] = (T, T.replace(minute=1), "S8", 108.0, 18, 9)  # duplicate (window_start, symbol) with row 8
    frame = vwap_rows(spark, rows)
    on_spark = validate(frame, VWAP, local_rows=0)
    on_pandas = validate(frame, VWAP, local_rows=len(rows))
    assert (on_spark.engine, on_pandas.engine) == ("spark", "pandas")
    assert not on_spark.success and not on_pandas.success
    assert on_pandas.rows == len(rows) and on_spark.rows == len(rows)

    def facts(summary):
        return sorted((f.expectation, f.unexpected_count, sorted(map(str, f.examples))) for f in summary.failures)

    assert facts(on_spark) == facts(on_pandas)
    assert any(f[0].startswith("between(vwap") and f[1] == 1 and f[2] == ["-1.0"] for f in facts(on_pandas))
    assert any(f[0].startswith("unique") for f in facts(on_pandas)), facts(on_pandas)
    # Each failure carries its own rule's name (GE reports results out of the suite's order).
    assert len(on_pandas.failures) == 2 and not any(f[0].startswith("between(trades") for f in facts(on_pandas))


def test_above_the_limit_spark_checks_it(spark):
    summary = validate(vwap_rows(spark, [good(i) for i in range(5)]), VWAP, local_rows=4)
    assert summary.engine == "spark" and summary.rows == 5 and summary.success


def test_a_slice_of_a_range_fetch_is_typed_as_if_fetched_alone():
    """pandas widens an integer column to float64 when any fetched row holds a null; a partition's
    slice without nulls gets its integer type back, so a regex sees "5", not "5.0"."""
    import pandas as pd
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from laminar_assets.contracts.expectations import local_slice, validate_local
    from laminar_assets.contracts.model import Contract, ContractColumn, ExpectationRule

    schema = StructType([StructField("symbol", StringType()), StructField("trades", LongType())])
    fetched = pd.DataFrame({"symbol": ["A", "A", "B"], "trades": [None, 7.0, 5.0]})  # as toPandas gives it
    part = pd.Series(["10:00", "10:00", "11:00"])
    digits = Contract(table="t", kind="sink", columns={"symbol": ContractColumn(type="string"),
                                                       "trades": ContractColumn(type="bigint")},
                      expectations=[ExpectationRule(expect="match_regex", column="trades", regex="^[0-9]+$")])
    alone = local_slice(fetched, part == "11:00", schema)
    assert str(alone["trades"].dtype) == "int64" and alone["trades"].tolist() == [5]
    assert validate_local(alone, digits).success
    with_null = local_slice(fetched, part == "10:00", schema)
    assert str(with_null["trades"].dtype) == "float64"  # as a fetch of these rows alone gives it
    assert not validate_local(fetched[part == "11:00"].reset_index(drop=True), digits).success  # the widened slice


def test_contract_checks_validate_from_several_threads_at_once():
    """A run's contract checks run in threads at once (thread_executor); Great Expectations' one context
    per process must not lose a data asset one thread adds while another adds its own."""
    import sys
    import threading

    import pandas as pd

    from laminar_assets.contracts.expectations import validate_local, warm_up
    from laminar_assets.contracts.model import Contract, ContractColumn, ExpectationRule

    warming = warm_up()  # GE imported and its context built first, as in a run
    if warming:
        warming.join(120)

    contracts = [Contract(table=f"threads_t{i}", kind="sink", columns={"a": ContractColumn(type="bigint", nullable=False)},
                          expectations=[ExpectationRule(expect="between", column="a", min=0, max=10)])
                 for i in range(4)]
    frame = pd.DataFrame({"a": [1, 2, 3]})
    start, errors = threading.Barrier(4, timeout=60), []

    def check(contract):
        try:
            start.wait()
            for j in range(12):
                assert validate_local(frame, contract, name=f"p{j}").success
        except Exception as exc:  # noqa: BLE001 - collected and asserted on below
            errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=check, args=(c,)) for c in contracts]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: a race shows at once
    try:
        [t.start() for t in threads]
        [t.join(120) for t in threads]
    finally:
        sys.setswitchinterval(interval)
    assert errors == []
