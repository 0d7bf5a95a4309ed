"""Invariants of a lake after any step, for the tests: every file a table names exists, and no run
leaves staged files that no commit took. Independent of the engine's own integrity check, which a
test may not use to judge itself."""

from __future__ import annotations

import glob
import json
import os
from urllib.parse import unquote

from deltalake import DeltaTable


def delta_tables(root: str) -> list[str]:
    """Every Delta table under `root` (folders holding a `_delta_log`)."""
    return sorted(os.path.dirname(log) for log in glob.glob(os.path.join(root, "**", "_delta_log"), recursive=True))


def laminar_tables(root: str, sinks) -> list[str]:
    """The folders of the tables Laminar writes: the given sinks (or stage outputs), state and
    quarantine tables; also those whose first commit has not landed yet (staged files only)."""
    found = [os.path.join(root, s) for s in sinks]
    found += glob.glob(os.path.join(root, "_laminar", "state", "*", "*"))
    found += glob.glob(os.path.join(root, "_laminar", "quarantine", "*"))
    return [t for t in found if os.path.isdir(t)]


def missing_files(table: str) -> list[str]:
    """Files the latest snapshot of `table` names that do not exist."""
    dt = DeltaTable(table)
    return [u for u in dt.file_uris() if not os.path.exists(u.removeprefix("file://"))]


def assert_lake_intact(root: str) -> None:
    """Every Delta table under `root` (sources too) names only files that exist."""
    broken = {t: m for t in delta_tables(root) if (m := missing_files(t))}
    assert not broken, f"tables name missing files: {broken}"


def orphan_files(table: str) -> list[str]:
    """Parquet files in the table's folder that no entry of its log has ever named (Laminar's tables
    keep every JSON entry, so the log is complete)."""
    named: set[str] = set()
    for entry in glob.glob(os.path.join(table, "_delta_log", "*.json")):
        with open(entry, encoding="utf-8") as fh:
            for line in fh:
                if not line.strip():
                    continue
                action = json.loads(line)
                for kind in ("add", "remove", "cdc"):
                    if kind in action:
                        named.add(os.path.normpath(os.path.join(table, unquote(action[kind]["path"]))))
    on_disk = [p for p in glob.glob(os.path.join(table, "**", "*.parquet"), recursive=True)
               if "_delta_log" not in p]
    return sorted(p for p in on_disk if os.path.normpath(p) not in named)


def empty_folders(table: str) -> list[str]:
    """Folders in the table's folder that hold no file at all (a staging nothing came of)."""
    return sorted(d for d, subdirs, names in os.walk(table) if not names and not subdirs and "_delta_log" not in d)


def assert_no_orphans(root: str, sinks) -> None:
    """No table Laminar writes holds a staged file no commit took, or a staging folder left empty."""
    orphans = {t: o for t in laminar_tables(root, sinks) if (o := orphan_files(t) + empty_folders(t))}
    assert not orphans, f"staged files no commit took: {orphans}"
