"""The one seam every export target plugs into: what a delivery hands a target, what a target answers, and
the registry of target modules by kind.

A target keeps the version of the source table it last delivered (`delivered()`) and applies one delivery's
changes together with the new version (`apply()`): atomically where the target allows it (Postgres: one
transaction), else so that a rerun converges (Redis: version-checked per key, the delivered version last;
webhooks: at least once with idempotency keys). The engine decides what to read (`delivery.py`): the change
feed since the delivered version, or the whole table at the pinned version when that cannot be trusted.

Adding a target is one module with a class `Target(export, connection, context)` and one line in `TARGETS`
(or `register_target` from outside the engine).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any, Protocol

import pyarrow as pa

from laminar_assets.errors import ExportError

from ..delta.layout import Layout
from ..spec.exports import ExportSpec
from ..spec.specs import Spec
from ..windows import Granularity, Interval
from .connections import Connection

# Where a delivery can be interrupted, in order: the crash tests stop it at each (`hook(step)`).
#   export_before_write    changes read, nothing sent to the target yet
#   export_after_rows      the target holds the rows (in the open transaction), not the new version
#   export_after_version   the target holds rows and version, not committed yet (Postgres)
#   export_after_commit    committed in the target; the lake's record of the delivery not written yet
EXPORT_STEPS = ("export_before_write", "export_after_rows", "export_after_version", "export_after_commit")


class Mode(str, Enum):
    INCREMENTAL = "INCREMENTAL"  # the net changes of the change feed since the delivered version
    FULL = "FULL"  # every row of the table at the pinned version replaces what the target holds
    NOOP = "NOOP"  # nothing to deliver


class Reason(str, Enum):
    """Why a delivery read what it read (recorded with every delivery, like a flow run's reason)."""

    NEW_VERSIONS = "NEW_VERSIONS"  # incremental: the change feed covers (delivered, pinned]
    UP_TO_DATE = "UP_TO_DATE"  # the target holds the pinned version already
    SOURCE_NOT_WRITTEN = "SOURCE_NOT_WRITTEN"  # the flow or stage has not written its table yet
    NO_DELIVERED_VERSION = "NO_DELIVERED_VERSION"  # a first delivery
    CHANGE_FEED_EXPIRED = "CHANGE_FEED_EXPIRED"  # the log or change files since the delivered version are gone
    CHANGE_FEED_UNREADABLE = "CHANGE_FEED_UNREADABLE"  # a commit whose changes the feed cannot give (deletion vectors)
    SCHEMA_CHANGED = "SCHEMA_CHANGED"  # the table's schema changed since the delivered version
    SOURCE_RECREATED = "SOURCE_RECREATED"  # the table at the source's path is another table (its Delta id changed)
    TARGET_CHANGED = "TARGET_CHANGED"  # the target no longer holds what was delivered (its table dropped or recreated)
    FORCED_BY_USER = "FORCED_BY_USER"  # a full resync asked for
    PARTITIONS_REPLACED = "PARTITIONS_REPLACED"  # nothing new: only the rows of partitions asked for were replaced


@dataclass(frozen=True)
class Delivered:
    """What a target says it holds: the source table's version and Delta id it last delivered, when, and,
    when the target lost it since (a table dropped or recreated), why."""

    version: int
    source_table_id: str | None
    at: datetime | None = None
    target_changed: str | None = None
    token: object = None  # the target's own guard (Postgres: the table's oid), given back to `apply`


@dataclass
class Changes:
    """One delivery, as a target applies it.

    FULL: `rows` is every row of the table at `version`; the target's rows are replaced by them (keyed targets).
    INCREMENTAL: `rows` are the net upserts (one row per key: its last state in the change feed), `deletes`
    the keys whose last change deleted them, and `replace` ranges of `time_column` whose rows the target
    drops first (a backfill of partitions: `rows` then holds the table's rows there). A keyless export gets
    `rows` = rows inserted and `deletes` = rows deleted, whole (`net_rows`), each with one more column,
    `_commit_version`: the version of the commit that inserted or deleted it (rows of the snapshot, FULL or of
    replaced partitions, have none). `expected` is what `delivered()` answered: the target refuses
    (`ConcurrentDeliveryError`) when it holds another version by the time it writes."""

    export: ExportSpec
    mode: Mode
    reason: Reason
    version: int
    source_table: str
    source_table_id: str | None
    delta_fields: list[dict]  # the table's Delta schema fields at `version` (names, types, nullability)
    schema: pa.Schema  # the same as Arrow: every batch of `rows` has it
    key: tuple[str, ...]
    rows: Iterable[pa.RecordBatch]
    deletes: pa.Table | None = None
    replace: tuple[Interval, ...] = ()
    time_column: str | None = None
    expected: Delivered | None = None
    detail: str = ""
    source: Spec | None = None  # the flow or stage read (its key columns and time column)
    pinned: Any = None  # the source table at `version` (`changes.Pinned`), for a target that reads rows of it

    @property
    def source_granularity(self) -> Granularity | None:
        """The source's partitioning: a row's partition is the key of its `time_column` value."""
        return self.source.granularity if self.source is not None else None


@dataclass(frozen=True)
class Applied:
    """What a target did: rows it wrote (inserted or changed), rows it deleted, and anything else it counts.
    `partial`: it delivered only part of the changes (a webhook out of time): it holds `delivered_version`
    (None: nothing yet), not `Changes.version`; the next delivery goes on from there."""

    rows_upserted: int = 0
    rows_deleted: int = 0
    extra: dict = field(default_factory=dict)  # e.g. a webhook's retries and dead letters
    partial: bool = False
    delivered_version: int | None = None
    detail: str = ""  # what the delivery's detail does not say (added to it)


@dataclass(frozen=True)
class TargetContext:
    """What a target may need of the delivery besides its export and connection: the lake (a webhook keeps
    its delivered version and dead letters there) and the crash hook, called at `EXPORT_STEPS`."""

    layout: Layout
    hook: Callable[[str], None]


class Target(Protocol):
    """An export's target. Built per delivery (`open_target`), closed after it."""

    def describe(self) -> str:
        """Where it writes, for messages and metadata: host, database, table; never a secret."""

    def delivered(self) -> Delivered | None:
        """The version it holds, or None before its first delivery."""

    def apply(self, changes: Changes) -> Applied:
        """Write `changes` and record `changes.version` as delivered, calling `context.hook` at
        export_after_rows and export_after_version; all or nothing where the target allows."""

    def close(self) -> None:
        """Release connections; called once, also after a failure."""


# kind -> "module:class" of its target, imported when an export of that kind delivers (so no client library is
# imported with the engine).
TARGETS: dict[str, str] = {
    "postgres": "laminar_assets.engine.export.postgres:PostgresTarget",
    "redis": "laminar_assets.engine.export.redis:RedisTarget",
    "webhook": "laminar_assets.engine.export.webhook:WebhookTarget",
}


def register_target(kind: str, path: str) -> None:
    """Make `kind`'s exports deliver through the class at `path` ("package.module:Class")."""
    TARGETS[kind] = path


def open_target(export: ExportSpec, connection: Connection, context: TargetContext) -> Target:
    """The target of `export`, built from its kind's registered class."""
    path = TARGETS.get(export.kind)
    if path is None:
        raise ExportError(f"export '{export.name}' is a {export.kind} export, whose delivery is not available in this "
                          f"version of Laminar (targets: {', '.join(sorted(TARGETS))})", export=export.name)
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)(export, connection, context)


def batches(table: pa.Table, rows: int) -> Iterator[pa.RecordBatch]:
    """`table` as record batches of at most `rows` rows."""
    yield from table.to_batches(max_chunksize=rows)
