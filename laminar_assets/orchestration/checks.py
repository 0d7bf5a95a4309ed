"""Asset checks: how far each flow's watermarks are behind their sources."""


import dagster as dg
import pyarrow as pa

from laminar_assets.contracts import Contract
from laminar_assets.engine import FlowSpec, LaminarError, Spec, partition_key_column
from laminar_assets.engine.report import inspect_partition, is_stale, lag
from laminar_assets.orchestration.assets import partitions_def
from laminar_assets.orchestration.check_partitions import evaluate_range
from laminar_assets.pipeline.settings import LaminarSettings
from laminar_assets.resources import LaminarResource


def build_lag_check(spec: Spec) -> dg.AssetChecksDefinition:
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
            if mark is not None and is_stale(mark, plan):  # is_stale: never without a watermark
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


def contract_outcome(engine, spec: Spec, contract: Contract, partition: str) -> tuple[bool, dict]:
    """Run the contract's Great Expectations suite on one partition of the spec's output."""
    return contract_outcomes(engine, spec, contract, [partition])[partition]


def _suffix(partition: str) -> str:
    return partition.replace(":", "").replace("-", "")


def _contract_metadata(partition: str, contract: Contract, summary, fetched_by: str) -> dict:
    return {
        "partition": partition,
        "expectations_evaluated": summary.evaluated,
        "expectations_failed": len(summary.failures),
        "rows_checked": summary.rows if summary.rows is not None else -1,
        "ge_engine": summary.engine,
        "rows_fetched_by": fetched_by,
        "unexpected_rows": sum(f.unexpected_count or 0 for f in summary.failures),
        "failures": dg.MetadataValue.json([f.__dict__ for f in summary.failures]),
        "contract": contract.path,
    }


PARTITION_COLUMN = "__laminar_partition"


def _per_row(contract: Contract) -> bool:
    """Rules that pass on a union of partitions exactly when they pass on each (not a row count)."""
    return not any(r.expect == "row_count_between" for r in contract.rules())


def _together(keys: list[str], contract: Contract, *, engine: str, fetched_by: str,
              rows: dict[str, int] | None = None) -> dict:
    """Every partition passed, validated in one suite run over their union."""
    return {k: (True, {"partition": k, "validated_together_with": len(keys) - 1,
                       "expectations_evaluated": len(contract.rules()), "expectations_failed": 0,
                       **({"rows_checked": rows[k]} if rows is not None else {}),
                       "ge_engine": engine, "rows_fetched_by": fetched_by, "contract": contract.path}) for k in keys}


def broken_tables(engine, spec: Spec, keys: list[str]) -> dict | None:
    """Failed outcomes for every partition when a table Laminar writes for the spec names a missing file
    (`Engine.integrity`): no reader should be the first to find it. None when every table is whole."""
    broken = [t for t in engine.integrity(spec) if not t.ok]
    if not broken:
        return None
    md = {"broken_tables": dg.MetadataValue.json([t.to_json() for t in broken]),
          "integrity": "; ".join(t.describe() for t in broken)}
    return {k: (False, {"partition": k, **md}) for k in keys}


def contract_outcomes(engine, spec: Spec, contract: Contract, keys: list[str]) -> dict:
    """Outcomes per partition (all failed when a table the spec writes names a missing file).

    For row-level rules and uniqueness, passing on the union of the
    partitions means passing on each, so they are validated together first (one suite run on the
    critical path when the check is blocking); a failure, or a row-count rule, validates each
    partition's rows, so a failure is pinned to its partitions.

    The rows come to the driver without a Spark job when the driver can read the sink's files
    itself (`Engine.sink_tables`: small, local, no deletion vectors), else from one Spark job;
    rows too many for the driver are validated by GE's Spark engine."""
    from laminar_assets.contracts.expectations import LOCAL_ROWS, validate_local
    from laminar_assets.engine.report import to_pandas

    broken = broken_tables(engine, spec, keys)
    if broken is not None:
        return broken
    tables = engine.sink_tables(spec, keys)
    if tables is None or sum(t.num_rows for t in tables.values()) > LOCAL_ROWS:
        return _spark_outcomes(engine, spec, contract, keys)
    if len(keys) > 1 and _per_row(contract):
        together = validate_local(to_pandas(pa.concat_tables(list(tables.values()))), contract, name="range")
        if together.success:
            return _together(keys, contract, engine=together.engine, fetched_by="driver",
                             rows={k: t.num_rows for k, t in tables.items()})
    out = {}
    for k in keys:
        summary = validate_local(to_pandas(tables[k]), contract, name=_suffix(k))
        out[k] = (summary.success, _contract_metadata(k, contract, summary, "driver"))
    return out


