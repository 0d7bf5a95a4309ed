"""The options a run follows (`EngineOptions`), the moments it passes through (`STEPS`), and the
context every module of a run's data path shares (`RunContext`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from laminar_assets.checkpoints import CheckpointStore

    from ..delta.layout import Layout

Hook = Callable[[str], None]
# Moments a run passes through, in order; tests crash or kill a run at each of them.
STEPS = ("after_intent", "after_read", "after_state_commit", "after_sink_commit", "after_first_watermark",
         "after_watermark")


@dataclass(frozen=True)
class EngineOptions:
    """How runs choose and guard their work (keyword options of `Engine`)."""

    # Refill a partition instead of merging when its changed bytes are at least this share of its bytes
    # (reason REFILL_CHEAPER); None never chooses refill for cost. Measured in bench/ (see README).
    refill_ratio: float | None = 0.5
    # ... but only for partitions of at least this many bytes: below it a run's cost is Spark job
    # latency either way, and a stable reason is worth more than a few kilobytes read.
    refill_min_bytes: int = 16 * 1024 * 1024
    # Recompute windows whose float state lost precision to a retraction (reason PRECISION_LOSS).
    # Turning it off exists only so tests can show that the equivalence check catches such a window.
    precision_guard: bool = True
    # Per-partition metrics are computed for runs of at most this many partitions; larger runs
    # report their totals on the first partition (`batch_partitions` says how many shared them).
    metrics_partitions: int = 64
    lease_seconds: float = 6 * 3600
    # A pass reading fewer bytes than this runs Spark's expressions interpreted instead of compiling
    # them: on small inputs compiling costs more CPU than it saves (a commit of 50 rows through the
    # demo graph took 8.3 s with code generation and 4.4 s without; rounds of the benchmark's two
    # flows alternating both ways: even at a 20k-row Δ (~0.4 MB), compiled ~0.5 s faster at 100k
    # rows (~2 MB), where interpreted hash aggregation spent ~6 us a row). 0 always compiles.
    # See spark_io.interpreted.
    interpreted_below_bytes: int = 1024 * 1024
    # A flow pass whose input (bytes read times the window copies of each row, plus the old state it
    # merges; flows with fact joins: never) is smaller than this runs in one Spark task with no shuffle: partial states and merge in one stage. On small inputs a stage
    # and its tasks cost more than the work: the benchmark's two flows, one after the other, 1M-row
    # base, alternated runs: 100k-row Δ (3.5 MB a flow) 1.50 -> 1.21 s; 300k (9 MB) 1.65 -> 1.41 s;
    # 1M (27 MB) 2.50 -> 2.35 s; 3M (117 MB) 6.2 -> 7.2 s (one core idles). 0: never.
    single_task_below_bytes: int = 32 * 1024 * 1024
    # A write whose rows are bounded by fewer bytes than this goes through the driver: Spark sends the
    # rows as Arrow batches and pyarrow writes the files, and a flow's sink rows come from the same
    # job as its state. The bound is in Parquet bytes: a flow's state by the bytes the pass reads times
    # the window copies per row, plus the old state it merges (flows with fact joins: never); its sink
    # by the same; a stage's rows by the bytes read plus its dimensions. Rows in Arrow take several
    # times their Parquet bytes. A Spark write job of a few thousand rows cost ~0.2-0.3 s here, the
    # collect ~0.1 s. 0: Spark always writes.
    driver_write_below_bytes: int = 8 * 1024 * 1024


@dataclass
class RunContext:
    """What every module of a run's data path needs: Spark, the layout, the watermark store, options."""

    spark: "SparkSession"
    layout: "Layout"
    store: "CheckpointStore"
    options: EngineOptions = field(default_factory=EngineOptions)
    hook: Hook = field(default=lambda step: None)
