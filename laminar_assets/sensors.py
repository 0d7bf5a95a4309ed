"""Sensors: Delta versions stand in for sequence numbers.

One sensor per Delta table that specs read (sources and stage outputs). Its
cursor is the last Delta version it saw; new commits become run requests for
the partitions their file statistics touch, for the specs reading that table.
A stage's output table has its own sensor, so downstream flows run after the
stage has committed the new version (graph order).
"""


import json

import dagster as dg
from dagster._core.storage.asset_check_execution_record import AssetCheckExecutionRecordStatus
from deltalake import DeltaTable

from laminar_assets.assets import PARTITION_TAG, partitions_def
from laminar_assets.engine import FlowSpec, LaminarError, StageSpec
from laminar_assets.engine.delta_source import resolve_uri
from laminar_assets.engine.inspect import dirty_partitions, inspect_partition, is_stale, new_commits
from laminar_assets.engine.windows import partition_interval, partitions_overlapping
from laminar_assets.resources import LaminarResource
from laminar_assets.settings import LaminarSettings

Spec = FlowSpec | StageSpec
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"


def consumers_by_table(specs: list[Spec]) -> dict[str, list[Spec]]:
    """Which specs read each table (main sources only: dimensions refill via DIMENSION_CHANGED)."""
    out: dict[str, list[Spec]] = {}
    for spec in specs:
        for src in spec.sources:
            out.setdefault(src, []).append(spec)
        if isinstance(spec, StageSpec):
            for dim in spec.dimension_tables:
                out.setdefault(dim, []).append(spec)
    return out


def partition_requests(spec: Spec, keys: list[str], settings: LaminarSettings, *, run_key_prefix: str,
                       tags: dict[str, str] | None = None) -> list[dg.RunRequest]:
    """One run per partition, or, when there are more than `backfill_threshold`, one range run per
    stretch of consecutive partitions (a range never spans a partition that was left out, e.g. held)."""
    pdef = partitions_def(spec, settings)
    order = {k: i for i, k in enumerate(pdef.get_partition_keys())}
    keys = sorted((k for k in keys if k in order), key=order.__getitem__)
    if not keys:
        return []
    asset = [dg.AssetKey(spec.name)]
    if len(keys) > settings.backfill_threshold:
        stretches: list[list[str]] = []
        for k in keys:
            if stretches and order[k] == order[stretches[-1][-1]] + 1:
                stretches[-1].append(k)
            else:
                stretches.append([k])
        return [dg.RunRequest(
            run_key=f"{run_key_prefix}:{spec.name}:{s[0]}...{s[-1]}", asset_selection=asset,
            tags={**(tags or {}), RANGE_START: s[0], RANGE_END: s[-1], "laminar/dirty_partitions": str(len(s))},
        ) for s in stretches]
    return [dg.RunRequest(
        run_key=f"{run_key_prefix}:{spec.name}:{k}", asset_selection=asset, partition_key=k,
        tags={**(tags or {}), PARTITION_TAG: f"{spec.name}/{k}"},
    ) for k in keys]


def parse_cursor(text: str | None) -> tuple[int | None, dict[str, list[str]]]:
    """(last Delta version seen, partitions held back per consumer by a failed upstream check)."""
    if not text:
        return None, {}
    if text.lstrip("-").isdigit():
        return int(text), {}
    data = json.loads(text)
    return data.get("version"), {k: list(v) for k, v in (data.get("held") or {}).items()}


def format_cursor(version: int | None, held: dict[str, list[str]]) -> str:
    held = {k: sorted(v) for k, v in held.items() if v}
    return str(version) if not held else json.dumps({"version": version, "held": held}, sort_keys=True)


def failed_check_partitions(instance: dg.DagsterInstance, producer: Spec, keys: set[str]) -> set[str]:
    """Partitions of `producer` not cleared by their blocking `contract` check: the latest evaluation
    failed, is still running (planned), or checked an older materialization than the latest.
    A partition the check never ran on is not held (there is nothing to gate on)."""
    if not keys:
        return set()
    check = dg.AssetCheckKey(dg.AssetKey(producer.name), "contract")
    infos = instance.event_log_storage.get_asset_check_partition_info([check], partition_keys=sorted(keys))
    return {i.partition_key for i in infos
            if i.latest_execution_status is not AssetCheckExecutionRecordStatus.SUCCEEDED or not i.is_current}


