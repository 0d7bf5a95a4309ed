"""Sensors: Delta versions stand in for sequence numbers.

One sensor per connected part of the graph (a source table, the stage reading it, and every flow
downstream). Each tick reads every table's version once, works out the dirty partitions of every
spec (`tick.plan_tick`) and requests ONE run that materializes them all, in graph order, in one
process and one Spark session: a commit of 200 rows with late rows and corrections is one run,
not one per (flow, partition). While a run of the part is queued or running the sensor waits;
the next tick then covers every commit that landed meanwhile.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from contextvars import ContextVar
from datetime import datetime
from math import inf
from typing import Any

import dagster as dg

from laminar_assets.engine import ExportSpec, LaminarError
from laminar_assets.engine.report import inspect_partition, is_stale
from laminar_assets.orchestration import resume
from laminar_assets.orchestration.assets import COMPONENT_TAG, partitions_def
from laminar_assets.orchestration.internals.private_names import DATA_VERSION_TAG, AssetCheckExecutionRecordStatus
from laminar_assets.orchestration.internals.run_processes import fail_dead_runs
from laminar_assets.pipeline.graph import Component, Spec, components
from laminar_assets.pipeline.settings import LaminarSettings
from laminar_assets.pipeline.tick import Cursor, pending_exports, plan_tick, watch_for_commits
from laminar_assets.resources import LaminarResource

RANGE_START = resume.RANGE_START
RANGE_END = resume.RANGE_END
# Whether a tick that finds nothing to do watches its sources for a commit (`sensor_watch_seconds`). A tick the
# daemon runs does; one run in this process by a caller that ticks again on its own schedule (the demo, the
# in-process bench: `in_process.evaluate_sensor`) does not, so it never waits.
WATCHING: ContextVar[bool] = ContextVar("laminar_sensor_watching", default=True)
# How often a watching tick asks the instance whether its part's run is still in progress: one query of the run
# storage each time, while a run lasts.
RUN_POLL_SECONDS = 0.1
ACTIVE = [dg.DagsterRunStatus.QUEUED, dg.DagsterRunStatus.NOT_STARTED, dg.DagsterRunStatus.STARTING,
          dg.DagsterRunStatus.STARTED, dg.DagsterRunStatus.CANCELING]


def parse_cursor(text: str | None) -> Cursor:
    if not text:
        return Cursor()
    data = json.loads(text)
    return Cursor(versions={k: int(v) for k, v in (data.get("versions") or {}).items()},
                  held={k: tuple(v) for k, v in (data.get("held") or {}).items()},
                  ids={k: str(v) for k, v in (data.get("ids") or {}).items()})  # absent in older cursors


def format_cursor(cursor: Cursor, *, failures: resume.Failures | None = None) -> str:
    held = {k: sorted(v) for k, v in cursor.held.items() if v}
    return json.dumps({"versions": cursor.versions, "ids": cursor.ids, **({"held": held} if held else {}),
                       **({"failures": failures.to_json()} if failures else {})}, sort_keys=True)


def failed_check_partitions(instance: dg.DagsterInstance, producer: Spec, keys: set[str]) -> set[str]:
    """Partitions of `producer` not cleared by their blocking `contract` check: the latest evaluation
    failed, is still running (planned), or checked an older materialization than the latest.
    A partition the check never ran on is not held (there is nothing to gate on)."""
    if not keys:
        return set()
    check = dg.AssetCheckKey(dg.AssetKey(producer.name), "contract")
    infos = instance.event_log_storage.get_asset_check_partition_info([check], partition_keys=sorted(keys))
    return {i.partition_key for i in infos if i.partition_key is not None  # (asked by partition: each has its key)
            and (i.latest_execution_status is not AssetCheckExecutionRecordStatus.SUCCEEDED or not i.is_current)}


def range_requests(dirty: dict[Spec, list[str]], settings: LaminarSettings, *, run_key: str,
                   tags: dict[str, str] | None = None, checks: list[dg.AssetCheckKey] | None = None,
                   exports: dict[str, tuple[Spec, list[str]]] | None = None) -> list[dg.RunRequest]:
    """One run per partitioning (hourly or daily, and its first partition) over the union of the dirty
    partitions, first to last: Dagster runs only assets of one partitions definition together, so flows
    that set their own `start` run apart from the rest of their part. Partitions inside the range with
    nothing to do plan as NOOP and start no Spark job. `exports`: export asset name -> (the spec it reads,
    the partitions to run it with): each joins its source's run, after it."""
    groups: dict[tuple[str, str], dict[str, tuple[Spec, list[str]]]] = {}
    members_of = [(spec.name, spec, keys) for spec, keys in dirty.items()]
    members_of += [(name, spec, keys) for name, (spec, keys) in (exports or {}).items()]
    for name, spec, keys in members_of:
        if keys:
            start = partitions_def(spec, settings).start
            own_start = "" if start == settings.partitions_start else f"@{start:%Y%m%d%H}"
            groups.setdefault((spec.granularity.value, own_start), {})[name] = (spec, keys)
    requests = []
    for (granularity, own_start), members in sorted(groups.items()):
        granularity += own_start
        pdef = partitions_def(next(iter(members.values()))[0], settings)
        # keys are fixed-width UTC times ('2024-01-02-09:00', '2024-01-02'): text order is time order,
        # so nothing lists the asset's (often tens of thousands of) partitions
        keys = sorted({k for _, ks in members.values() for k in ks if pdef.has_partition_key(k)})
        if not keys:
            continue
        assets = [dg.AssetKey(name) for name in members]
        dirty_count = sum(len(ks) for name, (spec, ks) in members.items() if name == spec.name)
        own = {**(tags or {}), "laminar/dirty_partitions": str(dirty_count)}
        wanted = None if checks is None else [c for c in checks if c.asset_key in assets]
        common: dict[str, Any] = dict(asset_selection=assets, asset_check_keys=wanted, run_key=f"{run_key}:{granularity}")
        if len(keys) == 1:
            requests.append(dg.RunRequest(partition_key=keys[0], tags=own, **common))
        else:
            requests.append(dg.RunRequest(tags={**own, RANGE_START: keys[0], RANGE_END: keys[-1]}, **common))
    return requests


