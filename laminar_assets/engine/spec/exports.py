"""Exports: a third kind of spec beside flows and stages. An export delivers the Delta table of one flow or
stage (its sink) to where applications read it: a Postgres table (exactly once), a Redis hash per key
(latest value, idempotent) or a webhook (each new row, at least once).

    vwap_1m_pg = PostgresExport(name="vwap_1m_pg", source="vwap_1m", table="vwap_1m", connection="analytics")

Like flows and stages, export specs are frozen plain data validated when built (keyword-only fields), and
discovered at the top level of a flows module (`registry.collect`). Whatever depends on the spec they read
(its kind, its key) is checked there, against the specs of the same definitions (`ExportSpec.source_problem`).
The credentials of the target never appear here: `connection` names a connection that the Dagster resource
or the environment defines when a delivery runs.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar, NoReturn, cast

from laminar_assets.errors import SpecError

from .parts import as_pairs, as_tuple
from .problems import catalog_problem
from .specs import Spec

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PG_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_$]{0,62}$")  # a Postgres identifier (at most 63 bytes)
# Fields every export has; the rest are its kind's options (also the WITH (...) options of CREATE SINK).
COMMON_FIELDS = ("name", "source", "connection", "description", "owners", "tags", "origin", "definition")


def export_key(source: Spec) -> tuple[str, ...]:
    """The columns that identify a row of `source`'s table, as exports upsert and delete it (`BaseSpec.row_key`):
    a flow's window start and group keys, a stage's dedup key and event time. Empty for a stage without a dedup
    key (its rows have no identity)."""
    return source.row_key


@dataclass(frozen=True, kw_only=True)
class ExportSpec:
    """What every export declares: its name (the asset's), the flow or stage it reads (`source`, by name), and
    the connection its target is reached through (by name: credentials are never part of a spec)."""

    kind: ClassVar[str]  # "postgres", "redis", "webhook": the target module that delivers it
    needs_key: ClassVar[bool] = True  # whether rows are upserted and deleted by key (else: sent as they come)
    url_example: ClassVar[str] = ""  # what a connection's URL looks like, for the message of one not defined
    # whether the target holds rows a backfill of partitions can replace (a webhook's receiver holds none: a
    # partition's rows sent again would be new alerts under new keys, so it delivers only what is pending)
    repairs_partitions: ClassVar[bool] = True
    duplicate_noun: ClassVar[str] = "export"  # what an error about its name among all definitions calls it

    name: str
    source: str
    connection: str
    description: str = ""
    owners: tuple[str, ...] = ()
    tags: Mapping[str, str] | tuple[tuple[str, str], ...] = ()
    # Where it was defined ("flows/exports.sql:12") and, for CREATE SINK, the statement itself.
    origin: str = ""
    definition: str = ""
    if TYPE_CHECKING:  # every kind's own field (with its own default), not a common one: COMMON_FIELDS and the
        batch_rows: int  # order of a kind's options stay as they are; rows per batch read from the source

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):  # first: other errors name it
            self._fail("name", f"expected an identifier (letters, digits, _), found {self.name!r}")
        for attr in ("source", "connection"):
            value = getattr(self, attr)
            if not isinstance(value, str) or not _NAME_RE.match(value):
                what = "the name of a flow or stage" if attr == "source" else "a connection name (letters, digits, _)"
                self._fail(attr, f"expected {what}, found {value!r}")
        for attr in ("description", "origin", "definition"):
            if not isinstance(getattr(self, attr), str):
                self._fail(attr, f"expected a string, found {getattr(self, attr)!r}")
        object.__setattr__(self, "owners", as_tuple(self.owners))
        try:
            tags = as_pairs(self.tags)
        except ValueError as exc:
            self._fail("tags", str(exc))
        object.__setattr__(self, "tags", tags)
        problem = catalog_problem(self.owners, tags)
        if problem:
            self._fail(*problem)
        self._validate()

    def _validate(self) -> None:
        """The kind's own options."""

    def _fail(self, field_name: str, message: str) -> NoReturn:
        raise SpecError(f"{type(self).__name__} '{self.name}': {message}", flow=self.name, field=field_name)

    def _positive(self, attr: str, *, whole: bool = True, optional: bool = False) -> None:
        value = getattr(self, attr)
        if value is None and optional:
            return
        ok = isinstance(value, int) if whole else isinstance(value, (int, float))
        if isinstance(value, bool) or not ok or value <= 0:
            kind = "a positive integer" if whole else "a positive number"
            self._fail(attr, f"expected {kind}{' or None' if optional else ''}, found {value!r}")

    @property
    def options(self) -> dict[str, Any]:
        """The kind's own fields and their values (what CREATE SINK's WITH (...) may set)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name not in COMMON_FIELDS}

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls) if f.name not in COMMON_FIELDS)

    @property
    def target(self) -> str:
        """Where it delivers, as the catalog shows it (no credentials)."""
        return f"{self.kind} connection '{self.connection}'"

    def source_problem(self, source: Spec) -> tuple[str, str] | None:
        """What is wrong with reading `source` (a flow or stage of the same definitions), as (field, message)."""
        if self.needs_key and not export_key(source):
            return "source", (f"{source.kind} '{source.name}' has no dedup key, so its rows have no identity to upsert "
                              f"and delete by; give the stage a dedup_key, or deliver its rows with a WebhookExport")
        kept = source.kept_columns  # the output columns a stage names (empty: all, or a flow's)
        missing = [c for c in export_key(source) if kept and c not in kept]
        if self.needs_key and missing:
            return "source", (f"stage '{source.name}' keeps columns {list(kept)}, without its key column(s) "
                              f"{missing}; add them to the stage's columns")
        return None

    @property
    def export_hash(self) -> str:
        """A hash of what changes the delivered rows (the asset's code version)."""
        payload = {"kind": self.kind, "source": self.source, **{k: v for k, v in self.options.items()}}
        return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()[:16]


@dataclass(frozen=True, kw_only=True)
class PostgresExport(ExportSpec):
    """A Postgres table keyed by the source's key (`export_key`), kept equal to the source's Delta table:
    exactly once (rows and the delivered version commit in one transaction). `table`: `name` or
    `schema.name` (default: the source's name, in schema `public`); created when missing, with column
    types mapped from the Delta schema. `batch_rows`: rows per batch read from the change feed and copied."""

    kind: ClassVar[str] = "postgres"
    url_example: ClassVar[str] = "postgresql://user@host:5432/db"

    table: str | None = None
    batch_rows: int = 50_000

    def _validate(self) -> None:
        if self.table is None:
            object.__setattr__(self, "table", self.source)
        if not isinstance(self.table, str) or not 1 <= len(self.table.split(".")) <= 2 \
                or not all(_PG_NAME_RE.match(p) for p in self.table.split(".")):
            self._fail("table", f"expected a Postgres table name 'name' or 'schema.name' (letters, digits, _; at most "
                                f"63 each), found {self.table!r}")
        self._positive("batch_rows")

    @property
    def qualified_table(self) -> str:
        """`table` as _validate left it: 'name' or 'schema.name' (the source's name when none was given)."""
        return cast(str, self.table)

    @property
    def schema_name(self) -> str:
        return self.qualified_table.split(".")[0] if "." in self.qualified_table else "public"

    @property
    def table_name(self) -> str:
        return self.qualified_table.split(".")[-1]

    @property
    def target(self) -> str:
        return f"postgres table {self.schema_name}.{self.table_name} (connection '{self.connection}')"


@dataclass(frozen=True, kw_only=True)
class RedisExport(ExportSpec):
    """One Redis hash per source key (`<key_prefix>:<key values>`) holding the latest window's row of a flow's
    group keys (or a stage's latest row of a dedup key), written by one Lua script per batch of `batch_rows` keys,
    the export's delivered version (`laminar:exports:<name>`) last (engine/export/redis.py)."""

    kind: ClassVar[str] = "redis"
    url_example: ClassVar[str] = "redis://[user@]host:6379/0"

    key_prefix: str | None = None
    batch_rows: int = 1_000

    def _validate(self) -> None:
        if self.key_prefix is None:
            object.__setattr__(self, "key_prefix", self.name)
        if not isinstance(self.key_prefix, str) or not self.key_prefix or any(c.isspace() for c in self.key_prefix):
            self._fail("key_prefix", f"expected a non-empty prefix without spaces, found {self.key_prefix!r}")
        if self.key_prefix.split(":")[0] == "laminar":
            self._fail("key_prefix", f"keys under 'laminar:' are Laminar's own (laminar:exports:<export> holds an "
                                     f"export's delivered version); choose another prefix than {self.key_prefix!r}")
        self._positive("batch_rows")

    @property
    def prefix(self) -> str:
        """`key_prefix` as _validate left it: the export's name when none was given."""
        return cast(str, self.key_prefix)

    @property
    def target(self) -> str:
        return f"redis keys {self.key_prefix}:* (connection '{self.connection}')"


RETRACTIONS = ("skip", "send")
INITIAL = ("skip", "all")


@dataclass(frozen=True, kw_only=True)
class WebhookExport(ExportSpec):
    """Each new row of the source (inserted, or the new state of a corrected row) POSTed as JSON, at least once,
    with an `Idempotency-Key` header a receiver drops duplicates by (docs/exports.md, "Webhooks").

    `retractions`: a deleted row, or the old state of a corrected one, is not sent ("skip") or sent as
    {"op": "retract", ...} ("send"). `initial`: what a delivery with no changes to read sends (the first one,
    or one after the change feed since the delivered version is gone): nothing ("skip": alerts are about new
    rows) or every row of the table ("all"). A request carries `rows_per_request` rows, at most
    `max_rows_per_second` rows a second go out (None: no limit) with at most `max_in_flight` requests waiting
    for an answer; a request waits `timeout_seconds` for one and is tried `max_attempts` times on a 5xx, 408,
    429, a timeout or a connection error, `backoff_seconds` before the second attempt, doubling up to
    `max_backoff_seconds`. A row whose attempts all fail goes to the dead-letter table. A delivery stops after
    `max_seconds`: what it did not send stays pending for the next one. `batch_rows`: rows per batch read."""

    kind: ClassVar[str] = "webhook"
    needs_key: ClassVar[bool] = False
    url_example: ClassVar[str] = "https://host/path"
    repairs_partitions: ClassVar[bool] = False

    retractions: str = "skip"
    initial: str = "skip"
    rows_per_request: int = 1
    max_rows_per_second: float | None = 100.0
    max_in_flight: int = 4
    max_attempts: int = 5
    timeout_seconds: float = 10.0
    backoff_seconds: float = 1.0
    max_backoff_seconds: float = 30.0
    max_seconds: float = 300.0
    batch_rows: int = 1_000

    def _validate(self) -> None:
        if self.retractions not in RETRACTIONS:
            self._fail("retractions", f"expected one of {', '.join(RETRACTIONS)}, found {self.retractions!r}")
        if self.initial not in INITIAL:
            self._fail("initial", f"expected one of {', '.join(INITIAL)}, found {self.initial!r}")
        for attr in ("rows_per_request", "max_in_flight", "max_attempts", "batch_rows"):
            self._positive(attr)
        self._positive("max_rows_per_second", whole=False, optional=True)
        for attr in ("timeout_seconds", "backoff_seconds", "max_backoff_seconds", "max_seconds"):
            self._positive(attr, whole=False)

    @property
    def target(self) -> str:
        return f"webhook (connection '{self.connection}')"


Export = PostgresExport | RedisExport | WebhookExport  # the one name for "an export" in annotations
EXPORT_KINDS: dict[str, type[ExportSpec]] = {"postgres": PostgresExport, "redis": RedisExport, "webhook": WebhookExport}
