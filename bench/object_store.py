"""The S3 variant: the benchmark's workload with every table in a bucket of a local S3 server.

moto's S3 server (`laminar_assets.deploy.local_s3.LocalS3`, 127.0.0.1, in memory) holds the source,
Laminar's state, sinks and watermarks, the full recompute's sinks and the streaming query's input;
the streaming query's checkpoints and output stay on local disk (its own bookkeeping, as a stream
job's usually does). One round, at the profile's `s3_rows`:

- the base is committed and brought up to date (untimed): Laminar over every partition, the stream
  over every file;
- Δ (the same shape as the local rounds) is committed, then timed: Laminar batched (`run_many` per
  flow, the flows one after another, so each flow run's requests are counted alone), the full
  recompute (both flows side by side) and Structured Streaming (both queries);
- the object-store requests each of them made are counted by kind (LIST, GET, HEAD, PUT, POST,
  DELETE) from the server's request recorder, and every sink is compared with the full recompute;
  Laminar's by phase of the run and by object too (bench/request_log.py), and each flow is run once
  more with nothing new (its NOOP run's requests).

A local in-memory server answers in a millisecond or less; a real store takes 10-100 ms a request,
so the request counts, not the seconds here, say what a run on S3 costs.
"""

from __future__ import annotations

import os
import time

from laminar_assets import storage
from laminar_assets.deploy.local_s3 import LocalS3
from laminar_assets.engine import Engine

from .config import Profile
from .equality import all_equal, equal_sinks
from .request_log import RequestLog, phases, table
from .specs import bench_specs
from .streaming import StreamingJob
from .variants import full_recompute, laminar_pass, touched_partitions
from .workload import Lake, added_files, write_base, write_delta_round

KINDS = ("LIST", "GET", "HEAD", "PUT", "POST", "DELETE")


def _total(counts: dict[str, int]) -> int:
    return sum(counts.values())


