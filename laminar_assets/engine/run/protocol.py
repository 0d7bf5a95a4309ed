"""The watermark protocol: leases, intent, settling an interrupted run, finishing, failures.

Per (flow, partition), in this order (docs/ARCHITECTURE.md):
  1. take the partition lease; settle an interrupted run from its intent record;
  2. write the intent (`pending`: run seq + target versions) into the watermark file;
  3. commit the state rows   (Delta app transaction `laminar/<flow>/<partition>` = seq);
  4. commit the sink rows    (same app transaction);
  5. replace the watermark with the target versions and seq.
A run of several partitions shares the commits of 3 and 4 (one app transaction per
partition in each); leases, intents and watermarks stay per partition, so recovery is
per partition. A crash after 3 is finished on restart; a crash before 3 leaves
nothing behind and the next run refills (PREVIOUS_ATTEMPT_FAILED). On an object store the
partitions' requests of one step (1, 2, 5, and giving the leases back) go side by side
(`side_by_side`): any subset of them may be done when a run dies, which recovery, being per
partition, already handles.
"""

from __future__ import annotations

import contextvars
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TypeVar

from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from laminar_assets import storage
from laminar_assets.checkpoints import CheckpointStore, FailedRuns, PendingRun, Watermark
from laminar_assets.errors import ConcurrentRunError, LaminarError, StoreUnavailableError
from laminar_assets.storage import failures

from ..delta.tables import open_delta
from ..delta.transactions import txn_versions_of
from ..spark.failures import first_line, texts
from .context import RunContext
from .plan import PartitionPlan

log = logging.getLogger(__name__)
T = TypeVar("T")


SIDE_BY_SIDE = 8
"""At most this many of a run's per-partition requests (leases, intents, watermarks) in flight at once."""


def side_by_side(ctx: RunContext, calls: list[Callable[[], T]]) -> list[T]:
    """Each of `calls`, results in order. On an object store, where each call waits on its requests' latency
    (20 ms or so apiece on S3), they run side by side in threads (each in a copy of this context); on a local
    disk one after another. Every call runs to its end either way; then the first failure (in order) is raised,
    so a caller sees any subset of its per-partition writes done, as recovery expects (it is per partition)."""
    if len(calls) < 2 or not storage.is_object_store(ctx.store.root):
        return [call() for call in calls]
    with ThreadPoolExecutor(min(SIDE_BY_SIDE, len(calls)), thread_name_prefix="laminar-requests") as pool:
        futures = [pool.submit(contextvars.copy_context().run, call) for call in calls]
    failed = next((f.exception() for f in futures if f.exception() is not None), None)
    if failed is not None:
        raise failed
    return [f.result() for f in futures]


@contextmanager
def leases(ctx: RunContext, spec, keys: list[str], run_id: str) -> Iterator[None]:
    """Hold the lease of every partition in `keys` for the duration of a run (taken and given back side by
    side on an object store, see `side_by_side`; when one cannot be taken, those taken are given back)."""
    if len(keys) < 2 or not storage.is_object_store(ctx.store.root):
        with ExitStack() as stack:
            for key in keys:
                stack.enter_context(ctx.store.lease(spec.name, key, run_id))
            yield
        return
    held = [ctx.store.lease(spec.name, key, run_id) for key in keys]
    taken: list = []

    def take(lease):
        lease.__enter__()
        taken.append(lease)

    try:
        side_by_side(ctx, [lambda lease=lease: take(lease) for lease in held])
    except BaseException as exc:  # a lease another run holds (or a store that failed): give back those taken
        for lease in reversed(taken):
            lease.__exit__(type(exc), exc, exc.__traceback__)
        raise
    with ExitStack() as stack:
        for lease in taken:
            stack.push(lease)  # the run's error unwinds them one by one, each as it does alone
        yield
        stack.pop_all()
    side_by_side(ctx, [lambda lease=lease: lease.__exit__(None, None, None) for lease in taken])


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


_UNREAD = object()


def begin_all(ctx: RunContext, spec, plans: dict[str, PartitionPlan], marks: dict[str, Watermark | None],
              input_schema: dict[str, str], run_id: str, *, opened: dict | None = None,
              source_ids: dict[str, str] | None = None,
              open_table: Callable[[str], DeltaTable | None] | None = None) -> dict[str, int]:
    """`begin` for every partition of a pass, reading the guard table's transactions once (and
    keeping the table in `opened`, see `txn_versions`)."""
    guard = ctx.layout.guard_uri(spec, input_schema)
    committed = txn_versions(guard, [ctx.layout.app_id(spec, k) for k in plans], opened=opened, open_table=open_table)
    seqs = side_by_side(ctx, [lambda k=k, p=p: begin(ctx, spec, p, marks[k], input_schema, run_id,
                                                    committed=committed[ctx.layout.app_id(spec, k)],
                                                    source_ids=source_ids)
                              for k, p in plans.items()])
    return dict(zip(plans, seqs))


