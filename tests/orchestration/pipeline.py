"""Small trades sources with exact event times, in the demo's schema."""

from __future__ import annotations

import pandas as pd

from laminar_assets.demo.generator import symbols_frame


def trades(rows) -> pd.DataFrame:
    """rows: (trade_id, 'YYYY-mm-dd HH:MM:SS', symbol, account, side, price, quantity)."""
    df = pd.DataFrame(list(rows), columns=["trade_id", "event_time", "symbol", "account", "side", "price", "quantity"])
    df["event_time"] = pd.to_datetime(df["event_time"], utc=True).astype("datetime64[us, UTC]")
    df["venue"] = "XNYS"
    return df.astype({"trade_id": "int64", "price": "float64", "quantity": "int64"})


def create_sources(lake, rows) -> None:
    lake.create("symbols", frame=symbols_frame())
    lake.create("raw_trades", frame=trades(rows))


BASE = [
    (1, "2024-01-02 09:01:00", "AAPL", "ACC-1", "BUY", 190.0, 100),
    (2, "2024-01-02 09:02:30", "AAPL", "ACC-2", "SELL", 191.0, 200),
    (3, "2024-01-02 09:40:00", "XOM", "ACC-1", "BUY", 110.0, 300),
    (4, "2024-01-02 10:05:00", "MSFT", "ACC-3", "BUY", 410.0, 100),
]
