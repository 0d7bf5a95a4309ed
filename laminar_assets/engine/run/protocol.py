"""The watermark protocol: claims, intent, settling an interrupted run, finishing, failures.

Per (flow, partition), in this order (docs/ARCHITECTURE.md):
  1. read the watermark (its tag with it); refuse the run when a live run holds it; claim it and settle an
     interrupted run from its intent record, when there is one;
  2. write the intent (`pending`: run seq + target versions) into the watermark, naming this run as holder,
     conditional on the version read in 1: this write is the claim (another run that wrote the watermark
     since makes it fail: `ConcurrentRunError`, nothing committed);
  3. commit the state rows   (Delta app transaction `laminar/<flow>/<partition>` = seq);
  4. commit the sink rows    (same app transaction);
  5. replace the watermark with the target versions and seq, holder cleared (conditional on 2's version).
A run of several partitions shares the commits of 3 and 4 (one app transaction per
partition in each); intents and watermarks stay per partition, so recovery is
per partition. A crash after 3 is finished on restart; a crash before 3 leaves
nothing behind and the next run refills (PREVIOUS_ATTEMPT_FAILED). The partitions' writes of one step
(2, 5) are one conditional write per block of partitions (a week of hourly ones: `CheckpointStore`), each
watermark in it compared on its own: any subset of the blocks may be written when a run dies, which
recovery, being per partition, already handles. A partition the run finds nothing
to do for is written only when its record changes (a NOOP's newer versions), in one conditional write.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from laminar_assets import storage
from laminar_assets.checkpoints import CheckpointStore, FailedRuns, PendingRun, Watermark
from laminar_assets.errors import (
    CheckpointError,
    ConcurrentRunError,
    InjectedCrash,
    LaminarError,
    StoreUnavailableError,
)
from laminar_assets.storage import failures

from ..delta.tables import open_delta
from ..delta.transactions import txn_versions_of
from ..spark.failures import first_line, texts
from .context import RunContext
from .plan import Mode, PartitionPlan

log = logging.getLogger(__name__)
T = TypeVar("T")


class Claims:
    """A run's writes of its partitions' watermarks (the module's steps): each conditional on the version the run
    read or last wrote, each naming the run as the partition's holder until the run's last write of it. The
    first write of a partition is the claim: it fails when another run wrote the watermark since this run read
    it, and then this run's plan of that partition may be stale. `tags`: partition -> the tag of the watermark
    as the run read it (None: there was none)."""

    def __init__(self, store: CheckpointStore, spec, run_id: str, tags: dict[str, str | None]) -> None:
        self.store, self.spec, self.run_id = store, spec, run_id
        self.tags = dict(tags)
        self.held: dict[str, Watermark] = {}  # partition -> its watermark as this run last wrote it, holding it
        self.written: dict[str, Watermark] = {}  # every partition this run wrote -> its watermark as last written
        self.me = store.holder(run_id)

    def write(self, key: str, mark: Watermark, *, hold: bool) -> bool:
        """Write `mark` as `key`'s watermark, naming this run as holder when `hold`; False (nothing written) when
        another run wrote it since this run read or last wrote it."""
        return self.write_many([(key, mark, hold)])[0]

    def write_many(self, items: list[tuple[str, Watermark, bool]]) -> list[bool]:
        """`write` of each (partition, watermark, hold), in one conditional write per block of partitions
        (`CheckpointStore.write_many_if`); whether each was written, in order."""
        bodies = [(key, mark.with_(holder=self.me if hold else None), hold) for key, mark, hold in items]
        # the writes that landed are recorded before a failed block's error is raised: what this run holds
        tags, error = self.store.write_many_partly([(body, self.tags.get(key)) for key, body, _hold in bodies])
        done = []
        for (key, body, hold), tag in zip(bodies, tags):
            done.append(tag is not None)
            if tag is None:
                continue
            self.tags[key] = tag
            self.written[key] = body
            if hold:
                self.held[key] = body
            else:
                self.held.pop(key, None)
        if error is not None:
            raise error
        return done

    def claim_all(self, marks: dict[str, Watermark | None]) -> None:
        """Hold each partition of `marks` before anything else is written for it (to settle an interrupted run):
        its watermark as read, or a placeholder with nothing committed; `ConcurrentRunError` naming the first
        one another run wrote since (the others are held, and given back when the run ends)."""
        items = [(k, mark or Watermark(self.spec.name, k, self.spec.spec_hash, {}, 0), True) for k, mark in marks.items()]
        for (k, _mark, _hold), ok in zip(items, self.write_many(items)):
            if not ok:
                raise self.taken(k)

    def claim(self, key: str, mark: Watermark | None) -> None:
        """`claim_all` of one partition."""
        self.claim_all({key: mark})

    def taken(self, key: str) -> ConcurrentRunError:
        current = self.store.load(self.spec.name, key)
        who = f" ({self.store.describe(current.holder)})" if current is not None and current.holder else ""
        return ConcurrentRunError(
            f"partition is being processed by another run{who}, which wrote its watermark after this run read "
            "it; nothing of this run was written: run it again and it continues from there",
            flow=self.spec.name, partition=key)

    def undo_all(self, marks: dict[str, Watermark | None]) -> None:
        """Give each partition of `marks` back as it was before this run's claim (its watermark as read; None:
        there was none)."""
        for key, mark in marks.items():
            if mark is None and self.store.delete_if(self.spec.name, key, self.tags[key]):  # rare: one apiece
                self.held.pop(key, None)
                self.written.pop(key, None)
                self.tags[key] = None
        self.write_many([(key, mark, False) for key, mark in marks.items() if mark is not None])

    def end(self, exc: BaseException | None) -> None:
        """Clear this run as holder of every partition it still holds (a partition claimed to be settled that
        had nothing to do). A simulated kill (`InjectedCrash`) writes nothing, and a release that fails (a store
        that stopped answering) leaves the holder: either way this process takes the partition over next time
        (`CheckpointStore.abandon`), and another process once this one is gone."""
        held = dict(self.held)
        if not held:
            return
        if not isinstance(exc, InjectedCrash):
            try:
                self.write_many([(key, mark, False) for key, mark in held.items()])
                return
            except (LaminarError, OSError) as err:
                log.warning("%s %s: this run's hold was not cleared (%s); this process's next run takes it over",
                            self.spec.name, ", ".join(held), err)
        for key in held:
            self.store.abandon(self.spec.name, key, self.run_id)


def refuse_held(store: CheckpointStore, spec, marks: dict[str, Watermark | None]) -> None:
    """`ConcurrentRunError` naming the first partition a live run holds (before this run writes anything)."""
    for key, mark in marks.items():
        if mark is not None and mark.holder is not None and not store.holder_gone(mark.holder, spec.name, key):
            raise ConcurrentRunError(
                f"partition is being processed by another run ({store.describe(mark.holder)}); wait for it to finish "
                "(a run whose process is gone on this host, or that began more than lease_seconds ago, is taken "
                f"over; one that died on another host: `laminar release {spec.name} {key}`)",
                flow=spec.name, partition=key)


def txn_version(uri: str, app: str) -> int | None:
    """The app-transaction version `app` committed to the table at `uri`; None if the table does
    not exist or holds none. Any other failure to read the table is an error, not a None: a None
    here would skip the guard against concurrent writers."""
    return txn_versions(uri, [app])[app]


def txn_versions(uri: str, apps: list[str], *, opened: dict[str, DeltaTable] | None = None,
                 open_table: Callable[[str], DeltaTable | None] | None = None) -> dict[str, int | None]:
    """`txn_version` of several apps from one open of the table. `opened`: the run's open tables
    (`RunInputs.opened`); the table opened here is kept there for the run's later reads. `open_table`: how
    the run opens a table it writes (`RunInputs.own_table`; None: no table yet)."""
    try:
        table = open_table(uri) if open_table is not None else open_delta(uri)
    except TableNotFoundError:
        table = None
    if table is None:
        return {a: None for a in apps}
    if opened is not None:
        opened[uri] = table
    return txn_versions_of(table, uri, apps)


@dataclass(frozen=True)
class Settled:
    """A watermark after settling its intent; `rederive_sink`: the state landed but the sink did not."""

    mark: Watermark
    rederive_sink: bool = False
    seq: int = 0
    input_schema: dict | None = None


def settle(ctx: RunContext, spec, partition: str, mark: Watermark) -> Settled:
    """Finish or discard the interrupted run recorded in `mark.pending` (nothing is written here)."""
    p = mark.pending
    assert p is not None, mark  # called for a watermark that records an interrupted run
    app = ctx.layout.app_id(spec, partition)
    if txn_version(ctx.layout.guard_uri(spec, dict(p.input_schema)), app) == p.seq:
        behind = spec.keeps_state and txn_version(ctx.layout.sink_uri(spec), app) != p.seq
        settled = mark.with_(
            seq=p.seq, source_versions=dict(p.target_versions), input_schema=dict(p.input_schema),
            source_ids=dict(p.source_ids),
            last_mode=p.mode, last_reason=p.reason, pending=None, failed_attempt=None,
            spec_hash=spec.spec_hash if spec.keeps_state else mark.spec_hash,
        )
        return Settled(settled, behind, p.seq, dict(p.input_schema))
    # a run that failed recorded why (`record_failure`); a killed one could not
    why = mark.failed_attempt or f"run {p.run_id} stopped before it committed"
    return Settled(mark.with_(pending=None, failed_attempt=why))


def begin_all(ctx: RunContext, spec, plans: dict[str, PartitionPlan], marks: dict[str, Watermark | None],
              input_schema: dict[str, str], claims: Claims, *, opened: dict | None = None,
              source_ids: dict[str, str] | None = None,
              open_table: Callable[[str], DeltaTable | None] | None = None) -> dict[str, int]:
    """Check each partition's run sequence against the guard table's transactions (read once, the table kept in
    `opened`, see `txn_versions`), then write every intent: one conditional write per block of partitions. When
    another run wrote one of the watermarks since this run read it, the intents written are undone and
    `ConcurrentRunError` raised: nothing of the run is committed."""
    guard = ctx.layout.guard_uri(spec, input_schema)
    committed = txn_versions(guard, [ctx.layout.app_id(spec, k) for k in plans], opened=opened, open_table=open_table)
    claimed_before = {k for k in plans if k in claims.held}  # claimed to settle: kept (and settled) on a conflict
    intents = {k: intent(spec, p, marks[k], input_schema, claims, committed[ctx.layout.app_id(spec, k)], guard,
                         source_ids) for k, p in plans.items()}
    written = claims.write_many([(k, body, True) for k, (_seq, body) in intents.items()])
    lost = [k for k, ok in zip(intents, written) if not ok]
    if lost:
        claims.undo_all({k: marks[k] for k in plans if k not in lost and k not in claimed_before})
        raise claims.taken(lost[0])
    return {k: seq for k, (seq, _body) in intents.items()}


def intent(spec, plan: PartitionPlan, mark: Watermark | None, input_schema: dict[str, str], claims: Claims,
           committed: int | None, guard: str, source_ids: dict[str, str] | None = None) -> tuple[int, Watermark]:
    """The run sequence of the partition and its watermark with the intent (`pending`), checked against the
    partition's transaction version in the guard table (`committed`): `ConcurrentRunError` when the table holds
    a run the watermark does not know, before anything is written."""
    seq = (mark.seq if mark else 0) + 1
    whole = plan.mode is Mode.REFILL and plan.refill_all
    if committed is not None and (mark is None or not mark.committed or (whole and committed >= seq)):
        # The watermark is gone (deleted by hand), or older than the table (restored from a backup, written by an
        # earlier version) and this run recomputes the whole partition from its sources: it continues the table's
        # sequence instead of clashing with it (a run committing that number first still makes this commit fail)
        seq = committed + 1
    if (mark is not None and mark.committed and mark.pending is None and not whole and spec.keeps_state
            and mark.spec_hash == spec.spec_hash and dict(mark.input_schema) == dict(input_schema)
            and (committed is None or committed < mark.seq)):
        # The state table this watermark's last run committed to holds an older run of the partition: a commit of
        # it was lost (its log file deleted, the table restored from an older backup). Merging into that state
        # would silently miss the lost run's rows: refused, as a watermark older than the table is (below); a
        # refill of the whole partition recomputes it from the sources, and this check lets it through.
        raise CheckpointError(
            f"the state table of '{spec.name}' at {guard} holds run {committed if committed is not None else 'none'} "
            f"of partition {plan.partition} but its watermark says run {mark.seq} committed: a commit of the table "
            "was lost (its log file deleted, or the table restored from an older backup), and merging into it would "
            f"miss that run's rows; nothing was written. `laminar refill {spec.name} --partition-range "
            f"{plan.partition}...{plan.partition}` recomputes the partition from its sources",
            flow=spec.name, partition=plan.partition, table=guard)
    if committed is not None and committed >= seq:
        raise ConcurrentRunError(
            f"the table already holds run {committed} of this partition but the watermark says {seq - 1}: another "
            "process wrote it since, or the watermark is older than the table (restored from a backup, or written by "
            f"an earlier Laminar version); if no other process runs '{spec.name}', `laminar refill {spec.name} "
            f"--partition-range {plan.partition}...{plan.partition}` recomputes the partition and its watermark",
            flow=spec.name, partition=plan.partition, table=guard,
        )
    pending = PendingRun(seq=seq, run_id=claims.run_id, target_versions=dict(plan.to_versions),
                         mode=plan.mode.value, reason=plan.reason.value, input_schema=dict(input_schema),
                         source_ids=_ids(plan, source_ids))
    base = mark or Watermark(spec.name, plan.partition, spec.spec_hash, {}, 0)
    return seq, base.with_(pending=pending)


def finish_all(ctx: RunContext, spec, plans: dict[str, PartitionPlan], input_schema: dict[str, str],
               seqs: dict[str, int], claims: Claims, *, source_ids: dict[str, str] | None = None,
               source_tags: Callable[[PartitionPlan], dict[str, str]] = lambda _p: {}) -> None:
    """Move each partition's watermark to its plan's target versions (both commits have landed), clearing this run
    as holder: the first block of partitions, then the others (one write per block, side by side); the step
    `after_first_watermark` lies in between. When another run took a partition over meanwhile (this one looked
    gone to it), that run settles this run's commits from the intent it found: nothing is overwritten here."""
    blocks: dict[str, list[str]] = {}
    for k in plans:
        blocks.setdefault(claims.store.block_path(spec.name, k), []).append(k)
    groups = list(blocks.values())
    for i, group in enumerate([groups[0], [k for g in groups[1:] for k in g]]):
        items = [(k, Watermark(
            flow=spec.name, partition=k, spec_hash=spec.spec_hash,
            source_versions=dict(plans[k].to_versions), seq=seqs[k], input_schema=dict(input_schema),
            last_mode=plans[k].mode.value, last_reason=plans[k].reason.value, source_ids=_ids(plans[k], source_ids),
            source_tags=dict(source_tags(plans[k])),
        ), False) for k in group]
        for k, done in zip(group, claims.write_many(items)):
            if not done:
                log.warning("%s %s: another run took the partition over before this run's watermark; it settles "
                            "this run's commits (run %s)", spec.name, k, seqs[k])
        if i == 0:
            ctx.hook("after_first_watermark")


