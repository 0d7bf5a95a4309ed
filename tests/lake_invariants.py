"""Invariants of a lake after any step, for the tests: every file a table names exists, and no run
leaves uncommitted files that no commit took. Independent of the engine's own integrity check, which a
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
_entries: dict[tuple[str, str], frozenset[str]] = {}  # (log entry URI, tag) -> the data files it names


class LakeView:
    """Every object under a lake's root with its tag, from one listing (on a bucket one request per
    1000 objects), for the checks after one step: each derives the tables, a table's files and its
    newest commit from it instead of listing the folders it looks at again. On S3 those listings were
    most of a stateful step's requests; nothing writes while the checks run, so one listing serves all."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.tags = dict(storage.list_tagged(root))  # name relative to the root -> tag

    def names(self, uri: str) -> list[tuple[str, str]]:
        """(name relative to `uri`, tag) of every object under the folder `uri` (inside the root)."""
        if uri == self.root:
            return list(self.tags.items())
        assert uri.startswith(self.root), (uri, self.root)
        prefix = uri[len(self.root):].strip("/").replace(os.sep, "/") + "/"
        return [(n[len(prefix):], t) for n, t in self.tags.items() if n.startswith(prefix)]

    def newest_commit(self, table: str) -> tuple[int, str] | None:
        return max(((int(m.group(1)), tag) for name, tag in self.names(table)
                    if name.startswith("_delta_log/") and (m := _COMMIT.match(name[len("_delta_log/"):]))),
                   default=None)


def latest_snapshot(uri: str, view: LakeView | None = None) -> tuple[DeltaTable, dict]:
    """The latest snapshot of the Delta table at `uri` (only to be read) and a dict for facts derived from
    it, opened again only when the log has a newer commit file than last time: the invariants after every
    step read each table several times, and an open replays the log since its checkpoint (on S3 two GETs
    per commit). The newest commit file tells (from `view`, a listing of the lake just made, else from
    one listing of the log): Delta never rewrites a commit file, so the same newest commit file (version
    and tag: S3's ETag, locally inode, size and modification time) is the same snapshot; a table
    recreated at the path writes other commit files (their contents carry UUIDs and times)."""
    newest = view.newest_commit(uri) if view is not None else max(
        ((int(m.group(1)), tag) for name, tag in storage.list_tagged(storage.join(uri, "_delta_log"))
         if (m := _COMMIT.match(name))), default=None)
    kept = _snapshots.get(uri)
    if newest is not None and kept is not None and kept[0] == newest:
        return kept[1], kept[2]
    table = open_delta(uri)
    if newest is not None and table.version() == newest[0]:
        _snapshots[uri] = (newest, table, {})
        return table, _snapshots[uri][2]
    return table, {}  # a commit landed between the listing and the open: not kept


def writers(uri: str, view: LakeView | None = None) -> set:
    """The `laminar.flow` of every commit of the table at `uri` (None for commits without one)."""
    table, facts = latest_snapshot(uri, view)
    if "writers" not in facts:
        facts["writers"] = {c.get("laminar.flow") for c in table.history()}
    return facts["writers"]


def latest_frame(uri: str, view: LakeView | None = None):
    """The latest snapshot of the table at `uri` as a pandas frame (read again only when the log moved;
    the caller must not change it)."""
    table, facts = latest_snapshot(uri, view)
    if "frame" not in facts:
        facts["frame"] = table.to_pandas()
    return facts["frame"]


def _files(root: str, view: LakeView | None = None) -> list[str]:
    if view is not None:
        return [storage.join(root, *name.split("/")) for name, _ in view.names(root)]
    return [storage.normalized(u) if "://" in u else u for u, _ in storage.list_files(root)]


def delta_tables(root: str, view: LakeView | None = None) -> list[str]:
    """Every Delta table under `root` (folders holding a `_delta_log`)."""
    marker = "/_delta_log/" if "://" in root else os.sep + "_delta_log" + os.sep
    return sorted({f.split(marker, 1)[0] for f in _files(root, view) if marker in f})


