"""One run's pieces, below the `Engine` that carries it out: its options and context, its inputs
gathered once, the pure planner and its frozen plans, the watermark protocol, which files it reads and
how rows are prepared, the schema check, the sweep, and what it returns."""

from .context import STEPS, EngineOptions, RunContext
from .metrics import RunMetrics
from .plan import Mode, PartitionPlan, Reason
from .planner import PlannerInput, plan_partition
from .result import RunResult, SweepResult
from .validate import columns_used

__all__ = [
    "EngineOptions", "Mode", "PartitionPlan", "PlannerInput", "Reason", "RunContext", "RunMetrics", "RunResult", "STEPS",
    "SweepResult", "columns_used", "plan_partition",
]
