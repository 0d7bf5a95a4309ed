"""Failed runs the pipeline sensor runs again: a transient fault never needs a human to unstick a flow.

A step retries a retryable failure (`retries`, `retry_delay_seconds`: 10 s, then 30 s, by default); a fault that
lasts longer (a Postgres, a store or a Spark server down for minutes) fails the run. The sensor has already moved its
cursor past the commits that run was for, so its partitions would wait for a new commit that touches them. This
module finds such runs of one connected part and says when their partitions run again: after
`resume_seconds`, doubling with every failed attempt up to `resume_max_seconds`, for as long as the failure is
one a retry may fix. A run the user canceled, or one that failed with an error a retry does not fix (a bad spec,
a failed contract, a bug), is not run again: the skip message says what its partitions wait for.

The cursor keeps which failures were already handled (`Failures`): each failed run is resumed once, by the run
that carries the `resume_of` tag, whose own failure starts the next attempt.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from datetime import UTC, datetime

import dagster as dg
from dagster import RunRecord

RESUME_OF_TAG = "laminar/resume_of"  # the run whose partitions this run runs again (the first of the chain)
RESUME_ATTEMPT_TAG = "laminar/resume_attempt"  # 1 for the first run again, 2 after that one failed too
PARTITION_TAG = "dagster/partition"
RANGE_START = "dagster/asset_partition_range_start"
RANGE_END = "dagster/asset_partition_range_end"
LOOKED_AT = 50  # failed runs of a part one tick looks at (the newest first)


@dataclasses.dataclass(frozen=True)
class Failures:
    """The part of a sensor's cursor about failed runs: runs that ended before `after` (epoch seconds) are handled,
    and so are those in `handled` (run id -> when it ended), which ended later: resumed, or found not retryable,
    while an earlier one still waits its pause."""

    after: float
    handled: Mapping[str, float] = dataclasses.field(default_factory=dict)

    @classmethod
    def parse(cls, data: Mapping | None, *, now: float) -> Failures:
        """From the cursor's `failures` entry; a cursor without one (a new sensor, or one from before this
        feature) starts now, so a deployment does not run again every failure its instance ever had."""
        if not data:
            return cls(after=now)
        return cls(after=float(data["after"]), handled={k: float(v) for k, v in (data.get("handled") or {}).items()})

    def to_json(self) -> dict:
        return {"after": self.after, **({"handled": dict(sorted(self.handled.items()))} if self.handled else {})}


@dataclasses.dataclass(frozen=True)
class FailedRun:
    """A failed run of the part and what becomes of its partitions."""

    run_id: str
    ended: float  # epoch seconds
    retryable: bool  # every step failure said a retry may fix it, or the run failed outside any step
    why: str  # the first step failure's message, or the run's; one line
    attempt: int  # the attempt that runs it again: 1 for a sensor's run, n + 1 for resume n
    first_run_id: str  # the chain's first run
    due: float  # epoch seconds when its partitions may run again (inf when never)
    assets: tuple[str, ...]
    partition_tags: Mapping[str, str]  # dagster/partition, or the range's start and end

    def resume_tags(self) -> dict[str, str]:
        return {RESUME_OF_TAG: self.first_run_id, RESUME_ATTEMPT_TAG: str(self.attempt)}


def pause_seconds(attempt: int, *, first: float, longest: float) -> float:
    """The pause before attempt `attempt` (1, 2, ...): `first`, doubling, at most `longest`."""
    return min(longest, first * 2 ** (attempt - 1))


def failed_runs(instance: dg.DagsterInstance, part: str, seen: Failures, *, first: float,
                longest: float) -> list[FailedRun]:
    """The part's failed runs the cursor has not handled, oldest first (one query, plus one of each run's step
    failures). A run the user canceled is not a failure here."""
    records = instance.get_run_records(
        dg.RunsFilter(tags={"laminar/component": part}, statuses=[dg.DagsterRunStatus.FAILURE],
                      updated_after=datetime.fromtimestamp(seen.after, tz=UTC)),
        limit=LOOKED_AT)
    # a run updated after it ended (a tag added, as Dagster's run retries add one) is found again by the query,
    # but its end is what the cursor counts: one that ended before `after` was handled
    return [failed_run(instance, record, first=first, longest=longest)
            for record in sorted(records, key=_ended_at)
            if record.dagster_run.run_id not in seen.handled and _ended_at(record) > seen.after]


def _ended_at(record: RunRecord) -> float:
    return record.end_time or record.update_timestamp.timestamp()


def failed_run(instance: dg.DagsterInstance, record: RunRecord, *, first: float, longest: float) -> FailedRun:
    """What becomes of one failed run's partitions (`first` = 0: never run again)."""
    run = record.dagster_run
    ended = _ended_at(record)
    retryable, why = _retryable(instance, run.run_id)
    attempt = int(run.tags.get(RESUME_ATTEMPT_TAG, "0")) + 1
    due = ended + pause_seconds(attempt, first=first, longest=longest) if retryable and first > 0 else float("inf")
    return FailedRun(run_id=run.run_id, ended=ended, retryable=retryable, why=why, attempt=attempt,
                     first_run_id=run.tags.get(RESUME_OF_TAG, run.run_id), due=due,
                     assets=_assets(instance, run),
                     partition_tags={k: v for k, v in run.tags.items() if k in (PARTITION_TAG, RANGE_START, RANGE_END)})


