"""Turning raw measurements into the report: headline keys, the incremental-time breakdown, the
targets (met or missed, and which stage is responsible), then `latest.json`, `latest.md`, `latest.png`.

Laminar is measured along two paths (see `variants.PATHS`): `per_partition` (`Engine.run` per
touched partition, one after another; the keys `t_incremental_s`, `ratio_inc_*`, `growth_inc_1m_to_10m`)
and `batched` (the sensor's run: `Engine.run_many` per flow, the flows side by side; the same keys with
`_batched`). Targets are evaluated for both.

The Spark Declarative Pipelines peer (`sdp_peer`) adds its keys (`t_sdp_s`, `t_sdp_refresh_s`,
`ratio_sdp_vs_inc_batched`, `sdp`) when it ran. The markdown, the plot and the files are `render`'s.

Pure Python except the plot (matplotlib, Agg backend); it needs no Spark, so it is unit-tested
with a fake result (tests/bench/test_bench_report.py).
"""

from __future__ import annotations

import statistics

from . import cpu_split, sdp_peer

TARGET_RATIO_INC_VS_FULL = 0.10
TARGET_RATIO_INC_VS_STREAMING = 1.0
TARGET_GROWTH = 1.3
TARGET_EXTREME_CHOICE = 1.2  # the way extreme_refill="cost" chose, at most this times the cheaper fixed way
VARIANTS = (
    ("t_incremental_s", "Laminar incremental (Engine.run per partition)"),
    ("t_incremental_batched_s", "Laminar incremental, batched (the sensor's run: run_many per flow, flows side by side)"),
    ("t_refill_touched_s", "Laminar refill of touched partitions (per partition)"),
    ("t_refill_touched_batched_s", "Laminar refill of touched partitions, batched"),
    ("t_full_recompute_s", "Full recompute (naive batch job, flows side by side)"),
    ("t_structured_streaming_s", "Structured Streaming (AvailableNow, RocksDB, queries side by side)"),
    *sdp_peer.VARIANTS,
)
PATH_KEYS = {"per_partition": ("incremental", ""), "batched": ("incremental_batched", "_batched")}
STAGE_LABELS = {
    "discover": "find touched partitions (Delta log statistics)",
    "plan": "plan: open snapshot, read new commits' log entries + footers, schema check",
    "read": ("read: the Spark job scanning changed files into partial aggregates, merging them with the old state "
             "and writing the output (a small pass: state and sink), plus run metrics"),
    "state_merge": "state commit: one Delta commit of the state files just written",
    "sink_write": "sink: a Spark job finalizing the state files just written (unless written with the state), Delta commit",
    "watermark": "watermark files",
    "other": "other (leases, recovery check, Python between runs)",
}
REQUIRED_KEYS = (
    "base_rows", "delta_rows", "t_incremental_s", "t_refill_touched_s", "t_full_recompute_s",
    "t_structured_streaming_s", "ratio_inc_vs_full", "ratio_inc_vs_streaming", "scaling", "growth_inc_1m_to_10m",
    "e2e_freshness_p50_s", "e2e_freshness_p95_s", "peak_rss_mb", "results_equal",
)


def ratio(a, b):
    return round(a / b, 4) if a is not None and b else None


