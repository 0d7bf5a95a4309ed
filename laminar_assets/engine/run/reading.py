"""Which files a run reads, and its source rows, each file read once for every partition of the run.

A run's partitions may need the same file in different roles: partition A merges
the rows commit v appended (an incremental read), partition B recomputes windows
from the pinned snapshot (a refill), and the appended file is in both. Files are
grouped by role (commit version, in the snapshot or not, change data or not) and
each group is one Parquet scan whose rows carry their role as columns:

    __src   the source table            __dver  the commit version of a changed-rows file, else NULL
    __snap  the file is in the snapshot  __sign  +1, or -1 for deleted rows / update pre-images
    __src_version  the version a row was read at (commit or snapshot), for the quarantine

`keep(...)` then decides per row (per window copy, for hopping windows) whether the
row counts for the partition its window falls in: rows in a refilled window count
when they come from the snapshot, other rows when their commit is one the
partition merges.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from ..aggregates.base import SIGN, q, sql_string
from ..delta.file_ranges import KeyProbe
from ..delta.log import CommitKind, DataFile
from ..quarantine.records import VERSION
from ..spark import stable_sql
from ..spark.frames import spark_schema
from ..spark.query import Query, union_all
from ..spark.query import frame as sql_frame
from ..spark.read import CHANGE_TYPE, read_source
from ..spark.stable_sql import bigint
from ..windows import Interval, coalesce, in_ranges_sql, partition_id_column
from .fact_joins import joined_columns
from .inputs import RunInputs
from .plan import Mode, PartitionPlan

SRC, DVER, SNAP, PART = "__src", "__dver", "__snap", "__p"
_SIGNS = {"insert": 1, "update_postimage": 1, "delete": -1, "update_preimage": -1}


@dataclass(frozen=True)
class FileGroup:
    """Files of one source read in one scan, all in the same role."""

    source: str
    files: tuple[DataFile, ...]
    version: int | None  # commit version of changed rows; None for snapshot-only files
    snapshot: bool  # the files are in the pinned snapshot the refills read
    change_data: bool = False
    read_version: int | None = None  # version recorded with the rows (the snapshot's, for snapshot files)
    only: str | None = None  # SQL over the source's columns that every row of use meets, read as a scan filter


@dataclass
class ReadSet:
    """Every file a run reads, grouped by role, and what each partition needed of them."""

    groups: list[FileGroup] = field(default_factory=list)
    files: dict[str, int] = field(default_factory=dict)  # per partition: files overlapping its needed range
    bytes: dict[str, int] = field(default_factory=dict)
    needed: list[Interval] = field(default_factory=list)  # event times any partition needs

    @property
    def empty(self) -> bool:
        return not any(g.files for g in self.groups)

    @property
    def total_bytes(self) -> int:
        """Bytes of every file the run reads, each counted once per role it is read in."""
        return sum(f.size for g in self.groups for f in g.files)


def refill_events(spec, plan: PartitionPlan) -> list[Interval]:
    """Event times a refill of the plan reads: the events of its window starts and of the windows
    holding the groups it recomputes (flows), or the whole partition (stages dedup within the
    partition, so they recompute all of it)."""
    return spec.refill_events(plan.interval, (*plan.refill, *plan.group_windows))


def read_set(spec, plans: list[PartitionPlan], inputs: RunInputs) -> ReadSet:
    """The files `plans` need (they share target versions), grouped by role."""
    out = ReadSet(needed=list(coalesce(p.needed for p in plans)))
    for src in spec.sources:
        commits = {c.version: c for c in inputs.histories[src].commits}
        # keyed by (file, commit): with deletion vectors one file changes in several commits
        delta: dict[tuple[str, int], DataFile] = {}
        for plan in plans:
            for v in plan.incremental_versions.get(src, ()):
                for f in commits[v].readable:
                    if f.time_range is None or f.time_range.overlaps(plan.needed):
                        delta[(f.uri, v)] = f
        events = [e for plan in plans for e in refill_events(spec, plan)]
        whole = [e for plan in plans for e in spec.refill_events(plan.interval, plan.refill)]
        probe = _key_probe(spec, plans)
        read = {uri for uri, _ in delta}
        snap: dict[str, DataFile] = {}
        snap_version = None
        if events:
            snap_version = plans[0].to_versions[src]
            for f in inputs.snapshot(spec, src, snap_version):
                if f.time_range is None or any(f.time_range.overlaps(e) for e in events):
                    if probe is not None and f.uri not in read and f.time_range is not None \
                            and not any(f.time_range.overlaps(e) for e in whole) and not probe.may_hold(f.bounds):
                        continue  # only keys recomputed alone could use its rows, and it holds none of them
                    snap[f.uri] = f
        by_role: dict[tuple, list[DataFile]] = {}
        shared: set[str] = set()  # snapshot files whose rows a commit read already yields
        for (uri, v), f in delta.items():
            in_snap = uri in snap and _same_rows(f, snap[uri])
            if in_snap:
                shared.add(uri)
            cdc = f.change_data or commits[v].kind is CommitKind.DELETION_VECTORS
            by_role.setdefault((v, in_snap, cdc), []).append(f)
        for uri, f in snap.items():
            if uri not in shared:
                by_role.setdefault((None, True, False), []).append(f)
        only = _snapshot_only_rows(spec, plans, inputs.infos[src].schema, whole) if probe is not None else None
        for (v, in_snap, cdc), files in sorted(by_role.items(), key=lambda kv: (kv[0][0] is None, kv[0][0] or 0, kv[0][1:])):
            out.groups.append(FileGroup(src, tuple(files), v, in_snap, cdc, v if v is not None else snap_version,
                                        only=only if v is None else None))
        for plan in plans:
            mine = [f for f in [*delta.values(), *(f for u, f in snap.items() if u not in shared)]
                    if f.time_range is None or f.time_range.overlaps(plan.needed)]
            out.files[plan.partition] = out.files.get(plan.partition, 0) + len(mine)
            out.bytes[plan.partition] = out.bytes.get(plan.partition, 0) + sum(f.size for f in mine)
    return out


def _key_probe(spec, plans: list[PartitionPlan]) -> KeyProbe | None:
    """The keys of the groups the plans recompute alone, when snapshot files can be skipped by them:
    every such plan names their values, and the key columns are the source's own (the statistics of
    a source column are not those of a derived or joined column of its name). None otherwise: no
    file is skipped by key."""
    keyed = [p for p in plans if p.refill_groups]
    made = {n for n, _ in spec.derived} | set(joined_columns(spec)) | {c for j in spec.joins for c in j.columns}
    if not keyed or not spec.key_columns or any(not p.group_keys for p in keyed) or set(spec.key_columns) & made:
        return None
    return KeyProbe(v for p in keyed for v in p.group_keys)


def group_values_sql(spec, plans: list[PartitionPlan]) -> str | None:
    """`k1 IN (...) AND k2 IN (...)` over the key values of the groups `plans` recompute alone, when
    every such plan names them (`group_keys`). Files whose statistics hold none of a column's values
    are not read (`file_ranges.KeyProbe`, the same column-by-column test), so a row must pass this
    to be one of those groups: a group whose hash collides with a changed one's stays an ordinary
    group, not one whose rows the skipped files hide. None when a plan names no values."""
    mine = [p for p in plans if p.refill_groups]
    if not mine or any(not p.group_keys for p in mine) or not spec.key_columns:
        return None
    columns = zip(*dict.fromkeys(v for p in mine for v in p.group_keys))
    return " AND ".join(f"{q(c)} IN ({', '.join(_literal(v) for v in dict.fromkeys(vals))})"
                        for c, vals in zip(spec.key_columns, columns))


def _snapshot_only_rows(spec, plans: list[PartitionPlan], schema: pa.Schema, whole: list[Interval]) -> str | None:
    """What a row of a snapshot file no commit of the run reads must meet to count: its event time
    in a window refilled whole, or its keys those of a group recomputed alone (see `keep_sql`: such
    a row counts for nothing else). As the scan's filter, Parquet skips the row groups whose
    statistics hold neither, and no later step sees the other rows. None when the event times of
    whole refills cannot be told from the raw column (derived, or not a UTC timestamp)."""
    keys = group_values_sql(spec, plans)
    if keys is None:
        return None
    if not whole:
        return keys
    if not _raw_utc_event_time(spec, schema):
        return None
    return f"({in_ranges_sql(spec.event_time, whole)} OR ({keys}))"


def _literal(value: int | str) -> str:
    return sql_string(value) if isinstance(value, str) else str(int(value))


def change_markers(spec, plans: list[PartitionPlan], inputs: RunInputs) -> list[PartitionPlan]:
    """The plans as reads of only the deletes and updates they take (change data or deletion-vector
    commits): what a refill of changed groups (flows) or keys (stages) looks at first to name them."""
    markers = []
    for p in plans:
        versions = {}
        for src in spec.sources:
            start, end = p.from_versions.get(src), p.to_versions.get(src)
            if start is None or end is None:
                continue
            versions[src] = tuple(c.version for c in inputs.histories[src].commits if start < c.version <= end
                                  and c.kind in (CommitKind.CHANGE_DATA, CommitKind.DELETION_VECTORS))
        markers.append(replace(p, mode=Mode.INCREMENTAL, refill=(), refill_all=False, refill_groups=(),
                               group_windows=(), group_keys=(), incremental_versions=versions))
    return markers


def _same_rows(change: DataFile, snapshot: DataFile) -> bool:
    """A commit's read of a file yields exactly the file's snapshot rows: a plain read (no change data,
    no changed deletion vector) and no deleted rows then or now."""
    return (not change.change_data and change.dv_change is None and change.deleted is None
            and snapshot.deleted is None)


_SIMPLE_NAME = re.compile(r"[A-Za-z0-9._-]+")
MAX_NAMED_FILES = 256  # files whose roles a merged scan spells out by name (snapshot-only files need not be)


def scans(reads: ReadSet) -> list[tuple[FileGroup, ...]]:
    """The file groups read together: per source, every plain group (no change data, no deletion
    vectors) in one scan, each row's role told by its file name; other groups one scan each.
    Groups stay apart when names would be ambiguous or too many to spell out."""
    out: list[tuple[FileGroup, ...]] = []
    plain: dict[str, list[FileGroup]] = {}
    for g in reads.groups:
        if g.change_data or g.only is not None or any(f.needs_row_positions for f in g.files):
            out.append((g,))
        else:
            plain.setdefault(g.source, []).append(g)
    for groups in plain.values():
        names = [os.path.basename(f.uri) for g in groups for f in g.files]
        named = sum(len(g.files) for g in groups if g.version is not None)
        if len(groups) > 1 and len(set(names)) == len(names) and named <= MAX_NAMED_FILES \
                and all(_SIMPLE_NAME.fullmatch(n) for n in names) and sum(g.version is None for g in groups) <= 1:
            out.append(tuple(groups))
        else:
            out.extend((g,) for g in groups)
    return out


def read_rows(spark: SparkSession, spec, reads: ReadSet, inputs: RunInputs) -> DataFrame:
    """The rows of every file group, with their role columns (one lazy frame; no job runs)."""
    return rows_query(spark, spec, reads, inputs).run(spark)


def rows_query(spark: SparkSession, spec, reads: ReadSet, inputs: RunInputs) -> Query:
    """`read_rows` as a query: each scan's Parquet read is a frame, the rest SQL text. Its columns are
    the first source's, then `__sign`, `__src`, `__dver`, `__snap` and `__src_version`."""
    first = inputs.infos[spec.sources[0]].schema
    names = list(first.names)  # every source's rows in this order (by name)
    parts = []
    for i, scan in enumerate(scans(reads) or [(FileGroup(spec.sources[0], (), None, False),)]):
        g = scan[0]
        info = inputs.infos[g.source]
        cols = _columns_as(first, info.schema)
        files = [f for grp in scan for f in grp.files]
        by_name = bool(files) and not g.change_data and not any(f.needs_row_positions for f in files)
        df = read_source(spark, files, info, change_data=g.change_data, file_name=_FILE if by_name else None)
        part = sql_frame(f"scan{i}", df)
        conds = []
        if g.change_data:
            sign = "CASE " + " ".join(f"WHEN {q(CHANGE_TYPE)} = {sql_string(k)} THEN {v}" for k, v in _SIGNS.items()) \
                + " ELSE 0 END"
            conds.append(f"{sign} != 0")
        else:
            sign = "1"
        in_range = _event_range_filter(spec, info.schema, reads.needed, sum(f.size for f in files))
        if in_range is not None:
            conds.append(in_range)
        if g.only is not None:
            conds.append(g.only)
        if by_name:  # each row's role looked up by its file name
            part = part.add_columns([(_ROLE, _role_by_file(scan))])
            role = [f"{_ROLE}.d", f"{_ROLE}.s", f"{_ROLE}.v"]
        else:
            role = [bigint(g.version), str(g.snapshot).lower(), bigint(g.read_version)]
        exprs = [*cols, f"{sign} AS {SIGN}", f"{sql_string(g.source)} AS {SRC}",
                 *[f"{e} AS {c}" for e, c in zip(role, (DVER, SNAP, VERSION))]]
        parts.append(part.select(exprs, where=" AND ".join(conds) or None))
    return replace(union_all(parts), columns=(*names, SIGN, SRC, DVER, SNAP, VERSION))


