"""Laminar's own file I/O, on a local folder or an object store, addressed by URI.

Every file Laminar keeps beside the tables (watermarks, leases, sweep progress, uncommitted Parquet
files, Delta log entries it writes itself) goes through these functions, so one code path serves
a local lake and a lake in a bucket. Each function hands its URI to the `Store` that serves it
(`registry.store_for`: the store mounted for the URI's root, else its scheme's default):

    local path or file://...   `LocalStore`: atomic replace by rename, put-if-absent by a hard link (O_EXCL)
    s3://bucket/key (s3a://)   `S3Store`: put-if-absent by `If-None-Match: *`, compare-and-swap by
                               `If-Match: <ETag>` (an object store has no atomic rename)
    abfss://c@acct.dfs.core.windows.net/key   `AzureStore`: the same with Azure's ETags (abfs://, az://,
                               wasb(s):// and the blob host are taken to this form)

`read_tagged` returns a content tag (the ETag, or the file's inode, size and modification time)
that `replace_if` and `delete` take: the write happens only if nobody changed the object since.
On a local disk that check and the write are two steps (two writers on one machine are kept
apart by leases created with O_EXCL); on S3 the store does both in one request.

A store's options (endpoint, credentials) are its own: an engine mounts the store of its root
(`mount`), and a URI nobody mounted is reached with options from the environment
(`ObjectStoreOptions.resolved`), read when a client is first made.
"""

from __future__ import annotations

import contextvars
import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pyarrow.fs as pafs

from . import copies
from .local import local_path
from .registry import SCHEMES, UNSUPPORTED, mount, mounted, mounts, object_store_classes, scheme, store_class, store_for, unmount
from .store import Store

__all__ = ["Store", "local_path", "mount", "mounted", "scheme", "store_for", "unmount"]  # re-exported


# --- which store -----------------------------------------------------------------------------
def is_object_store(uri: str) -> bool:
    """True for an object-store URI (s3://, s3a://, gs://); raises a clear `StorageError` naming the URI for
    object stores Laminar has no `Store` for (abfss://, ...). Any other scheme is not an object
    store (False): a URI another library resolves (a deletion vector stored by absolute URI)."""
    if scheme(uri) not in SCHEMES and scheme(uri) not in UNSUPPORTED:
        return False
    return store_class(uri).object_store


def normalized(uri: str) -> str:
    """The URI Laminar keeps: its scheme's own name (s3:// for s3a://), no trailing slash."""
    uri = uri.rstrip("/")
    cls = SCHEMES.get(scheme(uri))
    if cls is None or not cls.object_store:
        return uri
    if hasattr(cls, "canonical"):  # a scheme whose URIs have more than one spelling (Azure's hosts)
        return cls.canonical(uri)
    return f"{cls.schemes[0]}://{uri.split('://', 1)[1]}"


def resolve_root(root: str) -> str:
    """A storage root as Laminar keeps it: an absolute path, or a normalized object-store URI; a
    `StorageError` naming the root for a URI that is neither (hdfs://...)."""
    if is_object_store(root):
        return normalized(root)
    path = local_path(root)
    if path is None:
        from laminar_assets.errors import StorageError

        known = " or ".join(sorted({f"{c.schemes[0]}://" for c in object_store_classes()}))
        raise StorageError(f"{root}: {scheme(root)}:// is not a storage root Laminar supports: use a local path "
                           f"(or file://) or {known}", uri=root)
    return os.path.abspath(path)


def join(uri: str, *parts: str) -> str:
    """`uri` and path parts, with '/' (object stores) or the OS separator (local paths)."""
    if local_path(uri) is not None and "://" not in uri:
        return os.path.join(uri, *parts)
    return "/".join([uri.rstrip("/"), *[p.strip("/") for p in parts]])


def spark_uri(uri: str) -> str:
    """The URI Spark reads and writes: file:// for local paths, the connector's scheme (s3a://) for an
    object store."""
    local = local_path(uri)
    if local is not None:
        return f"file://{os.path.abspath(local)}"
    cls = SCHEMES.get(scheme(uri))
    if cls is None or not cls.spark_scheme:
        return uri
    store = store_for(uri)
    if hasattr(store, "spark_uri"):  # the store decides (Azure: abfs:// on an emulator's blob host)
        return store.spark_uri(uri)
    return f"{cls.spark_scheme}://{uri.split('://', 1)[1]}"


