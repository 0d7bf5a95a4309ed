"""Answers about sources and partitions that need no Spark: dirty partitions of new
commits (from Delta file statistics) and what the planner would do for a partition."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TypeGuard

from laminar_assets.checkpoints import CheckpointStore, Watermark

from ..delta.tables import CommitSummary, read_commit, resolve_uri, snapshot_files, source_history, table_info, temporal
from ..run.plan import Mode, PartitionPlan
from ..run.planner import PlannerInput, plan_partition
from ..spec.specs import Spec
from ..windows import PARTITION_SPAN, Interval, coalesce, later, partition_interval, partitions_overlapping


def reach(spec: Spec, events: Interval, within: Interval | None = None) -> list[str]:
    """Partitions of `spec` whose windows can hold rows with event times in `events`; with `within`
    (a `windows.partition_span`), only those inside it. Only the partitions returned are enumerated:
    a range that runs to a row dated 9999 costs what its part inside `within` costs."""
    times = output_times(spec, events)
    if times is not None and within is not None:
        times = times.intersect(within)
    return partitions_overlapping(times, spec.granularity) if times is not None else []


def output_times(spec: Spec, events: Interval) -> Interval | None:
    """Where rows with event times in `events` can land (`Spec.output_times_of`), counting only event
    times that a partition can hold (inside the spec's bounds and `PARTITION_SPAN`); None: nowhere."""
    usable = events.intersect(PARTITION_SPAN)
    if usable is not None and spec.bounds is not None:
        usable = usable.intersect(spec.bounds)
    return spec.output_times_of(usable) if usable is not None else None


@dataclass(frozen=True)
class NewCommits:
    """Commits of a table after a cursor, and the event-time ranges they touched."""

    table: str
    from_version: int | None
    to_version: int
    ranges: tuple[Interval, ...]
    unknown_range: bool
    commits: tuple[CommitSummary, ...]


def new_commits(root: str, table: str, event_time: str, after: int | None,
                upto: int | None = None) -> NewCommits | None:
    """What changed in `table` after version `after` up to version `upto` (latest if None; all of
    it if `after` is None); None if nothing did."""
    uri = resolve_uri(root, table)
    info = table_info(table, uri, upto)
    if after is not None and after >= info.version:
        return None
    ranges: list[Interval] = []
    unknown = False
    commits: list[CommitSummary] = []
    expired = False
    stats_column = info.physical(event_time) if temporal(info.schema, event_time) else None
    if stats_column is None:
        unknown = True
    if after is not None:
        for version in range(after + 1, info.version + 1):
            commit = read_commit(table, uri, version, stats_column, info.name_pairs)
            if commit is None:
                expired = True
                break
            commits.append(commit)
            touched = commit.touched
            if touched is None:
                unknown = True
            else:
                ranges.extend(t for t in touched if t.end > t.start)
    if after is None or expired or unknown:
        # Everything the table holds may be affected: use the snapshot's statistics. Rows that were
        # deleted are not in the snapshot, so `unknown` stays set and callers also take every
        # partition already materialized.
        for f in snapshot_files(info, event_time):
            if f.time_range is None:
                unknown = True
            elif f.time_range.end > f.time_range.start:
                ranges.append(f.time_range)
        if after is None and not expired:
            unknown = False  # a first look: everything there is, is in the snapshot
    return NewCommits(table, after, info.version, coalesce(ranges), unknown, tuple(commits))


def dirty_partitions(spec: Spec, changes: NewCommits, within: Interval | None = None) -> list[str]:
    """Partitions of `spec` the changed event-time ranges reach (inside `within`, when given)."""
    keys: set[str] = set()
    for r in changes.ranges:
        keys.update(reach(spec, r, within))
    return sorted(keys)


def touches(spec: Spec, changes: NewCommits, key: str) -> bool:
    """Whether the changes reach partition `key` of `spec` (`dirty_partitions` without listing them)."""
    part = partition_interval(key, spec.granularity)
    return any((times := output_times(spec, r)) is not None and times.overlaps(part) for r in changes.ranges)


def beyond(spec: Spec, changes: NewCommits, within: Interval) -> tuple[datetime | None, datetime | None]:
    """(the earliest, the latest) event time of the changes' ranges that reach before or after what the
    partitions `within` (a `windows.partition_span`) can hold (None: none reaches there). Whether a range
    reaches out is judged on its part inside the spec's bounds (rows outside them are quarantined as out of
    bounds, wherever they are), but the times returned are the range's own, as the files' statistics
    give them: the bounds themselves are no row's time."""
    held = Interval(within.start, later(within.end, spec.events_needed(Interval(within.end, within.end)).end - within.end))
    earliest = latest = None
    for r in changes.ranges:
        inside = r.intersect(spec.bounds) if spec.bounds is not None else r
        if inside is None:
            continue
        if inside.start < held.start:
            earliest = min(earliest or r.start, r.start)
        if inside.end > held.end:
            latest = max(latest or r.end, r.end)
    return earliest, latest


def inspect_partition(root: str, spec: Spec, partition: str,
                      store: CheckpointStore | None = None) -> tuple[Watermark | None, PartitionPlan]:
    """The watermark of a partition and the plan a run would follow now (schema checks aside)."""
    store = store or CheckpointStore(root)
    mark = store.load(spec.name, partition)
    histories, dims, dim_ids = {}, {}, {}
    # a table deleted and created again at the same path (another Delta id) is judged as a run judges it
    # (`RunInputs.histories_after`, the planner's dimension check): its versions say nothing about the old one
    was = mark.source_ids if (mark and mark.committed) else {}
    for src in spec.sources:
        uri = resolve_uri(root, src)
        info = table_info(src, uri)
        since = mark.source_versions.get(src) if (mark and mark.committed) else None
        history = source_history(src, uri, since, info.version, spec.event_time, info=info)
        recreated = since is not None and was.get(src) and info.table_id and was[src] != info.table_id
        histories[src] = history.replaced(since) if since is not None and recreated else history  # (recreated implies since)
    for table in spec.dimension_tables:
        info = table_info(table, resolve_uri(root, table))
        dims[table] = info.version
        if info.table_id:
            dim_ids[table] = info.table_id
    schema = dict(mark.input_schema) if mark else {}
    plan = plan_partition(PlannerInput(spec=spec, partition=partition, watermark=mark, histories=histories,
                                       dimension_versions=dims, dimension_ids=dim_ids, input_schema=schema))
    return mark, plan


def is_stale(mark: Watermark | None, plan: PartitionPlan) -> TypeGuard[Watermark]:
    """A materialized partition is stale when a run would change it, or its last attempt failed (never without
    a watermark: a partition never materialized is not stale)."""
    if mark is None:
        return False
    return bool(mark.failed_attempt) or mark.pending is not None or plan.mode is not Mode.NOOP


def lag(root: str, spec: Spec, mark: Watermark) -> tuple[int, float]:
    """(versions behind, seconds of commit time behind) of a watermark against its sources."""
    versions, seconds = 0, 0.0
    for src in spec.sources:
        uri = resolve_uri(root, src)
        latest = table_info(src, uri).version
        at = mark.source_versions.get(src)
        if at is None:
            continue
        versions = max(versions, latest - at)
        if latest > at:
            newest = read_commit(src, uri, latest, spec.event_time)
            oldest = read_commit(src, uri, at + 1, spec.event_time)
            if newest and oldest:
                seconds = max(seconds, (newest.timestamp - oldest.timestamp + timedelta(0)).total_seconds())
    return versions, seconds
