"""What does a stage's correction cost: its partition recomputed whole, or its changed keys alone? (#49)

A stage (filter, derived column, dedup by trade id) over one hour of trades. Each round updates the
price of some trades and deletes others (the demo's second batch: 14 corrections, 8 cancellations),
then brings the stage up to date twice, over the same source, each engine with its own output:

* `whole`: the partition recomputed from the snapshot and diffed with the rows kept
  (`key_refill_min_bytes` above any output: what every stage did before #49);
* `keys`: the changed dedup keys alone (`key_refill_min_bytes=0`): one Spark job names the keys,
  the pass recomputes them, the commit rewrites only the output files holding them.

The two run alternately, the order swapped every round; after each round both outputs must be
equal (exit status 1 otherwise). Prints one JSON line per size: median seconds of each, the keys
recomputed, the source files each read (median) and the output's bytes.

    python -m bench.stage_corrections [--rows 13000,114000,343000] [--rounds 5] [--files 8]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime

import numpy as np
import pandas as pd
import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from laminar_assets.engine import Engine, EngineOptions, StageSpec
from laminar_assets.engine.delta.arrow_reads import read_arrow
from laminar_assets.engine.spark import build_session
from laminar_assets.engine.spark.session import SparkOptions

HOUR = "2024-01-02-00:00"
START = datetime(2024, 1, 2)
CORRECTIONS, CANCELLATIONS = 14, 8


def stage(source: str) -> StageSpec:
    return StageSpec(name="norm", source=source, event_time="ts", dedup_key=("trade_id",), filter="qty > 0",
                     derived={"notional": "px * qty"})


def trades(rng: np.random.Generator, first: int, n: int) -> pd.DataFrame:
    seconds = np.sort(rng.integers(0, 3600 * 1_000_000, n))
    return pd.DataFrame({
        "trade_id": np.arange(first, first + n, dtype="int64"),
        "ts": pd.Timestamp(START, tz="UTC") + pd.to_timedelta(seconds, unit="us"),
        "sym": pd.Series(rng.choice([f"S{i:03d}" for i in range(200)], n)).astype("string"),
        "px": rng.uniform(10, 500, n).round(2),
        "qty": rng.integers(1, 1000, n).astype("int64"),
    }).astype({"ts": "datetime64[us, UTC]"})


def write_source(path: str, rows: int, files: int, rng: np.random.Generator) -> None:
    """`rows` trades of one hour in `files` commits (the output then has as many files)."""
    per = -(-rows // files)
    for i in range(files):
        write_deltalake(path, trades(rng, i * per + 1, min(per, rows - i * per)), mode="append",
                        configuration={"delta.enableChangeDataFeed": "true"})


def correct(path: str, rows: int, rng: np.random.Generator) -> None:
    """One batch of corrections (new prices) and one of cancellations, of random trade ids."""
    dt = DeltaTable(path)
    ids = rng.choice(np.arange(1, rows + 1), CORRECTIONS + CANCELLATIONS, replace=False)
    dt.update(updates={"px": "px + 0.01"}, predicate=f"trade_id IN ({', '.join(map(str, ids[:CORRECTIONS]))})")
    DeltaTable(path).delete(f"trade_id IN ({', '.join(map(str, ids[CORRECTIONS:]))})")


def output(root: str) -> pd.DataFrame:
    df = read_arrow(os.path.join(root, "norm")).to_pandas()
    return df.sort_values("trade_id").reset_index(drop=True)[sorted(df.columns)]


def measure(spark, rows: int, rounds: int, files: int, work: str) -> dict:
    rng = np.random.default_rng(rows)
    source = os.path.join(work, f"raw-{rows}")
    write_source(source, rows, files, rng)
    spec = stage(source)
    engines = {"whole": Engine(spark, os.path.join(work, f"whole-{rows}"), options=EngineOptions(key_refill_min_bytes=1 << 62)),
               "keys": Engine(spark, os.path.join(work, f"keys-{rows}"), options=EngineOptions(key_refill_min_bytes=0))}
    for e in engines.values():
        e.run(spec, HOUR)
    seconds: dict[str, list[float]] = {k: [] for k in engines}
    files_read: dict[str, list[int]] = {k: [] for k in engines}
    keys = []
    for r in range(rounds):
        correct(source, rows, rng)
        order = list(engines) if r % 2 == 0 else list(reversed(engines))
        for name in order:
            t0 = time.perf_counter()
            result = engines[name].run(spec, HOUR)
            seconds[name].append(time.perf_counter() - t0)
            files_read[name].append(result.metrics.get("files_read", 0))
            if name == "keys":
                keys.append(result.metrics.get("refilled_keys", 0))
        whole, by_key = output(engines["whole"].root), output(engines["keys"].root)
        if not whole.equals(by_key):
            raise SystemExit(f"rows={rows} round {r}: the outputs differ")
    size = sum(int(f) for f in pa.table(DeltaTable(os.path.join(engines["keys"].root, "norm"))
                                        .get_add_actions(flatten=True))["size_bytes"].to_pylist())
    return {"rows": rows, "output_bytes": size, "rounds": rounds, "keys_per_round": keys,
            "whole_s": round(statistics.median(seconds["whole"]), 3), "keys_s": round(statistics.median(seconds["keys"]), 3),
            "files_read": {k: statistics.median(v) for k, v in files_read.items()}, "outputs_equal": True}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", default="13000,114000,343000", help="rows of the hour, per size (comma-separated)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--files", type=int, default=8, help="source commits (and output files) the hour starts with")
    ap.add_argument("--driver-memory", default="4g")
    args = ap.parse_args(argv)
    spark = build_session(SparkOptions(master="local[2]", shuffle_partitions=2, driver_memory=args.driver_memory))
    try:
        with tempfile.TemporaryDirectory(prefix="laminar-stage-bench-") as work:
            for rows in (int(x) for x in args.rows.split(",")):
                print(json.dumps(measure(spark, rows, args.rounds, args.files, work)), flush=True)
    finally:
        spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())

