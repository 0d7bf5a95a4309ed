"""One delivery of an export, top to bottom (no Spark, no Dagster):

    pin the source table          its latest version V (every read below is of this snapshot)
    ask the target                the version it delivered (`Target.delivered`)
    decide                        NOOP, the change feed of (delivered, V] (INCREMENTAL), or every row at V (FULL)
    read                          the change feed collapsed per key (`changes.net_changes`), or the snapshot, streamed
    apply                         rows and V together (`Target.apply`: one transaction for Postgres)
    record                        the lake's record of the delivery (`records`), the lag behind the source

A delivery only moves the delivered version forward from what it read (the target's guard), so two deliveries
of one export never apply one change twice, and a crash at any step leaves the target at the old version or
the new one, whole: the next delivery reads from there.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from deltalake.exceptions import DeltaError

from laminar_assets import storage
from laminar_assets.errors import ExportError, InjectedCrash, LaminarError

from ..delta.layout import Layout
from ..delta.log import read_commit
from ..spec.exports import ExportSpec, export_key
from ..spec.specs import Spec
from ..windows import Interval, partition_interval
from . import changes as feed
from . import records
from .connections import Connection, resolve
from .protocol import Changes, Delivered, Mode, Reason, TargetContext, open_target

log = logging.getLogger(__name__)


@dataclass
class DeliveryResult:
    """What one delivery did and measured (Dagster metadata, `laminar status` and the tests read it)."""

    export: str
    kind: str
    target: str
    mode: Mode
    reason: Reason
    detail: str
    from_version: int | None  # what the target held before
    to_version: int | None  # the version the target holds after (the pinned one), None when nothing was delivered
    source_table_id: str | None = None  # the Delta id of the source table delivered
    rows_upserted: int = 0
    rows_deleted: int = 0
    change_rows: int = 0  # rows of the change feed read
    partitions_replaced: tuple[str, ...] = ()
    lag_versions: int | None = None  # behind the source table when the delivery ended
    lag_seconds: float | None = None
    commit_age_seconds: float | None = None  # from the pinned version's commit to the delivery's end
    seconds: dict[str, float] = field(default_factory=dict)
    extra: dict = field(default_factory=dict)  # a target's own counts (retries, dead letters)

    @property
    def delivered_version(self) -> int | None:
        return self.to_version if self.to_version is not None else self.from_version

    def to_json(self) -> dict:
        return {"export": self.export, "kind": self.kind, "target": self.target, "mode": self.mode.value,
                "reason": self.reason.value, "detail": self.detail, "from_version": self.from_version,
                "delivered_version": self.delivered_version, "rows_upserted": self.rows_upserted,
                "rows_deleted": self.rows_deleted, "change_rows": self.change_rows,
                "partitions_replaced": list(self.partitions_replaced), "lag_versions": self.lag_versions,
                "lag_seconds": self.lag_seconds, "commit_age_seconds": self.commit_age_seconds,
                "seconds": dict(self.seconds), **self.extra}


class Exporter:
    """Delivers exports of the flows and stages under `root`. `connections`: by name (the Dagster resource's);
    a connection not given comes from the environment (LAMINAR_CONNECTION_<NAME>_URL). `hook(step)` is called
    at each of `protocol.EXPORT_STEPS` (tests crash there)."""

    def __init__(self, root: str, *, connections: Mapping[str, Connection] | None = None,
                 hook: Callable[[str], None] | None = None) -> None:
        self.layout = Layout(storage.resolve_root(root))
        self.connections = dict(connections or {})
        self.hook = hook or (lambda step: None)

    def deliver(self, export: ExportSpec, source: Spec, *, partitions: list[str] | tuple[str, ...] = (),
                full: bool = False) -> DeliveryResult:
        """Bring `export`'s target up to the latest version of `source`'s table. `partitions` (keys of the
        source's partitioning): also replace the target's rows of those partitions with the table's (a
        backfill repairs them; a target that holds no rows to repair, a webhook's, delivers what is pending and
        says so). `full`: replace every row (FORCED_BY_USER). A failure raises a `LaminarError` (its delivered
        version did not move) after counting it in the lake's record."""
        if export.source != source.name:
            raise ExportError(f"export '{export.name}' reads '{export.source}', not '{source.name}'", export=export.name)
        ignored = () if export.repairs_partitions else tuple(dict.fromkeys(partitions))
        if ignored:
            partitions = ()
        try:
            ranges = tuple(partition_interval(k, source.granularity) for k in dict.fromkeys(partitions))
        except ValueError as exc:
            raise ExportError(f"export '{export.name}': bad partition key for '{source.name}': {exc}; nothing was "
                              "delivered", export=export.name, flow=source.name) from None
        root = self.layout.root
        before = records.load(root, export.name)
        base = records.ExportRecord(export.name, export.kind, export.source, export.target)
        target = None
        try:
            connection = resolve(export.name, export.connection, self.connections, example=export.url_example)
            target = open_target(export, connection, TargetContext(self.layout, self.hook))
            base = replace(base, target=target.describe())
            result = self._deliver(export, source, target, ranges, tuple(dict.fromkeys(partitions)), full)
        except InjectedCrash:
            raise  # a simulated kill writes nothing more
        except LaminarError as exc:
            _save(root, records.failed(before, base, exc.message))
            raise
        finally:
            if target is not None:
                target.close()
        if ignored:
            result.detail = (f"{result.detail}; partitions {', '.join(ignored)} asked for: a {export.kind} export "
                             "re-sends no partition's rows (its receiver holds none to replace), it sends what is pending")
        _save(root, records.succeeded(before, base, version=result.delivered_version, table_id=result.source_table_id,
                                      mode=result.mode.value, reason=result.reason.value, detail=result.detail,
                                      upserted=result.rows_upserted, deleted=result.rows_deleted, extra=result.extra))
        return result

    def _deliver(self, export: ExportSpec, source: Spec, target, ranges: tuple[Interval, ...], keys: tuple[str, ...],
                 full: bool) -> DeliveryResult:
        started = time.perf_counter()
        uri = self.layout.sink_uri(source)
        pinned = _read(export, source, lambda: feed.pin(source.sink_name, uri))
        delivered = target.delivered()
        before = delivered.version if delivered else None
        if pinned is None:
            return DeliveryResult(export.name, export.kind, target.describe(), Mode.NOOP, Reason.SOURCE_NOT_WRITTEN,
                                  f"'{source.name}' has not written its table yet ({uri})", before, before)
        key = export_key(source) if export.needs_key else ()
        feed.check_key(export.name, pinned, key)
        mode, reason, detail = _read(export, source, lambda: self._decide(pinned, delivered, full))
        out = DeliveryResult(export.name, export.kind, target.describe(), mode, reason, detail, before, pinned.version,
                             pinned.table_id)
        if mode is Mode.NOOP and not ranges:
            return self._finish(out, pinned, started, {})
        t0 = time.perf_counter()
        deletes = None
        column = source.output_time_column
        changed = None
        if mode is Mode.INCREMENTAL:
            try:
                changed = feed.change_rows(pinned, delivered.version)
            except (DeltaError, OSError, pa.ArrowException) as exc:
                gone = _missing_file(exc)
                if gone is None:
                    raise _unreadable(export, source, exc) from exc
                mode, reason, detail = Mode.FULL, Reason.CHANGE_FEED_EXPIRED, (
                    f"the change feed of '{pinned.name}' since version {delivered.version} names a file that is gone "
                    f"({gone})")
                out.mode, out.reason, out.detail = mode, reason, detail
        if mode is Mode.FULL:
            rows: Iterator[pa.RecordBatch] = feed.snapshot_batches(pinned, export.batch_rows)
            ranges, keys = (), ()
        else:
            upserts = pinned.schema.empty_table()
            if changed is not None:
                out.change_rows = changed.num_rows
                if key:
                    net = feed.net_changes(changed, pinned.schema, key)
                    upserts, deletes = net.upserts, net.deletes
                else:
                    upserts, deletes = feed.net_rows(changed, pinned.schema)
            else:  # up to date: only the partitions to replace
                mode, reason = Mode.INCREMENTAL, Reason.PARTITIONS_REPLACED
                out.mode, out.reason, out.detail = mode, reason, f"{detail}; the rows of {', '.join(keys)} replaced"
            if ranges:  # the snapshot's rows there replace whatever the feed says of them
                upserts = upserts.filter(pc.invert(feed.in_ranges(upserts, column, ranges)))
            rows = _chain(upserts.to_batches(max_chunksize=export.batch_rows),
                          feed.snapshot_batches(pinned, export.batch_rows, column=column, ranges=ranges) if ranges else ())
        seconds = {"read": time.perf_counter() - t0}
        changes = Changes(export, mode, reason, pinned.version, source.sink_name, pinned.table_id, pinned.delta_fields,
                          pinned.schema, key, _guarded(export, source, rows), deletes, ranges, column, delivered,
                          out.detail, source=source, pinned=pinned)
        self.hook("export_before_write")
        t1 = time.perf_counter()
        applied = target.apply(changes)
        seconds["write"] = time.perf_counter() - t1  # the snapshot's batches are read while they are written
        self.hook("export_after_commit")
        out.rows_upserted, out.rows_deleted, out.extra = applied.rows_upserted, applied.rows_deleted, dict(applied.extra)
        if applied.partial:  # the target holds an older version: the rest stays pending for the next delivery
            out.to_version = applied.delivered_version
        if applied.detail:
            out.detail = f"{out.detail}; {applied.detail}"
        out.partitions_replaced = keys
        return self._finish(out, pinned, started, seconds)

    def _decide(self, pinned: feed.Pinned, delivered: Delivered | None, full: bool) -> tuple[Mode, Reason, str]:
        if full:
            return Mode.FULL, Reason.FORCED_BY_USER, f"every row of '{pinned.name}' at version {pinned.version} asked for"
        if delivered is None:
            return Mode.FULL, Reason.NO_DELIVERED_VERSION, (f"a first delivery: every row of '{pinned.name}' at version "
                                                            f"{pinned.version}")
        if delivered.target_changed:
            return Mode.FULL, Reason.TARGET_CHANGED, delivered.target_changed
        if delivered.source_table_id and delivered.source_table_id != pinned.table_id:
            return Mode.FULL, Reason.SOURCE_RECREATED, (f"'{pinned.name}' was recreated since version {delivered.version} "
                                                        "was delivered (its Delta table id changed)")
        if delivered.version > pinned.version:
            return Mode.FULL, Reason.SOURCE_RECREATED, (f"'{pinned.name}' is at version {pinned.version}, behind the "
                                                        f"delivered version {delivered.version}: recreated or restored")
        if delivered.version == pinned.version:
            return Mode.NOOP, Reason.UP_TO_DATE, f"version {pinned.version} of '{pinned.name}' is delivered"
        gap = feed.feed_gap(pinned, delivered.version)
        if gap is not None:
            return Mode.FULL, gap[0], gap[1]
        return Mode.INCREMENTAL, Reason.NEW_VERSIONS, (f"the changes of versions {delivered.version + 1}..{pinned.version} "
                                                       f"of '{pinned.name}'")

    def _finish(self, out: DeliveryResult, pinned: feed.Pinned, started: float, seconds: dict) -> DeliveryResult:
        now = datetime.now(UTC)
        try:
            out.lag_versions, out.lag_seconds = records.lag(pinned.name, pinned.uri, out.delivered_version, now=now)
            commit = read_commit(pinned.name, pinned.uri, pinned.version, None)
            if commit is not None:
                out.commit_age_seconds = round(max(0.0, (now - commit.timestamp) / timedelta(seconds=1)), 3)
        except (LaminarError, DeltaError, OSError) as exc:  # the delivery is done; only its lag is unknown
            log.warning("%s: the lag behind '%s' could not be read (%s)", out.export, pinned.name, exc)
        out.seconds = {**{k: round(v, 4) for k, v in seconds.items()}, "total": round(time.perf_counter() - started, 4)}
        return out


def _read(export: ExportSpec, source: Spec, read):
    """`read()`, its Delta and file-system failures as one line naming the export and its source."""
    try:
        return read()
    except (DeltaError, OSError, pa.ArrowException) as exc:
        raise _unreadable(export, source, exc) from exc


def _unreadable(export: ExportSpec, source: Spec, exc: Exception) -> ExportError:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return ExportError(f"export '{export.name}' cannot read the table of '{source.name}': {first}; nothing was "
                       "delivered", export=export.name, flow=source.name)


def _missing_file(exc: Exception) -> str | None:
    """The file a change-feed read found gone (vacuumed after `feed_gap` looked), or None for any other failure:
    a gone file makes the delivery a full one instead of failing every time."""
    found = re.search(r"[Oo]bject at location (\S+) not found|No such file or directory[^:]*: '?([^'\s]+)", str(exc))
    return (found.group(1) or found.group(2)) if found else None


def _chain(*parts) -> Iterator[pa.RecordBatch]:
    for part in parts:
        yield from part


def _guarded(export: ExportSpec, source: Spec, rows: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """`rows`, a failure to read them (while the target writes them) as one line naming the export."""
    iterator = iter(rows)
    while True:
        batch = _read(export, source, lambda: next(iterator, None))
        if batch is None:
            return
        yield batch


def _save(root: str, record: records.ExportRecord) -> None:
    """Write the lake's record; one that cannot be written costs `laminar status` a line, not the delivery."""
    try:
        records.save(root, record)
    except (LaminarError, OSError) as exc:
        log.warning("%s: the record of the delivery was not written (%s)", record.export, exc)