def record_noops(ctx: RunContext, plans: list[PartitionPlan], marks: dict[str, Watermark | None], claims: Claims, *,
                 source_ids: dict[str, str] | None = None,
                 source_tags: Callable[[PartitionPlan], dict[str, str]] = lambda _p: {}) -> None:
    """Nothing to compute: record the newer versions each partition is already up to date with (conditional writes,
    one per block: when another run wrote a watermark since, that run's record stands). Also written when only the
    tags of the sources' commit files are new to it (`Watermark.source_tags`: once, for a watermark written
    without them); a partition whose record is unchanged is not written."""
    items = []
    for plan in plans:
        mark = marks[plan.partition]
        ids = (_ids(plan, source_ids) or mark.source_ids) if mark is not None else {}
        tags = dict(source_tags(plan))
        if mark is not None and mark.committed and (plan.to_versions != mark.source_versions
                                                    or ids != mark.source_ids or (tags and tags != mark.source_tags)
                                                    or mark.failed_runs is not None or plan.partition in claims.held):
            items.append((plan.partition, mark.with_(
                source_versions=dict(plan.to_versions), last_mode=plan.mode.value, last_reason=plan.reason.value,
                source_ids=ids, source_tags=tags, failed_runs=None), False))
    claims.write_many(items)


def _ids(plan: PartitionPlan, source_ids: dict[str, str] | None) -> dict[str, str]:
    """The table ids of the tables the plan's versions name."""
    return {t: source_ids[t] for t in plan.to_versions if source_ids and t in source_ids}


