"""Which `Store` serves a URI: the scheme's class, and the store mounted for the URI's root.

- `SCHEMES`: scheme -> `Store` class. Adding a scheme is one module (a class with the `Store`
  protocol) and its entry here, plus its Spark connector's jars in laminar_assets/engine/spark/jars.py.
- Mounts: an engine (or the Dagster resource) mounts the store built from its options at its root,
  so every URI under that root (its tables, watermarks, leases, uncommitted files) is reached with those
  options, and two engines with different roots and credentials live in one process. A URI under no
  mounted root (a source in another bucket) is reached with the store mounted for its scheme when
  every mount of that scheme has the same options, else with its scheme's default store: options from
  the environment (the AWS variables), read when a client is made. The longest mounted prefix wins; a prefix of just a scheme
  (`s3://`) serves every URI of that scheme that no longer prefix claims (tests, benchmarks). A local
  folder needs no options: every local path has the one `LocalStore`.

Nothing here is read at import time.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from laminar_assets.errors import StorageError

from .azure import AzureStore
from .gcs import GcsStore
from .local import LocalStore
from .options import TimeBounds
from .s3 import S3Store
from .store import Store

SCHEMES: dict[str, type[Store]] = {"file": LocalStore, "s3": S3Store, "s3a": S3Store}
SCHEMES["gs"] = GcsStore  # Google Cloud Storage (gcs.py)
SCHEMES.update(dict.fromkeys(AzureStore.schemes, AzureStore))  # abfss:// (abfs, az, wasbs, wasb: taken to abfss)
# Object-store schemes Laminar knows of but has no `Store` for: refused by name, never taken for a local
# path (gcs://: Google's libraries name the scheme gs://; adl://: Data Lake Storage Gen1, retired).
UNSUPPORTED = ("gcs", "adl")

_lock = threading.Lock()
_mounts: dict[str, Store] = {}  # normalized root prefix -> the store mounted there
_defaults: dict[type, Store] = {}  # a scheme's store for URIs nobody mounted (options from the environment)


def scheme(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else "file"


def store_class(uri: str) -> type[Store]:
    """The `Store` class of `uri`'s scheme; a `StorageError` naming the URI for a scheme Laminar cannot use."""
    s = scheme(uri)
    found = SCHEMES.get(s)
    if found is not None:
        return found
    known = " or ".join(sorted({f"{c.schemes[0]}://" for c in SCHEMES.values() if c.object_store}))
    if s in UNSUPPORTED:
        raise StorageError(
            f"{uri}: {s}:// is not supported yet. Laminar keeps its watermarks and leases with conditional "
            f"writes and tests them on {known}; use {known} (or a compatible store) or a local path", uri=uri)
    raise StorageError(f"{uri}: {s}:// is not a store Laminar knows: use {known} or a local path", uri=uri)


def prefix_of(uri: str) -> str:
    """`uri` as the mount table keys it: its scheme's own name (s3:// for s3a://), no trailing slash,
    an absolute path for a local one; a bare scheme (`s3://`) stays one."""
    cls = store_class(uri)
    if not cls.object_store:
        path = uri[len("file://"):] if uri.startswith("file://") else uri
        return os.path.abspath(path)
    if hasattr(cls, "canonical"):  # a scheme whose URIs have more than one spelling (Azure's hosts)
        return cls.canonical(uri)
    rest = uri.split("://", 1)[1].rstrip("/")
    return f"{cls.schemes[0]}://{rest}"


def build(uri: str, store: Store | TimeBounds | None = None) -> Store:
    """A store for `uri`'s scheme: `store` itself, or one built from options (None: from the environment)."""
    cls = store_class(uri)
    if store is None or not isinstance(store, Store):
        return cls(store)
    if scheme(uri) not in type(store).schemes:
        raise StorageError(f"{uri}: a {type(store).__name__} cannot serve {scheme(uri)}:// URIs", uri=uri)
    return store


def mount(root: str, store: Store | TimeBounds | None = None, *, check: bool = False) -> Store:
    """Reach every URI under `root` with `store` (or one built from these options) from now on, and
    return it. The same settings mounted again keep the store (and its clients); other settings at the
    same root replace it. `check`: first `check_reachable(root)`, so a store that cannot be used is
    never mounted (one clear line instead)."""
    built = build(root, store)
    if check:
        built.check_reachable(root)
    if not built.object_store:
        return built  # a local folder needs no options: every local path has the same store
    key = prefix_of(root)
    with _lock:
        current = _mounts.get(key)
        if current is not None and current == built:
            return current
        _mounts[key] = built
    return built


def unmount(root: str) -> None:
    """Forget the store mounted at `root` (URIs under it go to a shorter mount or the default again)."""
    with _lock:
        _mounts.pop(prefix_of(root), None)


@contextmanager
def mounted(root: str, store: Store | TimeBounds | None) -> Iterator[Store]:
    """`store` mounted at `root` while the block runs; what was mounted there before, after."""
    key = prefix_of(root)
    with _lock:
        before = _mounts.get(key)
    try:
        yield mount(root, store)
    finally:
        with _lock:
            if before is None:
                _mounts.pop(key, None)
            else:
                _mounts[key] = before


def store_for(uri: str) -> Store:
    """The store that serves `uri`: the one mounted at its longest mounted prefix; else, when every
    store mounted for its scheme has the same options, that one (a source in another bucket of the
    store the lake is on, as with one engine or one resource per process); else its scheme's default
    (options from the environment). Raises a `StorageError` for a scheme Laminar cannot use."""
    cls = store_class(uri)
    if cls.object_store and _mounts:
        for key in _ancestors(prefix_of(uri), f"{cls.schemes[0]}://"):
            found = _mounts.get(key)
            if found is not None:
                return found
        same = {store for store in list(_mounts.values()) if type(store) is cls}
        if len(same) == 1:
            return same.pop()
    found = _defaults.get(cls)
    if found is None:
        with _lock:
            found = _defaults.setdefault(cls, cls(None))
    return found


def _ancestors(key: str, root: str) -> Iterator[str]:
    """s3://b/x/y, s3://b/x, s3://b, s3:// (a dict lookup each: no scan of the mount table)."""
    parts = key[len(root):].split("/") if len(key) > len(root) else []
    for i in range(len(parts), 0, -1):
        yield root + "/".join(parts[:i])
    yield root


def mounts() -> dict[str, Store]:
    """A copy of the mount table (root prefix -> store)."""
    with _lock:
        return dict(_mounts)


def object_store_classes() -> list[type[Store]]:
    """Every object-store class in the registry, once each."""
    return list(dict.fromkeys(c for c in SCHEMES.values() if c.object_store))