def begin(ctx: RunContext, spec, plan: PartitionPlan, mark: Watermark | None, input_schema: dict[str, str],
          run_id: str, *, committed: int | None | object = _UNREAD, source_ids: dict[str, str] | None = None) -> int:
    """Check the run sequence against the table's transaction and write the intent; returns the seq.
    `committed`: the partition's transaction version, when the caller has read it already."""
    guard = ctx.layout.guard_uri(spec, input_schema)
    if committed is _UNREAD:
        committed = txn_version(guard, ctx.layout.app_id(spec, plan.partition))
    seq = (mark.seq if mark else 0) + 1
    if (mark is None or not mark.committed) and committed is not None:
        # The watermark is gone (deleted by hand) but the table has run `committed`: this run
        # refills anyway, so it continues the table's sequence instead of clashing with it.
        seq = committed + 1
    if committed is not None and committed >= seq:
        raise ConcurrentRunError(
            f"the table already holds run {committed} of this partition but the watermark says {seq - 1}: "
            "another process wrote it concurrently", flow=spec.name, partition=plan.partition, table=guard,
        )
    pending = PendingRun(seq=seq, run_id=run_id, target_versions=dict(plan.to_versions),
                         mode=plan.mode.value, reason=plan.reason.value, input_schema=dict(input_schema),
                         source_ids=_ids(plan, source_ids))
    base = mark or Watermark(spec.name, plan.partition, spec.spec_hash, {}, 0)
    ctx.store.save(base.with_(pending=pending))
    return seq


def finish(ctx: RunContext, spec, plan: PartitionPlan, input_schema: dict[str, str], seq: int, *,
           source_ids: dict[str, str] | None = None) -> None:
    """Move the watermark to the plan's target versions (both commits have landed)."""
    ctx.store.save(Watermark(
        flow=spec.name, partition=plan.partition, spec_hash=spec.spec_hash,
        source_versions=dict(plan.to_versions), seq=seq, input_schema=dict(input_schema),
        last_mode=plan.mode.value, last_reason=plan.reason.value, source_ids=_ids(plan, source_ids),
    ))


def record_noop(ctx: RunContext, plan: PartitionPlan, mark: Watermark | None, *,
                source_ids: dict[str, str] | None = None) -> None:
    """Nothing to compute: record the newer versions the partition is already up to date with."""
    ids = (_ids(plan, source_ids) or mark.source_ids) if mark is not None else {}
    if mark is not None and mark.committed and (plan.to_versions != mark.source_versions or ids != mark.source_ids
                                                or mark.failed_runs is not None):
        ctx.store.save(mark.with_(source_versions=dict(plan.to_versions), last_mode=plan.mode.value,
                                  last_reason=plan.reason.value, source_ids=ids, failed_runs=None))


def _ids(plan: PartitionPlan, source_ids: dict[str, str] | None) -> dict[str, str]:
    """The table ids of the tables the plan's versions name."""
    return {t: source_ids[t] for t in plan.to_versions if source_ids and t in source_ids}


def record_failure(ctx: RunContext, spec, partition: str, mark: Watermark | None, message: str) -> None:
    """Mark the partition's last attempt as failed, so its next run refills. The intent record stays:
    if the state commit landed, the next run completes it instead."""
    try:
        current = ctx.store.load(spec.name, partition) or mark
        base = current or Watermark(spec.name, partition, spec.spec_hash, {}, 0)
        ctx.store.save(base.with_(failed_attempt=message))
    except (LaminarError, OSError) as exc:  # e.g. the store that failed the run does not answer either
        # the run's own error is what the caller reports; the next run settles the intent as a crash's
        log.warning("%s %s: the failed attempt was not recorded (%s)", spec.name, partition, exc)


def record_failed_run(ctx: RunContext, spec, partitions: list[str], marks: dict[str, Watermark | None],
                      run_id: str, exc: BaseException) -> None:
    """Count a failed run against each partition whose watermark it did not move (`FailedRuns`), for
    `laminar status` and `laminar check`; the run's leases are held. Planning never reads it. A record
    that cannot be written loses the count, not the run's own error, which the caller raises."""
    for k in partitions:
        try:
            if k in marks and finished_since(ctx, spec, k, marks[k]):
                continue
            _count_failure(ctx.store, spec, k, run_id, exc)
        except (LaminarError, OSError) as err:
            log.warning("%s %s: the failed run %s was not recorded (%s)", spec.name, k, run_id, err)


def record_refused_run(store: CheckpointStore, spec, partitions: list[str], run_id: str, exc: BaseException) -> None:
    """Count a run refused before it began (e.g. a source its contract refuses, or a source that is gone,
    found by the orchestrator's guard before the engine runs) against each partition, as `record_failed_run`
    counts one that failed: otherwise `laminar status` and `laminar check` would show such a flow healthy
    while every run of it fails. Each record is written under the partition's lease, so it never replaces
    the watermark of a run in progress; a partition whose lease another run holds is left to that run."""
    for k in partitions:
        try:
            with store.lease(spec.name, k, run_id):
                _count_failure(store, spec, k, run_id, exc)
        except ConcurrentRunError:
            continue
        except (LaminarError, OSError) as err:
            log.warning("%s %s: the refused run %s was not recorded (%s)", spec.name, k, run_id, err)


def _count_failure(store: CheckpointStore, spec, partition: str, run_id: str, exc: BaseException) -> None:
    """Add one failed run to the partition's `FailedRuns` (a watermark with nothing committed when it has none)."""
    now = datetime.now(UTC).isoformat()
    base = store.load(spec.name, partition) or Watermark(spec.name, partition, spec.spec_hash, {}, 0)
    before = base.failed_runs
    store.save(base.with_(failed_runs=FailedRuns(
        count=(before.count if before else 0) + 1, since=before.since if before else now, last_at=now,
        last_error=short(exc), run_id=run_id)))


def finished_since(ctx: RunContext, spec, partition: str, mark: Watermark | None) -> bool:
    """True when the partition's watermark moved past `mark` (its run finished before a failure)."""
    current = ctx.store.load(spec.name, partition)
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
