"""`LocalStore`: a lake in a local folder (plain paths and file:// URIs).

Atomic replace by rename; put-if-absent by a hard link of a complete temporary file (fails if the
name exists, like O_EXCL, and never leaves a half-written file under the name). A tag is the file's
inode, size and modification time: `replace_tagged` and `delete(tag=)` check it and then write, two
steps made one by an exclusive lock of the file's folder (`flock`, which every process and thread of the
machine honours), so of two writers holding one tag exactly one replaces the file, as on an object store.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

import pyarrow.fs as pafs


def local_path(uri: str) -> str | None:
    """The file-system path of a local URI (a plain path or file://), else None."""
    if uri.startswith("file://"):
        return uri[len("file://"):]
    return uri if "://" not in uri else None


def _path(uri: str) -> str:
    path = local_path(uri)
    if path is None:
        raise ValueError(f"{uri}: not a local path")
    return path


class LocalStore:
    """The local file system. It has no options, so one instance serves every local path."""

    schemes: ClassVar[tuple[str, ...]] = ("file",)
    spark_scheme: ClassVar[str | None] = None
    jars: ClassVar[str | None] = None
    object_store: ClassVar[bool] = False

    def __init__(self, options: object = None) -> None:
        del options  # a local folder needs none

    def __eq__(self, other: object) -> bool:
        return type(other) is LocalStore

    def __hash__(self) -> int:
        return hash(LocalStore)

    def __repr__(self) -> str:
        return "LocalStore()"

    def describe(self) -> str:
        return "the local file system"

    # --- reading -------------------------------------------------------------------------------
    def read_tagged(self, uri: str) -> tuple[bytes, str] | None:
        try:
            with open(_path(uri), "rb") as fh:
                data = fh.read()
                st = os.fstat(fh.fileno())
        except FileNotFoundError:
            return None
        return data, _tag(st)

    def exists(self, uri: str) -> bool:
        return os.path.exists(_path(uri))

    def list_files(self, uri: str) -> list[tuple[str, int]]:
        out = []
        for dirpath, _dirs, names in os.walk(_path(uri)):
            for name in names:
                path = os.path.join(dirpath, name)
                try:
                    out.append((path, os.path.getsize(path)))
                except FileNotFoundError:
                    continue
        return sorted(out)

    def list_tagged(self, uri: str, *, after: str = "", until: str | None = None) -> list[tuple[str, str]]:
        local = _path(uri)
        out = []
        for path, _size in self.list_files(uri):
            name = os.path.relpath(path, local).replace(os.sep, "/")
            if name > after and (until is None or name <= until):
                try:
                    out.append((name, _tag(os.stat(path))))
                except FileNotFoundError:
                    continue
        return out

    def some_files(self, uri: str, limit: int) -> list[str]:
        out: list[str] = []
        for dirpath, _dirs, names in os.walk(_path(uri)):
            out += [os.path.join(dirpath, n) for n in sorted(names)[:limit - len(out)]]
            if len(out) >= limit:
                break
        return out

    def list_dirs(self, uri: str) -> list[str]:
        local = _path(uri)
        if not os.path.isdir(local):
            return []
        return sorted(n for n in os.listdir(local) if os.path.isdir(os.path.join(local, n)))

    # --- writing -------------------------------------------------------------------------------
    def write(self, uri: str, data: bytes) -> str:
        local = _path(uri)
        tmp = _temp(local, data)
        tag = _tag(os.stat(tmp))
        os.replace(tmp, local)
        return tag

    def create_tagged(self, uri: str, data: bytes) -> str | None:
        local = _path(uri)
        tmp = _temp(local, data)
        try:
            tag = _tag(os.stat(tmp))  # a hard link shares the inode, size and modification time
            os.link(tmp, local)  # fails if `local` exists: complete or absent, never half-written
            return tag
        except FileExistsError:
            return None
        finally:
            os.remove(tmp)

    def replace_tagged(self, uri: str, data: bytes, tag: str) -> str | None:
        local = _path(uri)
        tmp = _temp(local, data) if os.path.isdir(os.path.dirname(local) or ".") else None
        if tmp is None:
            return None  # no folder, so no file to replace
        try:
            with _folder_locked(local):
                current = self.read_tagged(uri)
                if current is None or current[1] != tag:
                    return None
                new = _tag(os.stat(tmp))
                os.replace(tmp, local)
                tmp = None
                return new
        finally:
            if tmp is not None:
                os.remove(tmp)

    def delete(self, uri: str, *, tag: str | None = None) -> bool:
        local = _path(uri)
        if tag is not None:
            if not os.path.isdir(os.path.dirname(local) or "."):
                return False
            with _folder_locked(local):
                current = self.read_tagged(uri)
                if current is None or current[1] != tag:
                    return False
                return _remove(local)
        return _remove(local)

    def copy(self, source: str, target: str) -> None:
        """A hard link, else a copy."""
        local, into = _path(source), _path(target)
        os.makedirs(os.path.dirname(into) or ".", exist_ok=True)
        try:
            os.link(local, into)
        except OSError:
            shutil.copyfile(local, into)

    def delete_tree(self, uri: str) -> None:
        shutil.rmtree(_path(uri), ignore_errors=True)

    def check_reachable(self, uri: str) -> None:
        return None  # a missing folder is the caller's to judge (a new lake, or a mistyped root)

    def not_answering(self) -> None:
        return None  # a local disk's calls are the kernel's to bound

    # --- what the other clients are given ------------------------------------------------------
    def delta_options(self, uri: str) -> dict[str, str] | None:
        return None

    def filesystem(self, uri: str) -> tuple[pafs.FileSystem, str]:
        return pafs.LocalFileSystem(), os.path.abspath(_path(uri))

    def spark_conf(self, uri: str | None = None) -> dict[str, str]:
        return {}

    def env(self) -> dict[str, str]:
        return {}


def _temp(local: str, data: bytes) -> str:
    """A new file beside `local` holding `data`, flushed to disk (to be renamed or linked into place)."""
    os.makedirs(os.path.dirname(local) or ".", exist_ok=True)
    tmp = f"{local}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    return tmp


def _tag(st: os.stat_result) -> str:
    return f"{st.st_ino}-{st.st_size}-{st.st_mtime_ns}"


def _remove(local: str) -> bool:
    try:
        os.remove(local)
        return True
    except FileNotFoundError:
        return False


@contextmanager
def _folder_locked(local: str) -> Iterator[None]:
    """Hold the exclusive `flock` of the folder of `local` for the block: a check of a file's tag and the write
    that follows it are one step for every writer on this machine (the lock is released when the folder's
    descriptor is closed, also when the process dies)."""
    fd = os.open(os.path.dirname(local) or ".", os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
