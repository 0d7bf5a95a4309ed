"""A run's inputs, gathered once: each source opened once, its log read once, its schema checked.

Partitions of one run may have watermarks at different versions; the log is read
from the oldest and every partition plans from its own slice (`SourceHistory.after`).
`inspect`, `report` and `explain` plan from the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.sql.types import StructType

from laminar_assets.checkpoints import Watermark
from laminar_assets.errors import LaminarError

from ..delta.layout import Layout
from ..delta.tables import (
    DataFile,
    SourceHistory,
    TableInfo,
    checkout_info,
    checkout_table,
    refuse_collated,
    snapshot_files,
    source_history,
    table_info,
)
from ..spec.specs import Spec
from ..windows import Interval, coalesce, partition_interval, share_inside
from .context import EngineOptions
from .planner import PlannerInput, needed_events
from .validate import columns_used


@dataclass
class RunInputs:
    """Sources at their latest version, their history since the run's oldest watermark, dimensions,
    and the types of the columns the spec reads."""

    infos: dict[str, TableInfo]
    histories: dict[str, SourceHistory]
    dims: dict[str, TableInfo]
    input_schema: dict[str, str]
    row_schema: StructType | None = None  # a source row with joined and derived columns (check_source)
    _snapshots: dict[tuple, list[DataFile]] = field(default_factory=dict, repr=False)
    # Event times the run's partitions can use (`limit_to`); None: all. A source's snapshot is listed
    # for these only: listing tens of thousands of files in Python costs more than the run's planning.
    scope: tuple[Interval, ...] | None = None
    # Laminar's own tables (state) as this run opened them: the intent's transaction check, the old
    # state's read and the state commit share one open (an open replays the log); a commit to a table
    # takes it out, so nothing reads a snapshot older than the run's own last commit.
    opened: dict[str, DeltaTable] = field(default_factory=dict, repr=False)
    # gives back the pooled snapshots of the sources and dimensions (`tables.checkout_info`), once
    _releases: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _held: dict[str, tuple[DeltaTable, Callable[[], None]]] = field(default_factory=dict, repr=False)

    def own_table(self, uri: str) -> DeltaTable | None:
        """A table this run writes (state, sink) at its latest version, from the process's pool on an object
        store (`tables.checkout_table`), given back by `release`; None when there is no table yet. A table the
        run checked out before (`hold`) is that handle, once."""
        if uri in self._held:
            table, release = self._held.pop(uri)
            self._releases.append(release)
            return table
        try:
            table, release = checkout_table(uri)
        except TableNotFoundError:
            return None
        self._releases.append(release)
        return table

    def hold(self, uri: str, table: DeltaTable, release: Callable[[], None]) -> None:
        """A table the run checked out before its inputs (the sink, by its owner check): `own_table` gives
        it, `release` gives it back."""
        self._held[uri] = (table, release)

    def release(self) -> None:
        """The run is done with its snapshots of the sources and dimensions: on an object store they go back
        to the process's pool, and the next run moves them forward instead of opening the tables again.
        A later read of `infos` or `dims` opens its own snapshot."""
        releases, self._releases = self._releases + [r for _t, r in self._held.values()], []
        self._held = {}
        if not releases:
            return
        self.infos = {k: replace(v, table=None) for k, v in self.infos.items()}
        self.dims = {k: replace(v, table=None) for k, v in self.dims.items()}
        for give_back in releases:
            give_back()

    def histories_after(self, mark: Watermark | None) -> dict[str, SourceHistory]:
        """Each source's history after the watermark's version of it; a source recreated since then
        (another Delta table id at the same path) has no readable history."""
        if mark is None or not mark.committed:
            return dict(self.histories)
        out = {}
        for src, h in self.histories.items():
            at, was = mark.source_versions.get(src), mark.source_ids.get(src)
            now = self.infos[src].table_id if src in self.infos else None
            out[src] = h.replaced(at) if at is not None and was and now and was != now else h.after(at)
        return out

    def source_ids(self) -> dict[str, str]:
        """The Delta table id of each source and dimension (what a watermark records beside its versions)."""
        return {t: info.table_id for t, info in {**self.infos, **self.dims}.items() if info.table_id}

    def joined_bytes(self) -> int:
        """Bytes of every joined table (dimensions, fact tables) at its pinned version."""
        key = ("__joined__", 0)
        if key not in self._snapshots:
            self._snapshots[key] = [f for info in self.dims.values() for f in snapshot_files(info, None)]
        return sum(f.size for f in self._snapshots[key])

    def limit_to(self, spec: Spec, partitions: list[str]) -> None:
        """Only event times these partitions' windows can use are ever read (see `snapshot`)."""
        self.scope = coalesce(needed_events(spec, partition_interval(k, spec.granularity)) for k in partitions)

    def snapshot(self, spec: Spec, source: str, version: int) -> list[DataFile]:
        """The data files of `source` at `version` with their event-time ranges (listed once per run):
        those that may hold event times in `scope` (every file without a usable range), or all."""
        key = (source, version)
        if key not in self._snapshots:
            info = self.infos[source]
            if info.version != version:
                info = table_info(source, info.uri, version)
            self._snapshots[key] = snapshot_files(info, spec.event_time, self.scope, bounds_of=spec.key_columns)
        return self._snapshots[key]