def record_failures(ctx: RunContext, spec, partitions: list[str], message: str, claims: Claims) -> None:
    """Mark each partition's last attempt as failed, so its next run refills, and clear this run as holder (one
    write per block). The intent record stays: if the state commit landed, the next run completes it instead. A
    partition this run does not hold (its claim lost to another run, or undone) has nothing of this run in it:
    left as it is."""
    items = [(k, claims.held[k].with_(failed_attempt=message), False) for k in partitions if k in claims.held]
    try:
        for (k, _m, _h), ok in zip(items, claims.write_many(items)):
            if not ok:
                log.warning("%s %s: the failed attempt was not recorded: another run wrote the watermark since",
                            spec.name, k)
    except (LaminarError, OSError) as exc:  # e.g. the store that failed the run does not answer either
        # the run's own error is what the caller reports; the next run settles the intent as a crash's
        log.warning("%s %s: the failed attempt was not recorded (%s)", spec.name, ", ".join(partitions), exc)


def record_failed_run(ctx: RunContext, spec, partitions: list[str], marks: dict[str, Watermark | None],
                      claims: Claims, exc: BaseException) -> None:
    """Count a failed run against each partition whose watermark it did not move (`FailedRuns`), for
    `laminar status` and `laminar check`, in the run's conditional writes (a partition another run wrote since
    is left to it). Planning never reads it. A record that cannot be written loses the count, not the run's own
    error, which the caller raises."""
    try:
        current = ctx.store.load_listed(spec.name, [k for k in partitions if k in marks]) if partitions else {}
        items = []
        for k in partitions:
            if k in marks and _moved(current.get(k), marks[k]):
                continue
            # what this run wrote last (its intent, its failure record), else the watermark as read
            base = claims.written.get(k) or marks.get(k) or Watermark(spec.name, k, spec.spec_hash, {}, 0)
            items.append((k, _counted(base, claims.run_id, exc), False))
        claims.write_many(items)
    except (LaminarError, OSError) as err:
        log.warning("%s %s: the failed run %s was not recorded (%s)", spec.name, ", ".join(partitions),
                    claims.run_id, err)


