"""Plan types: the mode and typed reason chosen for one (flow, partition)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from ..windows import Interval


class Mode(str, Enum):
    """How a run brings one partition up to date."""

    INCREMENTAL = "INCREMENTAL"  # merge partial states of the changed rows into stored state
    REFILL = "REFILL"  # recompute (some of) the partition's windows from the pinned snapshot
    NOOP = "NOOP"  # nothing to do


class Reason(str, Enum):
    """Why the planner picked its mode. Every run records exactly one."""

    # refill
    NO_WATERMARK = "NO_WATERMARK"
    CHECKPOINT_EXPIRED = "CHECKPOINT_EXPIRED"
    NON_APPEND_ON_NON_RETRACTABLE = "NON_APPEND_ON_NON_RETRACTABLE"
    REWRITE_WITHOUT_CHANGE_DATA = "REWRITE_WITHOUT_CHANGE_DATA"
    SPEC_CHANGED = "SPEC_CHANGED"
    DIMENSION_CHANGED = "DIMENSION_CHANGED"
    SCHEMA_CHANGED = "SCHEMA_CHANGED"
    SCHEMA_CHANGED_HISTORY = "SCHEMA_CHANGED_HISTORY"
    FORCED_BY_POLICY = "FORCED_BY_POLICY"
    FORCED_BY_USER = "FORCED_BY_USER"
    PREVIOUS_ATTEMPT_FAILED = "PREVIOUS_ATTEMPT_FAILED"
    DEDUP_REPLACED_ROW = "DEDUP_REPLACED_ROW"
    REFILL_CHEAPER = "REFILL_CHEAPER"
    PRECISION_LOSS = "PRECISION_LOSS"
    EXTREME_RETRACTED = "EXTREME_RETRACTED"
    QUERY_NOT_INCREMENTALIZABLE = "QUERY_NOT_INCREMENTALIZABLE"
    # incremental / no-op
    APPEND_ONLY = "APPEND_ONLY"
    RETRACTABLE_CHANGES = "RETRACTABLE_CHANGES"
    DELETION_VECTOR_CHANGES = "DELETION_VECTOR_CHANGES"
    NO_NEW_VERSIONS = "NO_NEW_VERSIONS"
    NO_CHANGES_IN_PARTITION = "NO_CHANGES_IN_PARTITION"
    PARTITION_FROZEN = "PARTITION_FROZEN"

    @property
    def describe(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Reason.NO_WATERMARK: "no watermark for this partition yet: first run computes it from the snapshot",
    Reason.CHECKPOINT_EXPIRED: "the checkpoint version is older than the history Delta still keeps",
    Reason.NON_APPEND_ON_NON_RETRACTABLE: "deletes/updates hit windows of an aggregate that cannot retract",
    Reason.REWRITE_WITHOUT_CHANGE_DATA: "a commit removed or rewrote data without a change data feed",
    Reason.SPEC_CHANGED: "the flow spec changed since the state was built",
    Reason.DIMENSION_CHANGED: "a joined dimension table has a new version",
    Reason.SCHEMA_CHANGED: "a source column the flow uses changed type compatibly",
    Reason.SCHEMA_CHANGED_HISTORY: ("a commit to merge holds files with a column the flow reads under another type "
                                    "than the source has now (retyped, then restored): the partition is recomputed "
                                    "from the latest snapshot"),
    Reason.FORCED_BY_POLICY: "refresh policy 'full' always refills",
    Reason.FORCED_BY_USER: "a refill was requested explicitly",
    Reason.PREVIOUS_ATTEMPT_FAILED: "the previous attempt failed or was killed before it committed",
    Reason.DEDUP_REPLACED_ROW: "a new row replaces an already-kept duplicate: the partition is recomputed",
    Reason.REFILL_CHEAPER: "the changed rows are a large share of the partition: recomputing reads less",
    Reason.PRECISION_LOSS: "a retraction left float state that cannot be trusted to 1e-9: the window is recomputed",
    Reason.EXTREME_RETRACTED: ("deletes/updates removed every row holding a group's min, max, first, last, "
                               "min_by or max_by: the window is recomputed"),
    Reason.QUERY_NOT_INCREMENTALIZABLE: ("the query has a construct whose state does not merge: the windows "
                                         "the changes touch are recomputed from the snapshot"),
    Reason.APPEND_ONLY: "only appends since the watermark",
    Reason.RETRACTABLE_CHANGES: "deletes/updates with change data, and every aggregate can retract",
    Reason.DELETION_VECTOR_CHANGES: ("rows deleted or restored through deletion vectors, read by position from "
                                     "each file's old and new vector; every aggregate can retract"),
    Reason.NO_NEW_VERSIONS: "the source has no version after the watermark",
    Reason.NO_CHANGES_IN_PARTITION: "new versions touch no window of this partition",
    Reason.PARTITION_FROZEN: "the partition is older than the late-data policy's freeze_after",
}


@dataclass(frozen=True)
class ChangedGroups:
    """The groups (a flow's window and keys, a stage's dedup key) a partition's deletes and updates
    touch: how many, their hashes (None when too many to name) and their key values (empty when
    unknown, NULL or not int/string: no file is skipped by them, see `PartitionPlan.group_keys`)."""

    count: int
    hashes: tuple[int, ...] | None
    values: tuple[tuple, ...] = ()


@dataclass(frozen=True)
class PartitionPlan:
    """What one run will do for one (flow, partition), and why. Built by `planner.plan_partition`."""

    flow: str
    partition: str
    interval: Interval  # the partition's own [start, end)
    needed: Interval  # event times whose rows can reach this partition's windows
    mode: Mode
    reason: Reason
    detail: str
    spec_hash: str
    from_versions: dict[str, int | None] = field(default_factory=dict, hash=False)
    to_versions: dict[str, int] = field(default_factory=dict, hash=False)
    refill: tuple[Interval, ...] = ()  # window-start ranges (flows) / event ranges (stages) to recompute
    refill_all: bool = False
    # Groups recomputed alone (hashes of (window start, keys), `flow.query.GROUP_HASH`), in the window
    # ranges `group_windows`: the rest of those windows keeps its state and merges (flows only)
    refill_groups: tuple[int, ...] = field(default=(), hash=False)
    group_windows: tuple[Interval, ...] = ()
    # The key values (`spec.key_columns`, int or string) of `refill_groups`: files whose statistics
    # hold none of them are not read (`file_ranges.KeyProbe`), and a row of those groups must have
    # them (`row_prep.group_values_sql`); empty when not known (only the hashes decide)
    group_keys: tuple[tuple, ...] = field(default=(), hash=False)
    incremental_versions: dict[str, tuple[int, ...]] = field(default_factory=dict, hash=False)
    pending_versions: dict[str, int] = field(default_factory=dict, hash=False)
    other_partitions: tuple[str, ...] = ()
    other_partitions_unknown: bool = False

    def to_json(self) -> dict:
        return {
            "flow": self.flow, "partition": self.partition, "mode": self.mode.value,
            "reason": self.reason.value, "detail": self.detail, "spec_hash": self.spec_hash,
            "interval": [self.interval.start.isoformat(), self.interval.end.isoformat()],
            "from_versions": self.from_versions, "to_versions": self.to_versions,
            "refill_all": self.refill_all,
            "refill": [[r.start.isoformat(), r.end.isoformat()] for r in self.refill],
            "refill_groups": len(self.refill_groups),
            "group_windows": [[r.start.isoformat(), r.end.isoformat()] for r in self.group_windows],
            "incremental_versions": {k: list(v) for k, v in self.incremental_versions.items()},
            "pending_versions": self.pending_versions,
            "other_partitions": list(self.other_partitions),
            "other_partitions_unknown": self.other_partitions_unknown,
        }
