"""The webhook target: each new row of a flow's or stage's table POSTed as JSON, at least once, with an
idempotency key per row (`webhook_events`), retries and backpressure (`webhook_send`), and dead letters
(`dead_letters`). docs/exports.md ("Webhooks") says what a receiver gets.

A receiver holds no version, so the export keeps its own in the lake, `_laminar/exports/<export>.webhook.json`:
the source table's version delivered and, when a delivery stopped part way (out of time, the receiver gone
quiet), where in the next version's events it stopped, or how far a full delivery of a snapshot got. One
delivery:

    events      the rows of the change feed since the delivered version (new rows; removed ones too with
                retractions="send"), or every row of the table (a full delivery), in a fixed order
    send        requests, retried; a row that fails every attempt becomes a dead letter
    decide      the receiver never answered: the delivery fails, nothing is recorded, the rows stay pending
    dead letters   written to `_laminar/dead_letters/<export>`                    -> hook export_after_rows
    record      the version delivered (or where it stopped), replacing the record it read   -> export_after_version

A crash anywhere before the record sends the same rows again next time, under the same keys: at least once,
never lost. A delivery's record moves only from the one it read (a conditional write), so two deliveries of
one export never move it backwards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
from deltalake.exceptions import DeltaError

from laminar_assets import storage
from laminar_assets.errors import ConcurrentDeliveryError, ExportError, ExportTargetError

from ..delta.arrow_reads import arrow_dataset
from ..delta.layout import SYSTEM_FOLDER
from ..delta.tables import open_delta
from ..spec.exports import WebhookExport
from . import dead_letters
from .changes import plain_schema
from .connections import Connection
from .protocol import Applied, Changes, Delivered, Mode, Reason, TargetContext
from .webhook_events import INSERT, RETRACT, Event, change_events, snapshot_events
from .webhook_send import OUT_OF_TIME, SILENT, UNREACHABLE, Endpoint, Report, Request, Sender


def state_uri(root: str, export: str) -> str:
    return storage.join(root, SYSTEM_FOLDER, "exports", f"{export}.webhook.json")


class WebhookTarget:
    """The target of a `WebhookExport` over one connection (its URL; a bearer token or a password as options)."""

    def __init__(self, export: WebhookExport, connection: Connection, context: TargetContext) -> None:
        self.export = export
        self.context = context
        self.endpoint = Endpoint.of(export, connection)
        self.uri = state_uri(context.layout.root, export.name)
        self._state: dict | None = None
        self._tag: str | None = None

    def describe(self) -> str:
        return f"webhook {self.endpoint.where}"

    # --- the protocol ------------------------------------------------------------------
    def delivered(self) -> Delivered | None:
        found = storage.read_tagged(self.uri)
        self._state, self._tag = None, None
        if found is None:
            return None
        try:
            state = json.loads(found[0])
            version = state["delivered_version"]
        except (ValueError, KeyError, TypeError):
            raise ExportError(f"export '{self.export.name}': its record of what it delivered ({self.uri}) cannot be "
                              "read; delete it to deliver from the start again (initial=...)",
                              export=self.export.name) from None
        self._state, self._tag = state, found[1]
        at = datetime.fromisoformat(state["delivered_at"]) if state.get("delivered_at") else None
        resync = state.get("resync")
        if version is None:
            return None
        if resync:
            return Delivered(version, state.get("source_table_id"), at,
                             f"a full delivery of version {resync['version']} stopped after {resync['rows']} row(s); "
                             "it goes on")
        return Delivered(version, state.get("source_table_id"), at)

    def apply(self, changes: Changes) -> Applied:
        export = self.export
        deadline = time.monotonic() + export.max_seconds
        state = self._state or {}
        resync = None
        notes: list[str] = []
        if changes.mode is Mode.FULL:
            resync = state.get("resync") if changes.reason is not Reason.FORCED_BY_USER else None
            if resync is None and changes.reason is not Reason.FORCED_BY_USER and export.initial == "skip":
                return self._skip(changes)
            resync = dict(resync) if resync else {"version": changes.version, "table_id": changes.source_table_id,
                                                  "rows": 0}
            total, events = self._snapshot(changes, resync)
            if resync["rows"]:
                notes.append(f"the full delivery of version {resync['version']} went on after its first "
                             f"{resync['rows']} row(s)")
        else:
            held = changes.expected.version if changes.expected is not None else None
            after = tuple(state["after"]) if state.get("after") and state.get("delivered_version") == held else None
            total, events = change_events(export, changes, after)
        report = Sender(export, self.endpoint, deadline, self.context.hook).run(self._requests(events)) \
            if total else Report()
        if total and not report.done_rows:
            raise self._nothing_done(report, total)
        written = self._dead_letters(report)
        self.context.hook("export_after_rows")
        complete = report.done_rows >= total
        if resync is not None:
            version = resync["version"] if complete else state.get("delivered_version")
            new = {"delivered_version": version, "source_table_id": resync["table_id"] if complete else
                   state.get("source_table_id"), "after": None,
                   "resync": None if complete else {**resync, "rows": resync["rows"] + report.done_rows}}
        elif complete:
            version = changes.version
            new = {"delivered_version": version, "source_table_id": changes.source_table_id, "after": None}
        else:  # up to the last event done: the versions before its own, and its place in its version
            assert report.done_last is not None  # done_rows > 0 here (none done raised above), so one request was done
            version = report.done_last[0] - 1
            new = {"delivered_version": version, "source_table_id": changes.source_table_id,
                   "after": list(report.done_last)}
        self._record(new, state)
        self.context.hook("export_after_version")
        sent = report.sent_rows
        if not complete:
            notes.append(f"{total - report.done_rows} of {total} row(s) pending ({report.stopped}): the next delivery "
                         "sends them")
        extra = {"webhook": self.endpoint.where, "requests": report.requests,
                 "rows_sent": sum(sent.values()), "retractions_sent": sent.get(RETRACT, 0), "retries": report.retries,
                 "dead_letters": written, "pending_rows": total - report.done_rows,
                 "stopped": report.stopped or ""}
        return Applied(rows_upserted=sent.get(INSERT, 0), rows_deleted=sent.get(RETRACT, 0), extra=extra,
                       partial=version != changes.version, delivered_version=version, detail="; ".join(notes))

    def close(self) -> None:
        self._state, self._tag = None, None

    # --- one delivery ------------------------------------------------------------------
    def _skip(self, changes: Changes) -> Applied:
        """A delivery with nothing to read changes from and `initial="skip"`: the table's rows are not sent; the
        next delivery sends what changes after its version."""
        try:
            skipped = arrow_dataset(self._table_uri(changes), open_delta(self._table_uri(changes), changes.version)) \
                .count_rows()
        except (DeltaError, OSError, pa.ArrowException):
            skipped = None  # only the count is unknown
        self.context.hook("export_after_rows")
        self._record({"delivered_version": changes.version, "source_table_id": changes.source_table_id, "after": None},
                     self._state or {})
        self.context.hook("export_after_version")
        rows = "its rows" if skipped is None else f"its {skipped} row(s)"
        return Applied(extra={"webhook": self.endpoint.where, "requests": 0, "rows_sent": 0, "retractions_sent": 0,
                              "retries": 0, "dead_letters": 0, "pending_rows": 0, "stopped": "",
                              "rows_skipped": skipped if skipped is not None else -1},
                       detail=f"initial='skip': {rows} at version {changes.version} not sent, only what changes after")

    def _table_uri(self, changes: Changes) -> str:
        return self.context.layout.table_uri(changes.source_table)

    def _snapshot(self, changes: Changes, resync: dict) -> tuple[int, Iterator[Event]]:
        """The events of every row of the table at the resync's version, after the rows it sent already; a
        resync whose version can no longer be read (vacuumed, the table recreated) starts again at the pinned one."""
        uri = self._table_uri(changes)
        try:
            table = open_delta(uri, resync["version"])
            if table.metadata().id != resync["table_id"]:
                raise ValueError("another table")
        except (DeltaError, OSError, ValueError):
            resync.update(version=changes.version, table_id=changes.source_table_id, rows=0)
            table = open_delta(uri, changes.version)
        schema = plain_schema(pa.schema(table.schema().to_arrow()))
        return snapshot_events(self.export, arrow_dataset(uri, table), schema, resync["version"], resync["rows"],
                               changes.time_column, changes.source_granularity)

    def _requests(self, events: Iterator[Event]) -> Iterator[Request]:
        batch: list[Event] = []
        index = 0
        for event in events:
            batch.append(event)
            if len(batch) == self.export.rows_per_request:
                yield Request.of(index, batch, self.export)
                batch, index = [], index + 1
        if batch:
            yield Request.of(index, batch, self.export)

    def _nothing_done(self, report: Report, total: int) -> ExportTargetError:
        """A delivery that got nothing done: the receiver never answered, went quiet, or time ran out first."""
        name, where = self.export.name, self.endpoint.where
        pending = f"nothing was delivered and its delivered version did not move: the next delivery sends the " \
                  f"{total} pending row(s)"
        if report.stopped == UNREACHABLE or not report.answered:
            why = f"{report.first_error}, {self.export.max_attempts} attempt(s)" if report.first_error else "no answer"
            return ExportTargetError(f"export '{name}': cannot reach the webhook at {where} ({why}); {pending}",
                                     export=name, webhook=where, retryable=True)
        what = "stopped answering" if report.stopped == SILENT else \
            f"did not take a row within the delivery's {self.export.max_seconds:g}s (max_seconds)" \
            if report.stopped == OUT_OF_TIME else "took no row"
        return ExportTargetError(f"export '{name}': the webhook at {where} {what}; {pending}", export=name,
                                 webhook=where, retryable=True)

    def _dead_letters(self, report: Report) -> int:
        letters = [{"export": self.export.name, "source": self.export.source, "idempotency_key": e.key, "op": e.op,
                    "version": e.version, "partition": e.partition, "status": o.status, "error": o.error,
                    "attempts": o.attempts, "row": e.row_json} for e, o in report.dead]
        try:
            return dead_letters.write(self.context.layout.root, self.export.name, letters)
        except (DeltaError, OSError, pa.ArrowException) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ExportError(f"export '{self.export.name}': its {len(letters)} dead letter(s) could not be written to "
                              f"{dead_letters.table_uri(self.context.layout.root, self.export.name)} ({first}); the "
                              "delivered version did not move: the next delivery sends those rows again",
                              export=self.export.name) from exc

    def _record(self, new: dict, read: dict) -> None:
        """Write the export's record of what it delivered, only over the record `delivered()` read."""
        moved = {"delivered_at": datetime.now(UTC).isoformat()} if new.get("delivered_version") != \
            read.get("delivered_version") or "delivered_at" not in read else {"delivered_at": read["delivered_at"]}
        data = json.dumps({"export": self.export.name, "resync": None, **new, **moved}, sort_keys=True).encode()
        done = storage.create(self.uri, data) if self._tag is None else storage.replace_if(self.uri, data, self._tag)
        if not done:
            raise ConcurrentDeliveryError(f"export '{self.export.name}': another delivery recorded what it delivered "
                                          f"while this one ran ({self.uri}); its rows went out (receivers drop the "
                                          "duplicates by their keys), the next delivery goes on from the other's record",
                                          export=self.export.name)
        self._tag = None
        self._state = None
