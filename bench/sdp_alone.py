"""`python -m bench.run --profile full --only sdp`: the Spark Declarative Pipelines peer alone, merged
into an existing report without re-running the other variants.

At each size of the profile: the same base and Δ rounds as `bench.run` (same generator, seeds and
settings), the SDP peer run over the base (untimed), then per round: commit Δ, recompute the sinks
in full (the bench's reference, in its warm session), time `spark-pipelines run`, compare. The
result is merged into the section of `<out>/latest.json` with the same base size, when that report
was made with the same workload settings, and the report (latest.json, .md, .png) is regenerated
from it; the other variants' numbers stay as they were, and the SDP section says when it was
measured. Otherwise the result is written to `<out>/sdp_alone.json`.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics

from . import environment, render, report, sdp_peer
from .config import Profile
from .equality import all_equal
from .measure import MemorySampler, load_average
from .specs import bench_specs
from .variants import full_recompute
from .workload import Lake, added_files, write_base, write_delta_round

SAME_WORKLOAD = ("base_hours", "delta_rows", "append_minutes", "late_share", "late_partitions", "hours_per_commit",
                 "correction_hours", "rounds", "seed")
SDP_KEYS = ("t_sdp_s", "t_sdp_samples_s", "t_sdp_refresh_s", "t_sdp_refresh_samples_s", "sdp", "sdp_base",
            "sdp_errors")


def _size(spark, profile: Profile, base_rows: int, work: str, sampler: MemorySampler) -> dict:
    shutil.rmtree(work, ignore_errors=True)
    lake = Lake(os.path.join(work, "lake"))
    specs = bench_specs(lake.uri)
    label = f"B={base_rows:,}"
    base = write_base(lake, base_rows, profile.base_hours, hours_per_commit=profile.hours_per_commit,
                      correction_hours=profile.correction_hours, seed=profile.seed)
    res: dict = {"base_rows": base_rows, "delta_rows": profile.delta_rows, "sdp_errors": []}
    peer = sdp_peer.SdpPeer(specs, os.path.join(work, "sdp"), driver_memory=profile.driver_memory,
                            shuffle_partitions=profile.shuffle_partitions)
    res["sdp_base"] = sdp_peer.base_pass(peer, lake.files(lake.version()), sampler, label)
    rounds, v_prev = [], lake.version()
    for r in range(profile.rounds):
        write_delta_round(lake, base, profile, r)
        v = lake.version()
        full = full_recompute(spark, lake, specs, os.path.join(work, f"full-{r}"), version=v)
        rd = sdp_peer.timed_round(peer, spark, full["sinks"], added_files(lake, v_prev, v), sampler,
                                  label + (f" round {r + 1}" if profile.rounds > 1 else ""), r)
        rd["t_full_recompute_same_run_s"] = full["wall_s"]
        rounds.append(rd)
        v_prev = v
    res["sdp_errors"] += [f"round {i + 1}: {rd['sdp_error']}" for i, rd in enumerate(rounds) if rd.get("sdp_error")]
    for key in ("t_sdp_s", "t_sdp_refresh_s", "t_full_recompute_same_run_s"):
        samples = [(i, rd[key]) for i, rd in enumerate(rounds) if rd.get(key) is not None]
        if samples:
            res[key] = round(statistics.median(v for _, v in samples), 4)
            res[f"{key[:-2]}_samples_s"] = [v for _, v in samples]
    if res.get("t_sdp_s") is not None:
        i = min(range(len(rounds)), key=lambda i: abs((rounds[i].get("t_sdp_s") or 1e9) - res["t_sdp_s"]))
        res["sdp"] = {**rounds[i]["sdp"], "round": i}
    res["rounds"] = [{k: v for k, v in rd.items() if k != "sdp"} for rd in rounds]
    res["sdp_equal"] = len(rounds) > 0 and all(
        rd.get("equality_sdp") and all_equal(rd["equality_sdp"]["sdp"]) for rd in rounds)
    if not os.environ.get("BENCH_KEEP_WORK"):
        shutil.rmtree(work, ignore_errors=True)
    return res


def _merge(report_json: dict, measured: dict, when: dict, sampler_report: dict) -> bool:
    """Put one size's SDP result into the report's section of that size; False if there is none."""
    settings = report_json.get("settings") or {}
    target = next((s for s in report_json.get("by_size") or [] if s.get("base_rows") == measured["base_rows"]), None)
    if target is None or any(settings.get(k) != when["settings"].get(k) for k in SAME_WORKLOAD):
        return False
    for k in SDP_KEYS:
        target.pop(k, None)
        if k in measured:
            target[k] = measured[k]
    target["sdp_measured_separately"] = {**{k: when[k] for k in ("started_at", "load_avg_1m", "code")},
                                         "t_full_recompute_same_run_s": measured.get("t_full_recompute_same_run_s")}
    for rd, mine in zip(target.get("rounds") or [], measured["rounds"]):
        rd.update({k: v for k, v in mine.items() if k.startswith(("t_sdp", "equality_sdp", "sdp_error"))})
    target["results_equal"] = bool(target.get("results_equal")) and measured["sdp_equal"]
    mem = report_json.setdefault("memory", {})
    for key in ("cpu_used_by_other_processes_by_phase", "load_avg_1m_by_phase"):
        mem.setdefault(key, {}).update({p: v for p, v in (sampler_report.get(key) or {}).items() if " sdp" in p})
    return True


def run_alone(profile: Profile, result: dict, work: str, out_dir: str) -> int:
    sampler = MemorySampler().start()
    spark = environment.start_session(profile, result)
    measured = []
    try:
        for b in sorted(profile.sizes):
            print(f"bench (sdp only): base {b:,} rows", flush=True)
            measured.append(_size(spark, profile, b, os.path.join(work, f"sdp-b{b}"), sampler))
    finally:
        sampler.stop()
        spark.stop()
    when = {"started_at": result["started_at"], "load_avg_1m": [result["load_avg_start"][0], load_average()[0]],
            "code": result["code"], "settings": profile.to_json()}
    path = os.path.join(out_dir, "latest.json")
    merged = []
    if os.path.exists(path):
        with open(path) as fh:
            full = json.load(fh)
        merged = [m["base_rows"] for m in measured if _merge(full, m, when, sampler.report())]
        if merged:
            render.write_all(report.summarize(full), out_dir)
            print(f"bench (sdp only): merged B = {merged} into {path} and regenerated the report", flush=True)
    rest = [m for m in measured if m["base_rows"] not in merged]
    if rest:
        os.makedirs(out_dir, exist_ok=True)
        with open(os.path.join(out_dir, "sdp_alone.json"), "w") as fh:
            json.dump({**when, "by_size": rest, "memory": sampler.report()}, fh, indent=2, default=str)
        print(f"bench (sdp only): no matching report section for B = {[m['base_rows'] for m in rest]}; "
              f"wrote {os.path.join(out_dir, 'sdp_alone.json')}", flush=True)
    for m in measured:
        print(f"  B={m['base_rows']:,}: sdp command {m.get('t_sdp_s')}s, refresh {m.get('t_sdp_refresh_s')}s, "
              f"equal {m['sdp_equal']}, errors {m['sdp_errors']}", flush=True)
    return 0 if all(m["sdp_equal"] and not m["sdp_errors"] for m in measured) else 1

