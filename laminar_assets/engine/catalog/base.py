"""The catalog seam: where Laminar names the tables it writes, and where sources are found by name.

A `TableCatalog` registers tables Laminar writes (stages, sinks, state, quarantine, dead letters) as
external Delta tables under one schema the user names (default `laminar`), at their location, with
their description, owners and tags as table properties; it resolves a source's catalog name
(`raw.trades`) to its location. One implementation per catalog kind (`hive.py`: Spark's own Hive
metastore); another catalog (Unity, Glue) is one more module with the same three methods and its
entry in `choose.KINDS`.

Registration never drops a table of a removed flow: `sync` reports such entries as `left`, and
only ever repoints an entry of the wanted name (an external table: its data is never touched).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from ..delta.catalog_names import looks_like_name  # noqa: F401  (re-exported: a source's catalog name)

DEFAULT_SCHEMA = "laminar"
IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Table properties Laminar sets on the tables it registers (in the Delta log: Delta's catalogs show a
# Delta table's properties from there)
DESCRIPTION = "laminar.description"
OWNERS = "laminar.owners"
TAGS = "laminar.tags"
KIND = "laminar.kind"


@dataclass(frozen=True)
class CatalogTable:
    """One table to register: its name in the schema, its location, and what a reader should know."""

    name: str  # the table's name inside the schema (lower case)
    location: str  # a local path or an object-store URI
    kind: str  # "sink", "stage", "state", "quarantine", "dead_letters"
    description: str = ""
    owners: tuple[str, ...] = ()
    tags: Mapping[str, str] = field(default_factory=dict)
    owner_flow: str | None = None  # the flow whose table it is (its commits name it)

    def properties(self) -> dict[str, str]:
        """The table properties Laminar keeps on it."""
        return {DESCRIPTION: self.description, OWNERS: ",".join(self.owners),
                TAGS: json.dumps(dict(sorted(self.tags.items()))), KIND: self.kind}


@dataclass
class CatalogReport:
    """What a registration did: entries created, renamed (old -> new name), repointed to a new location,
    whose properties were updated, left as they were; and `left`: entries of the schema no table of the
    project claims (a removed flow's), kept in place."""

    schema: str
    created: list[str] = field(default_factory=list)
    renamed: list[tuple[str, str]] = field(default_factory=list)
    repointed: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    left: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"schema": self.schema, "created": self.created, "renamed": [list(r) for r in self.renamed],
                "repointed": self.repointed, "updated": self.updated, "unchanged": self.unchanged, "left": self.left}


class TableCatalog(Protocol):
    """What Laminar needs of a catalog."""

    schema: str

    @property
    def description(self) -> str:
        """Where it is, for messages ("Hive metastore (Derby at ...)")."""

    def register(self, tables: Sequence[CatalogTable]) -> CatalogReport:
        """Make each table an entry of the schema at its location with its properties (idempotent); an entry
        at the same location under another name is renamed."""

    def sync(self, tables: Sequence[CatalogTable]) -> CatalogReport:
        """`register`, and report the schema's entries none of `tables` claims (`left`; never dropped)."""

    def resolve(self, name: str) -> str | None:
        """The location of the table `name` (`schema.table`), None when the catalog has no such table."""
