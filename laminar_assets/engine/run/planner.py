"""The planner: a pure function from (spec, watermark, source history) to a plan.

It reads nothing and writes nothing; `inputs.py` gathers its inputs, `executor.py`
carries its plan out, `report/overview.py` explains it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime

from laminar_assets.checkpoints.watermark import Watermark

from ..delta.tables import CommitKind, CommitSummary, SourceHistory
from ..spec.specs import RefreshPolicy, Spec
from ..windows import PARTITION_SPAN, Interval, coalesce, partition_interval, partitions_overlapping, share_inside
from .context import EngineOptions
from .plan import Mode, PartitionPlan, Reason


@dataclass(frozen=True)
class PlannerInput:
    """Everything the planner may look at."""

    spec: Spec
    partition: str
    watermark: Watermark | None
    histories: Mapping[str, SourceHistory] = field(hash=False)
    dimension_versions: Mapping[str, int] = field(default_factory=dict, hash=False)
    dimension_ids: Mapping[str, str] = field(default_factory=dict, hash=False)  # each one's Delta table id
    input_schema: Mapping[str, str] = field(default_factory=dict, hash=False)
    force: bool = False
    escalation: Reason | None = None  # set by the executor when a run finds it must refill
    escalation_scope: tuple[Interval, ...] | None = None  # window starts to refill for it (None: all)
    escalation_groups: tuple[int, ...] | None = None  # ... only these groups of them (None: whole windows)
    # Bytes of the partition's snapshot rows per source (estimated from file statistics) and the share
    # of them that, once changed, makes a refill cheaper than a merge; None: never refill for cost.
    partition_bytes: Mapping[str, int] | None = field(default=None, hash=False)
    refill_ratio: float | None = None
    refill_min_bytes: int = 0  # smaller partitions are never refilled for cost (job latency dominates)
    # Rows and bytes of the partition's committed state (its groups) and its snapshot rows (estimated from
    # file statistics), how deletes and updates under a min/max/first/last choose between merging first and
    # recomputing the windows up front (`EngineOptions.extreme_refill`; None: merge first), and the two
    # prices of that choice: a pass's fixed seconds and the bytes a pass reads per second.
    state_groups: int | None = None
    state_bytes: int | None = None
    partition_rows: int | None = None
    extreme_refill: str | None = None
    pass_seconds: float = EngineOptions.pass_seconds
    scan_bytes_per_second: float = EngineOptions.scan_bytes_per_second
    # The groups the deletes and updates of a NON_APPEND_ON_NON_RETRACTABLE refill touch (hashes of
    # (window start, keys), found by one Spark job over their change rows), and the share of the
    # touched windows' groups from which their windows are recomputed whole; None: whole windows.
    # A stage's are its changed dedup keys, weighed against its output rows in the partition
    # (`state_groups`); at the share or more, the partition is recomputed whole.
    changed_groups: tuple[int, ...] | None = None
    group_refill_share: float | None = None
    retract_extremes: bool = True  # False: deletes and updates refill what they touch (min/max as not retractable)


def needed_events(spec: Spec, part: Interval) -> Interval:
    """Event times whose rows can land in the partition's windows."""
    return spec.events_needed(part)


def refill_scope(spec: Spec, part: Interval, touched: Interval) -> Interval | None:
    """Window starts (flows) or event times (stages) of this partition affected by `touched`."""
    return spec.refill_scope(part, touched)


def _relevant(commit: CommitSummary, needed: Interval) -> bool:
    touched = commit.touched
    if touched is None:
        return True
    return any(t.overlaps(needed) for t in touched)


def _work_bound(spec, commits: tuple[CommitSummary, ...]) -> int:
    """How many of `commits` one run may take under the spec's work bounds (at least one)."""
    if not commits:
        return 0
    limit = len(commits)
    if spec.max_versions_per_run:
        limit = min(limit, spec.max_versions_per_run)
    if spec.max_rows_per_run:
        rows, taken = 0, 0
        for c in commits[:limit]:
            rows += c.rows
            if taken and rows > spec.max_rows_per_run:
                break
            taken += 1
        limit = taken
    return max(1, limit)


