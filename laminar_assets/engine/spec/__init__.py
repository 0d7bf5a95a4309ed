"""Flow and stage specs: what a data engineer declares, validated when it is built, and the one table
of aggregate kinds. Everything that differs between a flow and a stage is a member of `BaseSpec`.
Exports (`exports.py`) are the third kind: where a flow's or stage's table is delivered."""

from .exports import EXPORT_KINDS, Export, ExportSpec, PostgresExport, RedisExport, WebhookExport, export_key
from .kinds import KINDS, Kind
from .parts import Agg, DimensionJoin, FactJoin, Hopping, LatePolicy, RefreshPolicy, RowRule, Tumbling
from .specs import BUILTIN_RULES, RESERVED_COLUMNS, BaseSpec, FlowSpec, Spec, StageSpec

__all__ = [
    "Agg", "BUILTIN_RULES", "BaseSpec", "DimensionJoin", "EXPORT_KINDS", "Export", "ExportSpec", "FactJoin", "FlowSpec",
    "Hopping", "KINDS", "Kind", "LatePolicy", "PostgresExport", "RESERVED_COLUMNS", "RedisExport", "RefreshPolicy",
    "RowRule", "Spec", "StageSpec", "Tumbling", "WebhookExport", "export_key",
]
