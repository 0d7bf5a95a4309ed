"""End-to-end freshness through Dagster: from a source commit until its windows are in the sink.

The path is the production one: the `trades_versions` Delta-version sensor sees the commit, requests
runs for the partitions its file statistics touch, and the runs (the flows' Dagster assets calling
the engine) commit the new windows. The sensor daemon is emulated in process, the way the demo
drives Dagster (`laminar_assets.orchestration.internals.in_process`): the sensor is evaluated every
`sensor_interval_seconds` (the project's local default from `[tool.laminar]`, measured from the
start of the previous tick, as the daemon's minimum interval), and its run requests are executed
with `materialize` on a real, temporary `DagsterInstance` (SQLite, the repo's dagster.yaml), on the
warm Spark session.

Meanwhile a writer thread appends trades into the newest windows at random moments, so a commit
waits for the next tick as it would in production. A commit counts as fresh once the watermark of
every (flow, partition) it touched has reached its Delta version: the state and sink commits
happen before the watermark moves, so the sink holds the commit's windows by then.

Not included: the default daemon launches each run in a new process that starts its own Spark
JVM; here runs reuse the warm session (as `laminar demo` does), so that start-up comes on top.
"""

from __future__ import annotations

import os
import queue
import shutil
import threading
import time
import warnings
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import Interval
from laminar_assets.engine.report import reach

# Imported when the harness starts (not when freshness is measured, half an hour later), so one
# run uses one consistent version of the code; and without Dagster's beta/preview notices.
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    import dagster as dg

    from laminar_assets.definitions import build_definitions
    from laminar_assets.demo.run import Driver, pipeline_sensor_names
    from laminar_assets.orchestration.internals.in_process import evaluate_sensor, execute_request
    from laminar_assets.pipeline.settings import load_settings
    from laminar_assets.resources import LaminarResource, SparkResource

from .specs import bench_specs
from .workload import TABLE, Lake, commit_table, trades, uniform_times, write_base

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GAP = (0.5, 1.5)  # commits arrive this many sensor intervals apart (uniformly at random)

DAEMON_LOOP_S = 0.25  # the Laminar instance's sensor loop (instance.py SENSOR_LOOP_SECONDS; Dagster's own: 5 s)


@dataclass
class _Pending:
    version: int
    committed_at: float
    targets: set[tuple[str, str]]
    seen_at_tick: float | None = None
    tick_done_at: float | None = None
    fresh_at: float | None = None


def _cursor_version(cursor: str | None) -> int:
    """The Delta version of the source table in a pipeline sensor's cursor."""
    from laminar_assets.orchestration.sensors import parse_cursor

    return int(parse_cursor(cursor).versions.get(TABLE, -1))


