"""What one sensor tick asks for: the dirty partitions of every spec in a connected part of the graph.

Pure of Dagster: it reads Delta logs and watermarks only, and asks a callback which upstream
partitions failed their blocking check. `orchestration/sensors.py` turns the answer into one run request.

Where dirty partitions come from, for each spec in graph order:
- new commits of the tables it reads, after the version in the cursor, located by their file
  statistics (every materialized partition when a commit cannot be located);
- a dimension table (or a flow's joined fact table) that changed: every materialized partition;
- predicted: the partitions that read a partition its producer will rewrite in this same run;
- partitions held back last tick because an upstream partition failed its blocking check.
Partitions whose watermark already reflects the tables' current versions (or lags them only by
commits that touch other partitions) are dropped, so a tick with no cursor (a new Dagster instance
on an existing lake) does not redo what is done.

The search is bounded: only partitions from the spec's first partition (its `start`, else the
project's `partitions_start`) to the one holding now + `future_horizon` are enumerated, so a file
whose statistics run from today to a row dated 9999 (or back to 1900) costs what today costs. Changes
reaching outside are named in the tick's notes; the runs' sweep quarantines rows later than the
horizon (`event_time_outside_partitions`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import ExportSpec, Interval, LaminarError, later, partition_interval, partition_span
from laminar_assets.engine.delta import is_delta_table, last_commit_after, looks_cost_requests, open_table, resolve_uri
from laminar_assets.engine.export import load_record
from laminar_assets.engine.report import beyond, dirty_partitions, new_commits, reach, touches
from laminar_assets.pipeline.graph import Component, Spec, inputs_of
from laminar_assets.pipeline.settings import FUTURE_HORIZON, LaminarSettings

# (producer spec, its partitions a consumer reads) -> those whose blocking check failed
FailedCheck = Callable[[Spec, set[str]], set[str]]


@dataclass(frozen=True)
class Cursor:
    """The last table versions a tick looked at, the tables' Delta ids at those versions, and the
    partitions held back per spec. A version is only comparable within one table id: a table deleted
    and created again at the same path (a re-run demo, a rebuilt source) starts at version 0 again."""

    versions: dict[str, int] = field(default_factory=dict)
    held: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ids: dict[str, str] = field(default_factory=dict)

    def since(self, table: str, version: int, table_id: str | None) -> int | None:
        """The version after which `table` (now at `version`, id `table_id`; None: not known) has
        commits this cursor has not seen; None when it cannot tell (never seen, recreated, or gone
        back in versions)."""
        after = self.versions.get(table)
        recreated = table_id is not None and self.ids.get(table, table_id) != table_id
        if after is None or recreated or after > version:
            return None
        return after


@dataclass(frozen=True)
class TickPlan:
    """Dirty partitions per spec (graph order), what is held, and the cursor to store."""

    dirty: dict[str, tuple[str, ...]]
    held: dict[str, tuple[str, ...]]
    cursor: Cursor
    notes: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not any(self.dirty.values())


def table_versions(root: str, tables: tuple[str, ...]) -> tuple[dict[str, int], dict[str, str]]:
    """The current version and Delta table id of each table that exists (read once per tick, so every
    spec sees the same)."""
    versions: dict[str, int] = {}
    ids: dict[str, str] = {}
    for table in tables:
        uri = resolve_uri(root, table)
        if is_delta_table(uri):
            dt = open_table(table, uri)  # a damaged log: an error naming the table, version and file
            # str(): deltalake's Metadata.id says int, but the id is the table's UUID as a string
            versions[table], ids[table] = dt.version(), str(dt.metadata().id)
    return versions, ids


LOCAL_POLL_SECONDS = 0.05  # a file check on a local disk: microseconds
OBJECT_STORE_POLL_SECONDS = 0.25  # one request per table a look: 4 a second while the watch lasts


def watch_for_commits(root: str, tables: tuple[str, ...], versions: dict[str, int], *, seconds: float,
                      poll_seconds: float | None = None, sleep: Callable[[float], None] = time.sleep,
                      clock: Callable[[], float] = time.monotonic) -> dict[str, int]:
    """Wait up to `seconds` for a commit of any of `tables` after its version in `versions` (a table not in
    it: its first commit), looking every `poll_seconds` (None: `LOCAL_POLL_SECONDS`, or
    `OBJECT_STORE_POLL_SECONDS` when a table is on an object store) at the next commit's entry only, not
    opening the table. Once one is there it looks once more after `poll_seconds`, and again while it finds
    more, so a writer's burst (an append, then its updates and deletes, milliseconds apart) is answered as
    one, within the time allowed. Returns each table that moved -> the last version seen; empty when none
    did. A sensor's tick calls it when it found nothing to do, so a commit does not wait for the next tick."""
    uris = {t: resolve_uri(root, t) for t in tables}
    if poll_seconds is None:
        poll_seconds = OBJECT_STORE_POLL_SECONDS if any(looks_cost_requests(u) for u in uris.values()) \
            else LOCAL_POLL_SECONDS
    deadline = clock() + seconds
    seen = {t: versions.get(t) for t in tables}
    moved: dict[str, int] = {}
    while True:
        found = False
        for table, uri in uris.items():
            last = last_commit_after(uri, seen[table])
            if last is not None and last != seen[table]:
                seen[table] = moved[table] = last
                found = True
        left = deadline - clock()
        if (moved and not found) or left <= 0:
            return moved
        sleep(min(poll_seconds, left))