def _bound(spec, hist: SourceHistory) -> int:
    """How many of the history's commits one run may take under the spec's work bounds (at least one),
    and then more while the last one taken is at a version whose schema has a column the spec reads
    under another type family than the source has now (`SourceHistory.foreign`: retyped, then
    restored). A run pinned there would read that column with that version's type, which the spec's
    expressions were not written for (`px > 0` over text fails on every run, and the next run's
    bound stops at the same version: the flow never moves). The latest version always has today's
    schema, so the bound ends at the latest at most."""
    commits = hist.commits
    limit = _work_bound(spec, commits)
    foreign = set(hist.foreign)
    while limit < len(commits) and commits[limit - 1].version in foreign:
        limit += 1
    return limit


# Other partitions a plan names (run metadata): a file whose statistics run to a row dated 9999 spans
# 70 million hours, and listing them ran a run out of memory.
MAX_OTHER_PARTITIONS = 100


def _other_partitions(spec, commits, own: str) -> tuple[tuple[str, ...], bool]:
    """Up to `MAX_OTHER_PARTITIONS` other partitions the commits touched (earliest first), and whether
    more are touched than listed (or some unknown)."""
    keys: set[str] = set()
    unknown = False
    for c in commits:
        touched = c.touched
        if touched is None:
            unknown = True
            continue
        for t in touched:
            t = t.intersect(PARTITION_SPAN)
            if t is not None and spec.bounds is not None:
                t = t.intersect(spec.bounds)
            if t is None:
                continue
            listed = partitions_overlapping(t, spec.granularity, limit=MAX_OTHER_PARTITIONS + 2)
            unknown |= len(listed) > MAX_OTHER_PARTITIONS + 1
            keys.update(listed)
    keys.discard(own)
    unknown |= len(keys) > MAX_OTHER_PARTITIONS
    return tuple(sorted(keys)[:MAX_OTHER_PARTITIONS]), unknown


def plan_partition(inp: PlannerInput) -> PartitionPlan:
    """Choose INCREMENTAL, REFILL or NOOP and a reason for one (flow, partition)."""
    if inp.escalation is not None and inp.escalation_scope is not None:
        return _escalate_windows(_plan(replace(inp, escalation=None, escalation_scope=None, escalation_groups=None)),
                                 inp)
    plan = _plan(inp)
    if plan.mode is Mode.INCREMENTAL and inp.spec.refresh is not RefreshPolicy.INCREMENTAL_STRICT:
        plan = _extremes_up_front(plan, inp)
    if plan.mode is Mode.INCREMENTAL and inp.refill_ratio is not None and inp.partition_bytes is not None \
            and inp.spec.refresh is not RefreshPolicy.INCREMENTAL_STRICT:
        return _cheaper_refill(plan, inp)
    return plan


def _escalate_windows(plan: PartitionPlan, inp: PlannerInput) -> PartitionPlan:
    """The plan, with the escalation's windows added to what it refills (e.g. PRECISION_LOSS)."""
    for src, hist in inp.histories.items():  # a bounded run recomputes from the snapshot at its target
        to = plan.to_versions.get(src, hist.latest_version)
        unreadable = hist.snapshot_readable(to) if to < hist.latest_version else None
        if unreadable:
            expired = _plan(replace(inp, escalation=Reason.CHECKPOINT_EXPIRED, escalation_scope=None,
                                    escalation_groups=None))
            return replace(expired, detail=f"{unreadable}: refilling at the latest version")
    assert inp.escalation is not None and inp.escalation_scope is not None, inp  # plan_partition checked both
    mine = [s for s in inp.escalation_scope if s.overlaps(plan.interval)]
    windows = ", ".join(f"{s.start:%H:%M}..{s.end:%H:%M}" for s in inp.escalation_scope)
    if inp.escalation_groups is not None and not plan.refill_all \
            and len(inp.escalation_groups) + len(plan.refill_groups) <= MAX_REFILL_GROUPS:
        n = len(inp.escalation_groups)
        return replace(plan, mode=Mode.REFILL, reason=inp.escalation,
                       detail=f"{inp.escalation.describe}: {n} group(s) recomputed, in windows starting {windows}; "
                              "the other groups merged",
                       refill_groups=tuple(sorted({*plan.refill_groups, *inp.escalation_groups})),
                       group_windows=coalesce([*plan.group_windows, *mine]))
    scope = coalesce([*plan.refill, *mine])
    whole = plan.refill_all or (len(scope) == 1 and scope[0] == plan.interval)
    return replace(plan, mode=Mode.REFILL, reason=inp.escalation,
                   detail=f"{inp.escalation.describe} (windows starting {windows})", refill=scope, refill_all=whole)


