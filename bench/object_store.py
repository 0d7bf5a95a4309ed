"""The S3 variant: the benchmark's workload with every table in a bucket of a local S3 server.

moto's S3 server (`laminar_assets.deploy.local_s3.LocalS3`, 127.0.0.1, in memory) holds the source,
Laminar's state, sinks and watermarks, the full recompute's sinks and the streaming query's input;
the streaming query's checkpoints and output stay on local disk (its own bookkeeping, as a stream
job's usually does). One round per latency of the profile's `s3_latencies_ms` (0 and 20 ms in the
full profile), each in a bucket of its own, at the profile's `s3_rows`:

- the base is committed and brought up to date (untimed, at no latency): Laminar over every
  partition, the stream over every file;
- Δ (the same shape as the local rounds) is committed, then timed with the server sleeping the
  round's latency before each request: Laminar batched (`run_many` per flow, the flows one after
  another, so each flow run's requests are counted alone), the full recompute (both flows side by
  side) and Structured Streaming (both queries);
- the object-store requests each of them made are counted by kind (LIST, GET, HEAD, PUT, POST,
  DELETE) from the server's request recorder, and every sink is compared with the full recompute;
  Laminar's by phase of the run and by object too (bench/request_log.py), and each flow is run once
  more with nothing new (its NOOP run's requests).

A local in-memory server answers in a millisecond or less; a real store takes 10-100 ms a request
(S3 in its region about 20 ms to the first byte). The seconds at 0 ms are the code's own; the seconds
at 20 ms are what a run would wait on S3 (`by_latency`, with the share of the latency each variant's
requests added: 100% when each request waits alone, less when they overlap). Every round should make
the same requests whatever the latency (checked: `requests_same_at_every_latency`); Laminar's own
requests do, Spark's reads of Parquet files through s3a vary by a few GETs from run to run, at any
latency (a latency repeated, `0,20,0`, shows it).
"""

from __future__ import annotations

