"""Partitioned asset checks in a range run: one evaluation per partition, so consumers can be held
per partition.

Dagster attributes a check's result to a partition only in a single-partition run; in a range run it
records one unpartitioned evaluation and leaves every partition "planned". Laminar's sensor runs are
range runs, so a check evaluates each partition itself and logs one `AssetCheckEvaluation` per
partition, aimed at that partition's materialization from this run. Partitions this run left
unchanged (NOOP) keep their previous outcome instead of being validated again.
"""

from __future__ import annotations

from collections.abc import Callable

import dagster as dg
from dagster import AssetCheckEvaluation

from laminar_assets.orchestration.internals.private_names import (
    AssetCheckEvaluationTargetMaterializationData,
    AssetCheckExecutionRecordStatus,
)

# partitions -> {partition: (passed, metadata)}
Evaluate = Callable[[list[str]], dict[str, tuple[bool, dict]]]
CHANGED_KEY = "changed_partitions"  # range-run metadata: {partition: "MODE (REASON)"} of non-NOOP partitions


def run_partitions(context: dg.AssetCheckExecutionContext) -> list[str]:
    """The partitions of the check's run: one key, or every key of the range."""
    op = context.op_execution_context
    return list(op.partition_keys) if op.has_partition_key_range else [op.partition_key]


def _latest_materializations(instance: dg.DagsterInstance, asset: dg.AssetKey, keys: list[str]) -> dict:
    records = instance.fetch_materializations(dg.AssetRecordsFilter(asset_key=asset, asset_partitions=keys),
                                              limit=len(keys)).records
    latest: dict = {}
    for record in records:  # newest first
        latest.setdefault(record.partition_key, record)
    return latest


def _changed(record) -> bool:
    md = record.asset_materialization.metadata if record else {}
    if "mode" in md:
        return md["mode"].value != "NOOP"
    changed = md.get(CHANGED_KEY)
    return changed is None or record.partition_key in (changed.value or {})


def evaluate_range(context: dg.AssetCheckExecutionContext, asset: dg.AssetKey, evaluate: Evaluate, *,
                   severity: dg.AssetCheckSeverity, blocking: bool) -> dg.AssetCheckResult:
    """Evaluate the run's partitions; log one evaluation per partition in a range run."""
    keys = run_partitions(context)
    if not context.op_execution_context.has_partition_key_range:
        passed, metadata = evaluate(keys)[keys[0]]
        return dg.AssetCheckResult(passed=passed, severity=severity, metadata=metadata)
    latest = _latest_materializations(context.instance, asset, keys)
    check = dg.AssetCheckKey(asset, context.check_specs[0].name)
    previous = {i.partition_key: i for i in context.instance.event_log_storage.get_asset_check_partition_info(
        [check], partition_keys=keys)}
    outcomes: dict[str, tuple[bool, dict]] = {}
    fresh = []
    for key in keys:
        before = previous.get(key)
        done = before is not None and before.latest_execution_status in (
            AssetCheckExecutionRecordStatus.SUCCEEDED, AssetCheckExecutionRecordStatus.FAILED)
        if latest.get(key) is not None and not _changed(latest[key]) and done:
            assert before is not None  # `done` says so
            passed = before.latest_execution_status is AssetCheckExecutionRecordStatus.SUCCEEDED
            outcomes[key] = (passed, {"partition": key, "note": "partition unchanged by this run; outcome kept"})
        else:
            fresh.append(key)
    if fresh:
        outcomes.update(evaluate(fresh))
    for key in keys:
        record = latest.get(key)
        target = None if record is None else AssetCheckEvaluationTargetMaterializationData(
            storage_id=record.storage_id, run_id=record.run_id, timestamp=record.timestamp)
        passed, metadata = outcomes[key]
        # dagster's log_event has a branch for an AssetCheckEvaluation, but its parameter's type (UserEvent) leaves it out
        context.op_execution_context.log_event(AssetCheckEvaluation(  # type: ignore[arg-type]
            asset_key=asset, check_name=check.name, passed=passed, metadata=metadata,
            target_materialization_data=target, severity=severity, blocking=blocking, partition=key))
    failed = sorted(k for k, (ok, _) in outcomes.items() if not ok)
    return dg.AssetCheckResult(passed=not failed, severity=severity, metadata={
        "partitions_checked": len(keys), "partitions_validated": len(fresh), "partitions_failed": len(failed),
        "failed_partitions": dg.MetadataValue.json(failed[:50])})