def record_refused_run(store: CheckpointStore, spec, partitions: list[str], run_id: str, exc: BaseException) -> None:
    """Count a run refused before it began (e.g. a source its contract refuses, or a source that is gone,
    found by the orchestrator's guard before the engine runs) against each partition, as `record_failed_run`
    counts one that failed: otherwise `laminar status` and `laminar check` would show such a flow healthy
    while every run of it fails. Each record is a conditional write on the watermark as read, so it never
    replaces the watermark of a run in progress; a partition a live run holds is left to that run."""
    for k in partitions:
        try:
            mark, tag = store.load_tagged(spec.name, k)
            if mark is not None and mark.holder is not None and not store.holder_gone(mark.holder, spec.name, k):
                continue
            base = (mark or Watermark(spec.name, k, spec.spec_hash, {}, 0)).with_(holder=None)
            store.write_if(_counted(base, run_id, exc), tag)
        except (LaminarError, OSError) as err:
            log.warning("%s %s: the refused run %s was not recorded (%s)", spec.name, k, run_id, err)


def _counted(base: Watermark, run_id: str, exc: BaseException) -> Watermark:
    """`base` with one more failed run in its `FailedRuns`."""
    now = datetime.now(UTC).isoformat()
    before = base.failed_runs
    return base.with_(failed_runs=FailedRuns(
        count=(before.count if before else 0) + 1, since=before.since if before else now, last_at=now,
        last_error=short(exc), run_id=run_id))