def reads_of(consumer: Spec, producer: Spec, key: str) -> set[str]:
    """Partitions of `consumer` that read rows of `producer`'s partition `key`."""
    return set(reach(consumer, partition_interval(key, producer.granularity)))


def upstream_of(consumer: Spec, producer: Spec, key: str) -> set[str]:
    """Partitions of `producer` that `consumer`'s partition `key` reads (hopping windows reach back)."""
    from laminar_assets.engine import partitions_overlapping

    part = partition_interval(key, consumer.granularity)
    events = consumer.events_needed(part)  # a flow's windows that start in it reach past its end
    return set(partitions_overlapping(events, producer.granularity))


def is_current(store: CheckpointStore, spec: Spec, key: str, versions: dict[str, int], touched,
               ids: dict[str, str] | None = None) -> bool:
    """True when the partition's watermark reflects every table it reads: at the current version, or
    behind it only by commits that touch other partitions. `touched(table, event_time, since)` gives
    a table's new commits after `since` (None: none). `ids`: each table's Delta id; a watermark of a
    table since recreated at the same path is never current."""
    mark = store.load(spec.name, key)
    if mark is None or not mark.committed or mark.failed_attempt or mark.pending is not None:
        return False
    if mark.spec_hash != spec.spec_hash:
        return False
    for table in inputs_of(spec):
        was, now = mark.source_ids.get(table), (ids or {}).get(table)
        if was and now and was != now:
            return False
        at = mark.source_versions.get(table)
        if table not in versions or (at is not None and at >= versions[table]):
            continue
        if at is None or table not in spec.sources:  # a dimension changed: the stage refills
            return False
        changes = touched(table, spec.event_time, at)
        if changes is not None and (changes.unknown_range or touches(spec, changes, key)):
            return False
    return True


def searched(spec: Spec, settings: LaminarSettings | None, now: datetime) -> Interval:
    """The partitions of `spec` a tick looks for: from its first partition (its `start`, else the project's
    `partitions_start`; without settings, the first Laminar can name) to the one holding now +
    `future_horizon`."""
    first = spec.start_time or (settings.partitions_start if settings is not None else None)
    horizon = settings.future_horizon if settings is not None else FUTURE_HORIZON
    return partition_span(first, later(now, horizon), spec.granularity)


