"""Each export's state as the lake knows it, without reaching its target: the last delivery's record
(`export.records`) beside its source table's current version, for `laminar status` and `laminar_system.exports`."""

from __future__ import annotations

from datetime import UTC, datetime

from deltalake.exceptions import DeltaError

from laminar_assets.errors import LaminarError

from ..delta.tables import is_delta_table, open_table, resolve_uri
from ..export import dead_letters
from ..export.records import lag, load
from ..spec.exports import ExportSpec
from ..spec.specs import Spec


def export_status(root: str, exports: list[ExportSpec], specs: list[Spec]) -> list[dict]:
    """Per export: kind, source, target, the version delivered and the source table's version now, the lag in
    versions and seconds (of the oldest commit not delivered), the last delivery (when, mode, reason, rows) and,
    while deliveries fail, how many in a row, since when and the last error; for a webhook, its dead letters and
    its last delivery's rows sent, retries and rows pending. A target's own record (Postgres:
    `laminar_exports`) is the authority; a delivery whose process died after its commit shows here one behind."""
    by_name = {s.name: s for s in specs}
    now = datetime.now(UTC)
    out = []
    for export in exports:
        record = load(root, export.name)
        source = by_name.get(export.source)
        sink = source.sink_name if source is not None else None
        uri = resolve_uri(root, sink) if sink is not None else None
        delivered = record.delivered_version if record is not None else None
        version = versions = seconds = None
        try:
            if sink is not None and uri is not None and is_delta_table(uri):
                version = open_table(sink, uri).version()
                versions, seconds = lag(sink, uri, delivered, now=now)
        except LaminarError:  # a source that cannot be read: its row says nothing of the lag
            pass
        failed = record.failed if record is not None else None
        out.append({
            "export": export.name, "kind": export.kind, "source": export.source,
            "target": record.target if record is not None else export.target,
            "delivered_version": delivered, "source_version": version, "lag_versions": versions, "lag_seconds": seconds,
            "delivered_at": record.delivered_at if record is not None else None,
            "mode": record.mode if record is not None else None, "reason": record.reason if record is not None else None,
            "detail": record.detail if record is not None else "",
            "rows_upserted": record.rows_upserted if record is not None else 0,
            "rows_deleted": record.rows_deleted if record is not None else 0,
            "failed": failed,
            **_webhook(root, export, record.extra if record is not None else {}),
        })
    return out


def _webhook(root: str, export: ExportSpec, last: dict) -> dict:
    """A webhook export's dead letters (rows in its dead-letter table) and its last delivery's rows sent, retries
    and rows left pending; nothing for other kinds."""
    if export.kind != "webhook":
        return {}
    try:
        letters = dead_letters.count(root, export.name) or 0
    except (LaminarError, DeltaError, OSError):  # a table that cannot be read: its count is unknown
        letters = None
    return {"dead_letters": letters, "dead_letter_table": dead_letters.table_uri(root, export.name),
            **{k: last.get(k) for k in ("rows_sent", "retries", "pending_rows")}}


def describe_export_failures(failed: dict) -> str:
    """One line: how many deliveries failed in a row, since when, and the last one's error."""
    runs = "the last delivery" if failed["count"] == 1 else f"the last {failed['count']} deliveries"
    return f"{runs} failed (since {failed['since'][:19].replace('T', ' ')} UTC): {failed['error']}"
