"""A run over partitions that are up to date and whose inputs did not move: answered without leases,
without opening any Delta table and without writing anything but the run's outcome record.

On an object store every request costs 10-100 ms, and a run that finds nothing new is the most
common run of a scheduled or sensor-driven flow. The full path takes every lease, reads every
watermark, opens every source (its log replayed from the last checkpoint) and the sink, and reads
the sweep's progress: tens of requests, growing with the tables' age. Here it is, on S3:

    one listing of the flow's watermarks   (`CheckpointStore.load_listed`: their tags; a watermark
                                            this process read or wrote with that tag is not read again)
    one listing per input table's log       from the version the watermarks name: no newer commit, and
                                            that version's commit file is the one the last run saw
    the outcome record                      (one PUT, as every run)

and in a process that has not run the flow yet, a read of each watermark (side by side) and of the
sweep's progress.

The answer is NOOP / NO_NEW_VERSIONS for every partition, the one the planner gives when
nothing moved. It is given only when all of these hold, else the full path runs (and nothing is lost):

- no refill was asked for, and the spec's refresh policy is not 'full';
- every partition has a committed watermark of this spec (same spec hash), with no intent, no failed
  attempt and no failed-run count, and all of them name the same input versions;
- those versions are the latest in every log, and their commit files are the ones the flow's last run
  saw: this process ran the flow before (`remember`) and saw each with the tag the listing shows now, or
  every watermark names those tags (`Watermark.source_tags`: so a new process, as every run the daemon
  launches is, answers too). A table deleted and recreated at the same path has another commit file there;
- the sweep's progress for this spec covers those versions (read once by a process that has not yet).

Why no claim: nothing is written but the outcome record. A run holding a partition changes its
watermark (its intent) before it commits anything, and a later listing sees the new tag.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TypeGuard

from laminar_assets.checkpoints import Watermark

from ..delta.snapshot_cache import log_tail
from ..spec.specs import RefreshPolicy, Spec
from ..windows import partition_interval
from .context import RunContext
from .plan import Mode, PartitionPlan, Reason
from .planner import needed_events

_lock = threading.Lock()
# (root, flow, spec hash) -> {table: (version, tag of its commit file)}: what this process ran the flow up to
_seen: dict[tuple[str, str, str], dict[str, tuple[int, str]]] = {}


@dataclass(frozen=True)
class Check:
    """What `check` found: the watermarks (when they agree on the versions) and each input's latest
    version and commit tag (when its log could be listed from there)."""

    marks: dict[str, Watermark | None]
    latest: dict[str, tuple[int, str]] | None
    plans: dict[str, PartitionPlan] | None  # the NOOP plans, when the run has nothing to do
    # {table uri: {version: tag}} of the commit files listed (from the watermarks' versions on): the run's
    # snapshots start from them instead of listing again (`snapshot_cache.checkout`)
    listed: dict[str, dict[int, str]] = field(default_factory=dict)
    # the watermarks with the tag each had when listed or read (None: none): the run's writes are conditional on
    # them (`protocol.Claims`), so it needs no second listing
    tagged: dict[str, tuple[Watermark | None, str | None]] = field(default_factory=dict)


def check(ctx: RunContext, spec: Spec, keys: list[str], force: bool) -> Check | None:
    """The NOOP plans of `keys` when nothing moved (see the module's docstring), else what was read
    on the way (for `remember`). None: not worth looking (a refill asked for, a 'full' policy)."""
    if force or spec.refresh is RefreshPolicy.FULL:
        return None
    tagged = ctx.store.load_listed_tagged(spec.name, keys)
    marks = {k: mark for k, (mark, _tag) in tagged.items()}
    first = marks[keys[0]]
    if first is None or any(not _settled(m, spec) or m.source_versions != first.source_versions for m in marks.values()):
        return Check(marks, None, None, tagged=tagged)  # (first is one of the marks: None is not settled)
    latest: dict[str, tuple[int, str]] = {}
    listed: dict[str, dict[int, str]] = {}
    for table, version in first.source_versions.items():
        uri = ctx.layout.table_uri(table)
        listed[uri] = log_tail(uri, version)
        if not listed[uri]:
            return Check(marks, None, None, listed, tagged)
        latest[table] = max(listed[uri].items())
    with _lock:
        seen = _seen.get((ctx.layout.root, spec.name, spec.spec_hash))
    # the same tables: this process ran the flow up to these commit files, or the watermarks name their tags
    same = (seen is not None and seen == latest) or all(
        tag is not None and m is not None and m.source_tags.get(t) == tag
        for m in marks.values() for t, (_v, tag) in latest.items())
    unchanged = same and all(latest[t][0] == v for t, v in first.source_versions.items())
    if unchanged and ctx.store.swept(spec.name, spec.spec_hash) is None:
        ctx.store.load_sweep(spec.name, spec.spec_hash)  # a process that has not read it yet: one read
    swept = ctx.store.swept(spec.name, spec.spec_hash)
    unchanged = unchanged and swept is not None and all(
        swept.get(src, -1) >= first.source_versions[src] for src in spec.sources)
    if not unchanged:
        return Check(marks, latest, None, listed, tagged)
    return Check(marks, latest, {k: _noop(spec, k, marks[k]) for k in keys}, listed, tagged)


def remember(ctx: RunContext, spec: Spec, found: Check | None, plans: list[PartitionPlan],
             read: dict[str, tuple[int, str]] | None = None) -> None:
    """After a run that ended with every partition at the same versions, the latest ones: the next run
    of these partitions may be answered by `check`. What `check` listed before the run says which
    versions were the latest; when it listed nothing (a first run, a new partition, watermarks at different
    versions), the run's own snapshots say it (`read`: input -> (version, tag of its commit file) as the run's
    checkout listed them), else each input's log is listed now from the run's versions (one request per input).
    A commit that landed since is found by the next `check`'s listing, which starts at the version kept here."""
    if found is None or not plans or any(p.to_versions != plans[0].to_versions for p in plans):
        return
    versions = plans[0].to_versions
    latest = found.latest
    if latest is None or {t: v for t, (v, _tag) in latest.items()} != versions:
        if latest is not None:
            return  # the run stopped short of the latest versions (bounded): the next run has work
        latest = {}
        for table, version in versions.items():
            if read and table in read and read[table][0] == version:
                latest[table] = read[table]
                continue
            listed = log_tail(ctx.layout.table_uri(table), version)
            if not listed or max(listed) != version:
                return
            latest[table] = (version, listed[version])
    with _lock:
        _seen[(ctx.layout.root, spec.name, spec.spec_hash)] = dict(latest)


