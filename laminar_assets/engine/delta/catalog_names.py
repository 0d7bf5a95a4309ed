"""Sources named by their catalog name (`raw.trades`), as the lake records where they were found.

A run resolves such a name through its catalog (`engine.catalog`, a Spark SQL call) and records the location in
`<root>/_laminar/catalog/sources.json`; Laminar's Spark-free readers of a source (the sensors' version reads, the
staleness and `laminar status` answers, `laminar sql`'s views) find it there through `delta.tables.resolve_uri`.
A name nobody recorded yet stays a path under the root, as without a catalog: `laminar catalog` (or the flow's
first run) records it.
"""

from __future__ import annotations

import json
import re
import threading
import time

from laminar_assets import storage

# How a catalog name looks: `schema.table` (or `catalog.schema.table`), plain identifiers
NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){1,2}$")
RECORD = ("_laminar", "catalog", "sources.json")

_known: dict[str, dict[str, str]] = {}  # root -> name -> location, as this process last read or wrote them
_read_at: dict[str, float] = {}  # root -> when this process last read its record
REREAD_S = 5.0  # a name not in the record is looked for again at most this often (a sink named `a.b` is one too)
_lock = threading.Lock()


def looks_like_name(source: str) -> bool:
    """Whether a source is written as a catalog name (`raw.trades`), not a path."""
    return bool(NAME.match(source))


def recorded(root: str, name: str) -> str | None:
    """Where the source `name` was found under `root`'s lake (None: not recorded). Reads the record again only
    for a name this process has not seen in it, and then at most every `REREAD_S` seconds."""
    with _lock:
        found = _known.get(root, {}).get(name)
        fresh = time.monotonic() - _read_at.get(root, float("-inf")) < REREAD_S
    if found is not None or fresh:
        return found
    data = storage.read(storage.join(root, *RECORD))
    names = json.loads(data) if data else {}
    with _lock:
        _known[root], _read_at[root] = names, time.monotonic()
    return names.get(name)


def record(root: str, names: dict[str, str]) -> None:
    """Record where sources were found (written only when something changed)."""
    with _lock:
        _read_at.pop(root, None)
    recorded(root, next(iter(names), ""))  # the record as it is now
    with _lock:
        merged = {**_known.get(root, {}), **names}
        if merged == _known.get(root):
            return
    storage.write(storage.join(root, *RECORD), json.dumps(merged, sort_keys=True, indent=1).encode())
    with _lock:
        _known[root] = merged
