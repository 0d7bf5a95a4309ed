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
  DELETE) from the server's request recorder, and every sink is compared with the full recompute.

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
    before = storage.options()
    with LocalS3(log=os.path.join(work, "moto.log")) as server:
        storage.configure(server.options)
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
            for spec in specs:  # one flow at a time: each run's requests counted alone
                server.start_counting()
                t = time.perf_counter()
                results = engine.run_many(spec, parts.get(spec.name, [])) if parts.get(spec.name) else []
                seconds = time.perf_counter() - t
                counts = server.counts()
                flows[spec.name] = {"seconds": round(seconds, 4), "partitions": len(results),
                                    "modes": sorted({f"{r.mode.value}/{r.reason.value}" for r in results}),
                                    "requests": counts, "requests_total": _total(counts),
                                    "requests_per_partition": round(_total(counts) / max(len(results), 1), 1)}
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
            storage.configure(before)
    inc, full_s, stream_s = out["t_incremental_batched_s"], out["t_full_recompute_s"], out["t_structured_streaming_s"]
    out["ratio_inc_batched_vs_full"] = round(inc / full_s, 4) if full_s else None
    out["ratio_inc_batched_vs_streaming"] = round(inc / stream_s, 4) if stream_s else None
    out["dominant_request"] = _dominant(out["laminar_batched_per_flow"])
    return out


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
