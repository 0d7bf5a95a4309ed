"""Exports as Dagster assets: one partitioned asset per export (the partitions of the flow or stage it reads),
downstream of that spec's asset. A thin adapter over the engine's `Exporter` (no Spark session is started).

A materialization delivers every change of the source table since the delivered version (a delivery is of the
whole table: the target holds one delivered version). A run the pipeline sensor, the stale sensor or a schedule
launched (tagged with the component) delivers only that; any other run (a materialization or a backfill asked
for in the UI or with `dagster asset materialize`) also replaces the target's rows of its partitions with the
table's, at the version delivered. `laminar/force_refill=true` replaces every row (FORCED_BY_USER).
"""

import dagster as dg

from laminar_assets.engine import DeliveryResult, ExportSpec, LaminarError, Spec
from laminar_assets.orchestration.assets import COMPONENT_TAG, FORCE_TAG, _failure, partitions_def
from laminar_assets.orchestration.internals.thread_executor import WITHOUT_SPARK_TAG
from laminar_assets.pipeline.settings import LaminarSettings
from laminar_assets.resources import LaminarResource

EXPORT_STEP_PRIORITY = 1
"""The export step's `dagster/priority` (other steps: 0). A run's executor starts the ready steps highest priority
first, and among equals in plan order, where a flow's checks come before its export: with every thread taken by the
flow's contract and equivalence checks (and the next flows), a delivery of a fraction of a second waited for all of
them (11 s into a sensor-launched run, bench/daemon_freshness.py). With it the export takes the first free thread
once its flow's step has committed; the checks run beside or after it. A blocking check of the flow is a dependency
of the export's step (Dagster's), so the export still waits for it, and a failed one still holds that run's
delivery back (the sensor's next tick runs the export alone, as for any export behind its flow: docs/exports.md)."""


def export_pool(export: ExportSpec) -> str:
    return f"laminar_{export.name}"  # deliveries of one export queue behind each other across runs


def delivery_metadata(result: DeliveryResult) -> dict:
    """Metadata of one delivery; numbers stay numbers so the UI plots them (lag, rows, seconds)."""
    md: dict = {
        "mode": result.mode.value,
        "reason": result.reason.value,
        "detail": result.detail,
        "target": result.target,
        "rows_upserted": int(result.rows_upserted),
        "rows_deleted": int(result.rows_deleted),
        "change_rows": int(result.change_rows),
        "partitions_replaced": dg.MetadataValue.json(list(result.partitions_replaced)),
    }
    for key, value in (("delivered_version", result.delivered_version), ("from_version", result.from_version),
                       ("lag_versions", result.lag_versions)):
        if value is not None:
            md[key] = int(value)
    for key, age in (("lag_seconds", result.lag_seconds), ("commit_age_seconds", result.commit_age_seconds)):
        if age is not None:
            md[key] = float(age)
    for stage, seconds in result.seconds.items():
        md[f"seconds_{stage}"] = float(seconds)
    for key, value in result.extra.items():  # a target's own counts: retries, dead letters, ...
        md[key] = value if isinstance(value, (int, float, str)) else dg.MetadataValue.json(value)
    return md


def _static_metadata(export: ExportSpec) -> dict:
    md: dict[str, str | dg.MetadataValue] = {
        "source": export.source, "target": export.target, "connection": export.connection, "export_kind": export.kind,
        **{f"option_{k}": str(v) for k, v in export.options.items()}}
    if export.definition:
        md["defined_in"] = export.origin
        md["sql"] = dg.MetadataValue.md(f"```sql\n{export.definition}\n```")
    return md


def build_export_asset(export: ExportSpec, source: Spec, settings: LaminarSettings) -> dg.AssetsDefinition:
    """The asset of one export, downstream of `source`'s asset, with its partitions."""

    @dg.asset(
        name=export.name,
        partitions_def=partitions_def(source, settings),
        deps=[dg.AssetKey(source.name)],
        description=export.description or f"Delivers `{source.name}` to {export.target}.",
        group_name="exports",
        kinds={export.kind},
        backfill_policy=dg.BackfillPolicy.single_run(),
        metadata=_static_metadata(export),
        code_version=export.export_hash,
        pool=export_pool(export),
        # right after its flow, before the flow's checks; beside the Spark steps, not in one of their threads
        op_tags={"dagster/priority": str(EXPORT_STEP_PRIORITY), WITHOUT_SPARK_TAG: "true"},
        owners=list(export.owners),
        tags=dict(export.tags),
        retry_policy=dg.RetryPolicy(max_retries=settings.retries, delay=settings.retry_delay_seconds,
                                    backoff=dg.Backoff.EXPONENTIAL) if settings.retries else None,
    )
    def _asset(context: dg.AssetExecutionContext, laminar: LaminarResource) -> dg.MaterializeResult:
        keys = list(context.partition_keys)
        launched = COMPONENT_TAG in context.run.tags  # the sensor's (or a schedule's) run: the changes only
        full = context.run.tags.get(FORCE_TAG) == "true"
        try:
            result = laminar.exporter().deliver(export, source, partitions=() if launched else keys, full=full)
        except LaminarError as exc:
            raise _failure(exc, {"export": export.name, "target": export.target},
                           last=context.retry_number >= settings.retries) from None
        context.log.info(f"{export.name}: {result.mode.value} ({result.reason.value}) — {result.detail}; "
                         f"{result.rows_upserted} row(s) upserted, {result.rows_deleted} deleted; delivered version "
                         f"{result.delivered_version}, {result.lag_versions} version(s) behind")
        return dg.MaterializeResult(metadata=delivery_metadata(result))

    return _asset
