"""What one run did for one (flow, partition): its plan, and what it measured."""

from __future__ import annotations

from dataclasses import dataclass, field

from .metrics import RunMetrics
from .plan import Mode, PartitionPlan, Reason


@dataclass(frozen=True)
class SweepResult:
    """What one sweep did: new quarantine rows by rule, and per source what it read and why."""

    counts: dict[str, int] = field(default_factory=dict)
    # per source: "commits 3..7" or "snapshot at version 9", with the reason a snapshot was read
    sources: dict[str, str] = field(default_factory=dict)
    reason: Reason | None = None  # a snapshot sweep: NO_WATERMARK, CHECKPOINT_EXPIRED or SCHEMA_CHANGED_HISTORY

    @property
    def detail(self) -> str:
        return "; ".join(f"{src}: {how}" for src, how in self.sources.items())

    def to_json(self) -> dict:
        return {"counts": dict(self.counts), "sources": dict(self.sources),
                "reason": self.reason.value if self.reason else None}


@dataclass(frozen=True)
class RunResult:
    """The plan a partition ran, the run's id, and its numbers (`RunMetrics`; docs/dagster.md lists them)."""

    plan: PartitionPlan
    run_id: str
    metrics: RunMetrics = field(default_factory=RunMetrics, hash=False)
    seconds: dict[str, float] = field(default_factory=dict, hash=False)
    quarantined: dict[str, int] = field(default_factory=dict, hash=False)  # new quarantine rows by rule
    sweep: SweepResult | None = field(default=None, hash=False)  # the flow's sweep, on the run's first partition

    def __post_init__(self) -> None:
        if not isinstance(self.metrics, RunMetrics):  # given by name: checked against the fields
            object.__setattr__(self, "metrics", RunMetrics.of(self.metrics))

    @property
    def mode(self) -> Mode:
        return self.plan.mode

    @property
    def reason(self) -> Reason:
        return self.plan.reason

    @property
    def detail(self) -> str:
        return self.plan.detail

    def to_json(self) -> dict:
        return {"run_id": self.run_id, **self.plan.to_json(), "metrics": self.metrics.as_dict(), "seconds": self.seconds,
                "quarantined": self.quarantined, **({"sweep": self.sweep.to_json()} if self.sweep else {})}
