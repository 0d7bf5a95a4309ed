"""Local copies of the objects of a lake that never change once written: Delta commit files and checkpoints.

Every run the daemon launches is a new process, and a new process knew nothing of the logs the last one read:
each run read again, from the object store, the commits of its own tables since their checkpoints and the new
commits of its sources that the sensor had just read to decide on the run (a GET of 20-100 ms each). Here a
process keeps what it reads or writes of such objects on the local disk, and the next process on the machine
reads its copy instead of the store.

Why a copy is the object: a copy is kept under the object's URI and its tag, as the store gives both (S3's
ETag, GCS's generation, Azure's ETag), and served only to a reader that has just listed the object with that
tag. A Delta commit file or checkpoint is never rewritten; a table deleted and recreated at the path writes
other bytes at that name, and the store gives them another tag (a new generation or Azure ETag on every write;
S3's ETag of a single-part upload is the MD5 of the bytes, so the same tag means the same bytes). A copy is
written whole to a temporary name and renamed, and checked against a hash of its bytes when read: a torn or
damaged copy is deleted and the object read from the store.

A table's checkpoint hint (`checkpoint_hint`) is kept here too: the version of the checkpoint the last replay
of the table started from. A reader lists the log from it instead of reading `_last_checkpoint` first (one GET
fewer); the listing proves or disproves it (see `engine/delta/snapshot_cache.py`).

Where: `$LAMINAR_CACHE_DIR` (`off` turns copies off), else `$XDG_CACHE_HOME/laminar`, else `~/.cache/laminar`,
read when a copy is first asked for (never at import). At most `$LAMINAR_CACHE_MAX_MB` megabytes (default
512): the copies read longest ago are deleted first. Local tables are never copied (their reads are cheap).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
import time
from pathlib import Path

from laminar_assets.errors import StorageError

_DIGEST = 32  # bytes of blake2b before each copy's bytes
log = logging.getLogger(__name__)
DEFAULT_MAX_MB = 512
PRUNE_EVERY_SECONDS = 600  # at a process's first write, unless some process pruned this recently
HINT_DAYS = 30


class Copies:
    """The copies kept in one folder, at most `max_bytes` of them."""

    def __init__(self, directory: str | os.PathLike, max_bytes: int = DEFAULT_MAX_MB << 20) -> None:
        self.directory = Path(directory)
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._written_since_prune = 0
        self._checked_prune = False
        self.stats = {"hits": 0, "misses": 0, "kept": 0}

    def _path(self, uri: str, tag: str) -> Path:
        name = hashlib.sha256(f"{uri}\0{tag}".encode()).hexdigest()
        return self.directory / "objects" / name[:2] / name[2:40]

    def get(self, uri: str, tag: str) -> bytes | None:
        """The bytes of the object at `uri` whose tag is `tag`, when a copy is kept; else None."""
        path = self._path(uri, tag)
        try:
            raw = path.read_bytes()
        except OSError:
            self._count("misses")
            return None
        data = raw[_DIGEST:]
        if len(raw) < _DIGEST or _digest(uri, tag, data) != raw[:_DIGEST]:
            _unlink(path)  # torn, damaged, or another object's copy moved here: read from the store
            self._count("misses")
            return None
        try:
            os.utime(path)  # read recently: pruned last
        except OSError:
            pass
        self._count("hits")
        return data

    def put(self, uri: str, tag: str, data: bytes) -> None:
        """Keep a copy of the object at `uri` with tag `tag`. A copy that cannot be written is not kept (the next
        reader reads the store)."""
        path = self._path(uri, tag)
        self._prune_once_in_a_while()
        try:
            if path.exists():
                return
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(_digest(uri, tag, data))
                    fh.write(data)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
        except OSError as exc:
            _warn_once(self.directory, exc)
            return
        self._count("kept")
        with self._lock:
            self._written_since_prune += len(data) + _DIGEST
            due = self._written_since_prune > self.max_bytes // 8
            if due:
                self._written_since_prune = 0
        if due:
            self.prune()

    def _prune_once_in_a_while(self) -> None:
        """`prune` at a process's first write when no process pruned in the last `PRUNE_EVERY_SECONDS` (each run
        the daemon launches is a new process: a count of one process's writes alone would never reach the bound)."""
        with self._lock:
            if self._checked_prune:
                return
            self._checked_prune = True
        marker = self.directory / "pruned"
        try:
            if time.time() - marker.stat().st_mtime < PRUNE_EVERY_SECONDS:
                return
        except OSError:
            pass  # never pruned
        try:
            self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            marker.touch()
        except OSError:
            return
        self.prune()

    def prune(self) -> None:
        """Delete the copies read longest ago until at most three quarters of `max_bytes` are kept, and the
        checkpoint hints of tables no process replayed for `HINT_DAYS` days."""
        files = []
        for path in (self.directory / "objects").glob("*/*"):
            try:
                st = path.stat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, path))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files, key=lambda f: f[0]):
            if total <= self.max_bytes * 3 // 4:
                break
            _unlink(path)
            total -= size
        old = time.time() - HINT_DAYS * 86400
        for path in (self.directory / "hints").glob("*"):
            try:
                if path.stat().st_mtime < old:
                    _unlink(path)
            except OSError:
                continue

    def checkpoint_hint(self, uri: str) -> int | None:
        """The version of the checkpoint the last replay of the table at `uri` started from (-1: from version 0,
        no checkpoint), or None when none is kept."""
        try:
            kept = json.loads(self._hint_path(uri).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(kept, dict) or kept.get("uri") != uri or type(kept.get("checkpoint")) is not int:
            return None  # written by something else, or damaged: the pointer decides
        return kept["checkpoint"]

    def set_checkpoint_hint(self, uri: str, version: int) -> None:
        if self.checkpoint_hint(uri) == version:
            return
        path = self._hint_path(uri)
        try:
            path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".part-")
            with os.fdopen(fd, "w") as fh:
                json.dump({"uri": uri, "checkpoint": version}, fh)
            os.replace(tmp, path)
        except OSError:
            return

    def _hint_path(self, uri: str) -> Path:
        return self.directory / "hints" / hashlib.sha256(uri.encode()).hexdigest()[:40]

    def _count(self, what: str) -> None:
        with self._lock:
            self.stats[what] += 1


