"""`Store`: what Laminar needs from the place a lake lives, one implementation per URI scheme.

Laminar never renames a file to publish it and never relies on a disk shared by the driver and the
executors: it coordinates through a store's conditional writes and Delta commits. So a store offers
exactly these, on URIs of its scheme (`uri` is always a whole URI: s3://bucket/key, or a local path):

    read_tagged      the bytes and a tag of this version (an ETag; GCS's generation; inode, size and
                     mtime locally)
    create_tagged    write only if absent (put-if-absent): S3 `If-None-Match: *`, GCS `ifGenerationMatch=0`,
                     O_EXCL locally
    replace_tagged   write only if still the version a tag names (compare-and-swap): S3 `If-Match`, GCS
                     `ifGenerationMatch=<generation>`
    write            replace unconditionally, atomically (a reader sees the old bytes or the new)
    delete           (only the version a tag names, when given)
    list_*           files (with sizes, or with tags from a name on), folders, a few examples
    copy, delete_tree, check_reachable
    not_answering    fail calls at once for a while: the store was just found not answering

Every call is bounded in time (an object store's options say how: `options.ObjectStoreOptions`):
a store that stops answering fails the call with a one-line `StoreUnavailableError` naming the
endpoint and the object, never hangs it.

and the settings the scheme hands to the other clients that read and write the same files: deltalake's
`storage_options`, a pyarrow `FileSystem` (Parquet files, Delta log entries) and Spark's Hadoop
settings. Spark's settings are per bucket (`fs.s3a.bucket.<b>.*`) when a URI is given, so stores
with different endpoints or credentials coexist in one Spark session.

A store instance carries its own options (endpoint, credentials); nothing is process-wide. Which
store serves a URI is `laminar_assets.storage.registry`'s business: a scheme's class (one module and
one registry entry per scheme), and the store an engine or a resource mounted for its root.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable


@runtime_checkable
class Store(Protocol):
    """Laminar's file I/O on one scheme, with the options it was built with (see the module's docstring)."""

    # The URI schemes this store serves; the first is the one Laminar keeps (s3:// for s3a://).
    schemes: ClassVar[tuple[str, ...]]
    # The scheme Spark's connector reads (s3a); None: Spark reads the store's paths as they are (file://).
    spark_scheme: ClassVar[str | None]
    # The jar group Spark needs for it (laminar_assets/engine/spark/jars.py, installed by
    # laminar_assets/deploy/jar_installer.py); None: none.
    jars: ClassVar[str | None]
    # An object store (no folders, no rename; conditional writes instead).
    object_store: ClassVar[bool]

    def __init__(self, options: Any = None) -> None:
        """A store reached with `options`, its scheme's options (`TimeBounds` and the scheme's own fields; None:
        from the environment when a client is made): the registry builds a scheme's store from its class."""

    def describe(self) -> str:
        """Where the store is, for messages (no secrets)."""

    # --- reading -------------------------------------------------------------------------------
    def read_tagged(self, uri: str) -> tuple[bytes, str] | None:
        """The object's bytes and a tag of this version of it, or None when it does not exist."""

    def exists(self, uri: str) -> bool: ...

    def list_files(self, uri: str) -> list[tuple[str, int]]:
        """(URI, size) of every file under the folder `uri`, at any depth, sorted."""

    def list_tagged(self, uri: str, *, after: str = "", until: str | None = None) -> list[tuple[str, str]]:
        """(name relative to `uri`, tag) of the files under `uri` named after `after` and not after `until`."""

    def some_files(self, uri: str, limit: int) -> list[str]:
        """Up to `limit` files under the folder `uri` (which ones is unspecified)."""

    def list_dirs(self, uri: str) -> list[str]:
        """The names of the folders directly under `uri`."""

    # --- writing -------------------------------------------------------------------------------
    def write(self, uri: str, data: bytes) -> str:
        """Replace the object atomically; the new object's tag."""

    def create_tagged(self, uri: str, data: bytes) -> str | None:
        """Write only if the object does not exist; its tag, or None when it exists."""

    def replace_tagged(self, uri: str, data: bytes, tag: str) -> str | None:
        """Write only if the object is still the version `tag` names; the new tag, or None."""

    def delete(self, uri: str, *, tag: str | None = None) -> bool:
        """Delete the object (only the version `tag` names, when given); False when that version is gone."""

    def copy(self, source: str, target: str) -> None:
        """Copy an object within the store."""

    def delete_tree(self, uri: str) -> None:
        """Delete every file under the folder `uri`."""

    def check_reachable(self, uri: str) -> None:
        """A one-line `StorageError` within seconds when `uri`'s store cannot be used; writes nothing."""

    def not_answering(self) -> None:
        """Another client found the store not answering: for one call's time budget, fail this store's
        calls at once (`StoreUnavailableError`) instead of waiting the budget out again on each, so a
        run on a hung store fails within one budget, not one per clean-up call."""

    # --- what the other clients are given ------------------------------------------------------
    def delta_options(self, uri: str) -> dict[str, str] | None:
        """`storage_options` for deltalake on `uri` (None: none needed)."""

    def filesystem(self, uri: str) -> tuple[Any, str]:
        """A pyarrow `FileSystem` and the path of `uri` within it."""

    def spark_conf(self, uri: str | None = None) -> dict[str, str]:
        """Spark settings (`spark.hadoop.*`) that reach this store: for `uri`'s bucket only when given
        (so buckets on different stores coexist in one session), else for the whole scheme."""

    def env(self) -> dict[str, str]:
        """The options as environment variables, for a process Laminar starts (a Spark Connect server)."""
