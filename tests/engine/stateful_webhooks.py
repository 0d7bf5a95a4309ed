"""Webhook exports in the random stateful test (issue #61): what `ExportRules` (tests/engine/stateful_exports.py)
knows of a `WebhookExport` and checks after every step, when the test gives the machine a receiver
(`LakeMachine.webhook_receiver`: tests/engine/export/receiver.py, a real HTTP server on 127.0.0.1 that answers
200 and records every request).

The export sends removals too (`retractions="send"`) and every row on a first delivery (`initial="all"`), so a
receiver that drops the events whose `Idempotency-Key` it has seen and applies the rest (an insert adds its row,
a retract removes one) holds the sink. After every step, for every webhook export, with D its delivered version
(the lake's `_laminar/exports/<export>.webhook.json`, docs/exports.md):

- one key, one event: every request that carried a key carried the same op, version, partition and row;
- at least once: every row of the sink at D came in an insert;
- deduplicated, the events since the last full delivery are the sink at D, row for row (a full delivery, the
  first one or a forced resync, sends every row under new keys: a receiver starts again from it).

Where the receiver cannot know which events to keep, the last check waits: after a forced resync killed before
it recorded its version (its rows went out under keys no later delivery sends again: only the next full delivery
puts the receiver right, as the teardown's does), and after any delivery killed before it recorded (until the
next recorded delivery says whether it sent the same changes again, under the same keys, or every row).

The comparisons read the sink with `deltalake` and parse the received JSON by the sink's column types here:
nothing is shared with the export's implementation.
"""

from __future__ import annotations

import json
import math
from collections import Counter
from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa

from laminar_assets import storage
from laminar_assets.engine import WebhookExport
from laminar_assets.engine.export import Connection

CONNECTION = "hook"


def webhook_export(spec, receiver) -> tuple[WebhookExport, Connection]:
    """The webhook export of `spec` and its connection: no pacing, one request at a time (so requests arrive in
    the order sent), ten rows a request, one attempt (the receiver answers 200)."""
    return (WebhookExport(name=f"{spec.name}_hook", source=spec.name, connection=CONNECTION, retractions="send",
                          initial="all", rows_per_request=10, max_rows_per_second=None, max_in_flight=1,
                          max_attempts=1, timeout_seconds=10, batch_rows=7),
            Connection(CONNECTION, receiver.url))


def delivered(root: str, export: str) -> int | None:
    """The webhook export's delivered version, from its record in the lake (None: none yet)."""
    found = storage.read_tagged(storage.join(root, "_laminar", "exports", f"{export}.webhook.json"))
    return None if found is None else json.loads(found[0]).get("delivered_version")


def events(receiver, export: str, start: int = 0) -> list[dict]:
    """The events of `export` in the requests the receiver answered 200, from its request number `start` on."""
    return [e for r in receiver.since(start) if r.answer == 200 for e in r.events if e["export"] == export]


def one_event_per_key(got: list[dict], where: str) -> None:
    seen: dict[str, tuple] = {}
    for e in got:
        body = (e["op"], e["version"], e["partition"], json.dumps(e["row"], sort_keys=True))
        assert seen.setdefault(e["idempotency_key"], body) == body, \
            f"{where}: key {e['idempotency_key']} came with {seen[e['idempotency_key']]} and with {body}"


def sink_multiset(rows: list[dict], schema: pa.Schema) -> Counter:
    return Counter(tuple(_from_sink(r.get(f.name)) for f in schema) for r in rows)


def received_multiset(got: list[dict], schema: pa.Schema, *, net: bool) -> Counter:
    """The rows of the events (parsed by `schema`), deduplicated by key: inserts, minus retracts when `net`. A
    row that does not parse as `schema` (sent under an older schema) is left out."""
    out: Counter = Counter()
    seen: set[str] = set()
    for e in got:
        if e["idempotency_key"] in seen or (not net and e["op"] != "insert"):
            continue
        seen.add(e["idempotency_key"])
        try:
            row = tuple(_from_json(e["row"].get(f.name), f.type) for f in schema)
        except (TypeError, ValueError, KeyError):
            continue
        out[row] += 1 if e["op"] == "insert" else -1
    return out


def holds(receiver, export: str, mark: int, rows: list[dict], schema: pa.Schema) -> bool:
    """Whether the events from request number `mark` on, deduplicated, are the sink's `rows`."""
    held = received_multiset(events(receiver, export, mark), schema, net=True)
    return Counter({r: n for r, n in held.items() if n}) == sink_multiset(rows, schema)


def killed(receiver, root: str, target, how: str, sink_at) -> None:
    """What the receiver's events say after a webhook delivery was killed: a forced resync's rows are there for
    good (the last check waits for the next full delivery); a delivery that recorded its version was whole (a
    full one when the events since it began are the sink by themselves); one that did not is sent again by the
    next (the last check waits for it). `sink_at(target, version)`: the sink's rows and schema at a version."""
    from tests.engine.stateful_exports import EVERY_KEY

    now = delivered(root, target.export.name)
    if now == target.before:
        if how == "full":
            target.edited.add(EVERY_KEY)
        else:
            target.unconfirmed = True
        return
    target.unconfirmed = False
    if how == "full":
        target.mark, target.edited = target.started, set()
    elif not target.edited and not holds(receiver, target.export.name, target.mark, *sink_at(target, now)):
        target.mark = target.started  # a full delivery (a first one, a new schema, a gap in the feed)


def check(receiver, target, version: int | None, rows: list[dict] | None, schema: pa.Schema | None,
          where: str) -> None:
    """The three checks of the module docstring, for the sink's `rows` at the delivered `version`."""
    every = events(receiver, target.export.name)
    one_event_per_key(every, where)
    if version is None:
        return
    want = sink_multiset(rows, schema)
    sent = received_multiset(every, schema, net=False)
    missing = sorted(set(want) - set(sent), key=repr)
    assert not missing, f"{where}: rows of the sink at version {version} never sent: {missing}"
    if target.edited or target.unconfirmed:
        return
    held = received_multiset(events(receiver, target.export.name, target.mark), schema, net=True)
    held = Counter({r: n for r, n in held.items() if n})
    assert held == want, (f"{where}: the events since the last full delivery, deduplicated, are not the sink at "
                          f"version {version}: missing {sorted(want - held, key=repr)}, extra "
                          f"{sorted(held - want, key=repr)}, negative {sorted((r for r, n in held.items() if n < 0), key=repr)}")


def _from_sink(value):
    if isinstance(value, datetime):
        return value.astimezone(UTC) if value.tzinfo else value
    if isinstance(value, float) and math.isnan(value):
        return None  # JSON has no NaN: sent as null
    return value


def _from_json(value, kind: pa.DataType):
    """A JSON value of the row as the sink's column type holds it (docs/exports.md: what `row` holds)."""
    if value is None:
        return None
    if pa.types.is_timestamp(kind):
        at = datetime.fromisoformat(value)
        return at.astimezone(UTC) if at.tzinfo else at
    if pa.types.is_date(kind):
        return date.fromisoformat(value)
    if pa.types.is_decimal(kind):
        return Decimal(value)
    if pa.types.is_floating(kind):
        return _from_sink(float(value))
    if pa.types.is_integer(kind):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{value!r} is no integer")
        return value
    if pa.types.is_boolean(kind):
        if not isinstance(value, bool):
            raise TypeError(f"{value!r} is no boolean")
        return value
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        if not isinstance(value, str):
            raise TypeError(f"{value!r} is no string")
        return value
    return json.dumps(value, sort_keys=True)