def breakdown(size: dict, floor_s: float | None, section: str = "incremental") -> dict:
    """Where the incremental time of one size (one path) went, in seconds and shares of wall time."""
    inc = size.get(section) or {}
    wall = float(inc.get("wall_s") or 0.0)
    st = inc.get("stage_seconds") or {}
    stages = {
        "discover": inc.get("discover_s", 0.0),
        "plan": st.get("plan", 0.0),
        "read": st.get("read", 0.0),
        "state_merge": st.get("state", 0.0) + st.get("merge", 0.0),
        "sink_write": st.get("write", 0.0),
        "watermark": st.get("watermark", 0.0),
    }
    stages["other"] = max(wall - sum(stages.values()), 0.0)
    stages = {k: round(v, 4) for k, v in stages.items()}
    ins = (inc.get("instrumented") or {}).get("seconds", {})
    runs = int(inc.get("runs") or 0)
    jobs = inc.get("spark_jobs")
    metrics = inc.get("metrics") or {}
    out = {
        "wall_s": round(wall, 4),
        "runs": runs,
        "per_partition_s": round(wall / runs, 4) if runs else None,
        "stages_s": stages,
        "stages_share": {k: round(v / wall, 3) if wall else None for k, v in stages.items()},
        "stage_meaning": STAGE_LABELS,
        "dominant_stage": max(stages, key=stages.get) if wall else None,
        "cross_cutting_s": {
            "delta_commits": ins.get("delta_commit"),
            "parquet_writes": ins.get("parquet_write"),
            "delta_log_and_schema_check": ins.get("gather_log_and_schema"),
            "snapshot_file_listing": ins.get("snapshot_listing"),
        },
        "delta_commit_calls": ((inc.get("instrumented") or {}).get("calls") or {}).get("delta_commit"),
        "spark_jobs": jobs,
        "spark_jobs_per_partition": round(jobs / runs, 2) if jobs is not None and runs else None,
        "spark_job_floor_s": floor_s,
        "spark_job_overhead_est_s": round(jobs * floor_s, 3) if jobs is not None and floor_s is not None else None,
        "rows_read": metrics.get("rows_read"),
        "files_read": metrics.get("files_read"),
        "bytes_read": metrics.get("bytes_read"),
        "state_rows_written": metrics.get("state_rows"),
        "sink_rows_written": metrics.get("sink_rows"),
        "partitions": inc.get("partitions"),
        "modes": inc.get("modes"),
        "cpu": inc.get("cpu"),
    }
    est = out["spark_job_overhead_est_s"]
    out["spark_job_overhead_share"] = round(est / wall, 3) if est is not None and wall else None
    return out


def _explain_cost(b: dict, path: str) -> str:
    dom = b.get("dominant_stage")
    if not dom:
        return "no incremental measurement"
    how = "partition runs" if path == "per_partition" else "partitions in one run_many per flow"
    text = (f"Laminar incremental ({path}) took {b['wall_s']:.2f}s for {b['runs']} {how} "
            f"({b['per_partition_s']:.2f}s per partition, {b.get('rows_read') or 0:,} rows read). Largest stage: "
            f"{dom} — {STAGE_LABELS[dom]} — {b['stages_s'][dom]:.2f}s ({b['stages_share'][dom]:.0%}).")
    if b.get("spark_job_overhead_est_s") is not None:
        text += (f" {b['spark_jobs']} Spark jobs ({b['spark_jobs_per_partition']} per partition) at a floor of "
                 f"{b['spark_job_floor_s']:.3f}s each ≈ {b['spark_job_overhead_est_s']:.1f}s "
                 f"({b['spark_job_overhead_share']:.0%}) of bare per-job latency (a lower bound).")
    commits = (b.get("cross_cutting_s") or {}).get("delta_commits")
    if commits is not None:
        text += f" Delta commits (deltalake) {commits:.2f}s over {b.get('delta_commit_calls')} commits."
    cpu = cpu_split.describe(b.get("cpu"))
    return text + (" " + cpu if cpu else "")


def _growth_culprit(first: dict, last: dict, section: str) -> str:
    a, b = breakdown(first, None, section)["stages_s"], breakdown(last, None, section)["stages_s"]
    deltas = {k: b.get(k, 0) - a.get(k, 0) for k in b}
    worst = max(deltas, key=deltas.get)
    ra = (first.get(section) or {}).get("metrics", {}).get("rows_read")
    rb = (last.get(section) or {}).get("metrics", {}).get("rows_read")
    return (f"stage '{worst}' ({STAGE_LABELS[worst]}) grew most: {a.get(worst, 0):.2f}s -> {b.get(worst, 0):.2f}s "
            f"(+{deltas[worst]:.2f}s); rows read {ra} -> {rb} (the same Δ)")


