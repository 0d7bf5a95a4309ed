"""Benchmark profiles: the sizes and workload knobs of one run (`full` and `smoke`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class Profile:
    """Everything that shapes one benchmark run. All sizes are rows."""

    name: str
    sizes: tuple[int, ...]            # base table sizes B; the head-to-head runs at every size, the largest is headline
    base_hours: int                   # the base spans this many hourly partitions (ends half-way through the last)
    delta_rows: int                   # the fixed change batch Δ (appends + late rows), the same at every B
    append_minutes: int = 60         # Δ's appends cover [end of base, + this): 60 = the rest of the last hour + a new one
    late_share: float = 0.10          # share of Δ that is late: rows into older partitions
    late_partitions: int = 4          # how many older hourly partitions the late rows land in (one commit each)
    hours_per_commit: int = 3         # base commits: one per this many hours (time-ordered files, tight statistics)
    correction_hours: float = 2       # the update/delete batch changes rows of the newest base hours
    correction_every: int = 50        # ... every n-th trade id is updated, every n-th (offset n/2) deleted
    freshness_commits: int = 12       # commits timed end to end through Dagster (>= 10 for p95 to mean something)
    freshness_base_rows: int = 100_000
    freshness_base_hours: int = 2
    freshness_commit_rows: int = 2_000
    rounds: int = 3                   # Δ rounds per size; every timing is the median over them
    every_variant_at_every_size: bool = True  # False: sizes below the largest time only Laminar + full recompute
    warmup_rows: int = 50_000         # an untimed round of every variant first, so the JVM is warm (0: none)
    sdp: str = "largest"              # sizes with the Spark Declarative Pipelines peer: off | largest | all
    s3_rows: int = 0                  # the S3 variant's base size (a local S3 server); 0: not run
    s3_latencies_ms: tuple[float, ...] = (0,)  # the S3 variant runs once per latency (ms slept per request)
    # The JVM's heap: the engine's default (`SparkOptions.driver_memory`). With 8 GB every variant ran as fast
    # and the JVM's RSS grew to 9 GB of mostly uncollected garbage (docs/PERFORMANCE.md, "What holds the
    # benchmark's memory"), so the peak said what the heap allowed, not what the work needs.
    driver_memory: str = "2g"
    shuffle_partitions: int = 4       # the engine's default (SparkOptions)
    seed: int = 20240102
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        return asdict(self)

    def with_(self, **changes) -> Profile:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


FULL = Profile(
    name="full",
    sizes=(1_000_000, 3_000_000, 10_000_000),
    s3_rows=1_000_000,
    s3_latencies_ms=(0, 20),          # in-memory (~1 ms), and S3's first-byte latency in its region
    base_hours=96,                    # 4 days of hourly partitions
    delta_rows=100_000,               # 1% of the largest B
)

SMOKE = Profile(
    name="smoke",
    sizes=(20_000, 40_000),
    s3_rows=20_000,
    s3_latencies_ms=(0,),             # a second latency repeats the whole S3 round: not in the smoke
    base_hours=2,
    delta_rows=2_000,
    append_minutes=20,                # stays inside the last base hour: fewer runs, a faster smoke
    correction_hours=0.5,             # corrections inside the last base hour only
    every_variant_at_every_size=False,
    rounds=1,
    warmup_rows=0,
    sdp="off",                        # `spark-pipelines run` costs ~30-50 s per run (two JVMs): not in the smoke
    late_partitions=1,
    hours_per_commit=1,
    correction_every=20,
    freshness_commits=2,
    freshness_base_rows=2_000,
    freshness_base_hours=1,
    freshness_commit_rows=200,
    shuffle_partitions=2,             # one per core: tiny data, fewer tasks per job
)

PROFILES = {"full": FULL, "smoke": SMOKE}


def parse_latencies(text: str) -> tuple[float, ...]:
    """`--s3-latency-ms 0,20`: milliseconds, each >= 0, at least one."""
    import argparse

    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or any(not v >= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected milliseconds >= 0 separated by commas (e.g. 0,20), not {text!r}")
    return values
