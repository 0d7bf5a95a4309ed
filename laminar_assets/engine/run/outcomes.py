"""What each run did, kept for the hit and fallback rates (`report.flow_stats`).

One object per run of a flow or stage (`EngineRunner.run_many`), NOOPs included, beside the
watermarks:

    _laminar/outcomes/<flow>/<YYYY-MM-DD>/<HHMMSS.ffffff>-<run_id>.json

One write per run (a file on a local disk, one PUT in a bucket), never read by a run: a lost
record loses a sample of the statistics, never a row. Day folders let a summary over a period
list only that period's records.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from laminar_assets import storage

from ..delta.log import CommitKind, CommitSummary
from ..delta.tables import SourceHistory
from ..spec.specs import Spec
from ..windows import Interval
from .plan import Mode, PartitionPlan
from .result import RunResult


@dataclass(frozen=True)
class PartitionOutcome:
    """One partition's part of a run: its mode and reason, how much it refilled, what it read and
    how many source rows had changed for it."""

    partition: str
    mode: str
    reason: str
    refilled_share: float  # of the partition's event time (flows: of its windows) recomputed; 0 unless REFILL
    refilled_windows: int | None  # flows: windows recomputed; None for stages
    rows_read: int
    change_rows: int | None  # rows of the new commits' files that overlap the partition; None: unknown
    seconds: float


def outcomes_path(root: str, flow: str, at: datetime, run_id: str) -> str:
    return storage.join(root, "_laminar", "outcomes", flow, f"{at:%Y-%m-%d}", f"{at:%H%M%S.%f}-{run_id}.json")


def change_rows(plan: PartitionPlan, histories: dict[str, SourceHistory]) -> int | None:
    """Rows in the files the partition's new source commits added or removed (change data files for
    a change-data commit) whose event times overlap what the partition reads; None when a file's row
    count is not in the log. File granularity: a file that spans partitions counts whole in each."""
    total = 0
    for table, history in histories.items():
        upto = plan.to_versions.get(table)
        for commit in history.commits:
            if upto is not None and commit.version > upto:
                continue
            for f in _changed_files(commit):
                if f.time_range is not None and not f.time_range.overlaps(plan.needed):
                    continue
                if f.rows is None:
                    return None
                total += f.rows
    return total


def _changed_files(commit: CommitSummary):
    if commit.kind in (CommitKind.LAYOUT, CommitKind.METADATA, CommitKind.EMPTY):
        return ()
    if commit.kind is CommitKind.CHANGE_DATA:
        return commit.cdc
    return commit.adds + commit.removes


def refilled(spec: Spec, plan: PartitionPlan) -> tuple[float, int | None]:
    """(share of the partition recomputed, windows recomputed for a flow)."""
    part = plan.interval
    if plan.mode is not Mode.REFILL or (not plan.refill and not plan.refill_all):
        return spec.refilled_share(part, [])  # groups or keys alone (or none): no whole window or partition;
    #                                           `refilled_groups` / `refilled_keys` say how many
    return spec.refilled_share(part, [part] if plan.refill_all or not plan.refill else list(plan.refill))


def outcome_of(spec: Spec, result: RunResult, histories: dict[str, SourceHistory]) -> PartitionOutcome:
    share, windows = refilled(spec, result.plan)
    return PartitionOutcome(
        partition=result.plan.partition, mode=result.mode.value, reason=result.reason.value,
        refilled_share=round(share, 6), refilled_windows=windows, rows_read=int(result.metrics.get("rows_read", 0)),
        change_rows=_change_rows(result, histories),
        seconds=round(sum(result.seconds.values()), 4))


def _change_rows(result: RunResult, histories: dict[str, SourceHistory]) -> int | None:
    if result.mode is Mode.NOOP:
        return 0
    if all(v is None for v in result.plan.from_versions.values()):  # a first run: every row it read is new
        return int(result.metrics.get("rows_read", 0))
    return change_rows(result.plan, histories)


def record(root: str, spec: Spec, run_id: str, outcomes: list[PartitionOutcome], *, at: datetime | None = None) -> str:
    """Write one run's outcomes; returns where."""
    at = at or datetime.now(UTC)
    path = outcomes_path(root, spec.name, at, run_id)
    storage.write(path, json.dumps({"flow": spec.name, "kind": spec.kind, "run_id": run_id, "at": at.isoformat(),
                                    "partitions": [asdict(o) for o in outcomes]}, sort_keys=True).encode())
    return path


def read_outcomes(root: str, flow: str, since: datetime | None = None, until: datetime | None = None) -> list[dict]:
    """Every recorded run of `flow` in [since, until), oldest first (each: flow, kind, run_id, at, partitions)."""
    base = storage.join(root, "_laminar", "outcomes", flow)
    period = Interval(since or datetime(1970, 1, 1, tzinfo=UTC), until or datetime(9999, 1, 1, tzinfo=UTC))
    out = []
    for day in storage.list_dirs(base):
        try:
            start = datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC)
        except ValueError:
            continue  # not a day folder
        if not Interval(start, start + timedelta(days=1)).overlaps(period):
            continue
        for uri, _size in sorted(storage.list_files(storage.join(base, day))):
            raw = storage.read(uri) if uri.endswith(".json") else None
            if raw is None:
                continue
            data = json.loads(raw)
            if period.contains(datetime.fromisoformat(data["at"])):
                out.append(data)
    return sorted(out, key=lambda d: d["at"])
