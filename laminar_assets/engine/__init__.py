"""Laminar's incremental flow engine: a plain library (no Dagster imports).

    from laminar_assets.engine import Engine, FlowSpec, Agg, Tumbling, build_session
    engine = Engine(build_session(), root="/data/lake")
    result = engine.run(my_flow, "2024-01-01-00:00")
    print(result.mode, result.reason)

This module is the one import path for the rest of the project; its subpackages' `__init__`
modules export what other layers need of them (`engine.report`, `engine.delta`, `engine.spark`, ...).
The packages, from the bottom up: `windows` (all window and interval math), `spec`, `aggregates`,
`sql`, `delta`, `spark`, `output`, `quarantine`, `run`, `flow` and `stage`, `export`, `report`; then `Engine`
(`executor`) and `collect_specs` (`registry`). Imports only point down that list
(tests/test_boundaries.py).
"""

from laminar_assets.errors import (
    CheckpointError,
    CommitConflictError,
    ConcurrentDeliveryError,
    ConcurrentRunError,
    EnvironmentProblem,
    ExportError,
    ExportSchemaError,
    ExportTargetError,
    LaminarError,
    RunFailedError,
    SchemaMismatchError,
    SourceError,
    SourceNotFoundError,
    SpecError,
    SqlDefinitionError,
    StrictRefreshError,
    UnsupportedTableFeatureError,
)

from .catalog import CatalogOptions, CatalogReport, CatalogTable
from .delta import TableIntegrity
from .executor import Engine, checked_keys
from .export import Connection, DeliveryResult, Exporter
from .registry import Catalog, check_exports, check_tables, collect, collect_specs, order_specs
from .run import EngineOptions, Mode, PartitionPlan, Reason, RunMetrics, RunResult, SweepResult
from .run.protocol import record_refused_run
from .spark import SparkOptions, build_session, check_java, start_session
from .spec import (
    BUILTIN_RULES,
    Agg,
    BaseSpec,
    DimensionJoin,
    Export,
    ExportSpec,
    FactJoin,
    FlowSpec,
    Hopping,
    LatePolicy,
    PostgresExport,
    RedisExport,
    RefreshPolicy,
    RowRule,
    Spec,
    StageSpec,
    Tumbling,
    WebhookExport,
    export_key,
)
from .sql import compile_sql, compile_sql_definitions
from .windows import (
    PARTITION_SPAN,
    Granularity,
    Interval,
    describe_duration,
    later,
    parse_duration,
    partition_interval,
    partition_key,
    partition_key_column,
    partition_span,
    partitions_overlapping,
)

__all__ = [
    # running
    "Engine", "EngineOptions", "checked_keys", "RunMetrics", "RunResult", "SweepResult", "Mode", "Reason",
    "PartitionPlan", "TableIntegrity",
    "record_refused_run", "CatalogOptions", "CatalogReport", "CatalogTable",
    # declaring
    "Agg", "BUILTIN_RULES", "BaseSpec", "DimensionJoin", "FactJoin", "FlowSpec", "Hopping", "LatePolicy",
    "RefreshPolicy", "RowRule", "Spec", "StageSpec", "Tumbling", "check_tables", "collect_specs", "compile_sql",
    "order_specs", "Catalog", "collect", "check_exports", "compile_sql_definitions",
    # exporting
    "Export", "ExportSpec", "PostgresExport", "RedisExport", "WebhookExport", "export_key", "Connection",
    "DeliveryResult", "Exporter",
    # Spark
    "SparkOptions", "build_session", "check_java", "start_session",
    # time
    "PARTITION_SPAN", "Granularity", "Interval", "describe_duration", "later", "parse_duration", "partition_interval",
    "partition_key", "partition_key_column", "partition_span", "partitions_overlapping",
    # errors
    "CheckpointError", "CommitConflictError", "ConcurrentDeliveryError", "ConcurrentRunError", "EnvironmentProblem",
    "ExportError", "ExportSchemaError", "ExportTargetError", "LaminarError",
    "RunFailedError", "SchemaMismatchError", "SourceError", "SourceNotFoundError", "SpecError", "SqlDefinitionError",
    "StrictRefreshError", "UnsupportedTableFeatureError",
]
