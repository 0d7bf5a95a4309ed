"""Snapshots of the tables Laminar writes (state, sinks), replayed from their logs by Laminar, on object stores.

Opening a table with `deltalake` on an object store reads the checkpoint pointer, lists the log and reads every
commit since the checkpoint twice; the run then lists the log again (the tag of its version's commit file) and
reads those commits a third time (their app transactions). For a table two commits past its checkpoint that is ten
requests, for the state and again for the sink of every run in a new process (each run the daemon launches).
Here the log is read once, as the Delta protocol lays it out:

    _last_checkpoint                 the checkpoint's version C (none: the log starts at version 0)
    one listing from C               the commit files since, with their tags
    C.checkpoint.parquet             add, remove, metaData, protocol and txn actions at C
    C+1.json ... V.json              the actions of each commit since, read side by side

and replayed (a later metaData, protocol or app transaction replaces an earlier one; a remove cancels its add):
four requests for that table. A pooled snapshot moves forward by reading the commits since, once each.

Only logs laid out plainly are replayed: a single-file checkpoint with statistics as JSON, commits of add, remove,
metaData, protocol, txn, commitInfo, cdc and domainMetadata actions, no deletion vector. Anything else gives None,
and the caller opens the table with `deltalake` as before. The tables Laminar creates qualify.

A `LogSnapshot` is a `DeltaTable`: what Laminar asks of the tables it writes (version, metadata, schema, protocol,
app transactions, the add actions: `tables.snapshot_files`) comes from the replay; anything else (a write
transaction, a dataset, the history) is served by a `deltalake` table opened at the same version on first use,
so every method answers as `deltalake` would.
"""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
from deltalake import DeltaTable, Schema
from deltalake.table import Metadata, ProtocolVersions

from laminar_assets import storage

# The actions a replayed commit may hold; any other (e.g. a checkpoint-only `sidecar`, a feature's action this
# reader does not know) leaves the table to `deltalake`.
# Commits replayed after a checkpoint (or from version 0) at most: a log seldom checkpointed is opened by deltalake,
# and a replay's commit files, kept for the run's history, stay bounded in memory.
MAX_COMMITS = 200
_KNOWN = frozenset({"add", "remove", "metaData", "protocol", "txn", "commitInfo", "cdc", "domainMetadata"})
_OWN = frozenset({"_uri", "_replay", "_tag", "_lock", "_opened", "_made"})


def commit_actions(data: bytes) -> list[tuple[str, Any]] | None:
    """(kind, body) of each action in a commit file's JSON lines; None when a line is not one action (a damaged
    entry: `deltalake`'s own reader says what is wrong with it)."""
    out = []
    for line in data.decode("utf-8").splitlines():
        if not line.strip():
            continue
        try:
            action = json.loads(line)
        except ValueError:
            return None
        if not isinstance(action, dict) or len(action) != 1:
            return None
        out.append(next(iter(action.items())))
    return out


@dataclass
class Replay:
    """A table's state at `version` from its log: the latest metaData and protocol actions, each app's
    transaction version, and the live add actions by path, as the log writes it (a remove cancels the add of the
    same string, as `deltalake` matches them)."""

    version: int
    metadata: dict
    protocol: dict
    txns: dict[str, int] = field(default_factory=dict)
    adds: dict[str, dict] = field(default_factory=dict)
    # the commit files this replay read ({version: bytes}; not carried over by `copy`), for a reader of the same
    # commits' changes (a source's history) that would read them again
    entries: dict[int, bytes] = field(default_factory=dict, compare=False, repr=False)

    def copy(self) -> Replay:
        return Replay(self.version, dict(self.metadata), dict(self.protocol), dict(self.txns), dict(self.adds))

    def apply(self, version: int, data: bytes) -> bool:
        """Apply commit `version` (its JSON lines); False when it holds what this reader does not replay (nothing
        of it is kept then: the caller drops this replay)."""
        actions = commit_actions(data)
        if actions is None:
            return False  # a damaged entry: deltalake's own reader says what is wrong
        for kind, body in actions:
            if kind not in _KNOWN or not isinstance(body, dict):
                return False
            if not self._action(kind, body):
                return False
        self.version = version
        return True

    def _action(self, kind: str, body: dict) -> bool:
        if kind == "add":
            if body.get("deletionVector") or not body.get("path"):
                return False
            self.adds[body["path"]] = body
        elif kind == "remove":
            if body.get("deletionVector") or not body.get("path"):
                return False
            self.adds.pop(body["path"], None)
        elif kind == "metaData":
            self.metadata = body
        elif kind == "protocol":
            self.protocol = body
        elif kind == "txn":
            if body.get("appId") is None:
                return False
            self.txns[str(body["appId"])] = int(body["version"])
        return True  # commitInfo, cdc (change data: not part of the snapshot), domainMetadata


