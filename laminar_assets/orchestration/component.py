"""`LaminarComponent`: Laminar's flows as assets, checks, sensors and schedules of any `dg` project.

    dg scaffold defs laminar_assets.LaminarComponent trades

writes `defs/trades/defs.yaml` (and an example flow in `defs/trades/flows/`); the project's own
assets sit beside Laminar's in the same code location. The component builds its definitions with
the same builder as this repository's `definitions.py` (`build_definitions`), so both paths give the
same assets, checks and sensors.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import dagster as dg
from pydantic import BaseModel, Field, ValidationInfo, create_model, field_validator

from laminar_assets.engine.spark import JIT_OPTIONS
from laminar_assets.pipeline.settings import LaminarSettings, SettingsSource
from laminar_assets.resources import LaminarResource, SparkResource

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


S3_PREFIX = "s3_"  # LaminarResource's fields of an S3 store: the component's `s3` attributes without it


def resource_attributes(resource: type[BaseModel], name: str, doc: str, *, prefix: str = "",
                        leave_out: tuple[str, ...] = (), validators: dict[str, Any] | None = None) -> type[dg.Model]:
    """A nested attribute of the component (`spark`, `s3`) made from a resource's fields, their one declaration:
    each field whose name starts with `prefix` (dropped from the attribute's name), but those in `leave_out`, with
    the field's type, default and description. `validators`: checks of the attributes when the component loads."""
    fields: dict[str, Any] = {}
    for field, info in resource.model_fields.items():
        if field.startswith(prefix) and field not in leave_out:
            default: Any = ({"default_factory": info.default_factory} if info.default_factory is not None
                            else {"default": info.default})
            fields[field.removeprefix(prefix)] = (info.annotation, Field(description=info.description, **default))
    return create_model(name, __base__=dg.Model, __doc__=doc, __validators__=validators or {}, **fields)


def _check_jit(cls, value: str | None) -> str | None:
    """`spark.jit` is one the engine knows (`JIT_OPTIONS`), checked when the defs.yaml loads, not when a run starts."""
    if value is not None and value not in JIT_OPTIONS:
        raise ValueError(f"expected one of {', '.join(sorted(JIT_OPTIONS))}, not {value!r}")
    return value


if TYPE_CHECKING:  # made at import: the type checker sees models without fields, not the resources' fields
    class SparkAttributes(dg.Model):
        """The run's Spark: `SparkResource`'s fields."""

    class S3Attributes(dg.Model):
        """An S3 store: `LaminarResource`'s `s3_*` fields."""
else:
    SparkAttributes = resource_attributes(
        SparkResource, "SparkAttributes", leave_out=("stop_at_end",),  # a dg run always stops its session at its end
        validators={"_check_jit": field_validator("jit")(classmethod(_check_jit))},
        doc="The run's Spark: `SparkResource`'s fields (but stop_at_end), with their defaults and descriptions.")
    S3Attributes = resource_attributes(
        LaminarResource, "S3Attributes", prefix=S3_PREFIX,
        doc="An S3 or S3-compatible store for an s3:// lake root: `LaminarResource`'s s3_* fields without the "
            "prefix, with their defaults and descriptions; unset fields come from the AWS environment.")


COMPONENT = SettingsSource(engine="engine", horizon="this component's own attribute, not one of its engine options")
_WRITTEN_AS = {datetime: str, timedelta: str}  # settings a defs.yaml writes as text, parsed by the settings' check


def settings_attributes(base: type[dg.Model] = dg.Model) -> type[dg.Model]:
    """The component's attributes for the project settings, made from `LaminarSettings`, their one declaration:
    an optional attribute per setting, of the type a defs.yaml writes (a date or a duration as text), with the
    setting's description and its default named; checked by `LaminarSettings.check` when the component loads,
    so a wrong value is an error naming the attribute. Unset (None): Laminar's default, as in a project
    without `[tool.laminar]`."""
    fields: dict[str, Any] = {}
    for name, info in LaminarSettings.model_fields.items():
        described = f"{info.description} Unset: {_shown(info.get_default(call_default_factory=True))}."
        written: Any = _WRITTEN_AS.get(info.annotation, info.annotation)  # type: ignore[arg-type]
        fields[name] = (Annotated[written | None, _described(described, written | None)],
                        Field(default=None, description=described))

    def check(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            LaminarSettings.check(info.field_name or "", value, COMPONENT)
        return value  # as written: the definitions resolve 'today - N days' when they load

    validators: dict[str, Any] = {"_check": field_validator(*fields)(classmethod(check))}
    return create_model("LaminarSettingsAttributes", __base__=base, __doc__=settings_attributes.__doc__,
                        __validators__=validators, **fields)


def _described(description: str, written: Any) -> dg.Resolver:
    """An attribute's description where `dg` shows it (the component's schema, `dg docs`): Dagster derives
    that schema keeping a Resolver's description, not a pydantic Field's. `written`: the attribute's type in a
    defs.yaml. Resolved as Dagster's default resolver does (templates rendered); not that resolver itself,
    whose description would drop `written` and split a wrong value's error in two lines."""
    return dg.Resolver(lambda context, value: context.resolve_value(value), model_field_type=written,
                       description=description, inject_before_resolve=False)


def _shown(default: Any) -> str:
    """A setting's default as a defs.yaml would write it."""
    if isinstance(default, datetime):
        return f"'{default:%Y-%m-%d}'" if default == default.replace(hour=0, minute=0, second=0, microsecond=0) \
            else f"'{default.isoformat()}'"
    if isinstance(default, timedelta):
        seconds = int(default.total_seconds())
        unit, size = next((u, n) for u, n in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)) if seconds % n == 0)
        return f"'{seconds // size}{unit}'"
    if isinstance(default, str):
        return f"'{default}'"
    return "none" if default in ({}, [], None) else f"{default:g}" if isinstance(default, float) else str(default)


