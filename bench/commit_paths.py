"""Which Delta write path should a run's state/sink replace use? (issue #11, item 7)

Times three ways to replace the rows of some hourly partitions of a state-like table whose
rows Spark computed, and checks that all three leave the same table:

* `laminar`: Spark writes Parquet files laid out per partition (`output.uncommitted.write_uncommitted`) and one
  `deltalake` transaction removes the partitions' old files and adds the new ones
  (`output.commit.replace_ranges`). The rows never reach the driver.
* `predicate`: the rows are collected to the driver as Arrow (`DataFrame.toArrow()`) and
  `write_deltalake(mode="overwrite", predicate=...)` replaces the ranges.
* `merge`: the same Arrow rows, `DeltaTable.merge` on the keys with update, insert and
  delete-by-source restricted to the ranges.
* `delta-spark-replace` (with delta-spark installed): Spark writes and commits through delta-spark,
  `mode("overwrite")` with `replaceWhere` on the ranges and the run's `txnAppId`/`txnVersion`.
* `delta-spark-merge`: delta-spark's `MERGE` of the rows (a Spark DataFrame, never collected) on the
  keys, with `WHEN NOT MATCHED BY SOURCE AND <in the ranges> THEN DELETE`.

    python -m bench.commit_paths [--partitions 96] [--touched 12] [--rows-per-partition 3000]

Prints one JSON line per path (median seconds over `--rounds`) and whether the tables match.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from datetime import datetime, timedelta

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake
from pyspark.sql import functions as F

from laminar_assets.engine import Interval
from laminar_assets.engine.delta.arrow_reads import read_arrow
from laminar_assets.engine.output import replace_ranges, write_uncommitted
from laminar_assets.engine.spark import build_session
from laminar_assets.engine.spark.session import delta_available

START = datetime(2024, 1, 2)
KEYS = ("symbol", "window_start")


def state_frame(spark, first_hour: int, hours: int, rows_per_hour: int, salt: int):
    """A state-like frame: `rows_per_hour` (symbol, minute) rows per hour, a partition id column."""
    symbols = max(1, rows_per_hour // 60)
    n = hours * 60 * symbols
    start = START + timedelta(hours=first_hour)
    return (spark.range(n)
            .withColumn("minute", (F.col("id") / symbols).cast("long"))
            .withColumn("symbol", F.concat(F.lit("S"), (F.col("id") % symbols).cast("string")))
            .withColumn("window_start", F.lit(start).cast("timestamp_ntz")
                        + F.make_dt_interval(F.lit(0), F.lit(0), F.col("minute")))
            .withColumn("pv", F.col("id").cast("double") * 1.5 + salt)
            .withColumn("v", F.col("id") % 97 + salt)
            .withColumn("n", F.lit(1).cast("long") + salt)
            .withColumn("__part", F.date_format("window_start", "yyyy-MM-dd-HH"))
            .drop("id", "minute"))


def _ranges(first_hour: int, hours: int) -> list[Interval]:
    return [Interval(START + timedelta(hours=h), START + timedelta(hours=h + 1))
            for h in range(first_hour, first_hour + hours)]


def _base(spark, uri: str, partitions: int, rows: int) -> None:
    base = state_frame(spark, 0, partitions, rows, salt=0).repartition("__part")
    files = write_uncommitted(base, uri, "base", by="__part")
    replace_ranges(spark, files, table_uri=uri, column="window_start", ranges=[], transactions=[],
                   metadata={}, run_id="base", append_only=True, owner="bench")


def run_laminar(spark, uri, new, ranges, i):
    files = write_uncommitted(new.repartition("__part"), uri, f"r{i}", by="__part")
    replace_ranges(spark, files, table_uri=uri, column="window_start", ranges=ranges,
                   transactions=[("bench", i)], metadata={}, run_id=f"r{i}", owner="bench")


def _predicate(ranges) -> str:
    lo, hi = min(r.start for r in ranges), max(r.end for r in ranges)
    return f"window_start >= '{lo:%Y-%m-%d %H:%M:%S}' AND window_start < '{hi:%Y-%m-%d %H:%M:%S}'"


def run_predicate(spark, uri, new, ranges, i):
    rows = new.drop("__part").toArrow()  # the driver collects every row of the run
    write_deltalake(uri, rows, mode="overwrite", predicate=_predicate(ranges))


def run_merge(spark, uri, new, ranges, i):
    rows = new.drop("__part").toArrow()
    on = " AND ".join(f"t.{k} = s.{k}" for k in KEYS)
    in_range = _predicate(ranges).replace("window_start", "t.window_start")
    (DeltaTable(uri).merge(rows, on, source_alias="s", target_alias="t")
     .when_matched_update_all().when_not_matched_insert_all()
     .when_not_matched_by_source_delete(in_range).execute())


def run_delta_spark_replace(spark, uri, new, ranges, i):
    (new.drop("__part").write.format("delta").mode("overwrite").option("replaceWhere", _predicate(ranges))
     .option("txnAppId", "bench").option("txnVersion", i).save(uri))


def run_delta_spark_merge(spark, uri, new, ranges, i):
    new.drop("__part").createOrReplaceTempView("bench_new_rows")
    on = " AND ".join(f"t.{k} = s.{k}" for k in KEYS)
    in_range = _predicate(ranges).replace("window_start", "t.window_start")
    spark.sql(f"MERGE INTO delta.`{uri}` t USING bench_new_rows s ON {on} WHEN MATCHED THEN UPDATE SET * "
              f"WHEN NOT MATCHED THEN INSERT * WHEN NOT MATCHED BY SOURCE AND {in_range} THEN DELETE")


PATHS = {"laminar": run_laminar, "predicate": run_predicate, "merge": run_merge,
         "delta-spark-replace": run_delta_spark_replace, "delta-spark-merge": run_delta_spark_merge}


def _content(uri: str):
    tbl = read_arrow(uri).sort_by([("window_start", "ascending"), ("symbol", "ascending")])
    return tbl.select(["symbol", "window_start", "pv", "v", "n"])


def rows_sharing_files(uri: str, hour: Interval) -> int:
    """Rows a later replace of `hour` alone must rewrite: the other rows of the files holding it."""
    adds = pa.table(DeltaTable(uri).get_add_actions(flatten=True)).to_pylist()
    lo, hi = hour.start.replace(tzinfo=None), hour.end.replace(tzinfo=None)
    naive = [{**a, "lo": a["min.window_start"].replace(tzinfo=None), "hi": a["max.window_start"].replace(tzinfo=None)}
             for a in adds]
    shared = [a for a in naive if a["lo"] < hi and a["hi"] >= lo]
    return sum(a["num_records"] for a in shared)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--partitions", type=int, default=96)
    ap.add_argument("--touched", type=int, default=12)
    ap.add_argument("--rows-per-partition", type=int, default=3000)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)
    spark = build_session()
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    out, contents = {}, {}
    paths = {n: fn for n, fn in PATHS.items() if delta_available(spark) or not n.startswith("delta-spark")}
    with tempfile.TemporaryDirectory(prefix="laminar-commit-paths-") as work:
        for name, fn in paths.items():
            uri = f"{work}/{name}"
            _base(spark, uri, a.partitions, a.rows_per_partition)
            first = a.partitions - a.touched
            ranges = _ranges(first, a.touched)
            times = []
            for i in range(1, a.rounds + 1):
                new = state_frame(spark, first, a.touched, a.rows_per_partition, salt=i).cache()
                new.count()  # computing the rows is not what is timed
                t0 = time.perf_counter()
                fn(spark, uri, new, ranges, i)
                times.append(time.perf_counter() - t0)
                new.unpersist()
            dt = DeltaTable(uri)
            one = ranges[0]
            out[name] = {"median_s": round(statistics.median(times), 3), "rounds_s": [round(t, 3) for t in times],
                         "files": len(dt.file_uris()), "version": dt.version(),
                         "rows_in_files_of_one_partition": rows_sharing_files(uri, one)}
            contents[name] = _content(uri)
        same = all(contents[n].equals(contents["laminar"]) for n in contents)
        for name, row in out.items():
            print(json.dumps({"path": name, **row, "partitions": a.partitions, "touched": a.touched,
                              "rows_replaced": a.touched * 60 * max(1, a.rows_per_partition // 60)}))
        print(json.dumps({"tables_equal": same}))
    spark.stop()
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
