"""The app transactions of a table's snapshot, for all of a run's partitions from one read of its log.

A run proves which of its commits landed by app transactions (`laminar/<flow>/<partition>` = the run's
sequence number, docs/ARCHITECTURE.md), and checks them before it writes an intent and again on the snapshot
each commit is based on. `DeltaTable.transaction_version(app)` answers one app and reads the log for it every
time: on an object store that is the checkpoint and every commit file after it, per partition, twice a run.
Here the log segment of the snapshot is read once for all apps, as the Delta protocol lays it out:

    _last_checkpoint                the checkpoint's version C
    C.checkpoint.parquet            its `txn` column: each app's version at C
    C+1.json ... V.json             `txn` actions of the commits since (a later one replaces an earlier one)

and the answer is kept with the open table: the same handle at the same version is not read again, and a
handle moved forward (`snapshot_cache.checkout`) reads only the commits since. Where the log is not laid out
like that (a multi-part or V2 checkpoint, a checkpoint newer than the snapshot, a commit file gone),
`transaction_version` answers, per app.

A commit this process made through a handle is not read back either (`committed`): `deltalake` leaves the handle
at the version it committed on, V, and the commit, made with no retry (`max_commit_retries=0`), is version V+1
exactly: had anyone taken V+1 first, it would have failed. So V+1's app transactions are the ones it carried, and
when the handle is moved over V+1 (the next run's `checkout`, after checking that V's commit file is still the one
it read) they are taken from here instead of a GET of V+1's file (a request each for the state and the sink, every
run).
"""

from __future__ import annotations

import io
import json
import threading
import weakref

import pyarrow.parquet as pq
from deltalake import DeltaTable

from laminar_assets import storage

from .log_snapshot import LogSnapshot

_lock = threading.Lock()
_read: dict[int, tuple[weakref.ref, int, dict[str, int]]] = {}  # id(table) -> (table, version, app -> version)
# id(table) -> (table, V, every app's version at V+1): the commit this process made on the handle at V (`committed`)
_made: dict[int, tuple[weakref.ref, int, dict[str, int]]] = {}


def txn_versions_of(table: DeltaTable, uri: str, apps: list[str]) -> dict[str, int | None]:
    """The version each of `apps` committed to `table`'s snapshot (None: none), from one read of its log.
    `uri`: the table's location as Laminar names it (a path or an object-store URI)."""
    version = table.version()
    if isinstance(table, LogSnapshot):  # replayed from its log: its app transactions are known
        replayed = table.app_versions()
        with _lock:
            for key in [k for k, (ref, *_rest) in _read.items() if ref() is None]:
                del _read[key]
            _read[id(table)] = (weakref.ref(table), version, replayed)
        return {a: replayed.get(a) for a in apps}
    with _lock:
        kept = _read.get(id(table))
    found: dict[str, int] | None
    if kept is not None and kept[0]() is table and kept[1] == version:
        found = kept[2]
    else:
        found = None
        if kept is not None and kept[0]() is table and kept[1] < version:
            # the same handle moved forward (`snapshot_cache.checkout`): the commits since are read, no more;
            # the one this process made on it is known (`committed`)
            since, found = kept[1], dict(kept[2])
            with _lock:
                made = _made.pop(id(table), None)
            if made is not None and made[0]() is table and made[1] == since:
                since, found = since + 1, dict(made[2])
            found = _commits_since(uri, since, version, found)
        if found is None:
            found = _app_versions(uri, version)
        if found is None:  # a log laid out otherwise: deltalake reads it, per app
            return {a: table.transaction_version(a) for a in apps}
        with _lock:
            for key in [k for k, (ref, *_rest) in _read.items() if ref() is None]:
                del _read[key]
            _read[id(table)] = (weakref.ref(table), version, found)
    return {a: found.get(a) for a in apps}


def committed(table: DeltaTable, read_version: int, transactions: dict[str, int]) -> None:
    """`table` (a handle at `read_version`, which `deltalake` leaves there) committed version `read_version` + 1
    with `transactions` (app -> version) and no retry: that commit's app transactions need not be read back when
    the handle moves over it. Known only when this module read the handle's apps at `read_version` (the guard
    before every commit does); else nothing is kept and the commit is read as any other."""
    if table.version() != read_version:
        return
    with _lock:
        kept = _read.get(id(table))
        if kept is None or kept[0]() is not table or kept[1] != read_version:
            return
        for key in [k for k, (ref, *_rest) in _made.items() if ref() is None]:
            del _made[key]
        _made[id(table)] = (weakref.ref(table), read_version, {**kept[2], **transactions})


def made_on(table: DeltaTable) -> bool:
    """Whether this process committed the version after `table`'s through it (`committed` recorded it, and the
    handle has not moved since)."""
    with _lock:
        made = _made.get(id(table))
    return made is not None and made[0]() is table and made[1] == table.version()


def _app_versions(uri: str, version: int) -> dict[str, int] | None:
    """Every app's transaction version at `version` of the table at `uri`, or None when the log is not laid
    out as this reader reads it (see the module docstring)."""
    log = storage.join(uri, "_delta_log")
    found: dict[str, int] = {}
    start = 0
    hint = storage.read(storage.join(log, "_last_checkpoint"))
    if hint is not None:
        try:
            last = json.loads(hint)
            checkpoint = int(last["version"])
        except (ValueError, KeyError, TypeError):
            return None
        if checkpoint > version or last.get("parts") or last.get("v2Checkpoint"):
            return None
        data = storage.read(storage.join(log, f"{checkpoint:020d}.checkpoint.parquet"))
        if data is None:
            return None
        checkpoint_file = pq.ParquetFile(io.BytesIO(data))
        if "txn" in checkpoint_file.schema_arrow.names:
            for txn in checkpoint_file.read(columns=["txn"]).column("txn").to_pylist():
                if txn and txn.get("appId") is not None:
                    found[txn["appId"]] = int(txn["version"])
        start = checkpoint + 1
    return _commits_since(uri, start - 1, version, found)


def _commits_since(uri: str, since: int, version: int, found: dict[str, int]) -> dict[str, int] | None:
    """`found` (every app's version at `since`) with the `txn` actions of commits `since`+1 .. `version`;
    None when one of those commit files is gone or damaged."""
    log = storage.join(uri, "_delta_log")
    versions = range(since + 1, version + 1)
    for text in storage.read_many_immutable([(storage.join(log, f"{v:020d}.json"), None) for v in versions]):
        if text is None:
            return None
        for line in text.decode("utf-8").splitlines():
            if '"txn"' not in line:
                continue
            try:
                txn = json.loads(line).get("txn")
            except ValueError:
                return None  # a damaged entry: deltalake's own reader says what is wrong
            if txn and txn.get("appId") is not None:
                found[txn["appId"]] = int(txn["version"])
    return found
