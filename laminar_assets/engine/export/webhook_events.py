"""What a webhook export sends: the rows of one delivery as events, each with its idempotency key, in the
order the delivery goes through them (its progress is a place in that order).

An event is one row: `op` "insert" (a new row, or the new state of a corrected one) or "retract" (a deleted
row, or the old state of a corrected one), the version of the source table's commit that made the change,
the row's partition, and its idempotency key:

    sha256(export, partition, version, op, sha256(the row's values as canonical JSON)[, n])

`n` (from 1) tells identical rows of one commit apart (a keyless stage may hold a row twice). The same change
has the same key in every delivery that sends it (a rerun after a crash, a delivery that goes on from where
the last one stopped), so a receiver drops duplicates by it. A full delivery's rows (every row of the table at
version V: a first delivery with `initial="all"`, a forced resync) take V as their version and their place in
the snapshot (file, row) as the row's identity: a later resync sends them again under new keys.

Events of a delivery of changes are ordered by (version, retractions first, key); a full delivery's by its
snapshot's files (by path) and their rows. Rows stay Arrow until they are sent, turned into JSON a batch at a
time: only the keys, partitions and JSON texts of the change rows are held, never a whole table as Python
objects.
"""

from __future__ import annotations

import base64
import hashlib
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ..spec.exports import WebhookExport
from ..windows import Granularity, partition_key
from .changes import COMMIT_VERSION, conform
from .protocol import Changes

INSERT, RETRACT = "insert", "retract"
_OP_RANK = {RETRACT: 0, INSERT: 1}  # a correction's old state goes before its new one
_VERSION, _OP, _KEY, _PARTITION, _JSON = "__version", "__op", "__key", "__partition", "__json"


@dataclass(frozen=True)
class Event:
    op: str
    version: int
    partition: str | None
    key: str
    row_json: str  # the row, as JSON, its columns in the table's order
    place: tuple  # where it is in the delivery's order: (version, op rank, key), or (index,) in a snapshot

    def body(self, export: WebhookExport) -> dict:
        """The JSON object sent for this row (its `row` kept as the text already made)."""
        return {"op": self.op, "export": export.name, "source": export.source, "partition": self.partition,
                "version": self.version, "idempotency_key": self.key, "row": _Raw(self.row_json)}


class _Raw(str):
    """A JSON text placed as it is in a body (`dumps`)."""


