"""The end-to-end demo through Dagster: generate sources, let the Delta-version sensors
request runs and execute them on the local instance, then commit late rows, corrections
and cancellations and let the sensors bring everything up to date again."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import dagster as dg

from laminar_assets.orchestration.internals.in_process import evaluate_sensor, execute_request, failure_message

from .generator import BatchOptions, BatchSummary, recent_start, write_batch
from .lake import reset_demo_lake


@dataclass(frozen=True)
class RunRow:
    """One materialized partition, as the demo table shows it (from the run's Dagster metadata)."""

    flow: str
    partition: str
    mode: str
    reason: str
    versions: str
    rows_read: int
    sink_rows: int
    seconds: float
    quarantined: int = 0
    success: bool = True
    error: str = ""
    # an export's delivery: rows upserted, deleted and sent (a webhook), the version delivered (empty for a flow)
    delivered: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DemoStep:
    title: str
    batch: BatchSummary
    runs: tuple[RunRow, ...]
    seconds: float
    sensor_ticks: int = 0
    requests: int = 0


@dataclass
class Driver:
    """Evaluates every pipeline sensor and runs what it requests, until quiet: the daemon's loop, in process.
    A sensor without a cursor starts from the watermarks, so `dagster dev` afterwards redoes nothing."""

    defs: dg.Definitions
    instance: dg.DagsterInstance
    sensor_names: list[str]
    cursors: dict[str, str | None] = field(default_factory=dict)
    # hears what a run waits for (a pool slot another run holds) and which runs of dead processes it failed,
    # as `laminar refill` prints them: a run that waits says so instead of sitting silent for minutes
    notify: Callable[[str], None] | None = None

    def until_quiet(self, on_run=None, max_rounds: int = 10) -> tuple[list[RunRow], int, int]:
        rows, ticks, requested = [], 0, 0
        for _ in range(max_rounds):
            launched = 0
            for name in self.sensor_names:
                result = evaluate_sensor(self.defs, name, self.instance, self.cursors.get(name))
                ticks += 1
                if not isinstance(result, dg.SensorResult):
                    continue
                self.cursors[name] = result.cursor
                for event in result.asset_events or ():  # the daemon records these (source versions)
                    self.instance.report_runless_asset_event(event)
                for request in result.run_requests or ():  # dagster keeps [] for none
                    launched += 1
                    outcome = execute_request(self.defs, request, self.instance, notify=self.notify)
                    for row in run_rows(request, outcome):
                        rows.append(row)
                        if on_run:
                            on_run(row)
            requested += launched
            if not launched:
                break
        return rows, ticks, requested


def run_rows(request: dg.RunRequest, outcome: dg.ExecuteInProcessResult) -> list[RunRow]:
    """One row per asset of the run, from its materialization metadata (a range run sums its partitions)."""
    failures = {e.step_key: e for e in outcome.all_events if e.is_step_failure}
    # a run that failed outside any step (its executor could not start, a pool slot given up on) failed every asset
    # it holds: each row says why, not that an upstream step failed
    failed_run = not outcome.success and not failures
    rows = []
    assert request.asset_selection is not None, request  # Laminar's sensors name the assets of every request
    for key in request.asset_selection:
        name = key.to_user_string()
        mats = outcome.asset_materializations_for_node(name)
        if not mats:
            failure = failures.get(name) is not None or failed_run
            message = failure_message(outcome) if failure else "skipped: an upstream step or blocking check failed"
            rows.append(RunRow(name, request.partition_key or "range", "FAILED" if failure else "SKIPPED", "-", "-",
                               0, 0, 0.0, 0, False, message))
            continue
        md: dict[str, Any] = {k: getattr(v, "value", v) for k, v in mats[0].metadata.items()}
        if "rows_upserted" in md and "target" in md:  # an export: one delivery, whatever partitions the run holds
            rows.append(_delivery_row(name, mats, md))
            continue
        partition = mats[0].partition or "" if len(mats) == 1 else f"{mats[0].partition} … {mats[-1].partition}"
        if len(mats) == 1:
            frm, to = md.get("versions_from", {}), md.get("versions_to", {})
            versions = ", ".join(f"{s} {frm.get(s)}→{v}" for s, v in to.items())
            mode, reason = str(md["mode"]), str(md.get("reason", "")) + _recomputed(md)
            seconds = float(md.get("seconds_total", 0.0))
        else:  # a range run: one materialization per partition, each with its own metrics
            versions = ""
            mode = " ".join(f"{m}×{n}" for m, n in sorted((md.get("modes") or {}).items()))
            reason = ", ".join(sorted({v.split(" (")[-1].rstrip(")") for v in (md.get("changed_partitions") or {}).values()}))
            groups, windows = _total(mats, "refilled_groups"), _total(mats, "refilled_windows")
            keys = _total(mats, "refilled_keys")
            reason += "".join(f"; {n} {what} recomputed" for n, what in ((groups, "group(s)"), (keys, "key(s)"),
                                                                         (windows, "window(s)")) if n)
            seconds = float(md.get("range_seconds_total", 0.0))

        rows.append(RunRow(name, partition, mode, reason, versions, _total(mats, "rows_read"),
                           _total(mats, "sink_rows"), seconds, _total(mats, "rows_quarantined")))
    return rows


def _delivery_row(name: str, mats, md: dict) -> RunRow:
    """An export's row: one delivery (a run of several partitions records it once per partition, the same)."""
    partition = mats[0].partition or "" if len(mats) == 1 else f"{mats[0].partition} … {mats[-1].partition}"
    counts = {k: int(md.get(f"rows_{k}") or 0) for k in ("upserted", "deleted", "sent")}
    delivered = {**counts, "version": md.get("delivered_version")}
    versions = f"{md.get('from_version', '-')}→{md.get('delivered_version', '-')}"
    reason = str(md.get("reason", ""))
    if md.get("stopped"):
        reason += f"; stopped: {md['stopped']}"
    written = counts["sent"] if "rows_sent" in md else counts["upserted"]  # rows that reached the target
    return RunRow(name, partition, str(md["mode"]), reason, versions, int(md.get("change_rows") or 0), written,
                  float(md.get("seconds_total") or 0.0), 0, delivered=delivered)


def _recomputed(md: dict) -> str:
    """What a refill recomputed: a flow's groups alone or whole windows, a stage's keys alone ('' for
    other runs)."""
    if md.get("mode") != "REFILL":
        return ""
    if md.get("refilled_groups"):
        return f"; {md['refilled_groups']} group(s) recomputed"
    if md.get("refilled_keys"):
        return f"; {md['refilled_keys']} key(s) recomputed"
    if md.get("refilled_windows"):
        return f"; {md['refilled_windows']} window(s) recomputed"
    return ""


def _total(mats, key: str) -> int:
    """A numeric metadata value summed over a run's materializations."""
    return sum(int(getattr(m.metadata.get(key), "value", 0) or 0) for m in mats)


def pipeline_sensor_names(defs: dg.Definitions) -> list[str]:
    """The sensors that launch runs on new Delta versions, one per connected part of the graph."""
    return [s.name for s in defs.sensors or () if s.name.endswith("_pipeline")]


def start_spark_early(defs: dg.Definitions) -> threading.Thread | None:
    """Start the runs' SparkSession in a background thread (see `engine.start_session`), so it overlaps
    with writing the first batch and the first sensor tick."""
    laminar = (defs.resources or {}).get("laminar")
    spark = getattr(laminar, "spark", None)
    if spark is None:
        return None
    from laminar_assets.engine.spark import start_session

    return start_session(spark.options())


def run_demo(defs: dg.Definitions, instance: dg.DagsterInstance, specs, root: str, *, rows: int, seed: int,
             on_run=None, start: datetime | None = None, notify: Callable[[str], None] | None = None) -> list[DemoStep]:
    """Two batches of commits, each brought up to date by the sensors' runs. The data starts a few
    hours before now (`recent_start`) unless `start` is given, so the UI's partition plots show it.
    `root` must be empty, new, or a lake an earlier demo made (`lake.reset_demo_lake`): it is emptied first.
    `notify` hears what a run waits for, as in `Driver`."""
    reset_demo_lake(root)  # a new lake; a root holding anything but an earlier demo's lake is refused
    driver = Driver(defs, instance, pipeline_sensor_names(defs), notify=notify)
    steps = []
    t = time.perf_counter()
    start_spark_early(defs)
    first = write_batch(root, BatchOptions(rows=rows, seed=seed, start=start or recent_start()), batch=0)
    runs, ticks, requested = driver.until_quiet(on_run)
    steps.append(DemoStep("batch 1: three hours of in-order trades", first, tuple(runs), time.perf_counter() - t,
                          ticks, requested))
    t = time.perf_counter()
    second = write_batch(root, BatchOptions(rows=max(rows // 4, 50), seed=seed), batch=1)
    runs, ticks, requested = driver.until_quiet(on_run)
    steps.append(DemoStep("batch 2: a new hour + late rows, duplicates, corrections, cancellations", second,
                          tuple(runs), time.perf_counter() - t, ticks, requested))
    return steps