def gather(layout: Layout, spec: Spec, marks: Iterable[Watermark | None], check_schema, *,
           pooled: bool = False, listed: dict[str, dict[int, str]] | None = None) -> RunInputs:
    """Open every source and dimension once at its latest version, check the spec against each
    source's schema (`check_schema(info, dims) -> CheckedSource`) and read the log once from the oldest
    watermark among `marks` (partitions without one refill from the snapshot). `pooled`: on an object
    store, take the snapshots from the process's pool (`tables.checkout_info`: the commits since the last
    run's are read, not the log since the checkpoint); the caller gives them back with `RunInputs.release`.
    `listed`: {table uri: {version: tag}} of the commit files the caller listed just before (not listed again)."""
    marks = list(marks)
    releases: list[Callable[[], None]] = []

    def latest(name: str) -> TableInfo:
        if not pooled:
            return table_info(name, layout.table_uri(name))
        uri = layout.table_uri(name)
        info, release = checkout_info(name, uri, listed=(listed or {}).get(uri))
        releases.append(release)
        return info

    try:
        return _gather(spec, marks, check_schema, latest, releases)
    except BaseException:
        for give_back in releases:
            give_back()
        raise


def _gather(spec: Spec, marks: list[Watermark | None], check_schema, latest, releases) -> RunInputs:
    infos, histories, row_schema = {}, {}, None
    schema: dict[str, str] = {}
    dims = {t: latest(t) for t in spec.dimension_tables}
    for dim, info in dims.items():
        refuse_collated(info, columns_used(spec, dim))
    for src in spec.sources:
        info = latest(src)
        refuse_collated(info, columns_used(spec, src))  # before anything is read or written
        checked = check_schema(info, dims)
        row_schema = row_schema or checked.row_schema
        for col, typ in checked.types.items():
            if col in schema and schema[col] != typ:
                raise LaminarError(f"sources of '{spec.name}' disagree on the type of {col!r}: "
                                   f"{schema[col]} vs {typ} in '{src}'", flow=spec.name, table=src, column=col)
            schema[col] = typ
        infos[src] = info
        # A partition without a watermark refills from the snapshot and needs no history; the others
        # need the log from the oldest of their versions (None: a watermark that never saw `src`).
        since = [m.source_versions.get(src) for m in marks if m is not None and m.committed]
        known = [v for v in since if v is not None]
        oldest = min(known) if since and len(known) == len(since) else None
        if oldest is not None and oldest > info.version:  # every watermark is ahead: recreated table
            oldest = info.version
        bounded = bool(spec.max_versions_per_run or spec.max_rows_per_run)  # may read a snapshot before the latest
        history = source_history(src, info.uri, oldest, info.version, spec.event_time, info=info,
                                 check_snapshots=bounded, at_latest=True)
        histories[src] = history.with_retyped(info, columns_used(spec, src))
    return RunInputs(infos, histories, dims, schema, row_schema, _releases=releases)


def planner_input(spec: Spec, partition: str, mark: Watermark | None, inputs: RunInputs, *, force: bool = False,
                  escalation=None, escalation_scope=None, escalation_groups=None, partition_bytes: dict[str, int] | None = None,
                  refill_ratio: float | None = None, refill_min_bytes: int = 0, state_groups: int | None = None,
                  partition_rows: int | None = None, state_bytes: int | None = None,
                  extreme_refill: str | None = None, pass_seconds: float = EngineOptions.pass_seconds,
                  scan_bytes_per_second: float = EngineOptions.scan_bytes_per_second,
                  changed_groups: tuple[int, ...] | None = None, group_refill_share: float | None = None) -> PlannerInput:
    return PlannerInput(
        spec=spec, partition=partition, watermark=mark, histories=inputs.histories_after(mark),
        dimension_versions={d: i.version for d, i in inputs.dims.items()},
        dimension_ids={d: i.table_id for d, i in inputs.dims.items() if i.table_id},
        input_schema=inputs.input_schema, force=force, escalation=escalation, escalation_scope=escalation_scope,
        escalation_groups=escalation_groups,
        partition_bytes=partition_bytes, refill_ratio=refill_ratio, refill_min_bytes=refill_min_bytes,
        state_groups=state_groups, partition_rows=partition_rows, state_bytes=state_bytes,
        extreme_refill=extreme_refill, pass_seconds=pass_seconds, scan_bytes_per_second=scan_bytes_per_second,
        changed_groups=changed_groups, group_refill_share=group_refill_share,
    )


def partition_bytes(spec: Spec, inputs: RunInputs, partition: str, to_versions: dict[str, int]) -> dict[str, int]:
    """Estimated bytes of the snapshot rows a refill of the partition would read, per source:
    each overlapping file's size, times the share of its event-time range inside the needed range."""
    needed = needed_events(spec, partition_interval(partition, spec.granularity))
    out = {}
    for src in spec.sources:
        out[src] = int(sum(share_inside(f.time_range, needed) * f.size
                           for f in inputs.snapshot(spec, src, to_versions[src])))
    return out


def partition_rows(spec: Spec, inputs: RunInputs, partition: str, to_versions: dict[str, int]) -> int | None:
    """Estimated snapshot rows a refill of the partition would read (all sources), like
    `partition_bytes`; None when a file's statistics give no row count."""
    needed = needed_events(spec, partition_interval(partition, spec.granularity))
    total = 0.0
    for src in spec.sources:
        for f in inputs.snapshot(spec, src, to_versions[src]):
            if f.rows is None:
                return None
            total += share_inside(f.time_range, needed) * f.rows
    return int(total)
