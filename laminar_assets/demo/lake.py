"""The demo's lake: the demo starts from an empty root, and deletes only a lake it made itself.

The first thing the demo writes into a root is a marker, `_laminar/demo-lake.json`. A later demo on
the same root deletes everything under it (a folder, or every key under an S3 prefix) and starts
again; a root that holds anything else and no marker (a real lake, a home folder, a bucket's data)
is refused before anything is deleted or written.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

from laminar_assets import storage
from laminar_assets.errors import LaminarError

MARKER = "_laminar/demo-lake.json"
_EXAMPLES = 3  # files named in the refusal


def check_demo_root(root: str) -> bool:
    """Whether `root` holds a lake the demo made (True) or nothing at all (False); raises a `LaminarError`
    naming the root and what it holds when it holds anything else. Reads only."""
    local = storage.local_path(root)
    if local is not None and os.path.exists(local) and not os.path.isdir(local):
        raise LaminarError(f"the demo cannot use {root}: it is a file, not a folder; pass an empty or new --root "
                           "(or set LAMINAR_ROOT)", root=root)
    if storage.exists(storage.join(root, *MARKER.split("/"))):
        return True
    found = storage.some_files(root, _EXAMPLES)
    if found:
        base = storage.normalized(root).rstrip("/")
        shown = ", ".join(storage.normalized(f)[len(base) + 1:] for f in found)
        raise LaminarError(
            f"the demo starts by deleting everything under its root, and {root} holds files the demo did not make "
            f"({shown}{', ...' if len(found) == _EXAMPLES else ''}) and no demo marker ({MARKER}): nothing was "
            "deleted. Pass an empty or new --root (or set LAMINAR_ROOT), or one an earlier demo made; a lake a demo "
            "made before it marked its lakes is yours to delete", root=root)
    return False


def reset_demo_lake(root: str) -> None:
    """Make `root` an empty demo lake: refuse it (`check_demo_root`), delete a lake an earlier demo made,
    and write the marker before anything else."""
    if check_demo_root(root):
        storage.delete_tree(root)
    marker = {"made_by": "laminar demo", "made_at": datetime.now(UTC).isoformat(timespec="seconds"),
              "note": "the demo deletes everything under this root when it runs again here"}
    storage.write(storage.join(root, *MARKER.split("/")), json.dumps(marker, indent=2).encode())