def laminar_tables(root: str, sinks, view: LakeView | None = None) -> list[str]:
    """The folders of the tables Laminar writes: the given sinks (or stage outputs), state and
    quarantine tables; also those whose first commit has not landed yet (uncommitted files only)."""
    found = [storage.join(root, s) for s in sinks]
    state = storage.join(root, "_laminar", "state")
    quarantine = storage.join(root, "_laminar", "quarantine")
    if view is not None:  # the folders two levels under state/, one under quarantine/, that hold an object
        found += sorted({storage.join(state, *n.split("/")[:2]) for n, _ in view.names(state) if n.count("/") >= 2})
        found += sorted({storage.join(quarantine, n.split("/")[0]) for n, _ in view.names(quarantine) if "/" in n})
        return [t for t in found if view.names(t)]
    found += [storage.join(state, flow, name) for flow in storage.list_dirs(state)
              for name in storage.list_dirs(storage.join(state, flow))]
    found += [storage.join(quarantine, name) for name in storage.list_dirs(quarantine)]
    return [t for t in found if (os.path.isdir(storage.local_path(t)) if storage.local_path(t) is not None
                                 else storage.list_files(t))]


def missing_files(table: str, view: LakeView | None = None) -> list[str]:
    """Files the latest snapshot of `table` names that do not exist."""
    dt, facts = latest_snapshot(table, view)
    if "file_uris" not in facts:
        facts["file_uris"] = [u.removeprefix("file://") for u in dt.file_uris()]
    named = facts["file_uris"]
    if storage.local_path(table) is not None:
        return [u for u in named if not os.path.exists(u)]
    present = set(_files(table, view))
    return [u for u in named if storage.normalized(unquote(u)) not in present and storage.normalized(u) not in present]


def assert_lake_intact(root: str, view: LakeView | None = None) -> None:
    """Every Delta table under `root` (sources too) names only files that exist."""
    broken = {t: m for t in delta_tables(root, view) if (m := missing_files(t, view))}
    assert not broken, f"tables name missing files: {broken}"


def orphan_files(table: str, view: LakeView | None = None) -> list[str]:
    """Parquet files in the table's folder that no entry of its log has ever named (Laminar's tables
    keep every JSON entry, so the log is complete). A log entry is read once per tag (Delta never
    rewrites one; a table recreated at the path writes new ones)."""
    named: set[str] = set()
    listed = view.names(table) if view is not None else [
        (name, tag) for name, tag in storage.list_tagged(table)]
    for name, tag in listed:
        if name.startswith("_delta_log/") and name.endswith(".json"):
            entry = storage.join(table, *name.split("/"))
            if (entry, tag) not in _entries:
                paths = set()
                for line in (storage.read(entry) or b"").decode().splitlines():
                    action = json.loads(line) if line.strip() else {}
                    for kind in ("add", "remove", "cdc"):
                        if kind in action:
                            paths.add(storage.join(table, *unquote(action[kind]["path"]).split("/")))
                _entries[(entry, tag)] = frozenset(paths)
            named |= _entries[(entry, tag)]
    on_disk = [storage.join(table, *n.split("/")) for n, _ in listed if n.endswith(".parquet") and "_delta_log" not in n]
    return sorted(f for f in on_disk if f not in named and os.path.normpath(f) not in named)


def empty_folders(table: str) -> list[str]:
    """Folders in the table's folder that hold no file at all (a write nothing came of): local
    folders only, an object store has none."""
    local = storage.local_path(table)
    if local is None:
        return []
    return sorted(d for d, subdirs, names in os.walk(local) if not names and not subdirs and "_delta_log" not in d)


def assert_no_orphans(root: str, sinks, view: LakeView | None = None) -> None:
    """No table Laminar writes holds an uncommitted file no commit took, or a write's folder left empty."""
    orphans = {t: o for t in laminar_tables(root, sinks, view) if (o := orphan_files(t, view) + empty_folders(t))}
    assert not orphans, f"uncommitted files no commit took: {orphans}"