_FILE, _ROLE = "__file", "__role"


def _columns_as(first: pa.Schema, schema: pa.Schema) -> list[str]:
    """The first source's columns, selected from a source with `schema`. A fan-in flow's other
    source may lack a column the flow does not use (the source check refuses a used one): NULL."""
    have = {n.lower() for n in schema.names}
    missing = [c for c in first.names if c.lower() not in have]
    if not missing:
        return [q(c) for c in first.names]
    types = spark_schema(pa.schema([first.field(c) for c in missing]))
    return [f"CAST(NULL AS {types[c].dataType.simpleString()}) AS {q(c)}" if c in missing else q(c)
            for c in first.names]


def _role_by_file(scan: tuple[FileGroup, ...]) -> str:
    """SQL of a struct (d: DVER, s: SNAP, v: VERSION) with each row's role, looked up by its file
    name: the commit groups' files by name, the rest (the snapshot-only group of a merged scan, every
    file of a one-group scan) as the default, so a large refill lists no names. A lookup, not a CASE
    of the run's versions, so the generated code stays the same from run to run (stable_sql.py)."""
    default = scan[0] if len(scan) == 1 else next((g for g in scan if g.version is None), None)
    named = [] if len(scan) == 1 else [(os.path.basename(f.uri), g) for g in scan if g.version is not None
                                       for f in g.files]
    # '' never names a file: it keeps the map typed and non-empty
    entries = ", ".join(f"{sql_string(name)}, {_role(g)}" for name, g in [("", default), *named])
    return f"coalesce(element_at(map({entries}), {_FILE}), {_role(default)})"