def outside_partitions(dirty: dict[Spec, list[str]], settings: LaminarSettings) -> dict[str, tuple[list[str], datetime]]:
    """Dirty partitions the assets' partitions do not contain (before the flow's `start`, or after the
    current hour), with the start: no run can materialize them, so the sensor says so instead of dropping
    them quietly."""
    out: dict[str, tuple[list[str], datetime]] = {}
    for spec, keys in dirty.items():
        if keys:
            pdef = partitions_def(spec, settings)
            missing = [k for k in keys if not pdef.has_partition_key(k)]
            if missing:
                out[spec.name] = (sorted(missing), pdef.start)
    return out


def outside_message(name: str, keys: list[str], start: datetime) -> str:
    """The sensor's warning for `outside_partitions`: the keys before the asset's first partition (the
    start is the fix) apart from those after its last, the current one (event times in the future: no
    start would include them)."""
    first = f"{start:%Y-%m-%d-%H:%M}"
    before = [k for k in keys if k < first[:len(k)]]
    after = [k for k in keys if k >= first[:len(k)]]
    parts = []
    if before:
        parts.append(f"{len(before)} before its first partition ({before[0]}..{before[-1]}; it starts at "
                     f"{start:%Y-%m-%d %H:%M}): set the flow's start (or the project's partitions_start) earlier "
                     "to include them")
    if after:
        parts.append(f"{len(after)} after the current one ({after[0]}..{after[-1]}): event times in the future, "
                     "a partition exists once its time has begun (rows after now + future_horizon are quarantined)")
    return f"{name}: changed partitions outside the asset's partitions, no run can materialize them now: " + \
        "; ".join(parts)


