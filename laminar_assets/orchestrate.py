"""Running Dagster run requests in this process: what the sensor daemon would launch,
executed with `materialize` on a real instance (used by the demo and tests)."""

import dagster as dg

from laminar_assets.sensors import RANGE_END, RANGE_START


def execute_request(defs: dg.Definitions, request: dg.RunRequest, instance: dg.DagsterInstance) -> dg.ExecuteInProcessResult:
    """Materialize what one run request asks for: one partition, or a partition range in one run.
    The assets come from `defs` with their resources bound."""
    graph = defs.resolve_asset_graph()
    # Every definition goes in (resources bound), the request's assets and checks are selected: the
    # checks run in the same run, as they do when the daemon launches the request.
    assets = list(graph.assets_defs)
    checks = request.asset_check_keys
    if checks is None:
        checks = [c for c in graph.asset_check_keys if c.asset_key in set(request.asset_selection)]
    selection = dg.AssetSelection.assets(*request.asset_selection).without_checks() | \
        dg.AssetSelection.checks(*checks)
    kwargs = {"selection": selection}
    tags = dict(request.tags)
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