def _checkpoint(data: bytes, version: int) -> Replay | None:
    """The replay at a single-file checkpoint (its Parquet bytes); None when its add actions carry statistics
    only as a struct (`stats_parsed`) or a deletion vector, or it lacks metaData or protocol, or is not Parquet
    (damaged: pyarrow raises `ArrowInvalid`, a `ValueError`, or an `OSError` for some footers; deltalake's reader
    says what is wrong)."""
    try:
        return _checkpoint_of(pq.ParquetFile(io.BytesIO(data)), version)
    except OSError:
        return None


def _checkpoint_of(file: pq.ParquetFile, version: int) -> Replay | None:
    names = set(file.schema_arrow.names)
    if not {"add", "metaData", "protocol"} <= names:
        return None
    add_type = file.schema_arrow.field("add").type
    add_fields = {add_type.field(i).name for i in range(add_type.num_fields)}
    if "stats" not in add_fields and "stats_parsed" in add_fields:
        return None
    table = file.read(columns=[c for c in ("add", "metaData", "protocol", "txn", "sidecar", "checkpointMetadata")
                               if c in names])
    if any(table.column(c).null_count != table.num_rows for c in ("sidecar", "checkpointMetadata") if c in names):
        return None  # a V2 checkpoint: its file actions may live in sidecar files
    metadata = next((m for m in table.column("metaData").to_pylist() if m), None)
    protocol = next((p for p in table.column("protocol").to_pylist() if p), None)
    if metadata is None or protocol is None:
        return None
    replay = Replay(version, _plain(metadata), _plain(protocol))
    if "txn" in table.column_names:
        for txn in table.column("txn").to_pylist():
            if txn and txn.get("appId") is not None:
                replay.txns[str(txn["appId"])] = int(txn["version"])
    for add in table.column("add").to_pylist():
        if not add:
            continue
        if add.get("deletionVector") or not add.get("path"):
            return None
        add = _plain(add)
        replay.adds[add["path"]] = add
    return replay


def _plain(action: dict) -> dict:
    """A checkpoint's action as its JSON form holds it: maps (pyarrow's lists of pairs) as dicts, nulls left out."""
    out = {}
    for k, v in action.items():
        if v is None:
            continue
        if k in ("partitionValues", "configuration", "tags") and isinstance(v, list):
            v = {a: b for a, b in v}
        out[k] = v
    return out


def replay(uri: str, listed: Mapping[int, str], checkpoint: int | None) -> Replay | None:
    """The table at `uri` at the newest version of `listed` ({version: tag} of its commit files from `checkpoint`
    on, or from 0 when None), from the checkpoint's file and the commits after it, read side by side; None when
    a file is gone, damaged, or the log is not laid out as this reader replays it (`deltalake` says what is
    wrong with a damaged one)."""
    try:
        return _replay(uri, listed, checkpoint)
    except (KeyError, TypeError, ValueError, AttributeError):  # a damaged action (pyarrow's errors are ValueErrors)
        return None


def _replay(uri: str, listed: Mapping[int, str], checkpoint: int | None) -> Replay | None:
    if not listed:
        return None
    latest = max(listed)
    start = checkpoint if checkpoint is not None else 0
    if latest < start or any(v not in listed for v in range(start + 1, latest + 1)):
        return None
    if latest - start > MAX_COMMITS:  # a log that is seldom checkpointed: deltalake's open, as before
        return None
    log = storage.join(uri, "_delta_log")
    if checkpoint is not None:
        versions = list(range(checkpoint + 1, latest + 1))
        uris = [(storage.join(log, f"{checkpoint:020d}.checkpoint.parquet"),
                 getattr(listed, "checkpoint_tags", {}).get(checkpoint))]
    else:
        if 0 not in listed:
            return None
        versions = list(range(0, latest + 1))
        uris = []
    # files this machine read before (under the tags just listed) are read from their copies
    read = [data for data in storage.read_many_immutable(
        uris + [(storage.join(log, f"{v:020d}.json"), listed.get(v)) for v in versions]) if data is not None]
    if len(read) != len(uris) + len(versions):  # a file gone (log clean-up): deltalake opens it
        return None
    state = _checkpoint(read[0], checkpoint) if checkpoint is not None else Replay(-1, {}, {})
    if state is None:
        return None
    for version, data in zip(versions, read[len(uris):]):
        if not state.apply(version, data):
            return None
    state.entries = dict(zip(versions, read[len(uris):]))
    if not state.metadata or not state.protocol:
        return None
    if "v2Checkpoint" in (state.protocol.get("readerFeatures") or ()):
        return None  # its checkpoints may keep the file actions in sidecar files: deltalake's
    if int(state.protocol.get("minReaderVersion", 1)) > 3:
        return None  # a reader protocol after table features: deltalake refuses it, or knows it
    return state


