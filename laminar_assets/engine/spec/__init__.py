"""Flow and stage specs: what a data engineer declares, validated when it is built, and the one table
of aggregate kinds. Everything that differs between a flow and a stage is a member of `BaseSpec`."""

from .kinds import KINDS, Kind
from .parts import Agg, DimensionJoin, FactJoin, Hopping, LatePolicy, RefreshPolicy, RowRule, Tumbling
from .specs import BUILTIN_RULES, RESERVED_COLUMNS, BaseSpec, FlowSpec, Spec, StageSpec

__all__ = [
    "Agg", "BUILTIN_RULES", "BaseSpec", "DimensionJoin", "FactJoin", "FlowSpec", "Hopping", "KINDS", "Kind",
    "LatePolicy", "RESERVED_COLUMNS", "RefreshPolicy", "RowRule", "Spec", "StageSpec", "Tumbling",
]