def _role(g: FileGroup | None) -> str:
    if g is None:  # a merged scan without snapshot-only files: no row falls back to it
        return f"named_struct('d', {bigint(None)}, 's', false, 'v', {bigint(None)})"
    return f"named_struct('d', {bigint(g.version)}, 's', {str(g.snapshot).lower()}, 'v', {bigint(g.read_version)})"


# Above this many bytes a scan filters on the event-time ranges as plain timestamp comparisons, which
# Parquet can push down to skip row groups; below it the lookup form keeps the generated code stable
# (stable_sql.py) and the few row groups read cost less than compiling the scan again.
PUSHDOWN_MIN_BYTES = 64 * 1024 * 1024


def _event_range_filter(spec, schema: pa.Schema, needed: list[Interval], size: int) -> str | None:
    """`ts in needed` on the raw event-time column when it is a UTC timestamp (rows without one
    belong to the sweep); None when the column is derived or not a timestamp. Scans of `size` bytes
    from `PUSHDOWN_MIN_BYTES` on get the form Parquet pushes down to its row groups."""
    if not needed or not _raw_utc_event_time(spec, schema):
        return None
    if size >= PUSHDOWN_MIN_BYTES:
        return in_ranges_sql(spec.event_time, needed)
    return stable_sql.in_ranges_sql(spec.event_time, needed, spec.granularity)


def _raw_utc_event_time(spec, schema: pa.Schema) -> bool:
    """The event time is a source column (not derived) holding UTC timestamps."""
    if spec.event_time not in schema.names or spec.event_time in dict(spec.derived):
        return False
    typ = schema.field(spec.event_time).type
    return pa.types.is_timestamp(typ) and typ.tz is not None


def with_partition(df: DataFrame, spec, at: str) -> DataFrame:
    """Add `__p`, the partition number of timestamp column `at` (files are laid out by it)."""
    return df.withColumn(PART, partition_id_column(at, spec.granularity))