def _percentile(values: list[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 3) if values else None


def measure_freshness(spark, work: str, *, commits: int, base_rows: int, base_hours: int, commit_rows: int,
                      shuffle_partitions: int, seed: int) -> dict:
    if os.path.isdir(work):
        shutil.rmtree(work)
    lake = Lake(os.path.join(work, "lake"))
    home = os.path.join(work, "dagster_home")
    os.makedirs(home)
    shutil.copyfile(os.path.join(REPO, "dagster.yaml"), os.path.join(home, "dagster.yaml"))
    base = write_base(lake, base_rows, base_hours, hours_per_commit=1, correction_hours=0, seed=seed)
    specs = bench_specs()
    # the base's data starts in 2024; the project's schedules name its own flows, not the bench's
    settings = load_settings().model_copy(update={"partitions_start": datetime(2024, 1, 1, tzinfo=UTC), "schedules": {}})
    # the daemon evaluates sensors at most once per loop (DAEMON_LOOP_S), whatever the interval.
    interval = max(DAEMON_LOOP_S, float(settings.sensor_interval_seconds))
    resources = {"laminar": LaminarResource(root=lake.root, spark=SparkResource(
        master=spark.sparkContext.master, shuffle_partitions=shuffle_partitions, stop_at_end=False))}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        defs = build_definitions(specs, settings, resources=resources, contracts_dir=None)
    store = CheckpointStore(lake.root)
    out: dict = {"sensor_interval_seconds": interval, "commits": commits, "commit_rows": commit_rows,
                 "base_rows": base_rows}
    with dg.DagsterInstance.from_config(home) as instance:
        names = pipeline_sensor_names(defs)
        driver = Driver(defs, instance, names)
        t = time.perf_counter()
        boot_rows, _, _ = driver.until_quiet()
        out["bootstrap_s"] = round(time.perf_counter() - t, 3)
        out["bootstrap_runs"] = len(boot_rows)
        cursors = dict(driver.cursors)

        rng = np.random.default_rng(seed + 7)
        arrivals: queue.Queue = queue.Queue()
        errors: list[str] = []
        step = timedelta(minutes=2)

        def writer() -> None:
            first_id, tip = base.next_id, base.end
            try:
                for _ in range(commits):
                    time.sleep(float(rng.uniform(GAP[0] * interval, GAP[1] * interval)))
                    times = uniform_times(rng, commit_rows, tip, tip + step)
                    c = commit_table(lake, trades(rng, first_id, times), "append", tip, tip + step)
                    arrivals.put((c.version, time.perf_counter(), tip, tip + step))
                    first_id += commit_rows
                    tip += step
            except Exception as exc:  # noqa: BLE001  (surfaced in the results)
                errors.append(f"writer: {exc!r}")
            finally:
                arrivals.put(None)

        pending: list[_Pending] = []
        done: list[_Pending] = []
        sensor_eval_s: list[float] = []
        run_s: list[float] = []
        failed_runs = 0
        writer_done = False
        thread = threading.Thread(target=writer, name="bench-writer", daemon=True)
        thread.start()
        last_tick = time.perf_counter()
        deadline = time.perf_counter() + commits * 2 * interval + 600
        idle_ticks = 0  # ticks in a row without run requests after the last commit
        cursor_version = -1

        def check(now: float) -> None:
            for p in list(pending):
                if all((m := store.load(f, k)) is not None and m.committed and
                       (m.source_versions.get(TABLE) or -1) >= p.version for f, k in p.targets):
                    p.fresh_at = now
                    pending.remove(p)
                    done.append(p)

        # After the last commit, stop once the sensor has been quiet for a few ticks: a commit still
        # pending then was passed over by the sensor (its cursor is at or beyond the commit's version).
        while (not writer_done or pending) and time.perf_counter() < deadline and idle_ticks < 4:
            while True:
                try:
                    item = arrivals.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    writer_done = True
                    continue
                version, at, lo, hi = item
                targets = {(s.name, k) for s in specs for k in reach(s, Interval(lo, hi))}
                pending.append(_Pending(version, at, targets))
            wait = last_tick + interval - time.perf_counter()
            if wait > 0:
                time.sleep(min(wait, 0.02))
                continue
            last_tick = time.perf_counter()
            visible = [p for p in pending if p.seen_at_tick is None]
            requested = 0
            for name in names:
                t = time.perf_counter()
                result = evaluate_sensor(defs, name, instance, cursors.get(name))
                sensor_eval_s.append(time.perf_counter() - t)
                if not isinstance(result, dg.SensorResult):
                    continue
                cursors[name] = result.cursor
                seen = _cursor_version(result.cursor)
                cursor_version = max(cursor_version, seen)
                requested += len(result.run_requests)
                for p in visible:
                    if p.version <= seen and p.seen_at_tick is None:
                        p.seen_at_tick, p.tick_done_at = last_tick, time.perf_counter()
                for request in result.run_requests:
                    t = time.perf_counter()
                    outcome = execute_request(defs, request, instance)
                    run_s.append(time.perf_counter() - t)
                    failed_runs += 0 if outcome.success else 1
                    check(time.perf_counter())
            check(time.perf_counter())
            idle_ticks = idle_ticks + 1 if writer_done and not requested else 0
        thread.join(timeout=5)
        skipped = [p for p in pending if p.version <= cursor_version]

    fresh = [p.fresh_at - p.committed_at for p in done]
    waits = [p.seen_at_tick - p.committed_at for p in done if p.seen_at_tick is not None]
    after_tick = [p.fresh_at - p.tick_done_at for p in done if p.tick_done_at is not None]
    out.update({
        "samples_s": [round(x, 3) for x in fresh],
        "measured_commits": len(done),
        "unfinished_commits": len(pending),
        "commits_passed_over_by_sensor": [
            {"version": p.version, "flows_partitions_behind": sorted(
                f"{f} {k}" for f, k in p.targets
                if ((m := store.load(f, k)) is None or (m.source_versions.get(TABLE) or -1) < p.version))}
            for p in skipped],
        "p50_s": _percentile(fresh, 50),
        "p95_s": _percentile(fresh, 95),
        "max_s": round(max(fresh), 3) if fresh else None,
        "mean_wait_for_tick_s": round(float(np.mean(waits)), 3) if waits else None,
        "mean_from_tick_to_fresh_s": round(float(np.mean(after_tick)), 3) if after_tick else None,
        "mean_sensor_evaluation_s": round(float(np.mean(sensor_eval_s)), 3) if sensor_eval_s else None,
        "mean_run_s": round(float(np.mean(run_s)), 3) if run_s else None,
        "runs": len(run_s),
        "failed_runs": failed_runs,
        "errors": errors,
        "what_is_measured": (
            "wall time from a source commit becoming visible (write_deltalake returned) until the watermark of "
            "every (flow, partition) it touched reached its version (state and sink are committed before that), "
            f"via the pipeline sensor ticking every {interval:g} s (the [tool.laminar] default) and its run "
            "requests executed in process on a real DagsterInstance with the warm Spark session; commits arrive "
            f"at random moments {GAP[0]:g}-{GAP[1]:g} sensor intervals apart. Not included: the default daemon's "
            "launch of each run in a new process with its own Spark JVM (see spark_start_s for that start-up cost)."),
    })
    return out
