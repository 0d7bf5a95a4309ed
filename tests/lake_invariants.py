"""Invariants of a lake after any step, for the tests: every file a table names exists, and no run
leaves staged files that no commit took. Independent of the engine's own integrity check, which a
test may not use to judge itself. A lake is a local folder or a prefix in a bucket."""

from __future__ import annotations

import json
import os
import re
from urllib.parse import unquote

from deltalake import DeltaTable

from laminar_assets import storage
from laminar_assets.engine.delta import open_delta

_COMMIT = re.compile(r"^(\d{20})\.json$")
_snapshots: dict[str, tuple[tuple[int, str], DeltaTable, dict]] = {}  # uri -> (newest commit, table, facts)


def latest_snapshot(uri: str) -> tuple[DeltaTable, dict]:
    """The latest snapshot of the Delta table at `uri` (only to be read) and a dict for facts derived from
    it, opened again only when the log has a newer commit file than last time: the invariants after every
    step read each table several times, and an open replays the log since its checkpoint (on S3 two GETs
    per commit). One listing of the log tells: Delta never rewrites a commit file, so the same newest
    commit file (version and tag: S3's ETag, locally inode, size and modification time) is the same
    snapshot; a table recreated at the path writes other commit files (their contents carry UUIDs and
    times)."""
    newest = max(((int(m.group(1)), tag) for name, tag in storage.list_tagged(storage.join(uri, "_delta_log"))
                  if (m := _COMMIT.match(name))), default=None)
    kept = _snapshots.get(uri)
    if newest is not None and kept is not None and kept[0] == newest:
        return kept[1], kept[2]
    table = open_delta(uri)
    if newest is not None and table.version() == newest[0]:
        _snapshots[uri] = (newest, table, {})
        return table, _snapshots[uri][2]
    return table, {}  # a commit landed between the listing and the open: not kept


def writers(uri: str) -> set:
    """The `laminar.flow` of every commit of the table at `uri` (None for commits without one)."""
    table, facts = latest_snapshot(uri)
    if "writers" not in facts:
        facts["writers"] = {c.get("laminar.flow") for c in table.history()}
    return facts["writers"]


def latest_frame(uri: str):
    """The latest snapshot of the table at `uri` as a pandas frame (read again only when the log moved;
    the caller must not change it)."""
    table, facts = latest_snapshot(uri)
    if "frame" not in facts:
        facts["frame"] = table.to_pandas()
    return facts["frame"]


def _files(root: str) -> list[str]:
    return [storage.normalized(u) if "://" in u else u for u, _ in storage.list_files(root)]


def delta_tables(root: str) -> list[str]:
    """Every Delta table under `root` (folders holding a `_delta_log`)."""
    marker = "/_delta_log/" if "://" in root else os.sep + "_delta_log" + os.sep
    return sorted({f.split(marker, 1)[0] for f in _files(root) if marker in f})


def laminar_tables(root: str, sinks) -> list[str]:
    """The folders of the tables Laminar writes: the given sinks (or stage outputs), state and
    quarantine tables; also those whose first commit has not landed yet (staged files only)."""
    found = [storage.join(root, s) for s in sinks]
    state = storage.join(root, "_laminar", "state")
    found += [storage.join(state, flow, name) for flow in storage.list_dirs(state)
              for name in storage.list_dirs(storage.join(state, flow))]
    quarantine = storage.join(root, "_laminar", "quarantine")
    found += [storage.join(quarantine, name) for name in storage.list_dirs(quarantine)]
    return [t for t in found if (os.path.isdir(storage.local_path(t)) if storage.local_path(t) is not None
                                 else storage.list_files(t))]


def missing_files(table: str) -> list[str]:
    """Files the latest snapshot of `table` names that do not exist."""
    dt, facts = latest_snapshot(table)
    if "file_uris" not in facts:
        facts["file_uris"] = [u.removeprefix("file://") for u in dt.file_uris()]
    named = facts["file_uris"]
    if storage.local_path(table) is not None:
        return [u for u in named if not os.path.exists(u)]
    present = set(_files(table))
    return [u for u in named if storage.normalized(unquote(u)) not in present and storage.normalized(u) not in present]


def assert_lake_intact(root: str) -> None:
    """Every Delta table under `root` (sources too) names only files that exist."""
    broken = {t: m for t in delta_tables(root) if (m := missing_files(t))}
    assert not broken, f"tables name missing files: {broken}"


def orphan_files(table: str) -> list[str]:
    """Parquet files in the table's folder that no entry of its log has ever named (Laminar's tables
    keep every JSON entry, so the log is complete)."""
    named: set[str] = set()
    files = _files(table)
    for entry in files:
        if "_delta_log" in entry and entry.endswith(".json"):
            for line in (storage.read(entry) or b"").decode().splitlines():
                if not line.strip():
                    continue
                action = json.loads(line)
                for kind in ("add", "remove", "cdc"):
                    if kind in action:
                        named.add(storage.join(table, *unquote(action[kind]["path"]).split("/")))
    on_disk = [f for f in files if f.endswith(".parquet") and "_delta_log" not in f]
    return sorted(f for f in on_disk if f not in named and os.path.normpath(f) not in named)


def empty_folders(table: str) -> list[str]:
    """Folders in the table's folder that hold no file at all (a staging nothing came of): local
    folders only, an object store has none."""
    local = storage.local_path(table)
    if local is None:
        return []
    return sorted(d for d, subdirs, names in os.walk(local) if not names and not subdirs and "_delta_log" not in d)


def assert_no_orphans(root: str, sinks) -> None:
    """No table Laminar writes holds a staged file no commit took, or a staging folder left empty."""
    orphans = {t: o for t in laminar_tables(root, sinks) if (o := orphan_files(t) + empty_folders(t))}
    assert not orphans, f"staged files no commit took: {orphans}"
