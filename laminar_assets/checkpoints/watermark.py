"""The watermark of one (flow, partition): the source versions reflected in state and sink."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class PendingRun:
    """Intent written before a run commits anything: which run, up to which versions.

    On the next start, the Delta app transaction of the state and sink tables
    tells whether this run's commits landed; the record is then completed or
    discarded (see `docs/ARCHITECTURE.md`, watermark protocol).
    """

    seq: int
    run_id: str
    target_versions: dict[str, int]
    mode: str
    reason: str
    input_schema: dict[str, str] = field(default_factory=dict)
    source_ids: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class FailedRuns:
    """The runs of one (flow, partition) that failed in a row since its last successful run: how
    many, when the first and the last failed (UTC, ISO 8601), the last one's id and error. Only
    reports read it (`laminar status`, `laminar check`); a successful run clears it."""

    count: int
    since: str
    last_at: str
    last_error: str
    run_id: str = ""


@dataclass(frozen=True)
class Holder:
    """The run that holds a partition, named in the partition's watermark from the run's first write of it (its
    intent, or its claim before it settles an interrupted run) to its last (the watermark it reached, a NOOP's
    record, its failure). A holder that is gone (`CheckpointStore.holder_gone`: its process ended, or it is older
    than `lease_seconds`) holds nothing."""

    run_id: str
    host: str
    started: float
    pid: int | None = None
    process_started: str | None = None


@dataclass(frozen=True)
class Watermark:
    """Durable progress of one (flow, partition).

    `seq` is the number of the last run whose state and sink commits both
    landed; the same number is the Delta app-transaction version in the state
    and sink tables, which is how a crash between commits is detected.
    """

    flow: str
    partition: str
    spec_hash: str
    source_versions: dict[str, int]
    seq: int
    input_schema: dict[str, str] = field(default_factory=dict)
    last_mode: str | None = None
    last_reason: str | None = None
    failed_attempt: str | None = None  # set when a run failed; the next run refills
    pending: PendingRun | None = None
    updated_at: str | None = None
    # each source's Delta table id at those versions: a version means nothing in a recreated table
    source_ids: dict[str, str] = field(default_factory=dict)
    failed_runs: FailedRuns | None = None  # runs failed in a row since the last success
    holder: Holder | None = None  # the run writing this partition now (None: no run holds it)
    # each source's commit file at those versions, its tag (ETag) as the run listed it: a process that did not
    # run the flow knows, from one listing of the log, that nothing newer landed in the same table
    # (`engine.run.unchanged.check`), without opening it. Empty where the run did not list it.
    source_tags: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Watermark:
        pending, failed, holder = data.get("pending"), data.get("failed_runs"), data.get("holder")
        return cls(**{**data, "pending": PendingRun(**pending) if pending else None,
                      "failed_runs": FailedRuns(**failed) if failed else None,
                      "holder": Holder(**holder) if holder else None})

    def with_(self, **changes: Any) -> Watermark:
        return replace(self, **changes)

    @property
    def committed(self) -> bool:
        """False only for the placeholder of a partition that never completed a run."""
        return self.seq > 0
