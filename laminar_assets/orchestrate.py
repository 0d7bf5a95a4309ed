"""Running Dagster run requests in this process: what the sensor daemon would launch,
executed with `materialize` on a real instance (used by the demo and tests)."""

import dagster as dg

from laminar_assets.sensors import RANGE_END, RANGE_START


def execute_request(defs: dg.Definitions, request: dg.RunRequest, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """Materialize what one run request asks for: one partition, or a partition range in one run.
    The assets come from `defs` with their resources bound."""
    graph = defs.resolve_asset_graph()
    assets = [graph.assets_def_for_key(k) for k in request.asset_selection]
    tags = dict(request.tags)
    kwargs = {}
    if request.partition_key is not None:
        kwargs["partition_key"] = request.partition_key
    elif RANGE_START not in tags or RANGE_END not in tags:
        raise ValueError(f"run request {request.run_key} names neither a partition nor a range")
    # Events still go to the instance (and the UI); only the console echo is quiet.
    quiet = {"loggers": {"console": {"config": {"log_level": "WARNING"}}}}
    return dg.materialize(assets, instance=instance, tags=tags, raise_on_error=False, run_config=quiet, **kwargs)


def evaluate_sensor(defs: dg.Definitions, name: str, instance: dg.DagsterInstance, cursor: str | None,
                    resources: dict | None = None):
    """One tick of a sensor, exactly as the daemon evaluates it."""
    sensor = defs.resolve_sensor_def(name)
    with dg.build_sensor_context(instance=instance, cursor=cursor, resources=resources or dict(defs.resources),
                                 definitions=defs) as ctx:
        return sensor(ctx)