def run_checks(specs: tuple[Spec, ...], contracts: set[str]) -> list[dg.AssetCheckKey]:
    """The checks a sensor-launched run carries: contracts (blocking ones gate consumers) and equivalence.
    `watermark_lag` scans every materialized partition; it runs on demand, not on every commit."""
    keys = [dg.AssetCheckKey(dg.AssetKey(s.name), "contract") for s in specs if s.name in contracts]
    return keys + [dg.AssetCheckKey(dg.AssetKey(s.name), "equivalence") for s in specs if s.recompute_checked]


def build_pipeline_sensor(component: Component, settings: LaminarSettings, *, blocking: set[str],
                          contracts: set[str], exports: list[ExportSpec] | tuple = ()) -> dg.SensorDefinition:
    """The sensor of one connected part. `blocking`/`contracts`: specs whose output has a
    blocking/any contract check. `exports`: the exports of the part's specs (each runs after its source)."""
    checks = run_checks(component.specs, contracts)
    names = {s.name: s for s in component.specs}
    exports = [e for e in exports if e.source in names]
    delivered = f" and delivers {', '.join(e.name for e in exports)}" if exports else ""

    @dg.sensor(
        name=f"{component.name}_pipeline",
        minimum_interval_seconds=settings.sensor_interval_seconds,
        target=[dg.AssetKey(s.name) for s in component.specs] + [dg.AssetKey(e.name) for e in exports],
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Watches the Delta versions of {', '.join(f'`{t}`' for t in component.tables)} and requests one "
                    f"run that brings every dirty partition of {', '.join(s.name for s in component.specs)} up to "
                    f"date in graph order{delivered}; waits while a run of this part is in progress.",
    )
    def _sensor(context: dg.SensorEvaluationContext, laminar: LaminarResource):
        def in_progress() -> Sequence[str]:
            return context.instance.get_run_ids(dg.RunsFilter(tags={COMPONENT_TAG: component.name}, statuses=ACTIVE),
                                                limit=1)

        watch = settings.sensor_watch_seconds if WATCHING.get() else 0
        deadline = time.monotonic() + watch
        active = in_progress()
        if active:  # a run whose process was killed would hold the part forever: fail such runs, look again
            for note in fail_dead_runs(context.instance):
                context.log.warning(note)
            active = in_progress()
        while active and time.monotonic() + RUN_POLL_SECONDS < deadline:  # the run may end while this tick watches
            time.sleep(RUN_POLL_SECONDS)
            active = in_progress()
        if active:
            return dg.SkipReason(f"run {active[0]} of {component.name} is in progress; the next tick covers "
                                 "what lands meanwhile")
        result = _requests(context, laminar)
        left = deadline - time.monotonic()
        if isinstance(result, dg.SkipReason) and left > 0:
            seen = parse_cursor(context.cursor).versions
            if not watch_for_commits(laminar.resolved_root(), component.external, seen, seconds=left,
                                     poll_seconds=settings.sensor_poll_seconds):
                return dg.SkipReason(f"{result.skip_message} (watched for {watch:g} s)")
            result = _requests(context, laminar)  # a commit landed while this tick watched: request it now
        return result

    def _requests(context: dg.SensorEvaluationContext, laminar: LaminarResource) -> dg.SensorResult | dg.SkipReason:
        """The tick's run requests and cursor for the tables' current versions, with the partitions of failed runs
        whose pause ended (resume.py); a skip when nothing changed."""
        cursor = parse_cursor(context.cursor)
        now = resume.now()
        seen = resume.Failures.parse(json.loads(context.cursor).get("failures") if context.cursor else None, now=now)
        failed = resume.failed_runs(context.instance, component.name, seen, first=settings.resume_seconds,
                                    longest=settings.resume_max_seconds)
        due, seen = resume.advance(seen, failed, now)
        plan = plan_tick(component, laminar.resolved_root(), laminar.checkpoints(), cursor,
                         lambda producer, keys: failed_check_partitions(context.instance, producer, keys), blocking,
                         settings)
        for note in plan.notes:
            context.log.info(note)
        by_spec = {s: list(plan.dirty.get(s.name, ())) for s in component.specs}
        again = _resumed_partitions(due)
        for spec in component.specs:
            by_spec[spec] = sorted(set(by_spec[spec]) | set(again.get(spec.name, ())))
        for name, (keys, start) in outside_partitions(by_spec, settings).items():
            context.log.warning(outside_message(name, keys, start))
        # the run key names each table's id too: a lake rebuilt at the same path reaches the same
        # versions again, and Dagster skips a run whose key one of the sensor's runs already had
        span = ",".join(f"{t}:{plan.cursor.ids.get(t, '')[:8]}={_or_dash(cursor.since(t, v, plan.cursor.ids.get(t)))}..{v}"
                        for t, v in sorted(plan.cursor.versions.items()))
        # each export runs with its source's dirty partitions; one behind its source with nothing dirty to carry
        # it (never delivered, or its source materialized alone) runs with its source's latest partition, once
        # per version of that source (the run key names it)
        with_source = {e.name: (names[e.source], sorted(set(by_spec[names[e.source]]) | set(again.get(e.name, ()))))
                       for e in exports if by_spec[names[e.source]] or again.get(e.name)}
        pending = pending_exports(laminar.resolved_root(), [e for e in exports if e.name not in with_source],
                                  component.specs, laminar.checkpoints())
        span += "".join(f"+{name}@{version}" for name, (version, _) in sorted(pending.items()))
        for e in exports:
            if e.name in pending:
                with_source[e.name] = (names[e.source], [pending[e.name][1]])
        span += "".join(f"+again:{r.run_id}" for r in due)
        tags = {COMPONENT_TAG: component.name, **(max(due, key=lambda r: r.attempt).resume_tags() if due else {})}
        for run in due:
            context.log.info(f"runs the partitions of failed run {run.run_id} again (attempt {run.attempt}): {run.why}")
        requests = range_requests(by_spec, settings, run_key=f"{component.name}@{span}", tags=tags, checks=checks,
                                  exports=with_source)
        new_cursor = format_cursor(plan.cursor, failures=seen)
        # a tick that only moves the cursor (the part's own run wrote the stage's table, a commit changed no
        # partition that was not up to date, a failed run was found not to run again) says so, instead of
        # Dagster's "empty result"
        moved = [f"{t} {_or_dash(cursor.since(t, v, plan.cursor.ids.get(t)))}..{v}"
                 for t, v in sorted(plan.cursor.versions.items())
                 if cursor.since(t, v, plan.cursor.ids.get(t)) != v] if not requests else []
        skip = None if requests else \
            f"nothing to run for the new versions ({', '.join(moved)}): every partition they touch is up to date" \
            if moved else f"no new versions of {', '.join(component.tables)}{_after_failure(context.instance, failed, now)}"
        if skip and not moved and new_cursor == (context.cursor or ""):
            return dg.SkipReason(skip)
        return dg.SensorResult(run_requests=requests, cursor=new_cursor, skip_reason=skip,
                               asset_events=source_observations(component, cursor, plan.cursor))

    def _after_failure(instance: dg.DagsterInstance, failed: list[resume.FailedRun], now: float) -> str:
        """What a skip says about the part's failed runs: when those whose pause has not ended run again, or, when
        none waits and the last run did not succeed, that its partitions wait for a new commit that touches them
        (docs/known-limits.md), which "no new versions" alone hides."""
        waiting = [r for r in failed if r.retryable and now < r.due < inf]
        if waiting:
            return resume.waiting_message(component.name, waiting, now)
        records = instance.get_run_records(dg.RunsFilter(tags={COMPONENT_TAG: component.name}), limit=1)
        if not records or records[0].dagster_run.status not in (dg.DagsterRunStatus.FAILURE,
                                                                dg.DagsterRunStatus.CANCELED):
            return ""
        run = records[0].dagster_run
        about = resume.failed_run(instance, records[0], first=0, longest=settings.resume_max_seconds) \
            if run.status is dg.DagsterRunStatus.FAILURE else None
        return resume.after_failure_message(component.name, run.run_id, run.status.value, about,
                                            resume_off=settings.resume_seconds == 0)

    def _resumed_partitions(due: list[resume.FailedRun]) -> dict[str, set[str]]:
        """Asset name -> the partitions the failed runs `due` ran, for the assets of this part."""
        out: dict[str, set[str]] = {}
        for run in due:
            for name in run.assets:
                spec = names.get(name) or next((names[e.source] for e in exports if e.name == name), None)
                if spec is None:  # an asset no longer in this part
                    continue
                pdef = partitions_def(spec, settings)
                tags = run.partition_tags
                if resume.PARTITION_TAG in tags:
                    out.setdefault(name, set()).add(tags[resume.PARTITION_TAG])
                elif resume.RANGE_START in tags and resume.RANGE_END in tags:
                    out.setdefault(name, set()).update(pdef.get_partition_keys_in_range(
                        dg.PartitionKeyRange(tags[resume.RANGE_START], tags[resume.RANGE_END])))
        return out

    return _sensor