def _digest(uri: str, tag: str, data: bytes) -> bytes:
    """The check kept before a copy's bytes: of the object's URI and tag as well, so a copy moved or swapped by hand
    under another object's name fails it."""
    h = hashlib.blake2b(digest_size=_DIGEST)
    h.update(f"{uri}\0{tag}\0".encode())
    h.update(data)
    return h.digest()


_warned: set[str] = set()


def _warn_once(directory: Path, exc: OSError) -> None:
    if str(directory) not in _warned:
        _warned.add(str(directory))
        log.warning("no local copies of Delta log files are kept in %s (%s): runs read them from the store; set "
                    "LAMINAR_CACHE_DIR to a folder this process may write, or to off", directory, exc)


def _unlink(path: Path) -> None:
    try:
        path.unlink(missing_ok=True)
    except OSError:  # a folder this process may read but not change: the copy stays, the read goes to the store
        pass


_lock = threading.Lock()
_by_dir: dict[tuple[str, int], Copies] = {}


def kept() -> Copies | None:
    """The copies of this process's settings (the environment, read now: see the module docstring), or None when
    copies are turned off."""
    setting = os.environ.get("LAMINAR_CACHE_DIR")
    if setting is not None and setting.strip().lower() in ("off", "none", "0", "false", ""):
        return None
    if setting:
        directory = os.path.expanduser(setting)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        directory = os.path.join(base, "laminar")
    limit = os.environ.get("LAMINAR_CACHE_MAX_MB", str(DEFAULT_MAX_MB))
    try:
        max_bytes = int(float(limit) * (1 << 20))
        if max_bytes < 0:
            raise ValueError(limit)
    except (ValueError, OverflowError):  # not a number, negative, or infinite
        raise StorageError(f"LAMINAR_CACHE_MAX_MB is {limit!r}: expected a number of megabytes (0 or more) for the "
                           f"local copies of Delta logs in {directory} (e.g. {DEFAULT_MAX_MB}; LAMINAR_CACHE_DIR=off "
                           "keeps none)") from None
    key = (os.path.abspath(directory), max_bytes)
    with _lock:
        found = _by_dir.get(key)
        if found is None:
            found = _by_dir[key] = Copies(key[0], max_bytes)
        return found
