"""Hit and fallback rates: how often each flow's partition runs merged, refilled or had nothing to do.

Summed from the outcome records every run writes (`run.outcomes`). Per flow over a period:

    partition_runs         partitions run (a range run of 3 partitions counts 3)
    incremental/refill/noop_share   their shares of `partition_runs`
    hit_rate               incremental / (incremental + refill): how often work merged instead of refilling
    refills_by_reason      refills per typed reason
    windows_per_refill     flows: windows recomputed per refilled partition (mean)
    refilled_share         mean share of a refilled partition that was recomputed
    rows_read_per_change   rows read / rows of the new commits' files, over partitions that did work
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from ..run.outcomes import read_outcomes


@dataclass(frozen=True)
class FlowStats:
    flow: str
    runs: int = 0
    partition_runs: int = 0
    incremental: int = 0
    refill: int = 0
    noop: int = 0
    refills_by_reason: dict[str, int] = field(default_factory=dict)
    windows_refilled: int = 0
    windowed_refills: int = 0  # refills that count windows (a flow's; a stage has none)
    refilled_share_sum: float = 0.0
    rows_read: int = 0
    change_rows: int = 0
    change_rows_unknown: int = 0  # partition runs whose change size the log does not give

    def share(self, n: int) -> float | None:
        return round(n / self.partition_runs, 4) if self.partition_runs else None

    @property
    def hit_rate(self) -> float | None:
        worked = self.incremental + self.refill
        return round(self.incremental / worked, 4) if worked else None

    @property
    def windows_per_refill(self) -> float | None:
        return round(self.windows_refilled / self.windowed_refills, 2) if self.windowed_refills else None

    @property
    def refilled_share(self) -> float | None:
        return round(self.refilled_share_sum / self.refill, 4) if self.refill else None

    @property
    def rows_read_per_change(self) -> float | None:
        return round(self.rows_read / self.change_rows, 2) if self.change_rows else None

    def to_json(self) -> dict:
        return {"flow": self.flow, "runs": self.runs, "partition_runs": self.partition_runs,
                "incremental": self.incremental, "refill": self.refill, "noop": self.noop,
                "incremental_share": self.share(self.incremental), "refill_share": self.share(self.refill),
                "noop_share": self.share(self.noop), "hit_rate": self.hit_rate,
                "refills_by_reason": dict(self.refills_by_reason), "windows_per_refill": self.windows_per_refill,
                "refilled_share": self.refilled_share, "rows_read": self.rows_read, "change_rows": self.change_rows,
                "rows_read_per_change": self.rows_read_per_change}


def summarize(flow: str, records: list[dict]) -> FlowStats:
    """The stats of `records` (outcome records of one flow)."""
    counts: Counter = Counter()
    reasons: Counter = Counter()
    windows = windowed = read = changed = unknown = 0
    share = 0.0
    for rec in records:
        for p in rec["partitions"]:
            counts[p["mode"]] += 1
            if p["mode"] == "REFILL":
                reasons[p["reason"]] += 1
                if p.get("refilled_windows") is not None:
                    windows += p["refilled_windows"]
                    windowed += 1
                share += p.get("refilled_share") or 0.0
            if p["mode"] != "NOOP":
                if p.get("change_rows") is None:
                    unknown += 1
                else:
                    read += p.get("rows_read") or 0
                    changed += p["change_rows"]
    return FlowStats(flow=flow, runs=len(records), partition_runs=sum(counts.values()),
                     incremental=counts["INCREMENTAL"], refill=counts["REFILL"], noop=counts["NOOP"],
                     refills_by_reason=dict(sorted(reasons.items())), windows_refilled=windows, windowed_refills=windowed,
                     refilled_share_sum=share, rows_read=read, change_rows=changed, change_rows_unknown=unknown)


def stats_by_flow(root: str, specs, *, since: datetime | None = None, until: datetime | None = None) -> list[FlowStats]:
    """One `FlowStats` per spec over [since, until) (None: unbounded)."""
    return [summarize(s.name, read_outcomes(root, s.name, since, until)) for s in specs]


def outcome_rows(root: str, specs, *, since: datetime | None = None, until: datetime | None = None) -> list[dict]:
    """Every recorded partition run, flattened: flow, run_id, at, and the partition's outcome."""
    rows = []
    for s in specs:
        for rec in read_outcomes(root, s.name, since, until):
            at = datetime.fromisoformat(rec["at"])
            rows += [{"flow": rec["flow"], "run_id": rec["run_id"], "at": at, **p} for p in rec["partitions"]]
    return rows
