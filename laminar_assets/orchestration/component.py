"""`LaminarComponent`: Laminar's flows as assets, checks, sensors and schedules of any `dg` project.

    dg scaffold defs laminar_assets.LaminarComponent trades

writes `defs/trades/defs.yaml` (and an example flow in `defs/trades/flows/`); the project's own
assets sit beside Laminar's in the same code location. The component builds its definitions with
the same builder as this repository's `definitions.py` (`build_definitions`), so both paths give the
same assets, checks and sensors.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Annotated, Any

import dagster as dg
from pydantic import BaseModel, Field, field_validator

EXAMPLE_FLOW = """-- An example flow: per-minute volume and VWAP of a Delta table `raw_trades`
-- (columns event_time TIMESTAMP, symbol STRING, price DOUBLE, quantity BIGINT) under the lake root.
CREATE MATERIALIZED VIEW trades_1m PARTITIONED BY HOUR COMMENT 'Per-minute volume and VWAP per symbol' AS
SELECT symbol, TUMBLE(event_time, INTERVAL '1' MINUTE),
       SUM(quantity) AS volume, SUM(price * quantity) / SUM(quantity) AS vwap, COUNT(*) AS trades
FROM raw_trades
GROUP BY symbol, TUMBLE(event_time, INTERVAL '1' MINUTE);
"""


def _relative_to_defs(context: dg.ResolutionContext, value: str | None) -> str | None:
    """A folder written relative to the defs.yaml (templates rendered first), made absolute."""
    if value is None:
        return None
    text = context.resolve_value(value, as_type=str)
    return str(context.resolve_source_relative_path(text))


class LaminarScaffoldParams(BaseModel):
    """`dg scaffold defs laminar_assets.LaminarComponent NAME [--lake-root ...] [--partitions-start ...]`."""

    lake_root: str | None = None
    partitions_start: str | None = None


class LaminarScaffolder(dg.Scaffolder[LaminarScaffoldParams]):
    """Writes a defs.yaml with every attribute a team usually sets, a `flows/` folder holding one example
    flow, and an empty `data_contracts/` folder."""

    @classmethod
    def get_scaffold_params(cls) -> type[LaminarScaffoldParams]:
        return LaminarScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[LaminarScaffoldParams]) -> None:
        params = request.params or LaminarScaffoldParams()
        dg.scaffold_component(request, {
            "flows": "flows",
            "contracts": "data_contracts",
            "lake_root": params.lake_root or "{{ env('LAMINAR_ROOT', '.laminar/lake') }}",
            "partitions_start": params.partitions_start or f"{datetime.now(UTC):%Y-%m-%d}",
            "schedules": {},
        })
        (request.target_path / "flows").mkdir(exist_ok=True)
        (request.target_path / "data_contracts").mkdir(exist_ok=True)
        example = request.target_path / "flows" / "trades_1m.sql"
        if not example.exists():
            example.write_text(EXAMPLE_FLOW)


class SparkAttributes(dg.Model):
    """The run's Spark (`SparkResource`): unset fields fall back to LAMINAR_SPARK_* when a run starts."""

    master: str | None = Field(default=None, description="A cluster's master URL (spark://host:7077).")
    remote: str | None = Field(default=None, description="A Spark Connect endpoint (sc://host:15002).")
    shuffle_partitions: int = 4
    driver_memory: str = "2g"
    conf: dict[str, str] = Field(default_factory=dict, description="Extra Spark configuration.")
    jit: str | None = Field(default=None, description="'tiered', 'hot' or 'quick' for a JVM Laminar starts.")
    metastore: str | None = Field(default=None, description=(
        "The Hive metastore of a JVM Laminar starts: a folder (embedded Derby), a postgresql:// URL (a database "
        "on Postgres, shared by every process) or a jdbc: URL; unset: "
        "LAMINAR_METASTORE, or .laminar/metastore with a catalog schema (docs/catalog.md)."))


class S3Attributes(dg.Model):
    """An S3 or S3-compatible store for an s3:// lake root; unset fields come from the AWS environment."""

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = None
    path_style: bool | None = None