def _extremes_up_front(plan: PartitionPlan, inp: PlannerInput) -> PartitionPlan:
    """EXTREME_RETRACTED up front: recompute the windows deletes and updates touch in this run's one
    pass, instead of merging first, when that is expected to cost less (`extreme_refill="cost"`) or
    always (`"windows"`).

    A retracted row holds its group's extreme with probability ~1/(the group's rows), so with a
    share s of the partition's rows retracted and k extreme aggregates, ~L = k x s x (groups)
    extremes are lost (Poisson): some group loses one with probability 1 - exp(-L). Merging first
    costs a pass reading the change and the partition's state; when a group lost an extreme, the pass
    finds it and the run makes a second one, which reads them again and recomputes those groups from
    the rows of their windows (~1 - exp(-L / touched windows) of the touched windows' bytes).
    Recomputing up front costs one pass reading the touched windows' rows and the state of the
    partition's other windows (kept). Each pass is priced at `pass_seconds`
    plus its bytes at `scan_bytes_per_second`; the plan's detail gives both estimates, whichever
    is chosen."""
    k, how = inp.spec.held_extremes, inp.extreme_refill
    if not k or how is None or how == "merge":
        return plan
    changed, changed_bytes, windows = 0.0, 0.0, []
    for src, versions in plan.incremental_versions.items():
        wanted = set(versions)
        for c in inp.histories[src].commits:
            if c.version not in wanted or c.kind not in (CommitKind.CHANGE_DATA, CommitKind.DELETION_VECTORS):
                continue
            if c.kind is CommitKind.DELETION_VECTORS:
                for f in c.adds:
                    if f.dv_change is not None:
                        inside = share_inside(f.time_range, plan.needed)
                        changed += inside * f.dv_change.rows
                        changed_bytes += inside * f.size  # the file is read again for the rows it lost
            elif any(f.rows is None for f in c.cdc) and how == "cost":
                return plan  # rows unknown: merge, and let the pass find what it removed
            else:  # an update's change data holds each row twice: as it was and as it is now
                images = 2 if c.operation.upper().startswith("UPDATE") else 1
                changed += sum(share_inside(f.time_range, plan.needed) * (f.rows or 0) for f in c.cdc) / images
                changed_bytes += sum(share_inside(f.time_range, plan.needed) * f.size for f in c.cdc)
            windows.extend(_scope(inp.spec, plan.interval, c))
    if not windows:
        return plan
    slide = inp.spec.aggregation_for("pricing the refill of held extremes").shape.slide  # a stage holds none
    in_part = max(1, -(-(plan.interval.end - plan.interval.start) // slide))
    touched = min(in_part, max(1, sum(-(-(w.end - w.start) // slide) for w in coalesce(windows))))
    if how == "windows":
        estimate = "extreme_refill is 'windows'"
    else:
        if not inp.state_groups or not inp.partition_rows or inp.partition_bytes is None or changed <= 0:
            return plan
        losses = k * inp.state_groups * min(1.0, changed / inp.partition_rows)
        some_lost = 1 - math.exp(-losses)
        window_bytes = sum(inp.partition_bytes.values()) * touched / in_part
        state = inp.state_bytes or 0  # read by every pass that keeps some of the partition's windows

        def seconds(read: float) -> float:
            return inp.pass_seconds + read / inp.scan_bytes_per_second

        merge = seconds(changed_bytes + state)
        again = seconds(changed_bytes + state + window_bytes * (1 - math.exp(-losses / touched)))
        merge_first = merge + some_lost * again
        up_front = seconds(window_bytes + (state if touched < in_part else 0))
        estimate = (f"~{int(changed):,} of ~{inp.partition_rows:,} rows deleted or updated, {k} extreme aggregate(s) "
                    f"over {inp.state_groups:,} group(s): ~{losses:.1f} extreme(s) expected to be lost, some group "
                    f"with probability {some_lost:.0%}; expected cost of merging first ~{merge_first:.2f}s (a pass "
                    f"of ~{merge:.2f}s, then {some_lost:.0%} x a second one of ~{again:.2f}s), of recomputing the "
                    f"{touched} touched window(s) up front ~{up_front:.2f}s")
        if up_front >= merge_first:
            return replace(plan, detail=f"{plan.detail}; merging first: {estimate}")
    refill = _plan(replace(inp, retract_extremes=False))
    if refill.reason is not Reason.NON_APPEND_ON_NON_RETRACTABLE:
        return refill  # e.g. a bounded run's snapshot expired: that reason
    return replace(refill, reason=Reason.EXTREME_RETRACTED,
                   detail=f"recomputing the windows deletes and updates touch up front: {estimate}")


def _cheaper_refill(plan: PartitionPlan, inp: PlannerInput) -> PartitionPlan:
    """REFILL_CHEAPER when the partition's changed bytes are a large share of its bytes."""
    assert inp.partition_bytes is not None and inp.refill_ratio is not None, inp  # plan_partition checked both
    changed = 0.0
    for src, versions in plan.incremental_versions.items():
        wanted = set(versions)
        for c in inp.histories[src].commits:
            if c.version in wanted:
                changed += sum(share_inside(f.time_range, plan.needed) * f.size for f in c.readable)
    total = float(sum(inp.partition_bytes.values()))
    if changed <= 0 or changed < inp.refill_ratio * total or max(total, changed) < inp.refill_min_bytes:
        return plan
    share = changed / total if total else float("inf")
    detail = (f"changed rows ~{int(changed):,} bytes vs ~{int(total):,} bytes in the partition "
              f"({share:.0%} >= refill_ratio {inp.refill_ratio:.0%}): recomputing reads less than merging")
    return replace(plan, mode=Mode.REFILL, reason=Reason.REFILL_CHEAPER, detail=detail,
                   refill=(plan.interval,), refill_all=True, incremental_versions={})


def _plan(inp: PlannerInput) -> PartitionPlan:
    spec, mark = inp.spec, inp.watermark
    part = partition_interval(inp.partition, spec.granularity)
    needed = needed_events(spec, part)
    latest = {src: h.latest_version for src, h in inp.histories.items()}
    latest.update(inp.dimension_versions)
    from_versions = {src: (mark.source_versions.get(src) if mark else None) for src in latest}

    stretched: list[str] = []  # sources whose bound was passed (`_bound`), said in the plans of the bounded path

    def make(mode, reason, detail, **kw) -> PartitionPlan:
        if "to_versions" in kw and stretched:
            detail = f"{detail}; {'; '.join(stretched)}"
        to_versions = kw.pop("to_versions", latest)
        return PartitionPlan(
            flow=spec.name, partition=inp.partition, interval=part, needed=needed, mode=mode,
            reason=reason, detail=detail, spec_hash=spec.spec_hash, from_versions=from_versions,
            to_versions=dict(to_versions), **kw,
        )

    def refill_all(reason: Reason, detail: str) -> PartitionPlan:
        commits = [c for h in inp.histories.values() for c in h.commits]
        others, unknown = _other_partitions(spec, commits, inp.partition)
        return make(Mode.REFILL, reason, detail, refill=(part,), refill_all=True,
                    other_partitions=others, other_partitions_unknown=unknown)

    if inp.force:
        return refill_all(Reason.FORCED_BY_USER, "refill requested explicitly")
    if spec.refresh is RefreshPolicy.FULL:
        return refill_all(Reason.FORCED_BY_POLICY, "refresh policy is 'full'")
    if mark is None or not mark.committed:
        return refill_all(Reason.NO_WATERMARK, f"partition {inp.partition} has no watermark yet")
    if mark.spec_hash != spec.spec_hash:
        return refill_all(Reason.SPEC_CHANGED, f"state was built by spec {mark.spec_hash}, the spec is now {spec.spec_hash}")
    if inp.escalation is not None:
        return refill_all(inp.escalation, inp.escalation.describe)
    if mark.failed_attempt:
        return refill_all(Reason.PREVIOUS_ATTEMPT_FAILED, f"previous attempt failed: {mark.failed_attempt}")
    missing = [src for src in latest if src not in mark.source_versions]
    if missing:
        return refill_all(Reason.SPEC_CHANGED, f"no watermark for input(s) {', '.join(missing)}")
    for dim, version in inp.dimension_versions.items():
        if mark.source_versions[dim] != version:
            return refill_all(Reason.DIMENSION_CHANGED,
                              f"dimension '{dim}' moved from version {mark.source_versions[dim]} to {version}")
        was, now = mark.source_ids.get(dim), inp.dimension_ids.get(dim)
        if was and now and was != now:
            return refill_all(Reason.DIMENSION_CHANGED, f"dimension '{dim}' was recreated (its Delta table id changed)")
    for hist in inp.histories.values():
        if hist.expired:
            return refill_all(Reason.CHECKPOINT_EXPIRED, hist.expired)
    changed_cols = sorted(c for c, t in inp.input_schema.items() if mark.input_schema.get(c, t) != t)
    if changed_cols:
        detail = ", ".join(f"{c}: {mark.input_schema[c]} -> {inp.input_schema[c]}" for c in changed_cols)
        return refill_all(Reason.SCHEMA_CHANGED, f"source column types changed ({detail})")
    widened = next((why for h in inp.histories.values() for _v, why in h.widened), None)
    if widened and not _frozen(spec, part, inp.histories):
        return refill_all(Reason.SCHEMA_CHANGED, f"{widened} (type widening): recomputing from the latest snapshot")
    retyped = _retyped(inp.histories, needed)
    if retyped and not _frozen(spec, part, inp.histories):
        return refill_all(Reason.SCHEMA_CHANGED_HISTORY, f"{retyped}: recomputing from the latest snapshot")

    # Work through each source's new commits under the run bounds.
    to_versions = dict(latest)
    pending: dict[str, int] = {}
    incremental: dict[str, tuple[int, ...]] = {}
    refill: list[Interval] = []
    refill_reason: Reason | None = None
    refill_detail = ""
    kinds: set[CommitKind] = set()
    processed: list[CommitSummary] = []
    retractable, opaque = spec.retractable, spec.not_incrementalizable
    if not inp.retract_extremes and spec.held_extremes:
        retractable = False
    for src, hist in inp.histories.items():
        take = _bound(spec, hist)
        taken = hist.commits[:take]
        bounded = _work_bound(spec, hist.commits)
        if take > bounded:
            stretched.append(f"the work bound would stop at version {taken[bounded - 1].version} of '{src}', where a "
                             f"column '{spec.name}' reads had another type family than now (retyped, then restored): "
                             f"the run goes on to version {taken[-1].version}, the first after it with today's types")
        if taken:
            to_versions[src] = taken[-1].version
            pending[src] = hist.latest_version - taken[-1].version
        processed.extend(taken)
        versions: list[int] = []
        for commit in taken:
            if not _relevant(commit, needed):
                continue
            if opaque and commit.kind is not CommitKind.REWRITE:
                # Nothing merges: recompute exactly the windows the commit touches.
                kinds.add(commit.kind)
                refill.extend(_scope(spec, part, commit))
                if refill_reason is None:
                    refill_reason = Reason.QUERY_NOT_INCREMENTALIZABLE
                    refill_detail = (f"QUERY_NOT_INCREMENTALIZABLE: {', '.join(opaque)} (commit {commit.version} of "
                                     f"'{src}', {commit.operation}): the windows it touches are recomputed")
            elif commit.kind is CommitKind.APPEND:
                versions.append(commit.version)
                kinds.add(commit.kind)
            elif commit.kind in (CommitKind.CHANGE_DATA, CommitKind.DELETION_VECTORS):
                kinds.add(commit.kind)
                if retractable:
                    versions.append(commit.version)
                else:
                    refill.extend(_scope(spec, part, commit))
                    if refill_reason is None:
                        refill_reason = Reason.NON_APPEND_ON_NON_RETRACTABLE
                        refill_detail = (f"commit {commit.version} of '{src}' ({commit.operation}) deletes or updates rows"
                                         f"{_through_vectors(commit)} and {_why_not_retractable(spec)}")
            elif commit.kind is CommitKind.REWRITE:
                kinds.add(commit.kind)
                refill.extend(_scope(spec, part, commit))
                refill_reason = Reason.REWRITE_WITHOUT_CHANGE_DATA
                refill_detail = (f"commit {commit.version} of '{src}' ({commit.operation}) rewrote data without a "
                                 "change data feed (enable delta.enableChangeDataFeed to avoid refills)")
        incremental[src] = tuple(versions)

    others, unknown = _other_partitions(spec, processed, inp.partition)
    common = dict(to_versions=to_versions, pending_versions=pending, incremental_versions=incremental,
                  other_partitions=others, other_partitions_unknown=unknown)
    if _frozen(spec, part, inp.histories):
        if kinds:
            return make(Mode.NOOP, Reason.PARTITION_FROZEN,
                        f"partition is older than freeze_after={spec.late.freeze_after}; "
                        f"changes in versions {sorted(v for vs in incremental.values() for v in vs)} are ignored",
                        **{**common, "incremental_versions": {}})
    if refill:
        for src, hist in inp.histories.items():  # a bounded refill reads the snapshot at its target version
            unreadable = hist.snapshot_readable(to_versions[src]) if to_versions[src] < hist.latest_version else None
            if unreadable:
                return refill_all(Reason.CHECKPOINT_EXPIRED, f"{unreadable}: refilling at the latest version")
        scope = coalesce(refill)
        whole = len(scope) == 1 and scope[0] == part
        if refill_reason is Reason.NON_APPEND_ON_NON_RETRACTABLE and inp.changed_groups is not None:
            scoped = _NARROWED[spec.refill_unit](inp, part, scope)
            return make(Mode.REFILL, refill_reason, refill_detail + scoped.pop("detail"), **scoped, **common)
        return make(Mode.REFILL, refill_reason, refill_detail, refill=scope, refill_all=whole, **common)
    if any(incremental.values()):
        reason = Reason.APPEND_ONLY if kinds == {CommitKind.APPEND} else Reason.RETRACTABLE_CHANGES
        detail = reason.describe
        dv = [c for c in processed if c.kind is CommitKind.DELETION_VECTORS and c.version in
              {v for vs in incremental.values() for v in vs}]
        if dv:
            reason = Reason.DELETION_VECTOR_CHANGES
            detail = (f"{reason.describe}: commit(s) {', '.join(str(c.version) for c in dv)} "
                      f"({sum(c.dv_rows for c in dv)} row(s) deleted or restored in place)")
        return make(Mode.INCREMENTAL, reason, detail, **common)
    if processed:
        return make(Mode.NOOP, Reason.NO_CHANGES_IN_PARTITION,
                    f"{len(processed)} new version(s) touch no window of this partition", **common)
    return make(Mode.NOOP, Reason.NO_NEW_VERSIONS, Reason.NO_NEW_VERSIONS.describe, **common)


# Groups are named in the pass's SQL, so a refill of more than this many recomputes whole windows.
MAX_REFILL_GROUPS = 10_000


def _group_scope(inp: PlannerInput, part: Interval, scope: tuple[Interval, ...]) -> dict:
    """The refill of `scope` as its changed groups alone, or as whole windows when those groups are at
    least `group_refill_share` of the groups the windows hold (estimated from the partition's state:
    its groups spread evenly over its windows)."""
    groups = inp.changed_groups
    slide = inp.spec.aggregation_for("refilling changed groups").shape.slide  # refill_unit "groups": a flow's
    windows = sum(-(-(w.end - w.start) // slide) for w in scope)
    held = (inp.state_groups or 0) * windows / max(1, (part.end - part.start) // slide)
    if not groups:  # every changed row is one the flow leaves out (its filter): nothing to recompute
        return dict(detail=": none of the changed rows counts for the flow, nothing is recomputed")
    share = len(groups) / held if held else float("inf")
    if inp.group_refill_share is None or share >= inp.group_refill_share or len(groups) > MAX_REFILL_GROUPS:
        whole = len(scope) == 1 and scope[0] == part
        return dict(refill=scope, refill_all=whole,
                    detail=f": {len(groups)} of ~{int(held)} group(s) changed, the windows are recomputed")
    return dict(refill_groups=tuple(sorted(set(groups))), group_windows=scope,
                detail=f": {len(groups)} of ~{int(held)} group(s) in {windows} window(s) recomputed, "
                                     "the others keep their state")


def _key_scope(inp: PlannerInput, part: Interval, _scope: tuple[Interval, ...] = ()) -> dict:
    """A stage's refill as its changed keys alone (the rest of the partition keeps its rows), or as
    the whole partition when those keys are at least `group_refill_share` of its output rows."""
    keys, held = inp.changed_groups, inp.state_groups or 0
    if not keys:  # every changed row is one the stage leaves out (its filter): nothing to recompute
        return dict(detail=": none of the changed rows reaches the stage's output, nothing is recomputed")
    share = len(keys) / held if held else float("inf")
    if inp.group_refill_share is None or share >= inp.group_refill_share or len(keys) > MAX_REFILL_GROUPS:
        return dict(refill=(part,), refill_all=True,
                    detail=f": {len(keys)} key(s) changed of {held:,} output row(s), the partition is recomputed")
    return dict(refill_groups=tuple(sorted(set(keys))), group_windows=(part,),
                detail=f": {len(keys)} key(s) of {held:,} output row(s) recomputed, the other rows are kept")


def _scope(spec, part: Interval, commit: CommitSummary) -> list[Interval]:
    touched = commit.touched
    if touched is None:
        return [part]
    out = []
    for t in touched:
        s = refill_scope(spec, part, t)
        if s is not None:
            out.append(s)
    return out


def _through_vectors(commit: CommitSummary) -> str:
    if commit.kind is not CommitKind.DELETION_VECTORS:
        return ""
    return f" through deletion vectors ({commit.dv_rows} row(s) in place)"


def _why_not_retractable(spec) -> str:
    return spec.why_not_retractable


def _retyped(histories: Mapping[str, SourceHistory], needed: Interval) -> str | None:
    """Why a commit this partition would read holds files no read with the current schema can open
    (`SourceHistory.retyped`), or None."""
    for hist in histories.values():
        commits = {c.version: c for c in hist.commits}
        for version, why in hist.retyped:
            if version in commits and _relevant(commits[version], needed):
                return why
    return None


def _frozen(spec, part: Interval, histories: Mapping[str, SourceHistory]) -> bool:
    after = spec.late.freeze_after
    if after is None:
        return False
    newest: datetime | None = None
    for h in histories.values():
        for c in h.commits:
            newest = c.timestamp if newest is None else max(newest, c.timestamp)
    return newest is not None and part.end + after <= newest


# How a refill of part of a partition narrows, by the spec's `refill_unit`: the changed groups of windows (a flow),
# the changed keys (a stage).
_NARROWED: dict[str, Callable[[PlannerInput, Interval, tuple[Interval, ...]], dict]] = {
    "groups": _group_scope, "keys": _key_scope}