def _spark_outcomes(engine, spec: Spec, contract: Contract, keys: list[str]) -> dict:
    """`contract_outcomes` with the rows fetched by one Spark job (tagged with their partition), or
    validated where they are when there are too many for the driver."""
    from laminar_assets.contracts.expectations import fetch_local, local_slice, validate, validate_local

    column = spec.output_time_column
    sink = engine.sink_frames(spec, keys)
    local = fetch_local(sink.withColumn(PARTITION_COLUMN, partition_key_column(column, spec.granularity)))
    if local is None:  # too many rows for the driver: GE's Spark engine, the union first
        if len(keys) > 1 and _per_row(contract) and validate(sink, contract, name="range", local_rows=0).success:
            return _together(keys, contract, engine="spark", fetched_by="spark")
        out = {}
        for k in keys:
            summary = validate(engine.sink_frame(spec, k), contract, name=_suffix(k), local_rows=0)
            out[k] = (summary.success, _contract_metadata(k, contract, summary, "spark"))
        return out
    rows = local.drop(columns=[PARTITION_COLUMN])
    if len(keys) > 1 and _per_row(contract):
        together = validate_local(rows, contract, name="range")
        if together.success:
            return _together(keys, contract, engine=together.engine, fetched_by="spark",
                             rows={k: int((local[PARTITION_COLUMN] == k).sum()) for k in keys})
    out = {}
    for k in keys:
        summary = validate_local(local_slice(rows, local[PARTITION_COLUMN] == k, sink.schema), contract, name=_suffix(k))
        out[k] = (summary.success, _contract_metadata(k, contract, summary, "spark"))
    return out


def contract_severity(contract: Contract) -> dg.AssetCheckSeverity:
    return dg.AssetCheckSeverity.ERROR if contract.blocking else dg.AssetCheckSeverity.WARN


def contract_result(engine, spec: Spec, contract: Contract, partition: str) -> dg.AssetCheckResult:
    passed, metadata = contract_outcome(engine, spec, contract, partition)
    return dg.AssetCheckResult(passed=passed, severity=contract_severity(contract), metadata=metadata)


def build_contract_check(spec: Spec, contract: Contract, settings: LaminarSettings) -> dg.AssetChecksDefinition:
    @dg.asset_check(asset=dg.AssetKey(spec.name), name="contract", blocking=contract.blocking,
                    partitions_def=partitions_def(spec, settings),
                    description=f"Great Expectations suite from {contract.path or 'data_contracts/'} on each "
                                "partition the run changed.")
    def _check(context: dg.AssetCheckExecutionContext, laminar: LaminarResource) -> dg.AssetCheckResult:
        engine = laminar.engine(**settings.engine_options())
        return evaluate_range(context, dg.AssetKey(spec.name),
                              lambda keys: contract_outcomes(engine, spec, contract, keys),
                              severity=contract_severity(contract), blocking=contract.blocking)

    return _check


def equivalence_outcome(engine, spec: FlowSpec, partition: str, sample: int = 8) -> tuple[bool, dict]:
    return equivalence_outcomes(engine, spec, [partition], sample)[partition]


def equivalence_outcomes(engine, spec: FlowSpec, partitions: list[str], sample: int = 8) -> dict[str, tuple[bool, dict]]:
    """Outcomes per partition, from one recompute and one comparison for all of them (all failed when
    a table the spec writes names a missing file)."""
    from laminar_assets.engine.report import check_equivalence_many

    broken = broken_tables(engine, spec, partitions)
    if broken is not None:
        return broken
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
        engine = laminar.engine(**settings.engine_options())
        return evaluate_range(context, dg.AssetKey(spec.name),
                              lambda keys: equivalence_outcomes(engine, spec, keys),
                              severity=dg.AssetCheckSeverity.ERROR, blocking=False)

    return _check