def finished_since(ctx: RunContext, spec, partition: str, mark: Watermark | None) -> bool:
    """True when the partition's watermark moved past `mark` (its run finished before a failure)."""
    return _moved(ctx.store.load(spec.name, partition), mark)


def _moved(current: Watermark | None, mark: Watermark | None) -> bool:
    return current is not None and current.pending is None and current.seq > (mark.seq if mark else 0)


def short(exc: BaseException) -> str:
    """The first line of an error, for a failure record or a one-line message: for a store that did
    not answer, whichever client said so, the line naming the endpoint and the object."""
    if isinstance(exc, LaminarError):
        return exc.message
    found = store_unavailable(exc)
    return found.message if found is not None else first_line(exc)


def store_unavailable(exc: BaseException) -> StoreUnavailableError | None:
    """The `StoreUnavailableError` behind `exc` (one a Store raised, or one recognized in what
    deltalake, pyarrow or Spark's s3a said), or None when `exc` is no store's failure to answer."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, StoreUnavailableError):
            return e
        e = e.__cause__ or e.__context__
    found = failures.recognize(texts(exc))
    if found is None:
        return None
    try:
        options = getattr(storage.store_for(found.uri), "options", None) if found.uri else None
    except LaminarError:
        options = None
    return failures.unavailable(found, bounds=options.resolved().budget(found.client) if options is not None else None)
