"""Asset checks: how far each flow's watermarks are behind their sources."""


import dagster as dg

from laminar_assets.engine import FlowSpec, LaminarError, StageSpec
from laminar_assets.engine.inspect import inspect_partition, is_stale, lag
from laminar_assets.resources import LaminarResource


def build_lag_check(spec: FlowSpec | StageSpec) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=dg.AssetKey(spec.name), name="watermark_lag", blocking=False,
                    description="Passes when no materialized partition is behind a source version that touched it.")
    def _check(laminar: LaminarResource) -> dg.AssetCheckResult:
        root = laminar.resolved_root()
        store = laminar.checkpoints()
        stale, versions_behind, seconds_behind, partitions = [], 0, 0.0, 0
        for key in store.partitions(spec.name):
            partitions += 1
            try:
                mark, plan = inspect_partition(root, spec, key, store)
            except LaminarError as exc:
                stale.append(f"{key} ({exc.message})")
                continue
            if is_stale(mark, plan):
                stale.append(f"{key} ({plan.reason.value})")
                v, s = lag(root, spec, mark)
                versions_behind, seconds_behind = max(versions_behind, v), max(seconds_behind, s)
        return dg.AssetCheckResult(
            passed=not stale,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={
                "partitions_checked": partitions,
                "stale_partitions": len(stale),
                "max_versions_behind": versions_behind,
                "max_seconds_behind": float(seconds_behind),
                "stale": dg.MetadataValue.json(stale[:50]),
            },
        )

    return _check