def plan_tick(component: Component, root: str, store: CheckpointStore, cursor: Cursor,
              failed: FailedCheck, blocking: set[str], settings: LaminarSettings | None = None,
              now: datetime | None = None) -> TickPlan:
    """The dirty partitions of every spec of `component`. `blocking`: names of specs whose
    `contract` check is blocking (their consumers wait for it per partition). `settings`: the project's
    partitions start and future horizon, which bound the search (`searched`); `now`: the tick's time."""
    now = now or datetime.now(UTC)
    versions, ids = table_versions(root, component.tables)
    cache: dict[tuple[str, str, int | None], object] = {}

    def touched(table: str, event_time: str, since: int | None):
        """New commits of `table` after `since`, read once per tick for each distinct `since`."""
        if (table, event_time, since) not in cache:
            cache[(table, event_time, since)] = new_commits(root, table, event_time, since, versions[table])
        return cache[(table, event_time, since)]

    dirty: dict[str, tuple[str, ...]] = {}
    held: dict[str, tuple[str, ...]] = {}
    notes: list[str] = []
    for spec in component.specs:
        found: set[str] = set(cursor.held.get(spec.name, ()))
        predicted: set[str] = set()
        span = searched(spec, settings, now)
        for table in spec.sources:
            producer = component.producer(table)
            if producer is not None:  # even before the producer's first commit creates its table
                for key in dirty.get(producer.name, ()):
                    predicted |= reads_of(spec, producer, key)
            if table not in versions:
                continue
            since = cursor.since(table, versions[table], ids[table])
            if since is None:
                # a first look, or a table the cursor cannot place (recreated): its snapshot holds no trace of
                # rows deleted or moved since a partition's run, so every materialized partition is a candidate
                # too (one whose rows are all gone would be missed); is_current drops what is done
                found |= set(store.partitions(spec.name))
            try:
                changes = touched(table, spec.event_time, since)
            except LaminarError as exc:
                notes.append(f"cannot read {table}: {exc.message}")
                continue
            if changes is not None:
                found |= set(dirty_partitions(spec, changes, span))
                earliest, latest = beyond(spec, changes, span)
                if earliest or latest:
                    notes.append(_outside_note(spec, table, span, earliest, latest))
                if changes.unknown_range:
                    found |= set(store.partitions(spec.name))
        for dim in spec.dimension_tables:
            seen = cursor.versions.get(dim) is not None
            if dim in versions and seen and cursor.since(dim, versions[dim], ids[dim]) != versions[dim]:
                found |= set(store.partitions(spec.name))  # a dimension (or joined table) change refills all
        try:
            found = {k for k in found - predicted if not is_current(store, spec, k, versions, touched, ids)}
        except LaminarError as exc:
            notes.append(f"cannot read the history of {spec.name}'s inputs: {exc.message}")
        blocked = _blocked(component, spec, found, failed, blocking)
        if blocked:
            notes.append(f"{spec.name}: holding {len(blocked)} partition(s) whose upstream blocking contract "
                         f"check failed: {', '.join(sorted(blocked)[:5])}")
        dirty[spec.name] = tuple(sorted(predicted | (found - blocked)))
        if blocked:
            held[spec.name] = tuple(sorted(blocked))
    return TickPlan(dirty=dirty, held=held, cursor=Cursor(versions=versions, held=held, ids=ids), notes=tuple(notes))


def _outside_note(spec: Spec, table: str, span: Interval, earliest: datetime | None, latest: datetime | None) -> str:
    def at(t: datetime) -> str:
        return t.isoformat(" ", "minutes")[:16]  # four-digit years also before 1000 (strftime writes '1-01-01')
    extremes = "; ".join(text for text in (earliest and f"as early as {at(earliest)}", latest and f"as late as {at(latest)}")
                         if text)
    bounds = spec.bounds
    allowed = (f" (its event_time_bounds allow {at(bounds.start)} to {at(bounds.end)}: rows outside them are "
               "quarantined as event_time_out_of_bounds)") if bounds is not None else ""
    return (f"{spec.name}: new commits of '{table}' hold event times outside the partitions searched ({at(span.start)} to "
            f"{at(span.end)}: its first partition to now + future_horizon), {extremes}{allowed}; no partition there is "
            "searched. A run's sweep quarantines rows after the horizon (event_time_outside_partitions)")


def _blocked(component: Component, spec: Spec, keys: set[str], failed: FailedCheck, blocking: set[str]) -> set[str]:
    out: set[str] = set()
    for table in spec.sources:
        producer = component.producer(table)
        if producer is None or producer.name not in blocking or not keys:
            continue
        upstream = {k: upstream_of(spec, producer, k) for k in keys}
        bad = failed(producer, set().union(*upstream.values()))
        out |= {k for k in keys if upstream[k] & bad}
    return out


def pending_exports(root: str, exports: list[ExportSpec], specs: tuple[Spec, ...],
                    store: CheckpointStore) -> dict[str, tuple[int, str]]:
    """Exports behind their source's table that no dirty partition carries into a run: never delivered while the
    table exists, or last delivered at an older version by a delivery that succeeded (their source materialized
    alone). Export name -> (the table's version, the source's latest partition to run the export with). A
    failing export (its lake record says so) waits for its source's next change, or a run asked for by hand:
    the sensor does not retry it every tick."""
    by_name = {s.name: s for s in specs}
    out: dict[str, tuple[int, str]] = {}
    for export in exports:
        spec = by_name.get(export.source)
        if spec is None:
            continue
        uri = resolve_uri(root, spec.sink_name)
        if not is_delta_table(uri):
            continue
        try:
            record = load_record(root, export.name)
            version = open_table(spec.sink_name, uri).version()
        except LaminarError:  # a table or record that cannot be read now: the next tick looks again
            continue
        if record is not None and record.failed:
            continue
        if record is not None and record.delivered_version is not None and record.delivered_version >= version:
            continue
        partitions = store.partitions(spec.name)
        if partitions:
            out[export.name] = (version, partitions[-1])
    return out
