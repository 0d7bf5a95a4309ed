"""Asset checks: how far each flow's watermarks are behind their sources."""


import dagster as dg

from laminar_assets.assets import partitions_def
from laminar_assets.check_partitions import evaluate_range
from laminar_assets.contracts import Contract
from laminar_assets.engine import FlowSpec, LaminarError, StageSpec
from laminar_assets.engine.inspect import inspect_partition, is_stale, lag
from laminar_assets.engine.windows import partition_key_column
from laminar_assets.resources import LaminarResource
from laminar_assets.settings import LaminarSettings


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


def contract_outcome(engine, spec: FlowSpec | StageSpec, contract: Contract, partition: str) -> tuple[bool, dict]:
    """Run the contract's Great Expectations suite on one partition of the spec's output."""
    from laminar_assets.contracts.expectations import validate

    summary = validate(engine.sink_frame(spec, partition), contract, name=_suffix(partition))
    return summary.success, _contract_metadata(partition, contract, summary)


def _suffix(partition: str) -> str:
    return partition.replace(":", "").replace("-", "")


def _contract_metadata(partition: str, contract: Contract, summary) -> dict:
    return {
        "partition": partition,
        "expectations_evaluated": summary.evaluated,
        "expectations_failed": len(summary.failures),
        "rows_checked": summary.rows if summary.rows is not None else -1,
        "ge_engine": summary.engine,
        "unexpected_rows": sum(f.unexpected_count or 0 for f in summary.failures),
        "failures": dg.MetadataValue.json([f.__dict__ for f in summary.failures]),
        "contract": contract.path,
    }


PARTITION_COLUMN = "__laminar_partition"


def contract_outcomes(engine, spec: FlowSpec | StageSpec, contract: Contract, keys: list[str]) -> dict:
    """Outcomes per partition, from one Spark job when the partitions' rows fit on the driver.

    The rows of all `keys` are fetched once, tagged with their partition. For row-level rules and
    uniqueness, passing on the union means passing on each, so they are validated together first
    (one suite run on the critical path when the check is blocking). A failure, or a row-count rule,
    validates each partition's slice of the fetched rows, so a failure is pinned to its partitions.
    Rows too many for the driver are validated by GE's Spark engine partition by partition."""
    from laminar_assets.contracts.expectations import fetch_local, local_slice, validate, validate_local

    if len(keys) == 1:
        return {keys[0]: contract_outcome(engine, spec, contract, keys[0])}
    column = "window_start" if isinstance(spec, FlowSpec) else spec.event_time
    sink = engine.sink_frames(spec, keys)
    local = fetch_local(sink.withColumn(PARTITION_COLUMN, partition_key_column(column, spec.granularity)))
    per_row = not any(r.expect == "row_count_between" for r in contract.rules())
    if local is None:  # too many rows for the driver: GE's Spark engine, the union first
        if per_row and validate(sink, contract, name="range", local_rows=0).success:
            return {k: (True, {"partition": k, "validated_together_with": len(keys) - 1,
                               "expectations_evaluated": len(contract.rules()), "expectations_failed": 0,
                               "ge_engine": "spark", "contract": contract.path}) for k in keys}
        return {k: contract_outcome(engine, spec, contract, k) for k in keys}
    rows = local.drop(columns=[PARTITION_COLUMN])
    if per_row:
        together = validate_local(rows, contract, name="range")
        if together.success:
            return {k: (True, {"partition": k, "validated_together_with": len(keys) - 1,
                               "expectations_evaluated": together.evaluated, "expectations_failed": 0,
                               "rows_checked": int((local[PARTITION_COLUMN] == k).sum()),
                               "ge_engine": together.engine, "contract": contract.path}) for k in keys}
    out = {}
    for k in keys:
        summary = validate_local(local_slice(rows, local[PARTITION_COLUMN] == k, sink.schema), contract, name=_suffix(k))
        out[k] = (summary.success, _contract_metadata(k, contract, summary))
    return out


def contract_severity(contract: Contract) -> dg.AssetCheckSeverity:
    return dg.AssetCheckSeverity.ERROR if contract.blocking else dg.AssetCheckSeverity.WARN


def contract_result(engine, spec: FlowSpec | StageSpec, contract: Contract, partition: str) -> dg.AssetCheckResult:
    passed, metadata = contract_outcome(engine, spec, contract, partition)
    return dg.AssetCheckResult(passed=passed, severity=contract_severity(contract), metadata=metadata)


def build_contract_check(spec: FlowSpec | StageSpec, contract: Contract, settings: LaminarSettings) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=dg.AssetKey(spec.name), name="contract", blocking=contract.blocking,
                    partitions_def=partitions_def(spec, settings),
                    description=f"Great Expectations suite from {contract.path or 'data_contracts/'} on each "
                                "partition the run changed.")
    def _check(context: dg.AssetCheckExecutionContext, laminar: LaminarResource) -> dg.AssetCheckResult:
        engine = laminar.engine()
        return evaluate_range(context, dg.AssetKey(spec.name),
                              lambda keys: contract_outcomes(engine, spec, contract, keys),
                              severity=contract_severity(contract), blocking=contract.blocking)

    return _check


def equivalence_outcome(engine, spec: FlowSpec, partition: str, sample: int = 8) -> tuple[bool, dict]:
    return equivalence_outcomes(engine, spec, [partition], sample)[partition]


def equivalence_outcomes(engine, spec: FlowSpec, partitions: list[str], sample: int = 8) -> dict[str, tuple[bool, dict]]:
    """Outcomes per partition, from one recompute and one comparison for all of them."""
    from laminar_assets.engine.equivalence import check_equivalence_many

    results = check_equivalence_many(engine, spec, partitions, sample=sample)
    return {p: _equivalence_outcome(p, r) for p, r in results.items()}


def _equivalence_outcome(partition: str, result) -> tuple[bool, dict]:
    if result is None:
        return True, {"partition": partition, "windows_checked": 0, "note": "no watermark yet"}
    return result.passed, {"partition": partition, "windows_checked": result.windows_checked,
                           "mismatches": len(result.mismatches),
                           "mismatched_windows": dg.MetadataValue.json(list(result.mismatches)),
                           "at_versions": dg.MetadataValue.json(result.versions)}


def equivalence_result(engine, spec: FlowSpec, partition: str, sample: int = 8) -> dg.AssetCheckResult:
    passed, metadata = equivalence_outcome(engine, spec, partition, sample)
    return dg.AssetCheckResult(passed=passed, metadata=metadata)


def build_equivalence_check(spec: FlowSpec, settings: LaminarSettings) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=dg.AssetKey(spec.name), name="equivalence", partitions_def=partitions_def(spec, settings),
                    description="Recomputes a sample of each changed partition's windows from the source snapshot "
                                "at the watermark version and compares them with the sink.")
    def _check(context: dg.AssetCheckExecutionContext, laminar: LaminarResource) -> dg.AssetCheckResult:
        engine = laminar.engine()
        return evaluate_range(context, dg.AssetKey(spec.name),
                              lambda keys: equivalence_outcomes(engine, spec, keys),
                              severity=dg.AssetCheckSeverity.ERROR, blocking=False)

    return _check