def evaluate_targets(r: dict) -> list[dict]:
    """Each target of the issue, for each Laminar path: value, threshold, met, whether the run
    matched the target's conditions, and (when missed) the stage responsible."""
    by = r.get("by_size") or []
    sizes = [s["base_rows"] for s in by]
    at_10m = r.get("base_rows") == 10_000_000
    one_pct = bool(r.get("base_rows")) and r.get("delta_rows") == r["base_rows"] // 100
    out = []

    def add(name, path, value, threshold, conditions, conditions_met, culprit):
        met = None if value is None else value <= threshold
        out.append({"target": name, "laminar_path": path, "value": value, "threshold": threshold, "met": met,
                    "conditions": conditions, "conditions_met": bool(conditions_met),
                    "responsible": None if met in (True, None) else culprit()})

    for path, (section, suffix) in PATH_KEYS.items():
        b = r.get(f"breakdown_{section}") or {}
        if not b and path != "per_partition":
            continue

        def vs_stream(b=b, path=path):
            s = (by[-1].get("structured_streaming") if by else None) or {}
            return (_explain_cost(b, path) + f" The streaming job ran {len(s.get('per_query_s', {}))} queries "
                    f"in {s.get('wall_s', 0):.2f}s over the same Δ with {s.get('spark_jobs')} Spark jobs: one job "
                    "per query and trigger, however many windows or partitions Δ touches.")

        add(f"ratio_inc{suffix}_vs_full", path, r.get(f"ratio_inc{suffix}_vs_full"), TARGET_RATIO_INC_VS_FULL,
            "10M base rows, Δ = 1% of B", at_10m and one_pct, lambda b=b, path=path: _explain_cost(b, path))
        add(f"ratio_inc{suffix}_vs_streaming", path, r.get(f"ratio_inc{suffix}_vs_streaming"),
            TARGET_RATIO_INC_VS_STREAMING, "same Δ (append-only: the stream cannot see updates/deletes)",
            bool(by), vs_stream)
        add(f"growth_inc{suffix}_1m_to_10m", path, r.get(f"growth_inc{suffix}_1m_to_10m"), TARGET_GROWTH,
            "incremental time at 10M / at 1M with a fixed Δ", 1_000_000 in sizes and 10_000_000 in sizes,
            lambda section=section: _growth_culprit(by[0], by[-1], section))
    for flow, ways in ((r.get("updates_deletes") or {}).get("extreme_paths") or {}).items():
        fixed = [ways[h]["seconds"] for h in ("merge", "windows") if h in ways]
        if "cost" in ways and fixed and min(fixed) > 0:
            add(f"extreme_refill_choice_{flow}", "batched", round(ways["cost"]["seconds"] / min(fixed), 3),
                TARGET_EXTREME_CHOICE, "the update/delete batch: extreme_refill='cost' against the cheaper of "
                "'merge' and 'windows' on the same state (medians)", True,
                lambda ways=ways: "the planner's estimate chose the dearer way: " + "; ".join(
                    f"{h} {w['seconds']:.2f} s ({', '.join(w['modes'])})" for h, w in ways.items()))
    out.append({"target": "peak_memory_reported", "laminar_path": None, "value": r.get("peak_rss_mb"),
                "threshold": None, "met": r.get("peak_rss_mb") is not None,
                "conditions": "driver + Spark JVM peak RSS", "conditions_met": True, "responsible": None})
    out.append({"target": "no_source_collect", "laminar_path": None, "value": None, "threshold": None, "met": True,
                "conditions": "by construction: data is generated in chunks and committed; only aggregated sinks "
                              "are compared (in Spark; a few example rows at most reach the driver)",
                "conditions_met": True, "responsible": None})
    out.append({"target": "results_equal", "laminar_path": None, "value": r.get("results_equal"), "threshold": True,
                "met": bool(r.get("results_equal")), "conditions": "every variant's sinks equal the full recompute",
                "conditions_met": True,
                "responsible": None if r.get("results_equal") else
                "see rounds[].equality_* and updates_deletes.equality in by_size"})
    return out


