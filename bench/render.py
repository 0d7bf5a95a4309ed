"""The report as people read it: `latest.md` (tables), `latest.png` (seconds against base rows per
variant, log-log) and `latest.json`, from the summarized results (`report.summarize`), and the
console summary. Pure Python except the plot
(matplotlib, Agg backend)."""

from __future__ import annotations

import json
import os

from . import cpu_split
from .report import PATH_KEYS, STAGE_LABELS, VARIANTS, ratio


def fmt(v, digits=2) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        return f"{v:.{digits}f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _modes(modes: dict | None) -> str:
    return "; ".join(f"{f}: " + ", ".join(f"{m} ×{n}" for m, n in ms.items()) for f, ms in (modes or {}).items())


def _s3_section(s3: dict | None) -> list[str]:
    """The S3 variant: the same workload in a bucket of a local S3 server (bench/object_store.py)."""
    if not s3:
        return []
    lines = ["", f"## The same workload on S3 (local server: {s3.get('server')}), B = {fmt(s3.get('base_rows'))}", "",
             "| variant | seconds | ratio to full recompute | requests (LIST/GET/HEAD/PUT/POST/DELETE) |",
             "|---|---:|---:|---|"]

    def kinds(counts: dict | None) -> str:
        counts = counts or {}
        return " / ".join(str(counts.get(k, 0)) for k in s3.get("request_kinds", []))

    total: dict[str, int] = {}
    for f in (s3.get("laminar_batched_per_flow") or {}).values():
        for k, n in f["requests"].items():
            total[k] = total.get(k, 0) + n
    full = s3.get("t_full_recompute_s")
    lines.append(f"| Laminar incremental, batched | {fmt(s3.get('t_incremental_batched_s'))} | "
                 f"{fmt(s3.get('ratio_inc_batched_vs_full'), 3)} | {kinds(total)} |")
    lines.append(f"| full recompute | {fmt(full)} | 1.000 | {kinds(s3.get('full_recompute_requests'))} |")
    lines.append(f"| Structured Streaming | {fmt(s3.get('t_structured_streaming_s'))} | "
                 f"{fmt(ratio(s3.get('t_structured_streaming_s'), full), 3)} | {kinds(s3.get('streaming_requests'))} |")
    lines += ["", "Per flow run (Laminar, one `run_many` per flow):", ""]
    for name, f in (s3.get("laminar_batched_per_flow") or {}).items():
        lines.append(f"- {name}: {f['partitions']} partitions, {fmt(f['seconds'])} s, {f['requests_total']} requests "
                     f"({kinds(f['requests'])}), {f['requests_per_partition']} per partition; {', '.join(f['modes'])}")
        if f.get("requests_by_phase"):
            lines.append("  - by phase: " + ", ".join(f"{p} {n}" for p, n in f["requests_by_phase"].items()))
        if f.get("requests_by_object"):
            lines.append("  - by object: " + ", ".join(f"{o} {n}" for o, n in f["requests_by_object"].items()))
        if f.get("noop"):
            lines.append(f"  - run again with nothing new: {f['noop']['requests_total']} requests "
                         f"({kinds(f['noop']['requests'])}); {', '.join(f['noop']['modes'])}")
    lines += ["", f"Most of Laminar's requests: {s3.get('dominant_request')}. Results equal to the full recompute: "
                  f"{fmt(s3.get('results_equal'))}."]
    lines += _s3_latencies(s3)
    return lines


