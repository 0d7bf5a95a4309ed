"""The benchmark's source data: a trades table (the demo's schema) written as real Delta commits.

* base: `B` rows spread uniformly over `base_hours` hourly partitions, committed in time order,
  one commit per `hours_per_commit` hours, so each file's event-time statistics are tight;
* Δ (the change batch): appends into the newest windows (one commit) plus late rows into
  `late_partitions` older partitions (one commit each, as late data arrives in its own batches);
* corrections: one `DeltaTable.update` and one `DeltaTable.delete` over the newest base hours.

Rows are built with numpy/pyarrow chunk by chunk; nothing ever holds the whole table.
The table has `delta.enableChangeDataFeed = true`, so updates and deletes leave `_change_data` files
that Laminar reads as signed changes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from deltalake import write_deltalake

from laminar_assets import storage
from laminar_assets.demo.generator import SYMBOLS, VENUES
from laminar_assets.engine.delta import open_delta

TABLE = "trades"
START = datetime(2024, 1, 2, tzinfo=UTC)
HOUR = timedelta(hours=1)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SYM = pa.array([s[0] for s in SYMBOLS])
_BASE_PX = np.array([s[4] for s in SYMBOLS])
_LOTS = np.array([s[3] for s in SYMBOLS])
_VENUES = pa.array(list(VENUES))
_ACCOUNTS = pa.array([f"ACC-{a:03d}" for a in range(60)])
_SIDES = pa.array(["BUY", "SELL"])


def _us(t: datetime) -> int:
    d = t - _EPOCH
    return (d.days * 86_400 + d.seconds) * 1_000_000 + d.microseconds


@dataclass
class Lake:
    """A storage root holding the `trades` source (Laminar's sinks and state go under it too)."""

    root: str

    @property
    def uri(self) -> str:
        return storage.join(self.root, TABLE)

    def version(self) -> int:
        return open_delta(self.uri).version()

    def files(self, version: int | None = None) -> list[str]:
        """The data files of a snapshot: absolute paths, or object-store URIs (no deletion vectors:
        delta-rs never writes them)."""
        return [u.removeprefix("file://") for u in open_delta(self.uri, version=version).file_uris()]


@dataclass
class Commit:
    """One source commit the harness made, and what it touched."""

    version: int
    kind: str  # base | append | late | update | delete
    rows: int
    first: datetime | None = None  # event-time range [first, last] of the rows written
    last: datetime | None = None
    seconds: float = 0.0


@dataclass
class BaseInfo:
    rows: int
    hours: int
    start: datetime
    end: datetime  # half-way through the last hour
    next_id: int
    commits: list[Commit] = field(default_factory=list)
    # trade ids of the newest `correction_hours` hours: [first, last) (ids grow with event time)
    correction_ids: tuple[int, int] = (0, 0)


def trades(rng: np.random.Generator, first_id: int, times_us: np.ndarray) -> pa.Table:
    """Trades in the demo's `raw_trades` schema for the given (sorted) event times in microseconds."""
    n = len(times_us)
    idx = rng.integers(0, len(SYMBOLS), n)
    price = np.round(_BASE_PX[idx] * (1 + rng.normal(0, 0.004, n)), 2)
    qty = _LOTS[idx] * rng.integers(1, 40, n)
    return pa.table({
        "trade_id": pa.array(np.arange(first_id, first_id + n, dtype="int64")),
        "event_time": pa.array(times_us.astype("int64"), pa.int64()).cast(pa.timestamp("us", tz="UTC")),
        "symbol": pc.take(_SYM, pa.array(idx)),
        "account": pc.take(_ACCOUNTS, pa.array(rng.integers(0, len(_ACCOUNTS), n))),
        "side": pc.take(_SIDES, pa.array(rng.integers(0, 2, n))),
        "price": pa.array(price.astype("float64")),
        "quantity": pa.array(qty.astype("int64")),
        "venue": pc.take(_VENUES, pa.array(rng.integers(0, len(_VENUES), n))),
    })


def uniform_times(rng: np.random.Generator, n: int, lo: datetime, hi: datetime) -> np.ndarray:
    return np.sort(rng.integers(_us(lo), _us(hi), n, dtype="int64"))


def commit_table(lake: Lake, table: pa.Table, kind: str, first: datetime, last: datetime, *, create: bool = False) -> Commit:
    import time

    t = time.perf_counter()
    write_deltalake(lake.uri, table, mode="append", storage_options=storage.delta_options(lake.uri),
                    configuration={"delta.enableChangeDataFeed": "true"} if create else None)
    return Commit(lake.version(), kind, table.num_rows, first, last, time.perf_counter() - t)


def write_base(lake: Lake, rows: int, hours: int, *, hours_per_commit: int, correction_hours: float,
               seed: int) -> BaseInfo:
    """`rows` trades uniform over [START, START + hours - 30 min), one commit per `hours_per_commit` hours."""
    rng = np.random.default_rng(seed)
    end = START + hours * HOUR - timedelta(minutes=30)
    span = (end - START).total_seconds()
    cutoff = end - correction_hours * HOUR
    info = BaseInfo(rows=rows, hours=hours, start=START, end=end, next_id=1)
    written = 0
    chunk_start = START
    lo_id = None
    while chunk_start < end:
        chunk_end = min(chunk_start + hours_per_commit * HOUR, end)
        share = (chunk_end - START).total_seconds() / span
        n = (rows if chunk_end >= end else int(round(rows * share))) - written
        if n > 0:
            times = uniform_times(rng, n, chunk_start, chunk_end)
            if lo_id is None and chunk_end > cutoff:
                lo_id = info.next_id + int(np.searchsorted(times, _us(cutoff)))
            table = trades(rng, info.next_id, times)
            info.commits.append(commit_table(lake, table, "base", chunk_start, chunk_end, create=not info.commits))
            info.next_id += n
            written += n
        chunk_start = chunk_end
    info.correction_ids = (lo_id if lo_id is not None else info.next_id, info.next_id)
    return info


def write_delta(lake: Lake, base: BaseInfo, rows: int, *, late_share: float, late_partitions: int,
                seed: int, append_minutes: int = 60, start: datetime | None = None) -> list[Commit]:
    """Δ: appends into the newest windows ([start, start + append_minutes), start defaulting to the
    end of the base; with 60, the rest of the last hour and the next one), then `late_share` of the
    rows as late data into `late_partitions` older hours of the base."""
    rng = np.random.default_rng(seed + 1)
    late = int(round(rows * late_share)) if late_partitions else 0
    commits = []
    n_app = rows - late
    start = start or base.end
    tip = start + timedelta(minutes=append_minutes)
    times = uniform_times(rng, n_app, start, tip)
    commits.append(commit_table(lake, trades(rng, base.next_id, times), "append", start, tip))
    base.next_id += n_app
    # older hours: anything but the last two base hours, chosen at random (spread over the history)
    candidates = np.arange(0, max(base.hours - 2, 1))
    hours = sorted(rng.choice(candidates, size=min(late_partitions, len(candidates)), replace=False).tolist())
    for i, h in enumerate(hours):
        n = late // len(hours) + (1 if i < late % len(hours) else 0)
        if n == 0:
            continue
        lo = START + int(h) * HOUR
        times = uniform_times(rng, n, lo, lo + HOUR)
        commits.append(commit_table(lake, trades(rng, base.next_id, times), "late", lo, lo + HOUR))
        base.next_id += n
    return commits


def write_delta_round(lake: Lake, base: BaseInfo, profile, r: int) -> list[Commit]:
    """Round `r`'s Δ as the benchmark commits it (`profile`: a bench.config.Profile): the tip moves on by
    one append window per round, the late rows land in other older partitions (seed per round)."""
    return write_delta(lake, base, profile.delta_rows, late_share=profile.late_share,
                       late_partitions=profile.late_partitions, seed=profile.seed + 101 * r,
                       append_minutes=profile.append_minutes,
                       start=base.end + r * timedelta(minutes=profile.append_minutes))


def write_corrections(lake: Lake, base: BaseInfo, *, every: int, correction_hours: float) -> list[Commit]:
    """An update (price +1%, quantity +1) of every `every`-th trade of the newest base hours, then a
    delete of every `every`-th trade (offset every/2) of the same hours: two change-data commits."""
    import time

    lo, hi = base.correction_ids
    first = base.end - correction_hours * HOUR
    commits = []
    dt = open_delta(lake.uri)
    t = time.perf_counter()
    out = dt.update(updates={"price": "price * 1.01", "quantity": "quantity + 1"},
                    predicate=f"trade_id >= {lo} AND trade_id < {hi} AND trade_id % {every} = 0")
    commits.append(Commit(lake.version(), "update", int(out.get("num_updated_rows", 0)), first, base.end,
                          time.perf_counter() - t))
    dt = open_delta(lake.uri)
    t = time.perf_counter()
    out = dt.delete(f"trade_id >= {lo} AND trade_id < {hi} AND trade_id % {every} = {every // 2}")
    commits.append(Commit(lake.version(), "delete", int(out.get("num_deleted_rows", 0)), first, base.end,
                          time.perf_counter() - t))
    return commits


def added_files(lake: Lake, before: int, after: int) -> list[str]:
    """Data files in snapshot `after` that were not in snapshot `before` (the appended files)."""
    old = set(lake.files(before))
    return [f for f in lake.files(after) if f not in old]