def summarize(r: dict) -> dict:
    """Add the headline keys, the breakdowns and the targets to raw measurements (in place)."""
    by = r.get("by_size") or []
    head = by[-1] if by else {}
    r["base_rows"] = head.get("base_rows")
    r["delta_rows"] = head.get("delta_rows")
    for key, _ in VARIANTS:
        r[key] = head.get(key)
    r["full_recompute_cpu"] = (head.get("full_recompute") or {}).get("cpu")
    first, last = (by[0], by[-1]) if len(by) >= 2 else (None, None)
    for section, suffix in PATH_KEYS.values():
        t = r[f"t_{section}_s"]
        r[f"ratio_inc{suffix}_vs_full"] = ratio(t, r["t_full_recompute_s"])
        r[f"ratio_inc{suffix}_vs_streaming"] = ratio(t, r["t_structured_streaming_s"])
        r[f"growth_inc{suffix}_1m_to_10m"] = (ratio(last.get(f"t_{section}_s"), first.get(f"t_{section}_s"))
                                              if first else None)
    r["ratio_refill_vs_full"] = ratio(r["t_refill_touched_s"], r["t_full_recompute_s"])
    sdp_peer.summarize_into(r)
    r["scaling"] = [{"base_rows": s["base_rows"], "delta_rows": s.get("delta_rows"),
                     **{k: s.get(k) for k, _ in VARIANTS}} for s in by]
    r["growth_basis"] = ({"from_base_rows": first["base_rows"], "to_base_rows": last["base_rows"]}
                         if first else None)
    fresh = r.get("freshness") or {}
    r["e2e_freshness_p50_s"] = fresh.get("p50_s")
    r["e2e_freshness_p95_s"] = fresh.get("p95_s")
    r["e2e_freshness_unfinished_commits"] = fresh.get("unfinished_commits")
    r["peak_rss_mb"] = (r.get("memory") or {}).get("peak_rss_mb")
    r["results_equal"] = bool(by) and all(s.get("results_equal") for s in by) and not any(
        e.startswith(("B=", "s3:")) for e in r.get("errors", [])) and (r.get("s3") or {}).get("results_equal", True)
    floor = r.get("spark_job_floor_s")
    for section, _ in PATH_KEYS.values():
        r[f"breakdown_{section}"] = breakdown(head, floor, section) if head.get(section) else {}
        r[f"breakdown_{section}_by_size"] = {str(s["base_rows"]): breakdown(s, floor, section)
                                             for s in by if s.get(section)}
    ud = head.get("updates_deletes") or {}
    r["updates_deletes"] = {
        "commits": ud.get("commits"), "t_full_recompute_s": ud.get("t_full_recompute_s"),
        "results_equal": all(c.get("equal") for p in (ud.get("equality") or {}).values() for c in p.values())
        if ud else None,
        "paths": "sum/count/avg flows stay INCREMENTAL (RETRACTABLE_CHANGES, reading the change data feed); "
                 "first/last/min/max flows merge first (and recompute the groups that lost their extreme in a "
                 "second pass) or recompute the touched windows up front (EXTREME_RETRACTED), whichever the "
                 "planner expects to cost less (extreme_refill='cost'); both fixed ways are timed beside it on "
                 "the same state (extreme_paths)",
        "structured_streaming": "not applicable: a file source only sees new files (see streaming_limitations)",
    }
    for path in PATH_KEYS:
        if path in ud:
            r["updates_deletes"][path] = {
                "t_incremental_s": ud[path].get("t_incremental_s"), "modes": ud[path].get("modes"),
                "ratio_inc_vs_full": ratio(ud[path].get("t_incremental_s"), ud.get("t_full_recompute_s")),
                "flows": _by_flow(ud[path].get("per_run") or [])}
    ways: dict = {}  # flow -> way -> seconds of each round, and the modes of its first
    for run in ud.get("extreme_paths_runs") or []:
        for flow, f in _by_flow(run["per_run"]).items():
            w = ways.setdefault(flow, {}).setdefault(run["extreme_refill"], {"samples_s": [], "modes": f["modes"]})
            w["samples_s"].append(f["seconds"])
    extreme = {flow: {how: {"seconds": round(statistics.median(w["samples_s"]), 4), **w} for how, w in by.items()}
               for flow, by in ways.items() if any("EXTREME" in m for w in by.values() for m in w["modes"])}
    if extreme:  # per flow with extremes: the median seconds of each way over rounds that rotate their order
        r["updates_deletes"]["extreme_paths"] = extreme
    r["streaming_limitations"] = [
        "file source: updates and deletes in the Delta table are invisible (rewritten files would be re-read as "
        "new rows and double-count), so the stream is timed and checked on the append-only Δ only",
        "no watermark, so late rows are not dropped; the state keeps every window forever (RocksDB)",
        "output: update mode + foreachBatch appending each micro-batch's changed groups to Parquet; the current "
        "answer is the latest row per group. A MERGE into a Delta sink (needs the Delta JVM connector, unavailable "
        "here) would add to the streaming time",
    ]
    r["cost_calibration"] = cost_calibration(head)
    r["contention"] = contention(r)
    r["targets"] = evaluate_targets(r)
    return r