def _or_dash(version: int | None) -> str:
    return "-" if version is None else str(version)


def source_observations(component: Component, before: Cursor, now: Cursor) -> list[dg.AssetObservation]:
    """An observation of each source table whose Delta version moved since the last tick (or that was
    recreated), so the UI shows the sources' versions (their data version) without an observation run."""
    return [dg.AssetObservation(asset_key=table, metadata={"delta_version": now.versions[table]},
                                tags={DATA_VERSION_TAG: str(now.versions[table])})
            for table in component.external
            if table in now.versions and before.since(table, now.versions[table], now.ids.get(table)) != now.versions[table]]


def build_pipeline_sensors(specs: list[Spec], settings: LaminarSettings, *, blocking: set[str],
                           contracts: set[str], exports: list[ExportSpec] | tuple = ()) -> list[dg.SensorDefinition]:
    return [build_pipeline_sensor(c, settings, blocking=blocking, contracts=contracts, exports=exports)
            for c in components(specs)]


def build_stale_sensor(specs: list[Spec], settings: LaminarSettings) -> dg.SensorDefinition:
    @dg.sensor(
        name="stale_partitions",
        minimum_interval_seconds=max(60, settings.sensor_interval_seconds),
        target=[dg.AssetKey(s.name) for s in specs],
        default_status=dg.DefaultSensorStatus.STOPPED,
        description="Finds materialized partitions whose watermark is behind a source version that touched "
                    "them (or whose last attempt failed) and launches runs for them: catch-up after an outage.",
    )
    def _sensor(context: dg.SensorEvaluationContext, laminar: LaminarResource):
        return dg.SensorResult(run_requests=stale_requests(specs, settings, laminar))

    return _sensor


def stale_requests(specs: list[Spec], settings: LaminarSettings, laminar: LaminarResource) -> list[dg.RunRequest]:
    """One range run per stale spec (a spec's partitions are independent of another's staleness)."""
    root = laminar.resolved_root()
    store = laminar.checkpoints()
    part_of = {s.name: c.name for c in components(specs) for s in c.specs}
    requests = []
    for spec in specs:
        stale = []
        for key in store.partitions(spec.name):
            try:
                mark, plan = inspect_partition(root, spec, key, store)
            except LaminarError:
                continue
            if is_stale(mark, plan):
                stale.append((key, mark))
        if stale:
            fingerprint = "-".join(f"{m.seq}" for _, m in stale)
            requests += range_requests({spec: [k for k, _ in stale]}, settings,
                                       run_key=f"stale@{spec.name}@{fingerprint}",
                                       tags={COMPONENT_TAG: part_of[spec.name]})  # the part's sensor waits
    return requests