def _assets(instance: dg.DagsterInstance, run: dg.DagsterRun) -> tuple[str, ...]:
    """The assets a run was to materialize: its asset selection (a sensor's run), else those it planned (a run of
    a job, as the demo and the CLI execute a request in their own process)."""
    keys = set(run.asset_selection or ())
    if not keys:
        planned = instance.all_logs(run.run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION_PLANNED)
        keys = {e.dagster_event.asset_key for e in planned if e.dagster_event and e.dagster_event.asset_key}
    return tuple(sorted(k.to_user_string() for k in keys))


def _retryable(instance: dg.DagsterInstance, run_id: str) -> tuple[bool, str]:
    """Whether running the failed run again may succeed, and why it failed. Laminar's step failures say so
    (`retryable` in their metadata: orchestration/assets.py `_failure`); any other step failure (a failed
    blocking check, an error outside Laminar's) is not retried. A run that failed outside every step (its run
    worker killed, its process found dead, its code server gone) is."""
    failures = instance.all_logs(run_id, of_type=dg.DagsterEventType.STEP_FAILURE)
    if not failures:
        ends = instance.all_logs(run_id, of_type=dg.DagsterEventType.RUN_FAILURE)
        return True, _one_line(ends[-1].message if ends else "the run failed outside its steps")
    retryable = True
    for entry in failures:
        data = entry.dagster_event.step_failure_data if entry.dagster_event else None
        user = data.user_failure_data if data else None
        flag = user.metadata.get("retryable") if user else None
        retryable = retryable and flag is not None and flag.value is True
    first = failures[0].dagster_event
    data = first.step_failure_data if first else None
    why = (data.user_failure_data.description if data and data.user_failure_data else None) or \
        (data.error.message if data and data.error else failures[0].message)
    return retryable, _one_line(why or "a step failed")


def _one_line(text: str, limit: int = 300) -> str:
    """The first line of `text`; a long one without its trailing `[facts]` (the error's table, export, host), or cut."""
    line = text.strip().splitlines()[0] if text.strip() else text
    if len(line) > limit and " [" in line:
        line = line[:line.rindex(" [")]
    return line if len(line) <= limit else line[:limit - 3] + "..."


def advance(seen: Failures, runs: list[FailedRun], now: float) -> tuple[list[FailedRun], Failures]:
    """The failed runs whose partitions run now, and the cursor after this tick: a run is handled once it is
    resumed or found not retryable; one still in its pause is looked at again by the next tick."""
    due = [r for r in runs if r.retryable and r.due <= now]
    waiting = [r for r in runs if r.retryable and now < r.due < float("inf")]
    handled = {**seen.handled, **{r.run_id: r.ended for r in runs if r not in waiting}}
    after = seen.after if waiting or not handled else max(seen.after, *handled.values())
    return due, Failures(after=after, handled={k: v for k, v in handled.items() if v > after})


def waiting_message(part: str, waiting: list[FailedRun], now: float) -> str:
    """What a skip says about the part's failed runs whose partitions run again once their pause ends."""
    soonest = sorted(waiting, key=lambda r: r.due)
    told = "; ".join(f"{r.run_id} ({r.why}) in {max(0.0, r.due - now):.0f} s, attempt {r.attempt}" for r in soonest[:2])
    more = f"; and {len(soonest) - 2} more" if len(soonest) > 2 else ""
    return f"; failed runs of {part} whose partitions run again (the pause doubles): {told}{more}"


def after_failure_message(part: str, run_id: str, status: str, failed: FailedRun | None, *, resume_off: bool) -> str:
    """What a skip says when the part's last run did not succeed and nothing of it waits to run again (`failed`:
    that run, when it failed)."""
    if failed is not None and not failed.retryable:
        cause = f"failed with an error a retry does not fix ({failed.why})"
    elif failed is not None and resume_off:
        cause = f"failed ({failed.why}), and resume_seconds is 0 (failed runs do not run again)"
    else:
        cause = f"ended {status}"
    return (f"; the last run of {part}, {run_id}, {cause}: its partitions wait for a new commit that touches them, a "
            "`laminar refill`, a re-execution in the UI, or the stale_partitions sensor")


def now() -> float:
    """The time the sensor and the alerts measure pauses against (epoch seconds); tests move it forward."""
    return time.time()
