"""The lake's record of each export's last delivery: `<root>/_laminar/exports/<export>.json`.

The target holds the authoritative delivered version (Postgres: `laminar_exports`, in the same transaction as
the rows). This record is what `laminar status`, `laminar_system.exports` and the sensors read without
reaching the target: the last delivery (version, when, mode, reason, rows) and, when deliveries fail, how many
in a row, since when, and the last error (one line, never a secret). A delivery that committed in the target
and then died before writing the record leaves the record one delivery behind; the next delivery finds the
target at that version (UP_TO_DATE) and writes it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta

from laminar_assets import storage

from ..delta.layout import SYSTEM_FOLDER
from ..delta.log import read_commit
from ..delta.tables import open_table


@dataclass(frozen=True)
class ExportRecord:
    export: str
    kind: str
    source: str
    target: str
    delivered_version: int | None = None
    source_table_id: str | None = None
    delivered_at: str | None = None  # ISO 8601 UTC
    mode: str | None = None
    reason: str | None = None
    detail: str = ""
    rows_upserted: int = 0
    rows_deleted: int = 0
    attempted_at: str | None = None
    failed: dict | None = field(default=None)  # {"count", "since", "error"} while deliveries fail in a row
    extra: dict = field(default_factory=dict)  # the last delivery's own counts (a webhook's rows sent, dead letters)

    def to_json(self) -> dict:
        return asdict(self)


def record_uri(root: str, export: str) -> str:
    return storage.join(root, SYSTEM_FOLDER, "exports", f"{export}.json")


def load(root: str, export: str) -> ExportRecord | None:
    data = storage.read(record_uri(root, export))
    if data is None:
        return None
    try:
        values = json.loads(data)
        return ExportRecord(**{k: v for k, v in values.items() if k in ExportRecord.__dataclass_fields__})
    except (ValueError, TypeError):
        return None  # a record another version wrote, or cut short: the next delivery writes it again


def save(root: str, record: ExportRecord) -> None:
    storage.write(record_uri(root, record.export), json.dumps(record.to_json(), sort_keys=True).encode())


def succeeded(before: ExportRecord | None, base: ExportRecord, *, version: int | None, table_id: str | None,
              mode: str, reason: str, detail: str, upserted: int, deleted: int, extra: dict | None = None) -> ExportRecord:
    """The record after a delivery that succeeded. One with nothing to deliver (NOOP) keeps the last delivery's
    mode, reason and rows, and takes the version the target holds (the record of a delivery whose process
    died after its commit catches up here)."""
    now = _now()
    if mode == "NOOP":
        kept = before if before is not None else replace(base, mode=mode, reason=reason, detail=detail)
        return replace(kept, target=base.target, attempted_at=now, failed=None,
                       delivered_version=version if version is not None else kept.delivered_version,
                       source_table_id=table_id if table_id is not None else kept.source_table_id,
                       delivered_at=kept.delivered_at or (now if version is not None else None))
    return replace(base, delivered_version=version, source_table_id=table_id, delivered_at=now, mode=mode,
                   reason=reason, detail=detail, rows_upserted=upserted, rows_deleted=deleted, attempted_at=now,
                   extra=dict(extra or {}))


def failed(before: ExportRecord | None, base: ExportRecord, error: str) -> ExportRecord:
    """The record after a delivery that failed: the last success kept, the failures in a row counted."""
    now = _now()
    previous = before.failed if before is not None else None
    failures = {"count": (previous or {}).get("count", 0) + 1, "since": (previous or {}).get("since", now), "error": error}
    kept = before if before is not None else base
    return replace(kept, target=base.target, attempted_at=now, failed=failures)


def lag(name: str, uri: str, delivered: int | None, *, now: datetime | None = None) -> tuple[int | None, float | None]:
    """(versions, seconds) the target is behind the table at `uri`: the versions committed since the delivered
    one, and how long ago the oldest of them was committed (0 when none is pending; None when nothing was
    delivered or the table cannot be read)."""
    if delivered is None:
        return None, None
    latest = open_table(name, uri).version()
    if latest <= delivered:
        return 0, 0.0
    oldest = read_commit(name, uri, delivered + 1, None)
    if oldest is None:  # its log entry is gone: at least as old as the oldest entry left, unknown here
        return latest - delivered, None
    seconds = ((now or datetime.now(UTC)) - oldest.timestamp) / timedelta(seconds=1)
    return latest - delivered, max(0.0, round(seconds, 3))


def _now() -> str:
    return datetime.now(UTC).isoformat()