class LogSnapshot(DeltaTable):
    """A `DeltaTable` at `replay.version` answered from Laminar's replay of its log (see the module docstring).
    `tag`: of that version's commit file, from the listing the replay read (None: not known)."""

    def __init__(self, uri: str, state: Replay, tag: str | None) -> None:  # noqa: D107  (no deltalake open)
        self._uri = uri
        self._replay = state
        self._tag = tag
        self._lock = threading.Lock()
        self._opened: DeltaTable | None = None
        self._made: tuple[int, bytes] | None = None  # the commit this process made on this snapshot

    def __getattr__(self, name: str) -> Any:
        # Only attributes a `DeltaTable` sets in its own constructor (`_table`, `_storage_options`, ...) reach
        # here: they are the deltalake table's at this version, opened on first use.
        if name in _OWN or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self._deltalake(), name)

    def _deltalake(self) -> DeltaTable:
        with self._lock:
            if self._opened is not None and self._opened.version() != self._replay.version:
                self._opened = None  # moved by an operation through it (`alter` moves deltalake's handle)
            if self._opened is None:
                self._opened = DeltaTable(self._uri, version=self._replay.version,
                                          storage_options=storage.delta_options(self._uri))
            return self._opened

    @property
    def table_uri(self) -> str:
        return self._uri

    @property
    def tag(self) -> str | None:
        return self._tag

    def take_entries_read(self) -> dict[int, bytes]:
        """The commit files the replay that made this snapshot read ({version: bytes}), handed over once (the
        snapshot keeps none of them after)."""
        taken, self._replay.entries = self._replay.entries, {}
        return taken

    def version(self) -> int:
        return self._replay.version

    def metadata(self) -> Metadata:
        m = self._replay.metadata
        out = Metadata.__new__(Metadata)
        # the fields deltalake's wrapper reads, from the metaData action
        out._metadata = SimpleNamespace(  # type: ignore[assignment]
            id=m.get("id"), name=m.get("name"), description=m.get("description"),
            partition_columns=list(m.get("partitionColumns") or []), created_time=m.get("createdTime"),
            configuration={k: v for k, v in (m.get("configuration") or {}).items() if v is not None})
        return out

    def schema(self) -> Schema:
        return Schema.from_json(self._replay.metadata["schemaString"])

    def protocol(self) -> ProtocolVersions:
        p = self._replay.protocol
        return ProtocolVersions(int(p["minReaderVersion"]), int(p["minWriterVersion"]),
                                p.get("writerFeatures"), p.get("readerFeatures"))

    def transaction_version(self, app_id: str) -> int | None:
        return self._replay.txns.get(app_id)

    def app_versions(self) -> dict[str, int]:
        """Every app's transaction version at this snapshot."""
        return dict(self._replay.txns)

    def add_actions(self) -> list[dict]:
        """The live add actions, as the log writes them (statistics as JSON)."""
        return list(self._replay.adds.values())

    def made(self, version: int, entry: bytes) -> None:
        """This process wrote commit `version` (the next one: `entry`, its bytes) on this snapshot: a move over
        it applies them instead of reading the file back."""
        if version == self._replay.version + 1:
            self._made = (version, entry)

    def move_to(self, version: int, read: Callable[[list[int]], list[bytes | None]], tag: str | None) -> bool:
        """Move forward to `version` by applying the commits since (`read(versions)`: their bytes, except the one
        this process made on it, `made`); False (the snapshot unchanged) when one is gone or holds what this reader
        does not replay."""
        if version < self._replay.version:
            return False
        versions = list(range(self._replay.version + 1, version + 1))
        known = dict([self._made]) if self._made is not None else {}
        unknown = [v for v in versions if v not in known]
        found = {**dict(zip(unknown, read(unknown) if unknown else [])), **known}
        state = self._replay.copy()
        for v in versions:
            data = found.get(v)
            try:
                if data is None or not state.apply(v, data):
                    return False
            except (KeyError, TypeError, ValueError, AttributeError):  # a damaged action
                return False
        with self._lock:
            self._replay, self._tag, self._opened, self._made = state, tag, None, None
        return True

    def load_as_version(self, version: Any) -> None:
        if not isinstance(version, int) or not self.move_to(version, self._commits, None):
            raise ValueError(f"cannot move the replayed snapshot of {self._uri} from version {self.version()} "
                             f"to {version!r}")

    def _commits(self, versions: list[int]) -> list[bytes | None]:
        log = storage.join(self._uri, "_delta_log")
        return storage.read_many_immutable([(storage.join(log, f"{v:020d}.json"), None) for v in versions])

    def update_incremental(self) -> None:
        """Move to the latest version (as `deltalake`'s does: its optimize calls it after committing)."""
        names = [n for n, _tag in storage.list_tagged(storage.join(self._uri, "_delta_log"),
                                                      after=f"{self._replay.version:020d}.json")]
        versions = [int(n[:20]) for n in names if len(n) == 25 and n.endswith(".json") and n[:20].isdigit()]
        if versions and not self.move_to(max(versions), self._commits, None):
            raise ValueError(f"cannot move the replayed snapshot of {self._uri} from version {self.version()} "
                             f"to {max(versions)}")
