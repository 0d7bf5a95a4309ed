"""What one run did for one (flow, partition): its plan, and what it measured."""

from __future__ import annotations

from dataclasses import dataclass, field

from .plan import Mode, PartitionPlan, Reason


@dataclass(frozen=True)
class RunResult:
    """The plan a partition ran, the run's id, and its numbers (see the README's metadata list)."""

    plan: PartitionPlan
    run_id: str
    metrics: dict[str, float | int] = field(default_factory=dict, hash=False)
    seconds: dict[str, float] = field(default_factory=dict, hash=False)
    quarantined: dict[str, int] = field(default_factory=dict, hash=False)  # new quarantine rows by rule

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
        return {"run_id": self.run_id, **self.plan.to_json(), "metrics": self.metrics, "seconds": self.seconds,
                "quarantined": self.quarantined}
