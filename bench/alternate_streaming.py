"""Laminar's batched pass and Structured Streaming on the same Δ, alternated round by round.

    python -m bench.alternate_streaming [--rows 10000000] [--rounds 12] [--skip 2]

The full benchmark times each variant once per round in a fixed order, so a drift of the machine's
speed between variants moves the ratio. Here every round commits one Δ (the benchmark's shape),
and both run on it in one warm session, the order swapped every round. Prints each round and the
median ratio (Laminar / stream) over the rounds after the first `--skip` (JIT warm-up). Results
are not checked here: `bench.run` checks both against a full recompute.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile

from . import environment
from .config import FULL
from .specs import bench_specs
from .streaming import StreamingJob
from .variants import laminar_pass
from .workload import Lake, added_files, write_base, write_delta_round


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.alternate_streaming", description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=10_000_000, help="base rows")
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--skip", type=int, default=2, help="first rounds left out of the medians")
    args = parser.parse_args(argv)
    if args.rounds <= args.skip:
        parser.error("--rounds must be larger than --skip")
    from laminar_assets.engine import Engine

    profile = FULL
    work = tempfile.mkdtemp(prefix="laminar-alternate-")
    spark = environment.start_session(profile, {})
    try:
        lake = Lake(os.path.join(work, "lake"))
        specs = bench_specs(lake.uri)
        base = write_base(lake, args.rows, profile.base_hours, hours_per_commit=profile.hours_per_commit,
                          correction_hours=profile.correction_hours, seed=profile.seed)
        version = lake.version()
        engine = Engine(spark, os.path.join(work, "laminar"))
        laminar_pass(engine, specs, after=None, batched=True)
        stream = StreamingJob(spark, specs, os.path.join(work, "stream"))
        stream.add_files(lake.files(version), "base")
        stream.run()
        laminar_s, stream_s = [], []
        for r in range(args.rounds):
            write_delta_round(lake, base, profile, r)
            new = lake.version()

            def run_stream() -> float:  # timed in this round only
                stream.add_files(added_files(lake, version, new), f"delta{r}")  # noqa: B023
                return stream.run().wall_s

            if r % 2:
                stream_s.append(run_stream())
            laminar_s.append(laminar_pass(engine, specs, after=version, batched=True).wall_s)
            if not r % 2:
                stream_s.append(run_stream())
            version = new
            print(f"round {r + 1} ({'stream' if r % 2 else 'Laminar'} first): Laminar {laminar_s[-1]:.2f} s, "
                  f"stream {stream_s[-1]:.2f} s, ratio {laminar_s[-1] / stream_s[-1]:.2f}", flush=True)
        ratios = [a / b for a, b in zip(laminar_s[args.skip:], stream_s[args.skip:])]
        print(f"rounds {args.skip + 1}-{args.rounds}: Laminar median {statistics.median(laminar_s[args.skip:]):.3f} s, "
              f"stream median {statistics.median(stream_s[args.skip:]):.3f} s, ratio median "
              f"{statistics.median(ratios):.3f} (min {min(ratios):.2f}, max {max(ratios):.2f}, "
              f"<= 1 in {sum(x <= 1 for x in ratios)} of {len(ratios)})")
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
