"""Where tables live under a storage root, and the Delta app-transaction ids of partitions.

    <root>/<table>                                    sources, stage outputs and sinks (or absolute URIs)
    <root>/_laminar/state/<flow>/<spec hash>-<schema>  state of one spec over one input schema
    <root>/_laminar/quarantine/<source>                rows that broke a rule
    <root>/_laminar/watermarks, locks, sweeps           see checkpoints/store.py

`place_of` says which folder a table name stands for, in a form two names can be compared in: the
same folder spelled twice (`t`, `./t`, `T`, `a/../t`) is one place, and a place may lie inside another.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field

from .tables import resolve_uri

SYSTEM_FOLDER = "_laminar"  # every table and file Laminar keeps for itself lives under <root>/_laminar


@dataclass(frozen=True)
class Layout:
    """Paths and Delta app-transaction ids under one storage root. `names`: sources named by their catalog
    name (`raw.trades`) -> their location, as a run resolved them (`Engine`, `engine.catalog`)."""

    root: str
    names: Mapping[str, str] = field(default_factory=dict, compare=False, hash=False)

    def table_uri(self, name: str) -> str:
        return self.names.get(name) or resolve_uri(self.root, name)

    def sink_uri(self, spec) -> str:
        return self.table_uri(spec.sink)

    def state_uri(self, spec, input_schema: dict[str, str]) -> str:
        """State of one spec over one input schema: a compatible type change (SCHEMA_CHANGED) refills
        into a fresh table instead of clashing with the old state's column types."""
        schema = hashlib.sha256(json.dumps(sorted(input_schema.items())).encode()).hexdigest()[:8]
        return f"{self.root}/_laminar/state/{spec.name}/{spec.spec_hash}-{schema}"

    def quarantine_uri(self, source: str) -> str:
        return f"{self.root}/_laminar/quarantine/{os.path.basename(source.rstrip('/'))}"

    def guard_uri(self, spec, input_schema: dict[str, str]) -> str:
        """The table whose app transaction says whether a run's first commit landed."""
        return self.state_uri(spec, input_schema) if spec.keeps_state else self.sink_uri(spec)

    @staticmethod
    def app_id(spec, partition: str) -> str:
        return f"laminar/{spec.name}/{partition}"


@dataclass(frozen=True)
class Place:
    """The folder a table name stands for: `store` ('root' for a name relative to a root not known yet,
    'file' for a local path, 's3://bucket' for an object store) and the path's parts below it.

    Names are compared ignoring case unless both are object-store keys: a local disk may ignore case
    (macOS, Windows), and a name relative to the root may end up on one; S3 keys never do."""

    store: str
    parts: tuple[str, ...]
    exact_case: bool = False  # an object-store key: 'T' and 't' are two tables

    def _key(self, other: Place) -> tuple[tuple[str, ...], tuple[str, ...]]:
        if self.exact_case and other.exact_case:
            return self.parts, other.parts
        return tuple(p.casefold() for p in self.parts), tuple(p.casefold() for p in other.parts)

    def same(self, other: Place) -> bool:
        mine, theirs = self._key(other)
        return self.store == other.store and mine == theirs

    def contains(self, other: Place) -> bool:
        """Whether `other` is this folder or lies somewhere under it."""
        mine, theirs = self._key(other)
        return self.store == other.store and theirs[:len(mine)] == mine

    def __str__(self) -> str:
        if self.store == "root":
            return "<root>/" + "/".join(self.parts)
        return ("" if self.store == "file" else self.store) + "/" + "/".join(self.parts)


def place_of(name: str, root: str | None = None) -> Place:
    """The place of table `name` (a name relative to `root`, or an absolute path or URI): absolute,
    `.` and `..` resolved, symbolic links of a local path resolved, no trailing slash, s3a:// as s3://.
    With `root` None a relative name stays relative (its place is under 'root')."""
    if name.startswith("file://"):
        name = name[len("file://"):]
    scheme = name.split("://", 1)[0].lower() if "://" in name else None
    if scheme is None and not os.path.isabs(name):
        if root is None:
            return Place("root", _parts(posixpath.normpath(name)))  # '../t' stays outside the root
        name = resolve_uri(root, name) if "://" in root else os.path.join(root, name)
        scheme = name.split("://", 1)[0].lower() if "://" in name else None
    if scheme is None:
        return Place("file", _parts(os.path.realpath(name)))
    bucket, _, key = name.split("://", 1)[1].partition("/")
    store = f"{'s3' if scheme in ('s3', 's3a') else scheme}://{bucket}"
    return Place(store, _parts(posixpath.normpath("/" + key)), exact_case=True)


def _parts(path: str) -> tuple[str, ...]:
    return tuple(p for p in path.split("/") if p not in ("", "."))
