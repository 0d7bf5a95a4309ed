"""Spark's own Hive metastore as Laminar's catalog, spoken to in Spark SQL (so the same code runs on a
local session and over Spark Connect, where the server's JVM holds the metastore).

An entry is an external Delta table (`CREATE TABLE ... USING delta LOCATION ...`): the metastore keeps its
name, provider and location, the Delta log keeps its schema and properties, and a session with delta-spark
reads it as the Delta table at that location. Creating an entry over an existing Delta table writes nothing
to the table. The description, owners and tags are table properties in the Delta log (`laminar.description`,
`laminar.owners`, `laminar.tags`, and the table's description), where delta-spark's catalog reads a Delta
table's properties from (`SHOW TBLPROPERTIES`, `DESCRIBE TABLE EXTENDED`): one metadata commit when they
change, none otherwise.

The schema's entries are read in two statements (their names, then `SHOW TABLE EXTENDED` of those: the
metastore's records, no Delta log read) once per catalog object; every change made through it is kept in step.

Derby, the metastore's embedded database, lets one JVM open it at a time: the first catalog statement of
a second JVM fails, and is reported as `CatalogError` naming the metastore and what to do
(docs/catalog.md, "One process at a time"). A metastore database on Postgres serves any number of JVMs; its
refusal (pgjdbc's `PSQLException`) is one `CatalogError` line too.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from urllib.parse import unquote

from deltalake import CommitProperties

from laminar_assets import storage
from laminar_assets.errors import CatalogError

from ..delta.layout import place_of
from ..delta.tables import is_delta_table, open_delta
from ..output.commit import with_user_metadata
from ..spark.frames import spark_path
from .base import CatalogReport, CatalogTable

# What a JVM says when another one has the embedded metastore open (Derby's XSDB6, through DataNucleus)
_DERBY_BUSY = re.compile(r"XSDB6|Another instance of Derby|Failed to start database|Unable to instantiate "
                         r"org\.apache\.hadoop\.hive\.ql\.metadata\.SessionHiveMetaStoreClient", re.IGNORECASE)
# pgjdbc's own words, the root cause in the chain of Hive's and DataNucleus's exceptions
_PSQL = re.compile(r"org\.postgresql\.util\.PSQLException: ([^\n]*)")
_INFO = re.compile(r"^(?P<key>[A-Za-z ]+): (?P<value>.*)$")


class HiveCatalog:
    """Tables of one schema of the Hive metastore of `spark` (local, or a Spark Connect server's)."""

    def __init__(self, spark, schema: str) -> None:
        self.spark = spark
        self.schema = schema
        self._entries: dict[str, tuple[str, str]] | None = None  # name -> (location, table type)
        self._stamped: dict[str, dict] = {}  # location -> the properties this object made sure it has
        self._lock = threading.Lock()  # a run's steps may register from threads at once

    @property
    def description(self) -> str:
        return f"schema '{self.schema}' of the Hive metastore ({metastore_of(self.spark)})"

    # --- the seam -----------------------------------------------------------------
    def register(self, tables: Sequence[CatalogTable]) -> CatalogReport:
        with self._lock:
            report = CatalogReport(self.schema)
            entries = self._listed()
            for table in tables:
                self._register(table, entries, report)
            return report

    def sync(self, tables: Sequence[CatalogTable]) -> CatalogReport:
        with self._lock:
            self._entries = None  # read afresh: another process may have registered since
        report = self.register(tables)
        wanted = {t.name for t in tables}
        report.left = sorted(n for n in self._listed() if n not in wanted)
        return report

    def resolve(self, name: str) -> str | None:
        parts = name.lower().split(".")
        schema, table = parts[-2], parts[-1]
        if schema == self.schema:
            found = self._listed().get(table)
            return _path(found[0]) if found else None
        return _path(found[0]) if (found := self._show(schema, table).get(table)) else None

    # --- steps ----------------------------------------------------------------------
    def _register(self, table: CatalogTable, entries: dict[str, tuple[str, str]], report: CatalogReport) -> None:
        if not _is_delta(table.location):
            return  # not written yet: registered by the run that creates it
        at = place_of(table.location)
        mine = entries.get(table.name)
        if mine is not None and place_of(_path(mine[0])).same(at):
            report.unchanged.append(table.name)
        elif mine is None and (old := next((n for n, (loc, _t) in entries.items()
                                            if place_of(_path(loc)).same(at)), None)) is not None:
            self._sql(f"ALTER TABLE {self._q(old)} RENAME TO {self._q(table.name)}")
            entries[table.name] = entries.pop(old)
            report.renamed.append((old, table.name))
        else:
            if mine is not None:  # the name now stands for another location (a flow's new state table)
                if mine[1].upper() != "EXTERNAL":
                    raise CatalogError(f"{self.schema}.{table.name} is a {mine[1].lower()} table of the metastore, not "
                                       f"one Laminar registered; it was left as it is: drop or rename it, or choose "
                                       "another catalog schema", table=f"{self.schema}.{table.name}",
                                       location=table.location)
                self._sql(f"DROP TABLE {self._q(table.name)}")  # an external table: its files stay
                report.repointed.append(table.name)
            location = spark_path(table.location).replace("'", "\\'")
            self._sql(f"CREATE TABLE IF NOT EXISTS {self._q(table.name)} USING delta LOCATION '{location}'")
            entries[table.name] = (table.location, "EXTERNAL")
            if mine is None:
                report.created.append(table.name)
        if self._stamp(table):
            report.updated.append(table.name)

    def _stamp(self, table: CatalogTable) -> bool:
        """Set the table's properties and description in its Delta log where they differ (one commit each)."""
        wanted = table.properties()
        if self._stamped.get(table.location) == wanted:
            return False
        dt = open_delta(table.location)
        meta = dt.metadata()
        props = {k: v for k, v in wanted.items() if meta.configuration.get(k) != v}
        commit = CommitProperties(custom_metadata=with_user_metadata(
            {"laminar.flow": table.owner_flow} if table.owner_flow else {"laminar.catalog": "properties"}))
        if props:
            dt.alter.set_table_properties(props, raise_if_not_exists=False, commit_properties=commit)
        if table.description and (meta.description or "") != table.description:
            dt.alter.set_table_description(table.description, commit_properties=commit)
            props["description"] = table.description
        self._stamped[table.location] = wanted
        return bool(props)

    def _listed(self) -> dict[str, tuple[str, str]]:
        if self._entries is None:
            self._sql(f"CREATE SCHEMA IF NOT EXISTS `{self.schema}`")
            self._entries = self._show(self.schema)
        return self._entries

    def _show(self, schema: str, like: str = "*") -> dict[str, tuple[str, str]]:
        """name -> (location, type) of the tables of `schema` (the metastore's records only); {} when the
        schema does not exist."""
        if not self._sql(f"SHOW SCHEMAS LIKE '{schema}'").collect():
            return {}
        # The schema's tables by name first, then only those described: SHOW TABLE EXTENDED describes the
        # session's temporary views too, and pyspark's `spark.sql(query, df=...)` in another thread of the
        # session makes and drops one (`_pyspark_<id>`) per DataFrame argument: one dropped between that
        # statement's listing and its describing failed it (TABLE_OR_VIEW_NOT_FOUND), and with it a run.
        names = [r["tableName"] for r in self._sql(f"SHOW TABLES IN `{schema}` LIKE '{like}'").collect()
                 if not r["isTemporary"]]
        if not names:
            return {}
        out = {}
        for row in self._sql(f"SHOW TABLE EXTENDED IN `{schema}` LIKE '{'|'.join(names)}'").collect():
            if row["isTemporary"]:
                continue
            info = {m["key"]: m["value"] for line in (row["information"] or "").splitlines()
                    if (m := _INFO.match(line.strip()))}
            if info.get("Location"):
                out[row["tableName"].lower()] = (info["Location"], info.get("Type", ""))
        return out

    def _q(self, name: str) -> str:
        return f"`{self.schema}`.`{name}`"

    def _sql(self, statement: str):
        try:
            check_hive(self.spark)
            return self.spark.sql(statement)
        except CatalogError:
            raise
        except Exception as exc:  # Spark's errors, local (Py4J) or over Spark Connect (gRPC)
            if (busy := busy_metastore(self.spark, exc, self.schema)) is not None:
                raise busy from exc
            text = str(exc)
            first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
            raise CatalogError(f"the catalog ({self.description}) refused `{statement}`: {first}",
                               schema=self.schema) from exc


def busy_metastore(spark, exc: BaseException, schema: str | None = None) -> CatalogError | None:
    """The one-line error for Spark's failure to open its metastore: an embedded Derby another process holds, or
    a metastore database on Postgres that refused (a password changed, the server gone since the session
    started); None when `exc` is something else."""
    text = str(exc)
    if (refused := _PSQL.search(text)) is not None:
        said = " ".join(refused.group(1).split())
        return CatalogError(f"the Hive metastore ({metastore_of(spark)}) refused: {said}; check the database, its "
                            "server and the credentials in LAMINAR_METASTORE (docs/catalog.md)", schema=schema)
    where = metastore_of(spark)
    if not _DERBY_BUSY.search(text) or "postgresql" in text.lower() or \
            not (where.startswith("Derby") or where == "its default location"):
        return None  # not Derby's one-process rule (a Connect client may not see the server's settings)
    return CatalogError(
        f"the Hive metastore ({metastore_of(spark)}) is open in another process: an embedded Derby metastore "
        "serves one process at a time. Run through the process that holds it (the Spark Connect server of "
        "`laminar serve`: set LAMINAR_SPARK_REMOTE), wait for the other command to end, or use a metastore "
        "database (docs/catalog.md)", schema=schema)


def check_hive(spark) -> None:
    """Refuse a session without a Hive metastore: its catalog lives in the session's memory, and tables
    registered there would be gone when it stops."""
    kind = spark.conf.get("spark.sql.catalogImplementation", "in-memory")
    if kind != "hive":
        raise CatalogError(
            f"the Spark session has no Hive metastore (spark.sql.catalogImplementation={kind}), so it cannot hold "
            "the catalog: start Spark with a metastore (SparkOptions.metastore, SparkResource.metastore or "
            "LAMINAR_METASTORE; for `laminar serve`, before the server starts)")


def metastore_of(spark) -> str:
    """Where the session's metastore is, for messages (a database URL without its options or secrets)."""
    try:
        url = spark.conf.get("spark.hadoop.javax.jdo.option.ConnectionURL", None) or ""
    except Exception:  # noqa: BLE001 - a setting Spark Connect does not hand out: say less
        url = ""
    if url.startswith("jdbc:derby:"):
        name = re.search(r"databaseName=([^;]+)", url)
        return f"Derby at {name.group(1) if name else url}"
    return re.sub(r"//[^@/]*@", "//", url.split("?")[0]) if url else "its default location"


def _path(location: str) -> str:
    """A location as the metastore records it (file:/tmp/x, s3a://b/k) in the form Laminar names tables."""
    if location.startswith("file:"):
        location = "/" + unquote(location[len("file:"):]).lstrip("/")
    return storage.normalized(location) if "://" in location else os.path.normpath(location)


def _is_delta(uri: str) -> bool:
    return is_delta_table(uri)
