"""Sensors: Delta versions stand in for sequence numbers.

One sensor per Delta table that specs read (sources and stage outputs). Its
cursor is the last Delta version it saw; new commits become run requests for
the partitions their file statistics touch, for the specs reading that table.
A stage's output table has its own sensor, so downstream flows run after the
stage has committed the new version (graph order).
"""


import dagster as dg
from deltalake import DeltaTable

from laminar_assets.assets import PARTITION_TAG, partitions_def
from laminar_assets.engine import FlowSpec, LaminarError, StageSpec
from laminar_assets.engine.delta_source import resolve_uri
from laminar_assets.engine.inspect import dirty_partitions, inspect_partition, is_stale, new_commits
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
    """One run per partition, or one range run when there are more than `backfill_threshold`."""
    pdef = partitions_def(spec, settings)
    valid = set(pdef.get_partition_keys())
    keys = sorted(k for k in keys if k in valid)
    if not keys:
        return []
    asset = [dg.AssetKey(spec.name)]
    if len(keys) > settings.backfill_threshold:
        return [dg.RunRequest(
            run_key=f"{run_key_prefix}:{spec.name}:{keys[0]}...{keys[-1]}", asset_selection=asset,
            tags={**(tags or {}), RANGE_START: keys[0], RANGE_END: keys[-1], "laminar/dirty_partitions": str(len(keys))},
        )]
    return [dg.RunRequest(
        run_key=f"{run_key_prefix}:{spec.name}:{k}", asset_selection=asset, partition_key=k,
        tags={**(tags or {}), PARTITION_TAG: f"{spec.name}/{k}"},
    ) for k in keys]


def build_version_sensor(table: str, consumers: list[Spec], settings: LaminarSettings) -> dg.SensorDefinition:
    dims_only = [s for s in consumers if isinstance(s, StageSpec) and table in s.dimension_tables]

    @dg.sensor(
        name=f"{table}_versions",
        minimum_interval_seconds=settings.sensor_interval_seconds,
        target=[dg.AssetKey(s.name) for s in consumers],
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=f"Watches Delta table `{table}`; requests runs for the partitions new commits touch.",
    )
    def _sensor(context: dg.SensorEvaluationContext, laminar: LaminarResource):
        root = laminar.resolved_root()
        uri = resolve_uri(root, table)
        if not DeltaTable.is_deltatable(uri):
            return dg.SkipReason(f"no Delta table at {uri} yet")
        after = int(context.cursor) if context.cursor else None
        requests: list[dg.RunRequest] = []
        latest = None
        for spec in consumers:
            if spec in dims_only:
                # A dimension change refills every materialized partition of the stage.
                latest_dim = DeltaTable(uri).version()
                if after is not None and latest_dim > after:
                    keys = laminar.checkpoints().partitions(spec.name)
                    requests += partition_requests(spec, keys, settings, run_key_prefix=f"{table}@{after}..{latest_dim}")
                latest = latest_dim
                continue
            try:
                changes = new_commits(root, table, spec.event_time, after)
            except LaminarError as exc:
                return dg.SkipReason(f"cannot read {table}: {exc.message}")
            if changes is None:
                continue
            latest = changes.to_version
            keys = dirty_partitions(spec, changes)
            if changes.unknown_range:
                keys = sorted(set(keys) | set(laminar.checkpoints().partitions(spec.name)))
            requests += partition_requests(spec, keys, settings,
                                           run_key_prefix=f"{table}@{after}..{changes.to_version}")
        if latest is None or (after is not None and latest <= after):
            return dg.SkipReason(f"no new versions of {table} after {after}")
        return dg.SensorResult(run_requests=requests, cursor=str(latest))

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
