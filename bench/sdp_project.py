"""The Spark Declarative Pipelines project the SDP peer runs (see bench/sdp_peer.py): one
`CREATE MATERIALIZED VIEW` per flow, generated from its FlowSpec, and the project's settings."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from laminar_assets.engine import FlowSpec


def _agg_sql(agg, event_time: str) -> str:
    """One Agg as Spark SQL, with the semantics of `variants._reference_agg`."""
    c = f"`{agg.column}`" if agg.column else None
    if agg.kind == "count":
        return "count(1)" if c is None else f"count({c})"
    if agg.kind in ("sum", "avg", "min", "max"):
        return f"{agg.kind}({c})"
    if agg.kind in ("first", "last"):  # earliest / latest by event time, ties by value, nulls skipped
        fn = "min_by" if agg.kind == "first" else "max_by"
        return f"{fn}({c}, CASE WHEN {c} IS NOT NULL THEN named_struct('t', `{event_time}`, 'v', {c}) END)"
    raise NotImplementedError(f"the SDP peer has no SQL for {agg.kind}")


def flow_sql(spec: FlowSpec, source_uri: str) -> str:
    """`CREATE MATERIALIZED VIEW <flow> AS ...`: the flow's whole sink from the Parquet files at `source_uri`."""
    if spec.hidden or len(spec.sources) != 1:
        raise NotImplementedError("the SDP peer handles one source and no hidden aggregates")
    t = f"`{spec.event_time}`"
    derived = "".join(f", {expr} AS `{name}`" for name, expr in spec.derived)
    where = [f"({spec.filter})"] if spec.filter else []
    where += [f"{t} IS NOT NULL"] + [f"`{k}` IS NOT NULL" for k in spec.keys]
    size, slide = (f"'{int(d.total_seconds())} seconds'" for d in (spec.shape.size, spec.shape.slide))
    keys = "".join(f", `{k}`" for k in spec.keys)
    aggs = ",\n         ".join(f"{_agg_sql(a, spec.event_time)} AS `{a.name}`" for a in spec.aggregates)
    post = "".join(f", {expr} AS `{name}`" for name, expr in spec.post)
    return (f"-- {spec.name}: {spec.description or ''}\n"
            f"CREATE MATERIALIZED VIEW `{spec.name}` AS\n"
            f"WITH src AS (SELECT *{derived} FROM parquet.`{source_uri}`),\n"
            f"windowed AS (SELECT *, window({t}, {size}, {slide}) AS __w FROM src WHERE {' AND '.join(where)}),\n"
            f"agg AS (\n  SELECT __w.start AS window_start, __w.end AS window_end{keys},\n         {aggs}\n"
            f"  FROM windowed GROUP BY __w.start, __w.end{keys})\n"
            f"SELECT *{post} FROM agg;\n")


def write_project(root: str, specs: list[FlowSpec], source: str, *, driver_memory: str,
                  shuffle_partitions: int) -> None:
    """The SDP project under `root`: spec, SQL definitions, Spark defaults (see the module docstring)."""
    for sub in ("transformations", "conf", "storage", "events"):
        os.makedirs(os.path.join(root, sub), exist_ok=True)
    with open(os.path.join(root, "spark-pipeline.yml"), "w") as fh:
        fh.write(f"name: laminar_bench_sdp\nstorage: file://{root}/storage\nconfiguration:\n"
                 f"  spark.sql.shuffle.partitions: \"{shuffle_partitions}\"\n"
                 "libraries:\n  - glob:\n      include: transformations/**\n")
    with open(os.path.join(root, "transformations", "flows.sql"), "w") as fh:
        fh.write("\n".join(flow_sql(s, f"file://{source}") for s in specs))
    defaults = {
        "spark.driver.memory": driver_memory,
        "spark.sql.catalogImplementation": "hive",
        "spark.sql.warehouse.dir": f"file://{root}/warehouse",
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={root}/metastore_db;create=true",
        "spark.driver.extraJavaOptions": f"-Dderby.system.home={root}",
        "spark.eventLog.enabled": "true", "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false", "spark.eventLog.dir": f"file://{root}/events",
        "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
    }
    with open(os.path.join(root, "conf", "spark-defaults.conf"), "w") as fh:
        fh.writelines(f"{k} {v}\n" for k, v in defaults.items())