class _LocationAttributes(dg.Model):
    """Where the flows, the contracts and the lake are, and the Spark and store that reach them: the
    attributes a defs.yaml writes first (the base of the settings' attributes, so they come first in the schema)."""

    flows: Annotated[str, dg.Resolver(
        lambda ctx, v: v if _is_module_name(v) else _relative_to_defs(ctx, v), model_field_type=str,
        description="The flow and stage specs: a folder of .py and .sql files (relative to this defs.yaml), "
                    "or a module name such as 'laminar_assets.flows'.")] = "flows"
    contracts: Annotated[str | None, dg.Resolver(
        _relative_to_defs, model_field_type=str,
        description="Folder of the sources' data contracts (Great Expectations suites as YAML), relative to "
                    "this defs.yaml; none: no contract checks.")] = None
    lake_root: Annotated[str | None, _described(
        'Storage root of the Delta tables: a path (relative to the project root) or s3://bucket/prefix. None:'
        ' LAMINAR_ROOT when a run starts, else .laminar/lake.', str | None)] = None
    spark: Annotated[SparkAttributes, _described(
        "The run's Spark: `remote: sc://host:15002` for a Connect server, `master: spark://host:7077` for a "
        "cluster, `conf: {...}`; default: a local JVM per run.", SparkAttributes)] = Field(default_factory=SparkAttributes)
    s3: Annotated[S3Attributes, _described(
        f"Object-store fields ({', '.join(S3Attributes.model_fields)}) for an s3:// root (the time bounds: for "
        "any object-store root); unset ones come from the AWS environment.", S3Attributes)] = Field(default_factory=S3Attributes)
    catalog_schema: Annotated[str | None, _described(
        "The catalog schema every table a run writes is registered in (Spark's Hive metastore), e.g. 'laminar'; "
        "sources named schema.table are found there. None: LAMINAR_CATALOG, else no catalog.", str | None)] = None


if TYPE_CHECKING:  # made at import: the type checker sees the attributes written out here, not the settings'
    _Attributes = _LocationAttributes
else:
    _Attributes = settings_attributes(_LocationAttributes)  # location first, then the settings, in a defs.yaml's order


@dg.scaffold_with(LaminarScaffolder)
class LaminarComponent(dg.Component, _Attributes, dg.Resolvable):
    """Laminar: incremental time-window rollups over Delta tables, computed by Spark. One partitioned
    asset per flow and stage, their contract, equivalence and lag checks, a sensor per connected part
    of the graph watching Delta versions, and the schedules named here.

    Its project-settings attributes (partitions_start, future_horizon, schedules, retries, ...) are
    `LaminarSettings`' fields (`settings_attributes`), so they are declared and checked in one place."""

    thread_executor: Annotated[bool, _described(
        "Run a run's steps as threads of one process sharing one Spark session (Laminar's executor). It "
        "becomes the code location's default executor, so set false when the project's own jobs need "
        "Dagster's multiprocess executor.", bool)] = True

    def settings(self) -> LaminarSettings:
        """The project settings this component's attributes give (unset ones: Laminar's defaults)."""
        given = {name: getattr(self, name) for name in LaminarSettings.model_fields}
        return LaminarSettings.model_validate({k: v for k, v in given.items() if v is not None}, context=COMPONENT)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        from laminar_assets.engine import LaminarError, collect
        from laminar_assets.orchestration.builder import build_definitions

        settings = self.settings()
        root = self.lake_root
        if root and "://" not in root and not os.path.isabs(root):
            root = str(context.project_root / root)  # runs and the daemon may start elsewhere
        if self.contracts is not None and not os.path.isdir(self.contracts):
            raise LaminarError(f"contracts folder {self.contracts!r} does not exist: expected a folder of contract "
                               "YAML files; create it, or drop `contracts` for no contract checks", field="contracts")
        laminar = LaminarResource(root=root, spark=SparkResource(**self.spark.model_dump()),
                                  catalog_schema=self.catalog_schema,
                                  **{f"{S3_PREFIX}{k}": v for k, v in self.s3.model_dump().items()})
        catalog = collect(self.flows)
        return build_definitions(catalog.specs, settings, resources={"laminar": laminar}, contracts_dir=self.contracts,
                                 thread_executor=self.thread_executor, exports=catalog.exports)


def _is_module_name(value: str) -> bool:
    return "/" not in value and os.sep not in value and "." in value and not value.startswith(".")
