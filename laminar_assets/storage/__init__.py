"""Where the lake lives: a local folder or an object store (S3 and S3-compatible stores).

A plain library below both the engine and the checkpoint store: it imports neither. `files` is
Laminar's own file I/O by URI, with the conditional writes an object store offers instead of an
atomic rename; `options` says how to reach a store.
"""

from .files import (
    check_reachable,
    configure,
    copy,
    create,
    create_tagged,
    delete,
    delete_tree,
    delta_options,
    exists,
    filesystem,
    is_object_store,
    join,
    list_dirs,
    list_files,
    list_tagged,
    local_path,
    normalized,
    options,
    read,
    read_tagged,
    remove_empty_dirs,
    replace_if,
    replace_tagged,
    resolve_root,
    some_files,
    spark_uri,
    write,
)
from .options import ObjectStoreOptions

__all__ = [
    "ObjectStoreOptions", "check_reachable", "configure", "copy", "create", "create_tagged", "delete", "delete_tree",
    "delta_options", "exists", "filesystem", "is_object_store", "join", "list_dirs", "list_files", "list_tagged",
    "local_path", "normalized", "options", "read", "read_tagged", "remove_empty_dirs", "replace_if", "replace_tagged",
    "resolve_root", "some_files", "spark_uri", "write",
]
