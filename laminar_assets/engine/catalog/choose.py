"""Which catalog Laminar registers its tables in: `CatalogOptions` (a kind and a schema) and the factory
that makes the catalog of a kind (`KINDS`). It sits above the seam (`base.py`) and the implementations
(`hive.py`), so that the seam never imports one of them: another catalog (Unity, Glue) is one more module
beside `hive.py` and its entry in `KINDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from laminar_assets.errors import EnvironmentProblem

from .base import DEFAULT_SCHEMA, IDENTIFIER, TableCatalog
from .hive import HiveCatalog

KINDS: dict[str, Callable[..., TableCatalog]] = {"hive": HiveCatalog}
"""Each catalog kind's class, made with (spark, schema)."""


@dataclass(frozen=True)
class CatalogOptions:
    """Which catalog Laminar registers its tables in. `kind`: "hive" (Spark's own metastore: embedded
    Derby or a metastore database, `SparkOptions.metastore`); `schema`: the schema (database) its tables
    are registered under."""

    schema: str = DEFAULT_SCHEMA
    kind: str = "hive"

    def __post_init__(self) -> None:
        if not IDENTIFIER.match(self.schema):
            raise EnvironmentProblem(f"catalog schema must be a plain identifier (letters, digits, _), got "
                                     f"{self.schema!r}", field="catalog_schema")
        if self.kind not in KINDS:
            raise EnvironmentProblem(f"catalog kind must be one of {', '.join(sorted(KINDS))}, got {self.kind!r}",
                                     field="catalog")


def make_catalog(spark, options: CatalogOptions) -> TableCatalog:
    """The catalog of `options` on `spark`."""
    return KINDS[options.kind](spark, options.schema)