import os
import shutil
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
    """Run the S3 variant (see the module docstring) once per latency of `profile.s3_latencies_ms` (in that
    order; a latency may repeat, to see the noise), on one local S3 server, each round in a bucket of its
    own, after an untimed warm-up round at `profile.warmup_rows` (the first timed round would otherwise pay
    the JVM's warm-up on S3 alone); returns its section of the report: the first round at the top level,
    every round's seconds and requests in `by_latency`, and whether every request count was the same in
    every round (`requests_same_at_every_latency`)."""
    latencies = tuple(profile.s3_latencies_ms) or (0,)
    os.makedirs(work, exist_ok=True)
    rounds: dict[str, dict] = {}
    with LocalS3(log=os.path.join(work, "moto.log")) as server:
        storage.mount("s3://", server.options)  # every bucket of this server (the bench's lakes)
        try:
            if profile.warmup_rows:
                print(f"  S3 variant: warm-up round at {profile.warmup_rows:,} rows (untimed)", flush=True)
                small = profile.with_(s3_rows=profile.warmup_rows, delta_rows=max(profile.warmup_rows // 10, 100))
                _round(spark, small, server, os.path.join(work, "warm-up"), 0, "warm-up")
            for ms in latencies:
                label = latency_label(ms)
                label = label if label not in rounds else f"{label}-{sum(k.split('-')[0] == label for k in rounds) + 1}"
                print(f"  S3 variant: {profile.s3_rows:,} rows, timed at {ms:g} ms per request ({label})", flush=True)
                rounds[label] = _round(spark, profile, server, os.path.join(work, label), ms, label)
        finally:
            storage.unmount("s3://")
    first = next(iter(rounds.values()))
    out = dict(first)
    out["by_latency"] = {label: _summary(r, first) for label, r in rounds.items()}
    out["requests_same_at_every_latency"] = _same_requests(rounds)
    out["results_equal"] = all(r["results_equal"] for r in rounds.values())
    return out


def latency_label(ms: float) -> str:
    return f"{ms:g}ms"


def _round(spark, profile: Profile, server: LocalS3, work: str, latency_ms: float, label: str) -> dict:
    """One round in a new bucket: the base, Laminar's bootstrap, the stream over the base and Δ are written
    at no latency (untimed); Laminar's runs, their NOOP runs, the full recompute and the streaming
    micro-batch at `latency_ms`; the equality checks at none again."""
    rows = profile.s3_rows
    out: dict = {"base_rows": rows, "delta_rows": profile.delta_rows, "server": "moto, local, in memory",
                 "latency_ms": latency_ms, "request_kinds": list(KINDS)}
    shutil.rmtree(work, ignore_errors=True)  # the stream's checkpoints of an earlier run would skip Δ's files
    os.makedirs(work)
    server.set_latency(0)
    bucket = server.create_bucket("laminar-bench-" + "".join(c if c.isalnum() else "-" for c in label.lower()))
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
    stream.add_files(added_files(lake, v0, lake.version()), "delta")  # Δ's files for the stream's timed batch
    server.set_latency(latency_ms)
    try:
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
                    t = time.perf_counter()
                    noop = engine.run_many(spec, parts[spec.name])
                    seconds = time.perf_counter() - t
                requests = log.requests()
                flows[spec.name]["noop"] = {"seconds": round(seconds, 4),
                                            "modes": sorted({f"{r.mode.value}/{r.reason.value}" for r in noop}),
                                            "requests": _kinds(requests), "requests_total": len(requests),
                                            "requests_by_object": _totals(table(requests, "object"))}
        out["laminar_batched_per_flow"] = flows
        out["t_incremental_batched_s"] = round(sum(f["seconds"] for f in flows.values()), 4)

        server.start_counting()
        full = full_recompute(spark, lake, specs, f"{bucket}/full")
        out["full_recompute_requests"] = server.counts()
        out["t_full_recompute_s"] = full["wall_s"]

        server.start_counting()
        run = stream.run()
        out["streaming_requests"] = server.counts()
        out["t_structured_streaming_s"] = round(run.wall_s, 4)
    finally:
        server.set_latency(0)

    sinks = {s.name: engine.layout.sink_uri(s) for s in specs}
    streamed = {s.name: stream.current_answer(s) for s in specs}
    checks = equal_sinks(spark, specs, full["sinks"], {"laminar": sinks, "streaming": streamed})
    out["equality"] = checks
    out["results_equal"] = all(all_equal(by_flow) for by_flow in checks.values())
    inc, full_s, stream_s = out["t_incremental_batched_s"], out["t_full_recompute_s"], out["t_structured_streaming_s"]
    out["ratio_inc_batched_vs_full"] = round(inc / full_s, 4) if full_s else None
    out["ratio_inc_batched_vs_streaming"] = round(inc / stream_s, 4) if stream_s else None
    out["dominant_request"] = _dominant(out["laminar_batched_per_flow"])
    return out


def _summary(r: dict, first: dict) -> dict:
    """One latency's seconds and request totals; against the first latency's round, the seconds the latency
    added (`added_s`) and their share of requests x latency (`added_latency_share_pct`: 100 when every
    request waited alone, one after another; less when requests overlap, more when a wait also delays work
    that is not a request)."""
    flows = r["laminar_batched_per_flow"]
    requests = sum(f["requests_total"] for f in flows.values())
    out = {"latency_ms": r["latency_ms"], "t_incremental_batched_s": r["t_incremental_batched_s"],
           "t_full_recompute_s": r["t_full_recompute_s"], "t_structured_streaming_s": r["t_structured_streaming_s"],
           "ratio_inc_batched_vs_full": r["ratio_inc_batched_vs_full"],
           "ratio_inc_batched_vs_streaming": r["ratio_inc_batched_vs_streaming"],
           "seconds_per_flow": {name: f["seconds"] for name, f in flows.items()},
           "noop_seconds_per_flow": {name: f["noop"]["seconds"] for name, f in flows.items() if f.get("noop")},
           "requests_laminar": requests,
           "requests_per_flow": {name: {"kinds": f["requests"], "by_phase": f["requests_by_phase"],
                                        "by_object": f["requests_by_object"]} for name, f in flows.items()},
           "requests_noop": sum(f["noop"]["requests_total"] for f in flows.values() if f.get("noop")),
           "requests_full_recompute": _total(r["full_recompute_requests"]),
           "requests_streaming": _total(r["streaming_requests"]),
           "results_equal": r["results_equal"]}
    if r is not first and r["latency_ms"] != first["latency_ms"]:
        per_ms = 1000.0 / (r["latency_ms"] - first["latency_ms"])
        added = {"laminar": (r["t_incremental_batched_s"] - first["t_incremental_batched_s"], requests),
                 "full_recompute": (r["t_full_recompute_s"] - first["t_full_recompute_s"],
                                    out["requests_full_recompute"]),
                 "streaming": (r["t_structured_streaming_s"] - first["t_structured_streaming_s"],
                               out["requests_streaming"])}
        out["added_s"] = {k: round(s, 3) for k, (s, _) in added.items()}
        # ms of waiting per request per ms of latency, in percent: 100 when each request waits alone
        out["added_latency_share_pct"] = {k: round(100 * s * per_ms / n, 1) if n else None
                                          for k, (s, n) in added.items()}
    return out


def _same_requests(rounds: dict[str, dict]) -> dict:
    """Whether every round made the same requests as the first one (Laminar's per flow, kind and phase, their
    NOOP runs', the full recompute's and the streaming micro-batch's by kind), and where not."""
    first_label, *rest = rounds
    first = rounds[first_label]

    def shapes(r: dict) -> dict[str, object]:
        flows = r["laminar_batched_per_flow"]
        return {"laminar": {n: (f["requests"], f["requests_by_phase"]) for n, f in flows.items()},
                "laminar_noop": {n: f["noop"]["requests"] for n, f in flows.items() if f.get("noop")},
                "full_recompute": r["full_recompute_requests"], "streaming": r["streaming_requests"]}

    want = shapes(first)
    out: dict = {k: True for k in want}
    differences = []
    for label in rest:
        got = shapes(rounds[label])
        for k in want:
            if got[k] != want[k]:
                out[k] = False
                differences.append(f"{k} at {label}: {got[k]} (at {first_label}: {want[k]})")
    out["differences"] = differences
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
    """Run the S3 variant alone: `python -m bench.object_store [--profile full] [--s3-latency-ms 0,20] [--out FILE]`;
    prints the request counts and seconds and writes the section as JSON (default bench/results/s3.json for the
    full profile)."""
    import argparse
    import json

    from .config import PROFILES, parse_latencies
    from .environment import code_fingerprint, start_session
    from .measure import load_average
    from .render import _s3_section

    parser = argparse.ArgumentParser(description="the benchmark's S3 variant alone")
    parser.add_argument("--profile", choices=sorted(PROFILES), default="smoke")
    parser.add_argument("--rows", type=int, help="base rows (default: the profile's s3_rows)")
    parser.add_argument("--s3-latency-ms", type=parse_latencies, metavar="MS[,MS...]",
                        help="latencies to time the round at (default: the profile's; full 0,20, smoke 0)")
    parser.add_argument("--out")
    parser.add_argument("--work", default=os.path.join(".bench", "work-s3"))
    args = parser.parse_args(argv)
    profile = PROFILES[args.profile]
    profile = profile.with_(s3_rows=args.rows or None, s3_latencies_ms=args.s3_latency_ms)
    started, load_start, code = time.strftime("%Y-%m-%dT%H:%M:%S%z"), load_average(), code_fingerprint()
    spark = start_session(profile, {})
    try:
        result = s3_variant(spark, profile, os.path.abspath(args.work))
    finally:
        spark.stop()
    result.update(started_at=started, load_avg_start=load_start, load_avg_end=load_average(),
                  code=code)
    print("\n".join(_s3_section(result)))
    out = args.out or (os.path.join("bench", "results", "s3.json") if profile.name == "full" else None)
    if out:
        with open(out, "w") as fh:
            json.dump(result, fh, indent=1, sort_keys=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
