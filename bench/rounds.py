"""One Δ round of the benchmark: commit Δ, time every variant on it, check each against the full
recompute of the same snapshot (called by bench/run.py for every size and round)."""

from __future__ import annotations

import os
import shutil

from . import sdp_peer
from .cpu_split import CpuSplit
from .equality import all_equal as _all_equal
from .equality import equal_sinks as _equal
from .instrument import Instrument
from .measure import JobCounter, MemorySampler
from .variants import full_recompute, laminar_pass
from .workload import added_files, write_delta_round


def timed_pass(name: str, label: str, engine, specs, counter: JobCounter, sampler: MemorySampler,
                **kw) -> tuple[object, dict]:
    """One instrumented Laminar pass; returns it and its JSON section."""
    jobs: dict = {}
    with sampler.during(f"{label} {name}"), Instrument() as ins, counter.count(jobs):
        with CpuSplit() as cpu:
            done = laminar_pass(engine, specs, **kw)
    return done, {**done.summary(), "spark_jobs": jobs.get("spark_jobs"), "instrumented": ins.report(),
                  "per_run": done.per_run(), "cpu": cpu.result}


def delta_round(ctx: dict, r: int, v_prev: int) -> dict:
    """Commit one Δ and time every variant on it; each variant's sinks are checked against the full
    recompute of the same snapshot. Returns timings (t_*), sections and equality results."""
    spark, profile, lake, specs, engines = ctx["spark"], ctx["profile"], ctx["lake"], ctx["specs"], ctx["engines"]
    counter, sampler, work = ctx["counter"], ctx["sampler"], ctx["work"]
    label = ctx["label"] + (f" round {r + 1}" if profile.rounds > 1 else "")
    out: dict = {}
    commits = write_delta_round(lake, ctx["base"], profile, r)
    out["version"] = v_delta = lake.version()
    out["delta_commits"] = [{"version": c.version, "kind": c.kind, "rows": c.rows, "first": c.first.isoformat(),
                             "last": c.last.isoformat()} for c in commits]

    # 1. Laminar incremental, along each path
    touched = {}
    for path, engine in engines.items():
        key = "incremental" if path == "per_partition" else "incremental_batched"
        done, out[key] = timed_pass(key, label, engine, specs, counter, sampler, after=v_prev,
                                     batched=path == "batched")
        out[f"t_{key}_s"] = round(done.wall_s, 4)
        touched = done.partitions
        out["partitions_touched"] = {flow: len(keys) for flow, keys in touched.items()}
        print(f"  {label}: {key} {done.runs} partitions in {done.wall_s:.2f}s", flush=True)

    # 3. full recompute (also the reference every variant is checked against)
    full_jobs: dict = {}
    with sampler.during(f"{label} full recompute"), counter.count(full_jobs), CpuSplit() as cpu:
        full = full_recompute(spark, lake, specs, os.path.join(work, f"full-{r}"), version=v_delta)
    out["t_full_recompute_s"] = full["wall_s"]
    out["full_recompute"] = {**full, "spark_jobs": full_jobs.get("spark_jobs"), "cpu": cpu.result}
    print(f"  {label}: full recompute in {full['wall_s']:.2f}s", flush=True)
    sinks = {path: {s.name: e.layout.sink_uri(s) for s in specs} for path, e in engines.items()}
    out["equality_incremental"] = _equal(spark, specs, full["sinks"], sinks)
    checks = [out["equality_incremental"]]
    if ctx["every_variant"]:
        # 2. Laminar refill of the touched partitions, along each path
        for path, engine in engines.items():
            key = "refill_touched" if path == "per_partition" else "refill_touched_batched"
            done, out[key] = timed_pass(key, label, engine, specs, counter, sampler, after=None, force=True,
                                         partitions=touched, batched=path == "batched")
            out[f"t_{key}_s"] = round(done.wall_s, 4)
            print(f"  {label}: {key} {done.runs} partitions in {done.wall_s:.2f}s", flush=True)
        out["equality_refill"] = _equal(spark, specs, full["sinks"], sinks)

        # 4. Structured Streaming on Δ
        stream, delta_files = ctx["stream"], added_files(lake, v_prev, v_delta)
        stream.add_files(delta_files, f"delta{r}")
        stream_jobs: dict = {}
        with sampler.during(f"{label} structured streaming"), counter.count(stream_jobs):
            s_delta = stream.run()
        out["t_structured_streaming_s"] = round(s_delta.wall_s, 4)
        out["structured_streaming"] = {**s_delta.summary(), "spark_jobs": stream_jobs.get("spark_jobs")}
        out["equality_streaming"] = _equal(spark, specs, full["sinks"],
                                           {"stream": {s.name: stream.current_answer(s) for s in specs}})
        print(f"  {label}: structured streaming on delta in {s_delta.wall_s:.2f}s", flush=True)
        checks += [out["equality_refill"], out["equality_streaming"]]
        if ctx["sdp"]:  # 5. Spark Declarative Pipelines: `spark-pipelines run` after Δ (bench/sdp_peer.py)
            out.update(sdp_peer.timed_round(ctx["sdp"], spark, full["sinks"], delta_files, sampler, label, r))
            checks.append(out.get("equality_sdp") or {})
    out["equal"] = all(_all_equal(by_flow) for c in checks for by_flow in c.values())
    shutil.rmtree(os.path.join(work, f"full-{r}"), ignore_errors=True)
    return out