def split_blocked(instance: dg.DagsterInstance, producer: Spec | None, consumer: Spec,
                  keys: list[str]) -> tuple[list[str], list[str]]:
    """(keys to run, keys held back) — held when an upstream partition they read failed its blocking check."""
    if producer is None or not keys:
        return keys, []
    def reads(key: str):  # the event range a consumer partition reads (hopping windows reach past it)
        part = partition_interval(key, consumer.granularity)
        return consumer.shape.events_of_starts(part) if isinstance(consumer, FlowSpec) else part

    upstream = {k: set(partitions_overlapping(reads(k), producer.granularity)) for k in keys}
    failed = failed_check_partitions(instance, producer, set().union(*upstream.values()))
    held = [k for k in keys if upstream[k] & failed]
    return [k for k in keys if k not in held], held


def build_version_sensor(table: str, consumers: list[Spec], settings: LaminarSettings,
                         blocking_producer: Spec | None = None) -> dg.SensorDefinition:
    """`blocking_producer`: the spec writing `table` when its contract check is blocking; consumer
    partitions reading a partition that failed that check are held (kept in the cursor) until it passes."""
    dims_only = [s for s in consumers if isinstance(s, StageSpec) and table in s.dimension_tables]

    @dg.sensor(
        name=f"{table}_versions",
        minimum_interval_seconds=settings.sensor_interval_seconds,
        target=[dg.AssetKey(s.name) for s in consumers],
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Watches Delta table `{table}`; requests runs for the partitions new commits touch"
                    + (f", holding back those whose upstream `{blocking_producer.name}` partition failed its "
                       "blocking contract check." if blocking_producer else "."),
    )
    def _sensor(context: dg.SensorEvaluationContext, laminar: LaminarResource):
        root = laminar.resolved_root()
        uri = resolve_uri(root, table)
        if not DeltaTable.is_deltatable(uri):
            return dg.SkipReason(f"no Delta table at {uri} yet")
        after, held = parse_cursor(context.cursor)
        # One version per tick for every consumer: a commit landing mid-tick waits for the next
        # tick instead of being skipped for the consumers evaluated before it.
        upto = DeltaTable(uri).version()
        requests: list[dg.RunRequest] = []
        latest = None
        new_held: dict[str, list[str]] = {}
        for spec in consumers:
            keys: list[str] = []
            if spec in dims_only:
                # A dimension change refills every materialized partition of the stage.
                latest_dim = upto
                if after is not None and latest_dim > after:
                    keys = laminar.checkpoints().partitions(spec.name)
                latest = latest_dim
            else:
                try:
                    changes = new_commits(root, table, spec.event_time, after, upto)
                except LaminarError as exc:
                    return dg.SkipReason(f"cannot read {table}: {exc.message}")
                if changes is not None:
                    latest = changes.to_version
                    keys = dirty_partitions(spec, changes)
                    if changes.unknown_range:
                        keys = sorted(set(keys) | set(laminar.checkpoints().partitions(spec.name)))
            keys = sorted(set(keys) | set(held.get(spec.name, [])))
            run, blocked = split_blocked(context.instance, blocking_producer, spec, keys)
            if blocked:
                new_held[spec.name] = blocked
                context.log.info(f"{spec.name}: holding {len(blocked)} partition(s) whose upstream "
                                 f"{blocking_producer.name} contract check failed: {', '.join(blocked[:5])}")
            requests += partition_requests(spec, run, settings,
                                           run_key_prefix=f"{table}@{after}..{latest if latest is not None else after}")
        version = latest if latest is not None and (after is None or latest > after) else after
        if not requests and version == after and new_held == held:
            return dg.SkipReason(f"no new versions of {table} after {after}")
        return dg.SensorResult(run_requests=requests, cursor=format_cursor(version, new_held))

    return _sensor


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
    root = laminar.resolved_root()
    store = laminar.checkpoints()
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
            requests += partition_requests(spec, [k for k, _ in stale], settings,
                                           run_key_prefix=f"stale@{fingerprint}")
    return requests
