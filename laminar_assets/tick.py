"""What one sensor tick asks for: the dirty partitions of every spec in a connected part of the graph.

Pure of Dagster: it reads Delta logs and watermarks only, and asks a callback which upstream
partitions failed their blocking check. `sensors.py` turns the answer into one run request.

Where dirty partitions come from, for each spec in graph order:
- new commits of the tables it reads, after the version in the cursor, located by their file
  statistics (every materialized partition when a commit cannot be located);
- a dimension table that changed: every materialized partition of the stage;
- predicted: the partitions that read a partition its producer will rewrite in this same run;
- partitions held back last tick because an upstream partition failed its blocking check.
Partitions whose watermark already reflects the tables' current versions are dropped, so a tick
with no cursor (a new Dagster instance on an existing lake) does not redo what is done.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from deltalake import DeltaTable

from laminar_assets.checkpoints import CheckpointStore
from laminar_assets.engine import FlowSpec, LaminarError, StageSpec
from laminar_assets.engine.delta_source import resolve_uri
from laminar_assets.engine.inspect import dirty_partitions, new_commits, reach
from laminar_assets.engine.windows import partition_interval
from laminar_assets.graph import Component, Spec, inputs_of

# (producer spec, its partitions a consumer reads) -> those whose blocking check failed
FailedCheck = Callable[[Spec, set[str]], set[str]]


@dataclass(frozen=True)
class Cursor:
    """The last table versions a tick looked at, and the partitions held back per spec."""

    versions: dict[str, int] = field(default_factory=dict)
    held: dict[str, tuple[str, ...]] = field(default_factory=dict)


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


def table_versions(root: str, tables: tuple[str, ...]) -> dict[str, int]:
    """The current version of each table that exists (read once per tick, so every spec sees the same)."""
    out = {}
    for table in tables:
        uri = resolve_uri(root, table)
        if DeltaTable.is_deltatable(uri):
            out[table] = DeltaTable(uri).version()
    return out


def reads_of(consumer: Spec, producer: Spec, key: str) -> set[str]:
    """Partitions of `consumer` that read rows of `producer`'s partition `key`."""
    return set(reach(consumer, partition_interval(key, producer.granularity)))


def upstream_of(consumer: Spec, producer: Spec, key: str) -> set[str]:
    """Partitions of `producer` that `consumer`'s partition `key` reads (hopping windows reach back)."""
    from laminar_assets.engine.windows import partitions_overlapping

    part = partition_interval(key, consumer.granularity)
    events = consumer.shape.events_of_starts(part) if isinstance(consumer, FlowSpec) else part
    return set(partitions_overlapping(events, producer.granularity))


def is_current(store: CheckpointStore, spec: Spec, key: str, versions: dict[str, int]) -> bool:
    """True when the partition's watermark already reflects the current version of every table it reads."""
    mark = store.load(spec.name, key)
    if mark is None or not mark.committed or mark.failed_attempt or mark.pending is not None:
        return False
    if mark.spec_hash != spec.spec_hash:
        return False
    return all(mark.source_versions.get(t, -1) >= versions[t] for t in inputs_of(spec) if t in versions)


def plan_tick(component: Component, root: str, store: CheckpointStore, cursor: Cursor,
              failed: FailedCheck, blocking: set[str]) -> TickPlan:
    """The dirty partitions of every spec of `component`. `blocking`: names of specs whose
    `contract` check is blocking (their consumers wait for it per partition)."""
    versions = table_versions(root, component.tables)
    changes_cache: dict[tuple[str, str], object] = {}
    dirty: dict[str, tuple[str, ...]] = {}
    held: dict[str, tuple[str, ...]] = {}
    notes: list[str] = []
    for spec in component.specs:
        found: set[str] = set(cursor.held.get(spec.name, ()))
        predicted: set[str] = set()
        for table in spec.sources:
            producer = component.producer(table)
            if producer is not None:  # even before the producer's first commit creates its table
                for key in dirty.get(producer.name, ()):
                    predicted |= reads_of(spec, producer, key)
            if table not in versions:
                continue
            after = cursor.versions.get(table)
            cache_key = (table, spec.event_time)
            if cache_key not in changes_cache:
                try:
                    changes_cache[cache_key] = new_commits(root, table, spec.event_time, after, versions[table])
                except LaminarError as exc:
                    notes.append(f"cannot read {table}: {exc.message}")
                    changes_cache[cache_key] = None
            changes = changes_cache[cache_key]
            if changes is not None:
                found |= set(dirty_partitions(spec, changes))
                if changes.unknown_range:
                    found |= set(store.partitions(spec.name))
        if isinstance(spec, StageSpec):
            for dim in spec.dimension_tables:
                after = cursor.versions.get(dim)
                if dim in versions and after is not None and versions[dim] > after:
                    found |= set(store.partitions(spec.name))  # a dimension change refills the stage
        found = {k for k in found - predicted if not is_current(store, spec, k, versions)}
        blocked = _blocked(component, spec, found, failed, blocking)
        if blocked:
            notes.append(f"{spec.name}: holding {len(blocked)} partition(s) whose upstream blocking contract "
                         f"check failed: {', '.join(sorted(blocked)[:5])}")
        dirty[spec.name] = tuple(sorted(predicted | (found - blocked)))
        if blocked:
            held[spec.name] = tuple(sorted(blocked))
    return TickPlan(dirty=dirty, held=held, cursor=Cursor(versions=versions, held=held), notes=tuple(notes))


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
