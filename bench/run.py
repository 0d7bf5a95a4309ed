"""`python -m bench.run --profile full|smoke`: run the benchmark and write the report.

One process, one warm Spark session (local[2]), for every variant and size:

untimed warm-up round on a small table (full profile), then for each base size B (smallest first):
  generate the base (time-ordered Delta commits); bring Laminar up to date on it in two storage roots
  (one per Laminar path: `Engine.run` per partition, `Engine.run_many` batched), and let the
  streaming job process it too (untimed: the "having processed the base first" part);
  commit Δ (appends into the newest windows + late rows into older partitions), then time
    1. Laminar incremental, both paths (touched partitions from commit statistics)
    3. full recompute            (window() + groupBy over every source file, whole sinks rewritten)
    2. Laminar refill touched, both paths (force=True on the same partitions)
    4. Structured Streaming      (AvailableNow over Δ's files, RocksDB state, per-batch output)
    5. Spark Declarative Pipelines (`spark-pipelines run`, materialized views; bench/sdp_peer.py;
       by default at the largest size of the full profile only, `--sdp`)
  and check every variant's sinks against the full recompute;
  then commit an update and a delete, time Laminar on them and check against a new full recompute.
  (Smoke profile: sizes below the largest run only 1 and 3, for the scaling numbers.)
then time end-to-end freshness through Dagster (sensor + runs) on a separate small lake.

Exit status: 0 when every result matched the full recompute (whatever the speed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
import traceback

from . import environment, render, report, sdp_peer
from .config import PROFILES, Profile, parse_latencies
from .equality import all_equal as _all_equal
from .equality import equal_sinks as _equal
from .freshness import measure_freshness
from .measure import JobCounter, MemorySampler, jvm_memory, load_average, timed
from .object_store import s3_variant
from .rounds import delta_round, timed_pass
from .specs import bench_specs
from .streaming import StreamingJob
from .variants import PATHS, full_recompute, has_run_many, laminar_pass
from .workload import Lake, write_base, write_corrections

REPO = environment.REPO
EXTREME_PATHS = ("cost", "merge", "windows")  # the ways of `EngineOptions.extreme_refill`, timed side by side


def bench_size(spark, profile: Profile, base_rows: int, work: str, counter: JobCounter,
               sampler: MemorySampler, *, every_variant: bool = True, sdp: bool = False) -> dict:
    """Every variant at one base size; returns its section of the results. `every_variant=False`:
    only Laminar incremental (both paths) and the full recompute it is checked against. `sdp`: the
    Spark Declarative Pipelines peer too (with every variant)."""
    from laminar_assets.engine import Engine, EngineOptions

    if os.path.isdir(work):
        shutil.rmtree(work)
    lake = Lake(os.path.join(work, "lake"))
    specs = bench_specs(lake.uri)  # absolute source path: each Laminar path has its own root
    res: dict = {"base_rows": base_rows, "delta_rows": profile.delta_rows}
    label = f"B={base_rows:,}"
    with sampler.during(f"{label} generate"), timed(res, "t_generate_base_s"):
        base = write_base(lake, base_rows, profile.base_hours, hours_per_commit=profile.hours_per_commit,
                          correction_hours=profile.correction_hours, seed=profile.seed)
    v_base = lake.version()
    res["base_commits"] = len(base.commits)
    res["base_partitions"] = profile.base_hours
    print(f"  {label}: base written ({len(base.commits)} commits, {profile.base_hours} hourly partitions) "
          f"in {res['t_generate_base_s']:.1f}s", flush=True)

    # One engine (own root: state, sinks, watermarks) per Laminar path, on the same source table.
    engines = {"per_partition": Engine(spark, os.path.join(work, "laminar-per_partition"))}
    if has_run_many(engines["per_partition"]):
        engines["batched"] = Engine(spark, os.path.join(work, "laminar-batched"))
    res["laminar_paths"] = {k: PATHS[k] for k in engines}
    for path, engine in engines.items():
        with sampler.during(f"{label} laminar bootstrap {path}"):
            boot = laminar_pass(engine, specs, after=None, batched="batched" in engines)
        res[f"laminar_bootstrap_{path}"] = boot.summary()
        print(f"  {label}: Laminar bootstrap ({path} root) {boot.runs} partitions in {boot.wall_s:.1f}s", flush=True)

    if every_variant:
        stream = StreamingJob(spark, specs, os.path.join(work, "stream"))
        stream.add_files(lake.files(v_base), "base")
        with sampler.during(f"{label} streaming base"):
            s_base = stream.run()
        res["streaming_base"] = s_base.summary()
        print(f"  {label}: streaming processed the base in {s_base.wall_s:.1f}s", flush=True)
    peer = None
    if every_variant and sdp:
        try:
            peer = sdp_peer.SdpPeer(specs, os.path.join(work, "sdp"), driver_memory=profile.driver_memory,
                                    shuffle_partitions=profile.shuffle_partitions)
            res["sdp_base"] = sdp_peer.base_pass(peer, lake.files(v_base), sampler, label)
        except Exception as exc:  # noqa: BLE001  (recorded in the results; the benchmark goes on)
            res["sdp_errors"], peer = [f"base: {exc!r}"[:1000]], None

    # Δ rounds: the same shape each time (new rows at a tip one append window further, late rows into
    # other older partitions); every variant is timed per round and the median is reported.
    ctx = dict(spark=spark, profile=profile, lake=lake, base=base, specs=specs, engines=engines, counter=counter,
               sampler=sampler, label=label, work=work, every_variant=every_variant,
               stream=stream if every_variant else None, sdp=peer)
    rounds, v_prev = [], v_base
    for r in range(profile.rounds):
        rounds.append(delta_round(ctx, r, v_prev))
        v_prev = rounds[-1]["version"]
    res["rounds"] = [{k: v for k, v in rd.items()
                      if k.startswith(("t_", "equality")) or k in ("delta_commits", "partitions_touched", "sdp_error")}
                     for rd in rounds]
    res["sdp_errors"] = res.get("sdp_errors", []) + [f"round {i + 1}: {rd['sdp_error']}"
                                                     for i, rd in enumerate(rounds) if rd.get("sdp_error")]
    if not res["sdp_errors"]:
        del res["sdp_errors"]
    for key in dict.fromkeys(k for rd in rounds for k in rd if k.startswith("t_") and k.endswith("_s")):
        samples = [(i, rd[key]) for i, rd in enumerate(rounds) if rd.get(key) is not None]  # a failed peer: none
        if not samples:
            continue
        values = [v for _, v in samples]
        res[key] = round(statistics.median(values), 4)
        res[f"{key[:-2]}_samples_s"] = values
        median_round = min(samples, key=lambda iv: abs(iv[1] - res[key]))[0]
        section = key[2:-2]
        if section in rounds[median_round]:
            res[section] = {**rounds[median_round][section], "round": median_round}
    res["delta_commits"] = rounds[0]["delta_commits"]
    res["rounds_equal"] = [rd["equal"] for rd in rounds]
    if not every_variant:
        res["results_equal"] = all(res["rounds_equal"])
        if not os.environ.get("BENCH_KEEP_WORK"):
            shutil.rmtree(work, ignore_errors=True)
        return res
    v_delta = v_prev
    sinks = {path: {s.name: e.layout.sink_uri(s) for s in specs} for path, e in engines.items()}

    # updates and deletes: Laminar only (a file source cannot see them). The batched root is copied first, so
    # that each way a correction under a min/max/first/last can go (`EngineOptions.extreme_refill`) is timed
    # on the same state beside the one the engine chose: a wrong choice shows in every run.
    copies: list[tuple[str, str]] = []  # (way, root) in the order they run: each round rotates the ways
    if "batched" in engines:
        for r in range(max(profile.rounds, 1)):
            for how in EXTREME_PATHS[r % 3:] + EXTREME_PATHS[:r % 3]:
                copies.append((how, os.path.join(work, f"laminar-batched-{how}-{r}")))
                shutil.copytree(engines["batched"].root, copies[-1][1])
    corrections = write_corrections(lake, base, every=profile.correction_every,
                                    correction_hours=profile.correction_hours)
    v_corr = lake.version()
    ud: dict = {"commits": [{"version": c.version, "kind": c.kind, "rows": c.rows} for c in corrections]}
    for path, engine in engines.items():
        done, ud[path] = timed_pass(f"updates/deletes {path}", label, engine, specs, counter, sampler,
                                     after=v_delta, batched=path == "batched")
        ud[path]["t_incremental_s"] = round(done.wall_s, 4)
    ud["extreme_paths_runs"] = []
    for i, (how, root) in enumerate(copies):
        engine = Engine(spark, root, options=EngineOptions(extreme_refill=how))
        done, section = timed_pass(f"updates/deletes batched, extreme_refill={how}", label, engine, specs,
                                   counter, sampler, after=v_delta, batched=True)
        ud["extreme_paths_runs"].append({"extreme_refill": how, "order": i, "t_incremental_s": round(done.wall_s, 4),
                                         "spark_jobs": section.get("spark_jobs"), "per_run": section["per_run"]})
        if i < len(EXTREME_PATHS):  # the first round's sinks are checked against the full recompute
            sinks[f"batched, extreme_refill={how}"] = {s.name: engine.layout.sink_uri(s) for s in specs}
    full2 = full_recompute(spark, lake, specs, os.path.join(work, "full_after_corrections"), version=v_corr)
    ud["t_full_recompute_s"] = full2["wall_s"]
    ud["equality"] = _equal(spark, specs, full2["sinks"], sinks)
    res["updates_deletes"] = ud
    print(f"  {label}: updates/deletes " + ", ".join(f"{p} {ud[p]['t_incremental_s']:.2f}s"
                                                    for p in engines)
          + f" (full recompute {full2['wall_s']:.2f}s)", flush=True)

    res["results_equal"] = all(res["rounds_equal"]) and all(_all_equal(f) for f in ud["equality"].values())
    if not os.environ.get("BENCH_KEEP_WORK"):
        shutil.rmtree(work, ignore_errors=True)
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n")[0])
    parser.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    parser.add_argument("--sizes", help="comma-separated base sizes, e.g. 1000000,3000000 (overrides the profile)")
    parser.add_argument("--delta-rows", type=int)
    parser.add_argument("--base-hours", type=int)
    parser.add_argument("--late-share", type=float)
    parser.add_argument("--late-partitions", type=int)
    parser.add_argument("--correction-every", type=int,
                        help="the update/delete batch updates every n-th trade id of its hours and deletes every n-th")
    parser.add_argument("--rounds", type=int, help="Δ rounds per size (timings are medians over them)")
    parser.add_argument("--freshness-commits", type=int)
    parser.add_argument("--skip-freshness", action="store_true")
    parser.add_argument("--skip-s3", action="store_true", help="skip the S3 variant (a local S3 server)")
    parser.add_argument("--s3-latency-ms", type=parse_latencies, metavar="MS[,MS...]",
                        help="the S3 variant's round once per latency slept before each request (default: the "
                             "profile's; full 0,20, smoke 0)")
    parser.add_argument("--driver-memory")
    parser.add_argument("--wait-quiet", type=float, default=0.0, metavar="SECONDS",
                        help="first wait up to this long for the 1-minute load average to drop below --quiet-load")
    parser.add_argument("--quiet-load", type=float, default=1.0)
    parser.add_argument("--work", help="scratch folder for the lakes (default .bench/work-<profile>)")
    parser.add_argument("--out", help="where the report goes (default bench/results for full, "
                                      ".bench/results-smoke for smoke)")
    parser.add_argument("--sdp", choices=("off", "largest", "all"),
                        help="sizes at which the Spark Declarative Pipelines peer runs (default: the profile's)")
    parser.add_argument("--only", choices=("sdp",), help="run only this peer at the profile's sizes and merge it "
                                                         "into the --out report (bench/sdp_alone.py)")
    args = parser.parse_args(argv)

    profile = PROFILES[args.profile].with_(
        sizes=tuple(int(s) for s in args.sizes.split(",")) if args.sizes else None,
        delta_rows=args.delta_rows, base_hours=args.base_hours, late_share=args.late_share,
        late_partitions=args.late_partitions, freshness_commits=args.freshness_commits, rounds=args.rounds,
        driver_memory=args.driver_memory, sdp=args.sdp, correction_every=args.correction_every,
        s3_latencies_ms=args.s3_latency_ms)
    work = os.path.abspath(args.work or os.path.join(REPO, ".bench", f"work-{profile.name}"))
    out_dir = os.path.abspath(args.out or (os.path.join(REPO, "bench", "results") if profile.name == "full"
                                           else os.path.join(REPO, ".bench", "results-smoke")))
    result: dict = {
        "profile": profile.name, "settings": profile.to_json(), "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "load_avg_start": load_average(), "machine": environment.machine(), "code": environment.code_fingerprint(),
        "errors": [],
    }
    if args.wait_quiet > 0:
        result["quiet_wait"] = environment.wait_quiet(args.wait_quiet, args.quiet_load)
        result["load_avg_start"] = load_average()
    if args.only == "sdp":
        from .sdp_alone import run_alone

        return run_alone(profile, result, work, out_dir)
    sizes = sorted(profile.sizes)
    result["sizes_note"] = environment.sizes_note(profile)
    sampler = MemorySampler().start()
    print(f"bench: profile {profile.name}, sizes {sizes}, delta {profile.delta_rows:,} rows -> {out_dir}", flush=True)
    t_all = time.perf_counter()
    spark = None
    try:
        spark = environment.start_session(profile, result)
        counter = JobCounter(spark)
        sampler.spark = spark
        counter.job_floor_seconds(5)  # warm-up
        floors = {"start": round(counter.job_floor_seconds(), 4)}
        if profile.warmup_rows:
            print(f"bench: warm-up round at {profile.warmup_rows:,} rows (untimed)", flush=True)
            with sampler.during("warm-up"), timed(result, "t_warmup_s"):
                small = profile.with_(base_hours=3, late_partitions=1, correction_hours=1, rounds=1,
                                      delta_rows=max(profile.warmup_rows // 20, 100))
                bench_size(spark, small, profile.warmup_rows, os.path.join(work, "warmup"), counter, sampler)
            floors["after_warmup"] = round(counter.job_floor_seconds(), 4)
        by_size = []
        for b in sizes:
            print(f"bench: base {b:,} rows", flush=True)
            try:
                every = profile.every_variant_at_every_size or b == sizes[-1]
                sdp = profile.sdp == "all" or (profile.sdp == "largest" and b == sizes[-1])
                by_size.append(bench_size(spark, profile, b, os.path.join(work, f"b{b}"), counter, sampler,
                                          every_variant=every, sdp=sdp))
            except Exception as exc:  # noqa: BLE001  (recorded in the results; the benchmark goes on)
                result["errors"].append(f"B={b}: {exc!r}")
                traceback.print_exc()
        result["by_size"] = by_size
        floors["after_sizes"] = round(counter.job_floor_seconds(), 4)
        warm = [v for k, v in floors.items() if k != "start"]
        result["spark_job_floor_s"] = round(statistics.median(warm), 4)
        result["spark_job_floor_measurements_s"] = floors
        result["spark_job_floor_meaning"] = (
            "median wall time of a trivial one-task, JVM-only Spark job (spark.range(1) into the noop sink), "
            "measured after the warm-up and after the sizes (averaged); jobs x floor is a lower bound of the fixed "
            "per-job latency inside a phase")
        if profile.s3_rows and not args.skip_s3:
            print(f"bench: the S3 variant at {profile.s3_rows:,} rows (a local S3 server), latency "
                  + ", ".join(f"{ms:g}" for ms in profile.s3_latencies_ms) + " ms", flush=True)
            try:
                with sampler.during("s3"):
                    result["s3"] = s3_variant(spark, profile, os.path.join(work, "s3"))
            except Exception as exc:  # noqa: BLE001  (recorded in the results; the benchmark goes on)
                result["errors"].append(f"s3: {exc!r}")
                traceback.print_exc()
        if not args.skip_freshness:
            print("bench: end-to-end freshness through Dagster", flush=True)
            try:
                with sampler.during("freshness"):
                    result["freshness"] = measure_freshness(
                        spark, os.path.join(work, "freshness"), commits=profile.freshness_commits,
                        base_rows=profile.freshness_base_rows, base_hours=profile.freshness_base_hours,
                        commit_rows=profile.freshness_commit_rows, shuffle_partitions=profile.shuffle_partitions,
                        seed=profile.seed)
            except Exception as exc:  # noqa: BLE001  (recorded in the results; the benchmark goes on)
                result["errors"].append(f"freshness: {exc!r}")
                traceback.print_exc()
    except Exception as exc:  # noqa: BLE001  (recorded in the results; the benchmark goes on)
        result["errors"].append(repr(exc))
        traceback.print_exc()
    finally:
        sampler.stop()
        result["memory"] = sampler.report()
        if spark is not None:  # what the JVM still references at the end, every variant's work done
            try:
                result["memory"]["jvm_after_full_gc_at_end_mb"] = jvm_memory(spark, collect=True)
            except Exception as exc:  # noqa: BLE001  (a number of the report, never the run's failure)
                result["errors"].append(f"memory: {exc!r}")
        result["load_avg_end"] = load_average()
        result["t_total_s"] = round(time.perf_counter() - t_all, 1)
        final = report.summarize(result)
        paths = render.write_all(final, out_dir)
        print(render.console_summary(final), flush=True)
        print("bench: wrote " + ", ".join(paths), flush=True)
        if spark is not None:
            spark.stop()
    return 0 if final.get("results_equal") and not final["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
