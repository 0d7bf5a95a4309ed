"""Delta tables as Laminar reads them: one commit's actions (`log`), pinned snapshots and the history
since a version (`tables`), deletion vectors, event-time ranges of files, snapshots shared in a process,
where tables live under a root (`layout`), and whether every file a table names exists (`integrity`)."""

from .integrity import TableIntegrity, check_table
from .layout import Layout
from .log import CommitKind, CommitSummary, DataFile, last_commit_after, looks_cost_requests
from .tables import (
    SourceHistory,
    TableInfo,
    checkout_info,
    is_delta_table,
    open_delta,
    open_table,
    resolve_uri,
    snapshot_files,
    source_history,
    table_info,
)

__all__ = [
    "CommitKind", "CommitSummary", "DataFile", "Layout", "SourceHistory", "TableInfo", "TableIntegrity",
    "check_table", "checkout_info", "is_delta_table", "last_commit_after", "looks_cost_requests", "open_delta",
    "open_table", "resolve_uri", "snapshot_files", "source_history", "table_info",
]
