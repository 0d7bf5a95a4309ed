"""Catalogs Laminar registers its tables in and resolves sources' names with (`base`: the seam; `hive`:
Spark's own Hive metastore; `choose`: which catalog, and the factory that makes it)."""

from .base import DEFAULT_SCHEMA, CatalogReport, CatalogTable, TableCatalog, looks_like_name
from .choose import CatalogOptions, make_catalog
from .hive import busy_metastore

__all__ = ["busy_metastore", "DEFAULT_SCHEMA", "CatalogOptions", "CatalogReport", "CatalogTable", "TableCatalog",
           "looks_like_name", "make_catalog"]