@dg.scaffold_with(LaminarScaffolder)
class LaminarComponent(dg.Component, dg.Model, dg.Resolvable):
    """Laminar: incremental time-window rollups over Delta tables, computed by Spark. One partitioned
    asset per flow and stage, their contract, equivalence and lag checks, a sensor per connected part
    of the graph watching Delta versions, and the schedules named here."""

    flows: Annotated[str, dg.Resolver(
        lambda ctx, v: v if _is_module_name(v) else _relative_to_defs(ctx, v), model_field_type=str,
        description="The flow and stage specs: a folder of .py and .sql files (relative to this defs.yaml), "
                    "or a module name such as 'laminar_assets.flows'.")] = "flows"
    contracts: Annotated[str | None, dg.Resolver(
        _relative_to_defs, model_field_type=str,
        description="Folder of the sources' data contracts (Great Expectations suites as YAML), relative to "
                    "this defs.yaml; none: no contract checks.")] = None
    lake_root: str | None = Field(default=None, description=(
        'Storage root of the Delta tables: a path (relative to the project root) or s3://bucket/prefix. None:'
        ' LAMINAR_ROOT when a run starts, else .laminar/lake.'))
    spark: SparkAttributes = Field(default_factory=SparkAttributes, description=(
        "The run's Spark: `remote: sc://host:15002` for a Connect server, `master: spark://host:7077` for a "
        "cluster, `conf: {...}`; default: a local JVM per run."))
    s3: S3Attributes = Field(default_factory=S3Attributes, description=(
        "Object-store fields (endpoint, region, access_key_id, secret_access_key, path_style) for an s3:// "
        "root; unset ones come from the AWS environment."))
    catalog_schema: str | None = Field(default=None, description=(
        "The catalog schema every table a run writes is registered in (Spark's Hive metastore), e.g. 'laminar'; "
        "sources named schema.table are found there. None: LAMINAR_CATALOG, else no catalog."))
    partitions_start: str | None = Field(default=None, description=(
        "First partition of every flow without its own `start`: an ISO date or 'today - N days'."))
    future_horizon: str | None = Field(default=None, description=(
        "How far past now a partition may start, a duration like '6h' (default '1d'): the sensor searches no "
        "later partition, and runs quarantine later rows."))
    schedules: dict[str, str] = Field(default_factory=dict, description=(
        'Flow name -> cron schedule that brings its latest partition up to date.'))
    sensor_interval_seconds: int | None = Field(default=None, description=(
        "Least seconds between two ticks of a Delta-version sensor (default 1)."))
    retries: int | None = Field(default=None, description=(
        "Retries of a step that failed for a transient reason (default 2)."))
    alert: str | None = Field(default=None, description=(
        "Where failed runs are reported: 'log', a webhook URL, or 'package.module:function'."))
    engine: dict[str, Any] = Field(default_factory=dict, description=(
        "Engine options by name (refill_ratio, key_refill_min_bytes, ...; any EngineOptions field but "
        "future_horizon): over the project's [tool.laminar.engine] for every run and check of this component."))
    thread_executor: bool = Field(default=True, description=(
        "Run a run's steps as threads of one process sharing one Spark session (Laminar's executor). It "
        "becomes the code location's default executor, so set false when the project's own jobs need "
        "Dagster's multiprocess executor."))

    @field_validator("partitions_start")
    @classmethod
    def _start(cls, value: str | None) -> str | None:
        if value is not None:
            from laminar_assets.pipeline.settings import resolve_start

            resolve_start(value)  # a ValueError here names the field, the file and the line
        return value

    @field_validator("future_horizon")
    @classmethod
    def _horizon(cls, value: str | None) -> str | None:
        if value is not None:
            from laminar_assets.engine import parse_duration

            parse_duration(value)  # a ValueError here names the field, the file and the line
        return value

    @field_validator("engine")
    @classmethod
    def _engine(cls, value: dict[str, Any]) -> dict[str, Any]:
        from laminar_assets.engine import EngineOptions
        from laminar_assets.errors import EnvironmentProblem

        if "future_horizon" in value:
            raise ValueError("future_horizon is this component's own attribute, not one of its engine options")
        try:
            EngineOptions.of(value, where="engine")  # a name or a value it refuses: the field, the file and the line
        except EnvironmentProblem as exc:
            raise ValueError(exc.message) from None
        return value

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from laminar_assets.engine import LaminarError, collect
        from laminar_assets.orchestration.builder import build_definitions
        from laminar_assets.pipeline.settings import LaminarSettings
        from laminar_assets.resources import LaminarResource, SparkResource

        given: dict[str, Any] = {  # the settings this component sets (None: the project's)
            "partitions_start": self.partitions_start, "future_horizon": self.future_horizon,
            "schedules": self.schedules or None,
            "sensor_interval_seconds": self.sensor_interval_seconds, "retries": self.retries,
            "alert": self.alert, "engine": self.engine or None}
        settings = LaminarSettings(**{k: v for k, v in given.items() if v is not None})
        root = self.lake_root
        if root and "://" not in root and not os.path.isabs(root):
            root = str(context.project_root / root)  # runs and the daemon may start elsewhere
        if self.contracts is not None and not os.path.isdir(self.contracts):
            raise LaminarError(f"contracts folder {self.contracts!r} does not exist: expected a folder of contract "
                               "YAML files; create it, or drop `contracts` for no contract checks", field="contracts")
        laminar = LaminarResource(root=root, spark=SparkResource(**self.spark.model_dump()),
                                  catalog_schema=self.catalog_schema,
                                  **{f"s3_{k}": v for k, v in self.s3.model_dump().items()})
        catalog = collect(self.flows)
        return build_definitions(catalog.specs, settings, resources={"laminar": laminar}, contracts_dir=self.contracts,
                                 thread_executor=self.thread_executor, exports=catalog.exports)


def _is_module_name(value: str) -> bool:
    return "/" not in value and os.sep not in value and "." in value and not value.startswith(".")