def cost_calibration(size: dict) -> dict:
    """The two prices behind `EngineOptions.extreme_refill="cost"`, measured in this run, per Laminar path: a
    pass's fixed seconds and the bytes it reads per second, from the incremental and the refill variants of
    the same size (each pass's seconds = fixed + bytes / rate: two passes, two unknowns). The engine's
    defaults lie between the two paths' values (docs/PERFORMANCE.md)."""
    from laminar_assets.engine import EngineOptions

    out: dict = {"defaults": {"pass_seconds": EngineOptions.pass_seconds,
                              "scan_bytes_per_second": EngineOptions.scan_bytes_per_second}}
    for path, (section, suffix) in PATH_KEYS.items():
        small, large = size.get(section), size.get(f"refill_touched{suffix}")
        if not small or not large:
            continue

        def per_pass(sec: dict, path: str = path) -> tuple[float, float]:
            passes = len(sec["per_run"]) if path == "per_partition" else len(sec.get("partitions") or {}) or 1
            return (sum(r.get("seconds", 0.0) for r in sec["per_run"]) / passes,
                    (sec.get("metrics") or {}).get("bytes_read", 0) / passes)

        (s_small, b_small), (s_large, b_large) = per_pass(small), per_pass(large)
        if s_large <= s_small or b_large <= b_small:
            out[path] = {"note": "the refill did not take longer than the incremental pass: no rate to derive"}
            continue
        rate = (b_large - b_small) / (s_large - s_small)
        out[path] = {"pass_seconds": round(s_small - b_small / rate, 3), "scan_bytes_per_second": round(rate, -3)}
    return out


CONTENDED = 0.15  # other processes used more than this share of the machine's CPU during a timed phase
_TIMED_PHASES = {"incremental": "t_incremental_s", "incremental_batched": "t_incremental_batched_s",
                 "refill_touched": "t_refill_touched_s", "refill_touched_batched": "t_refill_touched_batched_s",
                 "full recompute": "t_full_recompute_s", "structured streaming": "t_structured_streaming_s",
                 "sdp": "t_sdp_s"}


def contention(r: dict) -> dict:
    """How much CPU other processes took during each timed phase (the machine may be shared)."""
    shares = ((r.get("memory") or {}).get("cpu_used_by_other_processes_by_phase") or {})
    out: dict = {}
    for s in r.get("by_size") or []:
        label = f"B={s['base_rows']:,}"
        per = {}
        for phase, key in _TIMED_PHASES.items():  # phases are "<label> [round n ]<phase>"; worst round
            values = [v for name, v in shares.items()
                      if v is not None and name.startswith(label + " ") and name.endswith(" " + phase)]
            if values:
                per[key] = max(values)
        out[str(s["base_rows"])] = per
    worst = max((v for d in out.values() for v in d.values() if v is not None), default=None)
    return {"cpu_share_used_by_other_processes": out, "worst": worst,
            "contended": worst is not None and worst > CONTENDED,
            "note": f"share of the machine's CPU capacity used by processes outside the benchmark during each timed "
                    f"phase (/proc/stat minus the benchmark's own process tree); above {CONTENDED} the timings are "
                    "inflated by other work on the machine"}


def _by_flow(per_run: list[dict]) -> dict:
    """Each flow's seconds (its runs' stages summed), modes and reason details in one pass."""
    out: dict = {}
    for run in per_run:
        f = out.setdefault(run["flow"], {"seconds": 0.0, "modes": {}, "details": []})
        f["seconds"] = round(f["seconds"] + run.get("seconds", 0.0), 4)
        mode = f"{run['mode']}/{run['reason']}"
        f["modes"][mode] = f["modes"].get(mode, 0) + 1
        if run.get("detail") and run["detail"] not in f["details"]:
            f["details"].append(run["detail"])
    return out
