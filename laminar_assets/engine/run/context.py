"""The options a run follows (`EngineOptions`), the moments it passes through (`STEPS`), and the
context every module of a run's data path shares (`RunContext`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from laminar_assets.checkpoints import CheckpointStore

    from ..delta.layout import Layout

Hook = Callable[[str], None]
# Moments a run passes through, in order; tests crash or kill a run at each of them.
STEPS = ("after_intent", "after_read", "after_state_commit", "after_sink_commit", "after_first_watermark",
         "after_watermark")


ExtremeRefill = Literal["cost", "merge", "windows"]
EXTREME_REFILL = get_args(ExtremeRefill)
# Options that were renamed: what a settings file still naming the old one is told.
RENAMED = {"extreme_refill_share": "extreme_refill: 'cost' (the default, by expected cost), 'merge' (what a share "
                                   "of none did) or 'windows'"}


@dataclass(frozen=True)
class EngineOptions:
    """How runs choose and guard their work (keyword options of `Engine`)."""

    # Refill a partition instead of merging when its changed bytes are at least this share of its bytes
    # (reason REFILL_CHEAPER); None never chooses refill for cost. Measured in bench/ (docs/benchmark.md).
    refill_ratio: float | None = 0.5
    # ... but only for partitions of at least this many bytes: below it a run's cost is Spark job
    # latency either way, and a stable reason is worth more than a few kilobytes read.
    refill_min_bytes: int = 16 * 1024 * 1024
    # Deletes and updates of rows a min/max/first/last may hold: "cost" recomputes the windows they touch up
    # front (reason EXTREME_RETRACTED) when that is expected to cost less than merging first and then, if a
    # group lost its extreme, a second pass that merges again and recomputes those groups (estimated from
    # the rows and bytes changed, the partition's rows, bytes and groups, and the two costs below; see
    # planner._extremes_up_front); "merge" always merges first; "windows" always recomputes up front.
    extreme_refill: ExtremeRefill = "cost"
    # What one pass of a flow costs whatever it reads (Spark's analysis, job and task start, the commits),
    # and how many bytes of Parquet it reads and aggregates per second after that: the two prices of
    # `extreme_refill="cost"`: the medians of three benchmark runs' batched path on a 2-core machine
    # (`cost_calibration` in bench/results/latest.json; docs/PERFORMANCE.md, "Corrections under extremes").
    pass_seconds: float = 0.43
    scan_bytes_per_second: float = 25e6
    # A delete or update that an aggregate cannot retract (count_distinct, top_k, sketches) recomputes
    # only the groups it touches (one Spark job finds them first), unless they are at least this share
    # of the groups of the windows they touch: then the windows, whole. None: always whole windows.
    group_refill_share: float | None = 0.5
    # ... and a stage's changed dedup keys (against its output rows in the partition), for stages
    # whose output partition holds at least this many bytes: below it, finding the keys and the
    # files holding them costs more Spark jobs than recomputing the partition (docs/PERFORMANCE.md).
    key_refill_min_bytes: int = 8 * 1024 * 1024
    # A flow pass reading fewer bytes than this counts every row holding a min/max/first/last (a sort
    # of the pass's rows), so deleting one of several tied rows merges. Larger passes (refills) count
    # a lower bound instead: no sort, and a delete of a tied extreme recomputes its group. 0: never.
    count_tied_extremes_below_bytes: int = 1024 * 1024
    # Recompute windows whose float state lost precision to a retraction (reason PRECISION_LOSS).
    # Turning it off exists only so tests can show that the equivalence check catches such a window.
    precision_guard: bool = True
    # Per-partition metrics are computed for runs of at most this many partitions; larger runs
    # report their totals on the first partition (`batch_partitions` says how many shared them).
    metrics_partitions: int = 64
    lease_seconds: float = 6 * 3600
    # How far past now a partition may start. A run of a later partition is refused before anything is
    # written, and the sweep quarantines rows with later event times (event_time_outside_partitions):
    # a clock or a producer off by years must not leave watermarks nobody offers. None: no bound.
    future_horizon: timedelta | None = timedelta(days=1)
    # A pass reading fewer bytes than this runs Spark's expressions interpreted instead of compiling
    # them: on small inputs compiling costs more CPU than it saves, on larger ones interpreted hash
    # aggregation costs more than compiling. 0 always compiles. See spark.frames.interpreted; the
    # measurements behind each default are in docs/PERFORMANCE.md ("Measured defaults").
    interpreted_below_bytes: int = 1024 * 1024
    # A flow pass whose input (bytes read times the window copies of each row, plus the old state it
    # merges; flows with fact joins: never) is smaller than this runs in one Spark task with no
    # shuffle: partial states and merge in one stage. On small inputs a stage and its tasks cost more
    # than the work; on large ones one core idles. 0: never.
    single_task_below_bytes: int = 32 * 1024 * 1024
    # A write whose rows are bounded by fewer bytes than this goes through the driver: Spark sends the
    # rows as Arrow batches and pyarrow writes the files, and a flow's sink rows come from the same
    # job as its state. The bound is in Parquet bytes: a flow's state by the bytes the pass reads times
    # the window copies per row, plus the old state it merges (flows with fact joins: never); its sink
    # by the same; a stage's rows by the bytes read plus its dimensions. Rows in Arrow take several
    # times their Parquet bytes. For a few thousand rows a Spark write job costs more than the collect.
    # 0: Spark always writes.
    driver_write_below_bytes: int = 8 * 1024 * 1024
    # In a bucket, a flow's committed state of fewer bytes than this (the partitions a pass merges into) is read
    # by the driver (pyarrow: a GET per file, its size from the log) and handed to Spark as rows: Spark's Parquet
    # reader asks the store for each file's status before reading it (a HEAD per file), and a batched run's state
    # files are a few kilobytes apiece. On a local disk Spark reads it (no request to save). 0: Spark always reads.
    driver_read_below_bytes: int = 1024 * 1024
    # A flow's write through the driver puts the rows of up to this many adjacent partitions in one file
    # (aligned: partition numbers n with the same n // partitions_per_file, e.g. hours 00-07, 08-15 and 16-23 of a
    # day for 8): on an object store each file costs a PUT when written and a HEAD and a GET whenever a run reads
    # it, and a batched run's per-partition files are tiny. But a later run over some of them writes the others'
    # rows back (`output.commit.replace_ranges`): cheaper only where runs keep covering the same blocks
    # (docs/PERFORMANCE.md, "Files of adjacent partitions"). 1 (the default): a file per partition.
    partitions_per_file: int = 1

    def __post_init__(self) -> None:
        if self.extreme_refill not in EXTREME_REFILL:
            from laminar_assets.errors import EnvironmentProblem

            raise EnvironmentProblem(f"EngineOptions: extreme_refill: expected one of {', '.join(map(repr, EXTREME_REFILL))}, "
                                     f"found {self.extreme_refill!r}", options=["extreme_refill"])

    @classmethod
    def of(cls, values: dict, *, where: str = "the engine options") -> EngineOptions:
        """Options from names and values as settings files and Dagster config give them (numbers as numbers or
        text, `future_horizon` as a duration such as '6h' or '1d', None for the options that take it); a name
        that is no option or a value of the wrong type is one `EnvironmentProblem` naming it and `where`."""
        from pydantic import TypeAdapter, ValidationError

        from laminar_assets.errors import EnvironmentProblem, did_you_mean

        from ..windows import parse_duration

        if not isinstance(values, Mapping):
            raise EnvironmentProblem(f"{where}: expected a table of engine options by name, found {values!r}")
        names = [f.name for f in fields(cls)]
        unknown = sorted(map(repr, set(values) - set(names)))
        renamed = [f"{old!r} is now {new}" for old, new in RENAMED.items() if old in values]
        if renamed:
            raise EnvironmentProblem(f"{where}: {'; '.join(renamed)} (docs/engine.md, 'EngineOptions')",
                                     options=sorted(k for k in RENAMED if k in values))
        if unknown:
            hints = "".join(did_you_mean(name, names) for name in sorted(set(values) - set(names)))
            raise EnvironmentProblem(f"{where}: {', '.join(unknown)} is not an engine option; {hints}the options "
                                     f"are {', '.join(names)} (docs/dagster.md, 'Engine options')", options=unknown)
        given = dict(values)
        if isinstance(given.get("future_horizon"), (int, float)):  # seconds? days? say which
            raise EnvironmentProblem(f"{where}: future_horizon: expected a duration such as '6h' or '1d', found "
                                     f"{given['future_horizon']!r}", options=["future_horizon"])
        if isinstance(given.get("future_horizon"), str):
            try:
                given["future_horizon"] = parse_duration(given["future_horizon"])
            except ValueError as exc:
                raise EnvironmentProblem(f"{where}: future_horizon: {exc}", options=["future_horizon"]) from None
        kinds = {f.name: str(f.type) for f in fields(cls)}
        wrong = [f"{name}: expected {kinds[name].replace(' | None', ' or none')}, found a boolean ({value!r})"
                 for name, value in given.items() if isinstance(value, bool) and not kinds[name].startswith("bool")]
        if not wrong:
            try:
                chosen = TypeAdapter(cls).validate_python(given)
            except ValidationError as exc:
                wrong = [f"{'.'.join(map(str, e['loc']))}: {e['msg']} (found {e.get('input')!r})" for e in exc.errors()]
        if not wrong:
            wrong = [f"{name}: {why} (found {getattr(chosen, name)!r})" for name in given
                     if (why := _out_of_range(name, getattr(chosen, name)))]
        if wrong:
            raise EnvironmentProblem(f"{where}: {'; '.join(wrong)}", options=sorted(given))
        return chosen


def _out_of_range(name: str, value) -> str | None:
    """Why an engine option's value makes no sense (None: it does)."""
    if value is None:
        return None
    if name == "future_horizon":
        return "expected a duration of 0 or more" if value < timedelta(0) else None
    if isinstance(value, (bool, str)):
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return "expected a finite number"
    if name == "lease_seconds" and value <= 0:
        return "expected more than 0 seconds"
    if name == "scan_bytes_per_second" and value <= 0:
        return "expected more than 0 bytes per second"
    if name in ("metrics_partitions", "partitions_per_file") and value < 1:
        return "expected 1 or more"
    return "expected 0 or more" if value < 0 else None


@dataclass
class RunContext:
    """What every module of a run's data path needs: Spark, the layout, the watermark store, options."""

    spark: SparkSession
    layout: Layout
    store: CheckpointStore
    options: EngineOptions = field(default_factory=EngineOptions)
    hook: Hook = field(default=lambda step: None)
