"""Whose table a run writes: a flow writes only into a table it created itself.

Every table Laminar creates for a flow or stage (its sink, its state) carries the table property
`laminar.flow` = the flow's name. Before a run writes anything, and again when it commits, the table
it writes must be

  - absent, or a folder holding nothing but Laminar's own uncommitted files (a first run that stopped
    before its first commit), or
  - a Delta table whose `laminar.flow` property names this flow, or, for a table an earlier Laminar
    created (no such property), whose app transactions (`laminar/<flow>/<partition>`) or recent
    commits (commit info `laminar.flow`) name this flow. Such a table gets the property at its next
    commit (`stamp`), so the search is paid once.

Anything else (a source table, a dimension, another flow's output, a folder of other files) is
refused with a `SpecError` naming the flow, the table and what was found, before anything is written:
a mistyped sink never replaces data that is not its flow's output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from laminar_assets import storage
from laminar_assets.errors import SpecError

from ..delta.tables import open_delta
from ..delta.transactions import txn_versions_of

OWNER_PROPERTY = "laminar.flow"
HISTORY_LOOKED_AT = 20  # recent commits searched for this flow's commit info in a table without the property
# What a run may leave in a sink's folder before the table exists: its uncommitted files and a log being created.
_OWN_FOLDERS = ("laminar", "_change_data/laminar", "_delta_log")


def owner_of(table: DeltaTable) -> str | None:
    """The flow named by the table's `laminar.flow` property (None: not set)."""
    return table.metadata().configuration.get(OWNER_PROPERTY)


def check_owner(uri: str, flow: str, *, what: str = "sink", apps: Sequence[str] = (),
                table: DeltaTable | None = None) -> DeltaTable | None:
    """Refuse (`SpecError`) unless `flow` may write the table at `uri` (see the module's docstring).
    `apps`: the run's app-transaction ids (evidence for a table an earlier Laminar created); `table`:
    the table as opened already. Returns the open table (None when there is none yet). Writes nothing."""
    if table is None:
        try:
            table = open_delta(uri)
        except TableNotFoundError:
            _refuse_foreign_files(uri, flow, what)
            return None
    owner = owner_of(table)
    if owner == flow:
        return table
    if owner is not None:
        _refuse(flow, what, uri, f"a Delta table created by flow '{owner}' (table property {OWNER_PROPERTY})")
    if apps and any(v is not None for v in txn_versions_of(table, uri, list(apps)).values()):
        return table
    writers = _recent_writers(table)
    if flow in writers:
        return table
    found = (f"a Delta table written by flow(s) {', '.join(sorted(writers))}" if writers else
             f"a Delta table Laminar did not create (version {table.version()}, no '{OWNER_PROPERTY}' property, "
             "no commit of this flow)")
    _refuse(flow, what, uri, found)


def needs_stamp(table: DeltaTable | None) -> bool:
    """Whether `table` (checked by `check_owner`) still lacks the `laminar.flow` property."""
    return table is not None and owner_of(table) is None


def _recent_writers(table: DeltaTable) -> set[str]:
    """The flows named in the commit info of the table's recent commits."""
    try:
        history = table.history(limit=HISTORY_LOOKED_AT)
    except (DeltaError, OSError, ValueError):  # log entries cleaned up: no evidence
        return set()
    return {c[OWNER_PROPERTY] for c in history if isinstance(c.get(OWNER_PROPERTY), str)}


def _refuse_foreign_files(uri: str, flow: str, what: str) -> None:
    """Refuse a folder at `uri` that holds files other than Laminar's own uncommitted files."""
    base = storage.normalized(uri).rstrip("/")
    for found, _size in storage.list_files(uri):
        rel = storage.normalized(found)[len(base) + 1:].replace("\\", "/")
        if not any(rel.startswith(folder + "/") for folder in _OWN_FOLDERS):
            _refuse(flow, what, uri, f"a folder that is not a Delta table and holds other files (e.g. {rel})")


def _refuse(flow: str, what: str, uri: str, found: str) -> NoReturn:
    raise SpecError(
        f"flow '{flow}' would write its {what} into {uri}, but that is {found}: Laminar writes only into tables "
        f"its flow created, so nothing was written. Give the flow another sink; or, if this table is its "
        f"output under an earlier name, set the table property {OWNER_PROPERTY} = '{flow}'",
        flow=flow, field="sink", table=uri)
