"""Lake integrity: every file the latest snapshot of a table names exists.

A reader should never be the first to find that a table names a missing file. `check_table`
opens a table's latest snapshot (afresh on a local disk; on an object store the snapshot the run's other
readers share, after a listing that proves it the latest) and looks for every data
file it names (Laminar writes no deletion vectors). `written_tables` lists the tables Laminar writes for a
spec: its sink (a stage's output), its state tables and its sources' quarantine tables.
`laminar check` and the contract and equivalence asset checks report a broken table with its
name, version and missing files.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from urllib.parse import unquote

import pyarrow as pa
from deltalake.exceptions import DeltaError, TableNotFoundError

from laminar_assets import storage

from . import snapshot_cache
from .layout import Layout
from .log_snapshot import LogSnapshot
from .tables import open_delta, open_error


@dataclass(frozen=True)
class TableIntegrity:
    """What `check_table` found: the table's latest version, how many files it names, which are missing."""

    table: str
    uri: str
    version: int | None  # None: there is no table here (yet), or its log cannot be read (`damage`)
    files: int = 0
    missing: tuple[str, ...] = ()
    damage: str | None = None  # why the table's log cannot be read (the damaged file, when one is the cause)

    @property
    def ok(self) -> bool:
        return not self.missing and self.damage is None

    def describe(self) -> str:
        if self.damage is not None:
            return f"{self.table} at {self.uri}: {self.damage}"
        if self.version is None:
            return f"{self.table}: no table at {self.uri}"
        if self.ok:
            return f"{self.table} (version {self.version}): all {self.files} files present"
        shown = ", ".join(self.missing[:3]) + (f" and {len(self.missing) - 3} more" if len(self.missing) > 3 else "")
        return (f"{self.table} at {self.uri}, version {self.version}: {len(self.missing)} of the {self.files} files "
                f"its snapshot names are missing ({shown}); readers of this version fail. Refill the partitions "
                "it holds (`laminar refill`) or restore the files")

    def to_json(self) -> dict:
        return {"table": self.table, "uri": self.uri, "version": self.version, "files": self.files,
                "missing": list(self.missing), "damage": self.damage}


def check_table(name: str, uri: str) -> TableIntegrity:
    """Whether every file the latest snapshot of the table at `uri` names exists."""
    try:
        if storage.is_object_store(uri):  # shared with the run's other readers: `open_snapshot` lists the log
            dt = snapshot_cache.open_snapshot(uri, None, open_delta)  # from the version it keeps, so it is the latest
        else:
            dt = open_delta(uri)  # a fresh open: a shared snapshot could predate the newest commit
    except TableNotFoundError:
        return TableIntegrity(name, uri, None)
    except DeltaError as exc:  # a log deltalake cannot read: reported with the file at fault, the other tables checked
        return TableIntegrity(name, uri, None, damage=str(open_error(name, uri, None, exc)))
    if isinstance(dt, LogSnapshot):  # the run's replay of the table's log: its add actions as written
        paths = [_absolute(uri, a["path"]) for a in dt.add_actions()]
    else:
        paths = [_absolute(uri, p) for p in pa.table(dt.get_add_actions(flatten=True)).column("path").to_pylist()]
    if storage.is_object_store(uri):  # one listing instead of a request per file
        present = {storage.normalized(u) for u, _ in storage.list_files(uri)}
        missing = tuple(p for p in paths if storage.normalized(p) not in present)
    else:
        missing = tuple(p for p in paths if not os.path.exists(storage.local_path(p) or p))
    return TableIntegrity(name, uri, dt.version(), len(paths), missing)


def written_tables(layout: Layout, spec) -> list[tuple[str, str]]:
    """(name, URI) of every table Laminar writes for `spec`: its sink or output, the state tables
    of every spec version and input schema it has had (flows), and its sources' quarantine tables."""
    tables = [(spec.sink, layout.sink_uri(spec))]
    if spec.keeps_state:
        folder = storage.join(layout.root, "_laminar", "state", spec.name)
        tables += [(f"{spec.name} state {name}", storage.join(folder, name)) for name in storage.list_dirs(folder)]
    tables += [(f"quarantine of {os.path.basename(src.rstrip('/'))}", layout.quarantine_uri(src))
               for src in spec.sources]
    return tables


def check_spec(layout: Layout, spec) -> list[TableIntegrity]:
    """`check_table` of every table in `written_tables` that exists (a damaged one included)."""
    return [r for r in (check_table(name, uri) for name, uri in written_tables(layout, spec))
            if r.version is not None or r.damage is not None]


def _absolute(table_uri: str, path: str) -> str:
    path = unquote(path)
    return path if "://" in path or path.startswith("/") else f"{table_uri}/{path}"