def delta_options(uri: str) -> dict[str, str] | None:
    """`storage_options` for deltalake on `uri` (None for a local table)."""
    return store_for(uri).delta_options(uri)


def filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    """A pyarrow filesystem and the path within it, for Parquet reads and writes."""
    return store_for(uri).filesystem(uri)


def spark_conf(uri: str | None = None, *, schemes: tuple[str, ...] | None = None) -> dict[str, str]:
    """Spark settings that reach the store of `uri` (its bucket's own keys, e.g. `fs.s3a.bucket.<b>.*`).
    Without a URI, the settings a Spark started now should have: each object-store scheme's default (or
    scheme-wide mount) and the per-bucket keys of every mounted root; `schemes` limits them to those
    schemes (the ones whose connector jars are installed)."""
    if uri is not None:
        return store_for(uri).spark_conf(uri)
    out: dict[str, str] = {}
    for cls in object_store_classes():
        if schemes is None or cls.schemes[0] in schemes:
            out.update(store_for(f"{cls.schemes[0]}://").spark_conf())
    for root, store in mounts().items():
        if (schemes is None or scheme(root) in schemes) and root.split("://", 1)[1]:
            out.update(store.spark_conf(root))
    return out


def env(uri: str | None = None) -> dict[str, str]:
    """The options of `uri`'s store (without a URI, of each object-store scheme's default or scheme-wide
    mount) as environment variables, for a process Laminar starts (a Spark Connect server)."""
    if uri is not None:
        return store_for(uri).env()
    out: dict[str, str] = {}
    for cls in object_store_classes():
        out.update(store_for(f"{cls.schemes[0]}://").env())
    return out


# --- reading ---------------------------------------------------------------------------------
def read(uri: str) -> bytes | None:
    """The object's bytes, or None when it does not exist."""
    found = read_tagged(uri)
    return found[0] if found else None


# At most this many of `read_many`'s reads in flight at once (threads: each waits on its request's latency).
READS_SIDE_BY_SIDE = 8


def read_many(uris: Sequence[str]) -> list[bytes | None]:
    """`read` of each of `uris`, in their order. On an object store they go side by side (at most
    `READS_SIDE_BY_SIDE` at once), each in a copy of the caller's context: the same requests as reading them one
    after another, without waiting on each one's latency in turn (a log's commits since its checkpoint, about 20
    ms apiece on S3). On a local disk one after another. The first failure, in order, is raised."""
    return [found[0] if found else None for found in read_many_tagged(uris)]


def read_many_tagged(uris: Sequence[str]) -> list[tuple[bytes, str] | None]:
    """`read_tagged` of each of `uris`, in their order, side by side as `read_many`."""
    if len(uris) < 2 or not all(is_object_store(u) for u in uris):
        return [read_tagged(u) for u in uris]
    with ThreadPoolExecutor(min(READS_SIDE_BY_SIDE, len(uris)), thread_name_prefix="laminar-reads") as pool:
        return list(pool.map(lambda u: contextvars.copy_context().run(read_tagged, u), uris))


def read_many_immutable(items: Sequence[tuple[str, str | None]]) -> list[bytes | None]:
    """`read_many` of objects that never change once written (Delta commit files, checkpoints), each given with
    the tag a listing just gave it (None: not known): on an object store an object whose copy this machine keeps
    under that tag is read from the copy (`copies`), the others from the store side by side, and kept (under the
    tag the read gave). Local files are read as `read_many` reads them."""
    uris = [u for u, _ in items]
    kept = copies.kept() if uris and all(is_object_store(u) for u in uris) else None
    if kept is None:
        return read_many(uris)
    keys = [_copy_key(u) for u in uris]
    out: list[bytes | None] = [kept.get(k, t) if t is not None else None for k, (_u, t) in zip(keys, items)]
    missing = [i for i, data in enumerate(out) if data is None]
    for i, found in zip(missing, read_many_tagged([uris[i] for i in missing])):
        if found is not None:
            out[i] = found[0]
            kept.put(keys[i], found[1], found[0])
    return out


def _copy_key(uri: str) -> str:
    """What a copy of the object at `uri` is kept under (with its tag): the URI and the store that serves it, so the
    same bucket and key on two endpoints (two emulators, a store and its mirror) are never taken for each other."""
    return f"{store_for(uri).describe()}|{uri}"


