"""Deterministic trade data written as real Delta commits: in-order trades, late rows,
duplicates, corrections (updates) and cancellations (deletes)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import numpy as np
import pandas as pd
import pyarrow as pa
from deltalake import write_deltalake

from laminar_assets import storage
from laminar_assets.engine.delta import is_delta_table, open_delta

SYMBOLS = (
    ("AAPL", "tech", "USD", 100, 190.0), ("MSFT", "tech", "USD", 100, 410.0), ("NVDA", "tech", "USD", 100, 880.0),
    ("XOM", "energy", "USD", 100, 110.0), ("CVX", "energy", "USD", 100, 150.0), ("JPM", "financials", "USD", 100, 195.0),
    ("GS", "financials", "USD", 100, 440.0), ("SAP", "tech", "EUR", 50, 180.0), ("SHEL", "energy", "GBP", 50, 27.0),
    ("HSBA", "financials", "GBP", 50, 6.5),
)
VENUES = ("XNYS", "XNAS", "BATS", "XLON", "XETR")
START = datetime(2024, 1, 2, 9, tzinfo=UTC)  # the fixed start tests and benchmarks use


def recent_start(now: datetime | None = None, *, hours_back: int = 6) -> datetime:
    """The hour `hours_back` hours before `now` (UTC): where `laminar demo` starts its data, so the
    demo's partitions are among the latest ones, which Dagster's partition plots show (the UI plots
    the latest 120 partition keys of an asset)."""
    now = now or datetime.now(UTC)
    return now.replace(minute=0, second=0, microsecond=0) - timedelta(hours=hours_back)


@dataclass(frozen=True)
class BatchOptions:
    """One commit batch of generated trades."""

    rows: int = 2000
    hours: int = 3
    late_share: float = 0.05
    duplicate_share: float = 0.02
    update_share: float = 0.02
    delete_share: float = 0.01
    bad_share: float = 0.003  # rows breaking raw_trades' contract rules (they end up in quarantine)
    seed: int = 7
    start: datetime = START  # where the first batch starts (later batches continue from the table)


@dataclass(frozen=True)
class BatchSummary:
    appended: int
    late: int
    duplicates: int
    updated: int
    deleted: int
    bad: int
    first_time: datetime
    last_time: datetime
    versions: tuple[int, ...]


def symbols_frame() -> pd.DataFrame:
    """The `symbols` dimension: one row per symbol with its sector, currency and lot size."""
    return pd.DataFrame([s[:4] for s in SYMBOLS], columns=["symbol", "sector", "currency", "lot_size"]).astype(
        {"lot_size": "int64"})


def _trades(rng: np.random.Generator, first_id: int, times: list[datetime]) -> pd.DataFrame:
    n = len(times)
    idx = rng.integers(0, len(SYMBOLS), n)
    base = np.array([SYMBOLS[i][4] for i in idx])
    lots = np.array([SYMBOLS[i][3] for i in idx])
    price = np.round(base * (1 + rng.normal(0, 0.004, n)), 2)
    qty = lots * rng.integers(1, 40, n)
    df = pd.DataFrame({
        "trade_id": np.arange(first_id, first_id + n, dtype="int64"),
        "event_time": pd.to_datetime(times, utc=True).astype("datetime64[us, UTC]"),
        "symbol": [SYMBOLS[i][0] for i in idx],
        "account": [f"ACC-{a:03d}" for a in rng.integers(0, 60, n)],
        "side": np.where(rng.random(n) < 0.5, "BUY", "SELL"),
        "price": price.astype("float64"),
        "quantity": qty.astype("int64"),
        "venue": [VENUES[v] for v in rng.integers(0, len(VENUES), n)],
    })
    return df


def _break_rows(df: pd.DataFrame, rng: np.random.Generator, n: int, *, first_kind: int = 0) -> int:
    """Break `n` rows in place, one rule after another: negative quantity, zero price, unknown
    symbol (no match in `symbols`), missing event time."""
    rows = rng.choice(len(df), size=min(n, len(df)), replace=False)
    for i, row in enumerate(rows):
        kind = (i + first_kind) % 4
        if kind == 0:
            df.loc[row, "quantity"] = -df.loc[row, "quantity"]
        elif kind == 1:
            df.loc[row, "price"] = 0.0
        elif kind == 2:
            df.loc[row, "symbol"] = "ZZZZ"
        else:
            df.loc[row, "event_time"] = pd.NaT
    return len(rows)


def _write(uri: str, data, **options) -> None:
    write_deltalake(uri, data, storage_options=storage.delta_options(uri), **options)


def _stats(uri: str) -> tuple[int, datetime | None, datetime | None]:
    actions = pa.table(open_delta(uri).get_add_actions(flatten=True)).to_pylist()
    max_id = max((a.get("max.trade_id") or 0 for a in actions), default=0)
    max_t = max((a["max.event_time"] for a in actions if a.get("max.event_time") is not None), default=None)
    min_t = min((a["min.event_time"] for a in actions if a.get("min.event_time") is not None), default=None)
    return int(max_id), min_t, max_t


def write_batch(root: str, options: BatchOptions = BatchOptions(), *, batch: int = 0) -> BatchSummary:
    """Write one batch of commits to `<root>/raw_trades` (and create `<root>/symbols` if missing).

    The first batch covers `hours` hours from `options.start` (2024-01-02 09:00 UTC unless set); each
    later batch continues in order for one more hour after the table's last trade and also writes
    late rows into the earlier hours, duplicates of existing trades, corrections and cancellations.
    """
    rng = np.random.default_rng(options.seed + 1000 * batch)
    trades_uri, symbols_uri = storage.join(root, "raw_trades"), storage.join(root, "symbols")
    if not is_delta_table(symbols_uri):
        _write(symbols_uri, symbols_frame(), configuration={"delta.enableChangeDataFeed": "true"})
    exists = is_delta_table(trades_uri)
    max_id, first_time, last_time = _stats(trades_uri) if exists else (0, None, None)
    # late rows go anywhere between the table's first hour and the new hour
    start = options.start if first_time is None else first_time.replace(minute=0, second=0, microsecond=0)
    span_start = start if last_time is None else last_time.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    span = timedelta(hours=options.hours if last_time is None else 1)
    late = int(options.rows * options.late_share) if exists else 0
    in_order = options.rows - late
    offsets = np.sort(rng.random(in_order)) * span.total_seconds()
    times = [span_start + timedelta(seconds=float(o)) for o in offsets]
    if late:
        late_offsets = rng.random(late) * (span_start - start).total_seconds()
        times += [start + timedelta(seconds=float(o)) for o in late_offsets]
    new = _trades(rng, max_id + 1, times)
    bad = _break_rows(new, rng, math.ceil(options.rows * options.bad_share), first_kind=batch)
    versions = []
    config = {"delta.enableChangeDataFeed": "true"}
    _write(trades_uri, new, mode="append", configuration=None if exists else config)
    versions.append(open_delta(trades_uri).version())
    dups = updated = deleted = 0
    if exists:
        dups = int(options.rows * options.duplicate_share)
        if dups:
            again = new.sample(n=min(dups, len(new)), random_state=options.seed + batch).reset_index(drop=True)
            _write(trades_uri, again, mode="append")
            versions.append(open_delta(trades_uri).version())
        dt = open_delta(trades_uri)
        changed = int(options.rows * (options.update_share + options.delete_share))
        ids = rng.choice(np.arange(1, max_id + 1), size=min(max_id, changed), replace=False)
        n_upd = int(len(ids) * options.update_share / max(options.update_share + options.delete_share, 1e-9))
        upd, dele = ids[:n_upd], ids[n_upd:]
        if len(upd):
            dt.update(updates={"price": "price * 1.01", "quantity": "quantity + 1"},
                      predicate=f"trade_id IN ({', '.join(str(int(i)) for i in upd)})")
            versions.append(dt.version())
            updated = len(upd)
        if len(dele):
            dt = open_delta(trades_uri)
            dt.delete(f"trade_id IN ({', '.join(str(int(i)) for i in dele)})")
            versions.append(dt.version())
            deleted = len(dele)
    return BatchSummary(
        appended=in_order, late=late, duplicates=dups, updated=updated, deleted=deleted, bad=bad,
        first_time=min(times), last_time=max(times), versions=tuple(versions),
    )


def append_trades(root: str, rows: int, start: datetime, end: datetime, *, seed: int = 7) -> int:
    """One append commit of `rows` clean trades with event times in [start, end); returns its version."""
    uri = storage.join(root, "raw_trades")
    rng = np.random.default_rng(seed)
    max_id, _, _ = _stats(uri)
    offsets = np.sort(rng.random(rows)) * (end - start).total_seconds()
    _write(uri, _trades(rng, max_id + 1, [start + timedelta(seconds=float(o)) for o in offsets]),
                    mode="append")
    return open_delta(uri).version()