def _s3_latencies(s3: dict) -> list[str]:
    """The S3 variant's seconds at each latency of the server (bench/object_store.py `by_latency`)."""
    by = s3.get("by_latency") or {}
    if not any(b.get("latency_ms") for b in by.values()):
        return ["", f"The server answered at {fmt(s3.get('latency_ms', 0))} ms latency (about a millisecond in "
                    "memory; a real store takes 10-100 ms): the request counts, not these seconds, say what a run "
                    "costs on S3."]
    same = s3.get("requests_same_at_every_latency") or {}
    lines = ["", "Seconds with the server sleeping a latency before each request (S3 in its region: about 20 ms "
                 "to the first byte); the same requests at every latency: "
                 + ", ".join(f"{k} {fmt(v)}" for k, v in same.items() if k != "differences") + ".", "",
             "| latency | Laminar incremental, batched | its NOOP runs | full recompute | Structured Streaming "
             "| Laminar / full | Laminar / streaming |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for label, b in by.items():
        noop = sum((b.get("noop_seconds_per_flow") or {}).values()) if b.get("noop_seconds_per_flow") else None
        lines.append(f"| {label} | {fmt(b.get('t_incremental_batched_s'))} | {fmt(noop)} | "
                     f"{fmt(b.get('t_full_recompute_s'))} | {fmt(b.get('t_structured_streaming_s'))} | "
                     f"{fmt(b.get('ratio_inc_batched_vs_full'), 3)} | {fmt(b.get('ratio_inc_batched_vs_streaming'), 3)} |")
    for label, b in by.items():
        if b.get("added_latency_share_pct"):
            lines.append(f"\nAt {label}, seconds added per request, as a share of the latency (100 %: every request "
                         "waited alone, one after another): " + ", ".join(
                             f"{k} {fmt(v, 1)} % ({b['added_s'][k]:+.2f} s)" for k, v in b["added_latency_share_pct"].items()))
    for d in same.get("differences") or []:
        lines.append(f"- requests differed: {d}")
    return lines


def markdown(r: dict) -> str:
    m, s, sp = r.get("machine") or {}, r.get("settings") or {}, r.get("spark") or {}
    lines = [f"# Laminar benchmark — profile `{r.get('profile')}`", ""]
    lines.append(f"Started {r.get('started_at')}, {fmt(r.get('t_total_s'), 0)} s in all. Machine: {m.get('cpus')} "
                 f"CPUs, {m.get('memory_gb')} GB; Spark {sp.get('version')} {sp.get('master')}, driver "
                 f"{sp.get('driver_memory')}, JIT {sp.get('jit', 'tiered')}. "
                 f"Load average at start {r.get('load_avg_start')}, at end "
                 f"{r.get('load_avg_end')}. Code: {(r.get('code') or {}).get('git_head')} "
                 f"(uncommitted engine files: {len((r.get('code') or {}).get('uncommitted_laminar_assets_files') or [])}).")
    lines += ["", f"Sizes: {r.get('sizes_note')}. Every timing is the median over {s.get('rounds', 1)} Δ round(s) "
              "of the same shape (samples: `by_size[].t_*_samples_s`)."]
    lines.append(f"Workload: base over {s.get('base_hours')} hourly partitions; Δ = {fmt(r.get('delta_rows'))} rows: "
                 f"{1 - (s.get('late_share') or 0):.0%} appended into the newest windows, "
                 f"{s.get('late_share', 0):.0%} late into {s.get('late_partitions')} older partitions. Two flows "
                 "(vwap-like 1 min, OHLC-like 5 min), hourly partitions.")
    c = r.get("contention") or {}
    if c.get("worst") is not None:
        lines += ["", f"Other processes used up to {c['worst']:.0%} of the machine's CPU during a timed phase"
                  + (" — **timings are inflated by concurrent work**." if c.get("contended") else ".")]
    lines += ["", f"**Results equal to the full recompute: {fmt(r.get('results_equal'))}**", ""]
    lines += ["## Head to head at B = " + fmt(r.get("base_rows")), "",
              "| variant | seconds | vs full recompute | vs streaming | vs Laminar batched |",
              "|---|---:|---:|---:|---:|"]
    for key, label in VARIANTS:
        if r.get(key) is None and ("batched" in key or "sdp" in key):
            continue
        lines.append(f"| {label} | {fmt(r.get(key))} | {fmt(ratio(r.get(key), r.get('t_full_recompute_s')), 3)} "
                     f"| {fmt(ratio(r.get(key), r.get('t_structured_streaming_s')), 3)} "
                     f"| {fmt(ratio(r.get(key), r.get('t_incremental_batched_s')), 3)} |")
    lines += ["", "## Targets", "", "| target | Laminar path | value | threshold | met | run matched conditions |",
              "|---|---|---:|---:|---|---|"]
    for t in r.get("targets", []):
        met = {True: "met", False: "**MISSED**", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {t.get('laminar_path') or ''} | {fmt(t['value'], 3)} | "
                     f"{fmt(t['threshold'])} | {met} | {'yes' if t['conditions_met'] else 'no'} ({t['conditions']}) |")
    missed = [t for t in r.get("targets", []) if t["met"] is False]
    if missed:
        lines += ["", "Responsible stages for missed targets:", ""]
        lines += [f"- **{t['target']}**: {t['responsible']}" for t in missed]
    shown = [(k, lbl) for k, lbl in VARIANTS if any(row.get(k) is not None for row in r.get("scaling", []))]
    lines += ["", "## Scaling (fixed Δ), seconds", "", "| base rows | " + " | ".join(lbl for _, lbl in shown) + " |",
              "|---:|" + "---:|" * len(shown)]
    for row in r.get("scaling", []):
        lines.append(f"| {fmt(row['base_rows'])} | " + " | ".join(fmt(row.get(k)) for k, _ in shown) + " |")
    basis = r.get("growth_basis") or {}
    lines += ["", f"growth_inc_1m_to_10m = {fmt(r.get('growth_inc_1m_to_10m'), 3)} (per partition), "
              f"{fmt(r.get('growth_inc_batched_1m_to_10m'), 3)} (batched): incremental time at "
              f"{fmt(basis.get('to_base_rows'))} / at {fmt(basis.get('from_base_rows'))} rows."]
    for section, _ in PATH_KEYS.values():
        b = r.get(f"breakdown_{section}") or {}
        if not b:
            continue
        path = "per partition" if section == "incremental" else "batched (run_many, flows side by side)"
        lines += ["", f"## Where incremental time goes: {path}, B = {fmt(r.get('base_rows'))}", ""]
        if section != "incremental":
            lines += ["Stage times are summed over the flows, which run at the same time, so they may add up to "
                      "more than the wall time; 'other' is what the wall time leaves (at least 0).", ""]
        lines += [f"{b['runs']} partitions, {fmt(b.get('per_partition_s'))} s each; {fmt(b.get('spark_jobs'))} "
                  f"Spark jobs; a trivial job costs {fmt(b.get('spark_job_floor_s'), 3)} s here, so at least "
                  f"{fmt(b.get('spark_job_overhead_est_s'))} s is bare per-job latency; "
                  f"{fmt(b.get('delta_commit_calls'))} Delta commits. Rows read: {fmt(b.get('rows_read'))}.",
                  "", "| stage | seconds | share |", "|---|---:|---:|"]
        for k, v in b["stages_s"].items():
            lines.append(f"| {STAGE_LABELS[k]} | {fmt(v)} | {fmt((b['stages_share'] or {}).get(k), 2)} |")
        cc = b.get("cross_cutting_s") or {}
        lines += ["", "Across stages: " + ", ".join(f"{k.replace('_', ' ')} {fmt(v)} s" for k, v in cc.items()) + ".",
                  "", "Modes: " + _modes(b.get("modes")) + "."]
        cpu = cpu_split.describe(b.get("cpu"))
        full_cpu = cpu_split.describe(r.get("full_recompute_cpu"))
        if cpu:
            lines += ["", cpu + (" The full recompute, for comparison: " + full_cpu.replace("CPU while timed: ", "")
                                 if full_cpu else ""),
                      "", "CPU kinds: " + "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in cpu_split.KINDS.items()) + "."]
    ud = r.get("updates_deletes") or {}
    if ud.get("t_full_recompute_s") is not None:
        lines += ["", "## Updates and deletes (change data feed)", "",
                  f"Full recompute {fmt(ud['t_full_recompute_s'])} s; results equal: {fmt(ud['results_equal'])}.", ""]
        for path in PATH_KEYS:
            if path in ud:
                lines.append(f"- Laminar {path}: {fmt(ud[path]['t_incremental_s'])} s "
                             f"(ratio {fmt(ud[path]['ratio_inc_vs_full'], 3)}); paths taken: "
                             f"{_modes(ud[path].get('modes'))}.")
        for flow, ways in (ud.get("extreme_paths") or {}).items():
            lines.append(f"- {flow}, batched, by the way deletes and updates under its extremes went (extreme_refill; "
                         f"median of {len(next(iter(ways.values()))['samples_s'])} run(s) each, in rotating order): "
                         + "; ".join(f"{how} {fmt(w['seconds'])} s ("
                                     + ", ".join(f"{m} ×{n}" for m, n in w["modes"].items()) + ")"
                                     for how, w in ways.items())
                         + ".")
        lines += ["", ud["paths"] + ". Structured Streaming: " + ud["structured_streaming"] + "."]
        cal = r.get("cost_calibration") or {}
        measured = [f"{path}: {fmt(c['pass_seconds'])} s a pass and {c['scan_bytes_per_second'] / 1e6:.0f} MB/s"
                    for path, c in cal.items() if path != "defaults" and "pass_seconds" in c]
        if measured:
            d = cal["defaults"]
            lines += ["", "The prices of that choice measured in this run (incremental against refill of the same "
                      "size): " + "; ".join(measured) + f". The engine's defaults: {fmt(d['pass_seconds'])} s and "
                      f"{d['scan_bytes_per_second'] / 1e6:.0f} MB/s."]
    f = r.get("freshness") or {}
    lines += ["", "## End-to-end freshness through Dagster", ""]
    if f:
        lines.append(f"p50 {fmt(r.get('e2e_freshness_p50_s'))} s, p95 {fmt(r.get('e2e_freshness_p95_s'))} s, "
                     f"max {fmt(f.get('max_s'))} s over {f.get('measured_commits')} commits "
                     f"(sensor interval {f.get('sensor_interval_seconds')} s; mean wait for a tick "
                     f"{fmt(f.get('mean_wait_for_tick_s'))} s, mean sensor evaluation "
                     f"{fmt(f.get('mean_sensor_evaluation_s'))} s, mean run {fmt(f.get('mean_run_s'))} s, "
                     f"{f.get('failed_runs')} failed runs).")
        passed = f.get("commits_passed_over_by_sensor") or []
        if f.get("unfinished_commits"):
            lines += ["", f"**{f['unfinished_commits']} commit(s) never became fresh** during the measurement "
                      "(not in p50/p95)" + (
                          f"; {len(passed)} of them the sensor passed over: its cursor moved beyond the commit "
                          "while runs were requested for only some flows, so these stayed behind until another "
                          "commit touches them: " + "; ".join(
                              f"version {x['version']}: {', '.join(x['flows_partitions_behind'])}" for x in passed)
                          if passed else "") + "."]
        lines += ["", f.get("what_is_measured", "")]
    else:
        lines.append("not measured")
    lines += _s3_section(r.get("s3"))
    mem = r.get("memory") or {}
    lines += ["", "## Memory", "", f"peak_rss_mb = {fmt(r.get('peak_rss_mb'), 0)} "
              f"(by process: {mem.get('peak_rss_by_process_mb')}); largest simultaneous sample "
              f"{fmt(mem.get('peak_rss_sampled_total_mb'), 0)} MB. {mem.get('peak_rss_measured', '')}"]
    lines += _sdp(r)
    lines += ["", "## Structured Streaming set-up and limits", ""]
    lines += [f"- {x}" for x in r.get("streaming_limitations", [])]
    if r.get("errors"):
        lines += ["", "## Errors", ""] + [f"- {e}" for e in r["errors"]]
    lines += ["", "Plot: `latest.png` (time vs base rows per variant). Raw numbers: `latest.json`.", ""]
    return "\n".join(lines)


def _sdp(r: dict) -> list[str]:
    """The Spark Declarative Pipelines section (bench/sdp_peer.py), if it ran."""
    s = r.get("sdp")
    if not s:
        return []
    f = lambda v: "—" if v is None else f"{v:,}" if isinstance(v, int) else f"{v:.2f}"  # noqa: E731
    ph, sep = s.get("phases_s") or {}, s.get("measured_separately")
    lines = ["", "## Spark Declarative Pipelines (materialized views, `spark-pipelines run`)", "",
             f"After Δ, the refresh (the `start_run` command, from the event log) took {f(s['refresh_s'])} s in "
             f"Spark, {f(r.get('ratio_sdp_vs_inc_batched'))}× Laminar's incremental batched pass, and the whole "
             f"command {f(s['wall_s'])} s ({f(r.get('ratio_sdp_command_vs_inc_batched'))}×): "
             + ", ".join(f"{k.replace('_', ' ')} {f(v)} s" for k, v in ph.items()) + ". "
             f"{s['spark_jobs']} Spark jobs ({f(s['spark_jobs_s'])} s). It read {f(s['rows_read'])} rows "
             f"({len(s.get('table_rows') or {})} views × {f(s['source_rows'])} source rows) and wrote "
             f"{f(s['rows_written'])} (the views hold {f(sum((s.get('table_rows') or {}).values()))}); files kept "
             f"from the previous run: {sum((s.get('files_kept') or {}).values())}. **Whole table recomputed: "
             f"{'yes' if s['recomputed_whole_table'] else 'no'}**; results equal to the full recompute: "
             f"{'yes' if s['results_equal'] else 'NO'}. Its processes used {f(s.get('cpu_s'))} CPU seconds and "
             f"{f(s.get('peak_rss_mb'))} MB at their peaks; other processes used "
             f"{'—' if s.get('cpu_others_share') is None else format(s['cpu_others_share'], '.0%')} of the "
             "machine's CPU meanwhile."]
    if sep:
        load = sep.get("load_avg_1m") or [None, None]
        lines += ["", f"Measured separately (`--only sdp`, started {sep.get('started_at')}, 1-minute load average "
                      f"{load[0]} at the start and {load[-1]} at the end) on the same base and Δ (same generator, "
                      "seeds and settings); the Laminar times it is compared with come from this report's run."]
    return lines + [""] + [f"- {x}" for x in s.get("limitations", [])]


def plot(r: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    fig, ax = plt.subplots(figsize=(8, 5), dpi=110)
    rows = r.get("scaling") or []
    for (key, label), style in zip(VARIANTS, ("o-", "o--", "s-", "s--", "D-", "^-", "v-", "v:")):
        pts = [(s["base_rows"], s[key]) for s in rows if s.get(key) is not None]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    if rows:
        ax.set_xticks([s["base_rows"] for s in rows])
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v / 1e6:g}M" if v >= 1e6 else f"{v / 1e3:g}k"))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}" if f"{v:g}"[0] in "235" else ""))
    ax.set_xlabel("base rows B (log)")
    ax.set_ylabel("seconds to absorb Δ (log)")
    equal = "results equal" if r.get("results_equal") else "RESULTS NOT EQUAL"
    ax.set_title(f"Δ = {fmt(r.get('delta_rows'))} rows, both flows, local[2], profile {r.get('profile')} ({equal})",
                 fontsize=10)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_lines():
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_all(r: dict, out_dir: str) -> list[str]:
    """latest.json, latest.md and latest.png in `out_dir`; returns their paths."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, n) for n in ("latest.json", "latest.md", "latest.png")]
    try:
        plot(r, paths[2])
    except Exception as exc:  # noqa: BLE001  (the numbers matter more than the picture)
        r.setdefault("errors", []).append(f"plot: {exc!r}")
        paths.pop()
    with open(paths[0], "w") as fh:
        json.dump(r, fh, indent=2, default=str)
        fh.write("\n")
    with open(paths[1], "w") as fh:
        fh.write(markdown(r))
    return paths


def console_summary(r: dict) -> str:
    keys = ("base_rows", "delta_rows", "t_incremental_s", "t_incremental_batched_s", "t_refill_touched_s",
            "t_refill_touched_batched_s", "t_full_recompute_s", "t_structured_streaming_s", "t_sdp_refresh_s",
            "t_sdp_s", "ratio_sdp_vs_inc_batched", "ratio_inc_vs_full",
            "ratio_inc_batched_vs_full", "ratio_inc_vs_streaming", "ratio_inc_batched_vs_streaming",
            "growth_inc_1m_to_10m", "growth_inc_batched_1m_to_10m", "e2e_freshness_p50_s", "e2e_freshness_p95_s",
            "peak_rss_mb", "results_equal")
    lines = ["bench results:"] + [f"  {k:32s} {fmt(r.get(k), 3)}" for k in keys]
    for t in r.get("targets", []):
        if t["met"] is False:
            lines.append(f"  MISSED {t['target']}: {t['responsible']}")
    return "\n".join(lines)
