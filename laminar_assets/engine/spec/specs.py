"""Flow and stage specs: what a data engineer declares, validated when it is built.

Specs are frozen plain data (no Spark objects), so they hash, compare and
serialise; the Spark behaviour of each aggregate lives in the `aggregates` package.
Everything that differs between a flow and a stage is a member of `BaseSpec`, so the
rest of the engine asks the spec instead of testing its class.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, ClassVar, NoReturn, cast

from laminar_assets.errors import LaminarError, SpecError

from ..windows import Granularity, Interval, WindowShape, parse_duration, partition_interval, partition_key, to_utc
from .kinds import KINDS
from .parts import (  # noqa: F401  (re-exported: specs are built from these)
    Agg,
    DimensionJoin,
    FactJoin,
    Hopping,
    LatePolicy,
    RefreshPolicy,
    RowRule,
    Tumbling,
    as_pairs,
    as_tuple,
)
from .problems import catalog_problem, duration_problem, expression_problem, flow_problem, joins_problem

_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Rules the engine always applies; a row breaking one is quarantined under this name.
BUILTIN_RULES = ("event_time_missing", "event_time_out_of_bounds", "event_time_outside_partitions", "key_missing", "unmatched")
RESERVED_COLUMNS = ("window_start", "window_end")

# The first partition a spec may start at: partition keys are dates of four-digit years from the epoch on.
_FIRST_START, _LAST_START = datetime(1970, 1, 1, tzinfo=UTC), datetime(9999, 1, 1, tzinfo=UTC)

# Bumped when the layout or meaning of a flow's state changes: part of every flow's hash, so an
# upgrade refills (SPEC_CHANGED) instead of merging into state of another shape.
STATE_FORMAT = 3  # 3: min, max, first, last, min_by and max_by count the rows holding their extreme


@dataclass(frozen=True)
class BaseSpec:
    """What flows and stages share: sources, event time, partitioning, rules, work bounds, catalog facts."""

    kind: ClassVar[str]  # "flow" or "stage": which job runs the spec (the executor's `JOBS`)
    # What the code that runs, stores and shows a spec asks of its kind, so that it asks instead of branching on
    # the kind's name (a new kind sets these and registers its job):
    keeps_state: ClassVar[bool]  # partial aggregates in a state table of its own, merged by each run; the first
    #   commit of a run is the state's, the sink is derived from it (and may lag it after a crash), and the
    #   planner prices merging against recomputing. False: the output is written directly
    refill_unit: ClassVar[str]  # what a refill of part of a partition recomputes: "groups" (of windows) or "keys"
    catalog_kind: ClassVar[str]  # how a catalog lists its output ("sink", "stage")
    described_as: ClassVar[str]  # what it is, in a description nobody wrote ("time-window rollup")
    group_name: ClassVar[str]  # the group of its asset in the Dagster UI ("flows", "stages")
    recompute_checked: ClassVar[bool]  # its sink is compared with a recompute (the equivalence check): merged
    #   state can drift from what the source holds; an output written from the rows read cannot
    # what an error about its name among all definitions calls it: "duplicate flow name" for a stage's too
    duplicate_noun: ClassVar[str] = "flow"

    name: str
    source: str | tuple[str, ...]
    event_time: str
    partitioning: Granularity | str = Granularity.HOURLY
    filter: str | None = None
    derived: Mapping[str, str] | tuple[tuple[str, str], ...] = ()
    sink: str | None = None
    refresh: RefreshPolicy | str = RefreshPolicy.AUTO
    late: LatePolicy = field(default_factory=LatePolicy)
    max_versions_per_run: int | None = None
    max_rows_per_run: int | None = None
    description: str = ""
    rules: tuple[RowRule, ...] = ()
    event_time_bounds: tuple[datetime | str, datetime | str] | None = None  # [lo, hi): plausible event times
    # Catalog facts, not part of the hash: who owns the asset, its tags, and how far its sink may
    # lag its sources before the orchestrator calls it stale ("5m", "1h").
    owners: tuple[str, ...] = ()
    tags: Mapping[str, str] | tuple[tuple[str, str], ...] = ()
    target_lag: str | timedelta | None = None
    # The first partition the orchestrator offers (a UTC partition boundary); None: the project's default.
    start: datetime | str | None = None
    # Where the spec was defined ("flows/minute_stats.sql:4") and, for SQL views, the statement itself.
    origin: str = ""
    definition: str = ""

    @property
    def bounds(self) -> Interval | None:
        """Plausible event times; rows outside them are quarantined (event_time_out_of_bounds)."""
        lo_hi = cast("tuple[datetime, datetime] | None", self.event_time_bounds)  # __post_init__ made them UTC datetimes
        return Interval(*lo_hi) if lo_hi else None

    def rules_for(self, source: str) -> tuple[RowRule, ...]:
        return tuple(r for r in self.rules if r.source in (None, source))

    def _rules_payload(self) -> dict[str, Any]:
        """Quarantine rules change what is aggregated, so they count in the hash (only when declared,
        so specs without rules keep their hash)."""
        out: dict[str, Any] = {}
        if self.rules:
            out["rules"] = [[r.name, r.check, r.source] for r in self.rules]
        bounds = self.bounds
        if bounds is not None:
            out["event_time_bounds"] = [bounds.start.isoformat(), bounds.end.isoformat()]
        return out

    def _pairs(self, field_name: str) -> tuple[tuple[str, str], ...]:
        """Sets field `field_name` to its (name, expression) pairs and returns them, or raises the spec's error
        naming the field."""
        try:
            pairs = as_pairs(getattr(self, field_name))
        except ValueError as exc:
            self._fail(field_name, str(exc))
        object.__setattr__(self, field_name, pairs)
        return pairs

    def _normalise_common(self) -> None:
        set_ = object.__setattr__
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):  # first: other fields' errors name it
            self._fail("name", f"expected an identifier (letters, digits, _), found {self.name!r}")
        set_(self, "source", as_tuple(self.source))
        self._pairs("derived")
        if self.sink is None:
            set_(self, "sink", self.name)
        set_(self, "rules", as_tuple(self.rules))
        set_(self, "owners", as_tuple(self.owners))
        tags = self._pairs("tags")
        for attr in ("sink", "description", "origin", "definition"):
            value = getattr(self, attr)
            if not isinstance(value, str) or (attr == "sink" and not value.strip()):
                self._fail(attr, f"expected {'a table name or URI' if attr == 'sink' else 'a string'}, found {value!r}")
        problem = catalog_problem(self.owners, tags)
        if problem:
            self._fail(*problem)
        if self.target_lag is not None:
            try:
                lag = parse_duration(self.target_lag)
            except ValueError as exc:
                self._fail("target_lag", f"expected a duration like '5m' or '1h', found {self.target_lag!r}: {exc}")
            if lag <= timedelta(0):
                self._fail("target_lag", f"expected a positive duration, found {self.target_lag!r}")
            set_(self, "target_lag", lag)
        if not isinstance(self.late, LatePolicy):
            self._fail("late", f"expected a LatePolicy, found {self.late!r}")
        if self.late.freeze_after is not None:
            freeze_problem = duration_problem(self.late.freeze_after, "freeze_after")
            if freeze_problem:
                self._fail("late.freeze_after", freeze_problem)
        if self.event_time_bounds is not None:
            try:
                lo, hi = (to_utc(_datetime(b)) for b in self.event_time_bounds)
            except (TypeError, ValueError) as exc:
                self._fail("event_time_bounds", f"expected two UTC datetimes (ISO strings), found "
                           f"{self.event_time_bounds!r}: {exc}")
            if not lo < hi:
                self._fail("event_time_bounds", f"expected lower < upper, found {lo.isoformat()} >= {hi.isoformat()}")
            set_(self, "event_time_bounds", (lo, hi))
        try:
            set_(self, "partitioning", Granularity(self.partitioning))
        except (TypeError, ValueError):
            self._fail("partitioning", f"expected 'hourly' or 'daily', found {self.partitioning!r}")
        if self.start is not None:
            set_(self, "start", self._first_partition(self.start))
        try:
            set_(self, "refresh", RefreshPolicy(self.refresh))
        except (TypeError, ValueError):
            allowed = ", ".join(p.value for p in RefreshPolicy)
            self._fail("refresh", f"expected one of {allowed}, found {self.refresh!r}")

    def _first_partition(self, value: datetime | str) -> datetime:
        try:
            start = to_utc(_datetime(value))
        except (TypeError, ValueError) as exc:
            self._fail("start", f"expected a UTC datetime (ISO string like '2026-11-01'), found {value!r}: {exc}")
        if not _FIRST_START <= start < _LAST_START:
            self._fail("start", f"expected a first partition from {_FIRST_START.year} to {_LAST_START.year - 1}, found "
                       f"{start.isoformat()}")
        boundary = partition_interval(partition_key(start, self.granularity), self.granularity).start
        if boundary != start:
            self._fail("start", f"expected the start of {'an hourly' if self.partitioning is Granularity.HOURLY else 'a daily'} "
                       f"partition, found {start.isoformat()}; use {boundary.isoformat()}")
        return start

    def _fail(self, field_name: str, message: str) -> NoReturn:
        raise SpecError(f"{type(self).__name__} '{self.name}': {message}", flow=self.name, field=field_name)

    def _validate_common(self) -> None:
        if not self.source:
            self._fail("source", "expected at least one source table, found none")
        for i, src in enumerate(self.source):
            if not isinstance(src, str) or not src.strip():
                self._fail(f"source[{i}]", f"expected a table name or URI, found {src!r}")
        if not isinstance(self.event_time, str) or not self.event_time:
            self._fail("event_time", f"expected a column name, found {self.event_time!r}")
        for i, (col, expr) in enumerate(self.derived):
            if not _NAME_RE.match(col) or col.startswith("__"):
                self._fail(f"derived[{i}]", f"expected an identifier not starting with '__', found {col!r}")
            if not expr.strip():
                self._fail(f"derived.{col}", "expected a Spark SQL expression, found an empty string")
            # An event time derived from source columns is fine (no statistics prune it); one that
            # rewrites a source column of the same name would make the statistics lie.
            if col == self.event_time and re.search(rf"(?<![\w`]){re.escape(col)}(?![\w`])|`{re.escape(col)}`", expr):
                self._fail(f"derived.{col}", f"a derived column may not replace the event time column {col!r} "
                           "(file statistics of the source locate rows by it); derive a new name and use it as event_time")
        if self.filter is not None and not isinstance(self.filter, str):
            self._fail("filter", f"expected a Spark SQL condition (a string) or None, found {self.filter!r}")
        names: set[tuple[str, str | None]] = set()  # (rule, source)
        for i, rule in enumerate(self.rules):
            if not isinstance(rule, RowRule):
                self._fail(f"rules[{i}]", f"expected a RowRule, found {rule!r}")
            if rule.source is not None and not isinstance(rule.source, str):
                self._fail(f"rules[{i}].source", f"expected a source table name or None, found {rule.source!r}")
            if not isinstance(rule.name, str) or not _NAME_RE.match(rule.name) or rule.name in BUILTIN_RULES:
                self._fail(f"rules[{i}].name", f"expected an identifier other than {', '.join(BUILTIN_RULES)}, "
                           f"found {rule.name!r}")
            if (rule.name, rule.source) in names:
                self._fail(f"rules[{i}].name", f"duplicate rule {rule.name!r}")
            names.add((rule.name, rule.source))
            if not isinstance(rule.check, str) or not rule.check.strip():
                self._fail(f"rules.{rule.name}", "expected a Spark SQL condition, found an empty string")
            if rule.source is not None and rule.source not in self.source:
                self._fail(f"rules.{rule.name}.source", f"expected one of the sources {list(self.source)}, "
                           f"found {rule.source!r}")
        problem = expression_problem(self)
        if problem:
            self._fail(*problem)
        for attr in ("max_versions_per_run", "max_rows_per_run"):
            value = getattr(self, attr)
            if value is not None and (not isinstance(value, int) or value < 1):
                self._fail(attr, f"expected a positive integer or None, found {value!r}")

    @property
    def sources(self) -> tuple[str, ...]:
        """`source` as __post_init__ left it: a tuple of table names or URIs."""
        return cast(tuple[str, ...], self.source)

    @property
    def granularity(self) -> Granularity:
        """`partitioning` as __post_init__ left it: a Granularity."""
        return cast(Granularity, self.partitioning)

    @property
    def sink_name(self) -> str:
        """`sink` as __post_init__ left it: the sink's table name or URI (the spec's name when none was given)."""
        return cast(str, self.sink)

    @property
    def derived_pairs(self) -> tuple[tuple[str, str], ...]:
        """`derived` as __post_init__ left it: (column, Spark SQL expression) pairs, in order."""
        return cast(tuple[tuple[str, str], ...], self.derived)

    @property
    def start_time(self) -> datetime | None:
        """`start` as __post_init__ left it: the start of the spec's first partition (None: the project's default)."""
        return cast("datetime | None", self.start)

    def _hash_payload(self) -> dict[str, Any]:
        raise NotImplementedError

    # --- what differs between flows and stages --------------------------------------------
    def aggregation(self) -> FlowSpec | None:
        """The spec as an aggregation of rows into windows, for what only one has (its window, keys, aggregates,
        `post` and state: their checks, descriptions and queries); None for a kind that passes rows through."""
        return None

    def aggregation_for(self, use: str) -> FlowSpec:
        """`aggregation()` on a path that only an aggregation takes (`use`: "re-deriving a sink from state"); a
        spec of another kind there is a bug in the caller, raised instead of running the path with it."""
        found = self.aggregation()
        if found is None:
            raise LaminarError(f"{use} needs the windows and state of a flow; {self.kind} '{self.name}' has none",
                               flow=self.name)
        return found

    @property
    def key_columns(self) -> tuple[str, ...]:
        """Columns a row must have (a NULL one is quarantined as key_missing): a flow's group keys,
        a stage's dedup key."""
        raise NotImplementedError

    @property
    def output_time_column(self) -> str:
        """The column of the sink (a stage's output) that places a row in a partition."""
        raise NotImplementedError

    @property
    def retractable(self) -> bool:
        """Whether deleted or updated rows can be taken out of the stored result, instead of
        recomputing what they touched."""
        return False

    @property
    def why_not_retractable(self) -> str:
        """Why deletes and updates recompute what they touch (for a run's reason detail)."""
        raise NotImplementedError

    @property
    def not_incrementalizable(self) -> tuple[str, ...]:
        """The constructs that make the spec refill-only (empty when its results merge)."""
        return ()

    @property
    def held_extremes(self) -> int:
        """How many aggregates keep one row's value (min, max, first, last, min_by, max_by): a delete
        or update of a row holding it makes its window be recomputed."""
        return 0

    @property
    def fact_joins(self) -> tuple[FactJoin, ...]:
        """Other fact tables joined to the source rows before anything else (flows only)."""
        return ()

    @property
    def dimension_joins(self) -> tuple[DimensionJoin, ...]:
        """Dimension tables joined beside each row, adding their columns to it (stages only)."""
        return ()

    @property
    def dimension_tables(self) -> tuple[str, ...]:
        """Tables read whole at a pinned version; a change to one refills every partition."""
        return ()

    @property
    def input_columns(self) -> tuple[str, ...]:
        """Source columns the spec names (the event time first), besides those its expressions use."""
        raise NotImplementedError

    @property
    def reads_all_columns(self) -> bool:
        """Whether the spec passes every source column through (a stage without `columns`)."""
        return False

    @property
    def kept_columns(self) -> tuple[str, ...]:
        """The row's columns it names as its output's (a stage's `columns`); empty when it names none: a stage
        without `columns` passes all through (`reads_all_columns`), a flow writes its keys and aggregates."""
        return ()

    @property
    def row_key(self) -> tuple[str, ...]:
        """The columns that identify a row of its output table (what exports upsert and delete by); empty when
        its rows have no identity."""
        raise NotImplementedError

    def joined_columns(self, table: str) -> set[str]:
        """The columns the spec reads from the joined table `table`."""
        raise NotImplementedError

    def events_needed(self, part: Interval) -> Interval:
        """Event times whose rows can land in partition `part`."""
        return part

    def output_times_of(self, events: Interval) -> Interval:
        """The values of `output_time_column` that rows with event times in `events` can land on."""
        return events

    def output_columns(self) -> list[str] | None:
        """The sink columns it writes, when they are known without reading a table (None: not known)."""
        return None

    def column_description(self, column: str) -> str | None:
        """What a sink column holds, for a catalog's column descriptions (None: nothing to say)."""
        return None

    def definition_facts(self) -> list[tuple[str, str, bool]]:
        """What its definition says, for the asset's metadata: (name, text, whether the text is Markdown)."""
        return []

    def logical_facts(self, describe: Callable[[Agg], dict]) -> dict[str, Any]:
        """The fields of its kind in `laminar explain`'s logical plan (after the fields every spec has);
        `describe` gives an aggregate's Spark SQL (the aggregates package's, above this module)."""
        raise NotImplementedError

    def refill_scope(self, part: Interval, touched: Interval) -> Interval | None:
        """What of partition `part` rows with event times in `touched` affect (window starts of a flow,
        event times of a stage); None when nothing."""
        return touched.intersect(part)

    def refilled_ranges(self, part: Interval, refill: tuple[Interval, ...]) -> list[Interval]:
        """The ranges of `output_time_column` a refill of `refill` (a plan's refill scope) recomputes:
        a stage dedups within a partition, so it recomputes all of it."""
        return [part] if refill else []

    def refill_events(self, part: Interval, refill: tuple[Interval, ...]) -> list[Interval]:
        """The event times a refill of `refill` reads."""
        return [part] if refill else []

    def refilled_share(self, part: Interval, ranges: list[Interval]) -> tuple[float, int | None]:
        """(share of partition `part` that a refill of `ranges` recomputes, windows recomputed or None): a run's
        outcome reports it. A stage recomputes the event times of `ranges` inside `part`, and has no windows."""
        inside = [r.intersect(part) for r in ranges]
        covered = sum(((r.end - r.start) for r in inside if r is not None), start=part.start - part.start)
        return min(1.0, covered / (part.end - part.start)), None

    @property
    def spec_hash(self) -> str:
        """Stable hash of everything that changes results; a new hash invalidates state."""
        payload = json.dumps(self._hash_payload(), sort_keys=True, default=str)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class FlowSpec(BaseSpec):
    """A time-window aggregation kept up to date incrementally.

    `SELECT window, keys, aggregates FROM source [WHERE filter] GROUP BY window, keys`,
    with optional `derived` input columns and `post` expressions over the results.
    """

    window: Tumbling | Hopping | None = None
    keys: tuple[str, ...] = ()
    aggregates: tuple[Agg, ...] = ()
    post: Mapping[str, str] | tuple[tuple[str, str], ...] = ()
    hidden: tuple[str, ...] = ()  # aggregates computed for `post` expressions but not written to the sink
    joins: tuple[FactJoin, ...] = ()  # other fact tables joined to the source rows (refill-only)

    def __post_init__(self) -> None:
        self._normalise_common()
        object.__setattr__(self, "keys", as_tuple(self.keys))
        object.__setattr__(self, "aggregates", as_tuple(self.aggregates))
        self._pairs("post")
        object.__setattr__(self, "hidden", as_tuple(self.hidden))
        object.__setattr__(self, "joins", as_tuple(self.joins))
        self._validate_common()
        self._validate_joins()  # before the flow's checks, which name the joined tables
        self._validate_flow()

    kind: ClassVar[str] = "flow"
    keeps_state: ClassVar[bool] = True
    refill_unit: ClassVar[str] = "groups"
    catalog_kind: ClassVar[str] = "sink"
    described_as: ClassVar[str] = "time-window rollup"
    group_name: ClassVar[str] = "flows"
    recompute_checked: ClassVar[bool] = True

    def aggregation(self) -> FlowSpec:
        return self

    def _validate_flow(self) -> None:
        problem = flow_problem(self, RESERVED_COLUMNS)
        if problem:
            self._fail(*problem)

    def _validate_joins(self) -> None:
        problem = joins_problem(self.joins, self.sources, self.rules)
        if problem:
            self._fail(*problem)

    @property
    def dimension_tables(self) -> tuple[str, ...]:
        return tuple(j.table for j in self.joins)

    @property
    def fact_joins(self) -> tuple[FactJoin, ...]:
        return self.joins

    @property
    def not_incrementalizable(self) -> tuple[str, ...]:
        joins = tuple(f"JOIN {j.table}" for j in self.joins)
        return joins + tuple(a.expr or a.kind for a in self.aggregates if not KINDS[a.kind].mergeable)

    @property
    def post_pairs(self) -> tuple[tuple[str, str], ...]:
        """`post` as __post_init__ left it: (column, Spark SQL expression over the results) pairs, in order."""
        return cast(tuple[tuple[str, str], ...], self.post)

    @property
    def shape(self) -> WindowShape:
        assert self.window is not None  # a flow without a window fails __post_init__ (window_problem)
        return self.window.shape

    @property
    def retractable(self) -> bool:
        return all(KINDS[a.kind].retractable for a in self.aggregates)

    @property
    def held_extremes(self) -> int:
        return sum(KINDS[a.kind].holds_extreme for a in self.aggregates)

    @property
    def why_not_retractable(self) -> str:
        kinds = sorted({a.kind for a in self.aggregates if not KINDS[a.kind].retractable})
        return f"aggregate(s) {', '.join(kinds)} cannot retract"

    @property
    def key_columns(self) -> tuple[str, ...]:
        return self.keys

    @property
    def output_time_column(self) -> str:
        return "window_start"

    @property
    def row_key(self) -> tuple[str, ...]:
        """The window start and the group keys (the window end follows from the start)."""
        return ("window_start", *self.keys)

    @property
    def input_columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys([self.event_time, *self.keys,
                                    *[c for a in self.aggregates for c in (a.column, a.by) if c]]))

    def joined_columns(self, table: str) -> set[str]:
        return {c for j in self.joins if j.table == table for c in j.columns}

    def events_needed(self, part: Interval) -> Interval:
        return self.shape.events_of_starts(part)

    def output_times_of(self, events: Interval) -> Interval:
        return Interval(events.start - self.shape.size + self.shape.slide, events.end)  # window starts

    def output_columns(self) -> list[str] | None:
        return ["window_start", "window_end", *self.keys,
                *[a.output for a in self.aggregates if a.output not in self.hidden], *[p for p, _ in self.post_pairs]]

    def column_description(self, column: str) -> str | None:
        if column in ("window_start", "window_end"):
            return f"{'start' if column == 'window_start' else 'end'} of the window (UTC; windows are [start, end))"
        for agg in self.aggregates:
            if agg.name == column:
                return agg.expr or f"{agg.kind}({agg.column or '*'})"
        return None

    def definition_facts(self) -> list[tuple[str, str, bool]]:
        aggregates = "\n".join(
            f"- `{a.name}` = {a.expr or f'{a.kind}({a.column or chr(42)})'} — "
            f"{'retractable' if KINDS[a.kind].retractable else 'not retractable'}"
            f"{' (refill-only)' if a.kind == 'sql' else ''}{' (hidden)' if a.name in self.hidden else ''}"
            for a in self.aggregates)
        return [("window", f"{self.shape.size} every {self.shape.slide}", False),
                ("keys", ", ".join(self.keys) or "(none)", False), ("aggregates", aggregates, True)]

    def logical_facts(self, describe: Callable[[Agg], dict]) -> dict[str, Any]:
        return {"keys": list(self.keys),
                "window": {"kind": "hopping" if self.shape.is_hopping else "tumbling",
                           "size_seconds": self.shape.size.total_seconds(),
                           "slide_seconds": self.shape.slide.total_seconds()},
                "aggregates": [describe(a) for a in self.aggregates], "post": dict(self.post),
                "hidden": list(self.hidden), "retractable": self.retractable,
                "not_incrementalizable": list(self.not_incrementalizable),
                "joins": [{"table": j.table, "alias": j.alias, "on": j.on, "columns": [j.column(c) for c in j.columns],
                           "how": j.how} for j in self.joins]}

    def refill_scope(self, part: Interval, touched: Interval) -> Interval | None:
        starts = self.shape.starts_overlapping(touched)
        return starts.intersect(part) if starts else None

    def refilled_ranges(self, part: Interval, refill: tuple[Interval, ...]) -> list[Interval]:
        return list(refill)  # window starts

    def refill_events(self, part: Interval, refill: tuple[Interval, ...]) -> list[Interval]:
        return [self.shape.events_of_starts(r) for r in refill]

    def refilled_share(self, part: Interval, ranges: list[Interval]) -> tuple[float, int | None]:
        """A flow recomputes whole windows: `ranges` are window starts, each range at least one window."""
        slide = self.shape.slide
        windows = sum(max(1, -(-(r.end - r.start) // slide)) for r in ranges)
        return min(1.0, windows / max(1, (part.end - part.start) // slide)), windows

    def _hash_payload(self) -> dict[str, Any]:
        return {
            "kind": "flow", "sources": self.sources, "event_time": self.event_time,
            "window": [str(self.shape.size), str(self.shape.slide)], "keys": self.keys,
            "aggregates": [a.to_json() for a in self.aggregates], "filter": self.filter,
            "derived": self.derived, "post": self.post, "partitioning": self.granularity.value,
            "state_format": STATE_FORMAT, **self._rules_payload(), **({"hidden": self.hidden} if self.hidden else {}),
            **({"joins": [[j.table, j.alias, j.on, j.columns, j.how] for j in self.joins]} if self.joins else {}),
        }


@dataclass(frozen=True)
class StageSpec(BaseSpec):
    """A row-level shared stage: filter, derived columns, dedup, dimension joins.

    Its output is a Delta table keyed by the same event time that downstream
    flows read as their source, version by version.
    """

    columns: tuple[str, ...] = ()  # output columns; empty = all
    dedup_key: tuple[str, ...] = ()
    joins: tuple[DimensionJoin, ...] = ()

    kind: ClassVar[str] = "stage"
    keeps_state: ClassVar[bool] = False
    refill_unit: ClassVar[str] = "keys"
    catalog_kind: ClassVar[str] = "stage"
    described_as: ClassVar[str] = "shared stage"
    group_name: ClassVar[str] = "stages"
    recompute_checked: ClassVar[bool] = False

    def __post_init__(self) -> None:
        self._normalise_common()
        object.__setattr__(self, "columns", as_tuple(self.columns))
        object.__setattr__(self, "dedup_key", as_tuple(self.dedup_key))
        object.__setattr__(self, "joins", as_tuple(self.joins))
        self._validate_common()
        for attr in ("columns", "dedup_key"):
            for i, col in enumerate(getattr(self, attr)):
                if not isinstance(col, str) or not col:
                    self._fail(f"{attr}[{i}]", f"expected a column name, found {col!r}")
        for i, join in enumerate(self.joins):
            if not isinstance(join, DimensionJoin):
                self._fail(f"joins[{i}]", f"expected a DimensionJoin, found {join!r}")
            if not isinstance(join.table, str) or not join.table.strip():
                self._fail(f"joins[{i}].table", f"expected a table name or URI, found {join.table!r}")
            for attr in ("on", "columns"):
                cols = getattr(join, attr)
                if not isinstance(cols, tuple) or not all(isinstance(c, str) and c for c in cols):
                    self._fail(f"joins[{i}].{attr}", f"expected column names, found {cols!r}")
            if not join.on:
                self._fail(f"joins[{i}].on", "expected at least one join column")
            if join.how not in ("inner", "left"):
                self._fail(f"joins[{i}].how", f"expected 'inner' or 'left', found {join.how!r}")
        if self.columns and self.event_time not in self.columns:
            self._fail("columns", f"output columns must include the event time column {self.event_time!r}")

    @property
    def dimension_tables(self) -> tuple[str, ...]:
        return tuple(j.table for j in self.joins)

    @property
    def key_columns(self) -> tuple[str, ...]:
        return self.dedup_key

    def output_columns(self) -> list[str] | None:
        return list(self.columns) or None

    def definition_facts(self) -> list[tuple[str, str, bool]]:
        return [("dedup_key", ", ".join(self.dedup_key) or "(none)", False),
                ("joins", ", ".join(j.table for j in self.joins) or "(none)", False)]

    def logical_facts(self, describe: Callable[[Agg], dict]) -> dict[str, Any]:
        return {"dedup_key": list(self.dedup_key),
                "joins": [{"table": j.table, "on": list(j.on), "columns": list(j.columns), "how": j.how}
                          for j in self.joins],
                "columns": list(self.columns)}

    @property
    def output_time_column(self) -> str:
        return self.event_time

    @property
    def row_key(self) -> tuple[str, ...]:
        """The dedup key and the event time: a stage keeps one row per dedup key and partition, so one key can
        hold a row in two partitions, told apart by the event time. Empty without a dedup key."""
        return (*self.dedup_key, self.event_time) if self.dedup_key else ()

    @property
    def dimension_joins(self) -> tuple[DimensionJoin, ...]:
        return self.joins

    @property
    def kept_columns(self) -> tuple[str, ...]:
        return self.columns

    @property
    def why_not_retractable(self) -> str:
        return "row-level stages recompute the affected range on deletes and updates"

    @property
    def reads_all_columns(self) -> bool:
        return not self.columns

    def joined_columns(self, table: str) -> set[str]:
        return {c for j in self.joins if j.table == table for c in (*j.on, *j.columns)}

    @property
    def input_columns(self) -> tuple[str, ...]:
        joined = {c for j in self.joins for c in j.columns}
        return tuple(dict.fromkeys([self.event_time, *self.dedup_key, *[c for j in self.joins for c in j.on],
                                    *[c for c in self.columns if c not in joined]]))

    def _hash_payload(self) -> dict[str, Any]:
        return {
            "kind": "stage", "sources": self.sources, "event_time": self.event_time,
            "filter": self.filter, "derived": self.derived, "columns": self.columns,
            "dedup_key": self.dedup_key,
            "joins": [[j.table, j.on, j.columns, j.how] for j in self.joins],
            "partitioning": self.granularity.value, **self._rules_payload(),
        }


Spec = FlowSpec | StageSpec  # the one name for "a flow or a stage" in annotations
SPEC_KINDS = (FlowSpec, StageSpec)  # the classes of `Spec`, for finding definitions among a module's values


def _datetime(value: Any) -> datetime:
    """A datetime, or an ISO string of one; a ValueError naming what was found for anything else."""
    if isinstance(value, str):
        return datetime.fromisoformat(value)
    if not isinstance(value, datetime):
        raise ValueError(f"expected a datetime or an ISO string, found {type(value).__name__}")
    return value