def dumps(value) -> str:
    """`value` as JSON, `_Raw` texts in it as they are."""
    if isinstance(value, _Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(dumps(v) for v in value) + "]"
    return json.dumps(value)


def jsonable(value):
    """A value of `RecordBatch.to_pylist()` as JSON takes it: times as ISO 8601, decimals as strings (exact),
    bytes as base64, a map as an object, NaN and infinities as null."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, (datetime, date, time)):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray)):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return {str(k): jsonable(v) for k, v in value}  # a map column: [(key, value), ...]
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    return str(value)


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def event_key(export: str, partition: str | None, version: int, op: str, identity: str) -> str:
    """The idempotency key of one row's change (see the module's docstring)."""
    return _sha(json.dumps([export, partition, version, op, identity]))


def _described(batch: pa.RecordBatch, time_column: str | None, granularity: Granularity | None
               ) -> tuple[list[str], list[str], list[str | None]]:
    """Per row of `batch`: its JSON text, the hash of its values (canonical JSON), its partition key."""
    texts, hashes, partitions = [], [], []
    times = batch.column(time_column).to_pylist() if time_column in batch.schema.names and granularity else None
    for i, row in enumerate(batch.to_pylist()):
        values = {k: jsonable(v) for k, v in row.items()}
        texts.append(json.dumps(values))
        hashes.append(_sha(json.dumps(values, sort_keys=True, separators=(",", ":"))))
        ts = times[i] if times is not None else None
        # a datetime only when `times` was read, i.e. with a granularity
        partitions.append(partition_key(ts, granularity) if isinstance(ts, datetime) and granularity is not None else None)
    return texts, hashes, partitions


def change_events(export: WebhookExport, changes: Changes, after: tuple | None) -> tuple[int, Iterator[Event]]:
    """The events of a delivery of changes (its new rows; its removed ones too with `retractions="send"`), in
    order, leaving out those at or before `after` (where the last delivery stopped): (how many, the events)."""
    schema = changes.schema
    parts = []
    for batch in changes.rows:
        parts.append(_tagged(batch, schema, INSERT, changes.version))
    if export.retractions == "send" and changes.deletes is not None:
        parts += [_tagged(b, schema, RETRACT, changes.version) for b in changes.deletes.to_batches(export.batch_rows)]
    table = pa.Table.from_batches(parts) if parts else None
    if table is None or not table.num_rows:
        return 0, iter(())
    keys, texts, partitions = [], [], []
    for batch in table.select(schema.names).to_batches(max_chunksize=export.batch_rows):
        row_texts, hashes, parts_of = _described(batch, changes.time_column, changes.source_granularity)
        texts += row_texts
        partitions += parts_of
        keys += hashes
    versions = table.column(_VERSION).to_pylist()
    ops = table.column(_OP).to_pylist()
    keys = [event_key(export.name, p, v, op, h) for p, v, op, h in zip(partitions, versions, ops, keys)]
    table = table.append_column(_KEY, pa.array(_distinct(keys), pa.string())) \
        .append_column(_PARTITION, pa.array(partitions, pa.string())).append_column(_JSON, pa.array(texts, pa.string()))
    del keys, texts, partitions
    rank = pc.if_else(pc.equal(table.column(_OP), RETRACT), 0, 1)
    table = table.append_column("__rank", rank).sort_by([(_VERSION, "ascending"), ("__rank", "ascending"),
                                                          (_KEY, "ascending")])
    if after is not None:
        table = table.filter(_later(table, after))
    return table.num_rows, _events_of(table, export.batch_rows)


def _tagged(batch: pa.RecordBatch, schema: pa.Schema, op: str, version: int) -> pa.RecordBatch:
    """`batch` in `schema`, with the version of each row's change (its `_commit_version`, else `version`: a row
    of the snapshot) and `op`."""
    versions = batch.column(COMMIT_VERSION) if COMMIT_VERSION in batch.schema.names else \
        pa.array(np.full(batch.num_rows, version, np.int64))
    plain = conform(batch, schema)
    return pa.RecordBatch.from_arrays([*plain.columns, versions.cast(pa.int64()), pa.array([op] * batch.num_rows, pa.string())],
                                      schema=schema.append(pa.field(_VERSION, pa.int64())).append(pa.field(_OP, pa.string())))


def _distinct(keys: list[str]) -> list[str]:
    """`keys` with the n-th repeat (n >= 1) of a key made its own: identical rows of one commit."""
    seen: dict[str, int] = {}
    out = []
    for key in keys:
        n = seen.get(key, 0)
        seen[key] = n + 1
        out.append(key if n == 0 else _sha(f"{key}#{n}"))
    return out


def _later(table: pa.Table, after: tuple) -> pa.Array:
    """Rows whose (version, op rank, key) is after `after`."""
    version, rank, key = after
    v, r, k = table.column(_VERSION), table.column("__rank"), table.column(_KEY)
    same_v, same_r = pc.equal(v, version), pc.equal(r, rank)
    return pc.or_(pc.greater(v, version),
                  pc.and_(same_v, pc.or_(pc.greater(r, rank), pc.and_(same_r, pc.greater(k, key)))))


def _events_of(table: pa.Table, chunk: int) -> Iterator[Event]:
    for batch in table.select([_OP, _VERSION, _PARTITION, _KEY, _JSON, "__rank"]).to_batches(max_chunksize=chunk):
        for op, version, partition, key, text, rank in zip(*(c.to_pylist() for c in batch.columns)):
            yield Event(op, version, partition, key, text, (version, rank, key))


def snapshot_events(export: WebhookExport, dataset, schema: pa.Schema, version: int, skip: int,
                    time_column: str | None, granularity: Granularity | None) -> tuple[int, Iterator[Event]]:
    """Every row of a snapshot (`dataset`, the table at `version`) as an insert event, its files in the order of
    their paths, leaving out the first `skip` rows (sent by an earlier delivery of the same snapshot): (how
    many, the events)."""
    fragments = sorted(dataset.get_fragments(), key=lambda f: f.path)
    sizes = [f.count_rows() for f in fragments]
    total = max(0, sum(sizes) - skip)

    def events() -> Iterator[Event]:
        index = 0
        for fragment, size in zip(fragments, sizes):
            if index + size <= skip:
                index += size
                continue
            position = 0
            for batch in fragment.to_batches(schema=dataset.schema, batch_size=export.batch_rows, use_threads=False):
                texts, hashes, partitions = _described(conform(batch, schema), time_column, granularity)
                for text, row_hash, partition in zip(texts, hashes, partitions):
                    if index >= skip:
                        identity = f"{row_hash}@{fragment.path}#{position}"
                        yield Event(INSERT, version, partition, event_key(export.name, partition, version, INSERT,
                                                                          identity), text, (index,))
                    index += 1
                    position += 1
    return total, events()