def keep_written(uri: str, tag: str | None, data: bytes) -> None:
    """Keep a copy of an object this process just wrote and will never rewrite (a Delta commit file) under the tag
    the write gave, for the next process on this machine that lists it (`read_many_immutable`)."""
    if tag is not None and is_object_store(uri) and (kept := copies.kept()) is not None:
        kept.put(_copy_key(uri), tag, data)


def read_tagged(uri: str) -> tuple[bytes, str] | None:
    """The object's bytes and a tag of this version of it (for `replace_if`), or None."""
    return store_for(uri).read_tagged(uri)


def exists(uri: str) -> bool:
    return store_for(uri).exists(uri)


def list_files(uri: str) -> list[tuple[str, int]]:
    """(URI, size) of every file under the folder `uri`, at any depth, sorted."""
    return store_for(uri).list_files(uri)


def list_tagged(uri: str, *, after: str = "", until: str | None = None) -> list[tuple[str, str]]:
    """(name, tag) of the files directly or deeper under the folder `uri` whose names (relative to it)
    sort after `after` and, when given, not after `until`, in name order. The tags are those
    `read_tagged` gives. On S3 one listing request per 1000 names, starting at `after` (StartAfter):
    what a folder holds before it costs nothing."""
    return store_for(uri).list_tagged(uri, after=after, until=until)


def some_files(uri: str, limit: int) -> list[str]:
    """Up to `limit` files under the folder `uri`, at any depth (URIs; which ones is unspecified): whether a
    folder holds anything, and examples of what, without listing all of a large one."""
    return store_for(uri).some_files(uri, limit)


def list_dirs(uri: str) -> list[str]:
    """The names of the folders directly under `uri`."""
    return store_for(uri).list_dirs(uri)


# --- writing ---------------------------------------------------------------------------------
def write(uri: str, data: bytes) -> str:
    """Replace the object with `data`, atomically: a reader sees the old bytes or the new ones.
    Returns the new object's tag (as `read_tagged` would give it), from the write's own answer."""
    return store_for(uri).write(uri, data)


def create(uri: str, data: bytes) -> bool:
    """Write `data` only if the object does not exist yet; False when it does (put-if-absent)."""
    return create_tagged(uri, data) is not None


def create_tagged(uri: str, data: bytes) -> str | None:
    """`create`, returning the tag of the object written (as `read_tagged` would give it) without
    reading it back: on S3 the PUT's answer carries the ETag. None when the object exists."""
    return store_for(uri).create_tagged(uri, data)


def replace_if(uri: str, data: bytes, tag: str) -> bool:
    """Write `data` only if the object is still the version `read_tagged` tagged; False otherwise."""
    return replace_tagged(uri, data, tag) is not None


def replace_tagged(uri: str, data: bytes, tag: str) -> str | None:
    """`replace_if`, returning the new object's tag (None when the object changed or is gone)."""
    return store_for(uri).replace_tagged(uri, data, tag)


def delete(uri: str, *, tag: str | None = None) -> bool:
    """Delete the object (only the version `tag` names, when given). False when `tag` is given and the
    object changed or is gone (without a tag, S3 answers alike whether it was there or not)."""
    return store_for(uri).delete(uri, tag=tag)


def copy(source: str, target: str) -> None:
    """Copy an object within one store (server-side on S3; a hard link, else a copy, on a local disk)."""
    store = store_for(target)
    if store_for(source) is not store:
        from laminar_assets.errors import StorageError

        raise StorageError(f"{source} -> {target}: a copy stays within one store ({store_for(source).describe()} "
                           f"and {store.describe()} are two)", uri=target)
    store.copy(source, target)


def delete_tree(uri: str) -> None:
    """Delete every file under the folder `uri` (an uncommitted folder no commit took)."""
    store_for(uri).delete_tree(uri)


def remove_empty_dirs(uri: str, up_to: str) -> None:
    """Remove `uri` and its parents while empty, up to (not including) `up_to` (local folders only:
    an object store has no folders)."""
    local, stop = local_path(uri), local_path(up_to)
    if local is None or stop is None:
        return
    stop = os.path.abspath(stop)
    current = os.path.abspath(local)
    while current.startswith(stop + os.sep):
        try:
            os.rmdir(current)
        except OSError:  # not empty (another write's files), or gone
            return
        current = os.path.dirname(current)


# --- checks ------------------------------------------------------------------------------------
def check_reachable(uri: str) -> None:
    """Raise a `StorageError` that says what to fix, within seconds, when the store of `uri` cannot
    be reached, refuses the credentials or has no such bucket. Writes nothing."""
    store_for(uri).check_reachable(uri)
