"""Are two sinks equal? Checked in Spark: a full outer join on the window and keys, then every value
column compared — integers exactly, floating point within 1e-9 relative (1e-12 absolute near 0).

Only aggregated sinks are compared (tens of thousands of rows at 10M source rows); no source
table is ever collected to the driver. At most a few mismatching rows come back, as examples.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import FractionalType

from laminar_assets import storage
from laminar_assets.engine.delta import open_delta

REL = 1e-9
ABS = 1e-12


def read_delta(spark: SparkSession, uri: str, version: int | None = None) -> DataFrame:
    """A Delta table's current (or pinned) snapshot as a Spark DataFrame, from the files deltalake lists.
    (No Delta JVM connector here; Laminar's and the harness's tables have no deletion vectors.)"""
    dt = open_delta(uri, version=version)
    files = [storage.spark_uri(u.removeprefix("file://")) for u in dt.file_uris()]
    if not files:
        import pyarrow as pa
        from pyspark.sql.pandas.types import from_arrow_schema

        return spark.createDataFrame([], from_arrow_schema(pa.schema(dt.schema().to_arrow())))
    return spark.read.parquet(*files)


def _flagged(expected: DataFrame, actual: DataFrame, keys: list[str]) -> DataFrame:
    """The full outer join of two sinks, one row per window and key, flagged: extra, missing, and
    the names of the value columns that differ."""
    values = [c for c in expected.columns if c not in keys]
    fractional = {f.name for f in expected.schema.fields if isinstance(f.dataType, FractionalType)}
    e = expected.select(*keys, *[F.col(c).alias(f"e__{c}") for c in values], F.lit(True).alias("e__row"))
    a = actual.select(*keys, *[F.col(c).alias(f"a__{c}") for c in values], F.lit(True).alias("a__row"))
    joined = e.join(a, keys, "full_outer")
    bad_cols = []
    for c in values:
        x, y = F.col(f"e__{c}"), F.col(f"a__{c}")
        if c in fractional:
            close = (x.isNull() & y.isNull()) | (
                F.abs(x - y) <= F.greatest(F.lit(ABS), F.lit(REL) * F.greatest(F.abs(x), F.abs(y))))
            bad_cols.append(F.when(~F.coalesce(close, F.lit(False)), F.lit(c)))
        else:
            bad_cols.append(F.when(~x.eqNullSafe(y), F.lit(c)))
    return joined.select(
        *keys,
        F.col("e__row").isNull().alias("__extra"),
        F.col("a__row").isNull().alias("__missing"),
        F.concat_ws(",", *bad_cols).alias("__cols"),
    )


def compare_all(items: dict[str, tuple[DataFrame, DataFrame, list[str]]], *, examples: int = 3) -> dict[str, dict]:
    """Several comparisons (name -> (expected, actual, keys)) counted in one Spark action; returns
    name -> counts and `equal`. Column sets must match. Examples are fetched only for differences."""
    out: dict[str, dict] = {}
    flagged: dict[str, DataFrame] = {}
    stats = None
    for name, (expected, actual, keys) in items.items():
        if sorted(expected.columns) != sorted(actual.columns):
            out[name] = {"equal": False, "error": f"columns differ: expected {sorted(expected.columns)}, "
                                                  f"found {sorted(actual.columns)}"}
            continue
        flagged[name] = _flagged(expected, actual, keys)
        one = flagged[name].agg(
            F.sum((~F.col("__extra")).cast("long")).alias("rows_expected"),
            F.sum((~F.col("__missing")).cast("long")).alias("rows_actual"),
            F.sum(F.col("__extra").cast("long")).alias("extra"),
            F.sum(F.col("__missing").cast("long")).alias("missing"),
            F.sum(((F.col("__cols") != "") & ~F.col("__extra") & ~F.col("__missing")).cast("long")).alias("mismatched"),
        ).withColumn("name", F.lit(name))
        stats = one if stats is None else stats.unionByName(one)
    for row in (stats.collect() if stats is not None else []):
        res = {
            "rows_expected": int(row["rows_expected"] or 0),
            "rows_actual": int(row["rows_actual"] or 0),
            "missing_rows": int(row["missing"] or 0),
            "extra_rows": int(row["extra"] or 0),
            "mismatched_rows": int(row["mismatched"] or 0),
        }
        res["equal"] = res["missing_rows"] == res["extra_rows"] == res["mismatched_rows"] == 0
        if not res["equal"]:
            f = flagged[row["name"]]
            bad = f.where(F.col("__extra") | F.col("__missing") | (F.col("__cols") != "")).limit(examples)
            res["examples"] = [{k: str(v) for k, v in r.asDict().items()} for r in bad.collect()]
        out[row["name"]] = res
    return out


def compare(expected: DataFrame, actual: DataFrame, keys: list[str], *, examples: int = 3) -> dict:
    """Row-by-row comparison of two sinks; returns counts and `equal`."""
    return compare_all({"it": (expected, actual, keys)}, examples=examples)["it"]


def equal_sinks(spark: SparkSession, specs, expected: dict[str, str], actuals: dict[str, dict]) -> dict:
    """Compare each flow's sink, for each variant (name -> flow -> Delta uri or DataFrame), with the
    full recompute's (flow -> Delta uri); all in one Spark action. Returns variant -> flow -> result."""
    from .variants import sink_keys

    items = {}
    for variant, actual in actuals.items():
        for spec in specs:
            got = actual[spec.name]
            got = read_delta(spark, got) if isinstance(got, str) else got
            items[f"{variant}|{spec.name}"] = (read_delta(spark, expected[spec.name]), got, sink_keys(spec))
    out: dict[str, dict] = {}
    for name, result in compare_all(items).items():
        variant, flow = name.split("|")
        out.setdefault(variant, {})[flow] = result
    return out


def all_equal(checks: dict) -> bool:
    """True when every flow's result in `checks` (flow -> result) is equal."""
    return all(c.get("equal") for c in checks.values())