def s3_variant(spark, profile: Profile, work: str) -> dict:
    """Run the S3 variant (see the module docstring); returns its section of the report."""
    rows = profile.s3_rows
    out: dict = {"base_rows": rows, "delta_rows": profile.delta_rows, "server": "moto, local, in memory",
                 "request_kinds": list(KINDS)}
    os.makedirs(work, exist_ok=True)
    with LocalS3(log=os.path.join(work, "moto.log")) as server:
        storage.mount("s3://", server.options)  # every bucket of this server (the bench's lakes)
        try:
            bucket = server.create_bucket("laminar-bench")
            lake = Lake(f"{bucket}/source")
            base = write_base(lake, rows, profile.base_hours, hours_per_commit=profile.hours_per_commit,
                              correction_hours=profile.correction_hours, seed=profile.seed)
            specs = bench_specs(lake.uri)  # the source by URI: Laminar keeps its tables under its own root
            engine = Engine(spark, f"{bucket}/laminar")
            laminar_pass(engine, specs, after=None, batched=True)  # every partition, untimed
            stream = StreamingJob(spark, specs, os.path.join(work, "stream"), source=f"{bucket}/stream-source")
            stream.add_files(lake.files(), "base")
            stream.run()
            v0 = lake.version()
            write_delta_round(lake, base, profile, 0)

            parts = touched_partitions(engine, specs, v0)
            flows = {}
            log = RequestLog(server.endpoint, sinks=tuple(engine.layout.sink_uri(s).rstrip("/").rsplit("/", 1)[-1]
                                                          for s in specs))
            for spec in specs:  # one flow at a time: each run's requests counted alone
                log.start()
                with phases(log):
                    t = time.perf_counter()
                    results = engine.run_many(spec, parts.get(spec.name, [])) if parts.get(spec.name) else []
                    seconds = time.perf_counter() - t
                requests = log.requests()
                counts = _kinds(requests)
                flows[spec.name] = {"seconds": round(seconds, 4), "partitions": len(results),
                                    "modes": sorted({f"{r.mode.value}/{r.reason.value}" for r in results}),
                                    "requests": counts, "requests_total": _total(counts),
                                    "requests_per_partition": round(_total(counts) / max(len(results), 1), 1),
                                    "requests_by_phase": _totals(table(requests, "phase")),
                                    "requests_by_object": _totals(table(requests, "object"))}
            for spec in specs:  # nothing new since: each flow's NOOP run
                if parts.get(spec.name):
                    log.start()
                    with phases(log):
                        noop = engine.run_many(spec, parts[spec.name])
                    requests = log.requests()
                    flows[spec.name]["noop"] = {"modes": sorted({f"{r.mode.value}/{r.reason.value}" for r in noop}),
                                                "requests": _kinds(requests), "requests_total": len(requests),
                                                "requests_by_object": _totals(table(requests, "object"))}
            out["laminar_batched_per_flow"] = flows
            out["t_incremental_batched_s"] = round(sum(f["seconds"] for f in flows.values()), 4)

            server.start_counting()
            full = full_recompute(spark, lake, specs, f"{bucket}/full")
            out["full_recompute_requests"] = server.counts()
            out["t_full_recompute_s"] = full["wall_s"]

            stream.add_files(added_files(lake, v0, lake.version()), "delta")
            server.start_counting()
            run = stream.run()
            out["streaming_requests"] = server.counts()
            out["t_structured_streaming_s"] = round(run.wall_s, 4)

            sinks = {s.name: engine.layout.sink_uri(s) for s in specs}
            streamed = {s.name: stream.current_answer(s) for s in specs}
            checks = equal_sinks(spark, specs, full["sinks"], {"laminar": sinks, "streaming": streamed})
            out["equality"] = checks
            out["results_equal"] = all(all_equal(by_flow) for by_flow in checks.values())
        finally:
            storage.unmount("s3://")
    inc, full_s, stream_s = out["t_incremental_batched_s"], out["t_full_recompute_s"], out["t_structured_streaming_s"]
    out["ratio_inc_batched_vs_full"] = round(inc / full_s, 4) if full_s else None
    out["ratio_inc_batched_vs_streaming"] = round(inc / stream_s, 4) if stream_s else None
    out["dominant_request"] = _dominant(out["laminar_batched_per_flow"])
    return out


def _kinds(requests) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in requests:
        out[r.kind] = out.get(r.kind, 0) + 1
    return out


def _totals(by: dict) -> dict[str, int]:
    return dict(sorted(((name, sum(c.values())) for name, c in by.items()), key=lambda kv: -kv[1]))


def _dominant(flows: dict) -> str:
    """Which request kind most of Laminar's requests were, over all flow runs."""
    totals: dict[str, int] = {}
    for f in flows.values():
        for kind, n in f["requests"].items():
            totals[kind] = totals.get(kind, 0) + n
    if not totals:
        return "none"
    kind, n = max(totals.items(), key=lambda kv: kv[1])
    return f"{kind} ({n} of {sum(totals.values())})"


def main(argv: list[str] | None = None) -> int:
    """Run the S3 variant alone: `python -m bench.object_store [--profile full] [--out FILE]`; prints the
    request counts and writes the section as JSON (default bench/results/s3.json for the full profile)."""
    import argparse
    import json

    from .config import PROFILES
    from .environment import start_session
    from .render import _s3_section

    parser = argparse.ArgumentParser(description="the benchmark's S3 variant alone")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    parser.add_argument("--rows", type=int, help="base rows (default: the profile's s3_rows)")
    parser.add_argument("--out")
    parser.add_argument("--work", default=os.path.join(".bench", "work-s3"))
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    if args.rows:
        profile = profile.with_(s3_rows=args.rows)
    spark = start_session(profile, {})
    try:
        result = s3_variant(spark, profile, os.path.abspath(args.work))
    finally:
        spark.stop()
    print("\n".join(_s3_section(result)))
    out = args.out or (os.path.join("bench", "results", "s3.json") if profile.name == "full" else None)
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
