"""Delta snapshots opened once per process and shared by the readers that ask for the same one.

A run's steps (threads of one process) read the same tables: every flow of the demo graph reads
`normalized_trades` at the same version, and a run's checks open the sinks its steps just wrote.
Opening a snapshot replays the log since the last checkpoint, every time. Here a snapshot is
opened once and handed to every reader of that table version.

Only read-only handles come from here (`tables.open_table`); writers open their own tables,
because a commit through a `DeltaTable` moves that object to the new version.

Why a cached snapshot is not stale: an entry is keyed by the table's path, its version, a hash of
that version's commit file and the identity (inode, size, modification time) of the log's first
commit file. Delta never rewrites a commit file, and the commits Delta writers make are unique: they
name the data files they add (file names carry UUIDs), a table's first commit holds the table's UUID,
and commits carry their time in milliseconds. So a table deleted and recreated at the same path has
another commit file at that version and another first commit file, and misses. Only a log written
by hand that repeats the old commit byte for byte, on a first commit file that the file system gave
the same inode, size and modification time (times are as fine as the kernel's clock tick), would be
served the old snapshot. A request for the latest version lists the log first (what `deltalake`
does as well) and opens exactly the version found, so a commit landing meanwhile is not mistaken for
the one listed. Not cached: versions whose commit file log clean-up has removed. On an object store
the check is the tag (ETag, generation) of the version's commit file, from one listing of the log
(`_open_remote`, below).

Each request reads and hashes the commit file it asks for, hit or miss: much less than an open,
which parses that file and more.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace

from deltalake import DeltaTable
from deltalake.exceptions import DeltaError, TableNotFoundError

from laminar_assets import storage
from laminar_assets.errors import SourceNotFoundError

from . import log_snapshot, transactions

# Snapshots kept (least recently used dropped first). A snapshot of a large table holds its file
# list in memory; a run touches a few tables at one or two versions each.
MAX_SNAPSHOTS = 8
# A snapshot is shared for this long after it was opened; older entries are dropped at the next
# request. The readers that gain are a run's steps, seconds apart; a long-lived process (the code
# server evaluating sensors) does not keep sharing, and keeping alive, snapshots of old versions.
KEEP_SECONDS = 120.0
_COMMIT = re.compile(r"^(\d{20})\.json$")

_lock = threading.Lock()
_entries: OrderedDict[tuple, tuple[Future, float]] = OrderedDict()  # key -> (table, opened at)
_stats = {"opened": 0, "shared": 0, "adopted": 0}


def open_snapshot(uri: str, version: int | None, opener: Callable[[str, int | None], DeltaTable]) -> DeltaTable:
    """The snapshot of the table at `uri` at `version` (latest if None), opened by `opener(uri,
    version)` unless an identical one is open already. The returned table must only be read."""
    if storage.is_object_store(uri):
        return _open_remote(uri, version, opener)
    key = _key(uri, version)
    if key is None:
        return opener(uri, version)
    with _lock:
        now = time.monotonic()
        for old in [k for k, (_, at) in _entries.items() if now - at > KEEP_SECONDS]:
            del _entries[old]
        held = _entries[key][0] if key in _entries else None
        mine = held is None
        entry: Future = Future() if held is None else held
        if mine:
            _entries[key] = (entry, now)
            while len(_entries) > MAX_SNAPSHOTS:
                _entries.popitem(last=False)
        else:
            _entries.move_to_end(key)
            _stats["shared"] += 1
    if not mine:
        return entry.result()  # opened by another reader (or being opened: wait for it)
    try:
        table = opener(uri, key[1])
    except BaseException as exc:
        with _lock:  # not cached: the next reader tries again and gets its own error
            if key in _entries and _entries[key][0] is entry:
                del _entries[key]
        entry.set_exception(exc)
        raise
    with _lock:
        _stats["opened"] += 1
    entry.set_result(table)
    return table


# --- object stores: snapshots shared by tag --------------------------------------------------------------------
#
# A run's readers of a table it does not write (its asset's metadata, a preview, the checks after it: the sink the
# run just committed, a source's schema) each opened the latest snapshot afresh on an object store: the pointer, a
# listing and every commit since the last checkpoint twice, 16 requests for a table 7 commits past it, up to seven
# times in one step and its checks. Here such a snapshot is kept with the tag (ETag, generation) of its version's
# commit file, and a reader of the latest version lists the log from the newest version kept (one request, S3
# StartAfter): that version's commit file still with that tag is the same table (a table recreated at the path has
# another commit file there, the argument of `_key`), and the newest commit listed is the latest version. A
# snapshot at it is shared; a newer version is opened at exactly the version listed. A reader of a given version
# lists from it the same way. A snapshot whose version's tag is not known (log clean-up took the commit file) is
# not kept. Same bounds as the local snapshots: `MAX_SNAPSHOTS`, `KEEP_SECONDS`. A snapshot not kept here but
# whose handle a run gave back to the pool (below) is taken from there and moved to the version asked for
# (`_adopt`): the run's readers after its commit read that commit, not the table's whole log since its checkpoint.

_remote: OrderedDict[tuple[str, int], tuple[DeltaTable, str, float]] = OrderedDict()  # (uri, version) -> (table, tag, at)


def _open_remote(uri: str, version: int | None, opener: Callable[[str, int | None], DeltaTable]) -> DeltaTable:
    now = time.monotonic()
    with _lock:
        for old in [k for k, (_t, _tag, at) in _remote.items() if now - at > KEEP_SECONDS]:
            del _remote[old]
        known = {v: (table, tag) for (u, v), (table, tag, _at) in _remote.items() if u == uri}
    target, tag = version, None
    if version is not None or known:
        since = version if version is not None else max(known)
        listed = log_tail(uri, since)
        if version is None and listed.get(since) != known[since][1]:  # another table at the path, or its log gone
            _forget_remote(uri)
            listed, known = Listed(), {}
        if listed:
            target = version if version is not None else max(listed)
            tag = listed.get(target)
            if tag is not None and target in known and known[target][1] == tag:
                with _lock:
                    _stats["shared"] += 1
                    if (uri, target) in _remote:
                        _remote.move_to_end((uri, target))
                return known[target][0]
    adopted = _adopt(uri, version, listed if (version is not None or known) else None)
    if adopted is not None:
        table, tag = adopted
    else:
        table = opener(uri, target)
        if tag is None:  # opened at the latest version without a listing: its commit file's tag, from one listing
            tag = log_tail(uri, table.version()).get(table.version())
    with _lock:
        _stats["adopted" if adopted is not None else "opened"] += 1
        if tag is not None and table.version() == (target if target is not None else table.version()):
            _remote[(uri, table.version())] = (table, tag, now)
            while len(_remote) > MAX_SNAPSHOTS:
                _remote.popitem(last=False)
    return table


def _adopt(uri: str, version: int | None, listed: Listed | None) -> tuple[DeltaTable, str] | None:
    """A handle a run committed through and gave back to the pool (`give_back`), taken out of it and moved to
    `version` (the latest when None) for readers to share, with the tag of that version's commit file; None when
    the pool holds none that can be (the caller opens the table). The readers after a run (its asset's metadata, a preview, the
    checks) ask for the version the run just committed: moving the run's handle over that commit reads it
    (a listing from the handle's version, the commit twice), where an open reads the checkpoint and every commit
    since (13-15 requests for a table a few commits past its checkpoint). The handle leaves the pool for good:
    shared readers may hold it, so no run moves it again; a process that runs again later opens its own (each
    run the daemon launches is a process of its own)."""
    # the handle the run committed through, when the run held more than one of the table (a stage's intent and
    # its pass each check one out)
    held = _take(uri, prefer=lambda h: transactions.made_on(h.table))
    if held is None:
        return None
    if held.base != held.version or held.tag is None or not transactions.made_on(held.table):
        # only a handle this process committed through (a run's state or sink): a source's handle, which the next
        # run of a long-lived process derives its snapshot from, stays in the pool
        give_back_held(uri, held)
        return None
    if not listed or held.version not in listed:
        listed = log_tail(uri, held.version)
    if listed.get(held.version) != held.tag:  # another table at the path, or its log cleaned up: not this one
        return None
    target = version if version is not None else max(listed)
    if target < held.version or target not in listed:  # an older version: the handle cannot move back
        give_back_held(uri, held)
        return None
    if target != held.version:
        try:
            held.table.load_as_version(target)
        except (DeltaError, OSError, ValueError):  # e.g. log clean-up raced the move: the caller opens the table
            return None
    return held.table, listed[target]


def _forget_remote(uri: str) -> None:
    with _lock:
        for key in [k for k in _remote if k[0] == uri]:
            del _remote[key]


def stats() -> dict[str, int]:
    """Snapshots opened and shared so far in this process (for tests and the benchmark)."""
    with _lock:
        return dict(_stats)


def clear() -> None:
    """Forget every snapshot and pooled handle (tests; a process that deleted tables it will recreate need
    not)."""
    with _lock:
        _entries.clear()
        _remote.clear()
        _pool.clear()


def _key(uri: str, version: int | None) -> tuple | None:
    """(path, version, hash of the version's commit file, identity of the first commit file), or
    None when the snapshot cannot be checked cheaply: not a local table, no log, or the version's
    commit file is gone (expired history; opened as asked, uncached)."""
    path = storage.local_path(uri)
    if path is None:
        return None
    log = os.path.join(path, "_delta_log")
    if version is None:
        try:
            with os.scandir(log) as it:
                versions = [int(m.group(1)) for e in it if (m := _COMMIT.match(e.name))]
        except OSError:
            return None
        if not versions:
            return None
        version = max(versions)
    try:
        with open(os.path.join(log, f"{version:020d}.json"), "rb") as fh:
            digest = hashlib.blake2b(fh.read(), digest_size=16).digest()
    except OSError:
        return None
    return (os.path.realpath(path), version, digest, _first_commit(log))


def _first_commit(log: str) -> tuple | None:
    """Inode, size and modification time of version 0's commit file (or, once log clean-up removed
    it, of the checkpoint pointer, which changes more often: only more misses)."""
    for name in (f"{0:020d}.json", "_last_checkpoint"):
        try:
            st = os.stat(os.path.join(log, name))
        except OSError:
            continue
        return (name, st.st_ino, st.st_size, st.st_mtime_ns)
    return None


# --- object stores: a run's handle at the latest version, moved forward from the last run's -----------------
#
# On an object store, opening a table at its latest version replays (with `deltalake`) every commit since the
# last checkpoint, reading each commit file twice: about 80 requests for a source 40 commits past its checkpoint,
# on every run, though a run's change is a few commits. A handle at version V moves to the latest version L by
# reading only the commits in (V, L] (`DeltaTable.load_as_version`), but moving a handle changes it for everyone
# holding it, and `deltalake` cannot copy one. So the handles here are held by one run at a time: `checkout`
# takes a handle out of the pool (or opens one), `give_back` returns it when the run is done with it. A run
# that finds none free (another run holds it) opens its own, and the pool keeps both afterwards. Sources and
# Laminar's own tables (state, sink) alike: a commit through a handle leaves it at its version (`deltalake`),
# and the next checkout moves it over that commit too.
#
# Why a handle moved forward is the table's latest snapshot: the handle was opened (or moved) to version V when
# the log's commit file of V had the tag (ETag) kept with it. `checkout` lists the log from V (one request,
# StartAfter): V's commit file still there with that tag means the same table (a table deleted and recreated at
# the path has another commit file at V: its commits name the data files they add, whose names carry UUIDs, and
# their time in milliseconds; the same argument as `_key`'s for local tables), and the newest commit listed is
# the latest version. Commit files are never rewritten, so the commits up to V the handle holds are the table's.
#
# A source is not moved at all over commits that only appended files (`checkout_appended`), the common change:
# moving costs `deltalake` a listing and two reads of each new commit, and the run reads each of them anyway for
# its history (`tables.source_history`). Read once here, a commit of only add actions (no remove, change data,
# metadata, protocol or domain action, no deletion vector) leaves the schema, configuration, protocol and id of
# the table as they were, and its snapshot is the one before plus the files it added: the run's snapshot is the
# handle's (at its version, the base) and the add actions since (`Held.appended`, listed by
# `tables.snapshot_files` as a commit's files are read). The chain of appended commits is kept with the handle in
# the pool; a commit of another kind moves the handle over all of them (the cost deferred, paid once), and a
# checkpoint among the new commits opens the table afresh from it (its commits since, read twice), which ends
# the chain, as `MAX_APPENDED` does for a table that never checkpoints.
#
# A process that holds no handle of a source yet (every run the daemon launches is a new process) derives the
# same way from the source's last checkpoint (`_from_checkpoint`): the handle is opened at the checkpoint's
# version (or at version 0 when the log has no checkpoint pointer), which reads the checkpoint and no commit
# after it, and the commits since are read once each, side by side, as appends. Opening at the latest version
# instead reads every commit since the checkpoint twice (`deltalake` replays the log once for the protocol and
# metadata, once for the files): 2N requests one after another where this makes N side by side, and the run
# reads the newest of them for its history anyway. A commit since the checkpoint that is not an append moves the
# handle over them as `checkout` does.

MAX_POOLED = 32  # handles kept, over all tables (least recently given back dropped first): a run holds three or so
# Appended commits a source's snapshot derives from the handle's (`checkout_appended`) before the handle is moved
# over them: a bound on the memory and the parsing of the files they add, for a source that never checkpoints.
MAX_APPENDED = 200
_CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(\.\d{10}\.\d{10})?(\.[^.]+)?\.parquet$")


@dataclass
class Held:
    """A snapshot of an object-store table at its latest version, `version`, as one run holds it: the handle
    `table` at version `base`, and when `base` < `version` the add actions of the commits in (`base`,
    `version`] (`appended`), each commit only adding files (`checkout_appended`). `tag`: of `version`'s commit
    file (None: not known). `entries`: commit files read ({version: bytes}) for the run's own reader of the log
    (not read again): those this checkout read, and those of the appended commits, kept with the chain."""

    table: DeltaTable
    base: int
    version: int
    tag: str | None
    appended: tuple[tuple[int, dict], ...] = ()
    entries: dict[int, bytes] = field(default_factory=dict)


class Listed(dict):
    """{version: tag} of a log's commit files from one listing (`log_tail`), and the versions of the
    checkpoints it listed (`checkpoints`)."""

    checkpoints: frozenset[int] = frozenset()
    # {version: tag} of the single-file checkpoints listed (`{version}.checkpoint.parquet`)
    checkpoint_tags: dict[int, str] = {}


_pool: OrderedDict[int, tuple[str, Held]] = OrderedDict()  # id -> (uri, held)
_pool_stats = {"moved": 0, "opened": 0, "reused": 0, "appended": 0, "from_checkpoint": 0, "replayed": 0}


def _take(uri: str, prefer: Callable[[Held], bool] | None = None) -> Held | None:
    """The pooled handle of `uri` at the newest version (among those `prefer` accepts, when some are), taken out."""
    with _lock:
        mine = [k for k, (u, _held) in _pool.items() if u == uri]
        if prefer is not None and (preferred := [k for k in mine if prefer(_pool[k][1])]):
            mine = preferred
        return _pool.pop(max(mine, key=lambda k: _pool[k][1].version))[1] if mine else None


def _count(what: str) -> None:
    with _lock:
        _pool_stats[what] += 1


def checkout(uri: str, opener: Callable[[str, int | None], DeltaTable], *,
             listed: dict[int, str] | None = None, replay: bool = False) -> tuple[DeltaTable, str | None]:
    """A handle of the object-store table at `uri` at its latest version that the caller holds alone (hand it
    back with `give_back`), and the tag of that version's commit file
    (None: not known). A pooled handle of the table is moved forward (the commits since its version are read);
    else the table is opened with `opener(uri, None)`, or with `replay` (a table Laminar writes) replayed from
    its log by Laminar when it can be (`log_snapshot`: the log read once, not three times). `listed`:
    {version: tag} of every commit file from some version on, as the caller listed them just before
    (`log_tail`): not listed again when they reach back to the pooled handle's version."""
    held = _checkout(uri, opener, listed, derive=False, replay=replay)
    return held.table, held.tag


def checkout_appended(uri: str, opener: Callable[[str, int | None], DeltaTable], *,
                      listed: dict[int, str] | None = None) -> Held:
    """`checkout` for a table the run only reads (a source): when every commit since the pooled snapshot only
    added files (an append: commit info, add actions without a deletion vector, app transactions), the handle is
    not moved over them (`deltalake` reads each commit twice to move it); the snapshot at the latest version is
    the handle's and the files those commits added, read once here (a GET each, which the run's reader of the
    log then uses: `Held.entries`). Another kind of commit, or more than `MAX_APPENDED` of them, moves the
    handle as `checkout` does; a checkpoint listed among the new commits opens the table afresh from it (that
    costs the commits since the checkpoint, and ends the chain of appended commits). Give it back with
    `give_back_held`."""
    return _checkout(uri, opener, listed, derive=True)


def _checkout(uri: str, opener, listed: dict[int, str] | None, *, derive: bool, replay: bool = False) -> Held:
    held = _take(uri)
    entries: dict[int, bytes] = {}
    if held is not None:
        if not listed or not min(listed) <= held.version <= max(listed):
            listed = log_tail(uri, held.version)
        if listed.get(held.version) == held.tag:
            latest = max(listed)
            if latest == held.version and (derive or held.base == held.version):
                _count("reused")
                return held
            checkpointed = derive and any(held.base < c <= latest for c in getattr(listed, "checkpoints", ()))
            if derive and not checkpointed and latest - held.base <= MAX_APPENDED:
                actions, entries = _appends(uri, held.version, latest, listed)
                if actions is not None:
                    _count("appended")
                    return Held(held.table, held.base, latest, listed[latest], held.appended + actions,
                                {**held.entries, **entries})
            if not checkpointed:
                try:
                    held.table.load_as_version(latest)
                except Exception:  # noqa: BLE001  (e.g. log clean-up raced the move: open as usual below)
                    pass
                else:
                    _count("moved")
                    return Held(held.table, latest, latest, listed[latest], (), entries)
    elif derive and (based := _from_checkpoint(uri, opener, listed)) is not None:
        return based
    elif replay and (replayed := _replayed(uri)) is not None:
        replayed.take_entries_read()  # a table the run writes: no history of it is read
        _count("replayed")
        return Held(replayed, replayed.version(), replayed.version(), replayed.tag, (), {})
    table = opener(uri, None)
    _count("opened")
    if not listed or not min(listed) <= table.version() <= max(listed):
        listed = log_tail(uri, table.version())
    return Held(table, table.version(), table.version(), listed.get(table.version()), (), entries)


def _from_checkpoint(uri: str, opener, listed: dict[int, str] | None) -> Held | None:
    """A source's snapshot at its latest version for a process that holds no handle of it: the handle opened at
    the version of the log's last checkpoint (`_last_checkpoint`; version 0 when there is none) and the commits
    since read once each (`_appends`); when one of them is not an append, the handle moved over them. None when
    this cannot be done (no log, a pointer that is not the protocol's, more than `MAX_APPENDED` commits since,
    a base version the log no longer holds): the caller opens the table at its latest version.

    A log Laminar replays (`_replayed`: no deletion vectors, single-file checkpoints, ...) is replayed to its
    latest version instead: the checkpoint (or the commits from version 0) and each commit since read once, where
    `deltalake`'s open at the checkpoint's version reads the pointer and lists the log again and reads the
    checkpoint's commit twice; a machine that read them before reads its copies (`storage.copies`)."""
    try:
        replayed = _replayed(uri)
    except TableNotFoundError:
        return None  # no log: the caller's open says so
    if replayed is not None:
        _count("from_checkpoint")
        latest = replayed.version()
        return Held(replayed, latest, latest, replayed.tag, (), replayed.take_entries_read())
    pointer = storage.read(storage.join(uri, "_delta_log", "_last_checkpoint"))
    try:
        base = int(json.loads(pointer)["version"]) if pointer is not None else 0
    except (ValueError, KeyError, TypeError):
        return None
    if not listed or not min(listed) <= base <= max(listed):
        listed = log_tail(uri, base)
    if not listed or (pointer is None and 0 not in listed):  # no log, or version 0 cleaned up without a pointer
        return None
    latest = max(listed)
    if latest < base or latest - base > MAX_APPENDED:
        return None
    try:
        table = opener(uri, base)
    except (DeltaError, OSError, ValueError, SourceNotFoundError):  # e.g. log clean-up took the base: open as usual
        return None
    if table.version() != base:
        return None
    _count("from_checkpoint")
    if latest == base:
        return Held(table, base, base, listed.get(base), (), {})
    actions, entries = _appends(uri, base, latest, listed)
    if actions is not None:
        return Held(table, base, latest, listed[latest], actions, entries)
    table.load_as_version(latest)  # a commit since did more than append: the handle moves over them
    return Held(table, latest, latest, listed[latest], (), entries)


def _replayed(uri: str) -> log_snapshot.LogSnapshot | None:
    """The table at `uri` at its latest version, replayed from its log (`log_snapshot`): the checkpoint pointer,
    one listing from the checkpoint, the checkpoint and the commits since, read once each (from this machine's
    copies when it read or wrote them before: `storage.copies`). None when the log is not laid out as that reader
    replays it (the caller opens the table with `deltalake`). Raises `TableNotFoundError` when there is no log at
    all.

    The pointer is not read when this machine replayed the table before (`Copies.checkpoint_hint`): the log is
    listed from the checkpoint that replay started from, and the newest checkpoint listed (or, with none, version
    0) is where this one starts. That is the table's state whatever the pointer says: any checkpoint and the
    commits after it replay to the same snapshot, and a listing from version H holds every checkpoint and commit
    from H on. A hint the listing does not bear out (no checkpoint from H on; a log recreated without version 0;
    a checkpoint in parts) is dropped for the pointer."""
    kept = storage.copies.kept()
    hint = kept.checkpoint_hint(uri) if kept is not None else None
    if hint is not None:
        snapshot = _replayed_from(uri, log_tail(uri, max(hint, 0)), hint)
        if snapshot is not None:
            return snapshot
    pointer = storage.read(storage.join(uri, "_delta_log", "_last_checkpoint"))
    checkpoint: int | None = None
    if pointer is not None:
        try:
            hint = json.loads(pointer)
            checkpoint = int(hint["version"])
        except (ValueError, KeyError, TypeError):
            return None
        if hint.get("parts") or hint.get("v2Checkpoint"):
            return None
    listed = log_tail(uri, checkpoint if checkpoint is not None else 0)
    if pointer is None and not listed and not listed.checkpoints:
        raise TableNotFoundError(f"no Delta table at {uri}: its log holds no commit")
    if checkpoint is not None and checkpoint not in listed.checkpoints:
        return None
    state = log_snapshot.replay(uri, listed, checkpoint)
    if state is None:
        return None
    if kept is not None:
        kept.set_checkpoint_hint(uri, checkpoint if checkpoint is not None else -1)
    return log_snapshot.LogSnapshot(uri, state, listed.get(state.version))


def _replayed_from(uri: str, listed: Listed, hint: int) -> log_snapshot.LogSnapshot | None:
    """`_replayed` from a listing of the log from checkpoint `hint` (-1: version 0) on, without the pointer; None
    when the listing does not bear the hint out."""
    newest = max(listed.checkpoints, default=None)
    if newest is not None:
        if newest not in listed.checkpoint_tags:  # in parts, or a V2 checkpoint: the pointer says which
            return None
        checkpoint: int | None = newest
    elif hint < 0 and 0 in listed:
        checkpoint = None
    else:
        return None
    state = log_snapshot.replay(uri, listed, checkpoint)
    if state is None:
        return None
    kept = storage.copies.kept()
    if kept is not None and checkpoint != hint:
        kept.set_checkpoint_hint(uri, checkpoint if checkpoint is not None else -1)
    return log_snapshot.LogSnapshot(uri, state, listed.get(state.version))


def _appends(uri: str, since: int, latest: int, listed: dict[int, str]
             ) -> tuple[tuple[tuple[int, dict], ...] | None, dict[int, bytes]]:
    """The add actions of the commits in (`since`, `latest`] when each of them only added files (None as soon as
    one did more, or is gone), and the commit files read. `listed`: their tags, from the listing that found them
    (a commit this machine read before is read from its copy: `storage.read_many_immutable`)."""
    actions: list[tuple[int, dict]] = []
    entries: dict[int, bytes] = {}
    versions = range(since + 1, latest + 1)
    # read side by side; every one is kept (the run's reader of the log takes them), so a commit past one that
    # ends the chain is not read in vain
    read = storage.read_many_immutable([(storage.join(uri, "_delta_log", f"{v:020d}.json"), listed.get(v))
                                        for v in versions])
    entries.update({v: data for v, data in zip(versions, read) if data is not None})
    for version, data in zip(versions, read):
        found = log_snapshot.commit_actions(data) if data is not None else None
        if found is None:  # gone, or a damaged entry: deltalake's own reader says what is wrong
            return None, entries
        for kind, body in found:
            if kind == "add" and isinstance(body, dict) and not body.get("deletionVector") and body.get("path"):
                actions.append((version, body))
            elif kind not in ("commitInfo", "txn"):
                return None, entries  # a remove, change data, metadata, protocol, domain metadata, ...
    return tuple(actions), entries


def give_back(uri: str, table: DeltaTable, version: int, tag: str | None) -> None:
    """Return a handle from `checkout` (at `version`, whose commit file has `tag`): the next run of this
    process moves it forward instead of opening the table again. The caller must not use it any more. A commit
    through the handle leaves it where it was (`deltalake` does not move it); a handle that moved anyway (an
    operation that reloads it) is dropped, since `tag` names another version's file."""
    give_back_held(uri, Held(table, version, version, tag))


def give_back_held(uri: str, held: Held) -> None:
    """Return a snapshot from `checkout_appended` (or `checkout`); see `give_back`."""
    if held.tag is None or held.table.version() != held.base:
        return
    with _lock:
        # the appended commits' files stay with the chain (immutable files of this table, as the tag of its
        # newest says): the next run of another flow reads none of them again
        _pool[id(held.table)] = (uri, replace(held, entries={v: b for v, b in held.entries.items() if v > held.base}))
        _pool.move_to_end(id(held.table))
        while len(_pool) > MAX_POOLED:
            _pool.popitem(last=False)


def pool_stats() -> dict[str, int]:
    """Pooled handles opened, moved forward and reused as they were (for tests and the benchmark)."""
    with _lock:
        return dict(_pool_stats)


def log_tail(uri: str, version: int) -> Listed:
    """{version: tag} of the commit files of the table at `uri` from `version` on, from one listing of its log
    that starts there (S3: StartAfter; what the log holds before costs nothing), and the checkpoints listed."""
    after = f"{version - 1:020d}.json" if version > 0 else ""
    found = Listed()
    checkpoints = set()
    single: dict[int, str] = {}
    for name, tag in storage.list_tagged(storage.join(uri, "_delta_log"), after=after):
        match = _COMMIT.match(name)
        if match and int(match.group(1)) >= version:
            found[int(match.group(1))] = tag
        elif (point := _CHECKPOINT.match(name)) and int(point.group(1)) >= version:
            checkpoints.add(int(point.group(1)))
            if point.group(2) is None and point.group(3) is None:
                single[int(point.group(1))] = tag
    found.checkpoints = frozenset(checkpoints)
    found.checkpoint_tags = single
    return found