def tags_at(found: Check | None, versions: dict[str, int]) -> dict[str, str]:
    """The tags of the inputs' commit files at `versions`, where `check` listed them (for the watermarks:
    `Watermark.source_tags`); an input it did not list, or listed at another latest version, has none."""
    latest = found.latest if found is not None else None
    return {t: latest[t][1] for t, v in versions.items()
            if latest and t in latest and latest[t][0] == v and latest[t][1] is not None}


def _settled(mark: Watermark | None, spec: Spec) -> TypeGuard[Watermark]:
    return (mark is not None and mark.committed and mark.pending is None and not mark.failed_attempt
            and mark.failed_runs is None and mark.spec_hash == spec.spec_hash and bool(mark.source_versions))



def _noop(spec: Spec, key: str, mark: Watermark | None) -> PartitionPlan:
    assert mark is not None  # check plans NOOP only partitions whose marks are settled
    part = partition_interval(key, spec.granularity)
    return PartitionPlan(
        flow=spec.name, partition=key, interval=part, needed=needed_events(spec, part), mode=Mode.NOOP,
        reason=Reason.NO_NEW_VERSIONS, detail=Reason.NO_NEW_VERSIONS.describe, spec_hash=spec.spec_hash,
        from_versions=dict(mark.source_versions), to_versions=dict(mark.source_versions),
        pending_versions={t: 0 for t in mark.source_versions})
