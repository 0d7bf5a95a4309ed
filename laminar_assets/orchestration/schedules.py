"""Cron schedules that materialize a flow's current partition (incremental), from `[tool.laminar.schedules]`."""


import dagster as dg

from laminar_assets.engine import Spec, partition_key
from laminar_assets.orchestration.assets import COMPONENT_TAG, PARTITION_TAG
from laminar_assets.orchestration.internals.private_names import UnresolvedAssetJobDefinition
from laminar_assets.pipeline.settings import LaminarSettings


def build_schedule(spec: Spec, cron: str, settings: LaminarSettings,
                   component: str) -> tuple[UnresolvedAssetJobDefinition, dg.ScheduleDefinition]:
    # partitioned like its asset (Dagster infers it from the selection)
    job = dg.define_asset_job(f"{spec.name}_latest", selection=[dg.AssetKey(spec.name)])

    @dg.schedule(name=f"{spec.name}_schedule", cron_schedule=cron, job=job, execution_timezone="UTC",
                 default_status=dg.DefaultScheduleStatus.STOPPED,
                 description=f"Brings the current partition of `{spec.name}` up to date ({cron}).")
    def _schedule(context: dg.ScheduleEvaluationContext):
        key = partition_key(context.scheduled_execution_time, spec.granularity)
        return dg.RunRequest(run_key=f"{spec.name}:{key}:{context.scheduled_execution_time.isoformat()}",
                             partition_key=key, tags={PARTITION_TAG: f"{spec.name}/{key}", COMPONENT_TAG: component})

    return job, _schedule
