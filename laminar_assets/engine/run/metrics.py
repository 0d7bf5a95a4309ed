"""What a run measured for one partition: `RunMetrics`, one typed field per metric.

The fields are the one list of run metrics. The engine's jobs and the executor fill them; the Dagster
asset's metadata (`orchestration/assets.py`), the demo's table and the benchmark read them; docs/dagster.md's
table of metadata names them (a test keeps it in step with `RunMetrics.shown`). A metric a run did not measure
is None and is left out of the metadata (a NOOP reads no files; a stage has no windows).

For code that reads metrics by name (`result.metrics["rows_read"]`, `.get`, `in`, `.items()`), `RunMetrics`
reads like the dict it replaced; reading, testing or writing a name that is not a field is a `KeyError`, so a
misspelt metric fails where it is used instead of vanishing from the UI or reading as 0. Every write is checked:
a count is an int, a share a number, neither negative nor NaN (numpy's and Arrow's numbers become Python's).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from dataclasses import dataclass, fields


@dataclass(slots=True)
class RunMetrics:
    """One partition's run metrics (None: not measured by this run)."""

    versions_read: int | None = None  # source versions the run read past its watermark
    files_read: int | None = None  # data files the pass opened for this partition
    bytes_read: int | None = None  # their bytes
    rows_read: int | None = None  # rows the pass read for this partition
    rows_rejected: int | None = None  # rows read that break a rule
    rows_quarantined: int | None = None  # new quarantine rows (the flow's sweep's count on the run's first partition)
    rows_retracted: int | None = None  # deleted or replaced rows subtracted from the state
    partial_groups: int | None = None  # partial aggregate groups the pass merged (flows)
    windows_touched: int | None = None  # windows the pass changed (an HLL estimate on large passes)
    state_rows: int | None = None  # the pass's state rows (its total, on its first partition)
    sink_rows: int | None = None  # the pass's sink rows (its total, on its first partition)
    rows_inserted: int | None = None  # a stage's output rows added
    rows_deleted: int | None = None  # a stage's output rows removed
    pending_versions: int | None = None  # versions left for a later run (work bounds)
    batch_partitions: int | None = None  # partitions in the pass this partition ran in
    refilled_windows: int | None = None  # windows a refill recomputed
    refilled_share: float | None = None  # share of the partition a refill recomputed (0 unless REFILL)
    refilled_groups: int | None = None  # a flow's groups recomputed alone
    refilled_keys: int | None = None  # a stage's dedup keys recomputed alone
    change_rows: int | None = None  # rows of the new commits' files that overlap the partition

    # the metrics the Dagster asset shows as metadata, under these names (docs/dagster.md lists them)
    shown = ("versions_read", "files_read", "bytes_read", "rows_read", "rows_rejected", "rows_quarantined",
             "rows_retracted", "windows_touched", "state_rows", "sink_rows", "rows_inserted", "rows_deleted",
             "refilled_windows", "refilled_share", "refilled_groups", "refilled_keys", "change_rows")

    def __setattr__(self, name: str, value) -> None:  # every write checked: the constructor's, `m.x = ...`, by name
        object.__setattr__(self, name, _check(name, value) if name in _NAMES else value)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def of(cls, values: dict | RunMetrics | None = None, **more) -> RunMetrics:
        """Metrics from a mapping of names (any name that is not a metric: `KeyError`)."""
        out = cls()
        out.update(dict(values or {}), **more)
        return out

    def update(self, values: dict | RunMetrics | None = None, **more) -> None:
        """Set the metrics named in `values` and `more` (None leaves a metric unmeasured); all or none of them."""
        given = {**dict(values.items() if values is not None else ()), **more}
        for name, value in given.items():
            _check(_known(name), value)
        for name, value in given.items():
            setattr(self, name, value)  # checked again, cheaply

    def shown_values(self) -> dict[str, int | float]:
        """The measured metrics of `shown`, each as its field's type (what the Dagster asset's metadata holds)."""
        return {name: (float if name in _FLOATS else int)(getattr(self, name)) for name in self.shown if name in self}

    def as_dict(self) -> dict[str, int | float]:
        """The measured metrics by name (what the run record and the benchmark keep)."""
        return {name: value for name, value in self.items()}

    # --- read and written by name, as the dict it replaced ------------------------------------------------
    def __setitem__(self, name: str, value: int | float | None) -> None:
        setattr(self, _known(name), value)

    def __getitem__(self, name: str) -> int | float:
        value = getattr(self, _known(name))
        if value is None:
            raise KeyError(f"run metric '{name}' was not measured by this run")
        return value

    def get(self, name: str, default=None):
        """The metric `name`, or `default` when this run did not measure it (a name that is no metric: `KeyError`)."""
        value = getattr(self, _known(name))
        return default if value is None else value

    def __contains__(self, name: object) -> bool:
        return getattr(self, _known(name)) is not None  # a name that is no metric: KeyError, not False

    def __iter__(self) -> Iterator[str]:
        return (name for name in _NAMES if getattr(self, name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def keys(self) -> list[str]:
        return list(self)

    def values(self) -> list[int | float]:
        return [getattr(self, name) for name in self]

    def items(self) -> list[tuple[str, int | float]]:
        return [(name, getattr(self, name)) for name in self]


_NAMES = RunMetrics.names()
_FLOATS = {f.name for f in fields(RunMetrics) if str(f.type).startswith("float")}


def _known(name: object) -> str:
    if name not in _NAMES:
        raise KeyError(f"{name!r} is not a run metric (RunMetrics: {', '.join(_NAMES)})")
    return name  # type: ignore[return-value]


def _check(name: str, value):
    """`value` if it can be metric `name`: None (not measured), or a count (an int) or a share (a number), never
    negative or NaN; else a `TypeError`/`ValueError` naming the metric, where it is written."""
    if value is None:
        return value
    floats = name in _FLOATS
    number: float  # numpy's and Arrow's numbers as Python's
    if floats and isinstance(value, numbers.Real) and not isinstance(value, bool):
        number = float(value)
    elif not floats and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        number = int(value)
    else:
        raise TypeError(f"run metric {name!r} is {'a number' if floats else 'a count (an int)'}, not {value!r}")
    if not number >= 0 or number == float("inf"):
        raise ValueError(f"run metric {name!r} is 0 or more and finite, not {value!r}")
    return number


