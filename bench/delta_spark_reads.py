"""Reading a pinned Delta version: Laminar's own path against delta-spark's (issue #47).

Laminar reads a snapshot by listing its files with `deltalake`, reading the Parquet through Spark
and decoding deletion vectors itself (`engine.spark.read`). delta-spark reads
`format("delta").option("versionAsOf", v)` with the vectors applied by the connector. Both are
timed on the same tables, in one warm session, each followed by the same aggregate (so the whole
scan runs), and their answers compared:

* `plain`: the benchmark's kind of table, trades in one file per commit, no deletion vectors;
* `vectors`: the same table after delta-spark deleted scattered rows in many commits with deletion
  vectors on, so that every file carries a vector.

    python -m bench.delta_spark_reads [--rows 1000000] [--commits 24] [--deletes 20] [--rounds 5]

Prints one JSON line per (table, path) with the median seconds, and whether the answers agree.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import numpy as np
import pyarrow as pa
from deltalake import write_deltalake

from laminar_assets.engine.delta import snapshot_files, table_info
from laminar_assets.engine.spark import SparkOptions, build_session
from laminar_assets.engine.spark.read import read_source
from laminar_assets.engine.spark.session import delta_available

AGG = "count(*) AS n, sum(px) AS px, count(DISTINCT sym) AS syms"


def _write(path: str, rows: int, commits: int) -> None:
    rng = np.random.default_rng(7)
    per = rows // commits
    for c in range(commits):
        ids = np.arange(c * per, (c + 1) * per)
        ts = np.datetime64("2024-01-01T00:00:00", "us") + (ids * 3_600_000_000 // per).astype("timedelta64[us]")
        write_deltalake(path, pa.table({"id": ids, "ts": pa.array(ts, pa.timestamp("us", "UTC")),
                                        "sym": pa.array([f"S{i % 50}" for i in ids]),
                                        "px": rng.uniform(1, 100, per)}), mode="append")


def laminar_read(spark, path: str, version: int):
    info = table_info("bench", path, version)
    read_source(spark, snapshot_files(info, None, keep_null_files=True), info).createOrReplaceTempView("bench_rows")
    return spark.sql(f"SELECT {AGG} FROM bench_rows").collect()[0]


def delta_spark_read(spark, path: str, version: int):
    spark.read.format("delta").option("versionAsOf", version).load(path).createOrReplaceTempView("bench_rows")
    return spark.sql(f"SELECT {AGG} FROM bench_rows").collect()[0]


def _time(fn, rounds: int):
    answer = fn()  # warm-up (and the answer compared)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return answer, times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--commits", type=int, default=24)
    ap.add_argument("--deletes", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args(argv)
    spark = build_session(SparkOptions(master="local[2]", shuffle_partitions=2))
    if not delta_available(spark):
        raise SystemExit("delta-spark's jars are not installed: python -m laminar_assets.deploy.jar_installer delta")
    agree = True
    with tempfile.TemporaryDirectory(prefix="laminar-delta-reads-") as work:
        path = f"{work}/trades"
        _write(path, a.rows, a.commits)
        tables = {"plain": 0}
        spark.sql(f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ('delta.enableDeletionVectors' = 'true')")
        for d in range(a.deletes):  # scattered rows of every file: each commit updates every file's vector
            spark.sql(f"DELETE FROM delta.`{path}` WHERE id % 997 = {d * 37 % 997}")
        tables["vectors"] = spark.sql(f"DESCRIBE HISTORY delta.`{path}` LIMIT 1").collect()[0]["version"]
        tables["plain"] = a.commits - 1
        for name, version in tables.items():
            answers = {}
            for label, fn in (("laminar", laminar_read), ("delta-spark", delta_spark_read)):
                answer, times = _time(lambda fn=fn, v=version: fn(spark, path, v), a.rounds)
                answers[label] = (answer["n"], round(answer["px"], 6), answer["syms"])
                print(json.dumps({"table": name, "path": label, "version": version, "rows": answer["n"],
                                  "median_s": round(statistics.median(times), 3),
                                  "rounds_s": [round(t, 3) for t in times]}))
            agree &= answers["laminar"] == answers["delta-spark"]
    print(json.dumps({"answers_agree": agree}))
    spark.stop()
    return 0 if agree else 1


if __name__ == "__main__":
    raise SystemExit(main())
