"""Where the lake lives: a local folder or an object store (S3 and S3-compatible stores, GCS: `gcs.GcsStore`).

A plain library below both the engine and the checkpoint store: it imports neither. `store` is the
protocol a scheme's store offers (conditional writes instead of an atomic rename, listings, and the
settings deltalake, pyarrow and Spark get); `local`, `s3` and `azure` are the stores; `registry` says which
store serves a URI (its scheme's, and the one mounted for its root); `files` is Laminar's file I/O by
URI on top; `options` says how to reach an S3 store; `copies` keeps local copies of the log files that never
change once written (Delta commits and checkpoints), so a new process on the same machine does not read them again.
"""

from . import copies
from .azure import AzureOptions, AzureStore
from .files import (
    check_reachable,
    copy,
    create,
    create_tagged,
    delete,
    delete_tree,
    delta_options,
    env,
    exists,
    filesystem,
    is_object_store,
    join,
    keep_written,
    list_dirs,
    list_files,
    list_tagged,
    local_path,
    normalized,
    read,
    read_many,
    read_many_immutable,
    read_many_tagged,
    read_tagged,
    remove_empty_dirs,
    replace_if,
    replace_tagged,
    resolve_root,
    some_files,
    spark_conf,
    spark_uri,
    write,
)
from .local import LocalStore
from .options import ObjectStoreOptions
from .registry import SCHEMES, mount, mounted, object_store_classes, store_for, unmount
from .s3 import S3Store
from .store import Store

__all__ = [
    "SCHEMES", "AzureOptions", "AzureStore", "LocalStore", "ObjectStoreOptions", "S3Store", "Store",
    "check_reachable", "copies", "copy", "create", "create_tagged", "delete", "delete_tree", "delta_options", "env",
    "exists", "filesystem", "is_object_store", "join", "keep_written", "list_dirs", "list_files", "list_tagged",
    "local_path", "mount", "mounted", "normalized", "object_store_classes", "read", "read_many", "read_many_immutable",
    "read_many_tagged", "read_tagged", "remove_empty_dirs", "replace_if", "replace_tagged", "resolve_root",
    "some_files", "spark_conf", "spark_uri", "store_for", "unmount", "write",
]
