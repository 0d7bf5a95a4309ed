"""Answers about a lake, for the CLI and the Dagster layer: the graph, explain and status
(`overview`), staleness and dirty partitions without Spark (`staleness`), `laminar sql`'s system tables,
the equivalence check, and reading a sink's rows."""

from .deliveries import describe_export_failures, export_status
from .equivalence import EquivalenceResult, check_equivalence, check_equivalence_many
from .flow_stats import FlowStats, stats_by_flow
from .overview import describe_failed_runs, explain, failed_runs, status, topology
from .sink_read import to_pandas
from .staleness import NewCommits, beyond, dirty_partitions, inspect_partition, is_stale, lag, new_commits, reach, touches
from .system_tables import jsonable, run_query

__all__ = [
    "EquivalenceResult", "FlowStats", "NewCommits", "beyond", "check_equivalence", "check_equivalence_many",
    "describe_export_failures", "describe_failed_runs", "dirty_partitions", "export_status",
    "explain", "failed_runs", "stats_by_flow", "inspect_partition",
    "is_stale", "jsonable", "lag", "new_commits", "reach", "run_query", "status", "to_pandas", "topology", "touches",
]
