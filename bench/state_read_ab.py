"""The state a pass merges into, read by the driver or by Spark, on the S3 variant: `python -m bench.state_read_ab
[LATENCY_MS] [ROUNDS]` (default 20 ms, 7 rounds).

One local S3 server sleeping LATENCY_MS before each request, the full profile's base (1M rows over 96 hours) and its
Δ rounds (appends into the newest hours, late rows into older ones); two engines over the same source, each with its
own state and sinks: the default (`EngineOptions.driver_read_below_bytes`: the driver reads small state and hands
Spark the rows) and Spark reading the state files (`driver_read_below_bytes=0`). Each round runs both flows' batched
runs with both engines, in alternating order, and prints their seconds; at the end the medians without the first
round (the JVM's warm-up). Reports numbers only (docs/PERFORMANCE.md, "The small state read by the driver")."""

from __future__ import annotations

import statistics
import sys
import time

from laminar_assets import storage
from laminar_assets.deploy.local_s3 import LocalS3
from laminar_assets.engine import Engine, EngineOptions

from .config import PROFILES
from .environment import start_session
from .specs import bench_specs
from .variants import laminar_pass, touched_partitions
from .workload import Lake, write_base, write_delta_round


def main(argv: list[str]) -> int:
    latency_ms = float(argv[0]) if argv else 20.0
    rounds = int(argv[1]) if len(argv) > 1 else 7
    profile = PROFILES["full"]
    spark = start_session(profile, {})
    seconds: dict[str, dict[str, list[float]]] = {"driver": {}, "spark": {}}
    try:
        with LocalS3() as server:
            storage.mount("s3://", server.options)
            bucket = server.create_bucket("state-read-ab")
            lake = Lake(f"{bucket}/source")
            base = write_base(lake, profile.s3_rows, profile.base_hours, hours_per_commit=profile.hours_per_commit,
                              correction_hours=profile.correction_hours, seed=profile.seed)
            specs = bench_specs(lake.uri)
            engines = {"driver": Engine(spark, f"{bucket}/by-driver"),
                       "spark": Engine(spark, f"{bucket}/by-spark", options=EngineOptions(driver_read_below_bytes=0))}
            for engine in engines.values():
                laminar_pass(engine, specs, after=None, batched=True)
            for r in range(1, rounds + 1):
                before = lake.version()
                write_delta_round(lake, base, profile, r)
                parts = touched_partitions(engines["driver"], specs, before)
                server.set_latency(latency_ms)
                for spec in specs:
                    for name in (["driver", "spark"] if r % 2 else ["spark", "driver"]):
                        t = time.perf_counter()
                        engines[name].run_many(spec, parts[spec.name])
                        seconds[name].setdefault(spec.name, []).append(round(time.perf_counter() - t, 3))
                server.set_latency(0)
                print(r, {n: {f: s[-1] for f, s in by.items()} for n, by in seconds.items()}, flush=True)
    finally:
        spark.stop()
    for name, by in seconds.items():
        print(name, {f: {"median_s": round(statistics.median(s[1:] or s), 3), "rounds_s": s} for f, s in by.items()})
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
