"""Laminar's incremental flow engine: a plain library (no Dagster imports).

    from laminar_assets.engine import Engine, FlowSpec, Agg, Tumbling, build_session
    engine = Engine(build_session(), root="/data/lake")
    result = engine.run(my_flow, "2024-01-01-00:00")
    print(result.mode, result.reason)
"""

from laminar_assets.errors import (
    CheckpointError,
    CommitConflictError,
    ConcurrentRunError,
    EnvironmentProblem,
    LaminarError,
    RunFailedError,
    SchemaMismatchError,
    SourceError,
    SourceNotFoundError,
    SpecError,
    StrictRefreshError,
    UnsupportedTableFeatureError,
)
from .executor import Engine
from .integrity import TableIntegrity
from .layout import EngineOptions
from .result import RunResult, SweepResult
from .plan import Mode, PartitionPlan, Reason
from .planner import PlannerInput, plan_partition
from .session import SparkOptions, build_session, check_java
from .spec import Agg, DimensionJoin, FactJoin, FlowSpec, Hopping, LatePolicy, RefreshPolicy, RowRule, StageSpec, Tumbling
from .windows import Granularity, Interval

__all__ = [
    "Agg", "CheckpointError", "CommitConflictError", "ConcurrentRunError", "DimensionJoin", "Engine", "EngineOptions", "FactJoin",
    "EnvironmentProblem", "FlowSpec", "Granularity", "Hopping", "Interval", "LaminarError", "LatePolicy",
    "Mode", "PartitionPlan", "PlannerInput", "Reason", "RefreshPolicy", "RowRule", "RunFailedError", "RunResult",
    "SchemaMismatchError", "SourceError", "SourceNotFoundError", "SparkOptions", "SpecError", "StageSpec",
    "StrictRefreshError", "SweepResult", "TableIntegrity", "Tumbling", "UnsupportedTableFeatureError", "build_session", "check_java",
    "plan_partition",
]
